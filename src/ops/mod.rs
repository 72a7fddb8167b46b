//! CPU tensor ops on row-major f32 slices, each with a plain reference (the spec) and, where it
//! matters, a rayon fast path tested against it under a named bound; the blocked matrix product
//! over weights kept in their stored precision is [`gemm`], the machine's measured FMA peak
//! [`peak`].

pub mod gemm;
pub mod peak;

use rayon::prelude::*;

/// Relative error bound for the fast matmul against the reference (summation order differs).
pub const MATMUL_REL_TOL: f32 = 1e-5;

/// `y[m, n] = Σ_k x[m, k] · w[n, k]` (PyTorch `Linear`: `w` is `[out, in]`). Reference.
pub fn linear_ref(x: &[f32], m: usize, k: usize, w: &[f32], n: usize) -> Vec<f32> {
    assert_eq!(x.len(), m * k);
    assert_eq!(w.len(), n * k);
    let mut y = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0f32;
            for p in 0..k {
                s += x[i * k + p] * w[j * k + p];
            }
            y[i * n + j] = s;
        }
    }
    y
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent accumulators so the compiler vectorises the loop.
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// Fast [`linear_ref`]: output columns split over threads, vectorised dot products.
pub fn linear(x: &[f32], m: usize, k: usize, w: &[f32], n: usize) -> Vec<f32> {
    assert_eq!(x.len(), m * k);
    assert_eq!(w.len(), n * k);
    let mut yt = vec![0f32; n * m]; // [n, m], one weight row per task
    yt.par_chunks_mut(m).enumerate().for_each(|(j, col)| {
        let wr = &w[j * k..(j + 1) * k];
        for (i, c) in col.iter_mut().enumerate() {
            *c = dot(&x[i * k..(i + 1) * k], wr);
        }
    });
    let mut y = vec![0f32; m * n];
    for j in 0..n {
        for i in 0..m {
            y[i * n + j] = yt[j * m + i];
        }
    }
    y
}

/// RMSNorm over the last dimension `d`: `x / sqrt(mean(x²) + eps) · w`.
pub fn rms_norm(x: &[f32], d: usize, w: &[f32], eps: f32) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    for (row, out) in x.chunks(d).zip(y.chunks_mut(d)) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let r = 1.0 / (ms + eps).sqrt();
        for ((o, v), g) in out.iter_mut().zip(row).zip(w) {
            *o = v * r * g;
        }
    }
    y
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Llama-style rotary embedding (`rotate_half`) in place on `[heads, dim]` rows at `pos`.
pub fn rope_half(x: &mut [f32], dim: usize, pos: usize, theta: f32) {
    let half = dim / 2;
    for head in x.chunks_mut(dim) {
        for i in 0..half {
            let freq = 1.0 / theta.powf(2.0 * i as f32 / dim as f32);
            let (s, c) = (pos as f32 * freq).sin_cos();
            let (a, b) = (head[i], head[i + half]);
            head[i] = a * c - b * s;
            head[i + half] = b * c + a * s;
        }
    }
}

/// Numerically stable softmax in place.
pub fn softmax(x: &mut [f32]) {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut s = 0f32;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        s += *v;
    }
    for v in x.iter_mut() {
        *v /= s;
    }
}

/// Index of the largest value (first on ties, as `torch.argmax`). A NaN is never picked over a
/// number (`torch.argmax` would pick the first NaN): 0 only where every value is NaN. Where a
/// NaN may be a defect of the input (a target's logits, a trace's taps), the callers refuse it
/// first ([`first_non_finite`]).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] || (x[best].is_nan() && !v.is_nan()) {
            best = i;
        }
    }
    best
}

/// The index of the first value that is NaN or infinite, if any.
pub fn first_non_finite(x: &[f32]) -> Option<usize> {
    x.iter().position(|v| !v.is_finite())
}

/// A row's best index ([`argmax`]'s, the first on ties) with its runner-up (the first best of
/// the others) and the gap between their values (`≥ 0`; NaN where either is NaN, and the
/// runner-up `usize::MAX` in a row of one).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Top2 {
    pub best: usize,
    pub second: usize,
    pub margin: f32,
}

/// [`Top2`] of `x`, in one pass: `best` is exactly [`argmax`]'s.
pub fn top2(x: &[f32]) -> Top2 {
    let best = argmax(x);
    let mut second = usize::MAX;
    for (i, &v) in x.iter().enumerate() {
        if i != best && (second == usize::MAX || v > x[second]) {
            second = i;
        }
    }
    let margin = if second == usize::MAX {
        f32::NAN
    } else {
        x[best] - x[second]
    };
    Top2 {
        best,
        second,
        margin,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// #38.4: an argmax never picks a NaN over a number, wherever the NaN is.
    #[test]
    fn argmax_never_picks_a_nan_over_a_number() {
        let n = f32::NAN;
        assert_eq!(argmax(&[n, 1.0, 2.0]), 2);
        assert_eq!(argmax(&[1.0, n, 0.5]), 0);
        assert_eq!(argmax(&[n, n, -3.0]), 2);
        assert_eq!(argmax(&[0.0, 2.0, n, 2.0]), 1, "first on ties");
        assert_eq!(top2(&[n, 1.0, 2.0]).best, 2);
        assert_eq!(first_non_finite(&[1.0, f32::INFINITY]), Some(1));
        assert_eq!(first_non_finite(&[1.0, 2.0]), None);
    }

    #[test]
    fn top2_keeps_argmax_and_finds_the_runner_up() {
        let t = top2(&[1.0, 3.0, 2.5, 3.0]);
        assert_eq!((t.best, t.second, t.margin), (1, 3, 0.0));
        let t = top2(&[4.0, 1.0, 2.0]);
        assert_eq!((t.best, t.second, t.margin), (0, 2, 2.0));
        let t = top2(&[7.0]);
        assert_eq!((t.best, t.second), (0, usize::MAX));
        assert!(t.margin.is_nan());
        for n in [2usize, 5, 64] {
            let x = data(n, 3);
            let t = top2(&x);
            assert_eq!(t.best, argmax(&x));
            let mut s = x.clone();
            s.sort_by(|a, b| b.partial_cmp(a).unwrap());
            assert_eq!(t.margin, s[0] - s[1]);
        }
    }

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn fast_linear_matches_reference() {
        for (m, k, n) in [(1, 7, 3), (5, 64, 33), (17, 130, 9)] {
            let (x, w) = (data(m * k, 1), data(n * k, 2));
            let (a, b) = (linear_ref(&x, m, k, &w, n), linear(&x, m, k, &w, n));
            for (p, q) in a.iter().zip(&b) {
                assert!(
                    (p - q).abs() <= MATMUL_REL_TOL * (1.0 + p.abs()) * k as f32,
                    "{p} vs {q}"
                );
            }
        }
    }

    #[test]
    fn norm_rope_softmax() {
        let y = rms_norm(&[3.0, 4.0], 2, &[1.0, 2.0], 0.0);
        let r = (12.5f32).sqrt();
        assert!((y[0] - 3.0 / r).abs() < 1e-6 && (y[1] - 8.0 / r).abs() < 1e-6);
        let mut v = vec![1.0, 2.0, 3.0, 4.0];
        rope_half(&mut v, 4, 0, 10000.0);
        assert_eq!(v, vec![1.0, 2.0, 3.0, 4.0], "position 0 is the identity");
        let mut s = vec![1.0, 1.0, 1000.0];
        softmax(&mut s);
        assert!((s[2] - 1.0).abs() < 1e-6);
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
    }
}
