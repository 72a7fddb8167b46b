//! Multi-head latent attention (transformers' `DeepseekV3Attention`) over a chunk of new
//! positions with a cache of the earlier ones: `q = q_b(norm(q_a x))` (or `q_proj x`), the
//! compressed `kv_a x` split into a normed latent and a shared rope key, `kv_b` expanding the
//! latent into per-head `k_nope` and `v`, RoPE on the rope dims of q and k, causal softmax
//! attention with the YaRN-scaled softmax scale, `o_proj`.
//!
//! Kimi-Linear's MLA (`nope_only`) is the same block with no rotation anywhere; Kimi-K3's adds
//! a sigmoid output gate (`Attn::gate`, vLLM `kimi_k3/nvidia/mla.py` `_gate_sigmoid_mul`).
//!
//! transformers' interleaved RoPE writes the rotated pairs de-interleaved (evens then odds);
//! this one keeps the pair layout. Both apply the same permutation to q and k, so every q·k is
//! the same sum.

use rayon::prelude::*;

use super::config::DsConfig;
use super::weights::{Attn, QProj};
use super::OpImpl;
use crate::ops::{rms_norm, softmax};

/// Keys `[T, heads, nope + rope]` and values `[T, heads, v]` of the positions seen so far.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub len: usize,
}

/// Queries `[n, heads, qk]` with RoPE applied at positions `pos0..pos0+n`.
fn queries(e: OpImpl, c: &DsConfig, a: &Attn, x: &[f32], n: usize, pos0: usize) -> Vec<f32> {
    let (h, qk) = (c.hidden, c.qk_head());
    let mut q = match &a.q {
        QProj::Full(w) => e.linear(x, n, h, w, c.heads * qk),
        QProj::Lora { a, norm, b } => {
            let r = norm.len();
            let qa = rms_norm(&e.linear(x, n, h, a, r), r, norm, c.latent_eps);
            e.linear(&qa, n, r, b, c.heads * qk)
        }
    };
    for (i, row) in q.chunks_mut(c.heads * qk).enumerate() {
        for head in row.chunks_mut(qk) {
            rotate(c, &mut head[c.nope..], pos0 + i);
        }
    }
    q
}

fn rotate(c: &DsConfig, x: &mut [f32], pos: usize) {
    if c.nope_only {
        return;
    }
    if c.interleave {
        c.rope.apply_interleaved(x, pos);
    } else {
        c.rope.apply_neox(x, pos);
    }
}

/// Append the keys and values of `n` new rows to the cache.
fn extend_cache(e: OpImpl, c: &DsConfig, a: &Attn, x: &[f32], n: usize, cache: &mut KvCache) {
    let (h, kl, rd, nh) = (c.hidden, c.kv_lora, c.rope_dim, c.heads);
    let ckv = e.linear(x, n, h, &a.kv_a, kl + rd);
    let latent: Vec<f32> = ckv.chunks(kl + rd).flat_map(|r| r[..kl].to_vec()).collect();
    let latent = rms_norm(&latent, kl, &a.kv_norm, c.latent_eps);
    let per = c.nope + c.v_dim;
    let kv = e.linear(&latent, n, kl, &a.kv_b, nh * per);
    for i in 0..n {
        let mut k_rot = ckv[i * (kl + rd) + kl..(i + 1) * (kl + rd)].to_vec();
        rotate(c, &mut k_rot, cache.len + i);
        for head in 0..nh {
            let base = i * nh * per + head * per;
            cache.k.extend_from_slice(&kv[base..base + c.nope]);
            cache.k.extend_from_slice(&k_rot);
            cache.v.extend_from_slice(&kv[base + c.nope..base + per]);
        }
    }
    cache.len += n;
}

/// One head of one query row over cached positions `0..keys`: `softmax(q·k · scale) · v`.
fn attend_one(c: &DsConfig, q: &[f32], cache: &KvCache, head: usize, keys: usize, out: &mut [f32]) {
    let (nh, qk, vd) = (c.heads, c.qk_head(), c.v_dim);
    let mut sc: Vec<f32> = (0..keys)
        .map(|s| {
            let k = &cache.k[(s * nh + head) * qk..(s * nh + head + 1) * qk];
            q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * c.scale
        })
        .collect();
    softmax(&mut sc);
    out.fill(0.0);
    for (s, p) in sc.iter().enumerate() {
        let v = &cache.v[(s * nh + head) * vd..(s * nh + head + 1) * vd];
        for (o, x) in out.iter_mut().zip(v) {
            *o += p * x;
        }
    }
}

/// The attention block on `n` normed rows `x` at positions `cache.len..`: appends to `cache`,
/// returns `o_proj` of the attention output, `[n, H]`.
pub fn forward(
    e: OpImpl,
    c: &DsConfig,
    a: &Attn,
    x: &[f32],
    n: usize,
    cache: &mut KvCache,
) -> Vec<f32> {
    let pos0 = cache.len;
    let q = queries(e, c, a, x, n, pos0);
    extend_cache(e, c, a, x, n, cache);
    let (nh, qk, vd) = (c.heads, c.qk_head(), c.v_dim);
    let mut out = vec![0f32; n * nh * vd];
    let one = |idx: usize, o: &mut [f32]| {
        let (i, head) = (idx / nh, idx % nh);
        let qh = &q[(i * nh + head) * qk..(i * nh + head + 1) * qk];
        attend_one(c, qh, cache, head, pos0 + i + 1, o);
    };
    match e {
        OpImpl::Reference => out.chunks_mut(vd).enumerate().for_each(|(i, o)| one(i, o)),
        OpImpl::Fast => out
            .par_chunks_mut(vd)
            .enumerate()
            .for_each(|(i, o)| one(i, o)),
    }
    if let Some(g) = &a.gate {
        let g = e.linear(x, n, c.hidden, g, nh * vd);
        out.iter_mut()
            .zip(&g)
            .for_each(|(o, g)| *o /= 1.0 + (-g).exp());
    }
    e.linear(&out, n, nh * vd, &a.o, c.hidden)
}
