//! The DeepSeek MLA EAGLE-3 attention projections (TorchSpec `Eagle3DeepseekV2ForCausalLM`,
//! vLLM/SGLang `deepseek_eagle3.py`, the Kimi-K2.5 MLA drafts): on the 2H input,
//! q = q_b(q_a_norm(q_a(x))) (or q_proj(x) when `q_lora_rank` is null) split nope|rope per head;
//! kv_a_proj_with_mqa(x) = c|k_rope with one k_rope shared by all heads;
//! kv_b(kv_a_norm(c)) = k_nope|v per head; interleaved RoPE (DeepSeek pairs) with the YaRN
//! frequencies and cos/sin factor on q_rope and k_rope; softmax scale
//! mscale(factor, mscale_all_dim)² / √(nope + rope). Mirrors `Eagle3MLA.attn_qkv` in
//! fixtures/gen/verify/common.py.

use super::source::Source;
use crate::error::Result;
use crate::ops::rms_norm;
use crate::runtime::linears::Linear;
use crate::runtime::rope::Rope;
use crate::runtime::weights::Loader;

/// The query projection: low-rank with a norm between (`q_a_proj`, `q_a_layernorm`,
/// `q_b_proj`) or one full matrix (`q_proj`, `q_lora_rank` null).
pub(super) enum QProj {
    Lora {
        rank: usize,
        a: Linear,
        norm: Vec<f32>,
        b: Linear,
    },
    Full(Linear),
}

/// Multi-head latent attention projections of an MLA draft layer.
pub struct MlaAttention {
    /// The widths (`q_lora_rank` as loaded: `None` for `q_proj`).
    pub shape: MlaShape,
    /// Interleaved RoPE table over `rope_dim` (YaRN when the config says so).
    pub rope: Rope,
    /// Softmax scale: YaRN's mscale² over √(nope + rope).
    pub softmax_scale: f32,
    pub(super) eps: f32,
    pub(super) q: QProj,
    pub(super) kv_a: Linear,
    pub(super) kv_a_norm: Vec<f32>,
    pub(super) kv_b: Linear,
    pub(super) o: Linear,
}

/// An MLA attention's widths: heads, the q-LoRA rank (`None`: `q_proj`, or read from
/// `q_a_proj`'s shape), the KV latent and the nope / rope / value head widths.
#[derive(Clone, Copy, Debug)]
pub struct MlaShape {
    pub heads: usize,
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub nope: usize,
    pub rope_dim: usize,
    pub v_dim: usize,
}

impl MlaAttention {
    pub(super) fn load(src: &Source, h: usize, eps: f32) -> Result<MlaAttention> {
        let d = src.dims;
        let shape = MlaShape {
            heads: src.need(d.num_attention_heads, "num_attention_heads")?,
            q_lora_rank: d.q_lora_rank.map(|r| r as usize),
            kv_lora_rank: src.need(d.kv_lora_rank, "kv_lora_rank")?,
            nope: src.need(d.qk_nope_head_dim, "qk_nope_head_dim")?,
            rope_dim: src.need(d.qk_rope_head_dim, "qk_rope_head_dim")?,
            v_dim: src.need(d.v_head_dim, "v_head_dim")?,
        };
        let rope = src.rope(shape.rope_dim);
        MlaAttention::read(&src.layer.pp("self_attn"), shape, (2 * h, h), rope, eps)
    }

    /// The projections under `vb` (the layer's `self_attn.`): rows `input` wide in, `h` out
    /// of `o_proj`; `rope` the table and the softmax multiplier ([`Rope::from_config`]).
    pub fn read(
        vb: &Loader,
        s: MlaShape,
        (input, h): (usize, usize),
        (rope, mult): (Rope, f32),
        eps: f32,
    ) -> Result<MlaAttention> {
        let (heads, kvlr, nope, rope_dim, v_dim) =
            (s.heads, s.kv_lora_rank, s.nope, s.rope_dim, s.v_dim);
        let qd = heads * (nope + rope_dim);
        let q = match vb.shape("q_a_proj.weight") {
            Some(a_shape) => {
                let rank = s.q_lora_rank.unwrap_or(a_shape[0]);
                QProj::Lora {
                    rank,
                    a: vb.linear("q_a_proj.weight", rank, input)?,
                    norm: vb.get("q_a_layernorm.weight", &[rank])?,
                    b: vb.linear("q_b_proj.weight", qd, rank)?,
                }
            }
            None => QProj::Full(vb.linear("q_proj.weight", qd, input)?),
        };
        let q_lora_rank = match &q {
            QProj::Lora { rank, .. } => Some(*rank),
            QProj::Full(_) => None,
        };
        Ok(MlaAttention {
            shape: MlaShape { q_lora_rank, ..s },
            rope,
            softmax_scale: mult / ((nope + rope_dim) as f32).sqrt(),
            eps,
            q,
            kv_a: vb.linear("kv_a_proj_with_mqa.weight", kvlr + rope_dim, input)?,
            kv_a_norm: vb.get("kv_a_layernorm.weight", &[kvlr])?,
            kv_b: vb.linear("kv_b_proj.weight", heads * (nope + v_dim), kvlr)?,
            o: vb.linear("o_proj.weight", h, heads * v_dim)?,
        })
    }

    /// q, k and v of the rows `a` (`[n, input]`) at RoPE positions `pos` (what the forward
    /// asks of the attention).
    pub(super) fn project(
        &self,
        a: &[f32],
        n: usize,
        pos: &[usize],
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let q = self.queries(a, n, pos, false);
        let (k, v) = self.keys_values(a, n, pos, false);
        (q, k, v)
    }

    /// The queries `[n, heads · (nope + rope)]` of the rows `a`, RoPE on each head's rope part
    /// at `pos`; `reference`: the plain matmuls ([`Linear::apply_ref`]).
    pub fn queries(&self, a: &[f32], n: usize, pos: &[usize], reference: bool) -> Vec<f32> {
        let s = &self.shape;
        let (nh, dq) = (s.heads, s.nope + s.rope_dim);
        let lin = |l: &Linear, x: &[f32]| {
            if reference {
                l.apply_ref(x, n)
            } else {
                l.apply(x, n)
            }
        };
        let mut q = match &self.q {
            QProj::Lora {
                rank,
                a: qa,
                norm,
                b,
            } => lin(b, &rms_norm(&lin(qa, a), *rank, norm, self.eps)),
            QProj::Full(w) => lin(w, a),
        };
        for (r, row) in q.chunks_mut(nh * dq).enumerate() {
            for qh in row.chunks_mut(dq) {
                self.rope.apply_interleaved(&mut qh[s.nope..], pos[r]);
            }
        }
        q
    }

    /// The keys `[n, heads · (nope + rope)]` and values `[n, heads · v_dim]` of the rows `a`:
    /// `kv_b(kv_a_norm(c))` per head, with the one k_rope (RoPE at `pos`) every head shares.
    pub fn keys_values(
        &self,
        a: &[f32],
        n: usize,
        pos: &[usize],
        reference: bool,
    ) -> (Vec<f32>, Vec<f32>) {
        let s = &self.shape;
        let (nh, nope, rd, vd) = (s.heads, s.nope, s.rope_dim, s.v_dim);
        let (dq, kvlr) = (nope + rd, s.kv_lora_rank);
        let lin = |l: &Linear, x: &[f32]| {
            if reference {
                l.apply_ref(x, n)
            } else {
                l.apply(x, n)
            }
        };
        let kv = lin(&self.kv_a, a);
        let c: Vec<f32> = kv
            .chunks(kvlr + rd)
            .flat_map(|row| row[..kvlr].to_vec())
            .collect();
        let kvb = lin(&self.kv_b, &rms_norm(&c, kvlr, &self.kv_a_norm, self.eps));
        let mut k = vec![0f32; n * nh * dq];
        let mut v = vec![0f32; n * nh * vd];
        for r in 0..n {
            let mut kr = kv[r * (kvlr + rd) + kvlr..(r + 1) * (kvlr + rd)].to_vec();
            self.rope.apply_interleaved(&mut kr, pos[r]);
            for head in 0..nh {
                let src = &kvb[(r * nh + head) * (nope + vd)..(r * nh + head + 1) * (nope + vd)];
                let kh = &mut k[(r * nh + head) * dq..(r * nh + head + 1) * dq];
                kh[..nope].copy_from_slice(&src[..nope]);
                kh[nope..].copy_from_slice(&kr);
                v[(r * nh + head) * vd..(r * nh + head + 1) * vd].copy_from_slice(&src[nope..]);
            }
        }
        (k, v)
    }

    /// `o_proj` of the attention output `[n, heads · v_dim]`.
    pub fn out_proj(&self, o: &[f32], n: usize, reference: bool) -> Vec<f32> {
        if reference {
            self.o.apply_ref(o, n)
        } else {
            self.o.apply(o, n)
        }
    }
}
