//! Kimi Delta Attention over a chunk of new positions with the layer's carried state, as
//! transformers 5.23's `KimiLinearDeltaAttention` computes it (and moonshotai's
//! `modeling_kimi.py` with flash-linear-attention's kernels, whose naive reference
//! `naive_recurrent_kda` is the same recurrence):
//!
//! * `q, k, v = SiLU(causal depthwise conv_K(W_{q,k,v} x))`, the convolution seeing the last
//!   `K − 1` inputs of earlier chunks (the conv state);
//! * per head, `q` and `k` L2-normalised (`x / sqrt(Σx² + 1e-6)`), `q` scaled by `D^-½`;
//! * the channel-wise log-decay `g = −exp(A_log[h]) · softplus(f_b(f_a x) + dt_bias)` (softplus
//!   taken as `x` above 20, as transformers does) and `β = sigmoid(b_proj x)`;
//! * the gated delta rule per token: `S ← diag(exp g) S`, `S ← S + k (β (v − Sᵀk))ᵀ`,
//!   `o = Sᵀq`, with `S` `[D_k, D_v]` per head carried across chunks (the recurrent state);
//! * `o_proj(RMSNorm(o) · o_norm · sigmoid(g_b(g_a x)))` per head.
//!
//! Kimi-K3's KDA (vLLM 0.33.0 `kimi_k3/nvidia/kda.py` `KimiK3DeltaAttention`) differs in two
//! places, both read from its config: the output gate is full rank, `sigmoid(g_proj x)`
//! (`use_full_rank_gate`), and the decay is bounded below, `g = L · sigmoid(exp(A_log[h]) ·
//! (f_b(f_a x) + dt_bias))` with `L = gate_lower_bound < 0` (the `USE_LOWER_BOUND` branch of
//! its `ops/third_party/kda/fused_recurrent.py`).
//!
//! This runs the recurrence token by token for every chunk (prefill and decode alike), so a
//! prefill then single-token steps computes exactly what one long chunk does; transformers'
//! prefill runs the chunked (WY) form of the same recurrence, which the parity tests bound.

use rayon::prelude::*;

use super::config::KlConfig;
use super::weights::{KdaW, OutGate};
use crate::ops::silu;
use crate::runtime::deepseek::OpImpl;

/// The eps of the in-kernel L2 norm of q and k (`use_qk_l2norm_in_kernel`).
const L2_EPS: f32 = 1e-6;

/// What a KDA layer carries from one chunk to the next.
#[derive(Debug, Clone)]
pub struct KdaState {
    /// The last `K − 1` pre-convolution rows `[K − 1, 3C]` (q | k | v), zeros before the first
    /// token (the convolution's causal padding).
    pub conv: Vec<f32>,
    /// The recurrent state, `[heads, D_k, D_v]`.
    pub s: Vec<f32>,
}

impl KdaState {
    pub fn new(c: &KlConfig) -> KdaState {
        let (w, d) = (c.kda.width(), c.kda.head_dim);
        KdaState {
            conv: vec![0.0; (c.kda.conv - 1) * 3 * w],
            s: vec![0.0; c.kda.heads * d * d],
        }
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The short convolution over `n` new rows of `[n, 3C]`, SiLU applied; updates the conv state.
fn conv(kw: &[f32], k: usize, mixed: &[f32], n: usize, st: &mut KdaState) -> Vec<f32> {
    let ch = mixed.len() / n.max(1);
    let hist: Vec<f32> = st.conv.iter().chain(mixed).copied().collect();
    let mut out = vec![0f32; n * ch];
    for t in 0..n {
        for c in 0..ch {
            let mut acc = 0f32;
            for j in 0..k {
                acc += kw[c * k + j] * hist[(t + j) * ch + c];
            }
            out[t * ch + c] = silu(acc);
        }
    }
    st.conv = hist[n * ch..].to_vec();
    out
}

fn l2norm(x: &mut [f32], scale: f32) {
    let r = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() + L2_EPS).sqrt() * scale;
    x.iter_mut().for_each(|v| *v *= r);
}

/// The delta rule for one head over `n` tokens: `qkv` the convolved rows `[n, 3C]`, `g` the
/// log-decays `[n, C]`, `beta` `[n, heads]`; `s` this head's state `[D, D]`; returns `[n, D]`.
#[allow(clippy::too_many_arguments)]
fn head(
    qkv: &[f32],
    g: &[f32],
    beta: &[f32],
    n: usize,
    w: usize,
    d: usize,
    hd: usize,
    heads: usize,
    s: &mut [f32],
) -> Vec<f32> {
    let mut out = vec![0f32; n * d];
    let mut kv = vec![0f32; d];
    let scale = 1.0 / (d as f32).sqrt();
    for t in 0..n {
        let row = &qkv[t * 3 * w..(t + 1) * 3 * w];
        let mut q = row[hd * d..(hd + 1) * d].to_vec();
        let mut k = row[w + hd * d..w + (hd + 1) * d].to_vec();
        let v = &row[2 * w + hd * d..2 * w + (hd + 1) * d];
        l2norm(&mut q, scale);
        l2norm(&mut k, 1.0);
        let gt = &g[t * w + hd * d..t * w + (hd + 1) * d];
        for (a, srow) in s.chunks_mut(d).enumerate() {
            let f = gt[a].exp();
            srow.iter_mut().for_each(|x| *x *= f);
        }
        kv.fill(0.0);
        for (a, srow) in s.chunks(d).enumerate() {
            for (m, x) in kv.iter_mut().zip(srow) {
                *m += x * k[a];
            }
        }
        let b = beta[t * heads + hd];
        let delta: Vec<f32> = v.iter().zip(&kv).map(|(v, m)| (v - m) * b).collect();
        for (a, srow) in s.chunks_mut(d).enumerate() {
            for (x, dl) in srow.iter_mut().zip(&delta) {
                *x += k[a] * dl;
            }
        }
        let o = &mut out[t * d..(t + 1) * d];
        for (a, srow) in s.chunks(d).enumerate() {
            for (y, x) in o.iter_mut().zip(srow) {
                *y += x * q[a];
            }
        }
    }
    out
}

/// The KDA block on `n` normed rows `x` `[n, H]`: updates `st`, returns `o_proj`'s output.
pub fn forward(
    e: OpImpl,
    c: &KlConfig,
    kw: &KdaW,
    x: &[f32],
    n: usize,
    st: &mut KdaState,
) -> Vec<f32> {
    let (h, w, d, heads) = (c.ds.hidden, c.kda.width(), c.kda.head_dim, c.kda.heads);
    let (q, k, v) = (
        e.linear(x, n, h, &kw.q, w),
        e.linear(x, n, h, &kw.k, w),
        e.linear(x, n, h, &kw.v, w),
    );
    let mut mixed = Vec::with_capacity(n * 3 * w);
    for t in 0..n {
        for p in [&q, &k, &v] {
            mixed.extend_from_slice(&p[t * w..(t + 1) * w]);
        }
    }
    let qkv = conv(&kw.conv, c.kda.conv, &mixed, n, st);
    let fb = e.linear(&e.linear(x, n, h, &kw.f_a, d), n, d, &kw.f_b, w);
    let g: Vec<f32> = fb
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let ch = i % w;
            let (a, x) = (kw.decay[ch / d], f + kw.dt_bias[ch]);
            match c.kda.lower_bound {
                None => -a * softplus(x),
                Some(lb) => lb * sigmoid(a * x),
            }
        })
        .collect();
    let beta: Vec<f32> = e
        .linear(x, n, h, &kw.b, heads)
        .into_iter()
        .map(sigmoid)
        .collect();
    let one = |(hd, s): (usize, &mut [f32])| head(&qkv, &g, &beta, n, w, d, hd, heads, s);
    let per_head: Vec<Vec<f32>> = match e {
        OpImpl::Reference => st.s.chunks_mut(d * d).enumerate().map(one).collect(),
        OpImpl::Fast => st.s.par_chunks_mut(d * d).enumerate().map(one).collect(),
    };
    let gate = match &kw.gate {
        OutGate::LowRank { a, b } => e.linear(&e.linear(x, n, h, a, d), n, d, b, w),
        OutGate::Full(g) => e.linear(x, n, h, g, w),
    };
    let mut o = vec![0f32; n * w];
    for (hd, ys) in per_head.iter().enumerate() {
        for t in 0..n {
            let y = &ys[t * d..(t + 1) * d];
            let r =
                1.0 / (y.iter().map(|v| v * v).sum::<f32>() / d as f32 + c.kda.o_norm_eps).sqrt();
            let base = t * w + hd * d;
            for j in 0..d {
                o[base + j] = y[j] * r * kw.o_norm[j] * sigmoid(gate[base + j]);
            }
        }
    }
    e.linear(&o, n, w, &kw.o, h)
}
