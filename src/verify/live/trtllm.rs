//! TensorRT-LLM's protocol (`trtllm-serve`, PyTorch backend; NVIDIA/TensorRT-LLM source, 2026):
//!
//! - **Per request** (no flag): `choices[i].avg_decoded_tokens_per_iter` on `/v1/completions`
//!   and `/v1/chat/completions` (`tensorrt_llm/serve/openai_protocol.py`), set from
//!   `LlmRequest::getAvgDecodedTokensPerIter()` = generated tokens / decoding iterations,
//!   "number of draft tokens accepted per step + 1" (`cpp/include/tensorrt_llm/batch_manager/
//!   llmRequest.h`). The iterations count the context (prefill) iteration too: the PyTorch
//!   sampler adds 1 to `py_decoding_iter` after a context request's first token as after every
//!   generation step (`tensorrt_llm/_torch/pyexecutor/sampler.py`, `update_requests`), so the
//!   engine's figure is `completion_tokens / (verify steps + 1)`. kquant takes the iterations as
//!   `round(completion_tokens / avg)` (checked to give `avg` back), the verify steps as
//!   iterations − 1 and the accepted drafts as `completion_tokens − iterations` (the prefill
//!   token and each step's bonus token are not drafts).
//! - **Server**: `GET /metrics` is a JSON list of iteration stats, drained on read, with
//!   `specDecodingStats {numDraftTokens, numAcceptedTokens, numRequestsWithDraftTokens}` when
//!   the LLM-args YAML sets `enable_iter_perf_stats: true` (`tensorrt_llm/_torch/pyexecutor/
//!   py_executor.py` `_update_iter_stats`). Over a run: steps = Σ numRequestsWithDraftTokens,
//!   accepted = Σ numAcceptedTokens, over the iterations with numDraftTokens > 0 (TRT-LLM's
//!   `compute_acceptance_length`, `tests/integration/defs/accuracy/accuracy_core.py`).

use serde_json::Value;

use super::client::{Client, Failure};
use super::engine::{
    count, openai_reply, openai_request, served_version, Counters, Engine, Finding, Preflight,
    Protocol, Reply, RequestOptions, Spec,
};
use crate::error::Result;
use crate::verify::prompt_sets::LivePrompt;

pub struct Trtllm;

impl Protocol for Trtllm {
    fn engine(&self) -> Engine {
        Engine::Trtllm
    }

    fn request(&self, p: &LivePrompt, o: &RequestOptions) -> (String, Value) {
        openai_request(p, o)
    }

    fn reply(&self, v: &Value) -> std::result::Result<Reply, String> {
        let o = openai_reply(v)?;
        let (completion, choice) = (o.completion, o.choice);
        let spec = match choice.get("avg_decoded_tokens_per_iter") {
            None | Some(Value::Null) => None,
            Some(a) => {
                let avg = a
                    .as_f64()
                    .filter(|a| a.is_finite() && *a >= 1.0)
                    .ok_or_else(|| {
                        format!("`avg_decoded_tokens_per_iter` is {a}, not a number >= 1")
                    })?;
                if completion == 0 {
                    None
                } else {
                    let iters = (completion as f64 / avg).round() as u64;
                    if iters == 0 || (completion as f64 / iters as f64 - avg).abs() > 1e-6 * avg {
                        return Err(format!(
                            "`avg_decoded_tokens_per_iter` {avg} is not {completion} completion tokens over a whole number of iterations"
                        ));
                    }
                    Some((
                        Spec {
                            steps: iters - 1,
                            accepted: completion - iters,
                        },
                        "choices[0].avg_decoded_tokens_per_iter",
                    ))
                }
            }
        };
        Ok(o.reply(spec))
    }

    fn counters(&self, c: &Client) -> std::result::Result<Option<Counters>, Failure> {
        // Drained on read: the caller sums the pages it gets (`Counters` are per page here).
        let v = c.get_json("/metrics")?;
        let Some(iters) = v.as_array() else {
            return Err(Failure {
                retryable: false,
                msg: "/metrics is not a JSON list of iteration stats".into(),
            });
        };
        let (mut steps, mut accepted, mut any) = (0u64, 0u64, false);
        for (i, it) in iters.iter().enumerate() {
            let Some(s) = it.get("specDecodingStats").filter(|s| !s.is_null()) else {
                continue;
            };
            any = true;
            let bad = |e: String| Failure {
                retryable: false,
                msg: format!("/metrics iteration {i}: specDecodingStats: {e}"),
            };
            let drafts = count(s, "numDraftTokens").map_err(bad)?.unwrap_or(0);
            if drafts == 0 {
                continue;
            }
            steps += count(s, "numRequestsWithDraftTokens")
                .map_err(bad)?
                .unwrap_or(0);
            accepted += count(s, "numAcceptedTokens").map_err(bad)?.unwrap_or(0);
        }
        Ok((any || iters.is_empty()).then_some(Counters {
            steps,
            accepted,
            requests: None,
        }))
    }

    fn counters_drain(&self) -> bool {
        true
    }

    fn preflight(&self, c: &Client) -> Result<Preflight> {
        let mut p = Preflight {
            version: served_version(c),
            ..Preflight::default()
        };
        p.warnings.push(Finding {
            msg: "TensorRT-LLM turns speculation off by itself when `acceptance_length_threshold` (or `max_concurrency`) is set in its decoding config; kquant cannot read that config over HTTP".into(),
            hint: "leave acceptance_window / acceptance_length_threshold / max_concurrency unset in the speculative_config of the LLM-args YAML".into(),
        });
        Ok(p)
    }

    fn per_request_hint(&self) -> &'static str {
        "use a trtllm-serve that returns choices[].avg_decoded_tokens_per_iter, or measure from its iteration stats with --server-counters (enable_iter_perf_stats: true) on a server this run has alone"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iterations_come_back_from_the_average() {
        let v = serde_json::json!({"id": "cmpl-1", "object": "text_completion", "model": "m",
            "choices": [{"index": 0, "text": "x", "finish_reason": "length", "avg_decoded_tokens_per_iter": 2.5}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 10, "total_tokens": 13}});
        // 10 tokens in 4 iterations: the context one (1 token) and 3 verify steps (9 tokens).
        let (s, _) = Trtllm.reply(&v).unwrap().spec.unwrap();
        assert_eq!(
            s,
            Spec {
                steps: 3,
                accepted: 6
            }
        );
        let mut bad = v.clone();
        bad["choices"][0]["avg_decoded_tokens_per_iter"] = serde_json::json!(2.6);
        assert!(Trtllm.reply(&bad).is_err());
        bad["choices"][0]["avg_decoded_tokens_per_iter"] = serde_json::json!(0.5);
        assert!(Trtllm.reply(&bad).is_err());
    }
}
