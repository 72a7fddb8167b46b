//! Sending a prompt set to an engine: `concurrency` requests in flight, each with the client's
//! timeout and up to `retries` more tries after a transport failure, a 5xx or a 429. A request
//! that still fails is reported as failed and never counted as a measurement. Where a response
//! carries no per-request acceptance, `server_counters` measures each request from the
//! engine's server-wide counters read just before and just after it, one request at a time,
//! and refuses the run when the counters show another client's requests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

use super::client::Client;
use super::engine::{committed_drafts, Counters, Protocol, Reply, RequestOptions, Spec};
use crate::error::{Error, Result};
use crate::verify::prompt_sets::LivePrompt;

/// The source of a figure measured from the server-wide counters.
pub const SERVER_COUNTERS: &str = "server counters";

/// How to send.
#[derive(Debug, Clone)]
pub struct Options {
    pub request: RequestOptions,
    pub concurrency: usize,
    pub retries: usize,
    /// Measure from the server-wide counters when a response has no per-request figure.
    pub server_counters: bool,
    /// Drafts per verify step, where the preflight found it (each response's own figure wins).
    pub spec_tokens: Option<u64>,
    /// Failed requests tolerated (`--max-failed`): once more have failed, the run's exit 2 is
    /// certain and no further prompt is sent.
    pub max_failures: usize,
    /// Measure responses that name another model than the one requested
    /// (`--allow-other-model`); without, the first such response refuses the run.
    pub allow_other_model: bool,
}

/// The outcome of a prompt never sent because more than `--max-failed` had already failed.
pub const NOT_SENT: &str = "not sent: more requests than --max-failed allows had already failed";

/// One measured request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measured {
    /// Verify steps and accepted drafts as the engine reports them.
    pub spec: Spec,
    /// The draft tokens the request committed: `completion_tokens − 1 − steps`. Below
    /// `spec.accepted` where the engine counts its final step before the cut (vLLM).
    pub committed: u64,
    /// Drafts per verify step, where the response says.
    pub num_spec_tokens: Option<u64>,
    /// The generated token ids, where the response has them.
    pub token_ids: Option<Vec<u32>>,
    pub completion_tokens: u64,
    pub finish_reason: Option<String>,
    /// The generated text or ids (to compare two deployments' greedy outputs).
    #[serde(skip)]
    pub output: Option<String>,
    /// Where the figure came from: the response field, or `server counters`.
    pub source: String,
    /// The model the response says answered, where it names one.
    pub model: Option<String>,
    /// The response's per-step histogram of accepted drafts, where the figure came from it.
    #[serde(skip)]
    pub histogram: Option<Vec<u64>>,
}

impl Measured {
    /// `reply` measured: its figure `spec` (read from `source`) and the drafts it committed.
    fn of(reply: &Reply, spec: Spec, committed: u64, source: String) -> Measured {
        Measured {
            spec,
            committed,
            num_spec_tokens: reply.num_spec_tokens,
            token_ids: reply.token_ids.clone(),
            completion_tokens: reply.completion_tokens,
            finish_reason: reply.finish_reason.clone(),
            output: reply.output.clone(),
            source,
            model: reply.model.clone(),
            // The histogram belongs to the response's own figure, not to server counters.
            histogram: reply.spec.and(reply.histogram.clone()),
        }
    }
}

/// One prompt's outcome.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub result: std::result::Result<Measured, String>,
    pub attempts: usize,
}

/// What a run sent: each prompt's outcome, in prompt order, and the run's K.
#[derive(Debug, Clone)]
pub struct Sent {
    pub outcomes: Vec<Outcome>,
    /// Drafts per verify step, one value for the whole run: the preflight's, else the first
    /// (in prompt order) measured response's; `None` where neither says.
    pub spec_tokens: Option<u64>,
}

/// Send every prompt; outcomes in prompt order. `progress` is told each finished prompt. An
/// error (exit 2) where the run cannot mean anything: a response without a per-request figure
/// and no `server_counters`, counters that other traffic moved. Every measured response is
/// then held to the run's one K ([`hold_to_one_k`]).
pub fn send(
    proto: &dyn Protocol,
    c: &Client,
    prompts: &[LivePrompt],
    o: &Options,
    progress: &(dyn Fn() + Sync),
) -> Result<Sent> {
    let slots: Vec<Mutex<Option<Outcome>>> = prompts.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let failures = AtomicUsize::new(0);
    let fatal: Mutex<Option<Error>> = Mutex::new(None);
    // With the counters as the fallback, one request at a time: the counters move only for it.
    let workers = if o.server_counters {
        1
    } else {
        o.concurrency.max(1)
    };
    std::thread::scope(|s| {
        for _ in 0..workers.min(prompts.len().max(1)) {
            s.spawn(|| loop {
                if fatal.lock().expect("fatal").is_some() {
                    return;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(p) = prompts.get(i) else {
                    return;
                };
                if failures.load(Ordering::Relaxed) > o.max_failures {
                    *slots[i].lock().expect("slot") = Some(Outcome {
                        result: Err(NOT_SENT.into()),
                        attempts: 0,
                    });
                    progress();
                    continue;
                }
                match one(proto, c, p, o) {
                    Ok(out) => {
                        if out.result.is_err() {
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                        *slots[i].lock().expect("slot") = Some(out)
                    }
                    Err(e) => {
                        fatal.lock().expect("fatal").get_or_insert(e);
                        return;
                    }
                }
                progress();
            });
        }
    });
    if let Some(e) = fatal.into_inner().expect("fatal") {
        return Err(e);
    }
    let mut outcomes: Vec<Outcome> = slots
        .into_iter()
        .map(|s| s.into_inner().expect("slot").expect("every prompt sent"))
        .collect();
    let spec_tokens = hold_to_one_k(proto, prompts, &mut outcomes, o);
    Ok(Sent {
        outcomes,
        spec_tokens,
    })
}

/// K is one value per run: the preflight's, else the first measured response's (in prompt
/// order, whatever the concurrency). A response that claims another K is a failed request; one
/// that omits it is held to the run's K; each is checked again against its own token counts
/// with that K ([`committed_drafts`]), and one that cannot hold is a failed request, never
/// measured (one poisoned response would otherwise pass 40 tokens off as one verify step).
pub fn hold_to_one_k(
    proto: &dyn Protocol,
    prompts: &[LivePrompt],
    outcomes: &mut [Outcome],
    o: &Options,
) -> Option<u64> {
    let (k, from) = match o.spec_tokens {
        Some(k) => (Some(k), "the preflight's"),
        None => (
            outcomes
                .iter()
                .find_map(|x| x.result.as_ref().ok().and_then(|m| m.num_spec_tokens)),
            "the first answer's",
        ),
    };
    for (out, p) in outcomes.iter_mut().zip(prompts) {
        let Ok(m) = &mut out.result else { continue };
        let route = proto.request(p, &o.request).0;
        let held = match (k, m.num_spec_tokens) {
            (Some(k), Some(x)) if x != k => Err(format!(
                "{route}: the response claims {x} drafts per verify step (`num_spec_tokens`), the run's K = {k} ({from}): K is one value per run"
            )),
            _ => committed_drafts(m.spec, m.completion_tokens, o.request.max_tokens, k).map_err(
                |e| format!("{route}: {} contradicts the response: {e}", m.source),
            ),
        };
        match held {
            Ok(c) => m.committed = c,
            Err(e) => out.result = Err(e),
        }
    }
    k
}

fn one(proto: &dyn Protocol, c: &Client, p: &LivePrompt, o: &Options) -> Result<Outcome> {
    let (route, body) = proto.request(p, &o.request);
    let mut attempts = 0;
    loop {
        attempts += 1;
        let before = if o.server_counters {
            match proto.counters(c) {
                Ok(x) => x,
                Err(f) if f.retryable && attempts <= o.retries => {
                    backoff(attempts);
                    continue;
                }
                Err(f) => return Ok(failed(format!("/metrics: {}", f.msg), attempts)),
            }
        } else {
            None
        };
        let r = match c.post_json(&route, &body) {
            Ok(v) => v,
            Err(f) if f.retryable && attempts <= o.retries => {
                backoff(attempts);
                continue;
            }
            Err(f) => return Ok(failed(format!("{route}: {}", f.msg), attempts)),
        };
        let reply = match proto.reply(&r) {
            Ok(x) => x,
            Err(msg) => {
                return Ok(failed(
                    format!(
                        "{route}: the response breaks {}'s schema: {msg}",
                        proto.engine().id()
                    ),
                    attempts,
                ))
            }
        };
        // A response from another model than the one asked for measures that model's draft.
        if let Some(m) = reply.model.as_deref() {
            if m != o.request.model && !o.allow_other_model {
                return Err(Error::Endpoint {
                    url: c.url(&route),
                    msg: format!(
                        "answered as model `{}`, not `{}` as requested: the accept length would be another model's",
                        crate::escape::printable(m),
                        crate::escape::printable(&o.request.model)
                    ),
                    hint: Some(format!(
                        "check --endpoint and --model (the server's --served-model-name); if `{}` is the model you mean (an alias of it), pass --model with it, or --allow-other-model to measure it anyway (the report names the answering model)",
                        crate::escape::printable(m)
                    )),
                });
            }
        }
        // Every figure is checked against the response it came with before it is measured.
        let measured = |spec: Spec, source: String| -> std::result::Result<Measured, String> {
            let k = o.spec_tokens.or(reply.num_spec_tokens);
            let committed =
                committed_drafts(spec, reply.completion_tokens, o.request.max_tokens, k)
                    .map_err(|e| format!("{route}: {source} contradicts the response: {e}"))?;
            Ok(Measured::of(&reply, spec, committed, source))
        };
        if let Some((spec, field)) = reply.spec {
            return Ok(Outcome {
                result: measured(spec, field.to_string()),
                attempts,
            });
        }
        if !o.server_counters {
            return Err(Error::Endpoint {
                url: c.url(&route),
                msg: format!(
                    "{} returned no per-request acceptance: the figure kquant reads is not in the response",
                    proto.engine().id()
                ),
                hint: Some(proto.per_request_hint().into()),
            });
        }
        let after = match proto.counters(c) {
            Ok(x) => x,
            Err(f) => return Ok(failed(format!("/metrics: {}", f.msg), attempts)),
        };
        let none = || Error::Endpoint {
            url: c.url("/metrics"),
            msg: format!(
                "{} exposes no server-wide speculative-decoding counters either",
                proto.engine().id()
            ),
            hint: Some(proto.per_request_hint().into()),
        };
        let delta = if proto.counters_drain() {
            // Each read is what happened since the last: the one before the request drained.
            after.ok_or_else(none)?
        } else {
            let (Some(b), Some(a)) = (before, after) else {
                return Err(none());
            };
            if a.steps < b.steps || a.accepted < b.accepted {
                return Ok(failed(
                    "the server-wide counters went backwards during the request (the server restarted?)".into(),
                    attempts,
                ));
            }
            if let (Some(rb), Some(ra)) = (b.requests, a.requests) {
                if ra.checked_sub(rb) != Some(1) {
                    return Err(Error::Endpoint {
                        url: c.url("/metrics"),
                        msg: format!(
                            "{} requests finished on the server during one of kquant's: the server-wide counters include another client's traffic",
                            ra as i128 - rb as i128
                        ),
                        hint: Some("--server-counters needs the server to itself; or enable the engine's per-request figure".into()),
                    });
                }
            }
            let prefill = u64::from(proto.counters_count_prefill());
            let Some(accepted) = (a.accepted - b.accepted).checked_sub(prefill) else {
                return Ok(failed(
                    "the server-wide counters did not move for the request".into(),
                    attempts,
                ));
            };
            Counters {
                steps: a.steps - b.steps,
                accepted,
                requests: None,
            }
        };
        return Ok(Outcome {
            result: measured(
                Spec {
                    steps: delta.steps,
                    accepted: delta.accepted,
                },
                SERVER_COUNTERS.into(),
            ),
            attempts,
        });
    }
}

fn failed(msg: String, attempts: usize) -> Outcome {
    Outcome {
        result: Err(msg),
        attempts,
    }
}

fn backoff(attempt: usize) {
    std::thread::sleep(Duration::from_millis(200 * attempt.min(10) as u64));
}
/// `verify --max-failed`: failed requests tolerated, a count (`3`) or a share of the prompts
/// (`5%`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MaxFailed {
    Count(usize),
    Percent(f64),
}

impl MaxFailed {
    /// Failed requests tolerated out of `n`.
    pub fn of(self, n: usize) -> usize {
        match self {
            MaxFailed::Count(c) => c,
            MaxFailed::Percent(p) => (p / 100.0 * n as f64).floor() as usize,
        }
    }
}
