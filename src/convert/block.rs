//! `convert dspark` and `convert dflash2`: the 2026 block drafters between the layouts that
//! share a backbone. DSpark on the Qwen3 GQA backbone has three: vLLM's `Qwen3DSparkModel`
//! (DSpark keys at the config root), SpecForge/SGLang's `DSparkDraftModel` (`model_type`
//! `qwen3`, keys in `dflash_config` plus the root copies vLLM reads) and the speculators format
//! (`speculators_model_type: dspark`, which vLLM's `update_dspark` rewrites). Inferact's
//! MLA-native `K3DSparkModel` goes to vLLM only, the one engine that builds it. DFlash2 has one
//! layout, which vLLM and SGLang both load.
//!
//! Tensors keep their names (a leading `model.` is dropped: vLLM's loaders add their own) and
//! their bytes; the config keys move to where each loader reads them, the taps are rewritten
//! in each layout's convention, and the anchor layout the draft was trained with is written
//! explicitly. The facts and their sources: docs/formats.md, "Converting DSpark and DFlash2".

use serde_json::{json, Map, Value};

use super::names::{config_value, flatten_speculators, hf_quant_config_file, read_hf_quant_config};
use super::{
    quantization_config_last, rename_quant_lists, set, AuxOut, BlockOut, DraftLayout, Options,
    Plan, Planned, Source,
};
use crate::checkpoint::block::{
    taps_problem, BlockDraft, Kind, Layout, TapIds, DFLASH2_ARCHITECTURES,
};
use crate::checkpoint::{AuxConvention, Checkpoint, Detection};
use crate::error::{Error, Result};

/// Keys a source keeps about its block, taps and heads, read into [`Keys`] and written again
/// where the output layout keeps them.
const MOVED: [&str; 18] = [
    "block_size",
    "dspark_block_size",
    "mask_token_id",
    "dspark_noise_token_id",
    "markov_rank",
    "dspark_markov_rank",
    "markov_head_type",
    "dspark_markov_head_type",
    "enable_confidence_head",
    "confidence_head_with_markov",
    "sample_from_anchor",
    "dspark_bonus_anchor",
    "target_layer_ids",
    "dspark_target_layer_ids",
    "aux_hidden_state_layer_ids",
    "eagle_aux_hidden_state_layer_ids",
    "num_target_layers",
    "dspark_config",
];

/// What `update_dspark` (vLLM's speculators reader) copies from the speculators root; every
/// other model key lives in `transformer_layer_config`.
const SPECULATORS_ROOT: [&str; 3] = [
    "draft_vocab_size",
    "target_hidden_size",
    "use_aux_hidden_state",
];

fn source_err(ck: &Checkpoint, msg: String, hint: String) -> Error {
    Error::Source {
        path: ck.weights.dir.clone(),
        msg,
        hint: Some(hint),
    }
}

/// `convert eagle3` / `convert dflash` on a DSpark or DFlash2 draft: refused, naming the verb
/// that takes it.
pub fn refuse_other_verb(ck: &Checkpoint, det: &Detection, dflash: bool) -> Result<()> {
    let Some(b) = det.block_draft.as_ref() else {
        return Ok(());
    };
    let fam = b.layout.family_name();
    Err(source_err(
        ck,
        format!(
            "is a {fam} draft (`{}` layout), not {}",
            b.layout.id(),
            if dflash { "a DFlash drafter" } else { "an EAGLE-3 draft" }
        ),
        format!(
            "use `kquant convert {}` (`kquant inspect` describes it: layout, block, anchor, heads, taps, engines)",
            fam.to_ascii_lowercase()
        ),
    ))
}

/// The `--to` values `convert dspark` / `convert dflash2` take.
pub fn ids_for(kind: Kind) -> &'static str {
    match kind {
        Kind::Dspark => "vllm, sglang, specforge, speculators",
        Kind::Dflash2 => "vllm, sglang",
    }
}

/// The layout written for a draft in `from` asked `--to to`, or why there is none.
pub fn written(kind: Kind, from: Layout, to: DraftLayout) -> Result<Layout> {
    use DraftLayout as D;
    let gqa = matches!(
        from,
        Layout::Qwen3Dspark | Layout::SpecforgeDspark | Layout::SpeculatorsDspark
    );
    let refuse = |msg: String, hint: String| Err(Error::Flags { msg, hint });
    match (from, to) {
        (_, D::Vllm) if gqa => Ok(Layout::Qwen3Dspark),
        (_, D::Sglang | D::Specforge) if gqa => Ok(Layout::SpecforgeDspark),
        (_, D::Speculators) if gqa => Ok(Layout::SpeculatorsDspark),
        (Layout::K3Dspark, D::Vllm) => Ok(Layout::K3Dspark),
        (Layout::K3Dspark, D::Sglang) => refuse(
            "SGLang 0.5.23 does not load Inferact's MLA-native `K3DSparkModel`: its DSpark classes (python/sglang/srt/models/dspark.py: DSparkDraftModel, Qwen3DSparkModel, LingDSparkModel) build the Qwen3 GQA DFlash backbone, and none is registered for `K3DSparkModel`".into(),
            "serve it with vLLM: `kquant convert dspark SRC --to vllm` (vLLM 0.33 builds it: vllm/models/kimi_k3/nvidia/dspark_mla.py)".into(),
        ),
        (Layout::K3Dspark, D::Specforge | D::Speculators) => refuse(
            format!(
                "--to {}: that DSpark layout is the Qwen3 GQA backbone (`q_proj`/`k_proj`/`v_proj`), and this `K3DSparkModel` draft's attention is MLA (`q_a_proj`, `kv_a_proj_with_mqa`, `context_proj`): no byte copy turns one into the other",
                to.id()
            ),
            "convert it `--to vllm` (vLLM 0.33 loads `K3DSparkModel`); a GQA DSpark has to be trained as one".into(),
        ),
        (Layout::Dflash2, D::Vllm | D::Sglang) => Ok(Layout::Dflash2),
        (Layout::Dflash2Mla, _) => refuse(
            format!("--to {}: neither vLLM 0.33 nor SGLang 0.5.23 loads an MLA DFlash2 (their `DFlash2DraftModel` builds GQA q/k/v_proj and reads no `dflash_config.attention_mode`), so there is no engine layout to convert it to", to.id()),
            "keep it in TorchSpec's layout; `kquant inspect` says which engines load it".into(),
        ),
        _ => refuse(
            format!("--to {} does not take {} drafts", to.id(), from.family_name()),
            format!(
                "`kquant convert {}` takes --to {}",
                kind_id(kind),
                ids_for(kind)
            ),
        ),
    }
}

/// The `convert` kind of a block family.
pub fn kind_id(kind: Kind) -> &'static str {
    match kind {
        Kind::Dspark => "dspark",
        Kind::Dflash2 => "dflash2",
    }
}

/// The source's block draft, checked to be of `kind`.
fn block_of<'d>(ck: &Checkpoint, det: &'d Detection, kind: Kind) -> Result<&'d BlockDraft> {
    let want = match kind {
        Kind::Dspark => "a DSpark draft",
        Kind::Dflash2 => "a DFlash2 draft",
    };
    match det.block_draft.as_ref() {
        Some(b) if det.family.block_kind() == Some(kind) => Ok(b),
        Some(b) => Err(source_err(
            ck,
            format!(
                "is a {} draft (`{}` layout), not {want}",
                b.layout.family_name(),
                b.layout.id()
            ),
            format!(
                "use `kquant convert {}`",
                b.layout.family_name().to_ascii_lowercase()
            ),
        )),
        None => Err(source_err(
            ck,
            format!("is a `{}` checkpoint, not {want}", det.family.id()),
            "`kquant inspect` names its family; `kquant convert eagle3` and `kquant convert dflash` take the others".into(),
        )),
    }
}

/// The block keys of the source, whichever layout held them.
struct Keys {
    block_size: u64,
    mask_token_id: Option<Value>,
    markov_rank: Option<u64>,
    markov_head_type: Option<String>,
    confidence: Option<(bool, bool)>,
    sample_from_anchor: bool,
    /// The source's `num_target_layers`.
    num_target_layers: Option<u64>,
    /// `dflash_config` / `dspark_config` keys that are not block, tap or head keys.
    extra: Map<String, Value>,
}

impl Keys {
    fn read(ck: &Checkpoint, kind: Kind, b: &BlockDraft, cfg: &Value) -> Result<Keys> {
        let block_size = b.block_size.filter(|&n| n >= 1).ok_or_else(|| {
            source_err(
                ck,
                format!("has no block size in its config ({} needs one to write the launch line and the engines' keys)", b.layout.family_name()),
                "add `\"block_size\": B` (the block the drafter was trained with) to its config.json and convert again".into(),
            )
        })?;
        let mask_token_id = [
            "/dflash_config/mask_token_id",
            "/dspark_config/mask_token_id",
            "/mask_token_id",
            "/dspark_noise_token_id",
        ]
        .iter()
        .find_map(|p| cfg.pointer(p).filter(|v| !v.is_null()).cloned());
        let mut extra = Map::new();
        for obj in ["dflash_config", "dspark_config"] {
            for (k, v) in cfg
                .get(obj)
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                if !MOVED.contains(&k.as_str()) {
                    extra.insert(k.clone(), v.clone());
                }
            }
        }
        let dspark = kind == Kind::Dspark;
        Ok(Keys {
            block_size,
            mask_token_id,
            markov_rank: b.markov.as_ref().and_then(|m| m.rank),
            markov_head_type: b.markov.as_ref().and_then(|m| m.head_type.clone()),
            confidence: b
                .confidence
                .as_ref()
                .filter(|c| dspark && (c.key.is_some() || c.enabled))
                .map(|c| (c.enabled, c.with_markov)),
            sample_from_anchor: b.anchor.sample_from_anchor,
            num_target_layers: cfg
                .pointer("/dflash_config/num_target_layers")
                .or_else(|| cfg.get("num_target_layers"))
                .and_then(Value::as_u64),
            extra,
        })
    }

    /// The DSpark keys every GQA layout keeps at the config root, as (key, value): vLLM reads
    /// them there (`qwen3_dspark.py`, `dspark/speculator.py`), SGLang after `dflash_config`.
    fn dspark_root(&self) -> Vec<(&'static str, Value)> {
        let mut v = vec![("block_size", json!(self.block_size))];
        if let Some(m) = &self.mask_token_id {
            v.push(("mask_token_id", m.clone()));
        }
        if let Some(r) = self.markov_rank {
            v.push(("markov_rank", json!(r)));
        }
        if let Some(t) = &self.markov_head_type {
            v.push(("markov_head_type", json!(t)));
        }
        if let Some((on, with_markov)) = self.confidence {
            v.push(("enable_confidence_head", json!(on)));
            v.push(("confidence_head_with_markov", json!(with_markov)));
        }
        // Always written: the layouts' defaults differ (vLLM/SGLang true, speculators false).
        v.push(("sample_from_anchor", json!(self.sample_from_anchor)));
        v
    }
}

/// A leading `model.` dropped (vLLM's DSpark/DFlash2 loaders prefix every name but `lm_head`
/// and `d2t` with their own; SGLang's strip it).
fn unprefixed(n: &str) -> String {
    n.strip_prefix("model.").unwrap_or(n).to_string()
}

/// Every source tensor, byte for byte, under its unprefixed name.
fn tensors(ck: &Checkpoint) -> Result<Vec<Planned>> {
    let mut out: Vec<Planned> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for t in ck.weights.infos() {
        let name = unprefixed(&t.name);
        if !seen.insert(name.clone()) {
            return Err(source_err(
                ck,
                format!("holds `{name}` both with and without the `model.` prefix"),
                "keep one of the two tensors (the engines read the name without `model.`)".into(),
            ));
        }
        out.push(Planned {
            name,
            dtype: t.dtype,
            shape: t.shape.clone(),
            source: Source::Copy(t.name.clone()),
        });
    }
    Ok(out)
}

/// The model keys of `cfg` (flattened): everything but the block, tap and head keys, the
/// architectures and the quantization config.
fn backbone(cfg: &Value) -> Map<String, Value> {
    let mut m = cfg.as_object().cloned().unwrap_or_default();
    for k in MOVED
        .iter()
        .chain(&["architectures", "quantization_config", "dflash_config"])
    {
        m.shift_remove(*k);
    }
    m
}

/// The architecture to write: the source's when `keep` names it, else `default`.
fn architecture(cfg: &Value, keep: &[&str], default: &str) -> Value {
    let first = cfg
        .pointer("/architectures/0")
        .and_then(Value::as_str)
        .filter(|a| keep.contains(a));
    json!([first.unwrap_or(default)])
}

/// Everything the config writers read.
struct Src<'a> {
    cfg: Value,
    keys: Keys,
    /// The taps as HF `hidden_states` indices.
    hs: Vec<i64>,
    target: Option<&'a Checkpoint>,
    steps: usize,
}

impl Src<'_> {
    /// The taps as outputs of 0-based layers (`target_layer_ids`).
    fn out_of(&self) -> Vec<i64> {
        self.hs.iter().map(|h| h - 1).collect()
    }

    /// `dflash_config` with the extras, the mask token and the taps.
    fn dflash_config(&self) -> Value {
        let mut dc = Value::Object(self.keys.extra.clone());
        if let Some(m) = &self.keys.mask_token_id {
            set(&mut dc, "mask_token_id", m.clone());
        }
        set(&mut dc, "target_layer_ids", json!(self.out_of()));
        dc
    }

    fn aux(&self, written: Vec<i64>, convention: AuxConvention, keys: &[&str]) -> AuxOut {
        AuxOut {
            hidden_states: self.hs.clone(),
            written,
            convention,
            keys: keys.iter().map(|k| k.to_string()).collect(),
        }
    }
}

/// vLLM's `Qwen3DSparkModel`: the DSpark keys at the root, the mask token and taps also in
/// `dflash_config` (as deepseek-ai/dspark_qwen3_8b_block7 ships them).
fn vllm_dspark(s: &Src) -> (Value, AuxOut) {
    let mut cfg = json!({"architectures": architecture(&s.cfg, &["Qwen3DSparkModel", "Qwen3OmniDSparkModel"], "Qwen3DSparkModel")});
    let m = cfg.as_object_mut().expect("object");
    m.extend(backbone(&s.cfg));
    m.entry("model_type").or_insert(json!("qwen3"));
    if let Some(n) = s.keys.num_target_layers {
        m.insert("num_target_layers".into(), json!(n));
    }
    for (k, v) in s.keys.dspark_root() {
        m.insert(k.into(), v);
    }
    m.insert("dflash_config".into(), s.dflash_config());
    let aux = s.aux(
        s.out_of(),
        AuxConvention::OutputOfLayer,
        &["dflash_config.target_layer_ids"],
    );
    (cfg, aux)
}

/// SpecForge/SGLang's `DSparkDraftModel`: `model_type` `qwen3` (vLLM renames the architecture to
/// `Qwen3DSparkModel` only then), the DSpark keys in `dflash_config` (SpecForge's home, read
/// first by SGLang) and copied at the root (where vLLM reads them). `sample_from_anchor` stays
/// at the root only: vLLM's DFlash speculator, which DSpark's extends, refuses
/// `dflash_config.sample_from_anchor: true`.
fn specforge_dspark(s: &Src, warnings: &mut Vec<String>) -> (Value, AuxOut) {
    let mut cfg = json!({"architectures": architecture(&s.cfg, &["DSparkDraftModel", "LingDSparkModel"], "DSparkDraftModel")});
    let m = cfg.as_object_mut().expect("object");
    m.extend(backbone(&s.cfg));
    match m.get("model_type").and_then(Value::as_str) {
        Some("qwen3") | None => {}
        Some(other) => warnings.push(format!(
            "model_type `{other}` written as `qwen3`: vLLM reads a `DSparkDraftModel` as the Qwen3 DSpark only with model_type qwen3 (vllm/config/speculative.py), and SGLang's DSparkDraftModel is the Qwen3 DFlash backbone"
        )),
    }
    m.insert("model_type".into(), json!("qwen3"));
    let mut dc = s.dflash_config();
    for (k, v) in s.keys.dspark_root() {
        if k != "sample_from_anchor" {
            set(&mut dc, k, v.clone());
        }
        m.insert(k.into(), v);
    }
    if let Some(n) = s.keys.num_target_layers {
        set(&mut dc, "num_target_layers", json!(n));
        m.insert("num_target_layers".into(), json!(n));
    }
    m.insert("dflash_config".into(), dc);
    let aux = s.aux(
        s.out_of(),
        AuxConvention::OutputOfLayer,
        &["dflash_config.target_layer_ids"],
    );
    (cfg, aux)
}

/// The speculators format: what `update_dspark` copies at the root, the taps raw in
/// `aux_hidden_state_layer_ids`, every other model key in `transformer_layer_config`, the
/// proposal (tokens per step) and the verifier in `speculators_config`.
fn speculators_dspark(s: &Src) -> (Value, AuxOut) {
    let mut inner = backbone(&s.cfg);
    inner.entry("model_type").or_insert(json!("qwen3"));
    if let Some(n) = s.keys.num_target_layers {
        inner.insert("num_target_layers".into(), json!(n));
    }
    if !s.keys.extra.is_empty() {
        inner.insert("dflash_config".into(), Value::Object(s.keys.extra.clone()));
    }
    let mut root = Map::new();
    root.insert(
        "architectures".into(),
        architecture(
            &s.cfg,
            &["Qwen3DSparkModel", "Qwen3OmniDSparkModel"],
            "Qwen3DSparkModel",
        ),
    );
    root.insert("speculators_model_type".into(), json!("dspark"));
    root.insert(
        "speculators_version".into(),
        json!(concat!("kquant-", env!("CARGO_PKG_VERSION"))),
    );
    for k in SPECULATORS_ROOT {
        if let Some(v) = inner.shift_remove(k) {
            root.insert(k.into(), v);
        }
    }
    for (k, v) in s.keys.dspark_root() {
        root.insert(k.into(), v);
    }
    root.insert("aux_hidden_state_layer_ids".into(), json!(s.hs));
    let verifier = match s.target {
        Some(t) => json!({
            "name_or_path": std::path::absolute(&t.weights.dir)
                .unwrap_or_else(|_| t.weights.dir.clone())
                .to_string_lossy(),
            "architectures": t.config.as_ref().map(|c| c.architectures()).unwrap_or_default(),
        }),
        None => json!({"name_or_path": null, "architectures": []}),
    };
    root.insert(
        "speculators_config".into(),
        json!({
            "algorithm": "dspark",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": s.steps}],
            "verifier": verifier,
        }),
    );
    root.insert("transformer_layer_config".into(), Value::Object(inner));
    let aux = s.aux(
        s.hs.clone(),
        AuxConvention::InputOfLayer,
        &["aux_hidden_state_layer_ids"],
    );
    (Value::Object(root), aux)
}

/// Inferact's `K3DSparkModel` for vLLM: the source's config with `num_target_layers` = the
/// number of taps (K3DSparkConfig requires it) and the taps in root `target_layer_ids`.
fn k3_dspark(s: &Src, warnings: &mut Vec<String>) -> (Value, AuxOut) {
    let mut cfg = s.cfg.clone();
    let taps = s.hs.len() as u64;
    if let Some(n) = s.keys.num_target_layers.filter(|&n| n != taps) {
        warnings.push(format!(
            "`num_target_layers` {n} written as {taps}: in a K3DSparkModel it counts the taps (K3DSparkConfig refuses any other value), where SpecForge/TorchSpec configs give the target's depth"
        ));
    }
    set(&mut cfg, "num_target_layers", json!(taps));
    set(&mut cfg, "target_layer_ids", json!(s.out_of()));
    let mut keys = vec!["target_layer_ids"];
    if cfg.pointer("/dflash_config/target_layer_ids").is_some() {
        let ids = json!(s.out_of());
        set(
            cfg.get_mut("dflash_config").expect("present"),
            "target_layer_ids",
            ids,
        );
        keys.push("dflash_config.target_layer_ids");
    }
    let aux = s.aux(s.out_of(), AuxConvention::OutputOfLayer, &keys);
    (cfg, aux)
}

/// DFlash2's one layout (vLLM's `DFlash2DraftModel`, SGLang's DFLASH worker with the same class
/// name and `dflash_config` keys): a speculators config flattened, the taps in
/// `dflash_config.target_layer_ids`.
fn dflash2(s: &Src) -> (Value, AuxOut) {
    let mut cfg = s.cfg.clone();
    set(
        &mut cfg,
        "architectures",
        architecture(&s.cfg, DFLASH2_ARCHITECTURES, "DFlash2DraftModel"),
    );
    if let Some(m) = cfg.as_object_mut() {
        for k in [
            "aux_hidden_state_layer_ids",
            "eagle_aux_hidden_state_layer_ids",
            "target_layer_ids",
            "sample_from_anchor",
        ] {
            m.shift_remove(k);
        }
        m.entry("model_type").or_insert(json!("qwen3"));
        m.entry("block_size").or_insert(json!(s.keys.block_size));
    }
    let mut dc = cfg.get("dflash_config").cloned().unwrap_or(json!({}));
    if let Some(m) = &s.keys.mask_token_id {
        set(&mut dc, "mask_token_id", m.clone());
    }
    set(&mut dc, "target_layer_ids", json!(s.out_of()));
    set(&mut cfg, "dflash_config", dc);
    let aux = s.aux(
        s.out_of(),
        AuxConvention::OutputOfLayer,
        &["dflash_config.target_layer_ids"],
    );
    (cfg, aux)
}

/// Proposals per step: DSpark's anchor-first block drafts `block_size` (every row predicts),
/// the 1+N layout (and DFlash2) `block_size` − 1; `--steps` may ask for fewer.
fn steps(ck: &Checkpoint, kind: Kind, keys: &Keys, asked: Option<usize>) -> Result<usize> {
    let anchor_first = kind == Kind::Dspark && keys.sample_from_anchor;
    let most = if anchor_first {
        keys.block_size
    } else {
        keys.block_size - 1
    } as usize;
    if most == 0 {
        return Err(source_err(
            ck,
            format!(
                "block_size {}: a 1+N block of that size proposes no token",
                keys.block_size
            ),
            "set `block_size` in its config.json to the block the drafter was trained with".into(),
        ));
    }
    match asked {
        Some(s) if s > most => Err(Error::Flags {
            msg: format!(
                "--steps {s}: this draft (block_size {}, {}) proposes at most {most} tokens per step",
                keys.block_size,
                if anchor_first { "anchor-first" } else { "1+N layout" }
            ),
            hint: format!("pass --steps between 1 and {most}, or leave it out for {most}"),
        }),
        Some(s) => Ok(s),
        None => Ok(most),
    }
}

/// Plan the conversion of a DSpark or DFlash2 draft (nothing is written).
/// `taps`: the source's as HF `hidden_states` indices (`super::source_taps`).
pub fn plan(
    ck: &Checkpoint,
    det: &Detection,
    target: Option<&Checkpoint>,
    o: &Options,
    (kind, taps): (Kind, Option<Vec<i64>>),
) -> Result<Plan> {
    let b = block_of(ck, det, kind)?;
    // `--aux-layers` replaces the config's taps: they are checked instead.
    let replaced = o.aux_layers.is_some();
    if let Some(c) = b.contradictions.iter().find(|c| !(c.taps && replaced)) {
        return Err(source_err(
            ck,
            format!("cannot be converted as written: {}", c.what),
            "fix its config.json (in a copy of the draft) so that its keys agree with each other, the vocabulary and the tensors, then convert again; `kquant inspect` lists every problem".into(),
        ));
    }
    if let (Some(ids), Some(conv)) = (&o.aux_layers, o.aux_convention) {
        let given = TapIds {
            ids,
            input_of_layer: Some(conv == AuxConvention::InputOfLayer),
        };
        if let Some(why) = taps_problem(b.layout, ck.config.as_ref(), given) {
            return Err(Error::Flags {
                msg: format!("--aux-layers: {why}"),
                hint: "name each target layer the drafter reads once, in increasing order, within the target's depth".into(),
            });
        }
    }
    let layout = written(kind, b.layout, o.engine)?;
    let hs = taps.ok_or_else(|| {
        source_err(
            ck,
            "names no taps (`dflash_config.target_layer_ids`, `target_layer_ids` or `aux_hidden_state_layer_ids`)".into(),
            "pass --aux-layers with --aux-convention to name the target layers the drafter reads".into(),
        )
    })?;
    let cfg = flatten_speculators(&config_value(ck));
    let keys = Keys::read(ck, kind, b, &cfg)?;
    let steps = steps(ck, kind, &keys, o.steps)?;
    let mut warnings = Vec::new();
    if keys.mask_token_id.is_none() {
        warnings.push("the config names no `mask_token_id`: SGLang refuses the draft (\"DSpark requires mask_token_id\") and vLLM has no mask row to embed".into());
    }
    let quant = cfg.get("quantization_config").cloned();
    let s = Src {
        cfg,
        keys,
        hs,
        target,
        steps,
    };
    let (mut config, aux) = match layout {
        Layout::Qwen3Dspark => vllm_dspark(&s),
        Layout::SpecforgeDspark => specforge_dspark(&s, &mut warnings),
        Layout::SpeculatorsDspark => speculators_dspark(&s),
        Layout::K3Dspark => k3_dspark(&s, &mut warnings),
        Layout::Dflash2 | Layout::Dflash2Mla => dflash2(&s),
    };
    if let Some(mut q) = quant {
        rename_quant_lists(&mut q, &unprefixed);
        set(&mut config, "quantization_config", q.clone());
        // vLLM builds a speculators draft's config from `transformer_layer_config`
        // (SpeculatorsConfig): its quantization config has to be there too.
        if let Some(inner) = config.get_mut("transformer_layer_config") {
            set(inner, "quantization_config", q);
        }
    }
    quantization_config_last(&mut config);
    let mut side_files = Vec::new();
    if let Some(mut hq) = read_hf_quant_config(ck)? {
        rename_quant_lists(&mut hq, &unprefixed);
        side_files.push(hf_quant_config_file(&hq));
    }
    if kind == Kind::Dspark && !s.keys.sample_from_anchor && o.engine == DraftLayout::Sglang {
        warnings.push(format!("the draft drafts the 1+N layout (`sample_from_anchor` false, written explicitly): SGLang's DSpark takes `block_size` as its gamma and verifies gamma + 1 tokens (dspark_config.py), so the launch line asks for --speculative-dspark-block-size {steps}"));
    }
    Ok(Plan {
        tensors: tensors(ck)?,
        dropped: Vec::new(),
        config,
        side_files,
        aux: Some(aux),
        warnings,
        steps,
        trtllm: None,
        launch: None,
        context_length: None,
        target: None,
        block: Some(BlockOut {
            layout,
            block_size: s.keys.block_size,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    /// Every (source layout, `--to`) pair: the layouts written, and a flag error (exit 2) for
    /// every other pair.
    #[test]
    fn written_covers_every_pair() {
        use DraftLayout as D;
        use Layout as L;
        let all = [
            L::Qwen3Dspark,
            L::K3Dspark,
            L::SpecforgeDspark,
            L::SpeculatorsDspark,
            L::Dflash2,
            L::Dflash2Mla,
        ];
        let mut ok = Vec::new();
        for from in all {
            let kind = if matches!(from, L::Dflash2 | L::Dflash2Mla) {
                Kind::Dflash2
            } else {
                Kind::Dspark
            };
            for &to in D::value_variants() {
                match written(kind, from, to) {
                    Ok(l) => ok.push((from, to, l)),
                    Err(e) => assert!(matches!(e, Error::Flags { .. }), "{from:?} {to:?}"),
                }
            }
        }
        let mut want = Vec::new();
        for from in [L::Qwen3Dspark, L::SpecforgeDspark, L::SpeculatorsDspark] {
            want.extend([
                (from, D::Sglang, L::SpecforgeDspark),
                (from, D::Vllm, L::Qwen3Dspark),
                (from, D::Specforge, L::SpecforgeDspark),
                (from, D::Speculators, L::SpeculatorsDspark),
            ]);
        }
        want.insert(4, (L::K3Dspark, D::Vllm, L::K3Dspark));
        want.extend([
            (L::Dflash2, D::Sglang, L::Dflash2),
            (L::Dflash2, D::Vllm, L::Dflash2),
        ]);
        assert_eq!(ok, want);
    }

    #[test]
    fn the_model_prefix_is_dropped_and_nothing_else() {
        assert_eq!(
            unprefixed("model.layers.0.mlp.up_proj.weight"),
            "layers.0.mlp.up_proj.weight"
        );
        assert_eq!(
            unprefixed("markov_head.markov_w1.weight"),
            "markov_head.markov_w1.weight"
        );
        assert_eq!(unprefixed("lm_head.weight"), "lm_head.weight");
    }
}
