//! `kquant quantize SRC -o OUT [--scheme …] [--format quark|compressed-tensors|modelopt]
//! [--exclude PATTERNS] [--input-amax FILE]`: argument parsing and rendering over the library's
//! pipeline, `crate::quantize` (resolve → plan → drive).

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;

use crate::checkpoint::Checkpoint;
use crate::cli::human_bytes;
use crate::cli::output_args::OutputArgs;
use crate::cli::print_json;
use crate::error::Result;
use crate::escape::printable;
use crate::quant::format::Format;
use crate::quant::quark;
use crate::quant::registry::SCHEMES;
use crate::quantize::calibrate::{self, Calibration, Method, Report};
use crate::quantize::drive::{Done, Job};
use crate::quantize::plan::{Action, Plan};
use crate::quantize::{self, Request};

/// Arguments of `kquant quantize`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Source checkpoint: directory, `.safetensors` file or hub id.
    pub src: String,
    #[command(flatten)]
    pub out: OutputArgs,
    /// Quantization scheme (`kquant schemes` lists them and where each loads); default int4-pc,
    /// or the preset's with `--config`.
    #[arg(long, value_parser = scheme_parser())]
    pub scheme: Option<String>,
    /// Output format. Default quark.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// A preset: a name from quant-configs/ (built in) or a JSON file. Flags override it.
    #[arg(long)]
    pub config: Option<String>,
    /// Comma-separated patterns (Python fnmatch on the module name = tensor name without
    /// `.weight`, as Quark matches them; for every format). Embeddings, norms, 1-D tensors and
    /// d2t/t2d are never quantized.
    /// (Default `lm_head`, or the preset's list.)
    #[arg(long)]
    pub exclude: Option<String>,
    /// Quark path to reproduce: `model` (reorder nibbles + zero-point; the default) or
    /// `file2file` (per-channel only). `--format quark` only.
    #[arg(long, value_enum)]
    pub quark_layout: Option<quark::Layout>,
    /// Quark release whose output to reproduce (default 0.13). `--format quark` only.
    #[arg(long, value_enum)]
    pub quark_version: Option<quark::Version>,
    /// Model path only: pack nibbles in sequential order (Quark `pack_method="order"`).
    #[arg(long)]
    pub quark_sequential: bool,
    /// Calibrated input amax per module (JSON `{"schema": "kquant.input-amax/1", "amax":
    /// {MODULE: AMAX}}`), required by `--scheme nvfp4` (W4A4) for its static input scales.
    #[arg(long, value_name = "FILE")]
    pub input_amax: Option<PathBuf>,
    /// Instead of `--input-amax`: every quantized module's input amax is ModelOpt's drafter
    /// quantizer's fixed 448 (`quantize_drafter.py`; FP8 `input_scale` 1.0), no calibration.
    #[arg(long, conflicts_with = "input_amax")]
    pub fixed_input_amax: bool,
    /// How the codes are chosen: `rtn` (round to nearest, the reference tools' recipe, byte for
    /// byte), `search` (per run of weights sharing a scale, the scale — RTN's × 1, 8/7.5,
    /// 0.99 … 0.60, in the stored dtype — with the least error weighted by the inputs' second
    /// moments over `--calibrate`) or `gptq` (GPTQ under RTN's scales on each module's Σ x xᵀ
    /// over `--calibrate`: block 128, damping 0.01, act-order), or `search-gptq` (GPTQ under
    /// the search's scales). Symmetric INT4 schemes.
    /// [default: `rtn`, or the `--config` preset's method]
    #[arg(long, value_enum)]
    pub method: Option<Method>,
    #[command(flatten)]
    pub cal: crate::cli::flags::Calibrate,
    /// Target checkpoint for the calibration replay: its embedding for an EAGLE-3 draft
    /// without one, embedding and lm_head for DFlash.
    #[arg(long, requires = "calibrate")]
    pub target_checkpoint: Option<String>,
    /// Draft tokens per step in the calibration replay [default: 3 for an EAGLE-3 chain; a
    /// DFlash draft's block_size − 1, and at most that].
    #[arg(long, value_name = "N", value_parser = crate::cli::flags::steps, requires = "calibrate")]
    pub steps: Option<usize>,
    /// Print the per-tensor plan and sizes; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the plan / result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let ck = Checkpoint::open(&a.src)?;
    let det = ck.detect()?;
    let recipe = quantize::resolve(&ck, &det, &a.src, &request(&a))?;
    let mut plan = Plan::new(&ck, &recipe, a.dry_run)?;
    let cal = a.cal.calibrate.as_ref().map(|t| Calibration {
        trace: t.clone(),
        target: a.target_checkpoint.clone(),
        steps: a.steps,
        limit: None,
        memory: a.cal.calibration_memory,
    });
    let (method, calibration) = calibrate::resolve_method(a.method, a.config.as_deref(), cal)?;
    let mut report = None;
    if let (Some(cal), false) = (&calibration, a.dry_run) {
        let pb = crate::progress::Deferred::new("calibrate", "positions");
        let r = calibrate::apply(&mut plan, &a.src, method, cal, &|done, total| {
            pb.set(done, total)
        })?;
        pb.finish_and_clear();
        print_calibration(cal, &r);
        report = Some(r);
    }
    if a.dry_run {
        if a.json {
            print_json(&plan.to_json());
        } else {
            print_plan(&plan);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let inputs = Job::inputs_calibrated(&plan, calibration.as_ref().map(|c| c.trace.as_path()))?;
    let wopts = a.out.write_options(inputs);
    let (mut job, mut warnings) = Job::start(&plan, &a.out.output, wopts, &det.family, &a.src)?;
    // Warned once the output is claimed: a refused output is one `error:`, not a page of
    // engine notes before it.
    print_warnings(&warnings);
    let pb = crate::progress::bytes(plan.bytes_before(), "quantize");
    job.write(&|k| pb.inc(k))?;
    pb.finish_and_clear();
    let done = job.finish(&a.src)?;
    for w in &done.warnings {
        eprintln!("warning: {}", printable(w));
    }
    warnings.extend(done.warnings.iter().cloned());
    if a.json {
        let doc = result_json(&plan, method, report.as_ref(), &done, &warnings);
        print_json(&doc);
    }
    eprintln!(
        "quantized {} tensors ({}, {}): {} -> {} in {}",
        plan.quantized(),
        recipe.scheme(),
        plan.codec.describe(),
        human_bytes(plan.bytes_before()),
        human_bytes(plan.bytes_after()),
        done.dir.display()
    );
    for n in &done.next {
        eprintln!("next: {}", printable(n));
    }
    Ok(ExitCode::SUCCESS)
}

/// The library's request from the flags.
fn request(a: &Args) -> Request {
    Request {
        scheme: a.scheme.clone(),
        format: a.format,
        config: a.config.clone(),
        exclude: a.exclude.clone(),
        quark_layout: a.quark_layout,
        quark_version: a.quark_version,
        quark_sequential: a.quark_sequential,
        input_amax: a.input_amax.clone(),
        fixed_input_amax: a.fixed_input_amax,
    }
}

/// The engine warnings of a claimed output, one line per engine, each escaped on its own
/// (crate::escape).
fn print_warnings(warnings: &[String]) {
    for w in warnings {
        for (i, line) in w.lines().enumerate() {
            let head = if i == 0 { "warning: " } else { "" };
            eprintln!("{head}{}", printable(line));
        }
    }
}

/// What the calibration stage did, on stderr: the trace, the runs it moved, the prompts'
/// categories, the modules kept at round to nearest.
fn print_calibration(cal: &Calibration, r: &Report) {
    eprintln!(
        "calibrated on {} ({} samples, {} input rows, {} replay(s)): {} modules; of their {} scale runs, {} have another scale than RTN's and {} other codes{}",
        printable(&cal.trace.display().to_string()),
        r.samples,
        r.tokens,
        r.replays,
        r.modules,
        r.runs,
        r.scales_changed,
        r.codes_changed,
        r.gptq_loss.map_or(String::new(), |l| format!(", GPTQ loss {l:.4e}"))
    );
    eprintln!(
        "calibration prompts by category (share of generated positions): {}",
        r.categories
            .iter()
            .map(|(c, f)| format!(
                "{} {:.0} %",
                if c.is_empty() {
                    "(none)".into()
                } else {
                    printable(c).into_owned()
                },
                f * 100.0
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !r.kept_rtn.is_empty() {
        eprintln!(
            "warning: the calibration inputs of {} module(s) are all zero, so there is nothing to fit: {} kept at round to nearest ({})",
            r.kept_rtn.len(),
            if r.kept_rtn.len() == 1 { "it is" } else { "they are" },
            r.kept_rtn.iter().map(|m| printable(m).into_owned()).collect::<Vec<_>>().join(", ")
        );
    }
}

/// The `--json` result (`kquant.quantize/1`).
fn result_json(
    plan: &Plan,
    method: Method,
    report: Option<&Report>,
    done: &Done,
    warnings: &[String],
) -> serde_json::Value {
    json!({"schema": "kquant.quantize/1", "output": done.dir, "scheme": plan.recipe.scheme(), "format": plan.recipe.format().name(), "method": method.name(), "calibration": report, "quantized": plan.quantized(), "bytes_before": plan.bytes_before(), "bytes_after": plan.bytes_after(), "files": done.files, "exclude": plan.unquantized, "warnings": warnings, "next": done.next})
}

/// The `--dry-run` table: each tensor, what happens to it, its bytes before and after; the
/// totals; the unquantized-module list as the config will carry it.
fn print_plan(plan: &Plan) {
    let scheme = plan.recipe.scheme();
    for r in &plan.rows {
        let what = match &r.action {
            Action::Quantize { .. } => scheme.to_string(),
            Action::Copy { reason } => format!("excluded ({reason})"),
        };
        // Names and patterns are escaped for the terminal (crate::escape).
        println!(
            "{:<48} {:<40} {:>12} -> {:>12}",
            printable(&r.tensor.name),
            printable(&what),
            human_bytes(r.tensor.nbytes()),
            human_bytes(r.bytes_after())
        );
    }
    println!(
        "{} tensors quantized; total {} -> {}",
        plan.quantized(),
        human_bytes(plan.bytes_before()),
        human_bytes(plan.bytes_after())
    );
    println!(
        "quantization_config.{}: {}",
        plan.recipe.format().list_key(),
        printable(&json!(plan.unquantized).to_string())
    );
}

fn scheme_parser() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(SCHEMES.iter().map(|s| s.id.id()))
}
