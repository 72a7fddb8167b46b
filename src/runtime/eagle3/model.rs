//! What a loaded EAGLE-3 draft is made of: its dimensions, its attention variant, its shared
//! weights and its linear set ([`Model`]). The forward (`mod.rs`), the loader (`load.rs`) and the
//! step on a device (`device.rs`) read it.

use super::super::embed::Embedding;
use super::super::linears::{Linear, LinearSet};
use super::attention::Attention;
use crate::checkpoint::Family;

pub struct Model {
    pub family: Family,
    /// The draft's hidden size H (`hidden_size`).
    pub h: usize,
    /// The target's hidden size, the width of one tap (`target_hidden_size`, else H): fc reads
    /// `3 · ht` values per position.
    pub ht: usize,
    /// The MLP's intermediate width (`intermediate_size`).
    pub inter: usize,
    /// The target vocabulary (the embedding's rows).
    pub vocab: usize,
    /// The draft's own vocabulary (lm_head's rows), mapped to target ids through d2t.
    pub draft_vocab: usize,
    /// RMSNorm epsilon (`rms_norm_eps`).
    pub eps: f32,
    /// EAGLE-3.1: the post-norm hidden state is fed back to the next depth.
    pub norm_output: bool,
    pub taps: Vec<usize>,
    pub(super) attn: Box<dyn Attention>,
    pub(super) w: Weights,
    pub(super) lin: LinearSet,
}

impl Model {
    /// The attention variant (its dimensions and projections).
    pub fn attention(&self) -> &dyn Attention {
        self.attn.as_ref()
    }

    /// The target id of draft-vocabulary id `i` (d2t offset; identity without d2t).
    pub fn to_target(&self, i: usize) -> u32 {
        (i as i64 + self.w.d2t.as_ref().map_or(0, |d| d[i])) as u32
    }
}

/// The shared (non-attention) weights.
pub(super) struct Weights {
    pub(super) gate: Linear,
    pub(super) up: Linear,
    pub(super) down: Linear,
    pub(super) hidden_norm: Vec<f32>,
    pub(super) input_norm: Vec<f32>,
    pub(super) post_norm: Vec<f32>,
    pub(super) fc: Linear,
    pub(super) fc_norm: Option<[Vec<f32>; 3]>,
    pub(super) norm: Vec<f32>,
    pub(super) lm_head: Linear,
    pub(super) embed: Embedding,
    /// Draft id → target id offset.
    pub(super) d2t: Option<Vec<i64>>,
}
