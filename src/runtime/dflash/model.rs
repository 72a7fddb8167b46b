//! What a loaded DFlash drafter is made of: its dimensions, its decoder layers (Qwen3, or MLA for
//! the `k3-dspark` layout), fc and
//! norms, and the target's embedding and lm_head as linears of its set ([`Model`]). The
//! forward (`mod.rs`) and the step on a device (`device.rs`) both read it.

use super::super::embed::Embedding;
use super::super::linears::{Linear, LinearSet};
use super::super::rope::Rope;
use super::conv::GroupedConv;
use super::heads::Head;

/// One decoder layer: its attention (Qwen3 GQA or MLA), norms and SiLU MLP.
pub(super) struct Layer {
    pub(super) attn: super::attn::Attn,
    pub(super) input_norm: Vec<f32>,
    pub(super) post_norm: Vec<f32>,
    pub(super) gate: Linear,
    pub(super) up: Linear,
    pub(super) down: Linear,
}

/// A loaded DFlash drafter's dimensions and weights, with the target's embedding and lm_head.
pub struct Model {
    pub h: usize,
    /// Target hidden size (width of one tap).
    pub ht: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub inter: usize,
    /// Target vocabulary.
    pub vocab: usize,
    /// The config's `block_size`: DFlash's block B (B − 1 proposals per round), DSpark's N.
    pub block_size: usize,
    /// Which block drafter (DFlash, DSpark, DFlash2).
    pub kind: super::variant::Kind,
    /// The most proposals a step takes (DFlash `block_size − 1`, DSpark `block_size`).
    pub max_steps: usize,
    /// DSpark's anchor-first block: `[x_r, MASK × (N−1)]`, every row predicts the next token.
    pub anchor_first: bool,
    /// How the predicting rows become proposals.
    pub head: Head,
    /// DFlash2's convolutions per layer (attention, MLP); empty otherwise.
    pub(super) convs: Vec<[GroupedConv; 2]>,
    /// Every embedding row is scaled by this (DFlash2's `input_embedding_scale`, else 1).
    pub embed_scale: f32,
    pub mask_id: u32,
    pub eps: f32,
    /// `target_layer_ids` as written (output of layer k).
    pub layer_ids: Vec<i64>,
    /// The same taps as HF `hidden_states` indices, in concatenation order.
    pub taps: Vec<usize>,
    /// `num_target_layers` of the config, when it has one.
    pub target_layers: Option<usize>,
    pub rope: Rope,
    pub(super) layers: Vec<Layer>,
    pub(super) fc: Linear,
    pub(super) hidden_norm: Vec<f32>,
    pub(super) norm: Vec<f32>,
    pub(super) embed: Embedding,
    /// The target's lm_head (module `lm_head (target)` of the set).
    pub(super) lm_head: Linear,
    pub(super) lin: LinearSet,
}
