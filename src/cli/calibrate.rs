//! `kquant calibrate --draft D --trace T [--target-checkpoint TGT] [--limit N] -o amax.json
//! [--json]`: the activation range NVFP4 W4A4's static input scales need, observed over a
//! replay of the trace (`quantize::amax` does the work) and written as the
//! `kquant.input-amax/1` file `kquant quantize --scheme nvfp4 --input-amax` reads. `--json`
//! prints `kquant.calibrate/1` (what was observed, the next lines).

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::print_json;
use crate::error::Result;
use crate::escape::printable;
use crate::quantize::amax::{next_steps, Observer, Request};

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
    #[command(flatten)]
    pub steps: crate::cli::flags::Steps,
    /// Where to write the input-amax JSON.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let req = Request {
        draft: a.draft.clone(),
        trace: a.trace.clone(),
        target_checkpoint: a.target_checkpoint.clone(),
        limit: a.limit,
        steps: a.steps.steps,
    };
    let observer = Observer::load(&req)?;
    let warnings = observer.warnings.clone();
    for w in &warnings {
        eprintln!("warning: {}", printable(w));
    }
    let o = observer.run()?;
    o.write(&req, &a.output)?;
    let (lo, hi) = o.range();
    let al = o.accept_length;
    let next = next_steps(&a.draft, &a.output);
    if a.json {
        let doc = serde_json::json!({
            "schema": "kquant.calibrate/1",
            "output": a.output,
            "draft": a.draft,
            "trace": a.trace,
            "target_checkpoint": a.target_checkpoint,
            "samples": o.samples,
            "steps": o.steps,
            "linears": o.amax.len(),
            "accept_length": al,
            "amax_min": lo,
            "amax_max": hi,
            "warnings": warnings,
            "next": next,
        });
        print_json(&doc);
    }
    eprintln!(
        "calibrated {} linear(s) over {} sample(s) (accept length {al:.3}): input amax {lo:.4} .. \
         {hi:.4} -> {}",
        o.amax.len(),
        o.samples,
        a.output.display()
    );
    for n in &next {
        eprintln!("next: {}", printable(n));
    }
    Ok(ExitCode::SUCCESS)
}
