//! The Kimi-Linear weights under the checkpoint's own names (moonshotai's `modeling_kimi.py`,
//! which transformers' save_pretrained also writes): KDA layers `self_attn.{q,k,v}_proj`,
//! `{q,k,v}_conv1d.weight` `[C, 1, K]`, `f_a_proj`/`f_b_proj`, `dt_bias` `[C]`, `A_log`
//! `[1, 1, H, 1]` (or `[H]`), `b_proj`, `g_a_proj`/`g_b_proj`, `o_norm` `[D]`, `o_proj`; MLA
//! layers DeepSeek's names; the MoE under `block_sparse_moe.` with `experts.E.w1` (gate), `w3`
//! (up), `w2` (down); the dense layers' `mlp.`. Read as f32 through the runtimes' one loader,
//! every shape checked with the tensor named.

use super::config::{KlConfig, Mixer};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::quant::decode::Logical;
use crate::runtime::deepseek::weights::Act;
use crate::runtime::deepseek::weights::{self, attn, mlp, Attn, Ffn, Mlp, Moe};
use crate::runtime::weights::Loader;

/// One KDA layer's weights.
pub struct KdaW {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Depthwise kernels `[3C, K]`: q's channels, then k's, then v's.
    pub conv: Vec<f32>,
    pub f_a: Vec<f32>,
    pub f_b: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// `exp(A_log)` per head.
    pub decay: Vec<f32>,
    pub b: Vec<f32>,
    pub gate: OutGate,
    pub o_norm: Vec<f32>,
    pub o: Vec<f32>,
}

/// The output gate's projection: Kimi-Linear's low rank `g_b(g_a x)`, or Kimi-K3's full-rank
/// `g_proj x` (`linear_attn_config.use_full_rank_gate`).
pub enum OutGate {
    LowRank { a: Vec<f32>, b: Vec<f32> },
    Full(Vec<f32>),
}

pub enum Mix {
    Kda(Box<KdaW>),
    Mla(Attn),
}

/// A Kimi-Linear layer: DeepSeek's, its mixer KDA or MLA.
pub type Layer = weights::Layer<Mix>;

pub type Weights = weights::Weights<Layer>;

/// One KDA layer's weights under `vb` (a layer's `self_attn.`); Kimi-K3's too.
pub(crate) fn kda(vb: &Loader, c: &KlConfig) -> Result<KdaW> {
    let (h, w, d, nh, k) = (
        c.ds.hidden,
        c.kda.width(),
        c.kda.head_dim,
        c.kda.heads,
        c.kda.conv,
    );
    let mut conv = Vec::with_capacity(3 * w * k);
    for p in ["q", "k", "v"] {
        conv.extend(vb.get(&format!("{p}_conv1d.weight"), &[w, 1, k])?);
    }
    let a_log = if vb.shape("A_log").as_deref() == Some(&[nh][..]) {
        vb.get("A_log", &[nh])?
    } else {
        vb.get("A_log", &[1, 1, nh, 1])?
    };
    for b in [
        "q_conv1d.bias",
        "k_conv1d.bias",
        "v_conv1d.bias",
        "g_b_proj.bias",
        "g_proj.bias",
    ] {
        if vb.has(b) {
            return Err(vb.error(b, "KDA biases are not supported (Kimi-Linear has none)"));
        }
    }
    Ok(KdaW {
        q: vb.get("q_proj.weight", &[w, h])?,
        k: vb.get("k_proj.weight", &[w, h])?,
        v: vb.get("v_proj.weight", &[w, h])?,
        conv,
        f_a: vb.get("f_a_proj.weight", &[d, h])?,
        f_b: vb.get("f_b_proj.weight", &[w, d])?,
        dt_bias: vb.get("dt_bias", &[w])?,
        decay: a_log.iter().map(|a| a.exp()).collect(),
        b: vb.get("b_proj.weight", &[nh, h])?,
        gate: if c.kda.full_rank_gate {
            OutGate::Full(vb.get("g_proj.weight", &[w, h])?)
        } else {
            OutGate::LowRank {
                a: vb.get("g_a_proj.weight", &[d, h])?,
                b: vb.get("g_b_proj.weight", &[w, d])?,
            }
        },
        o_norm: vb.get("o_norm.weight", &[d])?,
        o: vb.get("o_proj.weight", &[h, w])?,
    })
}

/// The Kimi-Linear MoE block (`block_sparse_moe.`): router, bias, `w1`/`w3`/`w2` experts.
fn moe(vb: &Loader, c: &KlConfig) -> Result<Moe> {
    moe_block(vb, c, c.ds.hidden, Act::Silu)
}

/// A `block_sparse_moe.` block: the router and its bias over the hidden row, the routed
/// experts `experts.E.w1/w3/w2` on rows of width `width` (the hidden size, or Kimi-K3's latent),
/// the shared experts on the hidden row; every MLP with activation `act`.
pub(crate) fn moe_block(vb: &Loader, c: &KlConfig, width: usize, act: Act) -> Result<Moe> {
    let (e, h, i) = (c.ds.experts, c.ds.hidden, c.ds.moe_inter);
    let bias_name = "gate.e_score_correction_bias";
    let experts = (0..e)
        .map(|x| {
            let ex = vb.pp(format!("experts.{x}"));
            Ok(Mlp {
                gate: ex.get("w1.weight", &[i, width])?,
                up: ex.get("w3.weight", &[i, width])?,
                down: ex.get("w2.weight", &[width, i])?,
                inter: i,
                act,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Moe {
        router: vb.get("gate.weight", &[e, h])?,
        bias: if vb.has(bias_name) {
            vb.get(bias_name, &[e])?
        } else {
            vec![0.0; e]
        },
        experts,
        shared: match c.ds.shared {
            0 => None,
            n => Some(Mlp {
                act,
                ..mlp(&vb.pp("shared_experts"), h, i * n)?
            }),
        },
    })
}

fn layer(decoder: &Loader, l: usize, c: &KlConfig) -> Result<Layer> {
    let vb = decoder.pp(format!("layers.{l}"));
    let h = c.ds.hidden;
    let ffn = if l < c.ds.first_dense {
        // The real checkpoint names the dense MLP `mlp.`; transformers' save_pretrained renames
        // it with the MoE (`block_sparse_moe.`), so both are read.
        let under = if vb.has("mlp.gate_proj.weight") {
            "mlp"
        } else {
            "block_sparse_moe"
        };
        Ffn::Dense(mlp(&vb.pp(under), h, c.ds.inter)?)
    } else {
        Ffn::Moe(moe(&vb.pp("block_sparse_moe"), c)?)
    };
    let sa = vb.pp("self_attn");
    let mix = match c.mixers[l] {
        Mixer::Kda => Mix::Kda(Box::new(kda(&sa, c)?)),
        Mixer::Mla => Mix::Mla(attn(&sa, &c.ds)?),
    };
    Ok(Layer {
        input_norm: vb.get("input_layernorm.weight", &[h])?,
        post_norm: vb.get("post_attention_layernorm.weight", &[h])?,
        mix,
        ffn,
    })
}

/// Load every weight, checked against `c`.
pub fn load(ck: &Checkpoint, c: &KlConfig) -> Result<Weights> {
    let lg = Logical::new(ck)?;
    if lg.shape("model.embed_tokens.weight").is_none() {
        return Err(
            Error::source(&ck.weights.dir, "has no `model.embed_tokens.weight`")
                .with_hint("pass the directory of a KimiLinearForCausalLM checkpoint"),
        );
    }
    let top = Loader::new(&lg, "target");
    let decoder = top.pp("model");
    let (v, h) = (c.ds.vocab, c.ds.hidden);
    let embed = decoder.get("embed_tokens.weight", &[v, h])?;
    let layers = (0..c.ds.layers)
        .map(|l| layer(&decoder, l, c))
        .collect::<Result<Vec<_>>>()?;
    let norm = decoder.get("norm.weight", &[h])?;
    let lm_head = if c.ds.tie {
        embed.clone()
    } else {
        top.get("lm_head.weight", &[v, h])?
    };
    Ok(Weights {
        embed,
        layers,
        norm,
        lm_head,
    })
}
