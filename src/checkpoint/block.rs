//! The 2026 block drafters, DSpark and DFlash2: which of their layouts a checkpoint is in, and
//! what its config and tensors say about the block, the anchor, the Markov and confidence heads
//! (DSpark), the convolutions and the path selector (DFlash2), the taps and the draft vocabulary
//! — with the findings that stop an engine from loading it, named in the engine's own terms.
//!
//! Sources (read, not run): vLLM 0.33.0 `vllm/model_executor/models/qwen3_dspark.py`,
//! `qwen3_dflash2.py`, `vllm/models/kimi_k3/nvidia/dspark_mla.py`,
//! `vllm/transformers_utils/configs/k3_dspark.py`, `.../configs/speculators/algos.py`,
//! `vllm/config/speculative.py`, `vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py`;
//! SGLang 0.5.23 `python/sglang/srt/models/dspark.py`, `.../models/dflash.py`,
//! `.../speculative/dspark_components/dspark_config.py`.

use serde::Serialize;
use serde_json::Value;

use super::Config;
use crate::io::source::Weights;

/// The architectures a DSpark draft's config names.
pub const DSPARK_ARCHITECTURES: &[&str] = &[
    "Qwen3DSparkModel",
    "Qwen3OmniDSparkModel",
    "K3DSparkModel",
    "DSparkDraftModel",
    "LingDSparkModel",
];
/// The architectures a DFlash2 draft's config names.
pub const DFLASH2_ARCHITECTURES: &[&str] = &["DFlash2DraftModel", "DFlash2BeamDraftModel"];

/// The largest block size taken: `checkpoint::detect::MAX_DIM`, the bound of every dimension a
/// runtime reads from a config (far above any trained block).
const MAX_BLOCK: u64 = 1 << 20;

/// Which published layout a DSpark or DFlash2 draft is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// vLLM's `Qwen3DSparkModel`: Qwen3 GQA, DSpark keys at the config root.
    Qwen3Dspark,
    /// Inferact's `K3DSparkModel` (`model_type: k3_dspark`): MLA with q-LoRA, TorchSpec names
    /// (`context_proj`, `context_norm`, `final_norm`), `num_target_layers` = number of taps.
    K3Dspark,
    /// SpecForge/SGLang `DSparkDraftModel` (`model_type: qwen3`): DSpark keys nested in
    /// `dflash_config`, `num_target_layers` = target depth.
    SpecforgeDspark,
    /// speculators format (`speculators_model_type: dspark`): raw `aux_hidden_state_layer_ids`,
    /// `sample_from_anchor` false by default.
    SpeculatorsDspark,
    /// `DFlash2DraftModel` with GQA attention (z-lab names).
    Dflash2,
    /// DFlash2 with `dflash_config.attention_mode: mla` (TorchSpec's Kimi-K3 template).
    Dflash2Mla,
}

impl Layout {
    pub fn id(self) -> &'static str {
        match self {
            Layout::Qwen3Dspark => "qwen3-dspark",
            Layout::K3Dspark => "k3-dspark",
            Layout::SpecforgeDspark => "specforge-dspark",
            Layout::SpeculatorsDspark => "speculators-dspark",
            Layout::Dflash2 => "dflash2",
            Layout::Dflash2Mla => "dflash2-mla",
        }
    }

    /// The layout in words.
    pub fn describe(self) -> &'static str {
        match self {
            Layout::Qwen3Dspark => "vLLM `Qwen3DSparkModel`: Qwen3 GQA, DSpark keys at the config root",
            Layout::K3Dspark => "Inferact `K3DSparkModel` (model_type `k3_dspark`): MLA-native (q-LoRA), `context_proj`/`context_norm`/`final_norm`, `num_target_layers` = number of taps",
            Layout::SpecforgeDspark => "SpecForge/SGLang `DSparkDraftModel` (model_type `qwen3`): Qwen3 GQA, DSpark keys in `dflash_config`, `num_target_layers` = target depth",
            Layout::SpeculatorsDspark => "speculators `dspark` (`speculators_model_type`): vLLM rewrites it to `Qwen3DSparkModel`; taps from raw `aux_hidden_state_layer_ids`",
            Layout::Dflash2 => "`DFlash2DraftModel`: DFlash GQA backbone (`fc`, `hidden_norm`, `norm`) with two-tap grouped convolutions and a candidate (path) selector",
            Layout::Dflash2Mla => "DFlash2 with `dflash_config.attention_mode: mla` (MLA backbone, TorchSpec's Kimi-K3 template)",
        }
    }

    /// The family in prose (`DSpark`, `DFlash2`).
    pub fn family_name(self) -> &'static str {
        match self {
            Layout::Dflash2 | Layout::Dflash2Mla => "DFlash2",
            _ => "DSpark",
        }
    }
}

/// How the query block is laid out and which rows predict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnchorLayout {
    /// `sample_from_anchor` true: N rows `[bonus, MASK×(N−1)]`, every row predicts the next
    /// token, the anchor the first draft (vLLM's DSpark default).
    AnchorFirst,
    /// `sample_from_anchor` false: DFlash's 1+N rows `[bonus, MASK×N]`, only the masks predict
    /// (speculators' default, and DFlash2 always).
    BonusAnchor,
}

impl AnchorLayout {
    pub fn id(self) -> &'static str {
        match self {
            AnchorLayout::AnchorFirst => "anchor-first",
            AnchorLayout::BonusAnchor => "bonus-anchor",
        }
    }
    pub fn describe(self) -> &'static str {
        match self {
            AnchorLayout::AnchorFirst => {
                "N rows [bonus, MASK×(N−1)], every row predicts, the anchor's row the first draft"
            }
            AnchorLayout::BonusAnchor => {
                "DFlash's 1+N rows [bonus, MASK×N], only the masks predict"
            }
        }
    }
}

/// The anchor layout and where it was read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Anchor {
    pub layout: AnchorLayout,
    pub sample_from_anchor: bool,
    /// The key it was read from, or the default that applies.
    pub from: String,
}

/// DSpark's Markov head: a rank-r bias `W2·W1[prev]` added left to right.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Markov {
    pub rank: Option<u64>,
    /// `vanilla`, `gated` or `rnn` (SpecForge/SGLang); vLLM builds `vanilla` only.
    pub head_type: Option<String>,
    /// The key the rank was read from.
    pub key: Option<String>,
    /// The rank is at the config root (where vLLM reads it).
    pub at_root: bool,
    /// `markov_head.markov_w1.weight`'s shape [target vocab, r].
    pub w1: Option<Vec<usize>>,
    /// `markov_head.markov_w2.weight`'s shape [draft vocab, r].
    pub w2: Option<Vec<usize>>,
}

/// DSpark's confidence head (per-position acceptance probability).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Confidence {
    /// `enable_confidence_head` (where vLLM reads it: the config root).
    pub enabled: bool,
    /// `confidence_head_with_markov`: the head reads `[h ; markov_w1[prev]]`.
    pub with_markov: bool,
    /// The key `enabled` was read from (none: not set).
    pub key: Option<String>,
    /// `confidence_head.proj.weight`'s shape, when the tensor is present.
    pub proj: Option<Vec<usize>>,
}

/// DFlash2's convolutions and candidate selector (`dflash_config`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Dflash2Heads {
    pub conv_kernel_size: Option<u64>,
    pub conv_group_size: Option<u64>,
    pub selector_rank: Option<u64>,
    pub selector_top_k: Option<u64>,
    /// `dflash_config.attention_mode` (`gqa`, `mla`), when set.
    pub attention_mode: Option<String>,
    /// Layers carrying `attention_conv`/`mlp_conv` tensors.
    pub conv_layers: usize,
    /// `candidate_selector.*` tensors are present.
    pub selector: bool,
}

/// How one engine reads the tap ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TapReading {
    /// `vllm` or `sglang`.
    pub engine: &'static str,
    /// `+1` or `raw`.
    pub shift: &'static str,
    /// The ids the engine ends with (vLLM's aux ids: capture after layer id−1).
    pub ids: Vec<i64>,
    pub how: &'static str,
}

/// `num_target_layers` and what it means in this layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NumTargetLayers {
    pub value: u64,
    /// `taps` (K3DSparkConfig) or `target-depth` (SpecForge, TorchSpec DFlash2).
    pub means: &'static str,
}

impl NumTargetLayers {
    /// What the value counts, in words.
    pub fn meaning(&self) -> &'static str {
        if self.means == "taps" {
            "the number of taps (K3DSparkConfig checks it against `target_layer_ids`)"
        } else {
            "the target's depth (SpecForge's meaning; a K3DSparkModel needs the number of taps)"
        }
    }
}

/// The vocabularies: the target's, the draft's, and the tensors that map between them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Vocab {
    pub vocab_size: Option<u64>,
    /// `draft_vocab_size`, else `vocab_size` (the engines' default).
    pub draft_vocab_size: Option<u64>,
    /// `draft_vocab_size` is not in the config: the engines take `vocab_size`.
    pub draft_vocab_default: bool,
    /// `draft_vocab_size` < `vocab_size`: the draft samples its own vocabulary and maps it
    /// through `d2t`.
    pub reduced: bool,
    pub d2t: bool,
    pub lm_head: bool,
    pub embed_tokens: bool,
}

/// Everything `inspect` says about a DSpark or DFlash2 draft (`block_draft` in `--json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockDraft {
    pub layout: Layout,
    /// The config's first architecture (empty without a config).
    pub architecture: String,
    pub block_size: Option<u64>,
    /// The key the block size was read from.
    pub block_size_key: Option<String>,
    pub anchor: Anchor,
    pub markov: Option<Markov>,
    pub confidence: Option<Confidence>,
    pub dflash2: Option<Dflash2Heads>,
    pub num_target_layers: Option<NumTargetLayers>,
    /// How vLLM and SGLang read the tap ids (empty without taps).
    pub taps: Vec<TapReading>,
    pub vocab: Vocab,
    /// Inconsistencies and what an engine does with them, each naming the engine.
    pub problems: Vec<Problem>,
    /// Where the config contradicts itself or the tensors (block-size keys that disagree, taps
    /// that name no target layers, a mask token outside the vocabulary, a Markov rank that is
    /// not the tensors'): each is also among `problems`; `convert` and the replay refuse the
    /// draft on the first ([`BlockDraft::contradiction`]).
    #[serde(skip)]
    pub contradictions: Vec<Contradiction>,
}

/// One place a DSpark or DFlash2 config contradicts itself, the vocabulary or the tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contradiction {
    pub what: String,
    /// It is about the taps, which `convert --aux-layers` replaces.
    pub taps: bool,
}

/// One finding: what is wrong, and which engine will not load the draft because of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub what: String,
    pub vllm_refuses: bool,
    pub sglang_refuses: bool,
}

/// The findings, as [`describe`] collects them, and the contradictions among them.
#[derive(Default)]
struct Problems(Vec<Problem>, Vec<Contradiction>);

impl Problems {
    /// The config contradicts itself or the tensors: a finding (`vllm`/`sglang`: the engine
    /// refuses it) that `convert` and the replay refuse.
    fn contradiction(&mut self, what: String, vllm_refuses: bool, sglang_refuses: bool) {
        self.1.push(Contradiction {
            what: what.clone(),
            taps: false,
        });
        self.add(what, vllm_refuses, sglang_refuses)
    }
    fn add(&mut self, what: String, vllm_refuses: bool, sglang_refuses: bool) {
        self.0.push(Problem {
            what,
            vllm_refuses,
            sglang_refuses,
        });
    }
    /// A finding no engine refuses the draft for.
    fn note(&mut self, what: String) {
        self.add(what, false, false)
    }
    /// vLLM will not load the draft.
    fn vllm(&mut self, what: String) {
        self.add(what, true, false)
    }
    /// SGLang will not load the draft.
    fn sglang(&mut self, what: String) {
        self.add(what, false, true)
    }
    /// Neither engine loads the draft.
    fn both(&mut self, what: String) {
        self.add(what, true, true)
    }
}

/// Which of the two families (`checkpoint::Family::{Dspark, Dflash2}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dspark,
    Dflash2,
}

/// The draft's sizes, as detection found them (`checkpoint::Dims`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Sizes {
    pub hidden_size: Option<u64>,
    pub vocab_size: Option<u64>,
    pub draft_vocab_size: Option<u64>,
    pub d2t: bool,
    pub lm_head: bool,
    pub embed_tokens: bool,
}

/// The tap ids as written, and whether they number inputs of layers (speculators) rather
/// than outputs (`checkpoint::AuxLayers`; `None`: convention unknown).
#[derive(Debug, Clone, Copy)]
pub struct TapIds<'a> {
    pub ids: &'a [i64],
    pub input_of_layer: Option<bool>,
}

/// Family from `config.json`: DSpark or DFlash2, with what said so (checked before DFlash and
/// EAGLE-3: a DSpark config carries a `dflash_config`).
pub fn family_from_config(c: &Config) -> Option<(Kind, String)> {
    let archs = c.architectures();
    let mt = c.model_type().unwrap_or("");
    let spec = c.root.get("speculators_model_type").and_then(Value::as_str);
    let named = |list: &[&str]| archs.iter().any(|a| list.contains(&a.as_str()));
    if named(DSPARK_ARCHITECTURES) || mt == "k3_dspark" || spec == Some("dspark") {
        let why = match spec {
            Some(s) => format!("config: speculators_model_type `{s}`"),
            None => format!("config: architectures {archs:?}, model_type `{mt}`"),
        };
        return Some((Kind::Dspark, why));
    }
    let dflash2_keys = ["conv_kernel_size", "selector_rank"]
        .iter()
        .any(|k| c.nested("dflash_config", k).is_some());
    if named(DFLASH2_ARCHITECTURES) || spec == Some("dflash2") || dflash2_keys {
        return Some((
            Kind::Dflash2,
            format!(
                "config: architectures {archs:?}, model_type `{mt}`{}",
                if dflash2_keys {
                    ", `dflash_config` with DFlash2 keys"
                } else {
                    ""
                }
            ),
        ));
    }
    None
}

/// Family from tensor names: DSpark's Markov head, DFlash2's selector or convolutions.
pub fn family_from_tensors<'a>(mut names: impl Iterator<Item = &'a str>) -> Option<(Kind, String)> {
    let mut found = None;
    for n in names.by_ref() {
        if n.starts_with("markov_head.") {
            return Some((
                Kind::Dspark,
                "tensors: `markov_head.*` (DSpark's Markov head)".into(),
            ));
        }
        if found.is_none()
            && (n.starts_with("candidate_selector.")
                || (n.starts_with("layers.")
                    && (n.contains(".attention_conv.") || n.contains(".mlp_conv."))))
        {
            found = Some((
                Kind::Dflash2,
                "tensors: `candidate_selector.*` / `layers.*.attention_conv` (DFlash2)".to_string(),
            ));
        }
    }
    found
}

/// Which layout a `family` draft is in.
pub fn layout(kind: Kind, c: Option<&Config>, w: &Weights) -> Layout {
    let has = |p: &str| w.names().any(|n| n.starts_with(p));
    match kind {
        Kind::Dspark => {
            let archs = c.map(Config::architectures).unwrap_or_default();
            let arch = |a: &str| archs.iter().any(|x| x == a);
            let spec = c.is_some_and(|c| {
                c.root.get("speculators_model_type").and_then(Value::as_str) == Some("dspark")
            });
            if spec {
                Layout::SpeculatorsDspark
            } else if arch("K3DSparkModel")
                || c.is_some_and(|c| c.model_type() == Some("k3_dspark"))
                || has("context_proj.")
            {
                Layout::K3Dspark
            } else if arch("DSparkDraftModel") || arch("LingDSparkModel") {
                Layout::SpecforgeDspark
            } else {
                Layout::Qwen3Dspark
            }
        }
        Kind::Dflash2 => {
            let mla = c.is_some_and(|c| {
                c.nested("dflash_config", "attention_mode")
                    .and_then(Value::as_str)
                    == Some("mla")
            }) || w
                .names()
                .any(|n| n.starts_with("layers.") && n.contains(".self_attn.q_a_proj."));
            if mla {
                Layout::Dflash2Mla
            } else {
                Layout::Dflash2
            }
        }
    }
}

/// The first of `keys` set (not null) in the config: (value, key as written).
fn first<'c>(c: &'c Config, keys: &[(Option<&str>, &str)]) -> Option<(&'c Value, String)> {
    keys.iter().find_map(|(obj, k)| {
        let v = match obj {
            Some(o) => c.nested(o, k),
            None => c.root.get(*k),
        };
        v.filter(|v| !v.is_null()).map(|v| {
            (
                v,
                obj.map(|o| format!("{o}.{k}"))
                    .unwrap_or_else(|| k.to_string()),
            )
        })
    })
}

fn shape(w: &Weights, name: &str) -> Option<Vec<usize>> {
    w.info(name).map(|t| t.shape.clone())
}

/// Describe a DSpark or DFlash2 draft (`None` for other families).
pub fn describe(
    kind: Kind,
    layout: Layout,
    c: Option<&Config>,
    w: &Weights,
    dims: &Sizes,
    aux: Option<TapIds>,
) -> BlockDraft {
    let mut problems = Problems::default();
    let empty = Config {
        path: Default::default(),
        root: Default::default(),
    };
    let cfg = c.unwrap_or(&empty);
    let architecture = cfg.architectures().first().cloned().unwrap_or_default();
    let dspark = kind == Kind::Dspark;
    let nest = |k: &'static str| -> Vec<(Option<&'static str>, &'static str)> {
        vec![
            (None, k),
            (Some("dspark_config"), k),
            (Some("dflash_config"), k),
        ]
    };
    let u = |v: &Value| v.as_u64();

    // Block size: `dspark_block_size`, `block_size`, then the nested ones.
    let mut bkeys = vec![(None, "dspark_block_size")];
    bkeys.extend(nest("block_size"));
    let block = first(cfg, &bkeys);
    let (block_size, block_size_key) = match block {
        Some((v, k)) => (u(v), Some(k)),
        None => (None, None),
    };
    if dspark && block_size_key.is_none() {
        problems.note("no block size in the config: vLLM then needs `num_speculative_tokens` and SGLang `--speculative-num-draft-tokens` at launch".into());
    }
    block_keys_agree(cfg, &bkeys, &mut problems);
    mask_token(kind, cfg, dims, &mut problems);
    key_types(cfg, &mut problems);
    if let Some(what) =
        aux.and_then(|a| taps_problem(layout, c, a).or_else(|| prefixed_taps(cfg, a)))
    {
        problems.add(what.clone(), false, false);
        problems.1.push(Contradiction { what, taps: true });
    }

    let anchor = anchor(layout, cfg, &mut problems);
    let markov = dspark.then(|| markov(cfg, w, dims, &mut problems));
    let confidence =
        dspark.then(|| confidence(layout, cfg, w, dims, markov.as_ref(), &mut problems));
    let dflash2 = (!dspark).then(|| dflash2(layout, cfg, w, dims.vocab_size, &mut problems));

    let ntl = c.and_then(|c| c.root.get("num_target_layers")).and_then(u);
    let ntaps = aux.map(|a| a.ids.len());
    let num_target_layers = ntl.map(|value| NumTargetLayers {
        value,
        means: if layout == Layout::K3Dspark {
            "taps"
        } else {
            "target-depth"
        },
    });
    if layout == Layout::K3Dspark {
        k3_checks(cfg, ntl, ntaps, &mut problems);
    }
    if layout == Layout::SpecforgeDspark && cfg.model_type() != Some("qwen3") {
        problems.vllm(format!(
            "vLLM will not load it as a Qwen3 DSpark: it renames `DSparkDraftModel` to `Qwen3DSparkModel` only for model_type `qwen3` (found {:?}) and otherwise builds DeepSeek-V4's DSpark, whose weights ship in the target (vllm/config/speculative.py)",
            cfg.model_type().unwrap_or("none")
        ));
    }
    if layout == Layout::SpeculatorsDspark && cfg.root.get("aux_hidden_state_layer_ids").is_none() {
        problems.vllm("vLLM will not load it: speculators' `update_dspark` requires `aux_hidden_state_layer_ids` (KeyError)".into());
    }

    let taps = aux.map(readings).unwrap_or_default();
    let vocab = vocab(layout, dims, &mut problems);
    BlockDraft {
        layout,
        architecture,
        block_size,
        block_size_key,
        anchor,
        markov,
        confidence,
        dflash2,
        num_target_layers,
        taps,
        vocab,
        problems: problems.0,
        contradictions: problems.1,
    }
}

/// Every block-size key set is a whole number of tokens in `1..=MAX_DIM`, and they agree: the
/// engines read them in different orders (vLLM `block_size`, then `dspark_block_size`:
/// vllm/config/speculative.py; SGLang `dspark_block_size`, then `dflash_config.block_size`, then
/// `block_size`: dspark_config.py, dflash_utils.py), so keys that disagree run different blocks.
fn block_keys_agree(c: &Config, keys: &[(Option<&str>, &str)], problems: &mut Problems) {
    let max = MAX_BLOCK;
    let mut seen: Vec<(String, u64)> = Vec::new();
    for &(obj, k) in keys {
        let Some((v, key)) = first(c, &[(obj, k)]) else {
            continue;
        };
        match v.as_u64() {
            Some(n) if (1..=max).contains(&n) => seen.push((key, n)),
            _ => problems.contradiction(
                format!("`{key}` is {v}: a block size is a whole number of tokens, 1..={max}"),
                true,
                true,
            ),
        }
    }
    if let Some(all) = disagreement(&seen) {
        problems.contradiction(
            format!(
                "the block-size keys disagree ({all}): vLLM reads `block_size` first, SGLang `dspark_block_size` and `dflash_config.block_size` before it, so the engines would run different blocks"
            ),
            false,
            false,
        );
    }
}

/// The mask token the engines embed for every masked row: a whole number below the vocabulary,
/// one value wherever it is written (SGLang reads `dspark_noise_token_id`, then
/// `dspark_config`/`dflash_config`, then the root, and refuses a negative id or one outside the
/// target's vocabulary: dspark_config.py `parse_dspark_draft_config`, `resolve_runtime_config`).
fn mask_token(kind: Kind, c: &Config, dims: &Sizes, problems: &mut Problems) {
    let keys = [
        (None, "dspark_noise_token_id"),
        (Some("dspark_config"), "mask_token_id"),
        (Some("dflash_config"), "mask_token_id"),
        (None, "mask_token_id"),
    ];
    let sglang = kind == Kind::Dspark;
    let mut seen: Vec<(String, u64)> = Vec::new();
    for &(obj, k) in &keys {
        let Some((v, key)) = first(c, &[(obj, k)]) else {
            continue;
        };
        match (v.as_u64(), dims.vocab_size) {
            (Some(id), Some(vocab)) if id >= vocab => problems.contradiction(
                format!("`{key}` {id} is outside the vocabulary of {vocab}: every masked row embeds it (SGLang: \"mask_token_id={id} is outside the target vocab size\")"),
                false,
                sglang,
            ),
            (Some(id), _) => seen.push((key, id)),
            (None, _) => problems.contradiction(
                format!("`{key}` is {v}: a mask token id is a whole number below the vocabulary (SGLang: \"mask_token_id must be non-negative\")"),
                false,
                sglang,
            ),
        }
    }
    if let Some(all) = disagreement(&seen) {
        problems.contradiction(
            format!(
                "the mask-token keys disagree ({all}): which one a masked row embeds depends on the engine's reading order"
            ),
            false,
            false,
        );
    }
}

/// The keys and values of `seen` when they are not all one value, as `` `key` value, … ``.
fn disagreement(seen: &[(String, u64)]) -> Option<String> {
    seen.iter().any(|(_, n)| *n != seen[0].1).then(|| {
        seen.iter()
            .map(|(k, n)| format!("`{k}` {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// What is wrong with taps `a` of a draft in `layout` with config `c`, if anything: taps name
/// target layers, once each, in order, within the target's depth when the config gives it
/// (`num_target_layers` in every layout but `k3-dspark`, where it counts the taps and the depth
/// is `target_num_hidden_layers`). The replay refuses the same, as vLLM's Qwen3-Omni DSpark
/// check does ("target_layer_ids must be unique and strictly increasing", "zero-based
/// text-layer indices in [0, N − 1]": vllm/config/speculative.py).
pub fn taps_problem(layout: Layout, c: Option<&Config>, a: TapIds) -> Option<String> {
    let ids = a.ids;
    // The hidden state a tap reads: output of layer k is hidden_states[k + 1].
    let hs = |k: i64| k + i64::from(a.input_of_layer != Some(true));
    let why = if ids.is_empty() {
        Some("name no layer".to_string())
    } else if let Some(k) = ids.iter().find(|&&k| hs(k) < 0) {
        Some(format!("{k} reads hidden_states[{}], before the embeddings (Python reads a negative index from the last layer)", hs(*k)))
    } else if !ids.windows(2).all(|w| w[0] < w[1]) {
        Some("must name distinct layers in increasing order (each tap is one target layer, read once)".to_string())
    } else {
        let key = if layout == Layout::K3Dspark {
            "target_num_hidden_layers"
        } else {
            "num_target_layers"
        };
        let depth = c.and_then(|c| c.root.get(key)).and_then(Value::as_u64);
        let last = ids.last().map_or(0, |&k| hs(k) as u64);
        depth.filter(|&d| last > d).map(|d| {
            format!("the last reads hidden_states[{last}], past the target's {d} layers (`{key}`)")
        })
    };
    why.map(|why| format!("taps {ids:?}: {why}"))
}

/// `dspark_target_layer_ids` beside the taps read from another key: SGLang reads it first
/// (`parse_dspark_draft_config`), vLLM the `dflash_config`/root ones, so they must name the same
/// hidden states (it numbers outputs of layers).
fn prefixed_taps(c: &Config, a: TapIds) -> Option<String> {
    let v = c
        .root
        .get("dspark_target_layer_ids")
        .filter(|v| !v.is_null())?;
    let ours: Vec<i64> = a
        .ids
        .iter()
        .map(|&k| k + i64::from(a.input_of_layer != Some(true)))
        .collect();
    let theirs: Option<Vec<i64>> = v
        .as_array()
        .and_then(|l| l.iter().map(|k| k.as_i64().map(|k| k + 1)).collect());
    (theirs.as_ref() != Some(&ours)).then(|| {
        format!("`dspark_target_layer_ids` {v} and the taps {:?} read elsewhere disagree: SGLang reads `dspark_target_layer_ids` first, vLLM the others", a.ids)
    })
}

/// The config's objects and flags have the types the engines read: `dflash_config` and
/// `dspark_config` objects (vLLM calls `.get` on them), the DSpark flags JSON booleans (Python
/// takes any non-empty string as true, where kquant would read the flag as unset), and
/// `num_target_layers` a whole number of layers, 1 or more (SGLang's `parse_dflash_draft_config`).
fn key_types(c: &Config, problems: &mut Problems) {
    for k in ["dflash_config", "dspark_config"] {
        if let Some(v) = c.root.get(k).filter(|v| !v.is_null() && !v.is_object()) {
            problems.contradiction(format!("`{k}` is {v}: it is an object of keys"), true, true);
        }
    }
    let flags = [
        "sample_from_anchor",
        "dspark_bonus_anchor",
        "enable_confidence_head",
        "confidence_head_with_markov",
    ];
    for k in flags {
        let nested = ["dflash_config", "dspark_config"].map(|o| (Some(o), k));
        for (obj, key) in [(None, k)].into_iter().chain(nested) {
            if let Some((v, at)) = first(c, &[(obj, key)]).filter(|(v, _)| !v.is_boolean()) {
                problems.contradiction(format!("`{at}` is {v}, not true or false: Python reads any non-empty value as true, so the engines and kquant would read it differently"), false, false);
            }
        }
    }
    if let Some(v) = c.root.get("num_target_layers").filter(|v| !v.is_null()) {
        if v.as_u64().is_none_or(|n| n == 0) {
            problems.contradiction(
                format!("`num_target_layers` is {v}: a target has a whole number of layers, 1 or more (SGLang's `parse_dflash_draft_config` reads it with `min_value=1`)"),
                false,
                true,
            );
        }
    }
}

fn anchor(layout: Layout, c: &Config, problems: &mut Problems) -> Anchor {
    let key = |k: &str| c.root.get(k).and_then(Value::as_bool);
    let nested = c
        .nested("dflash_config", "sample_from_anchor")
        .and_then(Value::as_bool);
    let (sfa, from) = match layout {
        Layout::Dflash2 | Layout::Dflash2Mla => {
            if nested == Some(true) {
                problems.vllm("vLLM will not load it: `dflash_config.sample_from_anchor: true` raises \"sample_from_anchor=True is not supported for DFlash\" (DFlash2 drafts the 1+N layout)".into());
            }
            (
                false,
                "DFlash2 always drafts 1+N, as vLLM's DFlash speculator".to_string(),
            )
        }
        Layout::SpeculatorsDspark => match key("sample_from_anchor") {
            Some(v) => (v, "`sample_from_anchor`".into()),
            None => (false, "speculators' default, `update_dspark`".into()),
        },
        _ => match (key("sample_from_anchor"), key("dspark_bonus_anchor")) {
            (Some(v), Some(bonus)) if v == bonus => {
                // The two keys say opposite layouts; the engines read `sample_from_anchor` only
                // (vLLM's Qwen3-Omni check requires "sample_from_anchor=true and
                // dspark_bonus_anchor=false").
                problems.contradiction(format!("`sample_from_anchor` {v} and `dspark_bonus_anchor` {bonus} say opposite anchor layouts: the engines read `sample_from_anchor`, so the draft would be served in the layout the other key says it was not trained with"), false, false);
                (v, "`sample_from_anchor`".into())
            }
            (Some(v), _) => (v, "`sample_from_anchor`".into()),
            (None, Some(bonus)) => (!bonus, "`dspark_bonus_anchor`".into()),
            (None, None) => (true, "vLLM's and SGLang's default".into()),
        },
    };
    Anchor {
        layout: if sfa {
            AnchorLayout::AnchorFirst
        } else {
            AnchorLayout::BonusAnchor
        },
        sample_from_anchor: sfa,
        from,
    }
}

fn markov(c: &Config, w: &Weights, dims: &Sizes, problems: &mut Problems) -> Markov {
    let keys = [
        (None, "dspark_markov_rank"),
        (None, "markov_rank"),
        (Some("dspark_config"), "markov_rank"),
        (Some("dflash_config"), "markov_rank"),
    ];
    let found = first(c, &keys);
    let rank = found.as_ref().and_then(|(v, _)| v.as_u64());
    let key = found.as_ref().map(|(_, k)| k.clone());
    let at_root = c.root.get("markov_rank").is_some_and(|v| !v.is_null());
    let head_found = first(
        c,
        &[
            (None, "dspark_markov_head_type"),
            (None, "markov_head_type"),
            (Some("dspark_config"), "markov_head_type"),
            (Some("dflash_config"), "markov_head_type"),
        ],
    );
    let head_type = head_found
        .as_ref()
        .and_then(|(v, _)| v.as_str().map(str::to_ascii_lowercase));
    let head_not_named = head_found.as_ref().filter(|_| head_type.is_none());
    let w1 = shape(w, "markov_head.markov_w1.weight");
    let w2 = shape(w, "markov_head.markov_w2.weight");
    // vLLM reads the root's rank, SGLang `dspark_markov_rank`, then the nested ones, then the
    // root's: the keys set must agree.
    let ranks: Vec<(String, u64)> = keys
        .iter()
        .filter_map(|&(o, k)| first(c, &[(o, k)]))
        .filter_map(|(v, k)| v.as_u64().map(|r| (k, r)))
        .collect();
    if let Some(all) = disagreement(&ranks) {
        problems.contradiction(
            format!("the Markov-rank keys disagree ({all}): vLLM builds the head from the root's, SGLang from `dspark_markov_rank` or the nested ones first"),
            false,
            false,
        );
    }
    if let (Some((v, k)), None) = (&found, rank) {
        problems.contradiction(format!("`{k}` is {v}: the Markov rank is a whole number (SGLang: \"DSpark markov_rank must be >= 0\"; vLLM builds `nn.Embedding(vocab_size, markov_rank)`)"), true, true);
    }
    match (rank, &key) {
        (None, Some(_)) => {}
        (None, None) => problems.both("no `markov_rank` in the config: vLLM will not load it (it reads `config.markov_rank` at the root) and SGLang refuses \"DSpark draft requires markov_rank > 0\"".into()),
        (Some(0), _) => problems.sglang("`markov_rank` is 0: SGLang refuses \"DSpark draft requires markov_rank > 0\"".into()),
        (Some(_), Some(k)) if !at_root => problems.both(format!("vLLM will not load it: `markov_rank` must be at the config root (vLLM reads `config.markov_rank`; found `{k}`; SpecForge exports need root-level copies, SpecForge PR #852); nor will SGLang, which builds the Markov head from the root's (`build_markov_head`): \"DSpark requires markov_rank > 0 (the Markov head is the core of the semi-AR draft); got markov_rank=0.\"")),
        _ => {}
    }
    if let Some((v, k)) = head_not_named {
        // SGLang's `build_markov_head`: `str(config.markov_head_type).lower()`, then only the
        // names it builds; vLLM's Qwen3 DSpark never reads it.
        problems.sglang(format!("`{k}` is {v}, not a head name: SGLang refuses \"Unsupported DSpark markov_head_type='{}'\" (vLLM builds `vanilla` whatever it says)", v.to_string().to_ascii_lowercase()));
    } else if rank.is_some_and(|r| r > 0) && head_type.is_none() {
        problems.sglang("no `markov_head_type`: SGLang refuses \"DSpark requires markov_head_type when markov_rank > 0, got None.\" (vLLM builds `vanilla`)".into());
    }
    if let Some(t) = head_type.as_deref().filter(|t| *t != "vanilla") {
        problems.vllm(format!("vLLM will not load it: Markov head `{t}`: vLLM builds only `vanilla` (W1 embedding + W2 projection), so the head's other tensors do not load (SGLang builds `{t}`)"));
    }
    // A quantized tensor's shape is its packing's (`quantize --exclude` can quantize W2).
    let float = |n: &str| {
        w.info(&format!("markov_head.{n}.weight"))
            .is_some_and(|t| t.dtype.is_float())
    };
    for (name, s) in [("markov_w1", &w1), ("markov_w2", &w2)] {
        match s {
            // compressed-tensors writes a quantized linear as `weight_packed`.
            None if w
                .info(&format!("markov_head.{name}.weight_packed"))
                .is_some() => {}
            None => problems.note(format!("no `markov_head.{name}.weight` tensor")),
            // The engines build the head from the rank and load the tensors into it
            // (vLLM's `default_weight_loader` asserts the shapes match).
            Some(s)
                if float(name) && rank.is_some_and(|r| s.get(1).map(|&x| x as u64) != Some(r)) =>
            {
                problems.contradiction(
                    format!(
                        "`markov_head.{name}.weight` is {s:?}: its rank disagrees with markov_rank {}",
                        rank.unwrap_or(0)
                    ),
                    true,
                    true,
                )
            }
            _ => {}
        }
    }
    if let (Some(s), Some(v)) = (&w1, dims.vocab_size) {
        if s.first().map(|&x| x as u64) != Some(v) {
            problems.note(format!("`markov_head.markov_w1.weight` is {s:?}: its rows are indexed by target token id, vocab_size is {v}"));
        }
    }
    Markov {
        rank,
        head_type,
        key,
        at_root,
        w1,
        w2,
    }
}

fn confidence(
    layout: Layout,
    c: &Config,
    w: &Weights,
    dims: &Sizes,
    markov: Option<&Markov>,
    problems: &mut Problems,
) -> Confidence {
    let found = first(
        c,
        &[
            (None, "enable_confidence_head"),
            (Some("dspark_config"), "enable_confidence_head"),
            (Some("dflash_config"), "enable_confidence_head"),
        ],
    );
    let enabled = found
        .as_ref()
        .is_some_and(|(v, _)| v.as_bool() == Some(true));
    let key = found.map(|(_, k)| k);
    let with_markov = first(
        c,
        &[
            (None, "confidence_head_with_markov"),
            (Some("dspark_config"), "confidence_head_with_markov"),
            (Some("dflash_config"), "confidence_head_with_markov"),
        ],
    )
    .is_some_and(|(v, _)| v.as_bool() == Some(true));
    let at_root = c
        .root
        .get("enable_confidence_head")
        .and_then(Value::as_bool)
        == Some(true);
    let proj = shape(w, "confidence_head.proj.weight");
    if enabled && !at_root && layout != Layout::SpeculatorsDspark {
        problems.note(format!("vLLM drops the confidence head: `enable_confidence_head` is only in `{}`, and vLLM reads it at the config root", key.as_deref().unwrap_or("")));
    }
    match (&proj, enabled) {
        (None, true) => problems.note("`enable_confidence_head` is set but there is no `confidence_head.proj.weight`: vLLM builds no head (it drops a head whose tensors are absent)".into()),
        (Some(_), false) => problems.note("`confidence_head.proj.weight` is present but `enable_confidence_head` is not set: vLLM drops the head".into()),
        _ => {}
    }
    if let (Some(s), Some(h)) = (&proj, dims.hidden_size) {
        let r = markov.and_then(|m| m.rank).unwrap_or(0);
        let want = if with_markov { h + r } else { h };
        if s.get(1).map(|&x| x as u64) != Some(want) {
            problems.note(format!(
                "`confidence_head.proj.weight` is {s:?}, but the head reads {want} values (hidden {h}{})",
                if with_markov { format!(" + markov_rank {r}") } else { String::new() }
            ));
        }
    }
    Confidence {
        enabled,
        with_markov,
        key,
        proj,
    }
}

fn dflash2(
    layout: Layout,
    c: &Config,
    w: &Weights,
    vocab: Option<u64>,
    problems: &mut Problems,
) -> Dflash2Heads {
    let get = |k: &str| {
        c.nested("dflash_config", k)
            .or_else(|| c.root.get(k))
            .and_then(Value::as_u64)
    };
    let mut conv: std::collections::BTreeSet<&str> = Default::default();
    for n in w.names() {
        if n.starts_with("layers.") && (n.contains(".attention_conv.") || n.contains(".mlp_conv."))
        {
            conv.insert(n.split('.').nth(1).unwrap_or(""));
        }
    }
    let h = Dflash2Heads {
        conv_kernel_size: get("conv_kernel_size"),
        conv_group_size: get("conv_group_size"),
        selector_rank: get("selector_rank"),
        selector_top_k: get("selector_top_k"),
        attention_mode: c
            .nested("dflash_config", "attention_mode")
            .and_then(Value::as_str)
            .map(String::from),
        conv_layers: conv.len(),
        selector: w.names().any(|n| n.starts_with("candidate_selector.")),
    };
    for k in [
        "conv_kernel_size",
        "conv_group_size",
        "selector_rank",
        "selector_top_k",
    ] {
        let v = c.nested("dflash_config", k).or_else(|| c.root.get(k));
        if let Some(v) = v.filter(|v| !v.is_null() && v.as_u64().is_none()) {
            // The engines size tensors and index with it (`qwen3_dflash2.py`): a string or a
            // negative number fails there; kquant would read it as unset.
            problems.contradiction(
                format!("`{k}` is {v}: a DFlash2 width is a whole number"),
                true,
                true,
            );
        }
    }
    if layout == Layout::Dflash2Mla {
        problems.both("neither vLLM 0.33 nor SGLang 0.5.23 loads an MLA DFlash2: their DFlash2 classes build GQA q/k/v_proj and read no `dflash_config.attention_mode` (vLLM's weight loader raises on `q_a_proj`; SGLang drops names it does not know)".into());
    }
    if !h.selector {
        problems.note(
            "no `candidate_selector.*` tensors: DFlash2 drafts through its path selector".into(),
        );
    }
    dflash2_shapes(&h, w, vocab, problems);
    h
}

/// DFlash2's `dflash_config` widths against the unquantized tensors they size (vLLM's and
/// SGLang's loaders build the convolutions and the selector from the keys, then load the
/// tensors into them: `qwen3_dflash2.py` `DFlashGroupedConv`, `CandidateSelector`): the first
/// tensor that disagrees is a contradiction.
fn dflash2_shapes(d: &Dflash2Heads, w: &Weights, vocab: Option<u64>, problems: &mut Problems) {
    let dim = |s: &[usize], i: usize| s.get(i).map_or(0, |&x| x as u64);
    let wrong = |n: &str, s: &[usize]| -> Option<String> {
        let (k, g, r) = (d.conv_kernel_size, d.conv_group_size, d.selector_rank);
        let key = if n.ends_with(".base_kernel") {
            k.filter(|&k| dim(s, 1) != k)
                .map(|k| format!("conv_kernel_size {k}"))
        } else if n.ends_with("_conv.kernel_projection.weight") {
            let h = dim(s, 1);
            match (k, g) {
                (Some(k), Some(g)) if g == 0 || h % g != 0 || dim(s, 0) != 2 * k * (h / g) => {
                    Some(format!("conv_kernel_size {k} and conv_group_size {g} (rows 2 · kernel · hidden / group)"))
                }
                _ => None,
            }
        } else if n.ends_with("_codebook") {
            r.filter(|&r| dim(s, 1) != r)
                .map(|r| format!("selector_rank {r}"))
        } else if n == "candidate_selector.hidden_projection.weight" {
            r.filter(|&r| dim(s, 0) != r)
                .map(|r| format!("selector_rank {r}"))
        } else {
            None
        }?;
        Some(format!(
            "`{n}` is {s:?}, which does not fit `dflash_config` {key}"
        ))
    };
    let found = w.infos().find_map(|t| {
        (t.dtype.is_float()
            && (t.name.starts_with("layers.") || t.name.starts_with("candidate_selector.")))
        .then(|| wrong(&t.name, &t.shape))
        .flatten()
    });
    if let Some(what) = found {
        problems.contradiction(what, true, true);
    }
    if let (Some(k), Some(v)) = (d.selector_top_k, vocab) {
        if k > v {
            problems.contradiction(
                format!("`dflash_config.selector_top_k` {k} is more candidates than the vocabulary of {v}"),
                true,
                true,
            );
        }
    }
}

fn k3_checks(c: &Config, ntl: Option<u64>, ntaps: Option<usize>, problems: &mut Problems) {
    let set = |k: &str| c.root.get(k).and_then(Value::as_bool) == Some(true);
    let unsupported: Vec<&str> = [
        "mla_use_nope",
        "mla_use_output_gate",
        "mla_use_qk_norm",
        "dspark_bonus_anchor",
    ]
    .into_iter()
    .filter(|k| set(k))
    .collect();
    if !unsupported.is_empty() {
        problems.vllm(format!(
            "vLLM will not load it: K3DSparkConfig raises \"MLA DSpark does not support {}.\"",
            unsupported.join(", ")
        ));
    }
    if c.root.get("q_lora_rank").is_none_or(Value::is_null) {
        problems.vllm("vLLM will not load it: K3DSparkConfig raises \"MLA DSpark does not support q_lora_rank=None.\"".into());
    }
    match (ntl, ntaps) {
        (_, None) | (_, Some(0)) => problems.vllm("vLLM will not load it: K3DSparkConfig raises \"MLA DSpark requires non-empty target_layer_ids and a matching num_target_layers.\" (no `target_layer_ids`)".into()),
        (Some(n), Some(k)) if n as usize == k => {}
        (n, Some(k)) => problems.vllm(format!(
            "vLLM will not load it: `num_target_layers` is {} but `target_layer_ids` has {k} ids; K3DSparkConfig raises \"MLA DSpark requires non-empty target_layer_ids and a matching num_target_layers.\" (in this layout it counts the taps, not the target's layers)",
            n.map(|n| n.to_string()).unwrap_or_else(|| "missing".into())
        )),
    }
    let dv = c.root.get("draft_vocab_size").and_then(Value::as_u64);
    let v = c.root.get("vocab_size").and_then(Value::as_u64);
    if let (Some(d), Some(v)) = (dv, v) {
        if d != v {
            problems.vllm(format!("vLLM will not load it: draft_vocab_size {d} ≠ vocab_size {v}; K3DSparkConfig raises \"MLA DSpark requires draft_vocab_size to equal vocab_size when sharing the target embedding and LM head.\""));
        }
    }
}

/// How vLLM and SGLang read the tap ids.
fn readings(a: TapIds) -> Vec<TapReading> {
    match a.input_of_layer {
        Some(true) => vec![TapReading {
            engine: "vllm",
            shift: "raw",
            ids: a.ids.to_vec(),
            how: "vLLM reads `aux_hidden_state_layer_ids` raw as its aux ids (capture after layer id−1) and sets `target_layer_ids` = id − 1",
        }],
        Some(false) => vec![
            TapReading {
                engine: "vllm",
                shift: "+1",
                ids: a.ids.iter().map(|k| k + 1).collect(),
                how: "vLLM adds +1 (aux id k+1 captures after 0-based layer k; eagle3_utils.get_eagle3_aux_layers_from_config)",
            },
            TapReading {
                engine: "sglang",
                shift: "raw",
                ids: a.ids.to_vec(),
                how: "SGLang takes 0-based layer outputs: its Qwen3-style targets capture before layer k+1, its Kimi-K3 target reads k with no shift",
            },
        ],
        None => Vec::new(),
    }
}

fn vocab(layout: Layout, d: &Sizes, problems: &mut Problems) -> Vocab {
    let draft = d.draft_vocab_size.or(d.vocab_size);
    let reduced = matches!((draft, d.vocab_size), (Some(a), Some(b)) if a < b);
    let v = Vocab {
        vocab_size: d.vocab_size,
        draft_vocab_size: draft,
        draft_vocab_default: d.draft_vocab_size.is_none(),
        reduced,
        d2t: d.d2t,
        lm_head: d.lm_head,
        embed_tokens: d.embed_tokens,
    };
    let qwen3 = matches!(
        layout,
        Layout::Qwen3Dspark | Layout::SpecforgeDspark | Layout::SpeculatorsDspark
    );
    if reduced && qwen3 {
        if !v.lm_head {
            problems.vllm("vLLM will not load it: \"Reduced-vocabulary Qwen3 DSpark checkpoints must include lm_head weights; the full target lm_head cannot be shared.\"".into());
        }
        if !v.d2t {
            problems.vllm("vLLM will not load it: \"Reduced-vocabulary Qwen3 DSpark checkpoints must include a d2t mapping so sampled draft ids can be converted to target ids.\"".into());
        }
    }
    v
}

impl BlockDraft {
    /// The first place the config contradicts itself or the tensors (`convert` and the replay
    /// refuse the draft on it).
    pub fn contradiction(&self) -> Option<&str> {
        self.contradictions.first().map(|c| c.what.as_str())
    }

    /// The first finding for which vLLM will not load the draft.
    pub fn vllm_refuses(&self) -> Option<&Problem> {
        self.problems.iter().find(|p| p.vllm_refuses)
    }

    /// The first finding for which SGLang will not load the draft.
    pub fn sglang_refuses(&self) -> Option<&Problem> {
        self.problems.iter().find(|p| p.sglang_refuses)
    }
}
