//! `kquant trace …`: making and bringing in `kquant-trace/1` traces. `capture` runs the target
//! on CPU (`verify::capture`): greedy continuations of the prompts, then the capture pass;
//! `import` (`cli::trace_import`) converts vLLM hidden-states connector files.

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::escape::printable;
use crate::runtime::deepseek::DeepseekV3;
use crate::verify::capture::{self, Options};

/// Arguments of `kquant trace`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: TraceCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum TraceCommand {
    /// Run a Kimi-K2 (DeepseekV3ForCausalLM) target on CPU over prompts and write a trace:
    /// greedy continuations, then one capture pass for the taps (as make_trace.py does).
    Capture(CaptureArgs),
    /// Import hidden states captured by a serving engine (`--from vllm-hidden-states DIR`).
    Import(super::trace_import::Args),
}

/// Arguments of `kquant trace capture`.
#[derive(Debug, clap::Args)]
pub struct CaptureArgs {
    /// The target checkpoint (directory, .safetensors file or hub id); any dtype or quantized
    /// layout kquant reads, run in f32.
    #[arg(long, required_unless_present = "target_deprecated")]
    pub target_checkpoint: Option<String>,
    /// Deprecated spelling of `--target-checkpoint` (accepted with a warning until the next
    /// release; `--target` names a target profile in `verify` and `trace import`).
    #[arg(long = "target", hide = true, conflicts_with = "target_checkpoint")]
    pub target_deprecated: Option<String>,
    /// Prompts: JSONL with token ids in `tokens` (or `prompt_ids`), optional `id`, `category`.
    #[arg(long)]
    pub prompts: PathBuf,
    /// Output trace directory.
    #[arg(short, long)]
    pub output: PathBuf,
    /// HF hidden_states indices to store, e.g. `1,2,3` [default: every block output before
    /// the last, 1..L-1].
    #[arg(long, value_delimiter = ',', value_parser = crate::cli::flags::layer_id)]
    pub taps: Option<Vec<usize>>,
    /// Greedy tokens generated per prompt.
    #[arg(long, default_value_t = 96, value_parser = crate::cli::flags::gen_len)]
    pub gen_len: usize,
    /// End a continuation at the target's EOS (default: EOS is committed like any token, as
    /// SGLang/vLLM benchmarks run with ignore_eos).
    #[arg(long)]
    pub stop_at_eos: bool,
    /// Capture only the first N prompts.
    #[arg(long, value_parser = crate::cli::flags::limit)]
    pub limit: Option<usize>,
    /// `dataset` of samples whose prompt line names none [default: the prompts file's stem].
    #[arg(long)]
    pub dataset: Option<String>,
    /// Replace an existing output directory.
    #[arg(long)]
    pub force: bool,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    match a.command {
        TraceCommand::Capture(c) => run_capture(c),
        TraceCommand::Import(i) => super::trace_import::run(i),
    }
}

fn run_capture(a: CaptureArgs) -> Result<ExitCode> {
    let target = crate::cli::deprecated::resolve(
        "trace capture",
        "--target",
        "--target-checkpoint",
        a.target_checkpoint.clone(),
        a.target_deprecated.clone(),
    )
    .expect("clap requires --target-checkpoint unless --target is given");
    // Claimed before hours of capture rather than at the end.
    let claim = crate::verify::trace::claim(
        &a.output,
        a.force,
        &[a.prompts.clone(), PathBuf::from(&target)],
    )?;
    let ck = Checkpoint::open(&target)?;
    let m = DeepseekV3::load(&ck)?;
    let mut prompts = capture::read_prompts(&a.prompts)?;
    prompts.truncate(a.limit.unwrap_or(usize::MAX));
    let taps = a
        .taps
        .clone()
        .unwrap_or_else(|| (1..m.num_layers).collect());
    let o = Options {
        gen_len: a.gen_len,
        taps,
        stop_at_eos: a.stop_at_eos,
    };
    let dataset = a.dataset.clone().unwrap_or_else(|| {
        a.prompts
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default()
    });
    let s = capture::write_trace(&ck, &m, &target, &prompts, &o, &dataset, claim)?;
    let summary = format!(
        "{}: {} samples, {} tokens, taps {:?}, greedy_selfcheck {} ({} regenerated without the cache)",
        a.output.display(),
        s.samples,
        s.tokens,
        o.taps,
        s.selfcheck,
        s.regenerated
    );
    let next = next_steps(&a.output, &target);
    if a.json {
        let doc = json!({
            "schema": "kquant.trace-capture/1",
            "output": a.output,
            "target": target,
            "prompts": a.prompts,
            "dataset": dataset,
            "samples": s.samples,
            "tokens": s.tokens,
            "taps": o.taps,
            "gen_len": o.gen_len,
            "greedy_selfcheck": s.selfcheck,
            "regenerated": s.regenerated,
            "warnings": Vec::<String>::new(),
            "next": next,
        });
        println!("{}", serde_json::to_string_pretty(&doc).expect("JSON"));
        eprintln!("{}", printable(&summary));
    } else {
        println!("{}", printable(&summary));
    }
    for n in &next {
        eprintln!("next: {}", printable(n));
    }
    Ok(ExitCode::SUCCESS)
}

/// What a user does with a captured trace next: the accept-length gate, and the calibration
/// NVFP4 W4A4 needs (both replay drafts over it, with the target's embedding where needed).
fn next_steps(out: &std::path::Path, target: &str) -> Vec<String> {
    let out = out.display();
    vec![
        format!("kquant verify --draft DRAFT --baseline BASELINE --trace {out} --target-checkpoint {target} (the accept-length gate; docs/verify.md)"),
        format!("kquant calibrate --draft DRAFT --trace {out} --target-checkpoint {target} -o amax.json (the input amax of NVFP4 W4A4; docs/quantize.md)"),
    ]
}
