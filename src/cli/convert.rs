//! `kquant convert {eagle3|dflash} SRC -o OUT --to ENGINE [--target-checkpoint TGT]`: move a
//! draft between engine layouts.

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;

use crate::checkpoint::{AuxConvention, Checkpoint};
use crate::cli::human_bytes;
use crate::cli::output_args::OutputArgs;
use crate::convert::{self, Engine, Options};
use crate::error::{Error, Result};
use crate::escape::{json_printable, printable};

/// Draft families `convert` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// EAGLE-3, Llama-style or MLA (Kimi) attention (`eagle3-mla`, the family `inspect` prints,
    /// is the same).
    #[value(alias = "eagle3-mla")]
    Eagle3,
    /// DFlash block drafter.
    Dflash,
}

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
    /// Draft family of the source: `eagle3` (Llama-style or MLA) or `dflash`.
    pub kind: Kind,
    /// Source draft: directory, `.safetensors` file or hub id.
    pub src: String,
    #[command(flatten)]
    pub out: OutputArgs,
    /// Engine (or trainer) layout to write.
    #[arg(long, value_enum)]
    pub to: Engine,
    /// Where the source comes from, when detection cannot tell (sets the aux-id convention and
    /// is checked against the tensor names).
    #[arg(long, value_enum)]
    pub from: Option<Engine>,
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
    /// EAGLE-3: draft depths per round (default 3). DFlash: tokens proposed per step, at most
    /// the draft's block_size − 1, which is the default (SGLang runs a block of steps + 1).
    #[arg(long, value_parser = crate::cli::flags::steps)]
    pub steps: Option<usize>,
    /// Print the plan (names, sources, dropped tensors, config, warnings) and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the plan / result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

fn convention_of(e: Engine) -> AuxConvention {
    match e {
        Engine::Vllm | Engine::Eagle => AuxConvention::InputOfLayer,
        _ => AuxConvention::OutputOfLayer,
    }
}

pub fn run(a: Args) -> Result<ExitCode> {
    let target_checkpoint = crate::cli::deprecated::resolve(
        "convert",
        "--target",
        "--target-checkpoint",
        a.target_checkpoint.clone(),
        a.target_deprecated.clone(),
    );
    let ck = Checkpoint::open(&a.src)?;
    let det = ck.detect()?;
    let dflash = a.kind == Kind::Dflash;
    if let (Some(from), Some(prefix)) = (a.from, det.layer_prefix.as_deref()) {
        if !dflash
            && from.eagle3_prefix() != prefix
            && !matches!(from, Engine::Trtllm | Engine::Torchspec)
        {
            let fits: Vec<&str> = <Engine as clap::ValueEnum>::value_variants()
                .iter()
                .filter(|e| {
                    **e != Engine::Zlab
                        && (e.eagle3_prefix() == prefix
                            || matches!(e, Engine::Trtllm | Engine::Torchspec))
                })
                .map(|e| e.id())
                .collect();
            return Err(Error::Flags {
                msg: format!(
                    "--from {} writes `{}*`, but the source's layer is `{prefix}*`",
                    from.id(),
                    from.eagle3_prefix()
                ),
                hint: format!(
                    "a `{prefix}*` source takes --from {}; or leave --from out (detection reads the layer names)",
                    fits.join(" | ")
                ),
            });
        }
    }
    let aux_convention = a.aux_convention.map(|c| match c {
        Convention::OutputOfLayer => AuxConvention::OutputOfLayer,
        Convention::InputOfLayer => AuxConvention::InputOfLayer,
    });
    let o = Options {
        dflash,
        engine: a.to,
        from: None,
        aux_layers: a.aux_layers.clone(),
        aux_convention: aux_convention.or(a.from.map(convention_of)),
        model_type: a.model_type.clone(),
        steps: a.steps,
    };
    let target = target_checkpoint
        .as_deref()
        .map(Checkpoint::open)
        .transpose()?;
    let mut plan = convert::plan(&ck, &det, target.as_ref(), &o)?;
    // Launch lines and TensorRT-LLM's options file name the output by its absolute path, so
    // that they work from any directory.
    convert::place(&mut plan, a.to, dflash, &convert::final_dir(&a.out.output));
    let bytes: u64 = plan
        .tensors
        .iter()
        .map(|t| t.shape.iter().product::<usize>() as u64 * t.dtype.size() as u64)
        .sum();
    if a.dry_run {
        if a.json {
            let mut doc = convert::plan_json(&plan);
            doc["schema"] = json!("kquant.convert-plan/1");
            doc["config"] = plan.config.clone();
            println!("{}", serde_json::to_string_pretty(&doc).expect("JSON"));
        } else {
            for t in &plan.tensors {
                // Names come from the files: escaped for the terminal (crate::escape; `{:?}`
                // escapes by itself).
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
        for w in &plan.warnings {
            eprintln!("warning: {}", printable(w));
        }
        return Ok(ExitCode::SUCCESS);
    }
    for w in &plan.warnings {
        eprintln!("warning: {}", printable(w));
    }
    let mut inputs: Vec<PathBuf> = ck.weights.files().iter().map(|p| p.to_path_buf()).collect();
    inputs.extend(ck.weights.config_path.clone());
    if let Some(t) = &target {
        // Read for its embedding / lm_head: recorded, and protected from -o like the source.
        inputs.extend(t.weights.files().iter().map(|p| p.to_path_buf()));
    }
    let opts = a.out.write_options(inputs);
    let pb = crate::progress::bytes(bytes, "convert");
    let s = convert::write(&ck, target.as_ref(), &plan, &a.out.output, opts, &pb)?;
    pb.finish_and_clear();
    if a.json {
        let mut doc = convert::plan_json(&plan);
        doc["schema"] = json!("kquant.convert/1");
        doc["output"] = json!(s.dir);
        doc["files"] = json!(s.files);
        println!("{}", serde_json::to_string_pretty(&doc).expect("JSON"));
    }
    eprintln!(
        "converted {} draft ({} tensors, {}) for {} into {}",
        det.family.id(),
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
