//! Loading an EAGLE-3 draft (Llama-style or MLA): the dimensions detection found, the shared
//! weights (fc, norms, MLP, lm_head, the embedding or the target's, d2t) and, through
//! [`Source`], each attention variant's own projections (the variants' loaders read a
//! [`Source`] and never call back here). Tensors are read with the runtimes' one
//! loader ([`crate::runtime::weights::Loader`]); linears go through the draft's
//! [`LinearSet`] hook.

use super::attention::Attention;
use super::llama_attn::LlamaAttention;
use super::mla_attn::MlaAttention;
use super::model::{Model, Weights};
use super::source::Source;
use super::Eagle3;
use crate::checkpoint::{Checkpoint, Detection, Family};
use crate::error::{Error, Result};
use crate::quant::decode::Logical;
use crate::runtime::embed::Embedding;
use crate::runtime::linears::{Exec, LinearSet};
use crate::runtime::weights::Loader;

impl Eagle3 {
    /// Load from a checkpoint detected as an EAGLE-3 draft (Llama-style or MLA). `target_embed`
    /// supplies the target's embedding `[vocab, H]` when the draft does not carry one. Every
    /// linear runs in f32 ([`Exec::F32`]).
    pub fn load(
        ck: &Checkpoint,
        det: &Detection,
        target_embed: Option<Vec<f32>>,
    ) -> Result<Eagle3> {
        Eagle3::load_on(ck, det, target_embed, Exec::F32)
    }

    /// [`Eagle3::load`] with the quantized linears placed by `exec`.
    pub fn load_on(
        ck: &Checkpoint,
        det: &Detection,
        target_embed: Option<Vec<f32>>,
        exec: Exec,
    ) -> Result<Eagle3> {
        if !matches!(det.family, Family::Eagle3 | Family::Eagle3Mla) {
            return Err(Error::source(
                &ck.weights.dir,
                format!(
                    "is `{}`; this runtime runs EAGLE-3 drafts (Llama-style or MLA)",
                    det.family.id()
                ),
            ));
        }
        let lg = Logical::new(ck)?;
        let lin = LinearSet::new(exec);
        let vb = Loader::new(&lg, "draft").with_linears(&lin);
        let layer_prefix = det.layer_prefix.as_deref().unwrap_or("midlayer.");
        let src = Source {
            layer: vb.pp(layer_prefix.trim_end_matches('.')),
            dims: &det.dims,
            dir: &ck.weights.dir,
            cfg: ck.config.as_ref(),
        };
        let d = &det.dims;
        d.check_bounded()
            .map_err(|m| src.err(m).with_hint("a dimension of config.json is past any real model's; check the file (`kquant inspect` shows what it reads)"))?;
        let h = src.need(d.hidden_size, "hidden_size")?;
        let ht = d.target_hidden_size.map_or(h, |x| x as usize);
        let inter = src.need(d.intermediate_size, "intermediate_size")?;
        let vocab = src.need(d.vocab_size, "vocab_size")?;
        let draft_vocab = d.draft_vocab_size.map_or(vocab, |x| x as usize);
        let eps = src.num("rms_norm_eps").unwrap_or(1e-6) as f32;
        let cfg_value = ck
            .config
            .as_ref()
            .map(|c| serde_json::Value::Object(c.root.clone()))
            .unwrap_or_default();
        let norm_output = crate::checkpoint::detect::eagle3_feeds_post_norm(det, &cfg_value);
        let taps = det
            .aux_layers
            .as_ref()
            .and_then(|a| a.hidden_states.clone())
            .map(|v| v.into_iter().map(|x| x as usize).collect())
            .unwrap_or_default();
        let attn: Box<dyn Attention> = match det.family {
            Family::Eagle3Mla => Box::new(MlaAttention::load(&src, h, eps)?),
            _ => Box::new(LlamaAttention::load(&src, h)?),
        };
        let fc_norm = if vb.has("fc_norm.0.weight") {
            Some([
                vb.get("fc_norm.0.weight", &[ht])?,
                vb.get("fc_norm.1.weight", &[ht])?,
                vb.get("fc_norm.2.weight", &[ht])?,
            ])
        } else {
            None
        };
        let embed = embedding(ck, &lg, &vb, target_embed, vocab, h)?;
        let d2t = crate::runtime::d2t::read(ck, draft_vocab, vocab)?;
        let layer = &src.layer;
        let w = Weights {
            gate: layer.linear("mlp.gate_proj.weight", inter, h)?,
            up: layer.linear("mlp.up_proj.weight", inter, h)?,
            down: layer.linear("mlp.down_proj.weight", h, inter)?,
            hidden_norm: layer.get("hidden_norm.weight", &[h])?,
            input_norm: layer.get("input_layernorm.weight", &[h])?,
            post_norm: layer.get("post_attention_layernorm.weight", &[h])?,
            fc: vb.linear("fc.weight", h, 3 * ht)?,
            fc_norm,
            norm: vb.get("norm.weight", &[h])?,
            lm_head: vb.linear("lm_head.weight", draft_vocab, h)?,
            embed,
            d2t,
        };
        let mut e = Eagle3 {
            m: Model {
                family: det.family.clone(),
                h,
                ht,
                inter,
                vocab,
                draft_vocab,
                eps,
                norm_output,
                taps,
                attn,
                w,
                lin,
            },
            step: None,
        };
        e.place_step()?;
        Ok(e)
    }
}

/// The draft's embedding `[vocab, H]`: its own unquantized one stays in its mapped file (rows
/// read on demand), else its own read whole, else the target's (`target_embed`).
fn embedding(
    ck: &Checkpoint,
    lg: &Logical,
    vb: &Loader,
    target_embed: Option<Vec<f32>>,
    vocab: usize,
    h: usize,
) -> Result<Embedding> {
    let mapped = match lg.module("embed_tokens.weight") {
        None => Embedding::map(ck, "embed_tokens.weight", vocab, h)?,
        Some(_) => None,
    };
    let embed = match (mapped, vb.has("embed_tokens.weight")) {
        (Some(m), _) => m,
        (None, true) => Embedding::Dense {
            h,
            v: vb.get("embed_tokens.weight", &[vocab, h])?,
        },
        (None, false) => Embedding::Dense {
            h,
            v: target_embed.ok_or_else(|| {
                Error::source(
                    &ck.weights.dir,
                    "the draft has no embed_tokens and no target embedding was given",
                )
                .with_hint(
                    "pass --target-checkpoint (the target checkpoint) so its embedding can be used",
                )
            })?,
        },
    };
    if embed.numel() != vocab * h {
        return Err(Error::Usage(format!(
            "target embedding has {} values, the draft needs [{vocab}, {h}]",
            embed.numel()
        )));
    }
    Ok(embed)
}
