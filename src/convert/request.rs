//! `kquant convert` as one library call: the user's [`Request`] (the draft, the layout to
//! write, the source layout when detection cannot tell, a target to take embeddings from)
//! becomes a [`Conversion`]: the source opened and detected, `--from` checked against its
//! layer names, the target opened, the plan made and placed at the output's final path; then
//! its inputs for the manifest and the write. `cli::convert` parses the arguments and renders.

use std::path::{Path, PathBuf};

use super::{DraftLayout, Options, Plan};
use crate::checkpoint::{AuxConvention, Checkpoint, Detection};
use crate::error::{Error, Result};
use crate::io::writer::{WriteOptions, WriteSummary};

/// Draft families `convert` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// EAGLE-3, Llama-style or MLA (Kimi) attention (`eagle3-mla`, the family `inspect` prints,
    /// is the same).
    #[value(alias = "eagle3-mla")]
    Eagle3,
    /// DFlash block drafter.
    Dflash,
    /// DSpark block drafter (vLLM `Qwen3DSparkModel`, SpecForge/SGLang `DSparkDraftModel`,
    /// speculators `dspark`, Inferact `K3DSparkModel`).
    Dspark,
    /// DFlash2 block drafter (`DFlash2DraftModel`).
    Dflash2,
}

impl Kind {
    /// The 2026 block family this kind names (none for EAGLE-3 and DFlash).
    pub fn block(self) -> Option<crate::checkpoint::block::Kind> {
        match self {
            Kind::Dspark => Some(crate::checkpoint::block::Kind::Dspark),
            Kind::Dflash2 => Some(crate::checkpoint::block::Kind::Dflash2),
            _ => None,
        }
    }
}

/// What the user asked `convert` for.
#[derive(Debug, Clone)]
pub struct Request {
    pub kind: Kind,
    /// The source draft: directory, `.safetensors` file or hub id.
    pub src: String,
    /// The layout to write.
    pub to: DraftLayout,
    /// Where the source comes from (its aux-id convention; checked against its layer names).
    pub from: Option<DraftLayout>,
    /// The target checkpoint to take embed_tokens / lm_head from.
    pub target_checkpoint: Option<String>,
    /// Aux-layer ids to write instead of the source's, in `aux_convention`.
    pub aux_layers: Option<Vec<i64>>,
    pub aux_convention: Option<AuxConvention>,
    /// `model_type` for MLA drafts.
    pub model_type: Option<String>,
    /// Draft depths per round (EAGLE-3) or tokens proposed per step (DFlash).
    pub steps: Option<usize>,
    /// The output directory (launch lines name it by its absolute path).
    pub output: PathBuf,
    /// The targets the draft's shape is matched against when no `target_checkpoint` names
    /// one (the built-in profiles' shapes, `crate::target::profile::builtin_or_empty`).
    pub known_targets: Vec<crate::target::Profile>,
    /// Write a draft the engine does not load (its quantization; [`engine_refusal`]): with a
    /// warning and no launch line, instead of refusing.
    pub force: bool,
}

/// A planned conversion: the source, its detection, the target, the plan.
pub struct Conversion {
    pub ck: Checkpoint,
    pub det: Detection,
    pub target: Option<Checkpoint>,
    pub plan: Plan,
}

impl DraftLayout {
    /// The aux-id convention of drafts this engine (or trainer) writes.
    pub fn aux_convention(self) -> AuxConvention {
        match self {
            DraftLayout::Vllm | DraftLayout::Eagle | DraftLayout::Speculators => {
                AuxConvention::InputOfLayer
            }
            _ => AuxConvention::OutputOfLayer,
        }
    }
}

impl Conversion {
    /// Open, detect, check and plan (nothing is written).
    pub fn prepare(req: &Request) -> Result<Conversion> {
        let ck = Checkpoint::open(&req.src)?;
        let det = ck.detect()?;
        let dflash = req.kind == Kind::Dflash;
        if let (Some(k), Some(from)) = (req.kind.block(), req.from) {
            // Their layouts say their conventions; a `--from` could only contradict them.
            return Err(Error::Flags {
                msg: format!(
                    "--from {}: `convert {}` reads the source's layout from its config",
                    from.id(),
                    super::block::kind_id(k)
                ),
                hint: "leave --from out (`kquant inspect` names the layout detected); --aux-layers with --aux-convention names other taps".into(),
            });
        }
        let eagle3 = req.kind == Kind::Eagle3;
        if let (Some(from), Some(prefix), true) = (req.from, det.layer_prefix.as_deref(), eagle3) {
            check_from(from, prefix)?;
        }
        let o = Options {
            dflash,
            engine: req.to,
            from: None,
            aux_layers: req.aux_layers.clone(),
            aux_convention: req
                .aux_convention
                .or(req.from.map(DraftLayout::aux_convention)),
            model_type: req.model_type.clone(),
            steps: req.steps,
        };
        let target = req
            .target_checkpoint
            .as_deref()
            .map(Checkpoint::open)
            .transpose()?;
        let mut plan = match req.kind.block() {
            Some(k) => super::plan_block(&ck, &det, target.as_ref(), &o, k)?,
            None => super::plan(&ck, &det, target.as_ref(), &o)?,
        };
        super::serving_target(
            &mut plan,
            &ck,
            &det,
            target.as_ref(),
            &req.known_targets,
            req.to,
        );
        // Launch lines and TensorRT-LLM's options file name the output by its absolute path,
        // so that they work from any directory.
        super::place(&mut plan, req.to, dflash, &super::final_dir(&req.output));
        engine_refusal(&ck, &det, req, &mut plan)?;
        Ok(Conversion {
            ck,
            det,
            target,
            plan,
        })
    }

    /// The bytes of every tensor the plan writes.
    pub fn bytes(&self) -> u64 {
        self.plan
            .tensors
            .iter()
            .map(|t| t.shape.iter().product::<usize>() as u64 * t.dtype.size() as u64)
            .sum()
    }

    /// The inputs a manifest records: the source's weight files and config, and the target's
    /// weight files (read for its embedding / lm_head: protected from the output like the
    /// source).
    pub fn inputs(&self) -> Vec<PathBuf> {
        let w = &self.ck.weights;
        let mut inputs: Vec<PathBuf> = w.files().iter().map(|p| p.to_path_buf()).collect();
        inputs.extend(w.config_path.clone());
        if let Some(t) = &self.target {
            inputs.extend(t.weights.files().iter().map(|p| p.to_path_buf()));
        }
        inputs
    }

    /// Write the plan into `out` ([`super::write`]).
    pub fn write(
        &self,
        out: &Path,
        opts: WriteOptions,
        progress: &indicatif::ProgressBar,
    ) -> Result<WriteSummary> {
        super::write(
            &self.ck,
            self.target.as_ref(),
            &self.plan,
            out,
            opts,
            progress,
        )
    }
}

/// The engine check `inspect` makes, for the engine `req.to` is for: a quantized draft whose
/// scheme the engine refuses (`crate::engines::refuses_quantization`) is refused, naming what
/// the engine does load; with `force`, planned with a warning and without a launch line (the
/// files are the engine's layout, but the engine will not load them).
fn engine_refusal(ck: &Checkpoint, det: &Detection, req: &Request, plan: &mut Plan) -> Result<()> {
    let Some(engine) = req.to.serving() else {
        return Ok(());
    };
    let Some((format, scheme, claim)) = crate::engines::refuses_quantization(ck, det, engine)
    else {
        return Ok(());
    };
    let what = format!(
        "{} does not load this draft (--format {} --scheme {scheme}): {} [{}]",
        engine.name(),
        format.name(),
        claim.why,
        claim.basis()
    );
    if req.force {
        plan.warnings.push(format!(
            "{what}; written anyway (--force), with no launch line"
        ));
        plan.launch = None;
        return Ok(());
    }
    let instead = match crate::engines::loads_instead(engine, &det.family, scheme) {
        Some(f) => format!(
            "{} loads `{}` drafts quantized with {f}: quantize the unquantized draft that way",
            engine.name(),
            det.family.id()
        ),
        None => format!(
            "{} loads no quantized `{}` draft kquant writes: convert the unquantized draft",
            engine.name(),
            det.family.id()
        ),
    };
    Err(Error::Flags {
        msg: what,
        hint: format!(
            "{instead} (`kquant schemes`, `kquant inspect`); or pass --force to write this layout anyway (no launch line)"
        ),
    })
}

/// `--from` against the source's EAGLE-3 layer prefix: refused when that engine writes another
/// (TensorRT-LLM and TorchSpec take either), naming the engines that fit.
fn check_from(from: DraftLayout, prefix: &str) -> Result<()> {
    // Speculators is a DSpark layout here (`convert eagle3` does not write it).
    let fits_prefix = |e: &DraftLayout| {
        *e != DraftLayout::Speculators
            && (e.eagle3_prefix() == prefix
                || matches!(e, DraftLayout::Trtllm | DraftLayout::Torchspec))
    };
    if fits_prefix(&from) {
        return Ok(());
    }
    let fits: Vec<&str> = <DraftLayout as clap::ValueEnum>::value_variants()
        .iter()
        .filter(|e| **e != DraftLayout::Zlab && fits_prefix(e))
        .map(|e| e.id())
        .collect();
    Err(Error::Flags {
        msg: format!(
            "--from {} writes `{}*`, but the source's layer is `{prefix}*`",
            from.id(),
            from.eagle3_prefix()
        ),
        hint: format!(
            "a `{prefix}*` source takes --from {}; or leave --from out (detection reads the layer names)",
            fits.join(" | ")
        ),
    })
}
