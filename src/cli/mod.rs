//! Command-line definitions (clap derive), one file per verb, plus error rendering.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::error::{Error, Result};
use crate::escape::printable;

pub mod bench;
pub mod bench_gemm;
pub mod bench_replay;
pub mod calibrate;
pub mod convert;
pub mod dequantize;
pub mod diff;
pub mod flags;
pub mod inspect;
pub mod output_args;
pub mod quantize;
pub mod render;
pub mod schemes;
pub mod sensitivity;
pub mod synth;
pub mod targets;
pub mod trace;
pub mod trace_import;
pub mod verify;
pub mod verify_files;
pub mod verify_join;

pub use render::{command_line, human_bytes, human_count, print_json};

/// Quantize, convert and verify speculative-decoding draft models for Kimi targets.
#[derive(Debug, Parser)]
#[command(name = "kquant", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show what a checkpoint is: family, dialect, engines that load it, dimensions, dtypes.
    Inspect(inspect::Args),
    /// Quantize a draft into the files AMD Quark, compressed-tensors (vLLM) or ModelOpt (TensorRT-LLM) write, bit for bit.
    Quantize(quantize::Args),
    /// Move an EAGLE-3 / EAGLE-3-MLA / DFlash / DSpark / DFlash2 draft between engine layouts (quantized or not).
    Convert(convert::Args),
    /// Turn a quantized checkpoint back into float weights (w = q · s).
    Dequantize(dequantize::Args),
    /// Per-tensor error between two checkpoints (quantized ones are dequantized first).
    Diff(diff::Args),
    /// List quantization schemes, the formats that carry them and where each loads.
    Schemes(schemes::Args),
    /// Accept length of a draft on a captured trace (exact replay of the engine's greedy loop),
    /// and the regression gate against a baseline: exit 1 when it fails.
    Verify(verify::Args),
    /// Where a quantization recipe costs accept length: each module group quantized alone and
    /// replayed against the original draft; `--pick` finds the cheapest exclusions that pass.
    Sensitivity(sensitivity::Args),
    /// Record each linear's input abs-max over a trace replay: the `--input-amax` file NVFP4
    /// W4A4 (`quantize --scheme nvfp4`) needs.
    Calibrate(calibrate::Args),
    /// Make kquant-trace/1 traces: `capture` runs the target on CPU over prompts, `import`
    /// brings in vLLM hidden-states connector files.
    Trace(trace::Args),
    /// Re-hash an output directory against its kquant-manifest.json.
    VerifyFiles(verify_files::Args),
    /// Join a live verify report and an offline one per request: steps, committed drafts and
    /// near-tie steps side by side, and which differences a near-tie can explain.
    VerifyJoin(verify_join::Args),
    /// Write a deterministic synthetic checkpoint (tiny fixtures, or real-shape benchmarks).
    Synth(synth::Args),
    /// Measure speed against a baseline run in the same process (see docs/performance.md).
    Bench(bench::Args),
    /// Target profiles: shape, default taps per draft family, published accept lengths.
    Targets(targets::Args),
}

/// Run a parsed command line.
pub fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Inspect(a) => inspect::run(a),
        Command::Quantize(a) => quantize::run(a),
        Command::Convert(a) => convert::run(a),
        Command::Dequantize(a) => dequantize::run(a),
        Command::Diff(a) => diff::run(a),
        Command::Schemes(a) => schemes::run(a),
        Command::Verify(a) => verify::run(a),
        Command::Sensitivity(a) => sensitivity::run(a),
        Command::Calibrate(a) => calibrate::run(a),
        Command::Trace(a) => trace::run(a),
        Command::VerifyFiles(a) => verify_files::run(a),
        Command::VerifyJoin(a) => verify_join::run(a),
        Command::Synth(a) => synth::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Targets(a) => targets::run(a),
    }
}

/// Print `error: …`, its `Caused by:` chain and a `hint:` to stderr. Messages quote names read
/// from files, so each part goes through [`printable`]: one error is one line, whatever a
/// tensor name holds.
pub fn render_error(e: &Error) {
    eprintln!("error: {}", printable(&e.to_string()));
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        eprintln!("  Caused by: {}", printable(&s.to_string()));
        src = s.source();
    }
    if let Some(h) = e.hint() {
        eprintln!("\nhint: {}", printable(&h));
    }
}

/// Print a command-line error from clap (a refused flag value, an unknown flag, a missing
/// argument) with a `hint:` line, escaped like any other error, and give exit code 2; `--help`
/// and `--version` print as usual and give 0.
pub fn render_clap_error(e: clap::Error) -> ExitCode {
    if !e.use_stderr() {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    // The rendered text quotes the value the user gave: escaped like a name from a file.
    let text = e.render().to_string();
    for line in text.trim_end().lines() {
        eprintln!("{}", printable(line));
    }
    let hint = std::error::Error::source(&e)
        .and_then(|s| s.downcast_ref::<flags::FlagError>())
        .map(|f| f.hint.clone())
        .or_else(|| live_conflict_hint(e.kind(), &text))
        .or_else(|| choices_hint(e.kind(), &text))
        .or_else(|| value_hint(&text))
        .unwrap_or_else(|| {
            "see `kquant --help`, or `kquant COMMAND --help` for a command's arguments".into()
        });
    eprintln!("\nhint: {}", printable(&hint));
    ExitCode::from(2)
}

/// A flag of the offline replay beside `verify --endpoint`: the live run measures the server's
/// own speculative loop, so the replay's flags would be silently unused.
fn live_conflict_hint(kind: clap::error::ErrorKind, text: &str) -> Option<String> {
    if kind != clap::error::ErrorKind::ArgumentConflict || !text.contains("'--endpoint <URL>'") {
        return None;
    }
    Some("a live run (--endpoint) measures the server's own speculative loop; --draft, --baseline, --trace, --device, --near-ties, --steps, --after-miss and --target-checkpoint belong to the offline replay: drop them, or drop --endpoint (docs/verify.md, \"Live\")".into())
}

/// For a refused value clap already listed the values that exist: the hint points at them (and,
/// for `--scheme`, at `kquant schemes`, which says what each is and where it loads).
fn value_hint(text: &str) -> Option<String> {
    if !text.contains("[possible values:") {
        return None;
    }
    Some(if text.contains("'--scheme <SCHEME>'") {
        "pick one of the possible values above; `kquant schemes` says what each scheme is and \
         which engines load it"
            .into()
    } else {
        "pick one of the possible values above".into()
    })
}

/// For an unknown command or flag, the hint names what exists: the commands of the command
/// the usage line names (`Usage: kquant trace <COMMAND>`), or its flags (hidden deprecated
/// spellings left out).
fn choices_hint(kind: clap::error::ErrorKind, text: &str) -> Option<String> {
    use clap::error::ErrorKind;
    if !matches!(
        kind,
        ErrorKind::InvalidSubcommand | ErrorKind::UnknownArgument
    ) {
        return None;
    }
    let usage = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Usage: kquant"))?;
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let mut path = Vec::new();
    for word in usage.split_whitespace() {
        if word.starts_with(['-', '<', '[']) {
            break;
        }
        cmd = cmd.find_subcommand(word)?.clone();
        path.push(word);
    }
    let name = std::iter::once("kquant")
        .chain(path.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let subcommands: Vec<&str> = cmd
        .get_subcommands()
        .map(|c| c.get_name())
        .filter(|n| *n != "help")
        .collect();
    if !subcommands.is_empty() {
        return Some(format!(
            "the commands of `{name}` are {}; `{name} COMMAND --help` says what each takes",
            subcommands.join(", ")
        ));
    }
    let flags: Vec<String> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| {
            let long = a.get_long()?;
            Some(match a.get_short() {
                Some(s) => format!("--{long} (-{s})"),
                None => format!("--{long}"),
            })
        })
        .collect();
    Some(format!(
        "`{name}` takes {}; `{name} --help` says what each means (docs/flags.md lists every flag)",
        flags.join(", ")
    ))
}
