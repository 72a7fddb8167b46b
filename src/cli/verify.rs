//! `kquant verify --draft D [--baseline B|prompt-lookup] [--target PROFILE] [--trace T]`: exact
//! offline replay of the engine's greedy speculative loop over a captured trace (or one captured
//! here from a live target), and the regression gate.
//! Exit 0 pass, 1 gate failed, 2 error.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::flags;
use crate::engines::Engine;
use crate::error::{Error, Result};
use crate::replay::AfterMiss;
use crate::verify::gate::GateOn;
use crate::verify::live::measure;
use crate::verify::offline;
use crate::verify::report::{self, Verdict};

/// `verify --engine`: a serving engine, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineArg {
    /// Tell from the server's `/v1/models` (`owned_by`).
    Auto,
    Vllm,
    Sglang,
    Trtllm,
}

impl EngineArg {
    /// The engine named (`None` for `auto`).
    fn engine(self) -> Option<Engine> {
        match self {
            EngineArg::Auto => None,
            EngineArg::Vllm => Some(Engine::Vllm),
            EngineArg::Sglang => Some(Engine::Sglang),
            EngineArg::Trtllm => Some(Engine::Trtllm),
        }
    }
}

/// Arguments of `kquant verify`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The draft to check (usually the quantized one).
    #[arg(long, required_unless_present = "endpoint")]
    pub draft: Option<String>,
    /// What to compare against: another draft (usually the original) or `prompt-lookup`.
    #[arg(long)]
    pub baseline: Option<String>,
    /// Live: the base URL of a running vLLM, SGLang or TensorRT-LLM server that serves the
    /// target with the draft (e.g. `http://127.0.0.1:8000`). The prompts (`--prompts`) are sent
    /// to it, greedy, and the accept length read back per request (docs/verify.md, "Live").
    #[arg(long, value_name = "URL", conflicts_with_all = ["draft", "baseline", "trace", "device", "near_ties", "steps", "after_miss", "target_checkpoint", "draft_stream", "allow_stream_mismatch", "stream"])]
    pub endpoint: Option<String>,
    /// Live: a second server to compare with, e.g. the BF16 draft's deployment (paired ΔAL over
    /// the same prompts).
    #[arg(long, value_name = "URL", requires = "endpoint")]
    pub baseline_endpoint: Option<String>,
    /// Live: the serving engine (`auto`: told by `/v1/models`).
    #[arg(long, value_enum, default_value_t = EngineArg::Auto, requires = "endpoint")]
    pub engine: EngineArg,
    /// Live: the served model name [default: the first of `/v1/models`].
    #[arg(long, requires = "endpoint")]
    pub model: Option<String>,
    /// Live: how `--prompts` is laid out (`auto`: told by its first record).
    #[arg(long, value_enum, default_value_t = crate::verify::prompt_sets::SetFormat::Auto, requires = "endpoint")]
    pub prompt_format: crate::verify::prompt_sets::SetFormat,
    /// Live: how raw text is sent, as `scripts/vllm_capture.py --text-mode` renders it: `auto`
    /// sends a chat benchmark's text (its `dataset` names MT-Bench, GSM8K, …: the bundled
    /// `mt_bench.jsonl`) as a user message through the chat template and other text as it is;
    /// `chat` every text as a user message (the script's default); `raw` every text as it is.
    #[arg(long, value_enum, default_value_t = crate::verify::prompt_sets::TextMode::Auto, requires = "endpoint")]
    pub text_mode: crate::verify::prompt_sets::TextMode,
    /// Live: tokens generated per request.
    #[arg(long, default_value_t = 256, value_parser = flags::max_tokens, requires = "endpoint")]
    pub max_tokens: usize,
    /// Live: requests in flight at once (batch composition can change greedy numerics; 1 gives
    /// the reproducible figure).
    #[arg(long, default_value_t = 1, value_parser = flags::concurrency, requires = "endpoint")]
    pub concurrency: usize,
    /// Live: seconds one request may take.
    #[arg(long, value_name = "SECS", default_value_t = 600, value_parser = flags::timeout_secs, requires = "endpoint")]
    pub request_timeout: u64,
    /// Live: tries after the first for a request that met a connection failure, a 5xx or a 429.
    #[arg(long, default_value_t = 2, value_parser = flags::retries, requires = "endpoint")]
    pub retries: usize,
    /// Live: failed requests tolerated (never measured), a count or a share (`5%`); more is an
    /// error (exit 2).
    #[arg(long, default_value = "5%", value_parser = flags::max_failed, requires = "endpoint")]
    pub max_failed: crate::verify::live::run::MaxFailed,
    /// Live: where a response has no per-request figure, measure each request from the
    /// engine's server-wide counters read around it, one request at a time. Only valid on a
    /// server this run has to itself (kquant refuses counters that another client moved,
    /// where the engine counts finished requests).
    #[arg(long, requires = "endpoint")]
    pub server_counters: bool,
    /// Live: measure responses that name another model than the one requested (an alias the
    /// server answers under its first name); without, such a response refuses the run. The
    /// report names the answering model.
    #[arg(long, requires = "endpoint")]
    pub allow_other_model: bool,
    /// Live: hold the measurement against the accept lengths `--target`'s profile quotes for
    /// this draft (a Hugging Face id as `kquant targets` lists it) on the prompt set's benchmark,
    /// overall and per category where the card splits it: below one by more than
    /// `--max-regression` fails the gate (the cards' engine figures). Offline: hold the draft's all-positions AL (teacher-forced) against the offline
    /// teacher-forced figures the profile quotes for DRAFT on the trace's benchmark (every
    /// sample's `dataset`); refused where the profile quotes none there.
    #[arg(long, value_name = "DRAFT", requires = "target")]
    pub published: Option<String>,
    /// Target profile (built-in name or JSON file; `kquant targets` lists them): the trace must
    /// fit its shape, and a live profile (`kimi-k2.5-tiny`, `kimi-linear-tiny`, `kimi-k3-tiny`)
    /// runs its target when no `--trace` is given.
    #[arg(long)]
    pub target: Option<String>,
    /// A kquant-trace/1 directory (tokens + target taps) captured from the target (`kquant
    /// trace capture` / `trace import`). Optional with a live `--target`.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Target checkpoint: its embedding for an EAGLE-3 draft that carries none, its embedding
    /// and lm_head for a DFlash draft [default: a live profile's target].
    #[arg(long)]
    pub target_checkpoint: Option<String>,
    #[command(flatten)]
    pub steps: flags::Steps,
    /// Say what near-ties could do: proposals whose logit is within LOGITS of the runner-up's
    /// are taken both ways (an engine serving in bf16 may pick either), and the report gives
    /// each accept length and ΔAL as a range, and per request the steps a near-tie decides
    /// (docs/verify.md, "Near-ties"). The replay on --device cpu only.
    #[arg(long, value_name = "LOGITS", value_parser = flags::near_ties, allow_negative_numbers = true)]
    pub near_ties: Option<f64>,
    /// With a live `--target` and no `--trace`: capture these prompts (jsonl, as `kquant trace
    /// capture --prompts` reads them) instead of the profile's bundled set. With `--endpoint`:
    /// the prompt set to send (MT-Bench, Spec-Bench, SPEED-Bench, GSM8K, MATH-500, HumanEval,
    /// plain jsonl of prompts or messages, or token ids; `--prompt-format`).
    #[arg(long, value_name = "FILE", conflicts_with = "trace")]
    pub prompts: Option<PathBuf>,
    #[command(flatten)]
    pub per_category: flags::PerCategory,
    /// What pass A computes after a root's first miss: `run` (every depth of every root, so
    /// every figure, the unconditional per-depth rates and the simulated AL included) or `skip`
    /// (an EAGLE-3 chain stops at the first miss: the gate's accept length, the all-positions AL
    /// and the conditional rates exactly, for the accepted rows' work only; `kquant bench
    /// replay --after-miss` measures both). The report states which.
    #[arg(long, value_enum, default_value_t = AfterMiss::Run)]
    pub after_miss: AfterMiss,
    /// The tap stream the draft was trained on, on a target with attention residuals
    /// (Kimi-K3): `partial` (vLLM's default capture) or `mixture` (SGLang's; vLLM with
    /// VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=1) [default: the target profile's `published_drafts`
    /// entry the draft is (same family, layout and taps), else not known: a note]. A draft
    /// baseline's too, unless --baseline-stream. A known stream that differs from the trace's
    /// is refused (docs/verify.md, "Tap streams").
    #[arg(long, value_enum)]
    pub draft_stream: Option<crate::target::stream::TapStream>,
    /// The tap stream a draft --baseline was trained on [default: --draft-stream's].
    #[arg(long, value_enum, requires = "baseline")]
    pub baseline_stream: Option<crate::target::stream::TapStream>,
    /// Replay a draft on a trace of another tap stream than the one it was trained on (to
    /// measure what the wrong stream costs), with a note, instead of refusing it.
    #[arg(long)]
    pub allow_stream_mismatch: bool,
    /// With a live attention-residual `--target` (Kimi-K3) and no `--trace`: the stream the
    /// capture taps [default: --draft-stream's, else vLLM's default `partial`].
    #[arg(long, value_enum, conflicts_with = "trace")]
    pub stream: Option<crate::target::stream::TapStream>,
    #[command(flatten)]
    pub gate: flags::Gate,
    /// Which accept length --max-regression and --min-accept judge: `walk` (tokens committed
    /// per verify step, as an engine's steps commit) or `all-positions` (teacher-forced over
    /// every anchor, the offline figure DFlash cards quote; offline only). Both are reported,
    /// with a baseline's and their paired Δ, either way.
    #[arg(long, value_enum, default_value_t = GateOn::Walk)]
    pub gate_on: GateOn,
    /// Fail when the draft's accept length is below this (a finite number in 0..=33).
    #[arg(long, value_parser = flags::min_accept)]
    pub min_accept: Option<f64>,
    /// Print the JSON report on stdout (`--json`, like every other command), or write it to FILE
    /// (`--json FILE`; `-` is stdout).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// Write JUnit XML here.
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Print, after the table, the draft's measured per-position acceptance in each engine's
    /// synthetic-acceptance form, overall and per category: vLLM's `--speculative-config`
    /// fragment (`rejection_sample_method: "synthetic"`, `synthetic_acceptance_rates`) and
    /// SGLang's `SGLANG_SIMULATE_ACC_LEN` (the JSON report has them always:
    /// `synthetic_acceptance`).
    #[arg(long)]
    pub synthetic_rates: bool,
    /// Refuse figures that come from degenerate output (a repetition loop in most
    /// continuations, an accept length near K+1, a per-depth acceptance of exactly 0 or 1):
    /// exit 2 after the report is written, as for any bad input. Without it they are `note:`
    /// lines and the JSON's `degenerate`.
    #[arg(long)]
    pub fail_on_degenerate: bool,
    /// Where the draft's linears run: `cpu` (the f32 runtime), `cuda[:N]`, `hip[:N]` (builds
    /// with `--features cuda` / `hip`): quantized INT4 ones on the kernels, unquantized BF16/F16
    /// ones (lm_head, fc) through the vendor BLAS, the lm_head's argmax on the device;
    /// `cpu-emu` replays that on the CPU (see docs/kernels.md).
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

pub fn run(a: Args) -> Result<ExitCode> {
    a.per_category.warn_spelling("verify");
    report::check_outputs(a.json.as_deref(), a.junit.as_deref())?;
    if let Some(endpoint) = a.endpoint.clone() {
        if a.gate_on == GateOn::AllPositions {
            return Err(Error::Flags {
                msg: "--gate-on all-positions with --endpoint: a live server reports steps and tokens, no teacher-forced positions".into(),
                hint: "gate a live run on its walked accept length (the default), or gate all-positions offline (`verify --trace`)".into(),
            });
        }
        let v = measure::run(&measure::Request {
            endpoint,
            baseline_endpoint: a.baseline_endpoint.clone(),
            engine: a.engine.engine(),
            model: a.model.clone(),
            target: a.target.clone(),
            prompts: a.prompts.clone(),
            prompt_format: a.prompt_format,
            text_mode: a.text_mode,
            limit_per_category: a.per_category.value(),
            max_tokens: a.max_tokens,
            concurrency: a.concurrency,
            request_timeout: a.request_timeout,
            retries: a.retries,
            max_failed: a.max_failed,
            server_counters: a.server_counters,
            allow_other_model: a.allow_other_model,
            published: a.published.clone(),
            thresholds: a.gate.thresholds(a.min_accept)?,
        })?;
        return render(&a, &v);
    }
    let draft = a.draft.clone().ok_or_else(|| Error::Flags {
        msg: "no draft to verify".into(),
        hint: "give --draft DIR (offline replay) or --endpoint URL (a live server)".into(),
    })?;
    let thresholds = a.gate.thresholds(a.min_accept)?;
    let plan = offline::Plan::resolve(offline::Request {
        draft,
        baseline: a.baseline.clone(),
        source: offline::Source {
            target: a.target.clone(),
            trace: a.trace.clone(),
            prompts: a.prompts.clone(),
            target_checkpoint: a.target_checkpoint.clone(),
            limit_per_category: a.per_category.value(),
            steps: a.steps.steps,
            stream: a.stream,
            stream_default: None,
        },
        near_ties: a.near_ties,
        after_miss: a.after_miss,
        thresholds,
        gate_on: a.gate_on,
        published: a.published.clone(),
        device: a.device.clone(),
        streams: offline::StreamFlags {
            draft: a.draft_stream,
            baseline: a.baseline_stream,
            allow_mismatch: a.allow_stream_mismatch,
        },
    })?;
    for w in &plan.warnings {
        eprintln!("warning: {w}");
    }
    render(&a, &plan.run()?)
}

/// `--fail-on-degenerate`: figures from degenerate output are bad data (exit 2), not a verdict
/// of the gate (exit 1 means only that the gate ran and failed).
fn refuse_degenerate(r: &report::Report) -> Result<()> {
    let Some(d) = r.degenerate.as_ref().filter(|d| d.flagged) else {
        return Ok(());
    };
    let what = match (r.offline(), r.live()) {
        (Some(o), _) => o.trace.clone(),
        (_, Some(l)) => l.live.prompts.clone(),
        _ => "verify".into(),
    };
    let causes: Vec<String> = d
        .findings
        .iter()
        .map(|f| {
            format!(
                "{} ({}, {})",
                f.cause.name(),
                f.side,
                crate::escape::printable(&f.scope)
            )
        })
        .collect();
    Err(Error::source(
        what,
        format!(
            "--fail-on-degenerate: the figures come from degenerate output: {} (the report above and its `degenerate` say where)",
            causes.join("; ")
        ),
    )
    .with_hint("measure on prompts a real workload sends (a chat model's prompts through its chat template, not raw completion), and check the draft (its taps, its weights); without --fail-on-degenerate the figures are reported with a note"))
}

/// Print the report, write `--json FILE` / `--junit FILE`, and exit 1 when the gate failed.
fn render(a: &Args, v: &Verdict) -> Result<ExitCode> {
    report::emit(&v.report, a.json.as_deref(), a.junit.as_deref(), &v.sources)?;
    if a.synthetic_rates && a.json.as_deref() != Some(std::path::Path::new("-")) {
        print!("{}", report::synthetic_lines(&v.report));
    }
    if a.fail_on_degenerate {
        refuse_degenerate(&v.report)?;
    }
    Ok(if v.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
