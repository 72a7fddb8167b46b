//! `kquant sensitivity SRC --trace T|--target LIVE [--scheme …] [--method …] [--pick]`: where a
//! quantization recipe costs accept length. Each group of modules (`quantize::sensitivity`) is
//! quantized alone, written in the recipe's format, and replayed against the original draft
//! over the trace: ΔAL, its paired 95 % interval and the proposal agreement per group, and the
//! same with every group quantized. `--pick` then measures exclusion sets, cheapest first
//! among those the single-group losses predict to pass (the prediction corrected by each miss),
//! until one meets `--max-regression`,
//! and prints (`--write-preset`: writes) the preset.
//! Exit 0; with `--pick`, 1 when no set tried meets the gate; 2 on error.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::print_json;
use crate::cli::{flags, human_bytes};
use crate::error::Result;
use crate::escape::printable;
use crate::quant::format::Format;
use crate::quant::registry::SCHEMES;
use crate::quantize::calibrate::Method;
use crate::quantize::sensitivity::report::Doc;
use crate::quantize::sensitivity::{self, run::Measured, Group};
use crate::verify::offline::Source;

/// Arguments of `kquant sensitivity`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The original (BF16/F16) draft: directory, `.safetensors` file or hub id.
    pub src: String,
    /// Target profile (`kquant targets`); a live one (`kimi-k2.5-tiny`) captures the trace
    /// when no `--trace` is given.
    #[arg(long)]
    pub target: Option<String>,
    /// The kquant-trace/1 directory to evaluate on. Calibrate on another one: a method
    /// measured on its own calibration prompts flatters itself.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// With a live `--target` and no `--trace`: capture these prompts (jsonl) instead of the
    /// profile's bundled set.
    #[arg(long, value_name = "FILE", conflicts_with = "trace")]
    pub prompts: Option<PathBuf>,
    /// Target checkpoint: its embedding (and DFlash's lm_head) for the drafts [default: a live
    /// profile's target]. Also used by the calibration replay.
    #[arg(long)]
    pub target_checkpoint: Option<String>,
    #[command(flatten)]
    pub per_category: flags::PerCategory,
    #[command(flatten)]
    pub steps: flags::Steps,
    /// Quantization scheme, as `quantize --scheme` [default: int4-pc, or the preset's].
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(SCHEMES.iter().map(|s| s.id.id())))]
    pub scheme: Option<String>,
    /// Output format the variants are written in [default: quark, or the preset's].
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// A preset (name or file) for the scheme, format and Quark settings; its exclude list is
    /// not used (give `--exclude`).
    #[arg(long)]
    pub config: Option<String>,
    /// Modules never quantized nor measured (comma-separated Quark fnmatch patterns)
    /// [default: none: `fc` and `lm_head` are measured like every other group].
    #[arg(long)]
    pub exclude: Option<String>,
    /// How the codes are chosen, as `quantize --method`.
    #[arg(long, value_enum, default_value_t = Method::Rtn)]
    pub method: Method,
    #[command(flatten)]
    pub cal: flags::Calibrate,
    /// The gate every measurement and the picked exclusion set must meet.
    #[command(flatten)]
    pub gate: flags::Gate,
    /// Look for the cheapest exclusion set (fewest bytes left unquantized) whose measured ΔAL
    /// meets `--max-regression`, and print it as a preset and a `quantize` command line.
    #[arg(long)]
    pub pick: bool,
    /// Most exclusion sets `--pick` measures (at least 1).
    #[arg(long, default_value_t = 12, value_parser = flags::limit, requires = "pick")]
    pub max_trials: usize,
    /// Write the picked preset here (a `quantize --config` file).
    #[arg(long, value_name = "FILE", requires = "pick")]
    pub write_preset: Option<PathBuf>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    a.per_category.warn_spelling("sensitivity");
    let req = sensitivity::run::Request {
        src: a.src.clone(),
        source: Source {
            target: a.target.clone(),
            trace: a.trace.clone(),
            prompts: a.prompts.clone(),
            target_checkpoint: a.target_checkpoint.clone(),
            limit_per_category: a.per_category.value(),
            steps: a.steps.steps,
            ..Source::default()
        },
        recipe: crate::quantize::Request {
            scheme: a.scheme.clone(),
            format: a.format,
            config: a.config.clone(),
            exclude: a.exclude.clone(),
            ..Default::default()
        },
        method: a.method,
        calibrate: a.cal.calibrate.clone(),
        calibration_memory: a.cal.calibration_memory,
        thresholds: a.gate.thresholds(None)?,
        pick: a.pick,
        max_trials: a.max_trials,
        write_preset: a.write_preset.clone(),
        command: crate::cli::command_line(),
    };
    let o = sensitivity::run::run(&req)?;
    if a.json {
        print_json(&o.doc);
    } else {
        print!(
            "{}",
            table(&o.doc, &o.groups, &o.single, &o.every, o.baseline_al)
        );
        if a.pick {
            match (&o.picked, &o.preset) {
                (Some(m), Some(p)) => {
                    println!(
                        "\npicked: leave {} unquantized: ΔAL {:+.4} [{:+.4}, {:+.4}], {} (of {} before)",
                        if m.excluded.is_empty() { "no further group".to_string() } else { m.excluded.join(", ") },
                        m.delta,
                        m.ci95[0],
                        m.ci95[1],
                        human_bytes(m.bytes_after),
                        human_bytes(o.bytes_before)
                    );
                    println!("preset: {}", printable(&p.to_string()));
                    println!("command: {}", printable(o.command.as_deref().unwrap_or("")));
                    if !o.loads_anywhere {
                        eprintln!(
                            "warning: no serving engine loads --scheme {} --format {} as written (`kquant schemes`): the preset gates what kquant and Quark-compatible pipelines run; to gate what vLLM or SGLang serve, pass --format compressed-tensors",
                            o.scheme,
                            o.format.name()
                        );
                    }
                }
                _ if o.trials == 0 => println!(
                    "\npicked: none: no exclusion set short of quantizing nothing is predicted (every group's ΔAL minus the excluded groups' own) to meet --max-regression {}",
                    a.gate.max_regression
                ),
                _ => println!(
                    "\npicked: none of the {} exclusion set(s) tried meets --max-regression {} (--max-trials tries more)",
                    o.trials,
                    a.gate.max_regression
                ),
            }
        }
    }
    if let (Some(path), Some(p)) = (&a.write_preset, &o.preset) {
        sensitivity::run::write_preset(&req, path, p)?;
    }
    Ok(if a.pick && o.picked.is_none() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The printed table: one row per group quantized alone, then every group together.
fn table(doc: &Doc, groups: &[Group], single: &[Measured], every: &Measured, base: f64) -> String {
    let mut s = format!(
        "sensitivity of {} ({} {}, method {}), {} samples, baseline AL {:.3}\n",
        printable(&doc.draft),
        doc.scheme,
        doc.format,
        doc.method_written(),
        doc.samples,
        base
    );
    s += &format!(
        "{:<18} {:>7} {:>10} {:>10} {:>8} {:>20} {:>9}\n",
        "quantize only", "modules", "size", "quantized", "ΔAL", "95% CI", "agree"
    );
    let row = |name: &str, m: &Measured, before: u64, after: u64| {
        format!(
            "{:<18} {:>7} {:>10} {:>10} {:>+8.4} {:>20} {:>9}\n",
            printable(name),
            m.quantized,
            human_bytes(before),
            human_bytes(after),
            m.delta,
            format!("[{:+.4}, {:+.4}]", m.ci95[0], m.ci95[1]),
            m.agreement.map_or("-".into(), |g| format!("{g:.4}"))
        )
    };
    for (g, m) in groups.iter().zip(single) {
        s += &row(&g.name, m, g.bytes_before, g.bytes_after);
    }
    let (b, q) = groups
        .iter()
        .fold((0, 0), |(b, q), g| (b + g.bytes_before, q + g.bytes_after));
    s += &row("every group", every, b, q);
    s
}
