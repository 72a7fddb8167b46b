//! `kquant bench replay DRAFT`: the speed of the verify replay on the CPU. The draft is loaded
//! the way `kquant verify` loads it (`replay::load_drafter`), then pass A (the
//! teacher-forced depth matches) and pass B (the walk) run over a trace — a captured one, or a
//! deterministic synthetic `kquant-trace/1` built for the draft's taps, hidden size and vocab
//! (`trace::synthetic`) — timed by part: the load, the taps read, pass A, pass B; with the
//! FLOPs of the CPU products against the machine's own FMA peak measured in the same run, and
//! the process's RSS after the load and at the end.

use std::path::PathBuf;
use std::time::Instant;

use serde_json::{json, Value};

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::ops::peak::Peak;
use crate::replay::walk::{walk_to, Walk};
use crate::replay::{
    check_fits, load_drafter, sample_inputs, sample_matches, steps_for, AfterMiss,
};
pub use crate::runtime::linears::Step;
use crate::runtime::Drafter;
use crate::trace::file::Trace;
use crate::trace::synthetic::{self, TraceShape};

/// Default length of a synthetic sample.
pub const SYNTHETIC_LEN: usize = 512;

/// What to replay.
#[derive(Debug, Clone)]
pub struct Request {
    pub draft: String,
    /// A trace to replay; a synthetic one without.
    pub trace: Option<PathBuf>,
    /// How the synthetic trace is made, without `trace`.
    pub synthetic: Synthetic,
    /// The first N samples of `trace`, or N synthetic ones (1 without).
    pub samples: Option<usize>,
    pub steps: Option<usize>,
    pub target_checkpoint: Option<String>,
    pub after_miss: AfterMiss,
    /// Where the draft's linears run, as `verify --device` takes it (`cpu`: the f32 runtime).
    pub device: String,
    /// How much of each draft step a device runs.
    pub step: Step,
}

/// The synthetic trace a replay without a trace makes for the draft.
#[derive(Debug, Clone, Default)]
pub struct Synthetic {
    /// Tokens per sample ([`SYNTHETIC_LEN`] without).
    pub len: Option<usize>,
    /// Prompt tokens of each sample (a eighth of the length without).
    pub prompt_len: Option<usize>,
    /// Where to keep it (a temporary directory without).
    pub write_trace: Option<PathBuf>,
    /// Replace an existing `write_trace` (only a trace kquant wrote).
    pub force: bool,
    /// The tap stream the trace is recorded as, on an attention-residual target (`None`: what
    /// a capture there taps by default).
    pub stream: Option<crate::target::stream::TapStream>,
}

/// The figures of a replay.
#[derive(Debug, Clone)]
pub struct Replay {
    pub draft: String,
    pub family: String,
    pub draft_bytes: u64,
    /// The trace directory replayed.
    pub trace: PathBuf,
    /// A synthetic trace's (length, prompt length).
    pub synthetic: Option<(usize, usize)>,
    pub samples: usize,
    /// The first sample's tokens.
    pub first_len: usize,
    /// Generated positions over every sample.
    pub positions: u64,
    pub steps: usize,
    pub after_miss: AfterMiss,
    pub after_miss_skipped: bool,
    /// Seconds: the draft's load, the trace's (synthetic: its making), the taps' read, pass A,
    /// pass B.
    pub load_s: f64,
    pub trace_s: f64,
    pub taps_s: f64,
    pub pass_a_s: f64,
    pub pass_b_s: f64,
    /// The FLOPs of the CPU products in pass A and the seconds spent inside them.
    pub gemm_flops: u64,
    pub gemm_s: f64,
    /// The device the linears ran on (`None`: the f32 runtime), and pass A's calls of device
    /// layers with the wall seconds spent in them.
    pub device: Option<String>,
    pub device_calls: u64,
    pub device_s: f64,
    /// On a device: `Ok` when the whole step ran there, `Err(why)` when only the linears did.
    pub device_step: Option<Result<(), String>>,
    /// The machine's f32 FMA peak, measured after the replay on its threads.
    pub fma: Peak,
    pub accept_length: f64,
    pub rss_after_load: Option<u64>,
    pub peak_after_load: Option<u64>,
    pub peak: Option<u64>,
}

impl Replay {
    /// Depths scored per position (the steps).
    pub fn depths(&self) -> usize {
        self.steps
    }
    /// Generated positions × depths per second of pass A.
    pub fn token_depths_per_s(&self) -> f64 {
        (self.positions * self.depths() as u64) as f64 / self.pass_a_s
    }
    pub fn positions_per_s(&self) -> f64 {
        self.positions as f64 / self.pass_a_s
    }
    /// FLOP/s over the time spent inside the products (what the kernels reach).
    pub fn gemm_per_s(&self) -> f64 {
        self.gemm_flops as f64 / self.gemm_s.max(1e-9)
    }
    /// FLOP/s over all of pass A (what the replay reaches, attention and the rest included).
    pub fn pass_a_flops_per_s(&self) -> f64 {
        self.gemm_flops as f64 / self.pass_a_s
    }

    /// Pass A's seconds outside the CPU products and the device layers: attention, norms,
    /// RoPE, embedding gathers, the runner-up search, the host's bookkeeping.
    pub fn rest_s(&self) -> f64 {
        (self.pass_a_s - self.gemm_s - self.device_s).max(0.0)
    }

    /// The `--json` document (`kquant.bench.replay/1`).
    pub fn to_json(&self) -> Value {
        let synthetic = self
            .synthetic
            .map(|(len, p)| json!({"len": len, "prompt_len": p, "seed": synthetic::SEED}));
        json!({
            "schema": "kquant.bench.replay/1",
            "draft": self.draft,
            "family": self.family,
            "draft_bytes": self.draft_bytes,
            "trace": if synthetic.is_some() { json!("synthetic") } else { json!(self.trace) },
            "synthetic": synthetic,
            "samples": self.samples,
            "positions": self.positions,
            "steps": self.steps,
            "after_miss": self.after_miss,
            "after_miss_skipped": self.after_miss_skipped,
            "depths": self.depths(),
            "load_s": self.load_s,
            "trace_s": self.trace_s,
            "taps_read_s": self.taps_s,
            "pass_a_s": self.pass_a_s,
            "pass_b_s": self.pass_b_s,
            "token_depths_per_s": self.token_depths_per_s(),
            "gemm_flops": self.gemm_flops,
            "gemm_s": self.gemm_s,
            "gemm_flops_per_s": self.gemm_per_s(),
            "device": self.device,
            "device_calls": self.device_calls,
            "device_s": self.device_s,
            "device_step": match &self.device_step {
                None => Value::Null,
                Some(Ok(())) => json!({"whole": true}),
                Some(Err(why)) => json!({"whole": false, "why": why}),
            },
            "rest_s": self.rest_s(),
            "pass_a_gemm_flops_per_s": self.pass_a_flops_per_s(),
            "fma_peak": self.fma,
            "share_of_fma_peak": self.gemm_per_s() / self.fma.flops,
            "pass_a_share_of_fma_peak": self.pass_a_flops_per_s() / self.fma.flops,
            "positions_per_s": self.positions_per_s(),
            "accept_length": self.accept_length,
            "rss_after_load_bytes": self.rss_after_load,
            "peak_rss_after_load_bytes": self.peak_after_load,
            "peak_rss_bytes": self.peak,
            "threads": rayon::current_num_threads(),
        })
    }
}

/// Removes a temporary directory when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A trace opened for the replay.
struct Opened {
    trace: Trace,
    /// A synthetic trace's (length, prompt length).
    synthetic: Option<(usize, usize)>,
    /// Removes a synthetic trace's temporary directory once the replay is done.
    _tmp: Option<TempDir>,
}

/// The trace to replay, opened and checked against the draft: `req.trace`, or a synthetic one
/// written for the draft (kept in `req.synthetic.write_trace`, else in a temporary directory that the
/// returned guard removes).
fn open_trace(req: &Request, d: &dyn Drafter) -> Result<Opened> {
    let (tmp, dir, synthetic) = match &req.trace {
        Some(p) => (None, p.clone(), None),
        None => {
            let len = req.synthetic.len.unwrap_or(SYNTHETIC_LEN);
            let prompt_len = req.synthetic.prompt_len.unwrap_or((len / 8).max(1));
            let (tmp, dir, force) = match &req.synthetic.write_trace {
                Some(p) => (None, p.clone(), req.synthetic.force),
                None => {
                    let p = std::env::temp_dir()
                        .join(format!("kquant-bench-replay-{}", std::process::id()));
                    // Named by this process's id: what is there is a leftover of a run
                    // with the same id, kquant's own.
                    (Some(TempDir(p.clone())), p, true)
                }
            };
            let shape = TraceShape {
                taps: d.taps().to_vec(),
                hidden: d.target_hidden(),
                vocab: d.vocab(),
                num_layers: d.target_layers(),
                // The target checkpoint says, where given (opened once already by `run`).
                attention_residuals: match &req.target_checkpoint {
                    Some(t) => Checkpoint::open(t)?
                        .config
                        .map(|c| crate::target::stream::config_has_attention_residuals(&c)),
                    None => None,
                },
            };
            synthetic::write(
                &dir,
                &shape,
                len,
                prompt_len,
                req.samples.unwrap_or(1),
                force,
                req.synthetic.stream,
            )?;
            (tmp, dir, Some((len, prompt_len)))
        }
    };
    let mut tr = Trace::open(&dir)?;
    if let (Some(n), Some(_)) = (req.samples, &req.trace) {
        tr.manifest.samples.truncate(n);
    }
    if tr.manifest.samples.is_empty() {
        return Err(Error::Usage(format!(
            "trace {} has no samples to replay",
            dir.display()
        )));
    }
    check_fits(d, &tr, &req.draft)?;
    Ok(Opened {
        trace: tr,
        synthetic,
        _tmp: tmp,
    })
}

/// Pass A and pass B over every sample of `tr`, timed by part: (taps read, pass A, pass B)
/// seconds, the walks summed, the generated positions.
fn replay(
    d: &dyn Drafter,
    tr: &Trace,
    steps: usize,
    after_miss: AfterMiss,
) -> Result<([f64; 3], Walk, u64)> {
    let (mut taps_s, mut pass_a_s, mut pass_b_s) = (0f64, 0f64, 0f64);
    let mut total = Walk::default();
    let mut positions = 0u64;
    for s in &tr.manifest.samples {
        let t = Instant::now();
        let (x, taps) = sample_inputs(d, tr, s)?;
        taps_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let (m, skipped) = sample_matches(d, &x, &taps, s.prompt_len, steps, after_miss);
        pass_a_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut w = walk_to(&m, s.stop());
        w.after_miss_skipped = skipped;
        total.add(&w);
        pass_b_s += t.elapsed().as_secs_f64();
        positions += s.gen_len as u64;
    }
    Ok(([taps_s, pass_a_s, pass_b_s], total, positions))
}

/// Load the draft, make or open the trace, replay it (the replay of
/// `replay::replay`, timed by part), then measure the FMA peak.
pub fn run(req: &Request) -> Result<Replay> {
    let ck = Checkpoint::open(&req.draft)?;
    let family = ck.detect()?.family.id().to_string();
    let draft_bytes: u64 = ck.weights.shards.iter().map(|s| s.file_len()).sum();
    drop(ck);

    let t = Instant::now();
    let target = req
        .target_checkpoint
        .as_deref()
        .map(Checkpoint::open)
        .transpose()?;
    let exec =
        crate::runtime::linears::Exec::device(crate::gpu::linear::verify_device(&req.device)?);
    let exec = match req.step {
        Step::Whole => exec,
        Step::PerLinear => exec.per_linear(),
    };
    let d = load_drafter(&req.draft, target.as_ref(), &exec)?;
    drop(target);
    let load_s = t.elapsed().as_secs_f64();
    let rss_after_load = crate::io::process::rss();
    let peak_after_load = crate::io::process::peak_rss();

    let t = Instant::now();
    let opened = open_trace(req, d.as_ref())?;
    let (tr, synthetic) = (&opened.trace, opened.synthetic);
    let trace_s = t.elapsed().as_secs_f64();

    let steps = steps_for(d.as_ref(), req.steps, &req.draft)?;
    let flops_before = crate::ops::gemm::flops_done();
    let gemm_s_before = crate::ops::gemm::seconds_in();
    let device_before = crate::runtime::linears::device_time();
    let ([taps_s, pass_a_s, pass_b_s], total, positions) =
        replay(d.as_ref(), tr, steps, req.after_miss)?;
    let gemm_flops = crate::ops::gemm::flops_done() - flops_before;
    let gemm_s = crate::ops::gemm::seconds_in() - gemm_s_before;
    let device_after = crate::runtime::linears::device_time();
    if let Some(e) = d.linears().take_error() {
        return Err(e);
    }
    // The machine's own f32 FMA peak, measured now, on the replay's threads.
    let fma = crate::ops::peak::measure(rayon::current_num_threads(), 0.6);
    Ok(Replay {
        draft: req.draft.clone(),
        family,
        draft_bytes,
        trace: tr.dir.clone(),
        synthetic,
        samples: tr.manifest.samples.len(),
        first_len: tr.manifest.samples[0].total_len().unwrap_or_default(),
        positions,
        steps,
        after_miss: req.after_miss,
        after_miss_skipped: total.after_miss_skipped,
        load_s,
        trace_s,
        taps_s,
        pass_a_s,
        pass_b_s,
        gemm_flops,
        gemm_s,
        device: exec.name(),
        device_calls: device_after.0 - device_before.0,
        device_s: device_after.1 - device_before.1,
        device_step: d.device_step(),
        fma,
        accept_length: total.al_walk(),
        rss_after_load,
        peak_after_load,
        peak: crate::io::process::peak_rss(),
    })
}
