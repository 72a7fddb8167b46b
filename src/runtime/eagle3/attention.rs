//! What differs between the EAGLE-3 attention variants, as one trait ([`Attention`]) the
//! shared forward calls, and how each variant (`llama_attn`, `mla_attn`) answers it. The
//! variants' files hold their weights, loaders and projections and name nothing here, so the
//! forward (`mod.rs`) and `load` depend on this file and it on the variants, never back.

use super::llama_attn::LlamaAttention;
use super::mla_attn::MlaAttention;

/// Projected attention inputs of `n` rows, RoPE applied: `q` `[n, heads · qk_dim]`,
/// `k` `[n, kv_heads · qk_dim]`, `v` `[n, kv_heads · v_dim]` (heads contiguous in each row).
pub struct Qkv {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// What differs between EAGLE-3 variants: how the 2H attention input becomes queries, keys and
/// values, and how the attention output returns to H. Query head `i` reads key/value head
/// `i / (heads / kv_heads)`.
pub trait Attention: Send + Sync {
    fn heads(&self) -> usize;
    fn kv_heads(&self) -> usize;
    /// Width of one query/key head.
    fn qk_dim(&self) -> usize;
    /// Width of one value head.
    fn v_dim(&self) -> usize;
    /// Multiplier of q·k before the softmax.
    fn scale(&self) -> f32;
    /// q/k/v of the rows `a` (`[n, 2H]`) at RoPE positions `pos`.
    fn qkv(&self, a: &[f32], n: usize, pos: &[usize]) -> Qkv;
    /// `o_proj` of the attention output `[n, heads · v_dim]`.
    fn out(&self, o: &[f32], n: usize) -> Vec<f32>;
    /// The Llama-style variant (its step can stay on a device: `device`).
    fn llama(&self) -> Option<&LlamaAttention> {
        None
    }
    /// The MLA variant (its step can stay on a device too).
    fn mla(&self) -> Option<&MlaAttention> {
        None
    }
}

impl Attention for LlamaAttention {
    fn llama(&self) -> Option<&LlamaAttention> {
        Some(self)
    }
    fn heads(&self) -> usize {
        self.heads
    }
    fn kv_heads(&self) -> usize {
        self.kv_heads
    }
    fn qk_dim(&self) -> usize {
        self.head_dim
    }
    fn v_dim(&self) -> usize {
        self.head_dim
    }
    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
    fn qkv(&self, a: &[f32], n: usize, pos: &[usize]) -> Qkv {
        let (q, k, v) = self.project(a, n, pos);
        Qkv { q, k, v }
    }
    fn out(&self, o: &[f32], n: usize) -> Vec<f32> {
        self.o.apply(o, n)
    }
}

impl Attention for MlaAttention {
    fn mla(&self) -> Option<&MlaAttention> {
        Some(self)
    }
    fn heads(&self) -> usize {
        self.shape.heads
    }
    fn kv_heads(&self) -> usize {
        self.shape.heads
    }
    fn qk_dim(&self) -> usize {
        self.shape.nope + self.shape.rope_dim
    }
    fn v_dim(&self) -> usize {
        self.shape.v_dim
    }
    fn scale(&self) -> f32 {
        self.softmax_scale
    }
    fn qkv(&self, a: &[f32], n: usize, pos: &[usize]) -> Qkv {
        let (q, k, v) = self.project(a, n, pos);
        Qkv { q, k, v }
    }
    fn out(&self, o: &[f32], n: usize) -> Vec<f32> {
        self.o.apply(o, n)
    }
}
