//! `kquant verify --draft D [--baseline B|prompt-lookup] [--target PROFILE] [--trace T]`: exact
//! offline replay of the engine's greedy speculative loop over a captured trace (or one captured
//! here from a live target), and the regression gate.
//! Exit 0 pass, 1 gate failed, 2 error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::checkpoint::Checkpoint;
use crate::cli::flags;
use crate::error::{Error, Result};
use crate::io::output;
use crate::runtime::deepseek::DeepseekV3;
use crate::trace::capture;
use crate::trace::file::Trace;
use crate::verify::drafters::{load_drafter, replay_matches, AfterMiss};
use crate::verify::gate::{decide, Thresholds};
use crate::verify::profile::{self, Profile};
use crate::verify::report::{self, Run};
use crate::verify::walk::Ties;
use crate::verify::walk::{walk_to, Walk};
use crate::verify::{gate, ngram};

/// Arguments of `kquant verify`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The draft to check (usually the quantized one).
    #[arg(long, required_unless_present = "endpoint")]
    pub draft: Option<String>,
    /// What to compare against: another draft (usually the original) or `prompt-lookup`.
    #[arg(long)]
    pub baseline: Option<String>,
    /// Live: the base URL of a running vLLM, SGLang or TensorRT-LLM server that serves the
    /// target with the draft (e.g. `http://127.0.0.1:8000`). The prompts (`--prompts`) are sent
    /// to it, greedy, and the accept length read back per request (docs/verify.md, "Live").
    #[arg(long, value_name = "URL", conflicts_with_all = ["draft", "baseline", "trace", "device"])]
    pub endpoint: Option<String>,
    /// Live: a second server to compare with, e.g. the BF16 draft's deployment (paired ΔAL over
    /// the same prompts).
    #[arg(long, value_name = "URL", requires = "endpoint")]
    pub baseline_endpoint: Option<String>,
    /// Live: the serving engine (`auto`: told by `/v1/models`).
    #[arg(long, value_enum, default_value_t = crate::verify::live::engine::Engine::Auto, requires = "endpoint")]
    pub engine: crate::verify::live::engine::Engine,
    /// Live: the served model name [default: the first of `/v1/models`].
    #[arg(long, requires = "endpoint")]
    pub model: Option<String>,
    /// Live: how `--prompts` is laid out (`auto`: told by its first record).
    #[arg(long, value_enum, default_value_t = crate::trace::prompt_sets::Format::Auto, requires = "endpoint")]
    pub prompt_format: crate::trace::prompt_sets::Format,
    /// Live: tokens generated per request.
    #[arg(long, default_value_t = 256, value_parser = flags::max_tokens, requires = "endpoint")]
    pub max_tokens: usize,
    /// Live: requests in flight at once (batch composition can change greedy numerics; 1 gives
    /// the reproducible figure).
    #[arg(long, default_value_t = 1, value_parser = flags::concurrency, requires = "endpoint")]
    pub concurrency: usize,
    /// Live: seconds one request may take.
    #[arg(long, value_name = "SECS", default_value_t = 600, value_parser = flags::timeout_secs, requires = "endpoint")]
    pub request_timeout: u64,
    /// Live: tries after the first for a request that met a connection failure, a 5xx or a 429.
    #[arg(long, default_value_t = 2, value_parser = flags::retries, requires = "endpoint")]
    pub retries: usize,
    /// Live: failed requests tolerated (never measured), a count or a share (`5%`); more is an
    /// error (exit 2).
    #[arg(long, default_value = "5%", value_parser = flags::max_failed, requires = "endpoint")]
    pub max_failed: flags::MaxFailed,
    /// Live: where a response has no per-request figure, measure each request from the
    /// engine's server-wide counters read around it, one request at a time. Only valid on a
    /// server this run has to itself (kquant refuses counters that another client moved,
    /// where the engine counts finished requests).
    #[arg(long, requires = "endpoint")]
    pub server_counters: bool,
    /// Live: hold the measurement against the accept lengths `--target`'s profile quotes for
    /// this draft (a Hugging Face id as `kquant targets` lists it) on the prompt set's benchmark,
    /// overall and per category where the card splits it: below one by more than
    /// `--max-regression` fails the gate.
    #[arg(long, value_name = "DRAFT", requires_all = ["endpoint", "target"])]
    pub published: Option<String>,
    /// Target profile (built-in name or JSON file; `kquant targets` lists them): the trace must
    /// fit its shape, and a live profile (`kimi-k2.5-tiny`) runs its target when no `--trace`
    /// is given.
    #[arg(long)]
    pub target: Option<String>,
    /// A kquant-trace/1 directory (tokens + target taps) captured from the target (`kquant
    /// trace capture` / `trace import`). Optional with a live `--target`.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Target checkpoint: its embedding for an EAGLE-3 draft that carries none, its embedding
    /// and lm_head for a DFlash draft [default: a live profile's target].
    #[arg(long)]
    pub target_checkpoint: Option<String>,
    #[command(flatten)]
    pub steps: flags::Steps,
    /// Say what near-ties could do: proposals whose logit is within LOGITS of the runner-up's
    /// are taken both ways (an engine serving in bf16 may pick either), and the report gives
    /// each accept length and ΔAL as a range, and per request the steps a near-tie decides
    /// (docs/verify.md, "Near-ties"). The replay on --device cpu only.
    #[arg(long, value_name = "LOGITS", value_parser = flags::near_ties)]
    pub near_ties: Option<f64>,
    /// With a live `--target` and no `--trace`: capture these prompts (jsonl, as `kquant trace
    /// capture --prompts` reads them) instead of the profile's bundled set. With `--endpoint`:
    /// the prompt set to send (MT-Bench, Spec-Bench, SPEED-Bench, GSM8K, MATH-500, HumanEval,
    /// plain jsonl of prompts or messages, or token ids; `--prompt-format`).
    #[arg(long, value_name = "FILE", conflicts_with = "trace")]
    pub prompts: Option<PathBuf>,
    #[command(flatten)]
    pub per_category: flags::PerCategory,
    /// What pass A computes after a root's first miss: `run` (every depth of every root, so
    /// every figure, the unconditional per-depth rates and the simulated AL included) or `skip`
    /// (an EAGLE-3 chain stops at the first miss: the gate's accept length, the all-positions AL
    /// and the conditional rates exactly, for the accepted rows' work only; `kquant bench
    /// replay --after-miss` measures both). The report states which.
    #[arg(long, value_enum, default_value_t = AfterMiss::Run)]
    pub after_miss: AfterMiss,
    #[command(flatten)]
    pub gate: flags::Gate,
    /// Fail when the draft's accept length is below this (a finite number in 0..=33).
    #[arg(long, value_parser = flags::min_accept)]
    pub min_accept: Option<f64>,
    /// Print the JSON report on stdout (`--json`, like every other command), or write it to FILE
    /// (`--json FILE`; `-` is stdout).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// Write JUnit XML here.
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Where the draft's linears run: `cpu` (the f32 runtime), `cuda[:N]`, `hip[:N]` (builds
    /// with `--features cuda` / `hip`): quantized INT4 ones on the kernels, unquantized BF16/F16
    /// ones (lm_head, fc) through the vendor BLAS, the lm_head's argmax on the device;
    /// `cpu-emu` replays that on the CPU (see docs/kernels.md).
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// Replay one draft over the trace with `steps` (the draft's own default without). Returns
/// its run and its depths per round.
pub(crate) fn run_draft(
    spec: &str,
    trace: &Trace,
    target: Option<&Checkpoint>,
    steps: Option<usize>,
    after_miss: AfterMiss,
    exec: &crate::runtime::linears::Exec,
) -> Result<(Run, usize)> {
    let d = load_drafter(spec, target, exec)?;
    let steps = crate::verify::drafters::steps_for(d.as_ref(), steps, spec)?;
    trace.require(
        d.taps(),
        d.target_hidden(),
        Some(d.vocab()),
        &format!("draft `{spec}`"),
    )?;
    // A bar with an ETA over the generated positions (stderr; hidden when it is not a terminal).
    let total: u64 = trace
        .manifest
        .samples
        .iter()
        .map(|s| s.gen_len as u64)
        .sum();
    let pb = crate::progress::items(
        total,
        &format!("replay {}", crate::escape::printable(spec)),
        "positions",
    );
    let samples = replay_matches(d.as_ref(), trace, steps, after_miss, usize::MAX, &|n| {
        pb.inc(n)
    });
    pb.finish_and_clear();
    let (samples, matches) = samples?.into_iter().unzip();
    Ok((
        Run {
            name: spec.to_string(),
            samples,
            matches,
        },
        steps,
    ))
}

/// Where the samples to replay come from: `--trace`, or a live capture of `--prompts` (the
/// profile's bundled set without), the first `limit` of each category.
pub(crate) struct TraceSource<'a> {
    pub trace: Option<&'a Path>,
    pub prompts: Option<&'a Path>,
    pub limit: Option<usize>,
}

/// The trace to replay: `--trace`, or a capture with a live profile's target into `tmp`.
pub(crate) fn open_trace(
    a: &TraceSource,
    profile: Option<&Profile>,
    tmp: &mut Option<tempfile::TempDir>,
) -> Result<Trace> {
    let mut trace = match (a.trace, profile) {
        (Some(t), _) => Trace::open(t)?,
        (None, Some(p)) => match &p.live {
            Some(live) => {
                let tgt = live.resolve(&live.target)?;
                let ck = Checkpoint::open(&tgt.to_string_lossy())?;
                let m = DeepseekV3::load(&ck)?;
                let file = match a.prompts {
                    Some(p) => p.to_path_buf(),
                    None => live.resolve(&live.prompts)?,
                };
                let mut prompts = capture::read_prompts(&file)?;
                let keep = per_category(prompts.iter().map(|p| p.category.as_str()), a.limit);
                prompts = keep.into_iter().map(|i| prompts[i].clone()).collect();
                let o = capture::Options {
                    gen_len: LIVE_GEN_LEN,
                    taps: (1..m.num_layers).collect(),
                    stop_at_eos: false,
                    lookahead: 0,
                    f32_taps: false,
                };
                let dir = tempfile::tempdir()
                    .map_err(|e| Error::io("create", Path::new("$TMPDIR"), e))?;
                let out = dir.path().join("trace");
                eprintln!(
                    "verify: no --trace; capturing {} prompts with the live `{}` target ({})",
                    prompts.len(),
                    crate::escape::printable(&p.name),
                    crate::escape::printable(&tgt.display().to_string())
                );
                let claim = crate::trace::file::claim(&out, false, &[])?;
                capture::write_trace(&ck, &m, &p.name, &prompts, &o, "live", claim)?;
                let t = Trace::open(&out)?;
                *tmp = Some(dir);
                t
            }
            None => {
                return Err(Error::Flags {
                    msg: format!("no --trace, and kquant cannot run target `{}` itself", p.name),
                    hint: format!("capture the target's hidden states on the serving cluster (vLLM's hidden-states connector) and `kquant trace import --format vllm-hidden-states DIR --target {} -o TRACE` (scripts/vllm_capture.py writes DIR; docs/verify.md, \"From a vLLM cluster to a gate\"), then pass --trace TRACE", p.name),
                })
            }
        },
        (None, None) => {
            return Err(Error::Flags {
                msg: "no trace to replay".into(),
                hint: "give --trace T, or --target with a live profile (e.g. kimi-k2.5-tiny)".into(),
            })
        }
    };
    if let Some(p) = profile {
        check_fits(&trace, p)?;
    }
    let keep = per_category(
        trace.manifest.samples.iter().map(|s| s.category.as_str()),
        a.limit,
    );
    trace.manifest.samples = keep
        .into_iter()
        .map(|i| trace.manifest.samples[i].clone())
        .collect();
    Ok(trace)
}

/// The target checkpoint the drafts run with: `--target-checkpoint`, else a live profile's.
pub(crate) fn target_spec(
    given: Option<&str>,
    profile: Option<&Profile>,
) -> Result<Option<String>> {
    Ok(match (given, profile.and_then(|p| p.live.as_ref())) {
        (Some(t), _) => Some(t.to_string()),
        (None, Some(live)) => Some(live.resolve(&live.target)?.to_string_lossy().to_string()),
        (None, None) => None,
    })
}

/// Indices of the first `limit` items of each category, in order (all without a limit).
fn per_category<'a>(cats: impl Iterator<Item = &'a str>, limit: Option<usize>) -> Vec<usize> {
    let mut seen: std::collections::HashMap<&str, usize> = Default::default();
    cats.enumerate()
        .filter(|(_, c)| {
            let n = seen.entry(c).or_default();
            *n += 1;
            *n <= limit.unwrap_or(usize::MAX)
        })
        .map(|(i, _)| i)
        .collect()
}

/// The trace's target must be the profile's (hidden size, layers, vocab where both know them).
fn check_fits(t: &Trace, p: &Profile) -> Result<()> {
    let m = &t.manifest;
    let mut bad = Vec::new();
    if let Some(&h) = p.hidden_size.known() {
        if h != m.hidden_size {
            bad.push(format!("hidden size {} (profile {h})", m.hidden_size));
        }
    }
    if let Some(&l) = p.num_layers.known() {
        if l != m.num_layers {
            bad.push(format!("{} layers (profile {l})", m.num_layers));
        }
    }
    if let (Some(&v), Some(tv)) = (p.vocab_size.known(), m.vocab_size) {
        if v != tv {
            bad.push(format!("vocab {tv} (profile {v})"));
        }
    }
    if bad.is_empty() {
        return Ok(());
    }
    Err(Error::Source {
        path: t.dir.clone(),
        msg: format!(
            "was not captured from target `{}`: {}",
            p.name,
            bad.join(", ")
        ),
        hint: Some(
            "pass the --target profile of the model the trace was captured from (`kquant targets`)"
                .into(),
        ),
    })
}

/// Greedy tokens per prompt of a live capture (what the fixture trace was made with).
const LIVE_GEN_LEN: usize = 96;

/// Print the report (the table, or the JSON with `--json` / `--json -`) and write `--json FILE`
/// and `--junit FILE`. Reports are regenerated on every run: an existing one is replaced when
/// kquant wrote it, anything else is refused (`io::output`), and none may be one of `sources`.
pub(crate) fn emit(
    rep: &serde_json::Value,
    json: Option<&Path>,
    junit: Option<&Path>,
    sources: &[PathBuf],
) -> Result<()> {
    let json_to_stdout = json == Some(Path::new("-"));
    if json_to_stdout {
        println!("{}", serde_json::to_string_pretty(rep).expect("JSON"));
    } else {
        print!("{}", report::table(rep));
    }
    if let Some(p) = json.filter(|_| !json_to_stdout) {
        output::write_file(
            p,
            report::JSON_REPORT,
            true,
            sources,
            &serde_json::to_vec_pretty(rep).expect("JSON"),
        )?;
    }
    if let Some(p) = junit {
        output::write_file(
            p,
            report::JUNIT_REPORT,
            true,
            sources,
            report::junit(rep).as_bytes(),
        )?;
    }
    Ok(())
}

/// The gate's thresholds from the flags, refused when they cannot gate.
pub(crate) fn thresholds(a: &Args) -> Result<Thresholds> {
    let th = Thresholds {
        max_regression: a.gate.max_regression,
        min_accept: a.min_accept,
    };
    th.check().map_err(|msg| Error::Flags {
        msg,
        hint: "give finite thresholds: a comparison with `nan` is always false, so the gate would pass anything".into(),
    })?;
    Ok(th)
}

pub fn run(a: Args) -> Result<ExitCode> {
    a.per_category.warn_spelling("verify");
    if a.endpoint.is_some() {
        return super::verify_live::run(a);
    }
    let draft_spec = a.draft.clone().ok_or_else(|| Error::Flags {
        msg: "no draft to verify".into(),
        hint: "give --draft DIR (offline replay) or --endpoint URL (a live server)".into(),
    })?;
    let exec = crate::runtime::linears::Exec::device(crate::gpu::linear::verify_device(&a.device)?);
    let profile = a.target.as_deref().map(profile::load).transpose()?;
    let th = thresholds(&a)?;
    let mut tmp = None;
    let src = TraceSource {
        trace: a.trace.as_deref(),
        prompts: a.prompts.as_deref(),
        limit: a.per_category.value(),
    };
    let trace = open_trace(&src, profile.as_ref(), &mut tmp)?;
    // A verify that replays nothing is never a pass.
    if trace.manifest.samples.is_empty() {
        return Err(Error::Source {
            path: trace.dir.join("manifest.json"),
            msg:
                "lists no samples: there is nothing to replay, and a gate over nothing cannot pass"
                    .into(),
            hint: Some(
                "verify on a trace with samples (`kquant trace capture` / `kquant trace import`)"
                    .into(),
            ),
        });
    }
    let target = target_spec(a.target_checkpoint.as_deref(), profile.as_ref())?
        .as_deref()
        .map(Checkpoint::open)
        .transpose()?;
    // A draft calibrated on this very trace is measured on the prompts it was fitted to.
    let mut warnings: Vec<String> = Vec::new();
    if a.trace.is_some() {
        for spec in [Some(&draft_spec), a.baseline.as_ref()]
            .into_iter()
            .flatten()
        {
            if spec == "prompt-lookup" {
                continue;
            }
            let calibration = Checkpoint::open(spec)
                .ok()
                .and_then(|ck| ck.config)
                .and_then(|c| {
                    c.get("kquant_quantization")
                        .and_then(|k| k.get("calibration"))
                        .cloned()
                });
            // Categories the evaluation has and the calibration had none of.
            if let Some(cats) = calibration
                .as_ref()
                .and_then(|c| c.get("categories"))
                .and_then(serde_json::Value::as_object)
            {
                let mut missing: Vec<String> = trace
                    .manifest
                    .samples
                    .iter()
                    .map(|s| s.category.clone())
                    .filter(|c| !cats.contains_key(c))
                    .collect();
                missing.sort();
                missing.dedup();
                if !missing.is_empty() {
                    warnings.push(format!(
                        "`{}` was calibrated on prompts without the categories {}: its codes were fitted to other text than these prompts (`quantize` prints the calibration's categories; calibrate on a set that covers them)",
                        crate::escape::printable(spec),
                        missing
                            .iter()
                            .map(|c| format!("`{}`", crate::escape::printable(c)))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
            }
            let recorded = calibration.as_ref().and_then(|c| {
                c.get("trace_sha256")
                    .and_then(serde_json::Value::as_str)
                    .map(String::from)
            });
            if let Some(r) = recorded {
                if crate::quantize::calibrate::trace_digest(&trace.dir).is_ok_and(|d| d == r) {
                    warnings.push(format!(
                        "`{}` was calibrated on this trace (its config.json records the trace's digest): its accept length here is measured on the prompts its codes were fitted to, which flatters it; verify on other prompts (fixtures/kimi-k2.5-tiny/prompts/eval.jsonl is held out from calibration.jsonl)",
                        crate::escape::printable(spec)
                    ));
                }
            }
        }
    }
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    let steps = a.steps.steps;
    let (draft, depths) = run_draft(
        &draft_spec,
        &trace,
        target.as_ref(),
        steps,
        a.after_miss,
        &exec,
    )?;
    let positions: u64 = draft.samples.iter().map(|w| w.positions).sum();
    if positions == 0 {
        return Err(Error::Source {
            path: trace.dir.join("manifest.json"),
            msg: format!(
                "the replay measured nothing: the {} sample(s) replayed have no generated position (gen_len 0, or prompt_len 0)",
                draft.samples.len()
            ),
            hint: Some("a gate over nothing cannot pass: verify on samples with a prompt and generated tokens".into()),
        });
    }
    let baseline = match a.baseline.as_deref() {
        None => None,
        Some("prompt-lookup") => {
            let mut samples: Vec<Walk> = Vec::new();
            let mut matches = Vec::new();
            for s in &trace.manifest.samples {
                let m = ngram::matches(&trace.tokens(s)?, s.prompt_len, depths);
                samples.push(walk_to(&m, s.stop()));
                matches.push(m);
            }
            Some(Run {
                name: "prompt-lookup".into(),
                samples,
                matches,
            })
        }
        Some(b) => Some(run_draft(b, &trace, target.as_ref(), steps, a.after_miss, &exec)?.0),
    };
    let all: Vec<&Walk> = draft.samples.iter().collect();
    let delta = baseline
        .as_ref()
        .map(|b| gate::paired_delta(&draft.samples, &b.samples).0);
    let decision = decide(gate::micro_al(&all), delta, th);
    let cats: Vec<String> = trace
        .manifest
        .samples
        .iter()
        .map(|s| {
            if s.category.is_empty() {
                "all".into()
            } else {
                s.category.clone()
            }
        })
        .collect();
    let mut rep = report::build(&draft, baseline.as_ref(), &cats, th, &decision, depths);
    rep["target"] = serde_json::json!(profile.as_ref().map(|p| p.name.clone()));
    rep["trace"] = serde_json::json!(match (&a.trace, &tmp) {
        (Some(t), _) => t.display().to_string(),
        (None, _) => "live capture".into(),
    });
    // The work cap, stated: what a figure over a capped trace stands for.
    rep["limit_per_category"] = serde_json::json!(a.per_category.value());
    rep["samples_replayed"] = serde_json::json!(trace.manifest.samples.len());
    rep["after_miss"] = serde_json::json!(a.after_miss);
    rep["warnings"] = serde_json::json!(warnings);
    let mut ties = (None, None);
    if let Some(tie) = a.near_ties {
        let stops: Vec<usize> = trace.manifest.samples.iter().map(|s| s.stop()).collect();
        let (doc, d, b) = report::near_ties(&draft, baseline.as_ref(), &stops, tie).ok_or_else(|| Error::Flags {
            msg: "--near-ties: the replay kept no logit margins (an argmax reduced on the device, or a prompt-lookup baseline)".into(),
            hint: "run the replay on --device cpu (the default), with a draft as --baseline".into(),
        })?;
        rep["near_ties"] = doc;
        ties = (Some(d), b);
    }
    // Each sample as an engine would report its request, to hold against the engine's own
    // per-request figures (`verify --endpoint`'s `live.*.requests`).
    let per_sample = |r: &Run, ties: Option<&Vec<Ties>>| -> Vec<serde_json::Value> {
        trace
            .manifest
            .samples
            .iter()
            .zip(&r.samples)
            .enumerate()
            .map(|(i, (s, w))| {
                let mut j = serde_json::json!({"id": s.id, "category": s.category, "steps": w.rounds,
                    "committed": w.committed - w.rounds,
                    "accepted": (w.engine_unknown == 0).then(|| w.committed - w.rounds + w.engine_extra),
                    "accept_length": w.al_walk(), "accept_length_engine": w.al_engine(),
                    "tokens": s.stop() - s.prompt_len});
                if let Some(t) = ties.map(|t| &t[i]) {
                    j["near_tie_steps"] = serde_json::json!(t.steps);
                    j["steps_range"] = serde_json::json!([t.up.rounds, t.down.rounds]);
                }
                j
            })
            .collect()
    };
    rep["draft"]["requests"] = serde_json::json!(per_sample(&draft, ties.0.as_ref()));
    if let Some(b) = &baseline {
        rep["baseline"]["requests"] = serde_json::json!(per_sample(b, ties.1.as_ref()));
    }
    let sources: Vec<PathBuf> = [Some(&draft_spec), a.baseline.as_ref()]
        .into_iter()
        .flatten()
        .map(PathBuf::from)
        .chain(a.trace.clone())
        .collect();
    emit(&rep, a.json.as_deref(), a.junit.as_deref(), &sources)?;
    Ok(if decision.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
