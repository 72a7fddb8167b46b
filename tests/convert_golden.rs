//! `kquant convert` against the outputs of the reference exporters themselves
//! (fixtures/goldens/convert/<tool>-<version>/<case>/, made on CPU by
//! fixtures/gen/convert/make_*_golden.py with pinned versions; each case's README.md says how):
//!
//! - SpecForge 0.2.0 `specforge export --to sglang|hf` (EAGLE-3 Llama, DFlash),
//! - nvidia-modelopt 0.47.0 `export_speculative_decoding` (EAGLE-3 Llama with a pruned and a full
//!   vocab, EAGLE-3 MLA `kimik2`, DFlash),
//! - speculators 0.9.0 `speculators convert --algorithm eagle3|dflash` (the speculators format vLLM
//!   loads).
//!
//! TorchSpec's `convert_to_hf.py` is not on PyPI (the `torchspec` name there is an empty
//! placeholder), so it has no golden here.
//!
//! For every golden, `kquant convert` runs on the same draft the reference exporter got
//! (`<case>/src/`, in the layout kquant reads) with the matching `--to`, and its output is compared
//! with the reference output: tensor names, dtypes, shapes and bytes; the config keys engines read
//! (in the engine's view: a speculators config's `transformer_layer_config` merged in as vLLM does,
//! transformers 5's `dtype` and `rope_parameters` read as `torch_dtype`, `rope_theta` and
//! `rope_scaling`, `null` as absent); the aux-layer taps; side files. Every difference is listed
//! per case with its value on both sides and why; anything else must be equal. A difference is a
//! documented choice, never a known kquant bug: a bug is fixed, not listed.
//!
//! The goldens are then read back as sources (`inspect` and `convert` to the original layout),
//! which must give the source's tensors and taps again.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{kquant, load, read_json, root, Tensors};
use serde_json::{Map, Value};

const TARGET: &str = "fixtures/goldens/convert/target-llama";

/// A directory under `fixtures/goldens/convert/`.
fn golden(rel: &str) -> PathBuf {
    common::golden("convert").join(rel)
}

fn inspect_json(dir: &Path) -> Value {
    common::kquant_json(&["inspect", dir.to_str().unwrap(), "--json"])
}

/// Where a tensor only the golden has comes from.
enum Origin {
    /// The source tensor of that name (byte for byte).
    Src(&'static str),
    /// The target's tensor of that name (byte for byte).
    Target(&'static str),
}

/// A config difference: (key, ours, reference, why).
type Dev = (&'static str, &'static str, &'static str, &'static str);

/// One golden and what kquant is expected to write differently.
struct Case {
    golden: &'static str,
    kind: &'static str,
    to: &'static str,
    with_target: bool,
    /// Tensors only the reference writes: (name, what it is, why kquant does not).
    only_golden: &'static [(&'static str, Origin, &'static str)],
    /// Tensors kquant writes in another dtype, values equal: (name, ours, golden).
    dtypes: &'static [(&'static str, &'static str, &'static str)],
    /// Config keys (engine view, dotted) that differ: (key, ours, golden, why); values are JSON,
    /// `-` is absent.
    config: Vec<Dev>,
    /// The golden's taps as HF `hidden_states` indices: (its key, offset to add).
    taps: (&'static str, i64),
}

// Why-strings shared by several cases.
const EXPLICIT: &str = "kquant writes the flags whose defaults differ between engines explicitly";
const KQ: &str = "kquant records the taps it wrote (ignored by engines)";
const THS: &str = "kquant writes target_hidden_size explicitly (= hidden_size)";
const BIAS: &str = "absent in the source; every engine defaults it to false";

const MODELOPT_EAGLE_CONFIG: [Dev; 5] = [
    ("eagle_config.parallel_draft_heads_num_layers", "-", "1", "ModelOpt template key; no engine reads it"),
    ("eagle_config.parallel_draft_step", "-", "1", "ModelOpt template key; no engine reads it"),
    ("eagle_config.use_input_layernorm_in_first_layer", "-", "true", "ModelOpt training key (TensorRT-LLM reads next_layer_regular, norm_before_fc, eh_proj_before_attn, return_hidden_post_norm)"),
    ("eagle_config.use_last_layernorm", "-", "true", "ModelOpt training key; the draft has `norm` either way"),
    ("eagle_config.use_mtp_layernorm", "-", "false", "ModelOpt training key; no engine reads it"),
];

fn cases() -> Vec<Case> {
    let mut v = vec![
        Case {
            golden: "specforge-0.2.0/eagle3-sglang",
            kind: "eagle3",
            to: "sglang",
            with_target: false,
            only_golden: &[("t2d", Origin::Src("t2d"), "docs/formats.md: no engine reads t2d; SpecForge's exporter lists it as required (`_REQUIRED_SERVING_KEYS`) but SGLang skips it")],
            dtypes: &[],
            config: vec![
                ("attention_bias", "-", "false", BIAS),
                ("mlp_bias", "-", "false", BIAS),
                ("eagle_config.norm_before_fc", "false", "-", EXPLICIT),
                ("fc_norm", "false", "-", EXPLICIT),
                ("norm_before_residual", "false", "-", EXPLICIT),
                ("target_hidden_size", "64", "-", THS),
                ("kquant.aux_hidden_states", "[2,4,5]", "-", KQ),
                ("kquant.aux_layer_convention", "\"output-of-layer\"", "-", KQ),
            ],
            taps: ("eagle_config.eagle_aux_hidden_state_layer_ids", 1),
        },
        Case {
            golden: "specforge-0.2.0/eagle3-hf",
            kind: "eagle3",
            to: "specforge",
            with_target: true,
            only_golden: &[("embed_tokens.weight", Origin::Target("model.embed_tokens.weight"), "kquant's `specforge` is SpecForge's training layout (docs/formats.md: embed_tokens dropped); `specforge export --to hf` makes a self-contained directory with the target's embedding")],
            dtypes: &[],
            config: vec![
                ("attention_bias", "-", "false", BIAS),
                ("mlp_bias", "-", "false", BIAS),
                ("eagle_config.norm_before_fc", "false", "-", EXPLICIT),
                ("fc_norm", "false", "-", EXPLICIT),
                ("norm_before_residual", "false", "-", EXPLICIT),
                ("target_hidden_size", "64", "-", THS),
                ("kquant.aux_hidden_states", "[2,4,5]", "-", KQ),
                ("kquant.aux_layer_convention", "\"output-of-layer\"", "-", KQ),
            ],
            taps: ("eagle_config.eagle_aux_hidden_state_layer_ids", 1),
        },
        Case {
            golden: "specforge-0.2.0/dflash-hf",
            kind: "dflash",
            to: "specforge",
            with_target: false,
            only_golden: &[],
            dtypes: &[],
            config: vec![
                ("draft_vocab_size", "-", "256", "SpecForge's config loader fills draft_vocab_size = vocab_size; DFlash engines default it the same"),
                ("hidden_act", "-", "\"silu\"", "absent in the source; Qwen3 default"),
                ("max_position_embeddings", "-", "32768", "absent in the source; Qwen3 default"),
                ("tie_word_embeddings", "-", "false", "absent in the source; DFlash drafts own no embedding"),
                ("kquant.aux_hidden_states", "[2,5]", "-", KQ),
                ("kquant.aux_layer_convention", "\"output-of-layer\"", "-", KQ),
            ],
            taps: ("dflash_config.target_layer_ids", 1),
        },
        Case {
            golden: "modelopt-0.47.0/eagle3-llama",
            kind: "eagle3",
            to: "trtllm",
            with_target: false,
            only_golden: &[],
            dtypes: &[("d2t", "I32", "I64")],
            config: vec![
                ("attention_bias", "-", "false", BIAS),
                ("mlp_bias", "-", "false", BIAS),
                ("eagle_config.norm_before_fc", "false", "-", EXPLICIT),
                ("fc_norm", "false", "-", EXPLICIT),
                ("norm_before_residual", "false", "-", EXPLICIT),
                ("target_hidden_size", "64", "-", THS),
                ("kquant.aux_hidden_states", "[2,4,5]", "-", KQ),
                ("kquant.aux_layer_convention", "\"output-of-layer\"", "-", KQ),
            ],
            taps: ("eagle_config.eagle_aux_hidden_state_layer_ids", 1),
        },
        Case {
            golden: "modelopt-0.47.0/eagle3-llama-fullvocab",
            kind: "eagle3",
            to: "trtllm",
            with_target: true,
            only_golden: &[],
            dtypes: &[],
            config: vec![
                ("attention_bias", "-", "false", BIAS),
                ("mlp_bias", "-", "false", BIAS),
                ("eagle_config.norm_before_fc", "false", "-", EXPLICIT),
                ("fc_norm", "false", "-", EXPLICIT),
                ("norm_before_residual", "false", "-", EXPLICIT),
                ("target_hidden_size", "64", "-", THS),
                ("kquant.aux_hidden_states", "[2,4,5]", "-", KQ),
                ("kquant.aux_layer_convention", "\"output-of-layer\"", "-", KQ),
            ],
            taps: ("eagle_config.eagle_aux_hidden_state_layer_ids", 1),
        },
        Case {
            golden: "modelopt-0.47.0/eagle3-kimik2",
            kind: "eagle3",
            to: "trtllm",
            with_target: false,
            only_golden: &[],
            dtypes: &[("d2t", "I32", "I64")],
            config: vec![
                ("attention_bias", "-", "false", BIAS),
                ("draft_vocab_size", "128", "-", "ModelOpt's kimik2 template has no draft_vocab_size, so TensorRT-LLM would take vocab_size (256) against a 128-row lm_head and d2t; kquant writes it"),
                ("eagle_config.norm_before_fc", "false", "-", EXPLICIT),
                ("fc_norm", "false", "-", EXPLICIT),
                ("norm_before_residual", "false", "-", EXPLICIT),
                ("target_hidden_size", "64", "-", THS),
                ("kquant.aux_hidden_states", "[2,4,5]", "-", KQ),
                ("kquant.aux_layer_convention", "\"output-of-layer\"", "-", KQ),
            ],
            taps: ("eagle_config.eagle_aux_hidden_state_layer_ids", 1),
        },
        Case {
            golden: "modelopt-0.47.0/dflash",
            kind: "dflash",
            to: "zlab",
            with_target: false,
            only_golden: &[],
            dtypes: &[],
            config: vec![
                ("auto_map.AutoModel", "\"dflash.DFlashDraftModel\"", "-", "kept from the z-lab source (z-lab's remote code); ModelOpt's template has none"),
                ("dflash_config.causal", "-", "false", "absent in the source (z-lab drafts are bidirectional within a block); ModelOpt always writes it"),
                ("hidden_act", "-", "\"silu\"", "absent in the source; Qwen3 default"),
                ("tie_word_embeddings", "-", "false", "absent in the source; DFlash drafts own no embedding"),
                ("kquant.aux_hidden_states", "[2,5]", "-", KQ),
                ("kquant.aux_layer_convention", "\"output-of-layer\"", "-", KQ),
            ],
            taps: ("dflash_config.target_layer_ids", 1),
        },
        Case {
            golden: "speculators-0.9.0/eagle3",
            kind: "eagle3",
            to: "vllm",
            with_target: false,
            only_golden: &[("t2d", Origin::Src("t2d"), "docs/formats.md: no engine reads t2d (vLLM skips it)")],
            dtypes: &[],
            config: vec![
                ("architectures", "[\"LlamaForCausalLMEagle3\"]", "[\"Eagle3Speculator\"]", "kquant writes vLLM's native config, not the speculators format (vLLM maps both to its Eagle3 Llama model)"),
                ("speculators_model_type", "-", "\"eagle3\"", "speculators format marker"),
                ("attention_bias", "-", "false", BIAS),
                ("mlp_bias", "-", "false", BIAS),
                ("eagle_config.eagle_aux_hidden_state_layer_ids", "[2,4,5]", "-", "kquant writes vLLM's ids top-level and nested (docs/formats.md)"),
                ("eagle_config.use_aux_hidden_state", "true", "-", EXPLICIT),
                ("eagle_config.norm_before_fc", "false", "-", "kquant writes norm_before_fc under eagle_config (where TensorRT-LLM reads it), speculators at top level; both false"),
                ("norm_before_fc", "-", "false", "see eagle_config.norm_before_fc"),
                ("norm_output", "-", "false", "speculators writes false; kquant omits it, false being the default where the key means EAGLE-3.1 post-norm feedback"),
                ("target_hidden_size", "64", "-", "speculators writes null (= hidden_size); kquant the value"),
                ("kquant.aux_hidden_states", "[2,4,5]", "-", KQ),
                ("kquant.aux_layer_convention", "\"input-of-layer\"", "-", KQ),
            ],
            taps: ("eagle_aux_hidden_state_layer_ids", 0),
        },
        Case {
            golden: "speculators-0.9.0/eagle3-noids",
            kind: "eagle3",
            to: "vllm",
            with_target: false,
            only_golden: &[("t2d", Origin::Src("t2d"), "docs/formats.md: no engine reads t2d (vLLM skips it)")],
            dtypes: &[],
            config: vec![
                ("architectures", "[\"LlamaForCausalLMEagle3\"]", "[\"Eagle3Speculator\"]", "kquant writes vLLM's native config, not the speculators format"),
                ("speculators_model_type", "-", "\"eagle3\"", "speculators format marker"),
                ("attention_bias", "-", "false", BIAS),
                ("mlp_bias", "-", "false", BIAS),
                ("eagle_aux_hidden_state_layer_ids", "[2,4,5]", "-", "speculators writes null unless given the ids (vLLM then falls back to the target's defaults); kquant converts the source's SpecForge ids"),
                ("eagle_config.eagle_aux_hidden_state_layer_ids", "[2,4,5]", "-", "kquant writes vLLM's ids top-level and nested"),
                ("eagle_config.use_aux_hidden_state", "true", "-", EXPLICIT),
                ("eagle_config.norm_before_fc", "false", "-", "kquant writes norm_before_fc under eagle_config, speculators at top level; both false"),
                ("norm_before_fc", "-", "false", "see eagle_config.norm_before_fc"),
                ("norm_output", "-", "false", "speculators writes false; kquant omits it, false being the default where the key means EAGLE-3.1 post-norm feedback"),
                ("target_hidden_size", "64", "-", "speculators writes null (= hidden_size); kquant the value"),
                ("kquant.aux_hidden_states", "[2,4,5]", "-", KQ),
                ("kquant.aux_layer_convention", "\"input-of-layer\"", "-", KQ),
            ],
            taps: ("", 0),
        },
        Case {
            golden: "speculators-0.9.0/dflash",
            kind: "dflash",
            to: "vllm",
            with_target: false,
            only_golden: &[],
            dtypes: &[],
            config: vec![
                ("speculators_model_type", "-", "\"dflash\"", "kquant writes the z-lab config vLLM also loads, not the speculators format"),
                ("aux_hidden_state_layer_ids", "-", "[2,4]", "speculators' taps (hidden_states indices); kquant writes the same taps as z-lab's dflash_config.target_layer_ids [1,3] (outputs of layers)"),
                ("dflash_config.target_layer_ids", "[1,3]", "-", "see aux_hidden_state_layer_ids"),
                ("mask_token_id", "-", "255", "speculators keeps it top-level, z-lab under dflash_config"),
                ("dflash_config.mask_token_id", "255", "-", "see mask_token_id"),
                ("auto_map.AutoModel", "\"dflash.DFlashDraftModel\"", "-", "kept from the z-lab source; speculators points auto_map at its own config class (not an engine key)"),
                ("num_target_layers", "5", "-", "kept from the z-lab source; speculators drops it"),
                ("draft_vocab_size", "-", "256", "speculators writes draft_vocab_size = vocab_size; DFlash engines default it the same"),
                ("hidden_act", "-", "\"silu\"", "absent in the source; Qwen3 default"),
                ("max_position_embeddings", "-", "32768", "absent in the source; Qwen3 default"),
                ("tie_word_embeddings", "-", "false", "absent in the source; DFlash drafts own no embedding"),
                ("kquant.aux_hidden_states", "[2,4]", "-", KQ),
                ("kquant.aux_layer_convention", "\"output-of-layer\"", "-", KQ),
            ],
            taps: ("aux_hidden_state_layer_ids", 0),
        },
    ];
    // The ModelOpt EAGLE exports all carry ModelOpt's eagle_config template.
    for c in v
        .iter_mut()
        .filter(|c| c.golden.starts_with("modelopt-0.47.0/eagle3"))
    {
        c.config.extend(MODELOPT_EAGLE_CONFIG);
    }
    v
}

/// Config keys engines read (besides every key kquant writes, which is always compared).
const ENGINE_KEYS: &[&str] = &[
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_hidden_layers",
    "hidden_act",
    "rms_norm_eps",
    "vocab_size",
    "draft_vocab_size",
    "target_hidden_size",
    "max_position_embeddings",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "torch_dtype",
    "rope_theta",
    "rope_scaling.type",
    "rope_scaling.factor",
    "rope_scaling.original_max_position_embeddings",
    "rope_scaling.beta_fast",
    "rope_scaling.beta_slow",
    "rope_scaling.mscale",
    "rope_scaling.mscale_all_dim",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "eagle_aux_hidden_state_layer_ids",
    "eagle_config.eagle_aux_hidden_state_layer_ids",
    "eagle_config.use_aux_hidden_state",
    "eagle_config.next_layer_regular",
    "eagle_config.norm_before_fc",
    "eagle_config.use_input_layernorm_in_first_layer",
    "eagle_config.use_last_layernorm",
    "eagle_config.use_mtp_layernorm",
    "eagle_config.parallel_draft_step",
    "eagle_config.parallel_draft_heads_num_layers",
    "eagle_config.eh_proj_before_attn",
    "eagle_config.return_hidden_post_norm",
    "norm_before_residual",
    "norm_before_fc",
    "fc_norm",
    "norm_output",
    "block_size",
    "dflash_config.mask_token_id",
    "dflash_config.target_layer_ids",
    "dflash_config.causal",
    "dflash_config.use_swa",
    "mask_token_id",
    "target_layer_ids",
    "aux_hidden_state_layer_ids",
    "num_target_layers",
    "layer_types",
    "sliding_window",
    "speculators_model_type",
];

/// A config as an engine reads it, flattened to dotted keys (see the module comment).
fn engine_view(cfg: &Value) -> BTreeMap<String, Value> {
    view(cfg, true)
}

/// `engine_view`, with a speculators `transformer_layer_config` merged in or not (engines that
/// do not know the speculators format do not).
fn view(cfg: &Value, speculators: bool) -> BTreeMap<String, Value> {
    let mut c = cfg.as_object().expect("config object").clone();
    if let (true, Some(Value::Object(inner))) = (speculators, c.get("transformer_layer_config")) {
        let mut merged = inner.clone();
        c.remove("transformer_layer_config");
        merged.extend(c);
        c = merged;
    }
    if let Some(v) = c.remove("dtype") {
        c.entry("torch_dtype").or_insert(v);
    }
    if let Some(Value::Object(rp)) = c.remove("rope_parameters") {
        if let Some(t) = rp.get("rope_theta") {
            c.entry("rope_theta").or_insert(t.clone());
        }
        let kind = rp.get("rope_type").and_then(Value::as_str);
        if !matches!(kind, None | Some("default")) && !c.contains_key("rope_scaling") {
            let mut rs = rp.clone();
            rs.remove("rope_theta");
            c.insert("rope_scaling".into(), Value::Object(rs));
        }
    }
    if let Some(Value::Object(rs)) = c.get("rope_scaling").cloned() {
        let mut rs = rs;
        if let Some(t) = rs.remove("rope_type") {
            rs.entry("type").or_insert(t);
        }
        rs.remove("rope_theta");
        let default = matches!(
            rs.get("type").and_then(Value::as_str),
            None | Some("default")
        );
        if default && rs.len() <= 1 {
            c.remove("rope_scaling");
        } else {
            c.insert("rope_scaling".into(), Value::Object(rs));
        }
    }
    let mut out = BTreeMap::new();
    flatten(&c, "", &mut out);
    out
}

fn flatten(m: &Map<String, Value>, prefix: &str, out: &mut BTreeMap<String, Value>) {
    for (k, v) in m {
        match v {
            Value::Null => {}
            Value::Object(o) if !o.is_empty() => flatten(o, &format!("{prefix}{k}."), out),
            Value::Object(_) => {}
            v => {
                out.insert(format!("{prefix}{k}"), v.clone());
            }
        }
    }
}

fn parse(s: &str) -> Option<Value> {
    (s != "-").then(|| serde_json::from_str(s).unwrap())
}

fn show(v: Option<&Value>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

/// `kquant convert KIND SRC -o <tmp>/out --to TO …`, which must succeed: (tmp, out, stderr).
fn convert(
    kind: &str,
    src: &Path,
    to: &str,
    extra: &[&str],
) -> (tempfile::TempDir, PathBuf, String) {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let mut a = vec![
        "convert",
        kind,
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--to",
        to,
    ];
    a.extend_from_slice(extra);
    let o = kquant(&a);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "kquant {a:?}: {err}");
    (t, out, err)
}

fn run_case(c: &Case) -> (tempfile::TempDir, PathBuf) {
    let g = golden(c.golden);
    let extra: &[&str] = if c.with_target {
        &["--target-checkpoint", TARGET]
    } else {
        &[]
    };
    let (t, out, _) = convert(c.kind, &g.join("src"), c.to, extra);
    (t, out)
}

fn int_values(dtype: &str, b: &[u8]) -> Vec<i64> {
    match dtype {
        "I64" => b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        "I32" => b
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        d => panic!("{d} is not an integer dtype"),
    }
}

fn check_tensors(c: &Case, ours: &Tensors) {
    let g = golden(c.golden);
    let theirs = load(&g.join("model.safetensors"));
    let src = load(&g.join("src/model.safetensors"));
    let target = load(&root().join(TARGET).join("model.safetensors"));
    let label = c.golden;
    let extra: Vec<&String> = ours.keys().filter(|k| !theirs.contains_key(*k)).collect();
    assert!(
        extra.is_empty(),
        "{label}: tensors only kquant writes: {extra:?}"
    );
    let mut missing: Vec<&str> = theirs
        .keys()
        .filter(|k| !ours.contains_key(*k))
        .map(String::as_str)
        .collect();
    missing.sort();
    let mut want: Vec<&str> = c.only_golden.iter().map(|(n, _, _)| *n).collect();
    want.sort();
    assert_eq!(missing, want, "{label}: tensors only the reference writes");
    for (name, origin, _) in c.only_golden {
        let (what, from) = match origin {
            Origin::Src(n) => ("source", &src[*n]),
            Origin::Target(n) => ("target", &target[*n]),
        };
        assert!(
            theirs[*name] == *from,
            "{label}: the reference's `{name}` is not the {what}'s"
        );
    }
    for (name, (dt, shape, data)) in &theirs {
        let Some((odt, oshape, odata)) = ours.get(name) else {
            continue;
        };
        assert_eq!(oshape, shape, "{label}: `{name}` shape");
        if let Some((_, o, t)) = c.dtypes.iter().find(|(n, _, _)| n == name) {
            assert_eq!(
                (odt.as_str(), dt.as_str()),
                (*o, *t),
                "{label}: `{name}` dtypes"
            );
            assert_eq!(
                int_values(odt, odata),
                int_values(dt, data),
                "{label}: `{name}` values"
            );
            continue;
        }
        assert_eq!(odt, dt, "{label}: `{name}` dtype");
        if odata != data {
            let n = odata.iter().zip(data).filter(|(a, b)| a != b).count();
            panic!("{label}: `{name}`: {n} of {} bytes differ", data.len());
        }
    }
}

fn check_config(c: &Case, ours_cfg: &Value) {
    let theirs_cfg = read_json(&golden(c.golden).join("config.json"));
    let (ours, theirs) = (engine_view(ours_cfg), engine_view(&theirs_cfg));
    let mut keys: Vec<&str> = ENGINE_KEYS.to_vec();
    keys.extend(ours.keys().map(String::as_str));
    keys.sort();
    keys.dedup();
    let mut got = Vec::new();
    for k in keys {
        let (o, t) = (ours.get(k), theirs.get(k));
        if o != t {
            got.push((k.to_string(), show(o), show(t)));
        }
    }
    let want: Vec<(String, String, String)> = c
        .config
        .iter()
        .map(|(k, o, t, _)| {
            (
                k.to_string(),
                show(parse(o).as_ref()),
                show(parse(t).as_ref()),
            )
        })
        .collect();
    let (mut got_s, mut want_s) = (got.clone(), want.clone());
    got_s.sort();
    want_s.sort();
    if got_s != want_s {
        let unexpected: Vec<_> = got_s.iter().filter(|d| !want_s.contains(d)).collect();
        let not_seen: Vec<_> = want_s.iter().filter(|d| !got_s.contains(d)).collect();
        panic!(
            "{}: config differs from the reference other than listed\n  (key, ours, reference) not listed: {unexpected:#?}\n  listed but not seen: {not_seen:#?}",
            c.golden
        );
    }
}

/// The golden's taps (HF hidden_states indices) equal the ones kquant wrote.
fn check_taps(c: &Case, ours_cfg: &Value) {
    let theirs = engine_view(&read_json(&golden(c.golden).join("config.json")));
    let ours: Vec<i64> = serde_json::from_value(ours_cfg["kquant"]["aux_hidden_states"].clone())
        .unwrap_or_else(|_| panic!("{}: kquant.aux_hidden_states", c.golden));
    let (key, offset) = c.taps;
    if key.is_empty() {
        // The reference wrote no ids: the source's (SpecForge [1,3,4], outputs of layers).
        let src = read_json(&golden(c.golden).join("src/config.json"));
        let ids: Vec<i64> =
            serde_json::from_value(src["eagle_config"]["eagle_aux_hidden_state_layer_ids"].clone())
                .unwrap();
        assert_eq!(
            ours,
            ids.iter().map(|i| i + 1).collect::<Vec<_>>(),
            "{}",
            c.golden
        );
        return;
    }
    let ids: Vec<i64> = serde_json::from_value(theirs[key].clone()).unwrap();
    assert_eq!(
        ours,
        ids.iter().map(|i| i + offset).collect::<Vec<_>>(),
        "{}: taps (`{key}` in the reference)",
        c.golden
    );
}

#[test]
fn every_golden_matches_but_for_the_listed_differences() {
    for c in cases() {
        let (_t, out) = run_case(&c);
        check_tensors(&c, &load(&out.join("model.safetensors")));
        let cfg = read_json(&out.join("config.json"));
        check_config(&c, &cfg);
        check_taps(&c, &cfg);
    }
}

/// The TensorRT-LLM YAML captures the layers the ModelOpt export names, and `--to modelopt`
/// is `--to trtllm`.
#[test]
fn trtllm_yaml_captures_the_modelopt_layers() {
    for c in cases().iter().filter(|c| c.to == "trtllm") {
        let (_t, out) = run_case(c);
        let yaml = std::fs::read_to_string(out.join("extra-llm-api-config.yml")).unwrap();
        let g = read_json(&golden(c.golden).join("config.json"));
        let ids: Vec<String> = g["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.to_string())
            .collect();
        let want = format!("eagle3_layers_to_capture: [{}]", ids.join(", "));
        assert!(yaml.contains(&want), "{}: {yaml}", c.golden);
        let (_t2, alias, _) = convert(
            c.kind,
            &golden(c.golden).join("src"),
            "modelopt",
            if c.with_target {
                &["--target-checkpoint", TARGET]
            } else {
                &[]
            },
        );
        assert_eq!(
            load(&alias.join("model.safetensors")),
            load(&out.join("model.safetensors")),
            "{}: --to modelopt tensors",
            c.golden
        );
        assert_eq!(
            read_json(&alias.join("config.json")),
            read_json(&out.join("config.json")),
            "{}: --to modelopt config",
            c.golden
        );
    }
}

type ReadBack = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
);

/// Every reference output, read back by kquant: detected as the right family and dialect with
/// the right taps, and converted to the source's layout gives the source's tensors again.
#[test]
fn goldens_read_back_as_sources() {
    // (golden, family, dialect, --to for the way back, source tensors not expected back); every
    // one taps hidden_states [2, 4, 5].
    let cases: &[ReadBack] = &[
        (
            "specforge-0.2.0/eagle3-sglang",
            "eagle3",
            "specforge",
            "specforge",
            &[],
        ),
        (
            "specforge-0.2.0/eagle3-hf",
            "eagle3",
            "specforge",
            "specforge",
            &[],
        ),
        (
            "modelopt-0.47.0/eagle3-llama",
            "eagle3",
            "vllm",
            "specforge",
            &[],
        ),
        // TorchSpec carries its own embedding; without --target-checkpoint it cannot come back.
        (
            "modelopt-0.47.0/eagle3-kimik2",
            "eagle3-mla",
            "vllm",
            "torchspec",
            &["embed_tokens.weight"],
        ),
        (
            "speculators-0.9.0/eagle3",
            "eagle3",
            "vllm",
            "specforge",
            &[],
        ),
    ];
    for &(g, family, dialect, back, not_back) in cases {
        let dir = golden(g);
        let j = inspect_json(&dir);
        assert_eq!(
            (j["family"].as_str(), j["dialect"].as_str()),
            (Some(family), Some(dialect)),
            "{g}"
        );
        assert_eq!(
            j["aux_layers"]["hidden_states"],
            serde_json::json!([2, 4, 5]),
            "{g}: taps"
        );
        let (_t, out, _) = convert("eagle3", &dir, back, &[]);
        let (ours, mut src) = (
            load(&out.join("model.safetensors")),
            load(&dir.join("src/model.safetensors")),
        );
        for n in not_back {
            src.remove(*n);
        }
        assert_eq!(
            ours.keys().collect::<Vec<_>>(),
            src.keys().collect::<Vec<_>>(),
            "{g} -> {back}: names"
        );
        for (n, t) in &src {
            assert!(
                ours[n] == *t,
                "{g} -> {back}: `{n}` differs from the source"
            );
        }
        let cfg = read_json(&out.join("config.json"));
        let want = read_json(&dir.join("src/config.json"));
        assert_eq!(
            cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
            want["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
            "{g} -> {back}: ids"
        );
    }
    // DFlash: ModelOpt's and SpecForge's exports are z-lab drafts.
    for g in ["modelopt-0.47.0/dflash", "specforge-0.2.0/dflash-hf"] {
        let dir = golden(g);
        let j = inspect_json(&dir);
        assert_eq!(
            (j["family"].as_str(), j["dialect"].as_str()),
            (Some("dflash"), Some("zlab")),
            "{g}"
        );
        let (_t, out, _) = convert("dflash", &dir, "zlab", &[]);
        assert_eq!(
            load(&out.join("model.safetensors")),
            load(&dir.join("src/model.safetensors")),
            "{g}"
        );
        assert_eq!(
            read_json(&out.join("config.json"))["dflash_config"]["target_layer_ids"],
            read_json(&dir.join("src/config.json"))["dflash_config"]["target_layer_ids"],
            "{g}"
        );
    }
}

/// TensorRT-LLM (`Eagle3DraftModel`: `return_hidden_post_norm or norm_output`, default false) and
/// vLLM / speculators (EAGLE 3.1 flag, default false) read `norm_output` as "feed the post-norm
/// hidden state back". SpecForge's `norm_output` (default true) only means "logits from norm(h)",
/// which every engine does anyway. The ModelOpt export (TensorRT-LLM layout) writes no
/// `norm_output`, speculators writes `false`; kquant writes `true` for a SpecForge-layout source
/// without the key (`norm_output = flag(cfg, "norm_output", true)` in src/convert/names.rs) and
/// also for a speculators source that says `false` (`flatten_speculators` does not carry the
/// top-level `norm_output`, `fc_norm` and `norm_before_fc`).
/// (Regression test: these goldens found kquant writing `norm_output: true` here; fixed.)
#[test]
fn norm_output_is_not_turned_on_for_trtllm_and_vllm() {
    let mut bad = Vec::new();
    for c in cases()
        .iter()
        .filter(|c| matches!(c.to, "trtllm" | "vllm") && c.kind == "eagle3")
    {
        let (_t, out) = run_case(c);
        let v = read_json(&out.join("config.json"))["norm_output"].clone();
        let want = read_json(&golden(c.golden).join("config.json"))["norm_output"]
            .as_bool()
            .unwrap_or(false);
        if v.as_bool().unwrap_or(false) != want {
            bad.push(format!(
                "{} --to {}: norm_output {v}, reference {want}",
                c.golden, c.to
            ));
        }
    }
    // A speculators draft that says norm_output false, going to TensorRT-LLM.
    let (_t, out, _) = convert("eagle3", &golden("speculators-0.9.0/eagle3"), "trtllm", &[]);
    let v = read_json(&out.join("config.json"))["norm_output"].clone();
    if v.as_bool().unwrap_or(false) {
        bad.push(format!(
            "speculators-0.9.0/eagle3 (norm_output false) --to trtllm: norm_output {v}"
        ));
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// speculators' DFlash format (`speculators_model_type: dflash`, dims in
/// `transformer_layer_config`, taps in top-level `aux_hidden_state_layer_ids` as hidden_states
/// indices, top-level `mask_token_id`) is what `speculators convert --algorithm dflash` writes for
/// vLLM. kquant detects it as a z-lab draft, finds no taps and writes a z-lab config with no
/// `dflash_config.target_layer_ids`, no top-level dimensions and the speculators keys left in.
/// (Regression test: these goldens found kquant misreading this format; fixed.)
#[test]
fn speculators_dflash_is_read() {
    let g = golden("speculators-0.9.0/dflash");
    let mut bad = Vec::new();
    let taps = inspect_json(&g)["aux_layers"]["hidden_states"].clone();
    if taps != serde_json::json!([2, 4]) {
        bad.push(format!("inspect: taps {taps}, want [2, 4]"));
    }
    let (_t, out, _) = convert("dflash", &g, "zlab", &[]);
    assert_eq!(
        load(&out.join("model.safetensors")),
        load(&g.join("src/model.safetensors"))
    );
    // As z-lab, SGLang and vLLM's z-lab path read it: top-level keys only.
    let (ours, src) = (
        view(&read_json(&out.join("config.json")), false),
        view(&read_json(&g.join("src/config.json")), false),
    );
    for k in [
        "architectures",
        "model_type",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
        "block_size",
        "dflash_config.target_layer_ids",
        "dflash_config.mask_token_id",
    ] {
        if ours.get(k) != src.get(k) {
            bad.push(format!(
                "{k}: ours {} source {}",
                show(ours.get(k)),
                show(src.get(k))
            ));
        }
    }
    let raw = read_json(&out.join("config.json"));
    for k in [
        "speculators_model_type",
        "transformer_layer_config",
        "speculators_config",
    ] {
        if raw.get(k).is_some() {
            bad.push(format!("{k} left in a z-lab config"));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}
