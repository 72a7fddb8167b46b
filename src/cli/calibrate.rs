//! `kquant calibrate --draft D --trace T [--target-checkpoint TGT] [--limit N] -o amax.json
//! [--json]`: the activation range NVFP4 W4A4's static input scales need. Runs the draft's replay
//! (pass A of docs/verify.md "What it computes", the f32 runtime: teacher-forced depths over the
//! trace's target taps and tokens) with an observer on every linear's input, and writes each
//! module's `max |x|` as the `kquant.input-amax/1` file `kquant quantize --scheme nvfp4
//! --input-amax` reads (`quant::input_amax`; module = the draft's own tensor name without
//! `.weight`). Fused siblings (q/k/v, gate/up, …) are recorded one by one; `quantize` shares
//! their largest. `--json` prints `kquant.calibrate/1` (what was observed, the next lines).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::escape::printable;
use crate::quant::input_amax::SCHEMA;
use crate::runtime::linears::Exec;
use crate::trace::file::Trace;
use crate::verify::drafters::{load_drafter, replay_first};
use crate::verify::gate::micro_al;

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
    let mut warnings = Vec::new();
    if !quantized.is_empty() {
        warnings.push(format!(
            "`{}` is already quantized ({} module(s)): the ranges observed are those of \
             its dequantized weights; calibrate the original draft for a fresh quantization",
            a.draft,
            quantized.len()
        ));
    }
    for w in &warnings {
        eprintln!("warning: {}", printable(w));
    }
    let steps = crate::verify::drafters::steps_for(d.as_ref(), a.steps.steps, &a.draft)?;
    d.linears().observe(true);
    let walks = replay_first(
        d.as_ref(),
        &trace,
        steps,
        crate::verify::drafters::AfterMiss::Run,
        limit,
        &|_| {},
    )?;
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
        "steps": steps,
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
    let al = micro_al(&all);
    let next = next_steps(&a.draft, &a.output);
    if a.json {
        let doc = serde_json::json!({
            "schema": "kquant.calibrate/1",
            "output": a.output,
            "draft": a.draft,
            "trace": a.trace,
            "target_checkpoint": a.target_checkpoint,
            "samples": walks.len(),
            "steps": steps,
            "linears": amax.len(),
            "accept_length": al,
            "amax_min": lo,
            "amax_max": hi,
            "warnings": warnings,
            "next": next,
        });
        println!("{}", serde_json::to_string_pretty(&doc).expect("JSON"));
    }
    eprintln!(
        "calibrated {} linear(s) over {} sample(s) (accept length {al:.3}): input amax {lo:.4} .. \
         {hi:.4} -> {}",
        amax.len(),
        walks.len(),
        a.output.display()
    );
    for n in &next {
        eprintln!("next: {}", printable(n));
    }
    Ok(ExitCode::SUCCESS)
}

/// What a user does with the input-amax file next: quantize the draft to NVFP4 W4A4 in each
/// format that carries it (docs/quantize.md).
fn next_steps(draft: &str, amax: &std::path::Path) -> Vec<String> {
    ["compressed-tensors", "modelopt"]
        .iter()
        .map(|f| {
            format!(
                "kquant quantize {draft} -o OUT --scheme nvfp4 --format {f} --input-amax {}",
                amax.display()
            )
        })
        .collect()
}

fn min_max(m: &BTreeMap<String, f32>) -> (f32, f32) {
    m.values()
        .fold((f32::INFINITY, 0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}
