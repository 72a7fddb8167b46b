//! The Kimi-K3 text weights under the checkpoint's own names: the decoder layers under
//! `language_model.layers.{i}.` (vLLM's and SGLang's `hf_to_vllm_mapper` rewrite that prefix, and
//! only it, to `language_model.model.layers.`; both spellings are read), the rest under
//! `language_model.model.` (`embed_tokens`, `norm`, `output_attn_res_norm`/`_proj`) and
//! `language_model.lm_head`. Per layer: the two norms, the attention-residual scores
//! (`self_attention_res_norm`/`_proj`, `mlp_res_norm`/`_proj`), KDA (Kimi-Linear's names with a
//! full-rank `g_proj`) or MLA (q-LoRA, `g_proj` output gate), the dense `mlp.` (layer 0) or
//! `block_sparse_moe.` (router, `experts.E.w1/w3/w2` in the latent, `routed_expert_down_proj`,
//! `routed_expert_norm`, `routed_expert_up_proj`, `shared_experts`). Read as f32 through the
//! runtimes' one loader, every shape checked with the tensor named.

use super::attn_res;
use super::config::K3Config;
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::quant::decode::Logical;
use crate::runtime::deepseek::weights::{attn, mlp, Mlp, Moe};
use crate::runtime::kimi_linear::weights::{kda, moe_block, Mix};
use crate::runtime::kimi_linear::Mixer;
use crate::runtime::weights::Loader;

/// The LatentMoE block.
pub struct LatentMoe {
    /// Router, bias, the routed experts (in the latent width) and the shared experts (full).
    pub moe: Moe,
    /// `routed_expert_down_proj` `[latent, H]`.
    pub down: Vec<f32>,
    /// `routed_expert_norm` `[latent]` (`latent_moe_use_norm`).
    pub norm: Option<Vec<f32>>,
    /// `routed_expert_up_proj` `[H, latent]`.
    pub up: Vec<f32>,
}

pub enum Ffn {
    Dense(Mlp),
    Moe(Box<LatentMoe>),
}

/// One decoder layer.
pub struct Layer {
    pub input_norm: Vec<f32>,
    pub post_norm: Vec<f32>,
    /// The attention side's mixture score (`self_attention_res_norm ⊙ self_attention_res_proj`).
    pub attn_res: Vec<f32>,
    /// The MLP side's (`mlp_res_norm ⊙ mlp_res_proj`).
    pub mlp_res: Vec<f32>,
    pub mix: Mix,
    pub ffn: Ffn,
}

pub struct Weights {
    pub embed: Vec<f32>,
    pub layers: Vec<Layer>,
    /// The output mixture's score (`output_attn_res_norm ⊙ output_attn_res_proj`).
    pub out_res: Vec<f32>,
    pub norm: Vec<f32>,
    pub lm_head: Vec<f32>,
}

/// A mixture score under `vb`: `{name}_norm.weight` `[H]` ⊙ `{name}_proj.weight` `[1, H]`.
fn res(vb: &Loader, name: &str, h: usize) -> Result<Vec<f32>> {
    Ok(attn_res::score(
        &vb.get(&format!("{name}_norm.weight"), &[h])?,
        &vb.get(&format!("{name}_proj.weight"), &[1, h])?,
    ))
}

/// A tensor the config switches off (`flag` false or missing) must not be in the checkpoint:
/// the forward would leave it out while the checkpoint's model runs it. vLLM 0.33.0 refuses
/// such a checkpoint too: `vllm/models/kimi_k3/nvidia/model.py` `load_weights` builds no
/// parameter for it, and `params_dict[name]` raises.
fn unused(vb: &Loader, name: &str, flag: &str) -> Result<()> {
    match vb.has(name) {
        true => Err(Error::source(
            vb.dir(),
            format!(
                "has tensor `{}`, but config.json's `{flag}` is false or missing: the config and the weights describe two models",
                vb.path(name)
            ),
        )
        .with_hint(format!(
            "set `{flag}` to true in config.json if the model was trained with it, or use the config.json that came with these weights"
        ))),
        false => Ok(()),
    }
}

fn latent_moe(vb: &Loader, c: &K3Config) -> Result<LatentMoe> {
    let (h, lt) = (c.ds().hidden, c.latent);
    Ok(LatentMoe {
        moe: moe_block(vb, &c.kl, lt, c.act)?,
        down: vb.get("routed_expert_down_proj.weight", &[lt, h])?,
        norm: match c.latent_norm {
            true => Some(vb.get("routed_expert_norm.weight", &[lt])?),
            false => {
                unused(vb, "routed_expert_norm.weight", "latent_moe_use_norm")?;
                None
            }
        },
        up: vb.get("routed_expert_up_proj.weight", &[h, lt])?,
    })
}

fn layer(layers: &Loader, l: usize, c: &K3Config) -> Result<Layer> {
    let vb = layers.pp(l);
    let ds = c.ds();
    let h = ds.hidden;
    let ffn = if l < ds.first_dense {
        Ffn::Dense(Mlp {
            act: c.act,
            ..mlp(&vb.pp("mlp"), h, ds.inter)?
        })
    } else {
        Ffn::Moe(Box::new(latent_moe(&vb.pp("block_sparse_moe"), c)?))
    };
    let sa = vb.pp("self_attn");
    let mix = match c.kl.mixers[l] {
        Mixer::Kda => Mix::Kda(Box::new(kda(&sa, &c.kl)?)),
        Mixer::Mla => {
            let mut a = attn(&sa, ds)?;
            if c.mla_gate {
                a.gate = Some(sa.get("g_proj.weight", &[ds.heads * ds.v_dim, h])?);
            } else {
                unused(&sa, "g_proj.weight", "mla_use_output_gate")?;
            }
            Mix::Mla(a)
        }
    };
    Ok(Layer {
        input_norm: vb.get("input_layernorm.weight", &[h])?,
        post_norm: vb.get("post_attention_layernorm.weight", &[h])?,
        attn_res: res(&vb, "self_attention_res", h)?,
        mlp_res: res(&vb, "mlp_res", h)?,
        mix,
        ffn,
    })
}

/// Load every weight, checked against `c`; a missing tensor or a wrong shape is an error that
/// names the tensor and says what to do (K3's hint, in place of the shared loader's generic one).
pub fn load(ck: &Checkpoint, c: &K3Config) -> Result<Weights> {
    const HINT: &str = "the weights and config.json describe different models: use the config.json that came with these weights (`kquant inspect --tensors DIR` lists the tensors and their shapes)";
    read_all(ck, c).map_err(|e| match e {
        Error::Tensor { hint: None, .. } | Error::Source { hint: None, .. } => e.with_hint(HINT),
        e => e,
    })
}

fn read_all(ck: &Checkpoint, c: &K3Config) -> Result<Weights> {
    let lg = Logical::new(ck)?;
    if lg
        .shape("language_model.model.embed_tokens.weight")
        .is_none()
    {
        return Err(Error::source(
            &ck.weights.dir,
            "has no `language_model.model.embed_tokens.weight`",
        )
        .with_hint("pass the directory of a KimiK3ForConditionalGeneration checkpoint"));
    }
    let top = Loader::new(&lg, "target");
    let lm = top.pp("language_model");
    let decoder = lm.pp("model");
    // The checkpoint's spelling first, then the one the engines map it to.
    let layers = ["language_model.layers", "language_model.model.layers"]
        .into_iter()
        .find(|p| lg.shape(&format!("{p}.0.input_layernorm.weight")).is_some())
        .map_or_else(|| lm.pp("layers"), |p| top.pp(p));
    let ds = c.ds();
    let (v, h) = (ds.vocab, ds.hidden);
    Ok(Weights {
        embed: decoder.get("embed_tokens.weight", &[v, h])?,
        layers: (0..ds.layers)
            .map(|l| layer(&layers, l, c))
            .collect::<Result<Vec<_>>>()?,
        out_res: res(&decoder, "output_attn_res", h)?,
        norm: decoder.get("norm.weight", &[h])?,
        lm_head: if ds.tie {
            decoder.get("embed_tokens.weight", &[v, h])?
        } else {
            lm.get("lm_head.weight", &[v, h])?
        },
    })
}
