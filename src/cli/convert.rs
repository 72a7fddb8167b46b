//! `kquant convert {eagle3|dflash|dspark|dflash2} SRC -o OUT --to ENGINE [--target-checkpoint TGT]`: move a
//! draft between engine layouts.

use std::process::ExitCode;

use serde_json::json;

use crate::checkpoint::AuxConvention;
use crate::cli::human_bytes;
use crate::cli::output_args::OutputArgs;
use crate::cli::print_json;
use crate::convert::Kind;
use crate::convert::{self, Conversion, DraftLayout, Plan, Request};
use crate::error::Result;
use crate::escape::{json_printable, printable};

/// Aux-id conventions on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Convention {
    /// id k = output of decoder layer k = HF hidden_states[k+1] (SpecForge, TorchSpec, ModelOpt, TRT-LLM).
    OutputOfLayer,
    /// id k = input of decoder layer k = HF hidden_states[k] (vLLM, EAGLE reference inference).
    InputOfLayer,
}

/// Arguments of `kquant convert`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Draft family of the source: `eagle3` (Llama-style or MLA), `dflash`, `dspark` or
    /// `dflash2`.
    pub kind: Kind,
    /// Source draft: directory, `.safetensors` file or hub id.
    pub src: String,
    #[command(flatten)]
    pub out: OutputArgs,
    /// Engine (or trainer) layout to write. DSpark takes vllm (`Qwen3DSparkModel`; an MLA
    /// `K3DSparkModel` stays one), sglang and specforge (`DSparkDraftModel`, keys in
    /// `dflash_config` and at the root) and speculators; DFlash2 takes vllm and sglang (one
    /// layout for both). A quantized draft whose scheme that engine does not load (as `kquant
    /// inspect` says) is refused; `--force` writes it anyway, with a warning and no launch
    /// line.
    #[arg(long, value_enum)]
    pub to: DraftLayout,
    /// Where the source comes from, when detection cannot tell (sets the aux-id convention and
    /// is checked against the tensor names).
    #[arg(long, value_enum)]
    pub from: Option<DraftLayout>,
    /// Target checkpoint (directory, `.safetensors` file or hub id) to copy embed_tokens /
    /// lm_head from when the chosen engine needs them and the draft lacks them.
    #[arg(long)]
    pub target_checkpoint: Option<String>,
    /// Deprecated spelling of `--target-checkpoint` (accepted with a warning until the next
    /// release; `--target` names a target profile in `verify` and `trace import`).
    #[arg(long = "target", hide = true, conflicts_with = "target_checkpoint")]
    pub target_deprecated: Option<String>,
    /// Aux-layer ids to write instead of the source's, comma-separated (needs --aux-convention).
    #[arg(long, value_delimiter = ',', value_parser = crate::cli::flags::aux_layer)]
    pub aux_layers: Option<Vec<i64>>,
    /// Convention of the source's (or --aux-layers') ids.
    #[arg(long, value_enum)]
    pub aux_convention: Option<Convention>,
    /// `model_type` for MLA drafts (default: deepseek_v3 for SGLang, which every SGLang release
    /// loads; kimi_k2 otherwise: vLLM 0.33.0 reads an EAGLE-3 draft with deepseek_v3 as DeepSeek
    /// MTP and refuses it).
    #[arg(long)]
    pub model_type: Option<String>,
    /// Tokens drafted per step in the printed launch line and TensorRT-LLM's max_draft_len.
    /// EAGLE-3: draft depths per round (default 3). DFlash and DFlash2: tokens proposed per
    /// step, at most the draft's block_size − 1, which is the default (SGLang runs a block of
    /// steps + 1). DSpark: at most block_size (anchor-first) or block_size − 1 (1+N layout).
    #[arg(long, value_parser = crate::cli::flags::steps)]
    pub steps: Option<usize>,
    /// Print the plan (names, sources, dropped tensors, config, warnings) and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the plan / result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let req = Request {
        kind: a.kind,
        src: a.src.clone(),
        to: a.to,
        from: a.from,
        target_checkpoint: crate::cli::flags::deprecated(
            "convert",
            "--target",
            "--target-checkpoint",
            a.target_checkpoint.clone(),
            a.target_deprecated.clone(),
        ),
        aux_layers: a.aux_layers.clone(),
        aux_convention: a.aux_convention.map(|c| match c {
            Convention::OutputOfLayer => AuxConvention::OutputOfLayer,
            Convention::InputOfLayer => AuxConvention::InputOfLayer,
        }),
        model_type: a.model_type.clone(),
        steps: a.steps,
        output: a.out.output.clone(),
        known_targets: crate::target::profile::builtin_or_empty(),
        force: a.out.force,
    };
    let c = Conversion::prepare(&req)?;
    let plan = &c.plan;
    if a.dry_run {
        if a.json {
            let mut doc = convert::plan_json(plan);
            doc["schema"] = json!("kquant.convert-plan/1");
            doc["config"] = plan.config.clone();
            print_json(&doc);
        } else {
            print_plan(plan);
        }
        print_warnings(plan);
        return Ok(ExitCode::SUCCESS);
    }
    print_warnings(plan);
    let opts = a.out.write_options(c.inputs());
    let pb = crate::progress::bytes(c.bytes(), "convert");
    let s = c.write(&a.out.output, opts, &pb)?;
    pb.finish_and_clear();
    if a.json {
        let mut doc = convert::plan_json(plan);
        doc["schema"] = json!("kquant.convert/1");
        doc["output"] = json!(s.dir);
        doc["files"] = json!(s.files);
        print_json(&doc);
    }
    eprintln!(
        "converted {} draft ({} tensors, {}) for {} into {}",
        c.det.family.id(),
        plan.tensors.len(),
        human_bytes(s.tensor_bytes),
        a.to.id(),
        s.dir.display()
    );
    if let Some(l) = &plan.launch {
        eprintln!("launch with:\n  {}", printable(l));
    }
    Ok(ExitCode::SUCCESS)
}

/// The plan's warnings on stderr.
fn print_warnings(plan: &Plan) {
    for w in &plan.warnings {
        eprintln!("warning: {}", printable(w));
    }
}

/// The `--dry-run` listing: each tensor and where it comes from, the dropped ones, the aux
/// layers as written, the config.
fn print_plan(plan: &Plan) {
    for t in &plan.tensors {
        // Names come from the files: escaped for the terminal (crate::escape; `{:?}` escapes by
        // itself).
        println!(
            "{:<52} {:<6} {:?}  <- {:?}",
            printable(&t.name),
            t.dtype.name(),
            t.shape,
            t.source
        );
    }
    for (n, why) in &plan.dropped {
        println!("{:<52} dropped: {}", printable(n), printable(why));
    }
    if let Some(x) = &plan.aux {
        println!(
            "aux layers: hidden_states {:?} written as {:?} ({}) in {}",
            x.hidden_states,
            x.written,
            x.convention.id(),
            printable(&x.keys.join(", "))
        );
    }
    println!(
        "config.json:\n{}",
        json_printable(&serde_json::to_string_pretty(&plan.config).expect("JSON"))
    );
}
