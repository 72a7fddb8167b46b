//! What a live verify needs from a serving engine, behind one trait: [`Protocol`] builds the
//! greedy request for a prompt, reads the per-request acceptance out of the response, reads the
//! server-wide counters (the fallback), and inspects the server before the run (the preflight).
//! `vllm`, `sglang` and `trtllm` implement it from the fields each engine's source defines.
//!
//! One convention throughout: accept length = tokens committed per verify step, the bonus token
//! counted = `1 + accepted / steps`, with `steps` the verify steps of the request and `accepted`
//! the draft tokens they accepted; the prefill-sampled first token is not a step.

use serde::Serialize;
use serde_json::Value;

use super::client::{Client, Failure};
pub use crate::engines::Engine;
use crate::error::Result;
use crate::verify::prompt_sets::LivePrompt;

/// What every request asks for besides the prompt.
#[derive(Debug, Clone)]
pub struct RequestOptions {
    /// The served model name (`model` of the OpenAI routes).
    pub model: String,
    pub max_tokens: usize,
}

/// Acceptance of one request: verify steps and the draft tokens they accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Spec {
    pub steps: u64,
    pub accepted: u64,
}

impl Spec {
    /// `1 + accepted / steps` (1 for no step).
    pub fn accept_length(&self) -> f64 {
        if self.steps == 0 {
            return 1.0;
        }
        1.0 + self.accepted as f64 / self.steps as f64
    }
}

/// What kquant reads from one response.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub completion_tokens: u64,
    pub finish_reason: Option<String>,
    /// The per-request acceptance and the field it came from; `None` when the response has
    /// none (the engine's per-request metrics are off, or too old).
    pub spec: Option<(Spec, &'static str)>,
    /// The generated text or token ids, to compare two deployments' greedy outputs.
    pub output: Option<String>,
    /// Drafts per verify step, where the response says (vLLM's `num_spec_tokens`).
    pub num_spec_tokens: Option<u64>,
    /// The generated token ids, where the response has them (vLLM's `return_token_ids`):
    /// kept in the JSON so that the hidden states of exactly these continuations can be
    /// captured (`scripts/vllm_capture.py --continuations`).
    pub token_ids: Option<Vec<u32>>,
    /// The model the response says answered (`model` of the OpenAI routes; SGLang's native
    /// `/generate` names none).
    pub model: Option<String>,
    /// The per-step histogram of accepted drafts, where the response has one (checked against
    /// `spec` by [`check_histogram`]): the synthetic-acceptance rates' counts.
    pub histogram: Option<Vec<u64>>,
}

/// The draft tokens a request committed: `min(accepted, completion_tokens − 1 − steps)` (the
/// prefill-sampled token and each step's bonus token are not drafts; fewer where some of the
/// request's tokens came from steps that drafted nothing), after checking that the engine's
/// own figure can come from this response: no more tokens than asked for, no more verify
/// steps than tokens after the prefill's, no accepted draft without a step, no more accepted
/// than `k` per step (32 where K is unknown), and no more accepted beyond the committed tokens
/// than one final step drafts (vLLM counts its final step before the cut at `max_tokens` or
/// EOS). `k` is the run's drafts per step where known. `Err` names
/// the contradiction; such a request is failed, never measured.
pub fn committed_drafts(
    spec: Spec,
    completion: u64,
    max_tokens: usize,
    k: Option<u64>,
) -> std::result::Result<u64, String> {
    if completion > max_tokens as u64 {
        return Err(format!(
            "{completion} completion tokens, more than the {max_tokens} asked for (max_tokens)"
        ));
    }
    let Some(room) = completion
        .checked_sub(1)
        .and_then(|c| c.checked_sub(spec.steps))
    else {
        if completion == 0 && spec.steps == 0 && spec.accepted == 0 {
            return Ok(0);
        }
        return Err(format!(
            "{} verify steps cannot have made {completion} completion tokens (each step commits at least one, after the prefill's)",
            spec.steps
        ));
    };
    if spec.steps == 0 && spec.accepted > 0 {
        return Err(format!(
            "{} accepted drafts without a verify step",
            spec.accepted
        ));
    }
    // Where no one says K, no step drafts more than the replay's deepest chain.
    let bound = k.unwrap_or(crate::runtime::matches::MAX_DEPTHS as u64);
    if spec.accepted > spec.steps.saturating_mul(bound) {
        return Err(match k {
            Some(k) => format!(
                "{} accepted drafts in {} steps of {k} drafts",
                spec.accepted, spec.steps
            ),
            None => format!(
                "{} accepted drafts in {} steps: no step drafts more than {bound}",
                spec.accepted, spec.steps
            ),
        });
    }
    if spec.accepted > room.saturating_add(bound) {
        return Err(format!(
            "{} accepted drafts, but {completion} completion tokens over {} verify steps hold at most {room}: only the final step may count drafts it did not commit, at most {bound}",
            spec.accepted, spec.steps
        ));
    }
    Ok(spec.accepted.min(room))
}

/// Server-wide cumulative counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counters {
    pub steps: u64,
    pub accepted: u64,
    /// Finished requests, where the engine counts them (a second client shows up here).
    pub requests: Option<u64>,
}

/// One preflight finding.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub msg: String,
    pub hint: String,
}

/// What the preflight read from the server.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Preflight {
    pub version: Option<String>,
    /// Drafts proposed per step, where the server says.
    pub num_spec_tokens: Option<u64>,
    /// Make the run meaningless: refused.
    pub errors: Vec<Finding>,
    /// Worth knowing; the run goes on.
    pub warnings: Vec<Finding>,
}

/// One engine's protocol.
pub trait Protocol: Send + Sync {
    fn engine(&self) -> Engine;
    /// The route and JSON body of the greedy request for `p`.
    fn request(&self, p: &LivePrompt, o: &RequestOptions) -> (String, Value);
    /// Read a response. `Err` for a response that breaks the engine's schema (a missing or
    /// mistyped field, figures that contradict each other).
    fn reply(&self, v: &Value) -> std::result::Result<Reply, String>;
    /// The server-wide counters now; `Ok(None)` where the engine exposes none kquant can
    /// difference.
    fn counters(&self, c: &Client) -> std::result::Result<Option<Counters>, Failure>;
    /// Whether reading the counters drains them (each read is the change since the last one,
    /// TensorRT-LLM's iteration stats) instead of a cumulative total.
    fn counters_drain(&self) -> bool {
        false
    }
    /// Whether the counters' accepted figure still holds each request's prefill-sampled token
    /// (SGLang's generated-token counter): the run takes 1 off per request.
    fn counters_count_prefill(&self) -> bool {
        false
    }
    /// Inspect the server before the run.
    fn preflight(&self, c: &Client) -> Result<Preflight>;
    /// How to turn the per-request figure on, for the error when a response lacks it.
    fn per_request_hint(&self) -> &'static str;
}

/// A non-negative integer field (`u64`), or why not.
pub(crate) fn count(v: &Value, key: &str) -> std::result::Result<Option<u64>, String> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_u64()
            .or_else(|| {
                x.as_f64()
                    .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 9.0e15)
                    .map(|f| f as u64)
            })
            .map(Some)
            .ok_or_else(|| format!("`{key}` is {x}, not a non-negative integer")),
    }
}

/// What every OpenAI-style response carries: `usage.completion_tokens`, `choices[0]`'s finish
/// reason and text (or message content), and `choices[0]` itself for the engine's own fields.
pub(crate) struct OpenAi<'a> {
    pub completion: u64,
    pub finish: Option<String>,
    pub output: Option<String>,
    /// The response's `model`.
    pub model: Option<String>,
    pub choice: &'a Value,
}

impl OpenAi<'_> {
    /// The reply of an engine whose response carries no more than these fields and its
    /// per-request acceptance `spec` (no drafts per step, no token ids).
    pub fn reply(self, spec: Option<(Spec, &'static str)>) -> Reply {
        Reply {
            completion_tokens: self.completion,
            finish_reason: self.finish,
            spec,
            output: self.output,
            num_spec_tokens: None,
            token_ids: None,
            model: self.model,
            histogram: None,
        }
    }
}

/// Read the [`OpenAi`] fields of a response.
pub(crate) fn openai_reply(v: &Value) -> std::result::Result<OpenAi<'_>, String> {
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or("has no `choices[0]`")?;
    let usage = v.get("usage").ok_or("has no `usage`")?;
    let completion =
        count(usage, "completion_tokens")?.ok_or("has no `usage.completion_tokens`")?;
    let finish = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .map(String::from);
    let output = choice
        .get("text")
        .and_then(Value::as_str)
        .or_else(|| choice.pointer("/message/content").and_then(Value::as_str))
        .map(String::from);
    let model = v.get("model").and_then(Value::as_str).map(String::from);
    Ok(OpenAi {
        completion,
        finish,
        output,
        model,
        choice,
    })
}

/// `choices[0].token_ids` (vLLM with `return_token_ids`), checked against
/// `usage.completion_tokens`; `Ok(None)` when absent.
pub(crate) fn token_ids(
    choice: &Value,
    completion: u64,
) -> std::result::Result<Option<Vec<u32>>, String> {
    let Some(ids) = choice.get("token_ids").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let ids: Vec<u32> = ids
        .as_array()
        .ok_or("`choices[0].token_ids` is not a list")?
        .iter()
        .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
        .collect::<Option<_>>()
        .ok_or("`choices[0].token_ids` holds something that is not a token id")?;
    if ids.len() as u64 != completion {
        return Err(format!(
            "`choices[0].token_ids` has {} ids, `usage.completion_tokens` says {completion}",
            ids.len()
        ));
    }
    Ok(Some(ids))
}

/// The body fields of an OpenAI-style greedy request for `p`: the route (`/v1/completions` for
/// token ids and text, `/v1/chat/completions` for messages) and the body.
pub(crate) fn openai_request(p: &LivePrompt, o: &RequestOptions) -> (String, Value) {
    use crate::verify::prompt_sets::Body;
    let mut body = serde_json::json!({
        "model": o.model,
        "max_tokens": o.max_tokens,
        // Always sent: the servers otherwise take the model's generation_config.json sampling.
        "temperature": 0.0,
        "n": 1,
        "stream": false,
        "ignore_eos": false,
    });
    let route = match &p.body {
        Body::Tokens(t) => {
            body["prompt"] = serde_json::json!(t);
            "/v1/completions"
        }
        Body::Text(t) => {
            body["prompt"] = serde_json::json!(t);
            "/v1/completions"
        }
        Body::Messages(m) => {
            body["messages"] = serde_json::json!(m);
            "/v1/chat/completions"
        }
    };
    (route.to_string(), body)
}

/// Check a per-step histogram (`key`: index j = verify steps that accepted j drafts, bonus
/// excluded, as vLLM's `acceptance_histogram` and SGLang's `spec_correct_drafts_histogram`)
/// against the step and accepted-draft counts beside it.
pub(crate) fn check_histogram(
    h: &Value,
    key: &str,
    steps: u64,
    accepted: u64,
) -> std::result::Result<(), String> {
    let h = h
        .as_array()
        .ok_or_else(|| format!("`{key}` is not a list"))?;
    let (mut n, mut a) = (0u64, 0u64);
    let overflow = || format!("`{key}` counts more than 2^64 steps or drafts");
    for (j, x) in h.iter().enumerate() {
        let c = x.as_u64().ok_or_else(|| format!("{key}[{j}] is {x}"))?;
        n = n.checked_add(c).ok_or_else(overflow)?;
        a = (j as u64)
            .checked_mul(c)
            .and_then(|jc| a.checked_add(jc))
            .ok_or_else(overflow)?;
    }
    if n != steps || a != accepted {
        return Err(format!(
            "the histogram counts {n} steps and {a} accepted drafts, the fields {steps} and {accepted}"
        ));
    }
    Ok(())
}

/// A histogram [`check_histogram`] accepted, as counts (`None`: absent, or not counts).
pub(crate) fn histogram_of(h: Option<&Value>) -> Option<Vec<u64>> {
    h?.as_array()?.iter().map(Value::as_u64).collect()
}

/// The `version` of a server's `GET /version` (vLLM, trtllm-serve); `None` when it has none.
pub(crate) fn served_version(c: &Client) -> Option<String> {
    c.get_json("/version")
        .ok()
        .and_then(|v| v.get("version").and_then(Value::as_str).map(String::from))
}

/// `major.minor.patch` of a version string (`0.5.12`, `v0.33.0rc1`, `0.29.0+cu128`), for the
/// version rules; `None` when it does not start with three numbers.
pub fn version_triple(v: &str) -> Option<(u64, u64, u64)> {
    let v = v.trim().trim_start_matches('v');
    let mut it = v.split(['.', '+', '-']);
    let num = |s: Option<&str>| -> Option<u64> {
        let s = s?;
        let d: String = s.chars().take_while(|c| c.is_ascii_digit()).collect();
        d.parse().ok()
    };
    Some((
        num(it.next())?,
        num(it.next())?,
        num(it.next()).unwrap_or(0),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_the_way_the_engines_print_them() {
        assert_eq!(version_triple("0.5.12"), Some((0, 5, 12)));
        assert_eq!(version_triple("v0.33.0rc1"), Some((0, 33, 0)));
        assert_eq!(version_triple("0.29.0+cu128"), Some((0, 29, 0)));
        assert_eq!(version_triple("1.2"), Some((1, 2, 0)));
        assert_eq!(version_triple("dev"), None);
    }

    #[test]
    fn counts_refuse_what_is_not_a_count() {
        let v = serde_json::json!({"a": 3, "b": 3.0, "c": -1, "d": 2.5, "e": "3"});
        assert_eq!(count(&v, "a"), Ok(Some(3)));
        assert_eq!(count(&v, "b"), Ok(Some(3)));
        assert_eq!(count(&v, "z"), Ok(None));
        for k in ["c", "d", "e"] {
            assert!(count(&v, k).is_err(), "{k}");
        }
    }
}
