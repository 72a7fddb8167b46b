//! `kquant trace …`: making and bringing in `kquant-trace/1` traces. `capture` runs the target
//! on CPU (`trace::capture`): greedy continuations of the prompts, then the capture pass;
//! `import` (`cli::trace_import`) converts vLLM hidden-states connector files; `prompts`
//! (`trace::prompts`) tokenizes text prompts for both.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::json;

use crate::checkpoint::Checkpoint;
use crate::cli::print_json;
use crate::error::Result;
use crate::escape::printable;
use crate::runtime::target::Target;
use crate::target::stream::TapStream;
use crate::trace::capture::{self, Options};

/// Arguments of `kquant trace`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: TraceCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum TraceCommand {
    /// Run a Kimi-K2 (DeepseekV3ForCausalLM), Kimi-Linear (KimiLinearForCausalLM) or Kimi-K3
    /// (KimiK3ForConditionalGeneration, either tap stream: --stream) target on CPU over prompts
    /// and write a trace:
    /// greedy continuations, then one capture pass for the taps (as make_trace.py does).
    Capture(CaptureArgs),
    /// Import hidden states captured by a serving engine (`--format vllm-hidden-states DIR`).
    Import(super::trace_import::Args),
    /// Tokenize text prompts (JSONL `text`, or chat `messages` with --chat-template) with the
    /// target's tokenizer into the token-id prompts `trace capture` and `trace import` read.
    Prompts(PromptsArgs),
    /// Merge traces of one target into one (your prompts and the bundled ones, to calibrate or
    /// evaluate on both): samples numbered again, bytes copied as stored.
    Merge(MergeArgs),
}

/// Arguments of `kquant trace merge`.
#[derive(Debug, clap::Args)]
pub struct MergeArgs {
    /// The traces (`kquant-trace/1` directories), two or more, captured from the same target
    /// with the same taps and tap dtype.
    #[arg(required = true, num_args = 2..)]
    pub inputs: Vec<PathBuf>,
    /// The merged trace to write.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Replace an existing output (only a trace kquant wrote).
    #[arg(long)]
    pub force: bool,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `kquant trace prompts`.
#[derive(Debug, clap::Args)]
pub struct PromptsArgs {
    /// The target's tokenizer: its checkpoint directory (tokenizer.json, or tiktoken.model for
    /// Kimi-K2.x), or the tokenizer.json / tiktoken ranks file itself.
    #[arg(long)]
    pub tokenizer: PathBuf,
    /// Prompts: JSONL, one {"id", "dataset", "category", "text"} (or chat "messages") per line.
    #[arg(
        long = "prompts",
        value_name = "PROMPTS",
        required_unless_present = "input"
    )]
    pub prompts: Option<PathBuf>,
    /// The old spelling of --prompts (accepted with a warning until the next release).
    #[arg(long, value_name = "PROMPTS", hide = true, conflicts_with = "prompts")]
    pub input: Option<PathBuf>,
    /// The tokenized prompts (JSONL with `tokens`) to write.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Render each record with the target's chat template (add_generation_prompt=True), as
    /// transformers' apply_chat_template does, then tokenize without adding special tokens.
    #[arg(long)]
    pub chat_template: bool,
    /// Print one JSON document (kquant.trace-prompts/1) on stdout instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// Replace OUT if it is a tokenized prompts file kquant wrote.
    #[arg(long)]
    pub force: bool,
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
    /// Also keep N greedy tokens past each continuation's stop (EOS ignored) as lookahead, so
    /// that `verify` can give the engine's own count beside the committed one: vLLM counts the
    /// drafts its final step accepted before cutting them at `max_tokens` or EOS. Use the
    /// engine's `num_speculative_tokens` (docs/verify.md, "Which accept length").
    #[arg(long, default_value_t = 0, value_parser = crate::cli::flags::lookahead, allow_negative_numbers = true)]
    pub lookahead: usize,
    /// How the taps are stored: `bf16` (half the size; what an engine serving in bf16 feeds
    /// the draft) or `f32` (what an engine serving in float32 feeds it: docs/verify.md, "Tap
    /// precision").
    #[arg(long, value_enum, default_value_t = TapDtype::Bf16)]
    pub tap_dtype: TapDtype,
    /// Which hidden-state stream to tap on a target with attention residuals (Kimi-K3):
    /// `partial` (the current block's partial sum: vLLM's default, and the default here) or
    /// `mixture` (the mixture the next layer reads: SGLang's, vLLM's with
    /// VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=1). Capture on the stream the draft was trained on
    /// (docs/verify.md, "Tap streams"). Refused on a target without attention residuals,
    /// whose taps are the one `residual` stream. Recorded in the manifest (`tap_stream`).
    #[arg(long, value_enum)]
    pub stream: Option<TapStream>,
    /// Capture only the first N prompts (after --per-category); a warning names the
    /// categories this leaves out.
    #[arg(long, value_parser = crate::cli::flags::limit)]
    pub limit: Option<usize>,
    /// Capture only the first N prompts of each category (in file order).
    #[arg(long, value_parser = crate::cli::flags::limit)]
    pub per_category: Option<usize>,
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
        TraceCommand::Prompts(p) => run_prompts(p),
        TraceCommand::Merge(m) => run_merge(m),
    }
}

fn run_merge(a: MergeArgs) -> Result<ExitCode> {
    let m = crate::trace::merge::merge(&a.inputs, &a.output, a.force)?;
    if a.json {
        let mut doc = serde_json::to_value(&m).expect("JSON");
        doc["schema"] = "kquant.trace-merge/1".into();
        print_json(&doc);
    } else {
        let parts: Vec<String> = m
            .inputs
            .iter()
            .map(|(p, n)| {
                format!(
                    "{} ({n})",
                    crate::escape::printable(&p.display().to_string())
                )
            })
            .collect();
        println!(
            "{}: {} samples from {} ({} tap stream)",
            crate::escape::printable(&m.out.display().to_string()),
            m.samples,
            parts.join(" + "),
            m.tap_stream.map_or("unknown", |s| s.id())
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn run_prompts(mut a: PromptsArgs) -> Result<ExitCode> {
    if let Some(i) = a.input.take() {
        eprintln!("warning: `--input` is deprecated for trace prompts: say --prompts, as every other command does (accepted until the next release)");
        a.prompts = Some(i);
    }
    let input = a
        .prompts
        .clone()
        .expect("clap requires --prompts or --input");
    use crate::trace::prompts;
    let s = prompts::run(&prompts::Options {
        tokenizer: a.tokenizer.clone(),
        input: input.clone(),
        output: a.output.clone(),
        chat_template: a.chat_template,
        force: a.force,
    })?;
    for w in &s.warnings {
        eprintln!("warning: {}", crate::escape::printable(w));
    }
    // The tokenizer came from the target's checkpoint: name it (its directory, or the
    // tokenizer file's), not a placeholder.
    let target = if a.tokenizer.is_dir() {
        Some(a.tokenizer.clone())
    } else {
        a.tokenizer
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
    };
    let next = format!(
        "kquant trace capture --target-checkpoint {} --prompts {} -o TRACE",
        target.map_or_else(|| "TARGET".to_string(), |t| t.display().to_string()),
        a.output.display()
    );
    if a.json {
        let doc = serde_json::json!({
            "schema": prompts::REPORT_SCHEMA,
            "output": a.output.display().to_string(),
            "input": input.display().to_string(),
            "records": s.records,
            "tokens": s.tokens,
            "tokenizer": {
                "kind": s.kind.name(),
                "file": s.tokenizer_file.display().to_string(),
                "sha256": s.tokenizer_sha256,
            },
            "chat_template": s.chat_template.as_ref().map(|(p, h)| serde_json::json!({
                "source": p.display().to_string(),
                "sha256": h,
            })),
            "add_special_tokens": s.add_special_tokens,
            "warnings": s.warnings,
            "next": next,
        });
        print_json(&doc);
    } else {
        println!(
            "{}: {} prompts, {} tokens ({} `{}`, sha256 {}{})",
            a.output.display(),
            s.records,
            s.tokens,
            s.kind.name(),
            s.tokenizer_file.display(),
            &s.tokenizer_sha256[..12],
            match &s.chat_template {
                Some((p, _)) => format!("; chat template from `{}`", p.display()),
                None => String::new(),
            }
        );
        println!("next: {next}");
    }
    Ok(ExitCode::SUCCESS)
}

fn run_capture(a: CaptureArgs) -> Result<ExitCode> {
    let target = crate::cli::flags::deprecated(
        "trace capture",
        "--target",
        "--target-checkpoint",
        a.target_checkpoint.clone(),
        a.target_deprecated.clone(),
    )
    .expect("clap requires --target-checkpoint unless --target is given");
    // Claimed before hours of capture rather than at the end.
    let claim = crate::trace::file::claim(
        &a.output,
        a.force,
        &[a.prompts.clone(), PathBuf::from(&target)],
    )?;
    let ck = Checkpoint::open(&target)?;
    let m = Target::load(&ck)?;
    let stream =
        crate::trace::stream::for_target(a.stream, m.attention_residuals(), &target, "--stream")?;
    let (prompts, dropped) =
        capture::select_prompts(capture::read_prompts(&a.prompts)?, a.per_category, a.limit);
    if let (Some(n), false) = (a.limit, dropped.is_empty()) {
        let names: Vec<String> = dropped
            .iter()
            .map(|(c, k)| format!("`{}` ({k})", printable(c)))
            .collect();
        eprintln!(
            "warning: --limit {n} keeps the first {n} prompts of the file and drops every prompt of {} categor{}: {}; --per-category N keeps N of each",
            dropped.len(),
            if dropped.len() == 1 { "y" } else { "ies" },
            names.join(", ")
        );
    }
    let taps = a
        .taps
        .clone()
        .unwrap_or_else(|| (1..m.num_layers()).collect());
    let o = Options {
        gen_len: a.gen_len,
        taps,
        stop_at_eos: a.stop_at_eos,
        lookahead: a.lookahead,
        f32_taps: a.tap_dtype == TapDtype::F32,
        stream,
    };
    let dataset = a.dataset.clone().unwrap_or_else(|| {
        a.prompts
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default()
    });
    let s = capture::write_trace(&ck, &m, &target, &prompts, &o, &dataset, claim)?;
    let summary = format!(
        "{}: {} samples, {} tokens, taps {:?} ({} stream{}), greedy_selfcheck {} ({} regenerated without the cache)",
        a.output.display(),
        s.samples,
        s.tokens,
        o.taps,
        stream.id(),
        stream_default_note(a.stream, stream),
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
            "tap_stream": stream,
            "gen_len": o.gen_len,
            "greedy_selfcheck": s.selfcheck,
            "regenerated": s.regenerated,
            "warnings": Vec::<String>::new(),
            "next": next,
        });
        print_json(&doc);
        eprintln!("{}", printable(&summary));
    } else {
        println!("{}", printable(&summary));
    }
    for n in &next {
        eprintln!("next: {}", printable(n));
    }
    Ok(ExitCode::SUCCESS)
}

/// Where the stream was not asked for on an attention-residual target: which default it is.
fn stream_default_note(asked: Option<TapStream>, used: TapStream) -> &'static str {
    match (asked, used) {
        (None, TapStream::Partial) => {
            ": vLLM's default; --stream mixture taps SGLang's (docs/verify.md, \"Tap streams\")"
        }
        _ => "",
    }
}

/// What a user does with a captured trace next: the accept-length gate, the calibration NVFP4
/// W4A4 needs, and a calibrated quantization (each replays drafts over it, with the target's
/// embedding where needed).
fn next_steps(out: &std::path::Path, target: &str) -> Vec<String> {
    let out = out.display();
    vec![
        format!("kquant verify --draft DRAFT --baseline BASELINE --trace {out} --target-checkpoint {target} (the accept-length gate; docs/verify.md)"),
        format!("kquant calibrate --draft DRAFT --trace {out} --target-checkpoint {target} -o amax.json (the input amax of NVFP4 W4A4; docs/quantize.md)"),
        format!("kquant quantize DRAFT -o OUT --method gptq --calibrate {out} --target-checkpoint {target} (GPTQ calibrated on this trace; evaluate on other prompts; docs/quantize.md)"),
    ]
}

/// `trace capture --tap-dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TapDtype {
    Bf16,
    F32,
}
