//! The Kimi-Linear hyper-parameters, read from `config.json` as moonshotai/Kimi-Linear-48B-A3B's
//! own file writes them (`linear_attn_config`, `num_experts`, `num_experts_per_token`,
//! `moe_renormalize`, …) or as transformers 5.23's `KimiLinearConfig` saves them (`layer_types`,
//! `linear_num_heads`, …). The MLA and MoE parts become a [`DsConfig`] the DeepSeek-V3 blocks run
//! (no RoPE: `mla_use_nope`); the KDA part is [`Kda`].

use serde_json::{Map, Value};

use crate::checkpoint::Config;
use crate::error::{Error, Result};
use crate::runtime::deepseek::config::{DsConfig, LATENT_EPS};
use crate::runtime::rope::Rope;

/// The most decoder layers a config may declare.
pub const MAX_LAYERS: usize = 4096;
/// The most floats one KDA layer's recurrent state may hold (heads · head_dim²; the real model's
/// is 32 · 128² = 524288).
pub const MAX_KDA_STATE: usize = 1 << 26;
/// The longest short convolution.
pub const MAX_CONV: usize = 64;

/// What mixes tokens in one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mixer {
    /// Kimi Delta Attention (linear attention, a recurrent state).
    Kda,
    /// Multi-head latent attention (softmax attention, a KV cache).
    Mla,
}

/// The KDA layers' dimensions (`linear_attn_config`).
#[derive(Debug, Clone, PartialEq)]
pub struct Kda {
    pub heads: usize,
    pub head_dim: usize,
    /// `short_conv_kernel_size`.
    pub conv: usize,
    /// Kimi-K3's `gate_lower_bound` `L` (`g = L · sigmoid(…)`); Kimi-Linear's softplus gate
    /// when none.
    pub lower_bound: Option<f32>,
    /// Kimi-K3's `use_full_rank_gate`: the output gate is one `g_proj`, not `g_b(g_a x)`.
    pub full_rank_gate: bool,
    /// The gated output norm's eps: `rms_norm_eps` in Kimi-Linear; in K3 vLLM's
    /// `FusedRMSNormGated` default, 1e-5 (`vllm/third_party/flash_linear_attention/ops/kda.py`).
    pub o_norm_eps: f32,
}

impl Kda {
    /// `heads · head_dim`: the width of q, k, v, the gates and the output.
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }
}

/// Everything the forward needs besides the weights.
#[derive(Debug, Clone)]
pub struct KlConfig {
    /// The MLA attention, the MoE and the shared sizes, as the DeepSeek-V3 blocks read them.
    pub ds: DsConfig,
    pub kda: Kda,
    /// One entry per layer, 0-based.
    pub mixers: Vec<Mixer>,
}

impl KlConfig {
    /// Read and check; errors name the key and the file.
    pub fn read(cfg: &Config) -> Result<KlConfig> {
        read(cfg.text(), cfg, false).map_err(|msg| Error::Config {
            path: cfg.path.clone(),
            msg,
        })
    }
}

/// The text config `t` read; `k3` admits Kimi-K3's KDA variants (the bounded gate and the
/// full-rank output gate) that a Kimi-Linear read refuses, and takes the latent norms' eps
/// from `rms_norm_eps` as vLLM's K3 MLA does (Kimi-Linear's transformers code uses 1e-6).
pub(crate) fn read(
    t: &Map<String, Value>,
    cfg: &Config,
    k3: bool,
) -> std::result::Result<KlConfig, String> {
    let get = |k: &str| t.get(k).filter(|v| !v.is_null());
    // Bounded before anything is sized from it (#38.11/12), as the DeepSeek config does.
    let uint_in = |m: &Map<String, Value>, k: &str| -> std::result::Result<Option<usize>, String> {
        match m.get(k).filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(v) => {
                let x = v
                    .as_u64()
                    .ok_or_else(|| format!("`{k}` must be a non-negative integer, found {v}"))?;
                let max = match k {
                    "max_position_embeddings" | "model_max_length" => {
                        crate::runtime::deepseek::config::MAX_POSITIONS
                    }
                    _ => crate::checkpoint::detect::MAX_DIM,
                };
                if x > max {
                    return Err(format!("`{k}` is {x}; kquant runs values up to {max}"));
                }
                Ok(Some(x as usize))
            }
        }
    };
    let uint = |k: &str| uint_in(t, k);
    // The first of several spellings that is present.
    let any = |ks: &[&str]| -> std::result::Result<Option<usize>, String> {
        for k in ks {
            if let Some(v) = uint(k)? {
                return Ok(Some(v));
            }
        }
        Ok(None)
    };
    let need = |ks: &[&str]| any(ks)?.ok_or_else(|| format!("`{}` is missing", ks[0]));
    let num = |k: &str, d: f64| get(k).and_then(Value::as_f64).unwrap_or(d);
    let flag = |ks: &[&str], d: bool| {
        ks.iter()
            .find_map(|k| get(k).and_then(Value::as_bool))
            .unwrap_or(d)
    };
    if !flag(&["mla_use_nope"], true) {
        return Err("`mla_use_nope` is false: Kimi-Linear's MLA with RoPE is not supported (the model's own code asserts it is true)".into());
    }
    if let Some(f) = get("moe_router_activation_func")
        .and_then(Value::as_str)
        .filter(|f| *f != "sigmoid")
    {
        return Err(format!(
            "`moe_router_activation_func` is `{f}`; the Kimi-Linear router scores with a sigmoid"
        ));
    }
    if let Some(f) = uint("moe_layer_freq")?.filter(|f| *f != 1) {
        return Err(format!(
            "`moe_layer_freq` is {f}; only every layer from `first_k_dense_replace` on being MoE (1) is supported"
        ));
    }
    let layers = need(&["num_hidden_layers"])?;
    // The layer pattern is a table of one entry a layer, made before any weight is read: a
    // hostile count is refused here, not allocated (a real model has tens of layers).
    if layers == 0 || layers > MAX_LAYERS {
        return Err(format!(
            "`num_hidden_layers` is {layers}: must be in 1..={MAX_LAYERS}"
        ));
    }
    let lac = get("linear_attn_config").and_then(Value::as_object);
    let empty = Map::new();
    let la = lac.unwrap_or(&empty);
    let rms_eps = num("rms_norm_eps", 1e-6) as f32;
    let (lower_bound, full_rank_gate, o_norm_eps) = k3_gates(la, k3, rms_eps)?;
    let kda = Kda {
        heads: uint_in(la, "num_heads")?
            .or(uint("linear_num_heads")?)
            .ok_or("`linear_attn_config.num_heads` is missing")?,
        head_dim: uint_in(la, "head_dim")?
            .or(uint("linear_head_dim")?)
            .ok_or("`linear_attn_config.head_dim` is missing")?,
        conv: uint_in(la, "short_conv_kernel_size")?
            .or(uint("linear_conv_kernel_dim")?)
            .unwrap_or(4),
        lower_bound,
        full_rank_gate,
        o_norm_eps,
    };
    if kda.heads == 0 || kda.head_dim == 0 || kda.conv == 0 {
        return Err("the KDA heads, head_dim and short_conv_kernel_size must be > 0".into());
    }
    // The recurrent state is heads · head_dim² floats a layer, the conv state conv · 3 · width:
    // both sized from these numbers before any weight is read.
    let state = kda
        .heads
        .checked_mul(kda.head_dim)
        .and_then(|w| w.checked_mul(kda.head_dim.max(3 * kda.conv)));
    if state.is_none_or(|n| n > MAX_KDA_STATE) || kda.conv > MAX_CONV {
        return Err(format!(
            "`linear_attn_config` heads {} × head_dim {} (short_conv_kernel_size {}) is past what a KDA layer can hold (state ≤ {MAX_KDA_STATE} floats, kernel ≤ {MAX_CONV})",
            kda.heads, kda.head_dim, kda.conv
        ));
    }
    let mixers = mixers(t, la, layers)?;
    let max_pos = any(&["model_max_length", "max_position_embeddings"])?.unwrap_or(4096);
    let nope = need(&["qk_nope_head_dim"])?;
    let rope_dim = need(&["qk_rope_head_dim"])?;
    let eos = crate::runtime::deepseek::config::eos_ids(get("eos_token_id"))?;
    let ds = DsConfig {
        hidden: need(&["hidden_size"])?,
        vocab: need(&["vocab_size"])?,
        layers,
        heads: need(&["num_attention_heads"])?,
        q_lora: uint("q_lora_rank")?,
        kv_lora: need(&["kv_lora_rank"])?,
        nope,
        rope_dim,
        v_dim: need(&["v_head_dim"])?,
        inter: need(&["intermediate_size"])?,
        moe_inter: need(&["moe_intermediate_size"])?,
        experts: need(&["num_experts", "num_local_experts", "n_routed_experts"])?,
        shared: any(&["num_shared_experts", "n_shared_experts"])?.unwrap_or(0),
        top_k: need(&["num_experts_per_token", "num_experts_per_tok"])?,
        n_group: any(&["num_expert_group", "n_group"])?.unwrap_or(1),
        topk_group: uint("topk_group")?.unwrap_or(1),
        norm_topk: flag(&["moe_renormalize", "norm_topk_prob"], true),
        routed_scale: num("routed_scaling_factor", 1.0) as f32,
        first_dense: uint("first_k_dense_replace")?.unwrap_or(0),
        eps: num("rms_norm_eps", 1e-6) as f32,
        latent_eps: if k3 {
            num("rms_norm_eps", 1e-6) as f32
        } else {
            LATENT_EPS
        },
        nope_only: true,
        tie: cfg
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        interleave: false,
        // Never applied (`nope_only`); a table of the right width keeps the type whole.
        rope: Rope::plain(rope_dim.max(2), 10000.0),
        scale: (1.0 / ((nope + rope_dim) as f64).sqrt()) as f32,
        eos,
        max_pos,
    };
    ds.check()?;
    Ok(KlConfig { ds, kda, mixers })
}

/// Kimi-K3's KDA gates from `linear_attn_config`: `gate_lower_bound` and `use_full_rank_gate`,
/// refused (named) when reading a Kimi-Linear config (`k3` false); and the output norm's eps
/// (`rms_eps`, K3's fixed 1e-5).
fn k3_gates(
    la: &Map<String, Value>,
    k3: bool,
    rms_eps: f32,
) -> std::result::Result<(Option<f32>, bool, f32), String> {
    for k in [
        "gate_lower_bound",
        "lower_bound",
        "safe_gate",
        "use_full_rank_gate",
    ] {
        if !k3
            && la
                .get(k)
                .is_some_and(|v| !v.is_null() && v != &Value::Bool(false))
        {
            return Err(format!(
                "`linear_attn_config.{k}` is set: the lower-bounded KDA gate is not supported (Kimi-Linear has none)"
            ));
        }
    }
    let lower_bound = match la.get("gate_lower_bound").filter(|v| !v.is_null()) {
        None => None,
        Some(v) => match v.as_f64() {
            Some(x) if x < 0.0 && x.is_finite() => Some(x as f32),
            _ => {
                return Err(format!(
                    "`linear_attn_config.gate_lower_bound` is {v}: a negative number"
                ))
            }
        },
    };
    let full = la.get("use_full_rank_gate").and_then(Value::as_bool);
    let o_norm_eps = if k3 { 1e-5 } else { rms_eps };
    Ok((lower_bound, full.unwrap_or(false), o_norm_eps))
}

/// The layer pattern: `linear_attn_config`'s 1-based `kda_layers` / `full_attn_layers` (the
/// checkpoint's own convention, `(idx + 1) in kda_layers`), else transformers' `layer_types`.
fn mixers(
    t: &Map<String, Value>,
    la: &Map<String, Value>,
    layers: usize,
) -> std::result::Result<Vec<Mixer>, String> {
    let ids = |k: &str| -> std::result::Result<Option<Vec<usize>>, String> {
        match la.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_u64()
                        .map(|x| x as usize)
                        .filter(|x| (1..=layers).contains(x))
                        .ok_or_else(|| {
                            format!(
                                "`linear_attn_config.{k}` holds {v}: layers are numbered 1..={layers} (1-based)"
                            )
                        })
                })
                .collect::<std::result::Result<Vec<_>, _>>()
                .map(Some),
            Some(v) => Err(format!(
                "`linear_attn_config.{k}` must be a list of layer numbers, found {v}"
            )),
        }
    };
    if let (Some(kda), Some(full)) = (ids("kda_layers")?, ids("full_attn_layers")?) {
        let mut m = vec![None; layers];
        for (list, kind) in [(&kda, Mixer::Kda), (&full, Mixer::Mla)] {
            for &l in list {
                if m[l - 1].replace(kind).is_some() {
                    return Err(format!(
                        "layer {l} is in both `kda_layers` and `full_attn_layers` (or twice)"
                    ));
                }
            }
        }
        return m
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.ok_or_else(|| {
                    format!(
                        "layer {} is in neither `kda_layers` nor `full_attn_layers`",
                        i + 1
                    )
                })
            })
            .collect();
    }
    match t.get("layer_types") {
        Some(Value::Array(a)) if a.len() == layers => a
            .iter()
            .map(|v| match v.as_str() {
                Some("linear_attention") => Ok(Mixer::Kda),
                Some("full_attention") => Ok(Mixer::Mla),
                _ => Err(format!(
                    "`layer_types` holds {v}: linear_attention or full_attention"
                )),
            })
            .collect(),
        Some(v) => Err(format!(
            "`layer_types` must list one type per layer ({layers}), found {v}"
        )),
        None => Err(
            "no layer pattern: `linear_attn_config.kda_layers` and `full_attn_layers` are missing"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(v: Value) -> std::result::Result<KlConfig, String> {
        let c = Config::from_value(std::path::Path::new("config.json"), v).unwrap();
        read(c.text(), &c, false)
    }

    fn real() -> Value {
        // moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json, values as published.
        json!({"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
            "eos_token_id": 163586, "first_k_dense_replace": 1, "hidden_act": "silu",
            "hidden_size": 2304, "intermediate_size": 9216, "kv_lora_rank": 512,
            "linear_attn_config": {"full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "head_dim": 128,
                "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
                "num_heads": 32, "short_conv_kernel_size": 4},
            "mla_use_nope": true, "model_max_length": 1048576, "moe_intermediate_size": 1024,
            "moe_layer_freq": 1, "moe_renormalize": true, "moe_router_activation_func": "sigmoid",
            "num_attention_heads": 32, "num_expert_group": 1, "num_experts": 256,
            "num_experts_per_token": 8, "num_hidden_layers": 27, "num_key_value_heads": 32,
            "num_shared_experts": 1, "q_lora_rank": null, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05, "routed_scaling_factor": 2.446,
            "tie_word_embeddings": false, "topk_group": 1, "v_head_dim": 128, "vocab_size": 163840})
    }

    #[test]
    fn reads_the_real_config_with_its_one_based_layer_lists() {
        let c = cfg(real()).unwrap();
        let mla: Vec<usize> = (0..27).filter(|&i| c.mixers[i] == Mixer::Mla).collect();
        assert_eq!(mla, vec![3, 7, 11, 15, 19, 23, 26]);
        assert_eq!(
            c.kda,
            Kda {
                heads: 32,
                head_dim: 128,
                conv: 4,
                lower_bound: None,
                full_rank_gate: false,
                o_norm_eps: 1e-5,
            }
        );
        assert_eq!((c.ds.experts, c.ds.top_k, c.ds.shared), (256, 8, 1));
        assert!(c.ds.nope_only && c.ds.q_lora.is_none());
        assert_eq!(c.ds.max_pos, 1048576);
        assert!((c.ds.scale - 192f32.powf(-0.5)).abs() < 1e-7);
        assert_eq!((c.ds.eps, c.ds.latent_eps), (1e-5, 1e-6));
    }

    #[test]
    fn refuses_what_it_would_run_as_something_else() {
        let with = |k: &str, v: Value| {
            let mut j = real();
            j[k] = v;
            cfg(j).unwrap_err()
        };
        assert!(with("mla_use_nope", json!(false)).contains("mla_use_nope"));
        assert!(with("moe_router_activation_func", json!("softmax")).contains("sigmoid"));
        assert!(with("moe_layer_freq", json!(2)).contains("moe_layer_freq"));
        // Hostile sizes are refused before anything is allocated from them.
        assert!(with("num_hidden_layers", json!(1u64 << 40)).contains("num_hidden_layers"));
        assert!(with("num_hidden_layers", json!(5000)).contains("1..=4096"));
        let mut j = real();
        j["linear_attn_config"]["head_dim"] = json!(1u64 << 33);
        assert!(cfg(j).unwrap_err().contains("head_dim"));
        let mut j = real();
        j["linear_attn_config"]["head_dim"] = json!(1u64 << 19);
        assert!(cfg(j)
            .unwrap_err()
            .contains("past what a KDA layer can hold"));
        // #38.11/12: dimensions whose products wrap, and ids that do not fit a token id.
        assert!(with("num_attention_heads", json!(1u64 << 62)).contains("num_attention_heads"));
        assert!(with("qk_rope_head_dim", json!(1u64 << 40)).contains("qk_rope_head_dim"));
        assert!(with("eos_token_id", json!((1u64 << 32) + 5)).contains("eos_token_id"));
        let mut j = real();
        j["linear_attn_config"]["short_conv_kernel_size"] = json!(1000);
        assert!(cfg(j)
            .unwrap_err()
            .contains("past what a KDA layer can hold"));
        let mut j = real();
        j["linear_attn_config"]["kda_layers"] = json!([0, 1]);
        assert!(cfg(j).unwrap_err().contains("1-based"));
        let mut j = real();
        j["linear_attn_config"]["full_attn_layers"] = json!([4, 8]);
        assert!(cfg(j).unwrap_err().contains("neither"));
        let mut j = real();
        j["linear_attn_config"]["full_attn_layers"] = json!([1, 4, 8, 12, 16, 20, 24, 27]);
        assert!(cfg(j).unwrap_err().contains("both"));
        let mut j = real();
        j["linear_attn_config"]["gate_lower_bound"] = json!(-5.0);
        assert!(cfg(j).unwrap_err().contains("lower-bounded"));
        // transformers' own spelling of the pattern is read too.
        let mut j = real();
        j.as_object_mut().unwrap().remove("linear_attn_config");
        j["linear_num_heads"] = json!(32);
        j["linear_head_dim"] = json!(128);
        j["layer_types"] = json!((0..27)
            .map(|i| if i % 4 == 3 || i == 26 {
                "full_attention"
            } else {
                "linear_attention"
            })
            .collect::<Vec<_>>());
        let c = cfg(j).unwrap();
        assert_eq!(c.mixers[3], Mixer::Mla);
        assert_eq!(c.mixers[0], Mixer::Kda);
    }
}
