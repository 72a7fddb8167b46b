//! Offline `verify`: one draft (and a baseline draft or prompt lookup) replayed over a
//! `kquant-trace/1` (or one captured here with a live profile's target), walked as the engine
//! walks it, gated and reported. Resolve → plan → run, as `crate::quantize` does: the CLI
//! turns its flags into a [`Request`], prints the [`Plan`]'s warnings, runs it and renders the
//! [`Outcome`] (`report::emit`).

use std::path::PathBuf;

use serde_json::Value;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::replay::{load_drafter, replay_matches, AfterMiss};
use crate::runtime::linears::Exec;
use crate::runtime::target::Target;
use crate::target::profile::{self, Profile};
use crate::target::stream::TapStream;
use crate::trace::capture;
use crate::trace::file::Trace;
use crate::trace::stream::TraceStream;
use crate::verify::degenerate::{self, Continuation, Degenerate};
use crate::verify::gate::{self, GateOn, Thresholds};
use crate::verify::ngram;
use crate::verify::published::{self, Count};
use crate::verify::report::schema::{OfflineRequest, OfflineTail, Tail};
use crate::verify::report::{self, Run, Verdict};
use crate::verify::stream::{self, StreamCheck};
use crate::verify::walk::{walk_to, Ties, Walk};

/// What an offline verify is asked: the flags, typed.
#[derive(Debug, Clone)]
pub struct Request {
    /// The draft to check (usually the quantized one).
    pub draft: String,
    /// Another draft (usually the original) or `prompt-lookup`.
    pub baseline: Option<String>,
    /// The target, the trace (or the live capture) and the steps the drafts replay.
    pub source: Source,
    /// Proposals within this many logits of their runner-up are taken both ways.
    pub near_ties: Option<f64>,
    pub after_miss: AfterMiss,
    pub thresholds: Thresholds,
    /// Which accept length the gate judges (`--gate-on`).
    pub gate_on: GateOn,
    /// `--published DRAFT`: hold the draft's all-positions AL against the offline
    /// teacher-forced figures `target`'s profile quotes for DRAFT on the trace's benchmark.
    pub published: Option<String>,
    /// Where the draft's linears run (`cpu`, `cpu-emu`, `cuda[:N]`, `hip[:N]`).
    pub device: String,
    /// The tap streams: the drafts' training streams where the user names them, and whether a
    /// known mismatch with the trace's is measured rather than refused (`verify::stream`).
    pub streams: StreamFlags,
}

/// `--draft-stream`, `--baseline-stream`, `--allow-stream-mismatch`.
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamFlags {
    pub draft: Option<TapStream>,
    pub baseline: Option<TapStream>,
    pub allow_mismatch: bool,
}

/// A request resolved: the trace opened (or captured), the target loaded, and what the user
/// should hear before the replay starts.
pub struct Plan {
    req: Request,
    exec: Exec,
    profile: Option<Profile>,
    trace: Trace,
    /// A live capture's trace, removed when the plan is dropped (or a signal ends the run).
    _capture: Option<Scratch>,
    target: Option<Checkpoint>,
    /// With `--published`: the benchmark the trace's prompts are.
    bench: Option<&'static str>,
    /// The trace's tap stream against the drafts' training streams.
    streams: StreamCheck,
    /// Findings to print before the replay (a draft calibrated on these very prompts…).
    pub warnings: Vec<String>,
}

impl Plan {
    /// Open the profile, the trace (a capture with a live profile's target without one) and
    /// the target checkpoint, and refuse a trace with nothing to replay.
    pub fn resolve(req: Request) -> Result<Plan> {
        let exec = Exec::device(crate::gpu::linear::verify_device(&req.device)?);
        // Flag combinations and both drafts checked before any capture or replay.
        refuse_near_ties_without_margins(&req, &exec)?;
        for spec in [Some(&req.draft), req.baseline.as_ref()]
            .into_iter()
            .flatten()
            .filter(|s| *s != "prompt-lookup")
        {
            Checkpoint::open(spec)?;
        }
        let mut capture_dir = None;
        // A live capture taps the stream asked, else the draft's where the flag names it.
        let mut source = req.source.clone();
        source.stream_default = req.streams.draft;
        let (profile, trace) = source.open(&mut capture_dir)?;
        let target = req
            .source
            .target_checkpoint(profile.as_ref())?
            .as_deref()
            .map(Checkpoint::open)
            .transpose()?;
        let streams = check_streams(&req, profile.as_ref(), &trace, target.as_ref())?;
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
        // `--published`: refused before any replay when nothing can be held against it.
        let bench = match &req.published {
            None => None,
            Some(name) => Some(published_benchmark(name, profile.as_ref(), &trace)?),
        };
        let warnings = if req.source.trace.is_some() {
            let specs = [Some(&req.draft), req.baseline.as_ref()];
            specs
                .into_iter()
                .flatten()
                .filter(|s| *s != "prompt-lookup")
                .flat_map(|s| calibration_warnings(s, &trace))
                .collect()
        } else {
            Vec::new()
        };
        let mut warnings = warnings;
        for s in [Some(&req.draft), req.baseline.as_ref()]
            .into_iter()
            .flatten()
        {
            warnings.extend(position_warning(s, &trace));
        }
        Ok(Plan {
            req,
            exec,
            profile,
            trace,
            _capture: capture_dir,
            target,
            bench,
            streams,
            warnings,
        })
    }

    /// Replay the draft and the baseline, walk, gate and build the report.
    pub fn run(self) -> Result<Verdict> {
        let (req, trace) = (&self.req, &self.trace);
        let th = req.thresholds;
        let replay = |spec: &str| {
            run_draft(
                spec,
                trace,
                self.target.as_ref(),
                req.source.steps,
                req.after_miss,
                &self.exec,
            )
        };
        let (draft, depths) = replay(&req.draft)?;
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
        let baseline = match req.baseline.as_deref() {
            None => None,
            Some("prompt-lookup") => Some(prompt_lookup(trace, depths)?),
            Some(b) => Some(replay(b)?.0),
        };
        let all: Vec<&Walk> = draft.samples.iter().collect();
        let on = req.gate_on;
        let delta = baseline
            .as_ref()
            .map(|b| gate::paired_delta_on(&draft.samples, &b.samples, on).0);
        let mut decision = gate::decide_on(gate::micro_al_on(&all, on), delta, th, on);
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
        // `--published`: the card's teacher-forced figures, held against the all-positions AL.
        let checks = match (&req.published, self.bench, &self.profile) {
            (Some(name), Some(bench), Some(p)) => {
                let cs = teacher_forced_checks(p, name, bench, &draft, &cats, th)?;
                for c in cs.iter().filter(|c| !c.passed) {
                    decision.passed = false;
                    decision
                        .reasons
                        .push(published::reason(c, name, th.max_regression));
                }
                Some(cs)
            }
            _ => None,
        };
        let mut rep = report::build_on(&draft, baseline.as_ref(), &cats, th, &decision, depths, on);
        rep.degenerate = Some(degenerate_of(
            trace,
            &draft,
            baseline.as_ref(),
            &cats,
            depths,
        )?);
        let mut ties = (None, None);
        let mut near_ties = None;
        if let Some(tie) = req.near_ties {
            let stops: Vec<usize> = trace.manifest.samples.iter().map(|s| s.stop()).collect();
            let (doc, d, b) = report::near_ties(&draft, baseline.as_ref(), &stops, tie).ok_or_else(|| Error::Flags {
                msg: "--near-ties: the replay kept no logit margins (an argmax reduced on the device, or a prompt-lookup baseline)".into(),
                hint: "run the replay on --device cpu (the default), with a draft as --baseline".into(),
            })?;
            near_ties = Some(doc);
            ties = (Some(d), b);
        }
        rep.tail = Some(Tail::Offline(Box::new(OfflineTail {
            published: checks,
            target: self.profile.as_ref().map(|p| p.name.clone()),
            trace: match &req.source.trace {
                Some(t) => t.display().to_string(),
                None => "live capture".into(),
            },
            // The work cap, stated: what a figure over a capped trace stands for.
            limit_per_category: req.source.limit_per_category,
            samples_replayed: trace.manifest.samples.len(),
            after_miss: req.after_miss,
            warnings: self.warnings.clone(),
            near_ties,
            tap_stream: self.streams.clone(),
        })));
        rep.draft.requests = Some(per_request(trace, &draft, ties.0.as_ref()));
        if let (Some(b), Some(side)) = (&baseline, rep.baseline.as_mut()) {
            side.requests = Some(per_request(trace, b, ties.1.as_ref()));
        }
        let sources: Vec<PathBuf> = [Some(&req.draft), req.baseline.as_ref()]
            .into_iter()
            .flatten()
            .map(PathBuf::from)
            .chain(req.source.trace.clone())
            .collect();
        Ok(Verdict {
            report: rep,
            passed: decision.passed,
            sources,
        })
    }
}

/// The trace's tap stream held against the drafts' training streams (`verify::stream`): the
/// profile given, else the built-in one the trace's manifest names, says which published
/// drafts there are.
fn check_streams(
    req: &Request,
    profile: Option<&Profile>,
    trace: &Trace,
    target: Option<&Checkpoint>,
) -> Result<StreamCheck> {
    let named = match profile {
        Some(_) => None,
        None => trace
            .manifest
            .target
            .get("name")
            .and_then(Value::as_str)
            .and_then(|n| {
                profile::builtin_or_empty()
                    .into_iter()
                    .find(|p| p.name == n)
            }),
    };
    let profile = profile.or(named.as_ref());
    let witness = target.and_then(|ck| {
        let cfg = ck.config.as_ref()?;
        Some(crate::trace::stream::checkpoint_witness(
            &ck.weights.dir.to_string_lossy(),
            cfg,
        ))
    });
    let ts = TraceStream::checked(trace, profile, witness)?;
    let target_name = match (
        profile,
        trace.manifest.target.get("name").and_then(Value::as_str),
    ) {
        (Some(p), _) => p.name.clone(),
        (None, Some(n)) => n.to_string(),
        (None, None) => trace.dir.display().to_string(),
    };
    let flags = [
        (req.streams.draft, "--draft-stream"),
        (req.streams.baseline, "--baseline-stream"),
    ];
    stream::check_flags(&flags, req.baseline.as_deref(), ts, &target_name)?;
    let mut drafts = vec![(
        req.draft.as_str(),
        stream::of_draft(&req.draft, req.streams.draft, "--draft-stream", profile, ts),
    )];
    if let Some(b) = req.baseline.as_deref().filter(|b| *b != "prompt-lookup") {
        let flag = req.streams.baseline.or(req.streams.draft);
        let name = if req.streams.baseline.is_some() {
            "--baseline-stream"
        } else {
            "--draft-stream"
        };
        drafts.push((b, stream::of_draft(b, flag, name, profile, ts)));
    }
    stream::check(ts, &drafts, req.streams.allow_mismatch)
}

/// `--published NAME` offline: the benchmark the trace's prompts are (every sample's
/// `dataset` naming one), checked against the profile's offline teacher-forced figures for NAME
/// before any replay; an error when there is nothing to hold the replay against.
fn published_benchmark(
    name: &str,
    profile: Option<&Profile>,
    trace: &Trace,
) -> Result<&'static str> {
    let p = profile.ok_or_else(|| Error::Flags {
        msg: "--published needs --target: the profile quotes the card figures".into(),
        hint: "give --target PROFILE (`kquant targets` lists the figures each quotes)".into(),
    })?;
    let bench = published::benchmark_of_file(
        crate::verify::prompt_sets::SetFormat::Plain,
        trace.manifest.samples.iter().map(|s| s.dataset.as_str()),
    )
    .ok_or_else(|| Error::Flags {
        msg: format!(
            "--published compares with a benchmark's figures; the trace's samples (dataset `{}`) are no benchmark",
            crate::escape::printable(
                trace
                    .manifest
                    .samples
                    .first()
                    .map_or("", |s| s.dataset.as_str())
            )
        ),
        hint: "capture the benchmark the card quotes (every sample's `dataset` naming it, e.g. math500), or leave --published out".into(),
    })?;
    published::checks_of(Count::TeacherForced, p, name, bench, (0.0, 0), &[], 0.0)?;
    Ok(bench)
}

/// The profile's offline teacher-forced figures for `name` on `bench`, each held against the
/// draft's all-positions AL (overall, and the card's categories).
fn teacher_forced_checks(
    p: &Profile,
    name: &str,
    bench: &str,
    draft: &Run,
    cats: &[String],
    th: Thresholds,
) -> Result<Vec<published::Check>> {
    let mut by: std::collections::BTreeMap<&str, (Walk, usize)> = Default::default();
    let mut all = Walk::default();
    for (w, c) in draft.samples.iter().zip(cats) {
        let e = by.entry(c.as_str()).or_default();
        e.0.add(w);
        e.1 += 1;
        all.add(w);
    }
    let per: Vec<(String, f64, usize)> = by
        .iter()
        .map(|(c, (w, n))| (c.to_string(), w.al_allpos(), *n))
        .collect();
    published::checks_of(
        Count::TeacherForced,
        p,
        name,
        bench,
        (all.al_allpos(), draft.samples.len()),
        &per,
        th.max_regression,
    )
}

/// The prompt-lookup baseline's run over the trace, `depths` drafts a step.
fn prompt_lookup(trace: &Trace, depths: usize) -> Result<Run> {
    let mut samples: Vec<Walk> = Vec::new();
    let mut matches = Vec::new();
    for s in &trace.manifest.samples {
        let m = ngram::matches(&trace.tokens(s)?, s.prompt_len, depths);
        samples.push(walk_to(&m, s.stop()));
        matches.push(m);
    }
    Ok(Run {
        name: "prompt-lookup".into(),
        samples,
        matches,
    })
}

/// The degenerate-output check (`verify::degenerate`): the trace's continuations (up to each
/// sample's stop) for loops, each drafter's walks for the rest.
fn degenerate_of(
    trace: &Trace,
    draft: &Run,
    baseline: Option<&Run>,
    cats: &[String],
    k: usize,
) -> Result<Degenerate> {
    let conts: Vec<(String, Vec<u32>)> = trace
        .manifest
        .samples
        .iter()
        .map(|s| {
            let t = trace.tokens(s)?;
            let gen = t
                .get(s.prompt_len..s.stop().min(t.len()))
                .unwrap_or_default();
            Ok((s.id.to_string(), gen.to_vec()))
        })
        .collect::<Result<_>>()?;
    let mut sides = vec![
        degenerate::Side {
            name: "trace",
            walks: None,
            continuations: conts
                .iter()
                .map(|(id, t)| (id.clone(), Some(Continuation::Tokens(t))))
                .collect(),
        },
        degenerate::Side {
            name: "draft",
            walks: Some(&draft.samples),
            continuations: Vec::new(),
        },
    ];
    if let Some(b) = baseline {
        sides.push(degenerate::Side {
            name: "baseline",
            walks: Some(&b.samples),
            continuations: Vec::new(),
        });
    }
    Ok(degenerate::check(&sides, cats, k))
}

/// Each sample as an engine would report its request, to hold against the engine's own
/// per-request figures (`verify --endpoint`'s `live.*.requests`).
fn per_request(trace: &Trace, r: &Run, ties: Option<&Vec<Ties>>) -> Vec<OfflineRequest> {
    trace
        .manifest
        .samples
        .iter()
        .zip(&r.samples)
        .enumerate()
        .map(|(i, (s, w))| {
            let t = ties.map(|t| &t[i]);
            OfflineRequest {
                id: s.id,
                category: s.category.clone(),
                steps: w.rounds,
                committed: w.committed - w.rounds,
                accepted: (w.engine_unknown == 0).then(|| w.committed - w.rounds + w.engine_extra),
                accept_length: w.al_walk(),
                accept_length_engine: w.al_engine(),
                tokens: s.stop() - s.prompt_len,
                // The prompt file's own id, where it is not the sample's number (`verify-join`).
                prompt_id: s.prompt_id.clone(),
                near_tie_steps: t.map(|t| t.steps),
                steps_range: t.map(|t| [t.up.rounds, t.down.rounds]),
            }
        })
        .collect()
}

/// Samples longer than the draft's `max_position_embeddings`: the replay runs them (its rotary
/// table is computed, not looked up), but the draft was never trained there, and an engine
/// that caps the draft's length at it drafts nothing past it; said, not silent.
fn position_warning(spec: &str, trace: &Trace) -> Option<String> {
    let max = Checkpoint::open(spec)
        .ok()?
        .config?
        .uint("max_position_embeddings")
        .ok()??;
    let longer: Vec<u64> = trace
        .manifest
        .samples
        .iter()
        .filter(|s| s.total_len().is_ok_and(|n| n as u64 > max))
        .map(|s| s.id)
        .collect();
    (!longer.is_empty()).then(|| {
        format!(
            "{} of {} samples are longer than `{}`'s max_position_embeddings ({max}) (first: sample {}): they are replayed past the positions the draft was trained on, and an engine that caps the draft's length there drafts nothing past it",
            longer.len(),
            trace.manifest.samples.len(),
            crate::escape::printable(spec),
            longer[0]
        )
    })
}

/// A draft calibrated on this very trace is measured on the prompts it was fitted to; one
/// calibrated without some of its categories was fitted to other text.
fn calibration_warnings(spec: &str, trace: &Trace) -> Vec<String> {
    let mut warnings = Vec::new();
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
        .and_then(Value::as_object)
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
            .and_then(Value::as_str)
            .map(String::from)
    });
    if let Some(r) = recorded {
        if crate::trace::file::digest(&trace.dir).is_ok_and(|d| d == r) {
            warnings.push(format!(
                "`{}` was calibrated on this trace (its config.json records the trace's digest): its accept length here is measured on the prompts its codes were fitted to, which flatters it; verify on other prompts (fixtures/kimi-k2.5-tiny/prompts/eval.jsonl is held out from calibration.jsonl)",
                crate::escape::printable(spec)
            ));
        }
    }
    warnings
}

/// Replay one draft over the trace with `steps` (the draft's own default without). Returns
/// its run and its depths per round.
pub fn run_draft(
    spec: &str,
    trace: &Trace,
    target: Option<&Checkpoint>,
    steps: Option<usize>,
    after_miss: AfterMiss,
    exec: &Exec,
) -> Result<(Run, usize)> {
    let d = load_drafter(spec, target, exec)?;
    let steps = crate::replay::steps_for(d.as_ref(), steps, spec)?;
    if let Some(e) = another_targets_draft(spec, d.taps(), trace) {
        return Err(e);
    }
    crate::replay::check_fits(d.as_ref(), trace, spec)?;
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

/// A draft whose taps the trace lacks and which are exactly another built-in target's default
/// taps for a draft family: a draft of that target (not a trace captured with too few taps),
/// said so by name. `None` otherwise (the trace's own tap check then speaks).
fn another_targets_draft(spec: &str, taps: &[usize], trace: &Trace) -> Option<Error> {
    let mut have = trace.manifest.taps.clone();
    have.sort_unstable();
    if taps.iter().all(|t| have.contains(t)) {
        return None;
    }
    let mut wanted = taps.to_vec();
    wanted.sort_unstable();
    let profiles = profile::builtin().ok()?;
    let of = |p: &Profile, hs: &[usize]| p.taps.family_of(hs).map(|f| f.id());
    let (owner, family) = profiles
        .iter()
        .find_map(|p| of(p, &wanted).map(|f| (p, f)))?;
    // The trace's own taps are that target's too: a capture with other taps, not another target.
    if of(owner, &have).is_some() {
        return None;
    }
    let traced = trace
        .manifest
        .target
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("its target");
    Some(Error::Source {
        path: trace.dir.join("manifest.json"),
        msg: format!(
            "draft `{}` reads taps {wanted:?}, target `{}`'s {family} taps: it looks like a draft of that target, and this trace was captured from `{}` with taps {have:?}",
            crate::escape::printable(spec),
            owner.name,
            crate::escape::printable(traced)
        ),
        hint: Some(format!(
            "verify a draft on a trace of its own target (`kquant targets {}` lists its taps); if the draft is this target's, capture the trace with its taps (`trace capture --taps {}`)",
            owner.name,
            wanted.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(",")
        )),
    })
}

/// `--near-ties` reads the logit margins that only the CPU replay of a draft keeps: refused with
/// a device replay or a prompt-lookup baseline before anything runs, not after the replay.
fn refuse_near_ties_without_margins(req: &Request, exec: &Exec) -> Result<()> {
    if req.near_ties.is_none() {
        return Ok(());
    }
    if !matches!(exec, Exec::F32) {
        return Err(Error::Flags {
            msg: format!(
                "--near-ties needs the logit margins the CPU replay keeps; --device {} reduces each argmax on the device",
                crate::escape::printable(&req.device)
            ),
            hint: "drop --device (the replay on cpu, the default, keeps the margins), or drop --near-ties".into(),
        });
    }
    if req.baseline.as_deref() == Some("prompt-lookup") {
        return Err(Error::Flags {
            msg: "--near-ties needs logit margins, and a prompt-lookup baseline has no logits"
                .into(),
            hint: "give a draft as --baseline (e.g. the original one), or drop --near-ties".into(),
        });
    }
    Ok(())
}

/// A live capture's trace in the temporary directory: no directory of its own (the claim's
/// staging and lock lie beside it, and a signal during the capture removes them), registered
/// with the signal handler once written (a signal during the replay removes it), and removed
/// when dropped. An interrupted verify leaves nothing behind (but after SIGKILL).
pub struct Scratch {
    path: PathBuf,
    _registration: crate::io::interrupt::OutputRegistration,
}

impl Scratch {
    /// A name in `$TMPDIR` that nothing holds yet.
    fn fresh() -> PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        std::env::temp_dir().join(format!(
            "kquant-verify-{}-{nanos:x}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// Take over the written trace at `path`.
    fn hold(path: PathBuf) -> Scratch {
        // A trace is a flat directory; no lock of its own (the claim's was released).
        let none = path.with_extension("kquant-no-lock");
        let r = crate::io::interrupt::register_output(&path, true, &none);
        Scratch {
            path,
            _registration: r,
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// What the drafts are replayed over and with, as `verify` and `sensitivity` take it: the
/// target profile, the samples (`--trace`, or a live capture of `--prompts`, the profile's
/// bundled set without), the first `limit_per_category` of each category, the target
/// checkpoint and the drafts per step.
#[derive(Debug, Clone, Default)]
pub struct Source {
    /// A target profile: a built-in name or a JSON file (a live one captures the trace when
    /// `trace` is `None`).
    pub target: Option<String>,
    /// The trace to replay.
    pub trace: Option<PathBuf>,
    /// With a live profile and no trace: the prompts to capture.
    pub prompts: Option<PathBuf>,
    /// The target checkpoint the drafts run with (a live profile's target without).
    pub target_checkpoint: Option<String>,
    /// The first N samples of each category.
    pub limit_per_category: Option<usize>,
    /// Drafts per verify step (the draft's own default without).
    pub steps: Option<usize>,
    /// The stream a live capture taps on an attention-residual target (`--stream`).
    pub stream: Option<TapStream>,
    /// Without `stream`: the one it taps there (the draft's training stream, where known),
    /// else vLLM's default `partial`.
    pub stream_default: Option<TapStream>,
}

impl Source {
    /// The target profile and the trace to replay: `trace`, or a capture with a live profile's
    /// target into `tmp`.
    pub fn open(&self, tmp: &mut Option<Scratch>) -> Result<(Option<Profile>, Trace)> {
        let profile = self.target.as_deref().map(profile::load).transpose()?;
        let trace = open_trace(self, profile.as_ref(), tmp)?;
        Ok((profile, trace))
    }

    /// The target checkpoint the drafts run with: `target_checkpoint`, else a live profile's.
    pub fn target_checkpoint(&self, profile: Option<&Profile>) -> Result<Option<String>> {
        Ok(
            match (
                &self.target_checkpoint,
                profile.and_then(|p| p.live.as_ref()),
            ) {
                (Some(t), _) => Some(t.clone()),
                (None, Some(live)) => {
                    Some(live.resolve(&live.target)?.to_string_lossy().to_string())
                }
                (None, None) => None,
            },
        )
    }
}

/// The trace to replay: `--trace`, or a capture with a live profile's target into `tmp`.
fn open_trace(a: &Source, profile: Option<&Profile>, tmp: &mut Option<Scratch>) -> Result<Trace> {
    let mut trace = match (a.trace.as_deref(), profile) {
        (Some(t), _) => Trace::open(t)?,
        (None, Some(p)) => match &p.live {
            Some(live) => {
                let tgt = live.resolve(&live.target)?;
                let ck = Checkpoint::open(&tgt.to_string_lossy())?;
                let m = Target::load(&ck)?;
                // The flag the stream came from, named in a refusal.
                let (asked, flag) = match a.stream {
                    Some(s) => (Some(s), "--stream"),
                    None => (a.stream_default.filter(|_| m.attention_residuals()), "--draft-stream"),
                };
                let stream = crate::trace::stream::for_target(asked, m.attention_residuals(), &p.name, flag)?;
                let file = match &a.prompts {
                    Some(p) => p.clone(),
                    None => live.resolve(&live.prompts)?,
                };
                let mut prompts = capture::read_prompts(&file)?;
                let keep = per_category(
                    prompts.iter().map(|p| p.category.as_str()),
                    a.limit_per_category,
                );
                prompts = keep.into_iter().map(|i| prompts[i].clone()).collect();
                let o = capture::Options {
                    gen_len: LIVE_GEN_LEN,
                    taps: (1..m.num_layers()).collect(),
                    stop_at_eos: false,
                    lookahead: 0,
                    f32_taps: false,
                    stream,
                };
                let out = Scratch::fresh();
                eprintln!(
                    "verify: no --trace; capturing {} prompts with the live `{}` target ({}){}",
                    prompts.len(),
                    crate::escape::printable(&p.name),
                    crate::escape::printable(&tgt.display().to_string()),
                    match m.attention_residuals() {
                        true => format!(", `{}` tap stream", stream.id()),
                        false => String::new(),
                    }
                );
                let claim = crate::trace::file::claim(&out, false, &[])?;
                capture::write_trace(&ck, &m, &p.name, &prompts, &o, "live", claim)?;
                let held = Scratch::hold(out);
                let t = Trace::open(&held.path)?;
                *tmp = Some(held);
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
        a.limit_per_category,
    );
    trace.manifest.samples = keep
        .into_iter()
        .map(|i| trace.manifest.samples[i].clone())
        .collect();
    Ok(trace)
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
