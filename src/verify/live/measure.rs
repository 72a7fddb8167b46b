//! A live verify (`verify --endpoint URL [--baseline-endpoint URL] --prompts FILE`): the
//! prompt set sent, greedy, to the user's running engine (and to the baseline deployment);
//! each request's accept length read back from the engine's own fields; the gate, the table,
//! the JSON and the JUnit are offline verify's, over the prompts both deployments answered.
//! Errors: a preflight that makes the figure meaningless, too many failed requests, nothing
//! measured.

use std::path::PathBuf;
use std::time::Duration;

use super::client::Client;
use super::engine::{Engine, Preflight, RequestOptions};
use super::run::{self, MaxFailed, Measured, Outcome};
use super::{protocol, resolve};
use crate::error::{Error, Result};
use crate::target::profile;
use crate::verify::degenerate::{self, Continuation};
use crate::verify::gate::{self, decide, Thresholds};
use crate::verify::prompt_sets::{self, LivePrompt};
use crate::verify::published::{self, Count};
use crate::verify::report::schema::{
    Failed, Finding, Live, LiveRequest, LiveSide, LiveTail, SameOutput, Tail,
};
use crate::verify::report::{self, Run, Verdict};
use crate::verify::walk::Walk;

/// What a live verify is asked: the flags, typed.
#[derive(Debug, Clone)]
pub struct Request {
    /// The server that serves the target with the draft.
    pub endpoint: String,
    /// A second server to compare with (paired ΔAL over the same prompts).
    pub baseline_endpoint: Option<String>,
    /// The serving engine (`None`: told by `/v1/models`).
    pub engine: Option<Engine>,
    /// The served model name (the first of `/v1/models` without).
    pub model: Option<String>,
    /// A target profile: a built-in name or a JSON file.
    pub target: Option<String>,
    /// The prompt set (the live profile's bundled set without).
    pub prompts: Option<PathBuf>,
    pub prompt_format: prompt_sets::SetFormat,
    /// How raw text is sent: as a user message through the chat template, or as it is.
    pub text_mode: prompt_sets::TextMode,
    /// The first N prompts of each category.
    pub limit_per_category: Option<usize>,
    pub max_tokens: usize,
    pub concurrency: usize,
    /// Seconds one request may take.
    pub request_timeout: u64,
    pub retries: usize,
    pub max_failed: MaxFailed,
    pub server_counters: bool,
    /// Measure responses that name another model than the one requested.
    pub allow_other_model: bool,
    /// A draft whose published accept lengths the profile quotes, as a floor.
    pub published: Option<String>,
    pub thresholds: Thresholds,
}

/// One deployment's run: where, what the preflight found, each prompt's outcome.
struct Side {
    url: String,
    engine: Engine,
    model: String,
    preflight: Preflight,
    outcomes: Vec<Outcome>,
    /// The run's one K (drafts per verify step), where known.
    spec_tokens: Option<u64>,
}

impl Side {
    /// What `what` says of each measured response, sorted, each once.
    fn measured(&self, what: impl Fn(&Measured) -> Option<String>) -> Vec<String> {
        let mut v: Vec<String> = self
            .outcomes
            .iter()
            .filter_map(|o| o.result.as_ref().ok().and_then(&what))
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

/// A request as the gate counts it: the committed tokens per verify step; what the engine
/// counted beyond them (its final step before the cut) kept beside.
fn walk_of(m: &Measured) -> Walk {
    Walk {
        rounds: m.spec.steps,
        committed: m.spec.steps + m.committed,
        requests: 1,
        engine_extra: m.spec.accepted - m.committed,
        accepted_hist: m.histogram.clone().unwrap_or_default(),
        ..Walk::default()
    }
}

/// A deployment after its preflight, before any prompt is sent.
struct Connected {
    client: Client,
    engine: Engine,
    proto: Box<dyn super::engine::Protocol>,
    model: String,
    /// The model `--model` or `/v1/models` names (`None`: neither does).
    named: Option<String>,
    preflight: Preflight,
}

/// Resolve the engine and run the preflight (errors refuse the run, warnings go to stderr),
/// all of it within one `--request-timeout`: a server that does not answer costs that once.
fn connect(url: &str, a: &Request, what: &str) -> Result<Connected> {
    let t = Duration::from_secs(a.request_timeout);
    let c = Client::new(url, t)?;
    let pc = c.until(std::time::Instant::now() + t);
    let (engine, served) = resolve(&pc, a.engine)?;
    let proto = protocol(engine);
    let preflight = proto.preflight(&pc)?;
    for w in &preflight.warnings {
        // Findings quote the server's own strings (its version): escaped for the terminal.
        eprintln!(
            "warning: {what} ({}): {}\nhint: {}",
            engine.id(),
            crate::escape::printable(&w.msg),
            crate::escape::printable(&w.hint)
        );
    }
    if let Some(e) = preflight.errors.first() {
        let more = preflight.errors[1..]
            .iter()
            .map(|e| format!("; {}", e.msg))
            .collect::<String>();
        return Err(Error::Endpoint {
            url: c.base().to_string(),
            msg: format!("preflight: {}{more}", e.msg),
            hint: Some(e.hint.clone()),
        });
    }
    let named = a.model.clone().or(served);
    let model = match &named {
        Some(m) => m.clone(),
        None if engine == Engine::Sglang => "default".into(),
        None => {
            return Err(Error::Endpoint {
                url: c.url("/v1/models"),
                msg: "lists no served model to name in the requests".into(),
                hint: Some("pass --model NAME (the server's --served-model-name)".into()),
            })
        }
    };
    Ok(Connected {
        client: c,
        engine,
        proto,
        model,
        named,
        preflight,
    })
}

/// Send every prompt to a connected deployment.
fn measure(k: Connected, a: &Request, prompts: &[LivePrompt], what: &str) -> Result<Side> {
    let o = run::Options {
        request: RequestOptions {
            model: k.model.clone(),
            max_tokens: a.max_tokens,
        },
        concurrency: a.concurrency,
        retries: a.retries,
        server_counters: a.server_counters,
        spec_tokens: k.preflight.num_spec_tokens,
        max_failures: a.max_failed.of(prompts.len()),
        allow_other_model: a.allow_other_model,
    };
    let pb = crate::progress::items(prompts.len() as u64, what, "requests");
    let sent = run::send(k.proto.as_ref(), &k.client, prompts, &o, &|| pb.inc(1))?;
    pb.finish_and_clear();
    Ok(Side {
        url: k.client.base().to_string(),
        engine: k.engine,
        model: k.model,
        preflight: k.preflight,
        outcomes: sent.outcomes,
        spec_tokens: sent.spec_tokens,
    })
}

/// A deployment's run as the report states it.
fn side_doc(s: &Side, prompts: &[LivePrompt]) -> LiveSide {
    let sources = s.measured(|m| Some(m.source.clone()));
    let failed: Vec<Failed> = s
        .outcomes
        .iter()
        .zip(prompts)
        .filter_map(|(o, p)| {
            o.result.as_ref().err().map(|e| Failed {
                id: p.id.clone(),
                category: p.category.clone(),
                error: e.clone(),
                attempts: o.attempts,
            })
        })
        .collect();
    // Each measured request: what the engine reported for it.
    let requests: Vec<LiveRequest> = s
        .outcomes
        .iter()
        .zip(prompts)
        .filter_map(|(o, p)| {
            o.result.as_ref().ok().map(|m| {
                let committed = super::engine::Spec {
                    steps: m.spec.steps,
                    accepted: m.committed,
                };
                LiveRequest {
                    id: p.id.clone(),
                    category: p.category.clone(),
                    steps: m.spec.steps,
                    accepted: m.spec.accepted,
                    accept_length_engine: m.spec.accept_length(),
                    committed: m.committed,
                    accept_length: committed.accept_length(),
                    completion_tokens: m.completion_tokens,
                    finish_reason: m.finish_reason.clone(),
                    source: m.source.clone(),
                    attempts: o.attempts,
                    token_ids: m.token_ids.clone(),
                    model: m.model.clone(),
                }
            })
        })
        .collect();
    LiveSide {
        endpoint: s.url.clone(),
        engine: s.engine,
        version: s.preflight.version.clone(),
        model: s.model.clone(),
        num_spec_tokens: s.spec_tokens,
        answered_by: answered_by(s),
        measured: s.outcomes.iter().filter(|o| o.result.is_ok()).count(),
        sources,
        failed,
        warnings: s
            .preflight
            .warnings
            .iter()
            .map(|w| Finding {
                msg: w.msg.clone(),
                hint: w.hint.clone(),
            })
            .collect(),
        retried: s.outcomes.iter().filter(|o| o.attempts > 1).count(),
        requests,
    }
}

/// The models the side's measured responses say answered them (sorted, each once).
fn answered_by(s: &Side) -> Vec<String> {
    s.measured(|m| m.model.clone())
}

/// Refuse a side with more failed requests than `--max-failed` allows.
fn check_failed(s: &Side, prompts: &[LivePrompt], a: &Request) -> Result<()> {
    let failed: Vec<(usize, &String)> = s
        .outcomes
        .iter()
        .enumerate()
        .filter_map(|(i, o)| o.result.as_ref().err().map(|e| (i, e)))
        .collect();
    let allowed = a.max_failed.of(prompts.len());
    let unsent = failed.iter().filter(|(_, e)| *e == run::NOT_SENT).count();
    if failed.len() > allowed {
        let (i, e) = failed
            .iter()
            .find(|(_, e)| *e != run::NOT_SENT)
            .copied()
            .unwrap_or(failed[0]);
        return Err(Error::Endpoint {
            url: s.url.clone(),
            msg: format!(
                "{} of {} requests failed (more than --max-failed allows, {allowed}){}; the first, prompt `{}`: {e}",
                failed.len() - unsent,
                prompts.len(),
                if unsent > 0 {
                    format!(", and the other {unsent} were not sent once that was certain")
                } else {
                    String::new()
                },
                crate::escape::printable(&prompts[i].id)
            ),
            hint: Some("check the server's log; a failed request is never measured (--request-timeout, --retries and --max-failed tune the tolerance)".into()),
        });
    }
    Ok(())
}

/// With `--published`: the benchmark the prompts are, refused (before any request) when they
/// are none, or when the profile quotes no figure for this draft on it.
fn published_benchmark(
    a: &Request,
    profile: Option<&profile::Profile>,
    format: prompt_sets::SetFormat,
    prompts: &[LivePrompt],
) -> Result<Option<&'static str>> {
    Ok(match &a.published {
        None => None,
        Some(name) => {
            let bench = published::benchmark_of_file(format, prompts.iter().map(|p| p.dataset.as_str()))
            .ok_or_else(|| Error::Flags {
                msg: format!("--published compares with a benchmark's figures; `{}` prompts are no benchmark", format.name()),
                hint: "send the benchmark's own prompt file (MT-Bench question.jsonl, GSM8K test.jsonl, …; or a plain file whose records all name it in `dataset`, as quant-configs/prompts/mt_bench.jsonl does) or name its format with --prompt-format".into(),
            })?;
            // The profile must quote a figure for this draft on this benchmark (overall or a
            // category the prompts have): refused now, not after every request was sent.
            if let Some(p) = profile {
                let cats: Vec<(String, f64, usize)> = prompts
                    .iter()
                    .map(category_of)
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .map(|c| (c, 0.0, 0))
                    .collect();
                published::checks_of(Count::Walk, p, name, bench, (0.0, 0), &cats, 0.0)?;
            }
            Some(bench)
        }
    })
}

/// The published figures are the target's: a warning when the server names another model.
fn warn_other_target(a: &Request, profile: Option<&profile::Profile>, k: &Connected) {
    let (Some(_), Some(p), Some(m)) = (&a.published, profile, &k.named) else {
        return;
    };
    if !published::names_target(m, p) {
        eprintln!(
            "warning: the endpoint serves `{}`, which does not name target `{}`{}: --published holds it against that target's published figures; check --endpoint and --target",
            crate::escape::printable(m),
            p.name,
            p.hf_id.as_deref().map(|h| format!(" ({h})")).unwrap_or_default()
        );
    }
}

/// A paired gate of a deployment against itself measures nothing: refused before any request.
fn refuse_same_server(a: &Request, url: &str) -> Result<()> {
    if let Some(b) = &a.baseline_endpoint {
        let t = Duration::from_secs(a.request_timeout);
        if Client::new(url, t)?
            .server()
            .same_as(&Client::new(b, t)?.server())
        {
            return Err(Error::Flags {
                msg: format!("--baseline-endpoint {b} is the same server as --endpoint {url}: the paired ΔAL would be 0 whatever the draft"),
                hint: "serve the baseline draft (e.g. the BF16 one) on another server and give its URL".into(),
            });
        }
    }
    Ok(())
}

/// With `--published`: the profile's figures for this draft on the prompts' benchmark, overall
/// and per category, each a floor the measurement must meet; a floor missed fails `decision`.
fn published_floors(
    a: &Request,
    profile: Option<&profile::Profile>,
    bench: Option<&'static str>,
    d: &Run,
    cats: &[String],
    decision: &mut gate::Decision,
) -> Result<Option<Vec<published::Check>>> {
    Ok(match &a.published {
        None => None,
        Some(name) => {
            let p = profile
                .as_ref()
                .expect("clap requires --target with --published");
            let bench = bench.expect("checked before the requests");
            let mut by_cat: std::collections::BTreeMap<&str, (Walk, usize)> = Default::default();
            for (w, c) in d.samples.iter().zip(cats) {
                let e = by_cat.entry(c.as_str()).or_default();
                e.0.add(w);
                e.1 += 1;
            }
            let per_cat: Vec<(String, f64, usize)> = by_cat
                .iter()
                .map(|(c, (w, n))| (c.to_string(), w.al_walk(), *n))
                .collect();
            let cs = published::checks_of(
                Count::Walk,
                p,
                name,
                bench,
                (
                    gate::micro_al(&d.samples.iter().collect::<Vec<_>>()),
                    d.samples.len(),
                ),
                &per_cat,
                a.thresholds.max_regression,
            )?;
            for c in cs.iter().filter(|c| !c.passed) {
                decision.passed = false;
                decision
                    .reasons
                    .push(published::reason(c, name, a.thresholds.max_regression));
            }
            Some(cs)
        }
    })
}

/// A prompt's category as the report names it (`all` for a prompt without one).
fn category_of(p: &LivePrompt) -> String {
    match p.category.as_str() {
        "" => "all".to_string(),
        c => c.to_string(),
    }
}

/// The prompt file (`--prompts`, else the live profile's bundled set), its format, and the
/// prompts to send: the first `--per-category` of each, in the text mode asked.
fn read_prompts(
    a: &Request,
    profile: Option<&profile::Profile>,
) -> Result<(PathBuf, prompt_sets::SetFormat, Vec<LivePrompt>)> {
    let file: PathBuf = match (&a.prompts, profile.and_then(|p| p.live.as_ref())) {
        (Some(p), _) => p.clone(),
        (None, Some(live)) => live.resolve(&live.prompts)?,
        (None, None) => {
            return Err(Error::Flags {
                msg: "--endpoint needs prompts to send".into(),
                hint: "give --prompts FILE (MT-Bench question.jsonl, GSM8K, HumanEval, plain jsonl…; docs/verify.md, \"Live\")".into(),
            })
        }
    };
    let (format, mut prompts) = prompt_sets::read(&file, a.prompt_format)?;
    let keep = prompt_sets::per_category(&prompts, a.limit_per_category);
    prompts = keep.into_iter().map(|i| prompts[i].clone()).collect();
    // The text mode the capture script uses, so that live and offline measure one input.
    prompt_sets::apply_text_mode(&mut prompts, a.text_mode);
    Ok((file, format, prompts))
}

/// Both preflights before any prompt is sent, then every prompt to the draft's deployment
/// and to the baseline's; a side with too many failed requests refused.
fn measure_both(
    a: &Request,
    profile: Option<&profile::Profile>,
    prompts: &[LivePrompt],
) -> Result<(Side, Option<Side>)> {
    refuse_same_server(a, &a.endpoint)?;
    let draft = connect(&a.endpoint, a, "draft")?;
    warn_other_target(a, profile, &draft);
    let baseline = a
        .baseline_endpoint
        .as_deref()
        .map(|b| connect(b, a, "baseline"))
        .transpose()?;
    let draft = measure(draft, a, prompts, "draft")?;
    check_failed(&draft, prompts, a)?;
    let baseline = match baseline {
        Some(k) => {
            let s = measure(k, a, prompts, "baseline")?;
            check_failed(&s, prompts, a)?;
            Some(s)
        }
        None => None,
    };
    Ok((draft, baseline))
}

/// Each of the prompts `both`'s continuation on a side: its token ids, else its text.
fn continuations<'a>(
    s: &'a Side,
    both: &[usize],
    prompts: &[LivePrompt],
) -> Vec<(String, Option<Continuation<'a>>)> {
    both.iter()
        .map(|&i| {
            let m = measured(s, i);
            let c = match (&m.token_ids, &m.output) {
                (Some(t), _) => Some(Continuation::Tokens(t)),
                (None, Some(o)) => Some(Continuation::Text(o)),
                (None, None) => None,
            };
            (prompts[i].id.clone(), c)
        })
        .collect()
}

/// Prompt `i`'s measurement on a side that measured it.
fn measured(s: &Side, i: usize) -> &Measured {
    s.outcomes[i].result.as_ref().expect("measured")
}

/// The prompts every deployment measured (the paired figures are over these alone) and each
/// side's run over them; an error when they ran no verify step.
fn paired(
    a: &Request,
    draft: &Side,
    baseline: Option<&Side>,
) -> Result<(Vec<usize>, Run, Option<Run>)> {
    let both: Vec<usize> = (0..draft.outcomes.len())
        .filter(|&i| {
            draft.outcomes[i].result.is_ok()
                && baseline.is_none_or(|b| b.outcomes[i].result.is_ok())
        })
        .collect();
    let run_of = |s: &Side, name: &str| Run {
        name: name.to_string(),
        samples: both.iter().map(|&i| walk_of(measured(s, i))).collect(),
        matches: Vec::new(),
    };
    let d = run_of(draft, &a.endpoint);
    let b = baseline.map(|s| run_of(s, a.baseline_endpoint.as_deref().unwrap_or("")));
    let steps: u64 = d.samples.iter().map(|w| w.rounds).sum();
    if both.is_empty() || steps == 0 {
        return Err(Error::Endpoint {
            url: a.endpoint.clone(),
            msg: if both.is_empty() {
                "no request was measured: a gate over nothing cannot pass".into()
            } else {
                format!(
                    "none of the {} measured requests ran a verify step: speculative decoding is off, or the engine switched it off",
                    both.len()
                )
            },
            hint: Some("serve the target with the draft (docs/verify.md, \"Launch lines\"), and check the engine's log for speculation being disabled".into()),
        });
    }
    Ok((both, d, b))
}

/// The two deployments' greedy outputs compared over `both`; a warning where they differ.
fn same_output(draft: &Side, s: &Side, both: &[usize], warnings: &mut Vec<String>) -> SameOutput {
    let (mut compared, mut equal) = (0usize, 0usize);
    for &i in both {
        if let (Some(x), Some(y)) = (&measured(draft, i).output, &measured(s, i).output) {
            compared += 1;
            equal += usize::from(x == y);
        }
    }
    if equal < compared {
        warnings.push(format!("the two deployments' greedy outputs differ on {} of {compared} prompts: their targets differ, or their numerics do (batch composition; vLLM VLLM_BATCH_INVARIANT=1, SGLang --enable-deterministic-inference); the paired ΔAL then compares different continuations", compared - equal));
    }
    SameOutput { compared, equal }
}

/// What each side's sources and answers mean for its figures: server-wide counters, a
/// `--server-counters` not used, responses from another model.
fn side_warnings(a: &Request, sides: [(&str, Option<&Side>); 2], warnings: &mut Vec<String>) {
    for (side, s) in sides {
        let Some(s) = s else { continue };
        let n = s
            .outcomes
            .iter()
            .filter(|o| {
                o.result
                    .as_ref()
                    .is_ok_and(|m| m.source == run::SERVER_COUNTERS)
            })
            .count();
        if n > 0 {
            warnings.push(format!("{side}: {n} requests were measured from the server-wide counters, one at a time: the figures hold only if no other client used {} meanwhile", s.url));
        }
        // Said, not silently unused (#38.23): a response that carries the engine's own
        // per-request figure is measured from it, whatever --server-counters asks.
        let own = s
            .outcomes
            .iter()
            .filter(|o| {
                o.result
                    .as_ref()
                    .is_ok_and(|m| m.source != run::SERVER_COUNTERS)
            })
            .count();
        if a.server_counters && own > 0 {
            warnings.push(format!("{side}: --server-counters was not used for {own} requests: their responses carry the engine's own per-request figure, which is measured instead (it needs no server to itself)"));
        }
    }
    for (side, s) in sides {
        let Some(s) = s else { continue };
        let other: Vec<String> = answered_by(s)
            .into_iter()
            .filter(|m| *m != s.model)
            .collect();
        if !other.is_empty() {
            warnings.push(format!(
                "{side}: responses name model {}, not `{}` as requested (--allow-other-model): the figures are that model's",
                other
                    .iter()
                    .map(|m| format!("`{}`", crate::escape::printable(m)))
                    .collect::<Vec<_>>()
                    .join(", "),
                crate::escape::printable(&s.model)
            ));
        }
    }
}

/// How a live report counts its figures.
const LIVE_CONVENTION: &str = "accept_length (gated) = tokens committed per verify step, bonus token counted: 1 + committed drafts / verify steps, committed drafts = completion_tokens − 1 − verify steps, per request; accept_length_engine = 1 + the engine's own accepted drafts / verify steps (vLLM counts a request's final step before cutting it at max_tokens or EOS); prompts failed on either side are left out of both";

pub fn run(a: &Request) -> Result<Verdict> {
    let th = a.thresholds;
    let profile = a.target.as_deref().map(profile::load).transpose()?;
    let (file, format, prompts) = read_prompts(a, profile.as_ref())?;
    // `--published` needs a benchmark's prompts: refused before any request is sent.
    let bench = published_benchmark(a, profile.as_ref(), format, &prompts)?;
    let (draft, baseline) = measure_both(a, profile.as_ref(), &prompts)?;
    let (both, d, b) = paired(a, &draft, baseline.as_ref())?;
    let unspeculated = d
        .samples
        .iter()
        .zip(&both)
        .filter(|(w, &i)| w.rounds == 0 && measured(&draft, i).completion_tokens > 1)
        .count();
    let mut warnings: Vec<String> = Vec::new();
    if unspeculated > 0 {
        warnings.push(format!("{unspeculated} requests generated tokens without a verify step: the engine switched speculation off for them (adaptive speculation, a batch-size limit); they count as accept length 1"));
    }
    let all: Vec<&Walk> = d.samples.iter().collect();
    let delta = b
        .as_ref()
        .map(|b| gate::paired_delta(&d.samples, &b.samples).0);
    let mut decision = decide(gate::micro_al(&all), delta, th);
    let cats: Vec<String> = both.iter().map(|&i| category_of(&prompts[i])).collect();
    // The profile's published figures for this draft, as a floor.
    let published = published_floors(a, profile.as_ref(), bench, &d, &cats, &mut decision)?;
    // Drafts per step: the run's one K (the preflight's, else the first answer's).
    let k = draft.spec_tokens.unwrap_or(0) as usize;
    let mut rep = report::build_on(&d, b.as_ref(), &cats, th, &decision, k, gate::GateOn::Walk);
    let mut sides = vec![degenerate::Side {
        name: "draft",
        walks: Some(&d.samples),
        continuations: continuations(&draft, &both, &prompts),
    }];
    if let (Some(s), Some(r)) = (&baseline, &b) {
        sides.push(degenerate::Side {
            name: "baseline",
            walks: Some(&r.samples),
            continuations: continuations(s, &both, &prompts),
        });
    }
    rep.degenerate = Some(degenerate::check(&sides, &cats, k));
    let same_output = baseline
        .as_ref()
        .map(|s| same_output(&draft, s, &both, &mut warnings));
    side_warnings(
        a,
        [("draft", Some(&draft)), ("baseline", baseline.as_ref())],
        &mut warnings,
    );
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    rep.tail = Some(Tail::Live(Box::new(LiveTail {
        target: profile.as_ref().map(|p| p.name.clone()),
        published,
        trace: None,
        limit_per_category: a.limit_per_category,
        samples_replayed: both.len(),
        live: Live {
            prompts: file.display().to_string(),
            prompt_format: format,
            text_mode: a.text_mode,
            max_tokens: a.max_tokens,
            concurrency: if a.server_counters { 1 } else { a.concurrency },
            convention: LIVE_CONVENTION,
            draft: side_doc(&draft, &prompts),
            baseline: baseline.as_ref().map(|s| side_doc(s, &prompts)),
            same_output,
            warnings,
        },
    })));
    Ok(Verdict {
        report: rep,
        passed: decision.passed,
        sources: vec![file],
    })
}
