//! Live verify (`kquant verify --endpoint URL --engine vllm|sglang|trtllm`): a prompt set sent,
//! greedy, to the user's own serving engine, and the accept length read back per request from
//! the engine's own fields — or, when the engine gives none and the run has the server alone,
//! from its server-wide counters sampled around each request. `client` is the HTTP side,
//! `engine` the [`engine::Protocol`] every engine implements (`vllm`, `sglang`, `trtllm`),
//! `prometheus` the `/metrics` pages, `run` the requests (concurrency, timeouts, retries),
//! `measure` a whole live verify (both deployments measured, gated, reported).
//! docs/verify.md, "Live: measure on your serving engine".

pub mod client;
pub mod engine;
pub mod measure;
pub mod prometheus;
pub mod run;
pub mod sglang;
pub mod trtllm;
pub mod vllm;

use serde_json::Value;

use client::Client;
use engine::{Engine, Protocol};

use crate::error::{Error, Result};

/// The protocol of `engine`.
pub fn protocol(engine: Engine) -> Box<dyn Protocol> {
    match engine {
        Engine::Vllm => Box::new(vllm::Vllm),
        Engine::Sglang => Box::new(sglang::Sglang),
        Engine::Trtllm => Box::new(trtllm::Trtllm),
    }
}

/// What `/v1/models` says: the engine (`owned_by`: `vllm`, `sglang`, `tensorrt_llm`) and the
/// first served model's id.
pub fn identify(c: &Client) -> Result<(Option<Engine>, Option<String>)> {
    let v = c.get_json("/v1/models").map_err(|f| Error::Endpoint {
        url: c.url("/v1/models"),
        msg: format!("cannot list the served models: {}", f.msg),
        hint: Some("check that the server is up and --endpoint is its base URL (e.g. http://127.0.0.1:8000)".into()),
    })?;
    let first = v
        .get("data")
        .and_then(Value::as_array)
        .and_then(|d| d.first());
    let id = first
        .and_then(|m| m.get("id"))
        .and_then(Value::as_str)
        .map(String::from);
    let engine = match first
        .and_then(|m| m.get("owned_by"))
        .and_then(Value::as_str)
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("vllm") => Some(Engine::Vllm),
        Some("sglang") => Some(Engine::Sglang),
        Some("tensorrt_llm" | "tensorrt-llm" | "trtllm") => Some(Engine::Trtllm),
        _ => None,
    };
    Ok((engine, id))
}

/// The engine to speak to: `given`, or the one `/v1/models` names.
pub fn resolve(c: &Client, given: Option<Engine>) -> Result<(Engine, Option<String>)> {
    let (seen, model) = match identify(c) {
        Ok(x) => x,
        // An engine named by the user may still answer without /v1/models (SGLang /generate).
        Err(_) if given.is_some() => (None, None),
        Err(e) => return Err(e),
    };
    match (given, seen) {
        (None, Some(e)) => Ok((e, model)),
        (None, None) => Err(Error::Endpoint {
            url: c.url("/v1/models"),
            msg: "cannot tell which engine serves it (`owned_by` of the first model is not vllm, sglang or tensorrt_llm)".into(),
            hint: Some("pass --engine vllm|sglang|trtllm".into()),
        }),
        (Some(g), Some(s)) if g != s => Err(Error::Endpoint {
            url: c.url("/v1/models"),
            msg: format!("is served by {} (`owned_by`), not {}", s.id(), g.id()),
            hint: Some(format!("pass --engine {} (or leave --engine out)", s.id())),
        }),
        (Some(g), _) => Ok((g, model)),
    }
}
