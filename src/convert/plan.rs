//! What `convert` will write, as data: the request's [`Options`], each output tensor
//! ([`Planned`]) and where its bytes come from ([`Source`]), the taps written ([`AuxOut`]), the
//! target served beside ([`DraftsTarget`]) and TensorRT-LLM's options ([`TrtllmYaml`]), all in
//! one [`Plan`]. `names` fills it per family; `mod.rs` places and writes it.

use serde_json::Value;

use super::layout::DraftLayout;
use crate::checkpoint::{AuxConvention, Dialect};
use crate::io::Dtype;

/// What `convert` was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// `eagle3` (Llama or MLA) or `dflash`.
    pub dflash: bool,
    pub engine: DraftLayout,
    /// Override of the detected source dialect.
    pub from: Option<Dialect>,
    /// Aux-layer ids given on the command line (with `aux_convention`).
    pub aux_layers: Option<Vec<i64>>,
    /// The convention of the source ids (required when the files cannot say).
    pub aux_convention: Option<AuxConvention>,
    /// `model_type` for MLA drafts (default per engine).
    pub model_type: Option<String>,
    /// `--steps`: EAGLE-3 draft depths per round (default 3); DFlash tokens proposed per step
    /// (default and at most the draft's `block_size` − 1).
    pub steps: Option<usize>,
}

/// Where one output tensor's bytes come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A source tensor, copied byte for byte.
    Copy(String),
    /// The source `d2t` cast to another integer type (values unchanged).
    CastInt(String),
    /// `t2d` derived from the source `d2t`: `t2d[arange(Vd) + d2t] = true`, length `vocab`.
    T2dFromD2t { d2t: String, vocab: usize },
    /// A tensor of the target checkpoint, copied.
    Target(String),
    /// Rows of a target tensor (`lm_head` pruned to the draft vocab by `d2t`).
    TargetRows { name: String, d2t: String },
}

/// One tensor of the output.
#[derive(Debug, Clone)]
pub struct Planned {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub source: Source,
}

/// Aux-layer taps as written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuxOut {
    pub hidden_states: Vec<i64>,
    pub written: Vec<i64>,
    pub convention: AuxConvention,
    pub keys: Vec<String>,
}

/// Everything `convert` will write.
#[derive(Debug, Clone)]
pub struct Plan {
    pub tensors: Vec<Planned>,
    /// (source tensor, why it is not written).
    pub dropped: Vec<(String, String)>,
    pub config: Value,
    pub side_files: Vec<(String, Vec<u8>)>,
    pub aux: Option<AuxOut>,
    pub warnings: Vec<String>,
    /// Draft depths per round (EAGLE-3) or tokens proposed per step (DFlash), for the launch
    /// line and TensorRT-LLM's `max_draft_len`.
    pub steps: usize,
    /// TensorRT-LLM's options file, written by [`place`](super::place) once the output's path is known.
    pub trtllm: Option<TrtllmYaml>,
    /// Set by [`place`](super::place).
    pub launch: Option<String>,
    /// SGLang's `--context-length` for the launch line: the draft's context, when it is below
    /// the target's (SGLang refuses the pair otherwise; [`sglang_context_length`](super::sglang_context_length)).
    pub context_length: Option<u64>,
    /// The target the draft serves beside, when known, and what the engine's source says
    /// about serving the draft's family on it (set by [`serving_target`](super::serving_target)).
    pub target: Option<DraftsTarget>,
    /// A DSpark or DFlash2 draft: the layout written and its block (the launch line's method
    /// and sizes; `super::block`).
    pub block: Option<BlockOut>,
}

/// What a DSpark or DFlash2 draft is written as, for the launch line (`super::place`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockOut {
    pub layout: crate::checkpoint::block::Layout,
    /// The block size in the written config.
    pub block_size: u64,
}

/// The target a draft serves beside, and whether the engine written for runs the pair.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DraftsTarget {
    /// `architectures[0]` of the target.
    pub architecture: String,
    /// How it is known: `--target-checkpoint`, or the built-in profile the draft's shape
    /// matches.
    pub known_from: String,
    /// The engine's verdict where its source says something stands in the way.
    pub serving: Option<crate::engines::target::OnTarget>,
}

/// What goes into `extra-llm-api-config.yml` besides the draft's path and `max_draft_len`.
#[derive(Debug, Clone)]
pub struct TrtllmYaml {
    pub dflash: bool,
    /// EAGLE-3 `eagle3_layers_to_capture` (outputs of layer k).
    pub capture_output_of: Option<Vec<i64>>,
}
