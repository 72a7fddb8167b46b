//! The DeepSeek-V3 / Kimi-K2 hyper-parameters, read from `config.json` (or its `text_config`)
//! the way transformers 5.23's `DeepseekV3Config` reads them, with the RoPE table and softmax
//! scale transformers' `DeepseekV3RotaryEmbedding` / `DeepseekV3Attention` derive from
//! `rope_parameters` (or the legacy `rope_scaling` + `rope_theta`).

use serde_json::{Map, Value};

use crate::checkpoint::Config;
use crate::error::{Error, Result};
use crate::runtime::rope::{yarn_mscale, Rope};

/// The largest `max_position_embeddings` a target config may give (16M positions: above every
/// real model's context).
pub const MAX_POSITIONS: u64 = 1 << 24;

/// transformers' RMSNorm default eps, which the latent norms keep.
pub const LATENT_EPS: f32 = 1e-6;

/// Everything the forward needs to know besides the weights.
#[derive(Debug, Clone)]
pub struct DsConfig {
    pub hidden: usize,
    pub vocab: usize,
    pub layers: usize,
    pub heads: usize,
    /// `None`: a plain `q_proj` (DeepSeek-V2-Lite style); else `q_a_proj` → norm → `q_b_proj`.
    pub q_lora: Option<usize>,
    pub kv_lora: usize,
    pub nope: usize,
    pub rope_dim: usize,
    pub v_dim: usize,
    pub inter: usize,
    pub moe_inter: usize,
    pub experts: usize,
    pub shared: usize,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk: bool,
    pub routed_scale: f32,
    pub first_dense: usize,
    pub eps: f32,
    /// The eps of the latent norms (`q_a_layernorm`, `kv_a_layernorm`): transformers builds them
    /// with the RMSNorm default 1e-6 whatever `rms_norm_eps` says (DeepSeek-V3 and Kimi-Linear
    /// alike).
    pub latent_eps: f32,
    /// No positional encoding at all (Kimi-Linear's MLA, `mla_use_nope`): the shared "rope" key
    /// dims are used as the projection makes them.
    pub nope_only: bool,
    pub tie: bool,
    /// `rope_interleave` (DeepSeek pairs) or Llama `rotate_half` on the rope dims.
    pub interleave: bool,
    pub rope: Rope,
    /// `qk_head_dim^-0.5 · mscale(factor, mscale_all_dim)²` (YaRN), as transformers applies it.
    pub scale: f32,
    /// `eos_token_id` (one or several).
    pub eos: Vec<u32>,
    /// `max_position_embeddings` (default 4096, at most [`MAX_POSITIONS`]): the longest
    /// sequence the target is run on.
    pub max_pos: usize,
}

impl DsConfig {
    /// `nope + rope_dim`.
    pub fn qk_head(&self) -> usize {
        self.nope + self.rope_dim
    }

    /// Read and check. Errors name the key and the file.
    pub fn read(cfg: &Config) -> Result<DsConfig> {
        let t = cfg.text();
        let cerr = |msg: String| Error::Config {
            path: cfg.path.clone(),
            msg,
        };
        let get = |k: &str| t.get(k).filter(|v| !v.is_null());
        // Every integer is bounded before anything is sized from it (#38.12: a
        // `qk_rope_head_dim` of 2^40 asked for 2 TB): dimensions up to MAX_DIM, positions up to
        // MAX_POSITIONS.
        let uint = |k: &str| -> Result<Option<usize>> {
            match get(k) {
                None => Ok(None),
                Some(v) => {
                    let x = v.as_u64().ok_or_else(|| {
                        cerr(format!("`{k}` must be a non-negative integer, found {v}"))
                    })?;
                    let max = if k == "max_position_embeddings" {
                        MAX_POSITIONS
                    } else {
                        crate::checkpoint::detect::MAX_DIM
                    };
                    if x > max {
                        return Err(cerr(format!(
                            "`{k}` is {x}; kquant runs values up to {max}"
                        )));
                    }
                    Ok(Some(x as usize))
                }
            }
        };
        let need = |k: &str| uint(k)?.ok_or_else(|| cerr(format!("`{k}` is missing")));
        let num = |k: &str, d: f64| get(k).and_then(Value::as_f64).unwrap_or(d);
        let flag = |k: &str, d: bool| get(k).and_then(Value::as_bool).unwrap_or(d);
        let heads = need("num_attention_heads")?;
        let nope = need("qk_nope_head_dim")?;
        let rope_dim = need("qk_rope_head_dim")?;
        let experts = uint("n_routed_experts")?
            .or(uint("num_local_experts")?)
            .ok_or_else(|| cerr("`n_routed_experts` is missing".into()))?;
        // transformers' DeepseekV3 router always scores with a sigmoid; a softmax-scored
        // (DeepSeek-V2) config would run as something else, so it is refused.
        if let Some(f) = get("scoring_func")
            .and_then(Value::as_str)
            .filter(|f| *f != "sigmoid")
        {
            return Err(cerr(format!(
                "`scoring_func` is `{f}`; the DeepSeek-V3 router scores with a sigmoid"
            )));
        }
        let max_pos = uint("max_position_embeddings")?.unwrap_or(4096);
        let (rope, mult) = rope_of(t, rope_dim, max_pos).map_err(cerr)?;
        // An id that does not fit a token id is an error, not a wrapped other token.
        let eos = eos_ids(get("eos_token_id")).map_err(cerr)?;
        let c = DsConfig {
            hidden: need("hidden_size")?,
            vocab: need("vocab_size")?,
            layers: need("num_hidden_layers")?,
            heads,
            q_lora: uint("q_lora_rank")?,
            kv_lora: need("kv_lora_rank")?,
            nope,
            rope_dim,
            v_dim: need("v_head_dim")?,
            inter: need("intermediate_size")?,
            moe_inter: need("moe_intermediate_size")?,
            experts,
            shared: uint("n_shared_experts")?.unwrap_or(0),
            top_k: need("num_experts_per_tok")?,
            n_group: uint("n_group")?.unwrap_or(1),
            topk_group: uint("topk_group")?.unwrap_or(1),
            norm_topk: flag("norm_topk_prob", true),
            routed_scale: num("routed_scaling_factor", 1.0) as f32,
            first_dense: uint("first_k_dense_replace")?.unwrap_or(0),
            eps: num("rms_norm_eps", 1e-6) as f32,
            latent_eps: LATENT_EPS,
            nope_only: false,
            tie: cfg
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            interleave: flag("rope_interleave", true),
            rope,
            scale: (1.0 / ((nope + rope_dim) as f64).sqrt() * mult as f64) as f32,
            eos,
            max_pos,
        };
        c.check().map_err(cerr)?;
        Ok(c)
    }

    /// The combinations transformers' router and attention can run.
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        if !self.rope_dim.is_multiple_of(2) {
            return Err(format!("`qk_rope_head_dim` {} must be even", self.rope_dim));
        }
        if self.n_group == 0 || !self.experts.is_multiple_of(self.n_group) {
            return Err(format!(
                "`n_routed_experts` {} is not a multiple of `n_group` {}",
                self.experts, self.n_group
            ));
        }
        let per = self.experts / self.n_group;
        if per < 2 && self.n_group > 1 {
            return Err(format!(
                "groups of {per} expert: the group score sums each group's top 2"
            ));
        }
        if self.topk_group == 0 || self.topk_group > self.n_group {
            return Err(format!(
                "`topk_group` {} must be in 1..=`n_group` {}",
                self.topk_group, self.n_group
            ));
        }
        if self.top_k == 0 || self.top_k > self.topk_group * per {
            return Err(format!(
                "`num_experts_per_tok` {} exceeds the {} experts of the selected groups",
                self.top_k,
                self.topk_group * per
            ));
        }
        if self.layers == 0 || self.heads == 0 || self.hidden == 0 {
            return Err(
                "`num_hidden_layers`, `num_attention_heads`, `hidden_size` must be > 0".into(),
            );
        }
        if let Some(&e) = self.eos.iter().find(|&&e| e as usize >= self.vocab) {
            return Err(format!(
                "`eos_token_id` {e} is outside the vocabulary of {}",
                self.vocab
            ));
        }
        let u = |x: usize| x as u64;
        crate::checkpoint::detect::check_dims(
            &[],
            &[
                (
                    "num_attention_heads × (qk_nope + qk_rope)",
                    &[u(self.heads), u(self.nope + self.rope_dim)],
                ),
                (
                    "num_attention_heads × (qk_nope + v_head_dim)",
                    &[u(self.heads), u(self.nope + self.v_dim)],
                ),
                (
                    "kv_lora_rank + qk_rope_head_dim",
                    &[u(self.kv_lora + self.rope_dim)],
                ),
                (
                    "n_routed_experts × moe_intermediate_size",
                    &[u(self.experts), u(self.moe_inter)],
                ),
                ("vocab_size × hidden_size", &[u(self.vocab), u(self.hidden)]),
            ],
        )
    }
}

/// `eos_token_id` (one id or a list) as token ids: an id that does not fit one is an error, not
/// a wrapped other token (#38.12). Shared with the Kimi-Linear config.
pub(crate) fn eos_ids(v: Option<&Value>) -> std::result::Result<Vec<u32>, String> {
    let token = |v: &Value| {
        v.as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| format!("`eos_token_id` holds {v}, not a token id"))
    };
    match v {
        None => Ok(vec![]),
        Some(Value::Array(a)) => a.iter().map(token).collect(),
        Some(v) => Ok(vec![token(v)?]),
    }
}

/// The RoPE table over `dim` rope dims and the softmax multiplier, as transformers 5.23 builds
/// them: `rope_parameters` (else `rope_scaling` with the top-level `rope_theta`); YaRN's
/// `original_max_position_embeddings` defaults to `max_position_embeddings` and `factor` to
/// their ratio; the cos/sin factor is `attention_factor` when given, else
/// `mscale(factor, mscale) / mscale(factor, mscale_all_dim)` when both are set, else
/// `mscale(factor)`; the softmax scale is multiplied by `mscale(factor, mscale_all_dim)²`
/// (`yarn_apply_mscale`).
pub fn rope_of(
    t: &Map<String, Value>,
    dim: usize,
    max_pos: usize,
) -> std::result::Result<(Rope, f32), String> {
    let params = t
        .get("rope_parameters")
        .filter(|v| v.is_object())
        .or_else(|| t.get("rope_scaling").filter(|v| v.is_object()));
    let theta_of = |p: Option<&Value>| {
        p.and_then(|p| p.get("rope_theta"))
            .or_else(|| t.get("rope_theta"))
            .and_then(Value::as_f64)
            .unwrap_or(10000.0)
    };
    let theta = theta_of(params);
    let kind = params
        .and_then(|p| p.get("rope_type").or_else(|| p.get("type")))
        .and_then(Value::as_str)
        .unwrap_or("default");
    match kind {
        "default" => return Ok((Rope::plain(dim, theta), 1.0)),
        "yarn" => {}
        other => {
            return Err(format!(
                "rope_type `{other}` is not supported (default, yarn)"
            ))
        }
    }
    let p = params.expect("yarn has parameters");
    if p.get("truncate").and_then(Value::as_bool) == Some(false) {
        return Err("YaRN with `truncate: false` is not supported".into());
    }
    let f = |k: &str| p.get(k).and_then(Value::as_f64);
    let orig = f("original_max_position_embeddings").unwrap_or(max_pos as f64);
    let factor = f("factor").unwrap_or(max_pos as f64 / orig);
    let mut norm = p.as_object().expect("object").clone();
    norm.insert("rope_type".into(), "yarn".into());
    norm.insert("original_max_position_embeddings".into(), orig.into());
    norm.insert("factor".into(), factor.into());
    let (mut rope, _) = Rope::from_config(dim, theta, Some(&Value::Object(norm)));
    let truthy = |v: Option<f64>| v.filter(|x| *x != 0.0);
    rope.attn_factor = match (
        f("attention_factor"),
        truthy(f("mscale")),
        truthy(f("mscale_all_dim")),
    ) {
        (Some(a), _, _) => a,
        (None, Some(m), Some(a)) => yarn_mscale(factor, m) / yarn_mscale(factor, a),
        _ => yarn_mscale(factor, 1.0),
    } as f32;
    let all_dim = truthy(f("mscale_all_dim"));
    let mult = all_dim.map_or(1.0, |a| yarn_mscale(factor, a).powi(2));
    Ok((rope, mult as f32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn yarn_follows_transformers_defaults() {
        let y = json!({"rope_type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
            "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 50000.0});
        let (r, mult) = rope_of(&obj(json!({"rope_parameters": y})), 16, 262144).unwrap();
        let (want, want_mult) = Rope::from_config(16, 50000.0, Some(&y));
        assert_eq!((r, mult), (want, want_mult));
        // Legacy `rope_scaling` + top-level theta; no `original_max_position_embeddings`: it
        // defaults to max_position_embeddings, so `factor` alone decides; no mscale_all_dim:
        // softmax multiplier 1 and cos/sin factor mscale(factor).
        let legacy = obj(json!({"rope_theta": 10000.0,
            "rope_scaling": {"type": "yarn", "factor": 40.0}}));
        let (r, mult) = rope_of(&legacy, 8, 4096).unwrap();
        assert_eq!(mult, 1.0);
        assert!((r.attn_factor as f64 - (0.1 * 40f64.ln() + 1.0)).abs() < 1e-6);
        let explicit = obj(
            json!({"rope_parameters": {"rope_type": "yarn", "factor": 4.0,
            "attention_factor": 0.5, "rope_theta": 1e4}}),
        );
        assert_eq!(rope_of(&explicit, 8, 4096).unwrap().0.attn_factor, 0.5);
        let plain = rope_of(&obj(json!({"rope_theta": 50000.0})), 8, 4096).unwrap();
        assert_eq!(plain, (Rope::plain(8, 50000.0), 1.0));
        assert!(rope_of(
            &obj(json!({"rope_scaling": {"type": "dynamic", "factor": 2.0}})),
            8,
            8
        )
        .unwrap_err()
        .contains("dynamic"));
    }
}
