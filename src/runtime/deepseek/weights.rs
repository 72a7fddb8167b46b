//! The DeepSeek-V3 weights and their loading as f32 with the runtimes' one loader
//! (`runtime::weights`, through `quant::decode::Logical`, so bf16 and every quantized layout
//! kquant reads load alike), every tensor's shape checked against the config with the tensor
//! named in the error.

use super::config::DsConfig;
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::ops::silu;
use crate::quant::decode::Logical;
use crate::runtime::weights::Loader;

/// A gated MLP's activation of its gate and up projections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Act {
    /// SwiGLU: `silu(gate) · up`.
    Silu,
    /// SiTU (vLLM `SituAndMul.forward_native`, Kimi-K3's `hidden_act: situ`):
    /// `β·tanh(gate/β)·sigmoid(gate) · β_lin·tanh(up/β_lin)` (`activation_situ_beta`,
    /// `activation_situ_linear_beta`; `up` passed through when the latter is unset).
    Situ { beta: f32, linear_beta: Option<f32> },
}

impl Act {
    pub fn apply(self, gate: f32, up: f32) -> f32 {
        match self {
            Act::Silu => silu(gate) * up,
            Act::Situ { beta, linear_beta } => {
                let g = beta * (gate / beta).tanh() / (1.0 + (-gate).exp());
                let u = linear_beta.map_or(up, |lb| lb * (up / lb).tanh());
                g * u
            }
        }
    }
}

/// A gated MLP (`down(act(gate x, up x))`, SwiGLU unless Kimi-K3's SiTU); `inter` its
/// intermediate width.
pub struct Mlp {
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
    pub inter: usize,
    pub act: Act,
}

/// The query projection: plain or low-rank with a norm in between.
pub enum QProj {
    Full(Vec<f32>),
    Lora {
        a: Vec<f32>,
        norm: Vec<f32>,
        b: Vec<f32>,
    },
}

/// Multi-head latent attention weights.
pub struct Attn {
    pub q: QProj,
    /// `kv_a_proj_with_mqa` `[kv_lora + rope, H]`.
    pub kv_a: Vec<f32>,
    pub kv_norm: Vec<f32>,
    /// `kv_b_proj` `[heads · (nope + v), kv_lora]`.
    pub kv_b: Vec<f32>,
    /// `o_proj` `[H, heads · v]`.
    pub o: Vec<f32>,
    /// Kimi-K3's sigmoid output gate `g_proj` `[heads · v, H]` (`mla_use_output_gate`), applied
    /// per element before `o_proj`; none in DeepSeek-V3 and Kimi-Linear.
    pub gate: Option<Vec<f32>>,
}

/// The routed-expert block.
pub struct Moe {
    /// Router `[experts, H]`.
    pub router: Vec<f32>,
    /// `e_score_correction_bias` (zeros when the checkpoint has none, as transformers inits it).
    pub bias: Vec<f32>,
    pub experts: Vec<Mlp>,
    pub shared: Option<Mlp>,
}

pub enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

/// One decoder layer: its two norms, its token mixer (`M`: MLA here, MLA or KDA in
/// Kimi-Linear) and its feed-forward block.
pub struct Layer<M = Attn> {
    pub input_norm: Vec<f32>,
    pub post_norm: Vec<f32>,
    pub mix: M,
    pub ffn: Ffn,
}

/// A whole model's weights, its layers of type `L` (Kimi-Linear's mix KDA and MLA).
pub struct Weights<L = Layer> {
    pub embed: Vec<f32>,
    pub layers: Vec<L>,
    pub norm: Vec<f32>,
    /// `[vocab, H]` (the embedding when tied).
    pub lm_head: Vec<f32>,
}

/// A SwiGLU MLP under `vb`.
pub(crate) fn mlp(vb: &Loader, h: usize, inter: usize) -> Result<Mlp> {
    Ok(Mlp {
        gate: vb.get("gate_proj.weight", &[inter, h])?,
        up: vb.get("up_proj.weight", &[inter, h])?,
        down: vb.get("down_proj.weight", &[h, inter])?,
        inter,
        act: Act::Silu,
    })
}

/// The MLA attention weights under `vb` (a layer's `self_attn.`).
pub(crate) fn attn(vb: &Loader, c: &DsConfig) -> Result<Attn> {
    let (h, nh) = (c.hidden, c.heads);
    let q = match c.q_lora {
        None => QProj::Full(vb.get("q_proj.weight", &[nh * c.qk_head(), h])?),
        Some(r) => QProj::Lora {
            a: vb.get("q_a_proj.weight", &[r, h])?,
            norm: vb.get("q_a_layernorm.weight", &[r])?,
            b: vb.get("q_b_proj.weight", &[nh * c.qk_head(), r])?,
        },
    };
    for b in ["q_a_proj.bias", "kv_a_proj_with_mqa.bias", "o_proj.bias"] {
        if vb.has(b) {
            return Err(vb.error(
                b,
                "attention biases (`attention_bias: true`) are not supported",
            ));
        }
    }
    Ok(Attn {
        q,
        kv_a: vb.get("kv_a_proj_with_mqa.weight", &[c.kv_lora + c.rope_dim, h])?,
        kv_norm: vb.get("kv_a_layernorm.weight", &[c.kv_lora])?,
        kv_b: vb.get("kv_b_proj.weight", &[nh * (c.nope + c.v_dim), c.kv_lora])?,
        o: vb.get("o_proj.weight", &[h, nh * c.v_dim])?,
        gate: None,
    })
}

/// Routed experts: one module per expert (checkpoint layout), or transformers 5's fused
/// `experts.gate_up_proj` `[E, 2I, H]` + `experts.down_proj` `[E, H, I]`.
fn experts(vb: &Loader, c: &DsConfig) -> Result<Vec<Mlp>> {
    let (e, h, i) = (c.experts, c.hidden, c.moe_inter);
    if vb.has("experts.gate_up_proj") {
        let gu = vb.get("experts.gate_up_proj", &[e, 2 * i, h])?;
        let dn = vb.get("experts.down_proj", &[e, h, i])?;
        return Ok((0..e)
            .map(|x| {
                let g = &gu[x * 2 * i * h..(x + 1) * 2 * i * h];
                Mlp {
                    gate: g[..i * h].to_vec(),
                    up: g[i * h..].to_vec(),
                    down: dn[x * h * i..(x + 1) * h * i].to_vec(),
                    inter: i,
                    act: Act::Silu,
                }
            })
            .collect());
    }
    (0..e)
        .map(|x| mlp(&vb.pp(format!("experts.{x}")), h, i))
        .collect()
}

/// Decoder layer `l` (under `decoder`, the `model.` prefix).
fn layer(decoder: &Loader, l: usize, c: &DsConfig) -> Result<Layer> {
    let vb = decoder.pp(format!("layers.{l}"));
    let h = c.hidden;
    let m = vb.pp("mlp");
    let ffn = if l < c.first_dense {
        Ffn::Dense(mlp(&m, h, c.inter)?)
    } else {
        let bias_name = "gate.e_score_correction_bias";
        Ffn::Moe(Moe {
            router: m.get("gate.weight", &[c.experts, h])?,
            bias: if m.has(bias_name) {
                m.get(bias_name, &[c.experts])?
            } else {
                vec![0.0; c.experts]
            },
            experts: experts(&m, c)?,
            shared: match c.shared {
                0 => None,
                n => Some(mlp(&m.pp("shared_experts"), h, c.moe_inter * n)?),
            },
        })
    };
    Ok(Layer {
        input_norm: vb.get("input_layernorm.weight", &[h])?,
        post_norm: vb.get("post_attention_layernorm.weight", &[h])?,
        mix: attn(&vb.pp("self_attn"), c)?,
        ffn,
    })
}

/// Where the decoder lives: `model` (DeepseekV3ForCausalLM), `language_model.model` (Kimi-K2.5
/// multimodal wrapper), and where its `lm_head` is.
fn prefixes(lg: &Logical) -> Option<(&'static str, &'static str)> {
    [
        ("model", "lm_head.weight"),
        ("language_model.model", "language_model.lm_head.weight"),
        ("model.language_model", "lm_head.weight"),
    ]
    .into_iter()
    .find(|(p, _)| lg.shape(&format!("{p}.embed_tokens.weight")).is_some())
}

/// Load every weight, checked against `c`.
pub fn load(ck: &Checkpoint, c: &DsConfig) -> Result<Weights> {
    let lg = Logical::new(ck)?;
    let (prefix, head) = prefixes(&lg).ok_or_else(|| {
        Error::source(
            &ck.weights.dir,
            "has no `model.embed_tokens.weight` (nor `language_model.model.embed_tokens.weight`)",
        )
        .with_hint("pass the directory of a DeepseekV3ForCausalLM (Kimi-K2) checkpoint")
    })?;
    let top = Loader::new(&lg, "target");
    let decoder = top.pp(prefix);
    let (v, h) = (c.vocab, c.hidden);
    let embed = decoder.get("embed_tokens.weight", &[v, h])?;
    let layers = (0..c.layers)
        .map(|l| layer(&decoder, l, c))
        .collect::<Result<Vec<_>>>()?;
    let norm = decoder.get("norm.weight", &[h])?;
    // transformers ties `lm_head` to the embedding when `tie_word_embeddings` is set, whatever
    // the checkpoint holds.
    let lm_head = if c.tie {
        embed.clone()
    } else {
        top.get(head, &[v, h])?
    };
    Ok(Weights {
        embed,
        layers,
        norm,
        lm_head,
    })
}
