//! `kquant quantize SRC -o OUT [--scheme …] [--format quark|compressed-tensors|modelopt]
//! [--exclude PATTERNS] [--input-amax FILE]`: argument parsing and rendering over the library's
//! pipeline, `crate::quantize` (resolve → plan → drive).

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;

use crate::checkpoint::Checkpoint;
use crate::cli::human_bytes;
use crate::cli::output_args::OutputArgs;
use crate::error::{Error, Result};
use crate::escape::printable;
use crate::quant::format::Format;
use crate::quant::quark;
use crate::quant::registry::SCHEMES;
use crate::quantize::calibrate::{self, Calibration, Method};
use crate::quantize::drive::Job;
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
    let request = Request {
        scheme: a.scheme.clone(),
        format: a.format,
        config: a.config.clone(),
        exclude: a.exclude.clone(),
        quark_layout: a.quark_layout,
        quark_version: a.quark_version,
        quark_sequential: a.quark_sequential,
        input_amax: a.input_amax.clone(),
    };
    let recipe = quantize::resolve(&ck, &det, &a.src, &request)?;
    let mut plan = Plan::new(&ck, &recipe, a.dry_run)?;
    // The method: the flag's, else the preset's (a preset picked on calibrated codes holds
    // only for them), else round to nearest.
    let preset_method = match &a.config {
        Some(spec) => crate::quant::preset::load(spec)?
            .method
            .map(|m| {
                <Method as clap::ValueEnum>::from_str(&m, false).map_err(|_| Error::Flags {
                    msg: format!("--config {spec}: `method` is `{m}`, not a quantize method"),
                    hint: "use rtn, search, gptq or search-gptq".into(),
                })
            })
            .transpose()?,
        None => None,
    };
    let method = a.method.or(preset_method).unwrap_or(Method::Rtn);
    if let (None, Some(m), None) = (a.method, preset_method, &a.cal.calibrate) {
        if m != Method::Rtn {
            return Err(Error::Flags {
                msg: format!(
                    "--config {} was measured with --method {}: its accept length holds for those codes, which need calibration inputs",
                    a.config.as_deref().unwrap_or(""),
                    method_name(m)
                ),
                hint: "give --calibrate TRACE (the preset's description names the trace it was picked on), or --method rtn to quantize to nearest knowingly".into(),
            });
        }
    }
    let calibration = match (method, &a.cal.calibrate) {
        (Method::Rtn, None) => None,
        (Method::Rtn, Some(_)) => {
            return Err(Error::Flags {
                msg: "--calibrate with --method rtn: round to nearest uses no calibration".into(),
                hint: "add --method search, or drop --calibrate".into(),
            })
        }
        (m, None) => {
            return Err(Error::Flags {
                msg: format!("--method {} needs calibration inputs", method_name(m)),
                hint: "give --calibrate TRACE (a trace captured from the draft's target: `kquant trace capture`)".into(),
            })
        }
        (m, Some(t)) => Some((
            m,
            Calibration {
                trace: t.clone(),
                target: a.target_checkpoint.clone(),
                steps: a.steps,
                limit: None,
                memory: a.cal.calibration_memory,
            },
        )),
    };
    let mut report = None;
    if let (Some((m, cal)), false) = (&calibration, a.dry_run) {
        let pb = crate::progress::items(0, "calibrate", "positions");
        let (chosen, r) = calibrate::choose(&plan, &a.src, *m, cal, &|done, total| {
            pb.set_length(total);
            pb.set_position(done);
        })?;
        pb.finish_and_clear();
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
                        crate::escape::printable(c).into_owned()
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
                r.kept_rtn.iter().map(|m| crate::escape::printable(m).into_owned()).collect::<Vec<_>>().join(", ")
            );
        }
        plan.chosen = chosen;
        plan.record = Some(json!({
            "method": method_name(*m),
            "calibration": {"trace_sha256": r.trace_sha256, "samples": r.samples, "input_rows": r.tokens, "steps": r.steps, "categories": r.categories},
            "gptq": m.gptq().then(|| json!({"block_size": 128, "damp_frac": 0.01, "act_order": true, "retries": 5})),
            "producer": format!("kquant {}", env!("CARGO_PKG_VERSION")),
        }));
        report = Some(r);
    }
    let (before, after, n_q) = (plan.bytes_before(), plan.bytes_after(), plan.quantized());
    if a.dry_run {
        if a.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&plan.to_json()).expect("JSON")
            );
        } else {
            print_plan(&plan);
        }
        return Ok(ExitCode::SUCCESS);
    }

    let mut inputs = Job::inputs(&plan);
    if let Some((_, cal)) = &calibration {
        // The calibration trace is an input of the output: the manifest records (and hashes)
        // its files.
        inputs.extend(crate::trace::file::files(&cal.trace)?);
    }
    let wopts = a.out.write_options(inputs);
    let (mut job, mut warnings) = Job::start(&plan, &a.out.output, wopts, &det.family, &a.src)?;
    // Warned once the output is claimed: a refused output is one `error:`, not a page of
    // engine notes before it. One line per engine: each escaped on its own (crate::escape).
    for w in &warnings {
        for (i, line) in w.lines().enumerate() {
            let head = if i == 0 { "warning: " } else { "" };
            eprintln!("{head}{}", printable(line));
        }
    }
    let pb = crate::progress::bytes(before, "quantize");
    job.write(&|k| pb.inc(k))?;
    pb.finish_and_clear();
    let done = job.finish(&a.src)?;
    for w in &done.warnings {
        eprintln!("warning: {}", printable(w));
    }
    warnings.extend(done.warnings);
    let scheme = recipe.scheme();
    if a.json {
        let doc = json!({"schema": "kquant.quantize/1", "output": done.dir, "scheme": scheme, "format": recipe.format().name(), "method": method_name(method), "calibration": report, "quantized": n_q, "bytes_before": before, "bytes_after": after, "files": done.files, "exclude": plan.unquantized, "warnings": warnings, "next": done.next});
        println!("{}", serde_json::to_string_pretty(&doc).expect("JSON"));
    }
    eprintln!(
        "quantized {n_q} tensors ({}, {}): {} -> {} in {}",
        scheme,
        plan.codec.describe(),
        human_bytes(before),
        human_bytes(after),
        done.dir.display()
    );
    for n in &done.next {
        eprintln!("next: {}", printable(n));
    }
    Ok(ExitCode::SUCCESS)
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

fn method_name(m: Method) -> &'static str {
    match m {
        Method::Rtn => "rtn",
        Method::Search => "search",
        Method::Gptq => "gptq",
        Method::SearchGptq => "search-gptq",
    }
}

fn scheme_parser() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(SCHEMES.iter().map(|s| s.id.id()))
}
