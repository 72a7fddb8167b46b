//! Per-family name and config rewriting for `convert` (EAGLE-3 Llama/MLA, DFlash).

use serde_json::{json, Value};

use super::{
    dflash_block_size, quantization_config_last, rename_quant_lists, set, AuxOut, DraftLayout,
    Options, Plan, Planned, Source, TrtllmYaml,
};
use crate::checkpoint::{AuxConvention, Checkpoint, Detection, Dialect, Family};
use crate::error::{Error, Result};
use crate::io::{Dtype, TensorInfo};

const LAYER_PREFIXES: [&str; 2] = ["midlayer.", "layers.0."];

/// Names a target checkpoint may use for its embedding and head (Kimi-K2.5's wrapper adds
/// `language_model.`).
const TARGET_EMBED: [&str; 2] = [
    "model.embed_tokens.weight",
    "language_model.model.embed_tokens.weight",
];
const TARGET_HEAD: [&str; 2] = ["lm_head.weight", "language_model.lm_head.weight"];

fn find<'a>(ck: &'a Checkpoint, names: &[&str]) -> Option<&'a TensorInfo> {
    names.iter().find_map(|n| ck.weights.info(n))
}

/// Rename a layer tensor to `prefix`; top-level names are unchanged.
fn relayer(name: &str, prefix: &str) -> String {
    for p in LAYER_PREFIXES {
        if let Some(rest) = name.strip_prefix(p) {
            return format!("{prefix}{rest}");
        }
    }
    name.to_string()
}

fn has(ts: &[Planned], n: &str) -> bool {
    ts.iter().any(|p| p.name == n)
}

fn copy(t: &TensorInfo, name: String) -> Planned {
    Planned {
        name,
        dtype: t.dtype,
        shape: t.shape.clone(),
        source: Source::Copy(t.name.clone()),
    }
}

/// Target-side embedding / head, checked against the draft's shape.
fn from_target(
    target: Option<&Checkpoint>,
    names: &[&str],
    want: &[usize],
    what: &str,
) -> Result<Option<Planned>> {
    let Some(t) = target else { return Ok(None) };
    let Some(info) = find(t, names) else {
        return Err(Error::source(
            &t.weights.dir,
            format!("target has no {what} (looked for {})", names.join(", ")),
        ));
    };
    if info.shape != want {
        return Err(Error::source(
            &t.weights.dir,
            format!(
                "target {what} `{}` has shape {:?}, the draft needs {:?}",
                info.name, info.shape, want
            ),
        ));
    }
    Ok(Some(Planned {
        name: String::new(),
        dtype: info.dtype,
        shape: info.shape.clone(),
        source: Source::Target(info.name.clone()),
    }))
}

/// Flatten a vLLM speculators config into a plain draft config: the dimensions come from
/// `transformer_layer_config`, every other non-null top-level key is kept (top-level
/// `norm_before_fc` moves into `eagle_config`), the speculators bookkeeping is dropped.
pub(crate) fn flatten_speculators(cfg: &Value) -> Value {
    let Some(inner) = cfg
        .get("transformer_layer_config")
        .filter(|v| v.is_object())
    else {
        return cfg.clone();
    };
    let mut out = inner.clone();
    for (k, v) in cfg.as_object().into_iter().flatten() {
        if v.is_null()
            || matches!(
                k.as_str(),
                "transformer_layer_config"
                    | "speculators_model_type"
                    | "speculators_config"
                    | "speculators_version"
                    | "auto_map"
                    | "transformers_version"
            )
        {
            continue;
        }
        if k == "norm_before_fc" {
            let mut ec = out.get("eagle_config").cloned().unwrap_or(json!({}));
            set(&mut ec, "norm_before_fc", v.clone());
            set(&mut out, "eagle_config", ec);
            continue;
        }
        set(&mut out, k, v.clone());
    }
    out
}

/// Aux ids for an engine from HF hidden_states indices.
fn write_aux(
    cfg: &mut Value,
    engine: DraftLayout,
    dflash: bool,
    hs: &[i64],
    warnings: &mut Vec<String>,
) -> AuxOut {
    let out_of: Vec<i64> = hs.iter().map(|h| h - 1).collect();
    let (conv, ids, keys): (AuxConvention, Vec<i64>, Vec<&str>) = if dflash {
        match engine {
            DraftLayout::Torchspec => (
                AuxConvention::OutputOfLayer,
                out_of,
                vec!["target_layer_ids"],
            ),
            _ => {
                if engine == DraftLayout::Vllm {
                    warnings.push("vLLM's handling of DFlash target_layer_ids changed between releases (vLLM PR #56983 registers ids + 1): check that your vLLM version reads them as outputs of layer k".into());
                }
                (
                    AuxConvention::OutputOfLayer,
                    out_of,
                    vec!["dflash_config.target_layer_ids"],
                )
            }
        }
    } else {
        match engine {
            DraftLayout::Vllm => (
                AuxConvention::InputOfLayer,
                hs.to_vec(),
                vec![
                    "eagle_aux_hidden_state_layer_ids",
                    "eagle_config.eagle_aux_hidden_state_layer_ids",
                ],
            ),
            DraftLayout::Sglang => {
                // SGLang adds +1 to the ids; since PR #25454 only when the first id is 1 and
                // otherwise takes them as inputs of layer k. Output-of ids starting at 1 read
                // the same in both; anything else is written for current SGLang.
                if out_of.first() == Some(&1) {
                    (
                        AuxConvention::OutputOfLayer,
                        out_of,
                        vec!["eagle_config.eagle_aux_hidden_state_layer_ids"],
                    )
                } else {
                    warnings.push(format!(
                        "SGLang before PR #25454 adds +1 to every aux id; these taps (hidden_states {hs:?}) are written for current SGLang as inputs of layer k and would be read one layer off by older SGLang"
                    ));
                    (
                        AuxConvention::InputOfLayer,
                        hs.to_vec(),
                        vec!["eagle_config.eagle_aux_hidden_state_layer_ids"],
                    )
                }
            }
            DraftLayout::Eagle => {
                warnings.push(format!(
                    "the EAGLE reference hard-codes its taps (inputs of layers 2, N/2, N-3); this draft's taps are hidden_states {hs:?}: check they are those"
                ));
                (AuxConvention::InputOfLayer, hs.to_vec(), vec![])
            }
            _ => (
                AuxConvention::OutputOfLayer,
                out_of,
                vec!["eagle_config.eagle_aux_hidden_state_layer_ids"],
            ),
        }
    };
    // Record the convention so that kquant (and people) reading this output need not guess.
    // (Also where the engine hard-codes its taps, so a round trip through it keeps them.)
    set(
        cfg,
        "kquant",
        json!({"aux_layer_convention": conv.id(), "aux_hidden_states": hs}),
    );
    for k in &keys {
        match k.split_once('.') {
            Some((obj, key)) => {
                let mut o = cfg.get(obj).cloned().unwrap_or(json!({}));
                set(&mut o, key, json!(ids));
                set(cfg, obj, o);
            }
            None => set(cfg, k, json!(ids)),
        }
    }
    AuxOut {
        hidden_states: hs.to_vec(),
        written: ids,
        convention: conv,
        keys: keys.into_iter().map(String::from).collect(),
    }
}

/// What a plan reads: the source draft and what detection found in it, the target checkpoint
/// (a layout's embedding or lm_head may be copied from it), the options, and the aux-layer ids
/// to write.
pub struct Input<'a> {
    pub ck: &'a Checkpoint,
    pub det: &'a Detection,
    pub target: Option<&'a Checkpoint>,
    pub o: &'a Options,
    pub taps: Option<Vec<i64>>,
}

/// The source's config.json as a JSON object (`{}` without one).
pub(super) fn config_value(ck: &Checkpoint) -> Value {
    ck.config
        .as_ref()
        .map(|c| Value::Object(c.root.clone()))
        .unwrap_or(json!({}))
}

/// The source's `hidden_size`, which every plan needs.
fn hidden_size(ck: &Checkpoint, det: &Detection) -> Result<usize> {
    Ok(det
        .dims
        .hidden_size
        .ok_or_else(|| Error::source(&ck.weights.dir, "hidden_size unknown"))? as usize)
}

/// The source's `vocab_size`, where a tensor copied from the target needs it.
fn vocab_size(ck: &Checkpoint, vocab: Option<usize>) -> Result<usize> {
    vocab.ok_or_else(|| Error::source(&ck.weights.dir, "vocab_size unknown"))
}

/// Copy the target's embedding `[v, h]` as `embed_tokens.weight` when a target is given;
/// otherwise warn with `missing`.
fn embed_from_target(
    target: Option<&Checkpoint>,
    (v, h): (usize, usize),
    tensors: &mut Vec<Planned>,
    warnings: &mut Vec<String>,
    missing: String,
) -> Result<()> {
    match from_target(target, &TARGET_EMBED, &[v, h], "embedding")? {
        Some(mut p) => {
            p.name = "embed_tokens.weight".into();
            tensors.push(p);
        }
        None => warnings.push(missing),
    }
    Ok(())
}

/// A file written beside the weights: its name and bytes.
/// What both plans end with: the aux-layer ids written into `cfg`, the quantization config's
/// module lists renamed (and moved last), and `hf_quant_config.json` renamed alongside; the
/// plan of `tensors` (and the `dropped` ones) under that config, its `steps` and TensorRT-LLM
/// options left for the caller to set (and `place` the rest).
fn finish_plan(
    i: &Input,
    (tensors, dropped): (Vec<Planned>, Vec<(String, String)>),
    mut cfg: Value,
    dflash: bool,
    rename: &dyn Fn(&str) -> String,
    mut warnings: Vec<String>,
) -> Result<Plan> {
    let aux = i
        .taps
        .as_deref()
        .map(|hs| write_aux(&mut cfg, i.o.engine, dflash, hs, &mut warnings));
    if let Some(q) = cfg.get_mut("quantization_config") {
        rename_quant_lists(q, rename);
    }
    quantization_config_last(&mut cfg);
    let mut side_files = Vec::new();
    if let Some(mut hq) = read_hf_quant_config(i.ck)? {
        rename_quant_lists(&mut hq, rename);
        side_files.push(hf_quant_config_file(&hq));
    }
    Ok(Plan {
        tensors,
        dropped,
        config: cfg,
        side_files,
        aux,
        warnings,
        steps: 0,
        trtllm: None,
        launch: None,
        context_length: None,
        target: None,
        block: None,
    })
}

/// An EAGLE-3 draft's widths: its hidden size, the target's (one tap), the target vocabulary
/// and the draft's own (`pruned` when the two differ).
struct Widths {
    h: usize,
    ht: usize,
    vocab: Option<usize>,
    dv: Option<usize>,
    pruned: bool,
}

impl Widths {
    fn of(ck: &Checkpoint, det: &Detection) -> Result<Widths> {
        let d = &det.dims;
        let h = hidden_size(ck, det)?;
        let vocab = d.vocab_size.map(|v| v as usize);
        let dv = d.draft_vocab_size.map(|v| v as usize).or(vocab);
        Ok(Widths {
            h,
            ht: d.target_hidden_size.unwrap_or(h as u64) as usize,
            vocab,
            dv,
            pruned: matches!((dv, vocab), (Some(a), Some(b)) if a != b),
        })
    }
}

/// EAGLE-3 (Llama-style or MLA).
pub fn plan_eagle3(i: Input) -> Result<Plan> {
    let (ck, o, e) = (i.ck, i.o, i.o.engine);
    let mla = i.det.family == Family::Eagle3Mla;
    if ck.weights.names().any(|n| {
        (n.starts_with("layers.") && !n.starts_with("layers.0.")) || n.starts_with("midlayer.1")
    }) {
        return Err(Error::source(
            &ck.weights.dir,
            "has more than one decoder layer; multi-layer EAGLE-3 conversion is not supported yet",
        ));
    }
    let cfg_in = config_value(ck);
    let speculators = cfg_in.get("speculators_model_type").is_some();
    let mut cfg = flatten_speculators(&cfg_in);
    let wd = Widths::of(ck, i.det)?;
    let mut warnings = Vec::new();
    let (mut tensors, dropped) = eagle3_tensors(ck, e, &wd);
    eagle3_from_target(ck, i.target, e, &wd, &mut tensors, &mut warnings)?;

    // Config.
    let arch = match (mla, e) {
        (true, _) => "Eagle3DeepseekV2ForCausalLM",
        (false, DraftLayout::Eagle) => "LlamaForCausalLM",
        (false, _) => "LlamaForCausalLMEagle3",
    };
    set(&mut cfg, "architectures", json!([arch]));
    let mt = match mla {
        true => mla_model_type(o, &mut warnings),
        false => "llama".into(),
    };
    set(&mut cfg, "model_type", json!(mt));
    set(&mut cfg, "hidden_size", json!(wd.h));
    set(&mut cfg, "target_hidden_size", json!(wd.ht));
    if let Some(dv) = wd.dv {
        set(&mut cfg, "draft_vocab_size", json!(dv));
    }
    if let Some(v) = wd.vocab {
        set(&mut cfg, "vocab_size", json!(v));
    }
    eagle3_flags(&mut cfg, &cfg_in, i.det, e, speculators, &mut warnings);
    let prefix = e.eagle3_prefix();
    let parts = (tensors, dropped);
    let mut plan = finish_plan(&i, parts, cfg, false, &|n| relayer(n, prefix), warnings)?;
    plan.steps = o.steps.unwrap_or(3);
    plan.trtllm = (e == DraftLayout::Trtllm).then(|| {
        let cap: Option<Vec<i64>> = plan
            .aux
            .as_ref()
            .map(|a| a.hidden_states.iter().map(|h| h - 1).collect());
        if cap.is_none() {
            plan.warnings.push("no aux-layer ids in the source: TensorRT-LLM will capture its defaults {1, N/2-1, N-4}; pass --aux-layers to pin them".into());
        }
        TrtllmYaml {
            dflash: false,
            capture_output_of: cap,
        }
    });
    Ok(plan)
}

/// The source's tensors under the layout's names, and those the layout does not take (with
/// why).
fn eagle3_tensors(
    ck: &Checkpoint,
    e: DraftLayout,
    wd: &Widths,
) -> (Vec<Planned>, Vec<(String, String)>) {
    let (h, ht, pruned) = (wd.h, wd.ht, wd.pruned);
    let mut tensors = Vec::new();
    let mut dropped = Vec::new();
    let prefix = e.eagle3_prefix();
    for t in ck.weights.infos() {
        let name = relayer(&t.name, prefix);
        let keep: std::result::Result<Planned, &str> = match t.name.as_str() {
            "embed_tokens.weight" => match e {
                DraftLayout::Vllm | DraftLayout::Torchspec => Ok(copy(t, name)),
                DraftLayout::Trtllm | DraftLayout::Sglang if ht != h => Ok(copy(t, name)),
                DraftLayout::Sglang => Err("SGLang replaces the draft embedding with the target's"),
                DraftLayout::Trtllm => Err("TensorRT-LLM shares the target's embedding when target_hidden_size == hidden_size"),
                _ => Err("this layout takes the embedding from the target"),
            },
            "t2d" => match e {
                DraftLayout::Specforge | DraftLayout::Eagle => Ok(copy(t, name)),
                DraftLayout::Torchspec if pruned => Ok(copy(t, name)),
                _ => Err("no engine reads t2d"),
            },
            "d2t" => match e {
                DraftLayout::Trtllm if !pruned => Err("TensorRT-LLM reads d2t only when the draft vocab differs from the target's"),
                DraftLayout::Torchspec if !pruned => Err("TorchSpec writes d2t only for a pruned draft vocab"),
                DraftLayout::Trtllm if t.dtype != Dtype::I32 => {
                    Ok(Planned { name, dtype: Dtype::I32, shape: t.shape.clone(), source: Source::CastInt(t.name.clone()) })
                }
                DraftLayout::Trtllm => Ok(copy(t, name)),
                _ if t.dtype != Dtype::I64 => {
                    Ok(Planned { name, dtype: Dtype::I64, shape: t.shape.clone(), source: Source::CastInt(t.name.clone()) })
                }
                _ => Ok(copy(t, name)),
            },
            _ => Ok(copy(t, name)),
        };
        match keep {
            Ok(p) => tensors.push(p),
            Err(why) => dropped.push((t.name.clone(), why.to_string())),
        }
    }
    (tensors, dropped)
}

/// What the layout reads and the source lacks: the vocab maps (t2d from d2t), the embedding
/// and the lm_head (the target's, when it is given).
fn eagle3_from_target(
    ck: &Checkpoint,
    target: Option<&Checkpoint>,
    e: DraftLayout,
    wd: &Widths,
    tensors: &mut Vec<Planned>,
    warnings: &mut Vec<String>,
) -> Result<()> {
    let (h, ht, pruned, vocab, dv) = (wd.h, wd.ht, wd.pruned, wd.vocab, wd.dv);
    let w = &ck.weights;
    // Vocab maps an engine reads but the source lacks.
    if pruned
        && matches!(
            e,
            DraftLayout::Specforge | DraftLayout::Eagle | DraftLayout::Torchspec
        )
        && !has(tensors, "t2d")
    {
        if let (Some(d2t), Some(v)) = (w.info("d2t"), vocab) {
            tensors.push(Planned {
                name: "t2d".into(),
                dtype: Dtype::BOOL,
                shape: vec![v],
                source: Source::T2dFromD2t {
                    d2t: d2t.name.clone(),
                    vocab: v,
                },
            });
        }
    }
    if pruned && !w.names().any(|n| n == "d2t") {
        return Err(Error::source(
            &ck.weights.dir,
            format!(
                "draft vocab {} differs from vocab {} but there is no d2t",
                dv.unwrap_or(0),
                vocab.unwrap_or(0)
            ),
        ));
    }
    // Embedding for layouts that carry it.
    if (matches!(e, DraftLayout::Torchspec) || (matches!(e, DraftLayout::Trtllm) && ht != h))
        && !has(tensors, "embed_tokens.weight")
    {
        embed_from_target(
            target,
            (vocab_size(ck, vocab)?, h),
            tensors,
            warnings,
            format!(
                "{} expects the draft to carry embed_tokens and the source has none: pass --target-checkpoint <target checkpoint or hub id> to copy it",
                e.id()
            ),
        )?;
    }
    // lm_head for layouts that need their own. TensorRT-LLM shares the target's when the draft
    // has none, but ModelOpt's export always writes one (the base model's): do the same when
    // the target is at hand.
    if !has(tensors, "lm_head.weight") && (e != DraftLayout::Trtllm || target.is_some()) {
        let v = vocab_size(ck, vocab)?;
        match from_target(target, &TARGET_HEAD, &[v, h], "lm_head")? {
            Some(mut p) => {
                p.name = "lm_head.weight".into();
                if pruned {
                    let Source::Target(n) = p.source else { unreachable!() };
                    p.shape = vec![dv.unwrap(), h];
                    p.source = Source::TargetRows { name: n, d2t: "d2t".into() };
                }
                tensors.push(p);
            }
            None => warnings.push(format!(
                "the draft has no lm_head: {} needs one (vLLM before `has_own_lm_head` and SGLang with draft_vocab_size fail); pass --target-checkpoint to copy the target's",
                e.id()
            )),
        }
    }
    Ok(())
}

/// The `model_type` an MLA draft is written with (`--model-type`, else what the layout's
/// engine loads), with a warning where the engine may not load it.
fn mla_model_type(o: &Options, warnings: &mut Vec<String>) -> String {
    let e = o.engine;
    // vLLM 0.33.0 reads an EAGLE-3 draft with model_type deepseek_v3 as DeepSeek MTP and
    // refuses it; every SGLang release loads deepseek_v3 (≤ 0.5.11 rejects kimi_k2).
    let mt = o.model_type.clone().unwrap_or_else(|| {
        match e {
            DraftLayout::Sglang => "deepseek_v3",
            _ => "kimi_k2",
        }
        .into()
    });
    if let Some(server) = e.serving() {
        let facts = crate::engines::layout::ConfigFacts {
            model_type: Some(&mt),
            speculators: false,
        };
        let dialect = if e.eagle3_prefix() == "layers.0." {
            Dialect::Vllm
        } else {
            Dialect::Specforge
        };
        if let Some(c) =
            crate::engines::layout::claim(&Family::Eagle3Mla, Some(dialect), facts, server)
                .filter(|c| c.loads != crate::engines::Loads::Yes)
        {
            warnings.push(format!(
                "model_type `{mt}`: {} ({}) {}: {}",
                server.name(),
                c.checked_with,
                match c.loads {
                    crate::engines::Loads::No => "does not load it",
                    _ => "may not load it",
                },
                c.why
            ));
        }
    }
    mt
}

/// The flags whose defaults differ between engines, written explicitly; `norm_output` carried
/// as a behaviour; `eagle_config`; the keys of other tools removed.
fn eagle3_flags(
    cfg: &mut Value,
    cfg_in: &Value,
    det: &Detection,
    e: DraftLayout,
    speculators: bool,
    warnings: &mut Vec<String>,
) {
    // Flags whose defaults differ between engines, written explicitly.
    let flag =
        |c: &Value, k: &str, default: bool| c.get(k).and_then(Value::as_bool).unwrap_or(default);
    let nbr = flag(cfg_in, "norm_before_residual", speculators);
    let fc_norm = flag(cfg, "fc_norm", false);
    set(cfg, "norm_before_residual", json!(nbr));
    set(cfg, "fc_norm", json!(fc_norm));
    // `norm_output` means two things: in SpecForge/TorchSpec "logits from norm(h)" (default
    // true, every standard draft), in TensorRT-LLM/vLLM/speculators (EAGLE-3.1) "feed the
    // post-norm hidden state back" (default false). Carry the behaviour, not the key.
    let post_norm = crate::checkpoint::detect::eagle3_feeds_post_norm(det, cfg_in);
    if let Some(m) = cfg.as_object_mut() {
        m.shift_remove("norm_output");
    }
    match (post_norm, e) {
        (true, DraftLayout::Vllm | DraftLayout::Trtllm) => set(cfg, "norm_output", json!(true)),
        (true, _) => warnings.push(format!(
            "the source feeds the post-norm hidden state back (EAGLE-3.1 norm_output); {} has no key for that, so the draft will run with the pre-norm state",
            e.id()
        )),
        _ => {}
    }
    let mut ec = cfg.get("eagle_config").cloned().unwrap_or(json!({}));
    let nbf = ec
        .get("norm_before_fc")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    set(&mut ec, "norm_before_fc", json!(nbf));
    set(&mut ec, "use_aux_hidden_state", json!(true));
    if e == DraftLayout::Trtllm && ec.get("next_layer_regular").is_none() {
        set(&mut ec, "next_layer_regular", json!(true));
    }
    if let Some(m) = ec.as_object_mut() {
        m.shift_remove("eagle_aux_hidden_state_layer_ids");
    }
    set(cfg, "eagle_config", ec);
    if let Some(m) = cfg.as_object_mut() {
        m.shift_remove("eagle_aux_hidden_state_layer_ids");
        for k in [
            "speculators_model_type",
            "speculators_config",
            "speculators_version",
            "transformer_layer_config",
        ] {
            m.shift_remove(k);
        }
        if e != DraftLayout::Torchspec {
            m.shift_remove("_torchspec_version");
        }
    }
    if e == DraftLayout::Torchspec && cfg.get("_torchspec_version").is_none() {
        set(
            cfg,
            "_torchspec_version",
            json!(concat!("kquant-", env!("CARGO_PKG_VERSION"))),
        );
    }
}

/// `hf_quant_config.json` in the bytes `quantize --format modelopt` (and ModelOpt itself,
/// Python's `json.dump(indent=4)`) writes, so that converting a quantized draft and quantizing
/// a converted one give the same file.
pub(super) fn hf_quant_config_file(hq: &Value) -> (String, Vec<u8>) {
    (
        "hf_quant_config.json".into(),
        crate::quant::modelopt::python_json_indent4(hq),
    )
}

pub(super) fn read_hf_quant_config(ck: &Checkpoint) -> Result<Option<Value>> {
    let p = ck.weights.dir.join("hf_quant_config.json");
    if !p.is_file() {
        return Ok(None);
    }
    let bytes =
        crate::io::text::read_regular(&p, crate::io::text::MAX_CONFIG, "hf_quant_config.json")?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::Config {
            path: p,
            msg: format!("not valid JSON: {e}"),
        })
}

/// DFlash: z-lab names (shared by SGLang, vLLM, SpecForge) ↔ TorchSpec names.
pub fn plan_dflash(i: Input) -> Result<Plan> {
    let (ck, det, o, e) = (i.ck, i.det, i.o, i.o.engine);
    let torchspec = e == DraftLayout::Torchspec;
    const MAP: [(&str, &str); 3] = [
        ("context_proj.", "fc."),
        ("context_norm.", "hidden_norm."),
        ("final_norm.", "norm."),
    ];
    // Tensor names (`fc.weight`) and module names (`fc`, in quantization configs).
    let rename = |n: &str| -> String {
        for (ts, zl) in MAP {
            let (from, to) = if torchspec { (zl, ts) } else { (ts, zl) };
            if let Some(rest) = n.strip_prefix(from) {
                return format!("{to}{rest}");
            }
            if Some(n) == from.strip_suffix('.') {
                return to.trim_end_matches('.').to_string();
            }
        }
        n.to_string()
    };
    let mut tensors = Vec::new();
    let mut dropped = Vec::new();
    let mut warnings = Vec::new();
    for t in ck.weights.infos() {
        match t.name.as_str() {
            "embed_tokens.weight" if !torchspec => dropped.push((
                t.name.clone(),
                "DFlash engines take the embedding from the target".into(),
            )),
            "lm_head.weight" => dropped.push((
                t.name.clone(),
                "DFlash drafters use the target's lm_head".into(),
            )),
            _ => tensors.push(copy(t, rename(&t.name))),
        }
    }
    let h = hidden_size(ck, det)?;
    if torchspec && !has(&tensors, "embed_tokens.weight") {
        let v = vocab_size(ck, det.dims.vocab_size.map(|v| v as usize))?;
        embed_from_target(
            i.target,
            (v, h),
            &mut tensors,
            &mut warnings,
            "TorchSpec's DFlash carries its own frozen embed_tokens: pass --target-checkpoint to copy the target's".into(),
        )?;
    }
    let mut cfg = flatten_speculators(&config_value(ck));
    if let Some(m) = cfg.as_object_mut() {
        m.shift_remove("aux_hidden_state_layer_ids");
    }
    let mask = cfg
        .pointer("/dflash_config/mask_token_id")
        .or_else(|| cfg.get("mask_token_id"))
        .cloned();
    set(&mut cfg, "architectures", json!(["DFlashDraftModel"]));
    if let Some(m) = cfg.as_object_mut() {
        m.shift_remove("target_layer_ids");
        m.shift_remove("mask_token_id");
    }
    if torchspec {
        set(&mut cfg, "model_type", json!("dflash"));
        if let Some(m) = mask {
            set(&mut cfg, "mask_token_id", m);
        }
        set(
            &mut cfg,
            "target_hidden_size",
            json!(det.dims.target_hidden_size.unwrap_or(h as u64)),
        );
        // TorchSpec keeps no dflash_config: a block size there moves to the top level.
        if let Some(b) = dflash_block_size(&cfg) {
            set(&mut cfg, "block_size", json!(b));
        }
        if let Some(m) = cfg.as_object_mut() {
            m.shift_remove("dflash_config");
        }
        if cfg.get("_torchspec_version").is_none() {
            set(
                &mut cfg,
                "_torchspec_version",
                json!(concat!("kquant-", env!("CARGO_PKG_VERSION"))),
            );
        }
    } else {
        set(&mut cfg, "model_type", json!("qwen3"));
        let mut dc = cfg.get("dflash_config").cloned().unwrap_or(json!({}));
        if let Some(m) = mask {
            set(&mut dc, "mask_token_id", m);
        }
        if let Some(m) = dc.as_object_mut() {
            m.shift_remove("target_layer_ids");
        }
        set(&mut cfg, "dflash_config", dc);
        if dflash_block_size(&cfg).is_none() {
            set(&mut cfg, "block_size", json!(16));
            warnings.push(format!(
                "the source's config.json has neither `dflash_config.block_size` nor `block_size`: wrote `block_size` 16 (z-lab's default), and the launch line follows it; if the drafter was trained with another block size, add `\"block_size\": B` at the top level of {} (kquant reads `dflash_config.block_size` first, then `block_size`) and convert again",
                config_json(ck).display()
            ));
        }
        if let Some(m) = cfg.as_object_mut() {
            m.shift_remove("_torchspec_version");
        }
    }
    let mut plan = finish_plan(&i, (tensors, dropped), cfg, true, &rename, warnings)?;
    plan.steps = dflash_steps(ck, &plan.config, e, o.steps)?;
    plan.trtllm = (e == DraftLayout::Trtllm).then_some(TrtllmYaml {
        dflash: true,
        capture_output_of: None,
    });
    Ok(plan)
}

/// The source's `config.json` (where a user edits the block size).
fn config_json(ck: &Checkpoint) -> std::path::PathBuf {
    ck.weights
        .config_path
        .clone()
        .unwrap_or_else(|| ck.weights.dir.join("config.json"))
}

/// The key of the source's config.json the block size came from: `dflash_config.block_size`
/// when it is set (read first, as [`dflash_block_size`] does), else the top-level `block_size`.
fn block_size_key(ck: &Checkpoint) -> &'static str {
    let nested = ck
        .config
        .as_ref()
        .and_then(|c| c.root.get("dflash_config"))
        .and_then(|d| d.get("block_size"))
        .and_then(Value::as_u64);
    if nested.is_some() {
        "dflash_config.block_size"
    } else {
        "block_size"
    }
}

/// Tokens a DFlash draft proposes per step: `block_size` − 1 (one block is the last accepted
/// token and `block_size` − 1 masked positions), or fewer with `--steps`. vLLM's
/// `num_speculative_tokens` and TensorRT-LLM's `max_draft_len` are this number; SGLang's
/// `--speculative-num-draft-tokens` is the block it runs, this number + 1.
fn dflash_steps(
    ck: &Checkpoint,
    cfg: &Value,
    e: DraftLayout,
    steps: Option<usize>,
) -> Result<usize> {
    let Some(block) = dflash_block_size(cfg) else {
        // Only a TorchSpec output of a source without a block size: no launch line.
        return Ok(steps.unwrap_or(15));
    };
    let most = block.saturating_sub(1) as usize;
    if most == 0 && (steps.is_some() || e.serving().is_some()) {
        return Err(Error::Source {
            path: ck.weights.dir.clone(),
            msg: format!("block_size {block}: a DFlash draft proposes block_size - 1 tokens per step, so none"),
            hint: Some(format!(
                "set `{}` in {} to the block size the drafter was trained with (z-lab's default is 16)",
                block_size_key(ck),
                config_json(ck).display()
            )),
        });
    }
    match steps {
        Some(s) if s > most => Err(Error::Flags {
            msg: format!(
                "--steps {s}: this DFlash draft has block_size {block}, so it proposes at most {most} tokens per step"
            ),
            hint: format!(
                "pass --steps between 1 and {most}, or leave it out for {most} (the whole block)"
            ),
        }),
        Some(s) => Ok(s),
        None => Ok(most),
    }
}
