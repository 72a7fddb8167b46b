//! The attention of a block drafter's layer, one of two backbones: Qwen3 GQA (z-lab DFlash,
//! vLLM `Qwen3DSparkModel`, `DFlash2DraftModel`: q/k/v_proj, per-head q/k RMSNorm, Llama RoPE)
//! or DeepSeek MLA (Inferact `K3DSparkModel`, `vllm/models/kimi_k3/nvidia/dspark_mla.py` on the
//! K3 `MultiHeadLatentAttention` of `vllm/models/kimi_k3/nvidia/mla.py` with `use_rope=True`:
//! q-LoRA, the KV latent and interleaved RoPE of [`MlaAttention`], the EAGLE-3 MLA draft's
//! projections on H-wide rows). What the forward (`mod.rs`) asks of either: the context keys
//! and values of the projected context rows, the block rows' q/k/v at their positions, the
//! widths and scale the softmax uses, and `o_proj`.
//!
//! vLLM computes MLA's context latent once for all layers (`context_kv_proj`, each layer's
//! `kv_a_proj_with_mqa` stacked) and attends in the latent space (W_UK / W_UV absorbed, a GPU
//! kernel); here every layer expands its latent into per-head keys and values, the same math.

use std::path::Path;

use serde_json::Value;

use super::super::linears::Linear;
use super::super::rope::{yarn_mscale, Rope};
use super::super::weights::Loader;
use crate::checkpoint::block::Layout;
use crate::checkpoint::{Config, Detection};
use crate::error::{Error, Result};
use crate::ops::rms_norm;
use crate::runtime::eagle3::{MlaAttention, MlaShape};

/// A Qwen3 attention: projections and per-head norms (`head_dim` wide heads).
pub(super) struct Gqa {
    pub(super) q: Linear,
    pub(super) k: Linear,
    pub(super) v: Linear,
    pub(super) o: Linear,
    pub(super) q_norm: Vec<f32>,
    pub(super) k_norm: Vec<f32>,
}

/// The attention of one decoder layer.
pub(super) enum Attn {
    Gqa(Box<Gqa>),
    Mla(Box<MlaAttention>),
}

/// The widths the block softmax reads: query head `i` uses key/value head
/// `i / (heads / kv_heads)`, q·k over `qk` values times `scale`, `v`-wide values.
#[derive(Clone, Copy)]
pub(super) struct Widths {
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    pub(super) qk: usize,
    pub(super) v: usize,
    pub(super) scale: f32,
}

impl Widths {
    /// A query row, a key row, a value row.
    pub(super) fn rows(&self) -> (usize, usize, usize) {
        (
            self.heads * self.qk,
            self.kv_heads * self.qk,
            self.kv_heads * self.v,
        )
    }
}

/// RMSNorm of every `d`-wide head of every row, in place (Qwen3 `q_norm` / `k_norm`).
pub(super) fn head_norm(x: &mut [f32], d: usize, w: &[f32], eps: f32) {
    let y = rms_norm(x, d, w, eps);
    x.copy_from_slice(&y);
}

fn lin(l: &Linear, x: &[f32], n: usize, reference: bool) -> Vec<f32> {
    if reference {
        l.apply_ref(x, n)
    } else {
        l.apply(x, n)
    }
}

impl Attn {
    /// The GQA attention (what the device step runs).
    pub(super) fn gqa(&self) -> Option<&Gqa> {
        match self {
            Attn::Gqa(g) => Some(g),
            Attn::Mla(_) => None,
        }
    }

    /// The softmax widths: GQA `(heads, kv_heads, head_dim, head_dim, 1/√head_dim)`; MLA
    /// every head its own key (`nope + rope` wide) and value, YaRN's mscale² / √(nope + rope).
    pub(super) fn widths(&self, (heads, kv_heads, head_dim): (usize, usize, usize)) -> Widths {
        match self {
            Attn::Gqa(_) => Widths {
                heads,
                kv_heads,
                qk: head_dim,
                v: head_dim,
                scale: 1.0 / (head_dim as f32).sqrt(),
            },
            Attn::Mla(m) => Widths {
                heads: m.shape.heads,
                kv_heads: m.shape.heads,
                qk: m.shape.nope + m.shape.rope_dim,
                v: m.shape.v_dim,
                scale: m.softmax_scale,
            },
        }
    }

    /// Keys and values of the `len` projected context rows `ctx` at positions 0..len, no
    /// input_layernorm: GQA `RoPE(k_norm(k_proj(ctx)))`, `v_proj(ctx)`; MLA the layer's
    /// `kv_a_proj_with_mqa` latent, `kv_a_layernorm`, `kv_b_proj`, k_rope roped.
    pub(super) fn context(
        &self,
        ctx: &[f32],
        len: usize,
        (rope, head_dim, eps): (&Rope, usize, f32),
        reference: bool,
    ) -> (Vec<f32>, Vec<f32>) {
        match self {
            Attn::Gqa(g) => {
                let mut k = lin(&g.k, ctx, len, reference);
                head_norm(&mut k, head_dim, &g.k_norm, eps);
                let kvd = k.len() / len.max(1);
                for (s, row) in k.chunks_mut(kvd.max(1)).enumerate() {
                    rope.apply_neox(row, s);
                }
                (k, lin(&g.v, ctx, len, reference))
            }
            Attn::Mla(m) => {
                let pos: Vec<usize> = (0..len).collect();
                m.keys_values(ctx, len, &pos, reference)
            }
        }
    }

    /// q, k and v of the `n` normed block rows `xn`, row `i` at RoPE position `pos[i]`.
    pub(super) fn block_qkv(
        &self,
        xn: &[f32],
        n: usize,
        pos: &[usize],
        (rope, head_dim, eps): (&Rope, usize, f32),
        reference: bool,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        match self {
            Attn::Gqa(g) => {
                let mut q = lin(&g.q, xn, n, reference);
                let mut k = lin(&g.k, xn, n, reference);
                let v = lin(&g.v, xn, n, reference);
                head_norm(&mut q, head_dim, &g.q_norm, eps);
                head_norm(&mut k, head_dim, &g.k_norm, eps);
                let (qd, kvd) = (q.len() / n, k.len() / n);
                for (i, &p) in pos.iter().enumerate() {
                    rope.apply_neox(&mut q[i * qd..(i + 1) * qd], p);
                    rope.apply_neox(&mut k[i * kvd..(i + 1) * kvd], p);
                }
                (q, k, v)
            }
            Attn::Mla(m) => {
                let q = m.queries(xn, n, pos, reference);
                let (k, v) = m.keys_values(xn, n, pos, reference);
                (q, k, v)
            }
        }
    }

    /// `o_proj` of the attention output.
    pub(super) fn out(&self, o: &[f32], n: usize, reference: bool) -> Vec<f32> {
        match self {
            Attn::Gqa(g) => lin(&g.o, o, n, reference),
            Attn::Mla(m) => m.out_proj(o, n, reference),
        }
    }
}

/// What every MLA layer of a `k3-dspark` draft is read with: the widths, the RoPE table and
/// softmax multiplier of `MultiHeadLatentAttention.__init__` (`use_rope=True`), and the norm eps.
pub(super) struct MlaSpec {
    shape: MlaShape,
    rope: Rope,
    mult: f32,
    eps: f32,
}

/// K3DSparkConfig's flags the replay (and vLLM: "MLA DSpark does not support …") refuses.
const K3_UNSUPPORTED: [&str; 4] = [
    "mla_use_nope",
    "mla_use_output_gate",
    "mla_use_qk_norm",
    "dspark_bonus_anchor",
];

impl MlaSpec {
    /// The spec of a draft detected in the `k3-dspark` layout, `None` for the GQA ones.
    pub(super) fn of(det: &Detection, dir: &Path, c: &Config) -> Result<Option<MlaSpec>> {
        if det.block_draft.as_ref().map(|b| b.layout) != Some(Layout::K3Dspark) {
            return Ok(None);
        }
        let refuse = |what: String| {
            Error::source(dir, format!("{what}: vLLM's K3DSparkConfig refuses it (\"MLA DSpark does not support …\") and the replay follows vLLM"))
                .with_hint("`kquant inspect` lists what vLLM says of this config")
        };
        if let Some(k) = K3_UNSUPPORTED
            .iter()
            .find(|k| c.get(k).and_then(Value::as_bool) == Some(true))
        {
            return Err(refuse(format!("`{k}` is true")));
        }
        let d = &det.dims;
        if d.block_size.is_none() {
            return Err(Error::source(dir, "a K3DSparkModel config names no `block_size`: vLLM takes the block from `num_speculative_tokens` at launch, and the replay needs the most tokens a step")
                .with_hint("add `\"block_size\": N` (the num_speculative_tokens the draft is served with) to config.json in a copy of the draft directory; `--steps` then picks 1..=N"));
        }
        let need = |v: Option<u64>, k: &str| match v {
            Some(x) if x > 0 => Ok(x as usize),
            _ => Err(Error::source(
                dir,
                format!("an MLA DSpark config needs a non-zero `{k}`"),
            )),
        };
        if d.q_lora_rank.is_none() {
            return Err(refuse("`q_lora_rank` is null".into()));
        }
        let shape = MlaShape {
            heads: need(d.num_attention_heads, "num_attention_heads")?,
            q_lora_rank: Some(need(d.q_lora_rank, "q_lora_rank")?),
            kv_lora_rank: need(d.kv_lora_rank, "kv_lora_rank")?,
            nope: need(d.qk_nope_head_dim, "qk_nope_head_dim")?,
            rope_dim: need(d.qk_rope_head_dim, "qk_rope_head_dim")?,
            v_dim: need(d.v_head_dim, "v_head_dim")?,
        };
        if !shape.rope_dim.is_multiple_of(2) {
            let msg = format!(
                "qk_rope_head_dim {} is odd: RoPE rotates pairs",
                shape.rope_dim
            );
            return Err(Error::source(dir, msg));
        }
        let (rope, mult) = mla_rope(dir, c, shape.rope_dim)?;
        let eps = norm_eps(dir, c)?;
        Ok(Some(MlaSpec {
            shape,
            rope,
            mult,
            eps,
        }))
    }

    /// Layer attention from its `self_attn.` tensors `vb`, on H-wide rows.
    pub(super) fn read(&self, vb: &Loader, h: usize) -> Result<MlaAttention> {
        let rope = (self.rope.clone(), self.mult);
        MlaAttention::read(vb, self.shape, (h, h), rope, self.eps)
    }
}

/// `rms_norm_eps` (1e-6 when absent): a finite number, not negative (a negative one makes
/// RMSNorm's root NaN for small rows, and every proposal with it).
pub(super) fn norm_eps(dir: &Path, c: &Config) -> Result<f32> {
    match c.get("rms_norm_eps").filter(|v| !v.is_null()) {
        None => Ok(1e-6),
        Some(v) => match v.as_f64() {
            Some(e) if e.is_finite() && e >= 0.0 => Ok(e as f32),
            _ => Err(Error::source(
                dir,
                format!("`rms_norm_eps` is {v}: RMSNorm's epsilon is a small non-negative number"),
            )
            .with_hint("give the rms_norm_eps the draft was trained with (1e-6 when absent)")),
        },
    }
}

/// The K3 MLA RoPE (`MultiHeadLatentAttention.__init__`): `rope_parameters` (or
/// `rope_scaling`), K3DSparkConfig's default `default` at θ 50000; any other type becomes
/// `deepseek_yarn`: YaRN frequencies, cos/sin times mscale(f, mscale) / mscale(f,
/// mscale_all_dim) (`DeepseekScalingRotaryEmbedding`), softmax scale times
/// mscale(f, mscale_all_dim)². `deepseek_llama_scaling` (`attention_factor` 1) is refused.
fn mla_rope(dir: &Path, c: &Config, dim: usize) -> Result<(Rope, f32)> {
    let params = c
        .get("rope_scaling")
        .filter(|v| !v.is_null())
        .or_else(|| c.get("rope_parameters").filter(|v| !v.is_null()));
    let theta = params
        .and_then(|p| p.get("rope_theta"))
        .or_else(|| c.get("rope_theta"))
        .and_then(Value::as_f64)
        .unwrap_or(50000.0);
    let bad = |what: String| {
        Error::source(dir, what).with_hint(
            "give the RoPE parameters the draft was trained with (`kquant inspect` shows the config)",
        )
    };
    if !(theta.is_finite() && theta > 0.0) {
        return Err(bad(format!(
            "`rope_theta` is {theta}: RoPE's base is a positive number"
        )));
    }
    let kind = params
        .and_then(|p| p.get("rope_type").or_else(|| p.get("type")))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let Some(p) = params.filter(|_| kind != "default") else {
        return Ok((Rope::plain(dim, theta), 1.0));
    };
    let num = |k: &str| p.get(k).and_then(Value::as_f64);
    if num("attention_factor") == Some(1.0) {
        return Err(Error::source(dir, format!("rope type `{kind}` with attention_factor 1: vLLM runs it as `deepseek_llama_scaling`, which the replay does not")));
    }
    let (Some(factor), Some(orig)) = (num("factor"), num("original_max_position_embeddings"))
    else {
        return Err(Error::source(dir, format!("rope type `{kind}` without `factor` and `original_max_position_embeddings`: vLLM's deepseek_yarn reads both")));
    };
    if !(factor.is_finite() && factor > 0.0 && orig.is_finite() && orig >= 1.0) {
        return Err(bad(format!("rope type `{kind}` with factor {factor} and original_max_position_embeddings {orig}: YaRN scales by a positive factor over at least one position")));
    }
    let mut yarn = p.clone();
    yarn["rope_type"] = "yarn".into();
    let (mut rope, mult) = Rope::from_config(dim, theta, Some(&yarn));
    let m = |k: &str, d: f64| yarn_mscale(factor, num(k).unwrap_or(d));
    rope.attn_factor = (m("mscale", 1.0) / m("mscale_all_dim", 0.0)) as f32;
    Ok((rope, mult))
}
