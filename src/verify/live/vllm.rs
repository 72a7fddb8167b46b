//! vLLM's protocol (read from the vllm 0.33.0 wheel; version boundaries from 0.11–0.29):
//!
//! - **Per request** (from 0.29.0, server flag `--per-request-spec-decode-metrics summary`):
//!   the top-level `metrics.speculative_decoding` object of a `/v1/completions` or
//!   `/v1/chat/completions` response (`vllm/entrypoints/generate/base/protocol.py`
//!   `SpeculativeDecodingMetrics`, filled by `RequestSpecDecodeMetrics.to_dict()` in
//!   `vllm/v1/metrics/stats.py`): `num_spec_steps` (verify steps, the prefill not one),
//!   `num_accepted_draft_tokens`, `acceptance_histogram` (index j = steps that accepted j
//!   drafts), `mean_acceptance_length = 1 + accepted / steps`, `num_spec_tokens` (K).
//! - **Server-wide**: the Prometheus counters on `/metrics` (`vllm/v1/spec_decode/metrics.py`,
//!   labels `model_name`, `engine`): `vllm:spec_decode_num_drafts_total` (+1 per request per
//!   verify step) and `vllm:spec_decode_num_accepted_tokens_total`; vLLM's own formula is
//!   `1 + Δaccepted / Δdrafts`. `--disable-log-stats` turns them off. Finished requests:
//!   `vllm:request_success_total`.
//! - `/version` → `{"version"}`; `/v1/models` → `data[i].id`, `owned_by: "vllm"`.

use serde_json::Value;

use super::client::{Client, Failure};
use super::engine::{
    check_histogram, count, openai_reply, openai_request, served_version, version_triple, Counters,
    Engine, Finding, Preflight, Protocol, Reply, RequestOptions, Spec,
};
use crate::error::Result;
use crate::verify::prompt_sets::LivePrompt;

pub struct Vllm;

/// The first vLLM release with per-request speculative-decoding metrics (PR vllm-project/vllm#48915).
pub const PER_REQUEST_SINCE: (u64, u64, u64) = (0, 29, 0);

impl Protocol for Vllm {
    fn engine(&self) -> Engine {
        Engine::Vllm
    }

    fn request(&self, p: &LivePrompt, o: &RequestOptions) -> (String, Value) {
        let (route, mut body) = openai_request(p, o);
        // The generated ids in `choices[0].token_ids` (vLLM >= 0.10.2; older releases ignore
        // the field: its request models allow extra keys).
        body["return_token_ids"] = Value::Bool(true);
        (route, body)
    }

    fn reply(&self, v: &Value) -> std::result::Result<Reply, String> {
        let o = openai_reply(v)?;
        let token_ids = super::engine::token_ids(o.choice, o.completion)?;
        let (completion_tokens, finish_reason, output, model) =
            (o.completion, o.finish, o.output, o.model);
        let spec = match v.pointer("/metrics/speculative_decoding") {
            None | Some(Value::Null) => None,
            Some(m) => Some((spec_of(m)?, "metrics.speculative_decoding")),
        };
        let num_spec_tokens = v
            .pointer("/metrics/speculative_decoding")
            .and_then(|m| m.get("num_spec_tokens"))
            .and_then(Value::as_u64);
        Ok(Reply {
            completion_tokens,
            finish_reason,
            spec,
            output,
            num_spec_tokens,
            token_ids,
            model,
            histogram: spec.as_ref().and_then(|_| {
                super::engine::histogram_of(
                    v.pointer("/metrics/speculative_decoding/acceptance_histogram"),
                )
            }),
        })
    }

    fn counters(&self, c: &Client) -> std::result::Result<Option<Counters>, Failure> {
        super::prometheus::counters(
            c,
            [
                "vllm:spec_decode_num_drafts",
                "vllm:spec_decode_num_accepted_tokens",
                "vllm:request_success",
            ],
            |_, accepted| accepted,
        )
    }

    fn preflight(&self, c: &Client) -> Result<Preflight> {
        let mut p = Preflight {
            version: served_version(c),
            ..Preflight::default()
        };
        if let Some(t) = p.version.as_deref().and_then(version_triple) {
            if t < PER_REQUEST_SINCE {
                p.warnings.push(Finding {
                    msg: format!(
                        "vLLM {} has no per-request acceptance (it came in 0.29.0)",
                        p.version.as_deref().unwrap_or("")
                    ),
                    hint: "upgrade to vLLM >= 0.29 and serve with --per-request-spec-decode-metrics summary, or measure from the server-wide counters with --server-counters on a server this run has alone".into(),
                });
            }
        }
        // Speculation on and stats logged: the counters exist (at 0 before the first request).
        match self.counters(c) {
            Ok(Some(_)) => {}
            Ok(None) => p.warnings.push(Finding {
                msg: "/metrics has no vllm:spec_decode_* counters: speculative decoding is off, or the server runs with --disable-log-stats".into(),
                hint: "serve with --speculative-config '{\"method\": \"eagle3\", ...}' and without --disable-log-stats".into(),
            }),
            Err(f) => p.warnings.push(Finding {
                msg: format!("/metrics cannot be read: {}", f.msg),
                hint: "the server-wide counters (--server-counters) need /metrics".into(),
            }),
        }
        Ok(p)
    }

    fn per_request_hint(&self) -> &'static str {
        "serve with --per-request-spec-decode-metrics summary (vLLM >= 0.29), or measure from the server-wide counters with --server-counters on a server this run has alone"
    }
}

/// `metrics.speculative_decoding` → steps and accepted drafts, checked against the histogram
/// and the mean where present.
fn spec_of(m: &Value) -> std::result::Result<Spec, String> {
    let at = |e: String| format!("metrics.speculative_decoding: {e}");
    let steps = count(m, "num_spec_steps")
        .map_err(at)?
        .ok_or_else(|| at("has no `num_spec_steps`".into()))?;
    let accepted = count(m, "num_accepted_draft_tokens")
        .map_err(at)?
        .ok_or_else(|| at("has no `num_accepted_draft_tokens`".into()))?;
    let k = count(m, "num_spec_tokens").map_err(at)?;
    if let Some(k) = k {
        if accepted > steps.saturating_mul(k) {
            return Err(at(format!(
                "{accepted} accepted drafts in {steps} steps of {k} drafts"
            )));
        }
    }
    if let Some(h) = m.get("acceptance_histogram").filter(|h| !h.is_null()) {
        check_histogram(h, "acceptance_histogram", steps, accepted).map_err(at)?;
    }
    Ok(Spec { steps, accepted })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of PR vllm-project/vllm#48915's description.
    #[test]
    fn the_pr_example_reads_as_its_mean() {
        let v = serde_json::json!({"choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 54, "total_tokens": 59},
            "metrics": {"speculative_decoding": {
            "mean_acceptance_length": 1.2325581395348837, "draft_acceptance_rate": 0.07751937984496124,
            "acceptance_histogram": [39, 1, 0, 3], "num_spec_steps": 43,
            "num_accepted_draft_tokens": 10, "num_draft_tokens": 129, "num_spec_tokens": 3}}});
        let r = Vllm.reply(&v).unwrap();
        let s = Spec {
            steps: 43,
            accepted: 10,
        };
        assert_eq!(r.spec, Some((s, "metrics.speculative_decoding")));
        assert!((s.accept_length() - 1.2325581395348837).abs() < 1e-15);
        assert_eq!(r.completion_tokens, 54);
        let mut bad = v.clone();
        bad["metrics"]["speculative_decoding"]["acceptance_histogram"] =
            serde_json::json!([39, 2, 0, 3]);
        assert!(Vllm.reply(&bad).unwrap_err().contains("histogram"));
        let mut none = v.clone();
        none.as_object_mut().unwrap().remove("metrics");
        assert_eq!(Vllm.reply(&none).unwrap().spec, None);
    }
}
