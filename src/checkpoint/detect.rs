//! Family and dialect detection from `config.json` plus tensor names (the layouts are described
//! in docs/formats.md). Config and tensors are read as two independent pieces
//! of evidence; when both speak and disagree, detection fails and says what disagrees.

use std::collections::BTreeSet;

use serde::Serialize;

use super::block::{self, Layout};
use super::quant_state::{self, QuantState};
use super::Checkpoint;
use crate::error::{Error, Result};

/// Which kind of model this is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Family {
    /// EAGLE-3 draft with Llama-style (GQA) attention.
    Eagle3,
    /// EAGLE-3 draft with DeepSeek MLA attention (Kimi drafts).
    Eagle3Mla,
    /// DFlash block drafter.
    Dflash,
    /// DSpark: a DFlash-style block drafter with a Markov head (and a confidence head).
    Dspark,
    /// DFlash2: DFlash with grouped convolutions and a candidate (path) selector.
    Dflash2,
    /// A target model.
    Target,
    /// Not recognised.
    Unknown,
}

impl Family {
    /// Every draft family.
    pub const DRAFTS: [Family; 5] = [
        Family::Eagle3,
        Family::Eagle3Mla,
        Family::Dflash,
        Family::Dspark,
        Family::Dflash2,
    ];

    /// A draft (not a target, not unknown).
    pub fn is_draft(&self) -> bool {
        Family::DRAFTS.contains(self)
    }

    /// DSpark's or DFlash2's [`block::Kind`] (none for the other families).
    pub fn block_kind(&self) -> Option<block::Kind> {
        match self {
            Family::Dspark => Some(block::Kind::Dspark),
            Family::Dflash2 => Some(block::Kind::Dflash2),
            _ => None,
        }
    }

    /// DSpark or DFlash2: the 2026 block drafters that `inspect` describes
    /// ([`super::block`]); `convert` does not take them yet, `quantize` only their GQA layouts.
    pub fn is_block_2026(&self) -> bool {
        matches!(self, Family::Dspark | Family::Dflash2)
    }

    pub fn id(&self) -> &'static str {
        match self {
            Family::Eagle3 => "eagle3",
            Family::Eagle3Mla => "eagle3-mla",
            Family::Dflash => "dflash",
            Family::Dspark => "dspark",
            Family::Dflash2 => "dflash2",
            Family::Target => "target",
            Family::Unknown => "unknown",
        }
    }
}

impl From<block::Kind> for Family {
    fn from(k: block::Kind) -> Family {
        match k {
            block::Kind::Dspark => Family::Dspark,
            block::Kind::Dflash2 => Family::Dflash2,
        }
    }
}

/// The dialect a DSpark or DFlash2 layout is reported in.
fn block_dialect(l: Layout) -> Dialect {
    match l {
        Layout::Qwen3Dspark | Layout::SpeculatorsDspark => Dialect::Vllm,
        Layout::K3Dspark | Layout::Dflash2Mla => Dialect::Torchspec,
        Layout::SpecforgeDspark => Dialect::Specforge,
        Layout::Dflash2 => Dialect::Zlab,
    }
}

/// Which target architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TargetKind {
    DeepseekV3,
    KimiK2,
    /// Kimi-K2.5/K2.6 multimodal wrapper (`language_model.` prefix, `text_config`).
    KimiK25,
    KimiLinear,
    /// Kimi-K3 (`KimiK3ForConditionalGeneration`): KDA and gated NoPE MLA, LatentMoE, Block
    /// Attention Residuals (`*_res_proj`), under `language_model.`.
    KimiK3,
}

impl TargetKind {
    pub fn id(self) -> &'static str {
        match self {
            TargetKind::DeepseekV3 => "deepseek-v3",
            TargetKind::KimiK2 => "kimi-k2",
            TargetKind::KimiK25 => "kimi-k2.5",
            TargetKind::KimiLinear => "kimi-linear",
            TargetKind::KimiK3 => "kimi-k3",
        }
    }
}

/// The on-disk layout convention (who wrote it / who reads it natively).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Dialect {
    /// SpecForge / SGLang native: `midlayer.*` (also old ModelOpt exports).
    Specforge,
    /// vLLM native / speculators / new ModelOpt export: `layers.0.*`.
    Vllm,
    /// EAGLE reference release: `LlamaForCausalLM` + `draft_vocab_size`, `midlayer.*`.
    Eagle,
    /// TorchSpec exports (`_torchspec_version`; DFlash with `context_proj`).
    Torchspec,
    /// z-lab DFlash (also SpecForge, SGLang, vLLM DFlash): `layers.*`, `fc`, `hidden_norm`.
    Zlab,
    /// Hugging Face transformers layout of a target (`model.layers.*`).
    Hf,
}

impl Dialect {
    pub const ALL: [Dialect; 6] = [
        Dialect::Specforge,
        Dialect::Vllm,
        Dialect::Eagle,
        Dialect::Torchspec,
        Dialect::Zlab,
        Dialect::Hf,
    ];
    pub fn id(self) -> &'static str {
        match self {
            Dialect::Specforge => "specforge",
            Dialect::Vllm => "vllm",
            Dialect::Eagle => "eagle",
            Dialect::Torchspec => "torchspec",
            Dialect::Zlab => "zlab",
            Dialect::Hf => "hf",
        }
    }
}

/// How aux-layer ids are numbered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuxConvention {
    /// id k = output of decoder layer k (0-based) = HF `hidden_states[k+1]`.
    OutputOfLayer,
    /// id k = input of decoder layer k = HF `hidden_states[k]`.
    InputOfLayer,
}

impl AuxConvention {
    pub fn id(self) -> &'static str {
        match self {
            AuxConvention::OutputOfLayer => "output-of-layer",
            AuxConvention::InputOfLayer => "input-of-layer",
        }
    }
    /// HF `hidden_states` index of id `k`.
    pub fn to_hidden_state(self, k: i64) -> i64 {
        match self {
            AuxConvention::OutputOfLayer => k + 1,
            AuxConvention::InputOfLayer => k,
        }
    }
}

/// Aux-layer (tap) ids as found, with their convention when it can be known from the files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuxLayers {
    /// The ids as written in the config.
    pub ids: Vec<i64>,
    /// Config key they were read from.
    pub key: String,
    pub convention: Option<AuxConvention>,
    /// Why the convention is what it is (or why it cannot be known).
    pub reason: String,
    /// The same taps as HF `hidden_states[i]` indices, when the convention is known.
    pub hidden_states: Option<Vec<i64>>,
}

/// Model dimensions (from config, with tensor shapes as fallback).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Dims {
    pub hidden_size: Option<u64>,
    pub target_hidden_size: Option<u64>,
    pub num_hidden_layers: Option<u64>,
    pub num_attention_heads: Option<u64>,
    pub num_key_value_heads: Option<u64>,
    pub head_dim: Option<u64>,
    pub q_lora_rank: Option<u64>,
    pub kv_lora_rank: Option<u64>,
    pub qk_nope_head_dim: Option<u64>,
    pub qk_rope_head_dim: Option<u64>,
    pub v_head_dim: Option<u64>,
    pub intermediate_size: Option<u64>,
    pub vocab_size: Option<u64>,
    pub draft_vocab_size: Option<u64>,
    pub block_size: Option<u64>,
    pub n_routed_experts: Option<u64>,
    pub has_d2t: bool,
    pub has_t2d: bool,
    pub has_embed_tokens: bool,
    pub has_lm_head: bool,
}

/// The largest dimension (a width, a head count, a vocabulary, a layer count) a runtime takes
/// from a config: far above every real model (Kimi's vocabulary is 163840), and small enough
/// that no product of three of them wraps a `usize` (#38.11).
pub const MAX_DIM: u64 = 1 << 20;
/// The largest row width (heads × head dim, …) a runtime builds: it fits a kernel's `int`.
pub const MAX_WIDTH: u64 = (1 << 31) - 1;

/// `Err` naming the first of `dims` above [`MAX_DIM`], or the first product of `widths` above
/// [`MAX_WIDTH`] (computed checked): what a runtime checks before it computes a size from a
/// config, so a hostile value is an `error:`, never a wrapped product or a huge allocation.
pub fn check_dims(dims: &[(&str, u64)], widths: &[(&str, &[u64])]) -> Result<(), String> {
    if let Some((k, v)) = dims.iter().find(|(_, v)| *v > MAX_DIM) {
        return Err(format!(
            "`{k}` is {v}; kquant runs dimensions up to {MAX_DIM} (2^20)"
        ));
    }
    for (what, f) in widths {
        let p = f.iter().try_fold(1u64, |a, &b| a.checked_mul(b));
        if p.is_none_or(|p| p > MAX_WIDTH) {
            return Err(format!(
                "{what} = {} is more than {MAX_WIDTH} values a row",
                f.iter().map(u64::to_string).collect::<Vec<_>>().join(" × ")
            ));
        }
    }
    Ok(())
}

impl Dims {
    /// [`check_dims`] over every dimension this holds and the row widths a draft runtime
    /// computes from them (attention heads × head dims, MLA's, `fc`'s 3 × target hidden).
    pub fn check_bounded(&self) -> Result<(), String> {
        let named = [
            ("hidden_size", self.hidden_size),
            ("target_hidden_size", self.target_hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("q_lora_rank", self.q_lora_rank),
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_nope_head_dim", self.qk_nope_head_dim),
            ("qk_rope_head_dim", self.qk_rope_head_dim),
            ("v_head_dim", self.v_head_dim),
            ("intermediate_size", self.intermediate_size),
            ("vocab_size", self.vocab_size),
            ("draft_vocab_size", self.draft_vocab_size),
            ("block_size", self.block_size),
            ("n_routed_experts", self.n_routed_experts),
        ];
        let dims: Vec<(&str, u64)> = named
            .iter()
            .filter_map(|(k, v)| v.map(|v| (*k, v)))
            .collect();
        check_dims(&dims, &[])?;
        let g = |v: Option<u64>| v.unwrap_or(1);
        let heads = g(self.num_attention_heads);
        let qk = g(self.qk_nope_head_dim) + g(self.qk_rope_head_dim);
        let nv = g(self.qk_nope_head_dim) + g(self.v_head_dim);
        check_dims(
            &[],
            &[
                ("num_attention_heads × head_dim", &[heads, g(self.head_dim)]),
                (
                    "num_key_value_heads × head_dim",
                    &[g(self.num_key_value_heads), g(self.head_dim)],
                ),
                ("num_attention_heads × (qk_nope + qk_rope)", &[heads, qk]),
                ("num_attention_heads × (qk_nope + v_head_dim)", &[heads, nv]),
                (
                    "3 × target_hidden_size",
                    &[3, g(self.target_hidden_size.or(self.hidden_size))],
                ),
                ("2 × hidden_size", &[2, g(self.hidden_size)]),
            ],
        )
    }
}

/// Everything detection finds.
#[derive(Debug, Clone, Serialize)]
pub struct Detection {
    pub family: Family,
    pub target_kind: Option<TargetKind>,
    /// Why the family is what it is (or why it is unknown).
    pub reason: String,
    pub dialect: Option<Dialect>,
    /// Layer prefix of a draft (`midlayer.` or `layers.0.`).
    pub layer_prefix: Option<String>,
    pub dims: Dims,
    pub aux_layers: Option<AuxLayers>,
    pub quantization: QuantState,
    pub notes: Vec<String>,
    /// What a DSpark or DFlash2 draft's config and tensors say (`None` for other families).
    pub block_draft: Option<super::block::BlockDraft>,
}

struct Names<'a> {
    all: BTreeSet<&'a str>,
}

impl<'a> Names<'a> {
    fn any_prefix(&self, p: &str) -> bool {
        self.all.range(p..).next().is_some_and(|n| n.starts_with(p))
    }
    fn count_prefix(&self, p: &str) -> usize {
        self.all.range(p..).take_while(|n| n.starts_with(p)).count()
    }
    fn has(&self, n: &str) -> bool {
        self.all.contains(n)
    }
}

/// Family suggested by one piece of evidence, with what suggested it.
type Evidence = Option<(Family, Option<TargetKind>, String)>;

fn from_config(c: &super::Config) -> Evidence {
    let archs = c.architectures();
    let arch = archs.first().map(String::as_str).unwrap_or("");
    let mt = c.model_type().unwrap_or("");
    let says = |f: Family, t: Option<TargetKind>, why: String| Some((f, t, why));
    let mla = c.get("kv_lora_rank").is_some_and(|v| !v.is_null());
    let spec_type = c
        .root
        .get("speculators_model_type")
        .and_then(|v| v.as_str());
    if let Some((k, why)) = block::family_from_config(c) {
        return says(k.into(), None, why);
    }
    if arch == "DFlashDraftModel"
        || c.root.contains_key("dflash_config")
        || mt == "dflash"
        || spec_type == Some("dflash")
    {
        return says(
            Family::Dflash,
            None,
            format!("config: architectures {archs:?}, model_type `{mt}`"),
        );
    }
    let eagle_arch = arch.to_ascii_lowercase().contains("eagle")
        || c.root
            .get("speculators_model_type")
            .and_then(|v| v.as_str())
            == Some("eagle3");
    if eagle_arch {
        let f = if mla || arch.contains("Deepseek") || arch.contains("DeepSeek") {
            Family::Eagle3Mla
        } else {
            Family::Eagle3
        };
        return says(
            f,
            None,
            format!(
                "config: architectures {archs:?}{}",
                if mla { " with kv_lora_rank" } else { "" }
            ),
        );
    }
    if arch == "LlamaForCausalLM" && c.root.contains_key("draft_vocab_size") {
        return says(
            Family::Eagle3,
            None,
            "config: LlamaForCausalLM with draft_vocab_size (EAGLE reference)".into(),
        );
    }
    let target = match (arch, mt) {
        ("KimiK3ForConditionalGeneration", _) | (_, "kimi_k3") => Some(TargetKind::KimiK3),
        ("KimiK25ForConditionalGeneration", _) | (_, "kimi_k25") => Some(TargetKind::KimiK25),
        ("KimiLinearForCausalLM", _) | (_, "kimi_linear") => Some(TargetKind::KimiLinear),
        ("DeepseekV3ForCausalLM" | "DeepseekV2ForCausalLM", "kimi_k2") => Some(TargetKind::KimiK2),
        ("DeepseekV3ForCausalLM" | "DeepseekV2ForCausalLM", _) => Some(TargetKind::DeepseekV3),
        _ => None,
    };
    target.and_then(|t| {
        says(
            Family::Target,
            Some(t),
            format!("config: architectures {archs:?}, model_type `{mt}`"),
        )
    })
}

fn from_tensors(n: &Names) -> Evidence {
    let says =
        |f: Family, t: Option<TargetKind>, why: &str| Some((f, t, format!("tensors: {why}")));
    if let Some((k, why)) = block::family_from_tensors(n.all.iter().copied()) {
        return Some((k.into(), None, why));
    }
    if n.any_prefix("context_proj.") && n.any_prefix("layers.") {
        return says(
            Family::Dflash,
            None,
            "`context_proj` + `layers.*` (TorchSpec DFlash names)",
        );
    }
    for p in ["midlayer.", "layers.0."] {
        if n.any_prefix(&format!("{p}self_attn.kv_a_proj_with_mqa.")) && n.any_prefix("fc.") {
            return says(
                Family::Eagle3Mla,
                None,
                &format!("`fc` + `{p}self_attn.kv_a_proj_with_mqa` (MLA)"),
            );
        }
    }
    if n.any_prefix("fc.")
        && n.any_prefix("hidden_norm.")
        && n.any_prefix("layers.")
        && has_qk_norm(n)
    {
        return says(
            Family::Dflash,
            None,
            "`fc` + top-level `hidden_norm` + `layers.*.self_attn.q_norm` (DFlash)",
        );
    }
    for p in ["midlayer.", "layers.0."] {
        if n.any_prefix("fc.") && n.any_prefix(&format!("{p}self_attn.q_proj.")) {
            return says(
                Family::Eagle3,
                None,
                &format!("`fc` + `{p}self_attn.q_proj` (EAGLE-3, GQA)"),
            );
        }
    }
    if (n.any_prefix("language_model.layers.0.") || n.any_prefix("language_model.model.layers.0."))
        && n.all
            .iter()
            .any(|x| x.ends_with(".self_attention_res_proj.weight"))
    {
        return says(
            Family::Target,
            Some(TargetKind::KimiK3),
            "`language_model.*layers.*.self_attention_res_proj` (Kimi-K3 attention residuals)",
        );
    }
    if n.any_prefix("language_model.model.layers.") {
        return says(
            Family::Target,
            Some(TargetKind::KimiK25),
            "`language_model.model.layers.*` (Kimi-K2.5 wrapper)",
        );
    }
    if n.any_prefix("model.layers.") && n.any_prefix("model.embed_tokens.") {
        let t = if n.any_prefix("model.layers.0.self_attn.kv_a_proj_with_mqa.")
            || n.any_prefix("model.layers.1.self_attn.kv_a_proj_with_mqa.")
        {
            Some(TargetKind::DeepseekV3)
        } else {
            None
        };
        return says(Family::Target, t, "`model.embed_tokens` + `model.layers.*`");
    }
    None
}

fn has_qk_norm(n: &Names) -> bool {
    n.all
        .iter()
        .any(|x| x.starts_with("layers.") && x.contains(".self_attn.q_norm."))
}

impl Checkpoint {
    /// Run detection (ambiguous evidence is an error).
    pub fn detect(&self) -> Result<Detection> {
        detect(self)
    }
}

/// Run detection on an opened checkpoint.
pub fn detect(ck: &Checkpoint) -> Result<Detection> {
    let names = Names {
        all: ck.weights.names().collect(),
    };
    let path = ck
        .weights
        .config_path
        .clone()
        .unwrap_or_else(|| ck.weights.dir.clone());
    let derr = |msg: String| Error::Detect {
        path: path.clone(),
        msg,
    };
    let mut notes = Vec::new();

    let cfg_ev = ck.config.as_ref().and_then(from_config);
    let ten_ev = from_tensors(&names);
    let (family, target_kind, reason) = match (cfg_ev, ten_ev) {
        (Some(c), Some(t)) => {
            if c.0 != t.0 {
                return Err(derr(format!(
                    "ambiguous family: {} suggests {}, but {} suggests {}",
                    c.2,
                    c.0.id(),
                    t.2,
                    t.0.id()
                )));
            }
            let kind = c.1.or(t.1);
            (c.0, kind, format!("{}; {}", c.2, t.2))
        }
        (Some(c), None) => {
            notes.push(format!("tensor names do not confirm the family: {}", c.2));
            (c.0, c.1, c.2)
        }
        (None, Some(t)) => {
            if ck.config.is_some() {
                notes.push("config.json does not name a known architecture; family taken from tensor names".into());
            }
            t
        }
        (None, None) => {
            let why = match &ck.config {
                None => "no config.json, and the tensor names match no known draft or target layout".to_string(),
                Some(c) => format!(
                    "architectures {:?} (model_type {:?}) and the tensor names match no known draft or target layout",
                    c.architectures(),
                    c.model_type().unwrap_or("")
                ),
            };
            (Family::Unknown, None, why)
        }
    };

    let mid = names.any_prefix("midlayer.");
    let l0 = names.any_prefix("layers.0.");
    let layer_prefix = match family {
        Family::Eagle3 | Family::Eagle3Mla => match (mid, l0) {
            (true, true) => {
                return Err(derr(format!(
                    "ambiguous layer prefix: {} tensors under `midlayer.` and {} under `layers.0.`",
                    names.count_prefix("midlayer."),
                    names.count_prefix("layers.0.")
                )))
            }
            (true, false) => Some("midlayer.".to_string()),
            (false, true) => Some("layers.0.".to_string()),
            (false, false) => None,
        },
        _ => None,
    };

    let torchspec = ck
        .config
        .as_ref()
        .is_some_and(|c| c.root.contains_key("_torchspec_version"))
        || ck.weights.shards.iter().any(|s| {
            s.header()
                .metadata
                .as_ref()
                .is_some_and(|m| m.contains_key("torchspec_version"))
        });
    let layout = family
        .block_kind()
        .map(|k| (k, block::layout(k, ck.config.as_ref(), &ck.weights)));
    let dialect = match family {
        Family::Dspark | Family::Dflash2 => layout.map(|(_, l)| block_dialect(l)),
        Family::Eagle3 | Family::Eagle3Mla => {
            let c = ck.config.as_ref();
            let eagle_ref = c.is_some_and(|c| {
                c.architectures().first().map(String::as_str) == Some("LlamaForCausalLM")
            });
            if torchspec {
                Some(Dialect::Torchspec)
            } else if eagle_ref && mid {
                Some(Dialect::Eagle)
            } else if mid {
                Some(Dialect::Specforge)
            } else if l0 {
                Some(Dialect::Vllm)
            } else {
                None
            }
        }
        Family::Dflash => Some(if names.any_prefix("context_proj.") {
            Dialect::Torchspec
        } else {
            Dialect::Zlab
        }),
        Family::Target => Some(Dialect::Hf),
        Family::Unknown => None,
    };

    let draft = family.is_draft();
    let dims = dims(ck, &names, layer_prefix.as_deref(), draft)?;
    let aux_layers = match ck.config.as_ref() {
        Some(c) => aux_layers(c, &family, dialect, l0).map_err(|m| match m {
            Error::Config { msg, .. } => derr(msg),
            e => e,
        })?,
        None => None,
    };
    let quantization = quant_state::detect(ck);
    if let (Some(h), Some(fc)) = (dims.hidden_size, ck.weights.info("fc.weight")) {
        if fc.shape.first().copied() != Some(h as usize) {
            notes.push(format!(
                "`fc.weight` has {} rows but hidden_size is {h}",
                fc.shape.first().unwrap_or(&0)
            ));
        }
    }
    let block_draft = layout.map(|(k, l)| describe_block(ck, k, l, &dims, aux_layers.as_ref()));
    Ok(Detection {
        block_draft,
        family,
        target_kind,
        reason,
        dialect,
        layer_prefix,
        dims,
        aux_layers,
        quantization,
        notes,
    })
}

/// [`block::describe`] a DSpark or DFlash2 draft from what detection found.
fn describe_block(
    ck: &Checkpoint,
    kind: block::Kind,
    l: Layout,
    dims: &Dims,
    aux_layers: Option<&AuxLayers>,
) -> block::BlockDraft {
    let sizes = block::Sizes {
        hidden_size: dims.hidden_size,
        vocab_size: dims.vocab_size,
        draft_vocab_size: dims.draft_vocab_size,
        d2t: dims.has_d2t,
        lm_head: dims.has_lm_head,
        embed_tokens: dims.has_embed_tokens,
    };
    let taps = aux_layers.map(|a| block::TapIds {
        ids: &a.ids,
        input_of_layer: a.convention.map(|c| c == AuxConvention::InputOfLayer),
    });
    block::describe(kind, l, ck.config.as_ref(), &ck.weights, &sizes, taps)
}

fn dims(ck: &Checkpoint, n: &Names, prefix: Option<&str>, draft: bool) -> Result<Dims> {
    let w = &ck.weights;
    let rows = |name: &str| {
        w.info(name)
            .and_then(|t| t.shape.first())
            .map(|&d| d as u64)
    };
    let mut d = Dims {
        has_d2t: n.has("d2t"),
        has_t2d: n.has("t2d"),
        has_embed_tokens: n.any_prefix("embed_tokens.")
            || n.any_prefix("model.embed_tokens.")
            || n.any_prefix("language_model.model.embed_tokens."),
        has_lm_head: n.any_prefix("lm_head.") || n.any_prefix("language_model.lm_head."),
        ..Dims::default()
    };
    if let Some(c) = &ck.config {
        d.hidden_size = c.uint("hidden_size")?;
        d.target_hidden_size = c.uint("target_hidden_size")?;
        d.num_hidden_layers = c.uint("num_hidden_layers")?;
        d.num_attention_heads = c.uint("num_attention_heads")?;
        d.num_key_value_heads = c.uint("num_key_value_heads")?;
        d.head_dim = c.uint("head_dim")?;
        d.q_lora_rank = c.uint("q_lora_rank")?;
        d.kv_lora_rank = c.uint("kv_lora_rank")?;
        d.qk_nope_head_dim = c.uint("qk_nope_head_dim")?;
        d.qk_rope_head_dim = c.uint("qk_rope_head_dim")?;
        d.v_head_dim = c.uint("v_head_dim")?;
        d.intermediate_size = c.uint("intermediate_size")?;
        d.vocab_size = c.uint("vocab_size")?;
        d.draft_vocab_size = c.uint("draft_vocab_size")?;
        // DFlash: `dflash_config.block_size` first, as SGLang reads it; z-lab's drafts write
        // the top-level key.
        d.block_size = match c.nested("dflash_config", "block_size") {
            Some(v) if !v.is_null() => Some(v.as_u64().ok_or_else(|| Error::Config {
                path: c.path.clone(),
                msg: format!(
                    "`dflash_config.block_size` must be a non-negative integer, found {v}"
                ),
            })?),
            _ => c.uint("block_size")?,
        };
        d.n_routed_experts = c.uint("n_routed_experts")?;
    }
    let norm = prefix
        .map(|p| format!("{p}hidden_norm.weight"))
        .unwrap_or_else(|| "norm.weight".into());
    d.hidden_size = d
        .hidden_size
        .or_else(|| rows(&norm))
        .or_else(|| rows("norm.weight"));
    if d.head_dim.is_none() && d.kv_lora_rank.is_none() {
        if let (Some(h), Some(nh)) = (d.hidden_size, d.num_attention_heads.filter(|&x| x > 0)) {
            d.head_dim = Some(h / nh);
        }
    }
    d.vocab_size = d
        .vocab_size
        .or_else(|| rows("t2d"))
        .or_else(|| rows("embed_tokens.weight"));
    if draft {
        d.draft_vocab_size = d
            .draft_vocab_size
            .or_else(|| rows("d2t"))
            .or_else(|| rows("lm_head.weight"));
    }
    Ok(d)
}

fn aux_layers(
    c: &super::Config,
    family: &Family,
    dialect: Option<Dialect>,
    l0: bool,
) -> Result<Option<AuxLayers>> {
    let derr = |msg: String| Error::Config {
        path: c.path.clone(),
        msg,
    };
    let make = |ids: Vec<i64>, key: &str, conv: Option<AuxConvention>, reason: &str| {
        let hidden_states = conv.map(|cv| ids.iter().map(|&k| cv.to_hidden_state(k)).collect());
        AuxLayers {
            ids,
            key: key.into(),
            convention: conv,
            reason: reason.into(),
            hidden_states,
        }
    };
    match family {
        Family::Dflash | Family::Dspark | Family::Dflash2 => {
            let dflash = *family == Family::Dflash;
            // speculators' DFlash config lists the taps as hidden_states indices.
            if let Some(hs) = c.int_list(None, "aux_hidden_state_layer_ids")? {
                return Ok(Some(make(
                    hs,
                    "aux_hidden_state_layer_ids",
                    Some(AuxConvention::InputOfLayer),
                    if dflash {
                        "speculators DFlash config: hidden_states indices (input of layer k)"
                    } else {
                        "speculators config: hidden_states indices (input of layer k); vLLM reads them raw and sets target_layer_ids = id − 1"
                    },
                )));
            }
            let nested = c.int_list(Some("dflash_config"), "target_layer_ids")?;
            let top = c.int_list(None, "target_layer_ids")?;
            let (ids, key) = match (nested, top) {
                (Some(a), Some(b)) if a != b => {
                    return Err(derr(format!("`dflash_config.target_layer_ids` {a:?} and top-level `target_layer_ids` {b:?} disagree")))
                }
                (Some(a), _) => (a, "dflash_config.target_layer_ids"),
                (None, Some(b)) => (b, "target_layer_ids"),
                (None, None) => match c.int_list(None, "dspark_target_layer_ids")? {
                    Some(ids) if !dflash => (ids, "dspark_target_layer_ids"),
                    _ => return Ok(None),
                },
            };
            Ok(Some(make(
                ids,
                key,
                Some(AuxConvention::OutputOfLayer),
                if dflash {
                    "DFlash target_layer_ids are outputs of layer k in every known implementation"
                } else {
                    "DSpark/DFlash2 target_layer_ids are outputs of 0-based layer k (vLLM adds +1 to them; SGLang captures after layer k)"
                },
            )))
        }
        Family::Eagle3 | Family::Eagle3Mla => {
            let nested = c.int_list(Some("eagle_config"), "eagle_aux_hidden_state_layer_ids")?;
            let top = c.int_list(None, "eagle_aux_hidden_state_layer_ids")?;
            let (ids, key) = match (nested, top) {
                (Some(a), Some(b)) if a != b => {
                    return Err(derr(format!(
                        "`eagle_config.eagle_aux_hidden_state_layer_ids` {a:?} and top-level `eagle_aux_hidden_state_layer_ids` {b:?} disagree"
                    )))
                }
                (Some(a), _) => (a, "eagle_config.eagle_aux_hidden_state_layer_ids"),
                (None, Some(b)) => (b, "eagle_aux_hidden_state_layer_ids"),
                (None, None) => match c.int_list(Some("kquant"), "aux_hidden_states")? {
                    // A layout that hard-codes its taps (EAGLE reference) written by kquant.
                    Some(hs) => {
                        return Ok(Some(make(
                            hs,
                            "kquant.aux_hidden_states",
                            Some(AuxConvention::InputOfLayer),
                            "recorded by kquant as HF hidden_states indices (the engine hard-codes its taps)",
                        )))
                    }
                    None => return Ok(None),
                },
            };
            // kquant's own outputs record the convention they were written in.
            let recorded = c
                .nested("kquant", "aux_layer_convention")
                .and_then(|v| v.as_str())
                .and_then(|v| match v {
                    "output-of-layer" => Some(AuxConvention::OutputOfLayer),
                    "input-of-layer" => Some(AuxConvention::InputOfLayer),
                    _ => None,
                });
            if let Some(conv) = recorded {
                return Ok(Some(make(
                    ids,
                    key,
                    Some(conv),
                    "recorded by kquant in config.json (`kquant.aux_layer_convention`)",
                )));
            }
            let kimi = c.model_type() == Some("kimi_k2");
            let modelopt_new = ["next_layer_regular", "parallel_draft_step"]
                .iter()
                .any(|k| c.nested("eagle_config", k).is_some());
            let speculators = c.root.contains_key("speculators_model_type");
            let (conv, why) = match dialect {
                Some(Dialect::Specforge) => (Some(AuxConvention::OutputOfLayer), "`midlayer.*` drafts (SpecForge, TorchSpec native, old ModelOpt) number taps as outputs of layer k"),
                Some(Dialect::Eagle) => (Some(AuxConvention::InputOfLayer), "the EAGLE reference captures inputs of layers"),
                Some(Dialect::Torchspec) if l0 && kimi => (Some(AuxConvention::InputOfLayer), "TorchSpec `--vllm` export adds +1 to kimi_k2 ids (input of layer k, vLLM's reading)"),
                Some(Dialect::Torchspec) => (Some(AuxConvention::OutputOfLayer), "TorchSpec numbers taps as outputs of layer k"),
                Some(Dialect::Vllm) if speculators => (Some(AuxConvention::InputOfLayer), "speculators config: vLLM reads the ids raw (input of layer k)"),
                Some(Dialect::Vllm) if modelopt_new => (Some(AuxConvention::OutputOfLayer), "new ModelOpt export (`eagle_config.next_layer_regular`): outputs of layer k"),
                _ => (None, "`layers.0.*` drafts come from exporters with either convention; the files do not say which (pass --aux-convention)"),
            };
            Ok(Some(make(ids, key, conv, why)))
        }
        _ => Ok(None),
    }
}

/// Whether an EAGLE-3 draft feeds the post-norm hidden state back to the next depth
/// (EAGLE-3.1). `norm_output` means that only in the `layers.0.*` family of configs (vLLM,
/// speculators, ModelOpt → TensorRT-LLM); in SpecForge/TorchSpec configs it means "logits
/// from norm(h)", which every draft does.
pub fn eagle3_feeds_post_norm(det: &Detection, cfg: &serde_json::Value) -> bool {
    let eagle31_semantics =
        det.dialect == Some(Dialect::Vllm) || cfg.get("speculators_model_type").is_some();
    eagle31_semantics
        && cfg
            .get("norm_output")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
}
