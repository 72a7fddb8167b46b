//! The Llama-style EAGLE-3 attention projections (SpecForge / TorchSpec `LlamaForCausalLMEagle3`,
//! vLLM `layers.0.*`): q/k/v on the 2H input with grouped key/value heads, `rotate_half` RoPE
//! over the whole head, softmax scale 1/√head_dim. Mirrors `Eagle3Llama.attn_qkv` in
//! fixtures/gen/verify/common.py.

use super::source::Source;
use crate::error::Result;
use crate::runtime::linears::Linear;
use crate::runtime::rope::Rope;

/// Grouped-query attention projections of a Llama-style draft layer.
pub struct LlamaAttention {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// RoPE table over `head_dim` (plain; YaRN tables apply their cos/sin factor only).
    pub rope: Rope,
    pub(super) q: Linear,
    pub(super) k: Linear,
    pub(super) v: Linear,
    pub(super) o: Linear,
}

impl LlamaAttention {
    pub(super) fn load(src: &Source, h: usize) -> Result<LlamaAttention> {
        let d = src.dims;
        let heads = src.need(d.num_attention_heads, "num_attention_heads")?;
        let kv_heads = d.num_key_value_heads.map_or(heads, |x| x as usize);
        let head_dim = d.head_dim.map_or(h / heads, |x| x as usize);
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(src.err(format!(
                "{heads} attention heads are not a multiple of {kv_heads} key/value heads"
            )));
        }
        let (qd, kvd) = (heads * head_dim, kv_heads * head_dim);
        // Llama-style YaRN scales cos/sin only; the softmax scale stays 1/√head_dim.
        let (rope, _) = src.rope(head_dim);
        let vb = src.layer.pp("self_attn");
        Ok(LlamaAttention {
            heads,
            kv_heads,
            head_dim,
            rope,
            q: vb.linear("q_proj.weight", qd, 2 * h)?,
            k: vb.linear("k_proj.weight", kvd, 2 * h)?,
            v: vb.linear("v_proj.weight", kvd, 2 * h)?,
            o: vb.linear("o_proj.weight", h, qd)?,
        })
    }

    /// q, k and v of the rows `a` (`[n, 2H]`) at RoPE positions `pos` (what the forward
    /// asks of the attention).
    pub(super) fn project(
        &self,
        a: &[f32],
        n: usize,
        pos: &[usize],
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (qd, kvd) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let mut q = self.q.apply(a, n);
        let mut k = self.k.apply(a, n);
        let v = self.v.apply(a, n);
        for (r, &p) in pos.iter().enumerate().take(n) {
            self.rope.apply_neox(&mut q[r * qd..(r + 1) * qd], p);
            self.rope.apply_neox(&mut k[r * kvd..(r + 1) * kvd], p);
        }
        (q, k, v)
    }
}
