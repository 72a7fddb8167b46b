//! `kquant calibrate --draft D --trace T [--target-checkpoint TGT] [--limit N] -o amax.json`:
//! the activation range NVFP4 W4A4's static input scales need. Runs the draft's replay (pass A
//! of docs/verify.md ("What it computes"), the f32 runtime: teacher-forced depths over the trace's
//! target taps and tokens) with an observer on every linear's input, and writes each module's
//! `max |x|` as the `kquant.input-amax/1` file `kquant quantize --scheme nvfp4 --input-amax`
//! reads (`quant::input_amax`; module = the draft's own tensor name without `.weight`).
//! Fused siblings (q/k/v, gate/up, …) are recorded one by one; `quantize` shares their largest.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::quant::input_amax::SCHEMA;
use crate::runtime::linears::Exec;
use crate::verify::drafters::{load_drafter, replay_first};
use crate::verify::gate::micro_al;
use crate::verify::trace::Trace;

/// Arguments of `kquant calibrate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The draft to calibrate (the unquantized one the NVFP4 checkpoint will be made from).
    #[arg(long)]
    pub draft: String,
    /// A kquant-trace/1 directory (tokens + target taps) captured from the target.
    #[arg(long)]
    pub trace: PathBuf,
    /// Target checkpoint: its embedding for an EAGLE-3 draft that carries none, its embedding
    /// and lm_head for a DFlash draft (required there).
    #[arg(long)]
    pub target_checkpoint: Option<String>,
    /// Replay only the first N samples of the trace.
    #[arg(long, value_parser = crate::cli::flags::limit)]
    pub limit: Option<usize>,
    /// Draft depths per round replayed (every depth's inputs are observed).
    #[arg(long, default_value_t = 3, value_parser = crate::cli::flags::steps)]
    pub steps: usize,
    /// Where to write the input-amax JSON.
    #[arg(short, long)]
    pub output: PathBuf,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let trace = Trace::open(&a.trace)?;
    let target = a
        .target_checkpoint
        .as_deref()
        .map(Checkpoint::open)
        .transpose()?;
    let d = load_drafter(&a.draft, target.as_ref(), &Exec::F32)?;
    trace.require(
        d.taps(),
        d.target_hidden(),
        Some(d.vocab()),
        &format!("draft `{}`", a.draft),
    )?;
    let limit = a.limit.unwrap_or(usize::MAX);
    if limit == 0 {
        return Err(Error::Usage("--limit 0 replays nothing".into()));
    }
    let (_, quantized) = d.linears().placement();
    if !quantized.is_empty() {
        eprintln!(
            "warning: `{}` is already quantized ({} module(s)): the ranges observed are those of \
             its dequantized weights; calibrate the original draft for a fresh quantization",
            a.draft,
            quantized.len()
        );
    }
    d.linears().observe(true);
    let walks = replay_first(d.as_ref(), &trace, a.steps, limit)?;
    d.linears().observe(false);
    let amax = d.linears().input_amax();
    if let Some((m, _)) = amax.iter().find(|(_, v)| !v.is_finite()) {
        return Err(Error::Source {
            path: a.trace.clone(),
            msg: format!("the input of `{m}` was not finite during the replay"),
            hint: Some("check the trace's taps (`kquant trace` writes finite bf16)".into()),
        });
    }
    if amax.is_empty() {
        return Err(Error::Source {
            path: a.trace.clone(),
            msg: "the replay ran no linear (no generated positions in the samples replayed)".into(),
            hint: Some("raise --limit or use a trace with generated tokens".into()),
        });
    }
    let doc = serde_json::json!({
        "schema": SCHEMA,
        "amax": amax,
        "draft": a.draft,
        "trace": a.trace,
        "samples": walks.len(),
        "steps": a.steps,
        "observed": "max |x| over every input row of each linear in the f32 replay (pass A)",
    });
    let mut bytes = serde_json::to_vec_pretty(&doc).expect("JSON");
    bytes.push(b'\n');
    // Regenerated on every run: replaced when kquant wrote it, refused otherwise (io::output).
    crate::io::output::write_file(
        &a.output,
        crate::quant::input_amax::FILE_KIND,
        true,
        &[PathBuf::from(&a.draft), a.trace.clone()],
        &bytes,
    )?;
    let all: Vec<_> = walks.iter().collect();
    let (lo, hi) = min_max(&amax);
    eprintln!(
        "calibrated {} linear(s) over {} sample(s) (accept length {:.3}): input amax {lo:.4} .. \
         {hi:.4} -> {}",
        amax.len(),
        walks.len(),
        micro_al(&all),
        a.output.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn min_max(m: &BTreeMap<String, f32>) -> (f32, f32) {
    m.values()
        .fold((f32::INFINITY, 0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}
