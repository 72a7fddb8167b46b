//! SGLang's protocol (read from the sglang 0.5.23 wheel; field history from 0.5.2–0.5.22):
//!
//! - **Per request, native `POST /generate`** (no flag; the fields appear once the request has
//!   finished): `meta_info.spec_verify_ct` (verify passes, 0.5.2+) with
//!   `spec_num_correct_drafts` (0.5.12+; `spec_accepted_drafts` its 0.5.12–0.5.20 alias,
//!   `spec_accept_token_num` in 0.5.6–0.5.9) and `completion_tokens`
//!   (`sglang/srt/managers/tokenizer_manager.py` `_calculate_spec_decoding_metrics`). SGLang's
//!   own `spec_accept_length = completion_tokens / spec_verify_ct` counts the prefill-sampled
//!   token; kquant reads `1 + correct / verify_ct`, and on 0.5.2–0.5.4, which have only
//!   `spec_verify_ct`, `correct = completion_tokens − 1 − verify_ct`.
//! - **Per request, OpenAI routes** (chat messages): the request field
//!   `"return_spec_tokens_details": true` (0.5.19+) puts the same fields in
//!   `sglext.spec_tokens_details` (`sglang/srt/entrypoints/openai/protocol.py`).
//! - **Server**: `GET /server_info` (`/get_server_info` before 0.5.9): the server arguments
//!   (`version`, `speculative_algorithm`, `speculative_num_steps`, `speculative_adaptive`, …)
//!   and `internal_states[i].avg_spec_accept_length`, which lags by up to
//!   `--decode-log-interval` decode iterations and is not used. With `--enable-metrics` the
//!   Prometheus page has `sglang:spec_verify_calls_total` (0.5.13+) and
//!   `sglang:generation_tokens_total`, both counted when a request finishes
//!   (`sglang/srt/observability/metrics_collector.py`): the server-wide fallback differences
//!   them around one request (steps = Δverify calls, accepted = Δtokens − 1 − Δverify calls).
//! - The EAGLE-3 aux-layer off-by-one (sgl-project/sglang#25454): 0.5.12 and earlier add 1 to
//!   every explicit `eagle_aux_hidden_state_layer_ids`; fixed in 0.5.13.

use serde_json::Value;

use super::client::{Client, Failure};
use super::engine::{
    check_histogram, count, version_triple, Counters, Engine, Finding, Preflight, Protocol, Reply,
    RequestOptions, Spec,
};
use crate::error::{Error, Result};
use crate::verify::prompt_sets::{Body, LivePrompt};

pub struct Sglang;

/// Drafts a verify step proposes (K), from the server arguments: `speculative_num_steps` for
/// EAGLE's chain (or tree depth); the block drafters force that to 1 and draft
/// `speculative_num_draft_tokens` − 1 a step (DFLASH: the block size; DSPARK: gamma + 1;
/// `sglang/srt/arg_groups/speculative_hook.py`, `_handle_dflash`, `_handle_dspark`).
fn drafts_per_step(info: &Value) -> Option<u64> {
    let algo = info
        .get("speculative_algorithm")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_ascii_uppercase();
    if algo.contains("DFLASH") || algo.contains("DSPARK") {
        count(info, "speculative_num_draft_tokens")
            .ok()
            .flatten()
            .and_then(|n| n.checked_sub(1))
    } else {
        count(info, "speculative_num_steps").ok().flatten()
    }
}

/// The last SGLang release with the unconditional +1 on explicit aux-layer ids.
pub const AUX_SHIFT_UNTIL: (u64, u64, u64) = (0, 5, 12);
/// The first release with `return_spec_tokens_details` on the OpenAI routes.
pub const OPENAI_DETAILS_SINCE: (u64, u64, u64) = (0, 5, 19);

impl Protocol for Sglang {
    fn engine(&self) -> Engine {
        Engine::Sglang
    }

    fn request(&self, p: &LivePrompt, o: &RequestOptions) -> (String, Value) {
        let sampling = serde_json::json!({
            "temperature": 0.0,
            "max_new_tokens": o.max_tokens,
            "ignore_eos": false,
        });
        match &p.body {
            Body::Tokens(t) => (
                "/generate".into(),
                serde_json::json!({"input_ids": t, "sampling_params": sampling, "stream": false}),
            ),
            Body::Text(t) => (
                "/generate".into(),
                serde_json::json!({"text": t, "sampling_params": sampling, "stream": false}),
            ),
            Body::Messages(m) => (
                "/v1/chat/completions".into(),
                serde_json::json!({
                    "model": o.model,
                    "messages": m,
                    "max_tokens": o.max_tokens,
                    "temperature": 0.0,
                    "n": 1,
                    "stream": false,
                    "ignore_eos": false,
                    "return_spec_tokens_details": true,
                }),
            ),
        }
    }

    fn reply(&self, v: &Value) -> std::result::Result<Reply, String> {
        if let Some(m) = v.get("meta_info") {
            // Native /generate.
            let completion =
                count(m, "completion_tokens")?.ok_or("meta_info has no `completion_tokens`")?;
            let output = v
                .get("text")
                .and_then(Value::as_str)
                .map(String::from)
                .or_else(|| v.get("output_ids").map(|x| x.to_string()));
            let finish = m
                .pointer("/finish_reason/type")
                .and_then(Value::as_str)
                .map(String::from);
            return Ok(Reply {
                completion_tokens: completion,
                finish_reason: finish,
                spec: spec_of(m, completion).map_err(|e| format!("meta_info: {e}"))?,
                output,
                num_spec_tokens: None,
                token_ids: None,
                model: None,
                histogram: super::engine::histogram_of(m.get("spec_correct_drafts_histogram")),
            });
        }
        let o = super::engine::openai_reply(v)?;
        let completion = o.completion;
        let details = match v.pointer("/sglext/spec_tokens_details") {
            None | Some(Value::Null) => None,
            Some(Value::Array(a)) => a.first(),
            Some(d) => Some(d),
        };
        let spec = match details {
            None => None,
            Some(d) => spec_of(d, completion)
                .map_err(|e| format!("sglext.spec_tokens_details: {e}"))?
                .map(|(s, _)| (s, "sglext.spec_tokens_details")),
        };
        let histogram = details
            .and_then(|d| super::engine::histogram_of(d.get("spec_correct_drafts_histogram")));
        Ok(Reply {
            histogram,
            ..o.reply(spec)
        })
    }

    fn counters(&self, c: &Client) -> std::result::Result<Option<Counters>, Failure> {
        // Prometheus (`--enable-metrics`), counted when a request finishes: verify passes from
        // 0.5.13 (`sglang:spec_verify_calls_total`) and generated tokens, the prefill token among
        // them (`sglang:generation_tokens_total`, summed over its `is_streaming` label).
        // Each request's tokens are its prefill token plus each step's accepted drafts and
        // bonus token: the run subtracts the prefill token per request.
        super::prometheus::counters(
            c,
            [
                "sglang:spec_verify_calls",
                "sglang:generation_tokens",
                "sglang:num_requests",
            ],
            |steps, tokens| tokens.saturating_sub(steps),
        )
    }

    fn counters_count_prefill(&self) -> bool {
        true
    }

    fn preflight(&self, c: &Client) -> Result<Preflight> {
        let info = c
            .get_json("/server_info")
            .or_else(|_| c.get_json("/get_server_info"))
            .map_err(|f| Error::Endpoint {
                url: c.url("/server_info"),
                msg: format!("SGLang's server info cannot be read: {}", f.msg),
                hint: Some("is this an SGLang server (python -m sglang.launch_server)? Otherwise pass the right --engine".into()),
            })?;
        let mut p = Preflight {
            version: info
                .get("version")
                .and_then(Value::as_str)
                .map(String::from),
            num_spec_tokens: drafts_per_step(&info),
            ..Preflight::default()
        };
        let algo = info
            .get("speculative_algorithm")
            .and_then(Value::as_str)
            .filter(|a| !a.is_empty() && !a.eq_ignore_ascii_case("none"));
        match algo {
            None => p.errors.push(Finding {
                msg: "the server runs no speculative decoding (`speculative_algorithm` is unset): there is no accept length to measure".into(),
                hint: "launch with --speculative-algorithm EAGLE3 --speculative-draft-model-path DRAFT --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4".into(),
            }),
            Some(a) => {
                if let Some(t) = p.version.as_deref().and_then(version_triple) {
                    if t <= AUX_SHIFT_UNTIL && a.to_ascii_uppercase().contains("EAGLE3") {
                        p.warnings.push(Finding {
                            msg: format!("SGLang {} adds 1 to every explicit EAGLE-3 aux-layer id (fixed in 0.5.13, sgl-project/sglang#25454): a draft whose ids do not start at 1 (e.g. [2, n/2, n-3]) reads the wrong layers and its accept length comes out low (about 0.1 on Kimi-K2.5)", p.version.as_deref().unwrap_or("")),
                            hint: "upgrade SGLang to 0.5.13 or later before trusting this figure".into(),
                        });
                    }
                }
            }
        }
        if info.get("speculative_adaptive").and_then(Value::as_bool) == Some(true) {
            p.errors.push(Finding {
                msg: "the server adapts the number of speculative steps (`speculative_adaptive`): the figure would mix drafting depths".into(),
                hint: "launch without --speculative-adaptive".into(),
            });
        }
        if info
            .get("enable_deterministic_inference")
            .and_then(Value::as_bool)
            != Some(true)
        {
            p.warnings.push(Finding {
                msg: "deterministic inference is off: greedy continuations (and so the accept length) can drift with batch composition".into(),
                hint: "for a reproducible gate launch with --enable-deterministic-inference, or keep --concurrency 1".into(),
            });
        }
        Ok(p)
    }

    fn per_request_hint(&self) -> &'static str {
        "send token ids or text (native /generate always reports spec_verify_ct), use SGLang >= 0.5.19 for chat messages (return_spec_tokens_details), or measure from the Prometheus counters with --server-counters (--enable-metrics, SGLang >= 0.5.13) on a server this run has alone"
    }
}

/// The acceptance in a `meta_info` / `spec_tokens_details` object; `None` without
/// `spec_verify_ct` (no speculation). Returns the field the accepted count came from.
fn spec_of(
    m: &Value,
    completion: u64,
) -> std::result::Result<Option<(Spec, &'static str)>, String> {
    let Some(steps) = count(m, "spec_verify_ct")? else {
        return Ok(None);
    };
    let mut correct = None;
    for (k, field) in [
        (
            "spec_num_correct_drafts",
            "meta_info.spec_num_correct_drafts",
        ),
        ("spec_accepted_drafts", "meta_info.spec_accepted_drafts"),
        ("spec_accept_token_num", "meta_info.spec_accept_token_num"),
    ] {
        if let Some(c) = count(m, k)? {
            correct = Some((c, field));
            break;
        }
    }
    let (accepted, field) = match correct {
        Some(c) => c,
        // 0.5.2–0.5.4: completion = the prefill token + Σ (accepted + 1) over the steps.
        None => {
            let a = completion.checked_sub(1 + steps).ok_or_else(|| {
                format!("{completion} completion tokens cannot come from {steps} verify steps")
            })?;
            (a, "meta_info.spec_verify_ct")
        }
    };
    // The prefill token plus each step's accepted drafts and bonus token (a stop string or
    // max_tokens may trim the last step's).
    if completion > 1 + steps + accepted {
        return Err(format!(
            "{completion} completion tokens cannot come from {steps} verify steps that accepted {accepted} drafts"
        ));
    }
    if let Some(h) = m
        .get("spec_correct_drafts_histogram")
        .filter(|h| !h.is_null())
    {
        check_histogram(h, "spec_correct_drafts_histogram", steps, accepted)?;
    }
    Ok(Some((Spec { steps, accepted }, field)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// K is the chain's steps for EAGLE and the block's drafts for DFLASH / DSPARK, which
    /// SGLang runs with `speculative_num_steps` forced to 1.
    #[test]
    fn drafts_per_step_of_each_algorithm() {
        let info = |algo: &str, steps: u64, tokens: u64| {
            serde_json::json!({"speculative_algorithm": algo, "speculative_num_steps": steps,
                "speculative_num_draft_tokens": tokens})
        };
        assert_eq!(drafts_per_step(&info("EAGLE3", 3, 4)), Some(3));
        assert_eq!(drafts_per_step(&info("EAGLE", 5, 16)), Some(5));
        assert_eq!(drafts_per_step(&info("DFLASH", 1, 16)), Some(15));
        assert_eq!(drafts_per_step(&info("DSPARK", 1, 8)), Some(7));
        assert_eq!(
            drafts_per_step(&serde_json::json!({"speculative_algorithm": "DFLASH"})),
            None
        );
    }

    /// The `spec_tokens_details` example of PR sgl-project/sglang#33518 (DSpark block 5).
    #[test]
    fn the_pr_example_reads_without_the_prefill_token() {
        let d = serde_json::json!({"spec_accept_rate": 0.2930232558139535, "spec_accept_length": 2.4651162790697674,
            "spec_num_correct_drafts": 63, "spec_num_proposed_drafts": 215,
            "spec_verify_ct": 43, "spec_correct_drafts_histogram": [11, 14, 11, 4, 0, 3]});
        let v = serde_json::json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 106, "total_tokens": 115},
            "sglext": {"spec_tokens_details": d}});
        let r = Sglang.reply(&v).unwrap();
        let s = Spec {
            steps: 43,
            accepted: 63,
        };
        assert_eq!(r.spec, Some((s, "sglext.spec_tokens_details")));
        // 1 + 63 / 43; SGLang's own `spec_accept_length` is completion / verify_ct, the same
        // here (this response's 106 completion tokens hold no prefill token beyond the steps').
        assert_eq!(s.accept_length(), 1.0 + 63.0 / 43.0);
        // 0.5.2: only spec_verify_ct.
        let old = serde_json::json!({"text": "x", "meta_info": {"completion_tokens": 106, "spec_verify_ct": 43}});
        assert_eq!(
            Sglang.reply(&old).unwrap().spec.unwrap().0,
            Spec {
                steps: 43,
                accepted: 62
            }
        );
        let none = serde_json::json!({"text": "x", "meta_info": {"completion_tokens": 5}});
        assert_eq!(Sglang.reply(&none).unwrap().spec, None);
    }
}
