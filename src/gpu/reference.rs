//! The CPU reference the kernels are checked against (dequantize + f32 GEMM, with
//! [`crate::ops::linear`]), the W4A8 reference (per-token int8 activations, exact
//! integer dot products), the named error bounds, and the CPU replays of regime A's kernels
//! that the "cpu" device ([`super::emu`]) runs split by split: the GEMV's algorithm (magic-number
//! dequant in f16, the permuted int8 activations, the `−8·Σa` correction) and the int8
//! activation quantizer; for the dense (unquantized) path, the plain f32 product and the row
//! argmax's order ([`argmax_ref`]).

use std::ops::Range;

use rayon::prelude::*;

use super::layout::{dequant8_magic, W4Layout, CHUNK};
use super::tune::Regime;
use super::Act;
use crate::ops;

/// W4A16 bound: `|y − y_ref| ≤ W4A16_REL_L1_TOL · Σ_k |w[n,k]·x[m,k]| + ABS_FLOOR` (f32
/// accumulation in a different order; both sides see the same bf16/f16 activations).
pub const W4A16_REL_L1_TOL: f32 = 1e-5;
/// W4A8 bound against [`w4a8_ref`]: the integer part is exact, only the f32 epilogue and the
/// split-K sum of partials round.
pub const W4A8_REL_L1_TOL: f32 = 1e-6;
/// Absolute floor of every bound.
pub const ABS_FLOOR: f32 = 1e-6;
/// Tensor-core bound, per channel in regimes B (our `mma.sync` / MFMA kernel) and C (the vendor
/// BLAS's `GemmEx`, bf16/f16 in, f32 compute, its own algorithm): the whole K runs through the
/// MMA accumulator, and Hopper's tensor cores align the partial sums inside each MMA step and
/// truncate, so every 16-wide k step can lose up to two units in the last place of the running
/// sum: `(K/16)·2·2⁻²³ ≈ 3.2e-4` of `Σ_k |w·x|` at K = 21504, the largest Kimi K, under 2⁻¹¹.
/// Measured on an H200 at the full Kimi shapes (first hardware run, docs/kernels.md): up to
/// 1.0e-5 (B, f16) and 6.4e-5 (C), past `W4A16_REL_L1_TOL`; per group, B restarts the
/// accumulator every group and stays under 1e-6.
pub const W4A16_TENSOR_CORE_REL_L1_TOL: f32 = 1.0 / 2048.0;
/// Regime C per group, bf16: the dense weight is `q·s` rounded to bf16 (unit roundoff 2⁻⁸), so
/// `|y − y_ref| ≤ (2⁻⁸ + W4A16_TENSOR_CORE_REL_L1_TOL) · Σ_k |w·x| + ABS_FLOOR` (normal-range products).
pub const W4A16_DENSE_GROUP_REL_TOL_BF16: f32 = 1.0 / 256.0 + W4A16_TENSOR_CORE_REL_L1_TOL;
/// Regime C per group, f16: unit roundoff 2⁻¹¹.
pub const W4A16_DENSE_GROUP_REL_TOL_F16: f32 = 1.0 / 2048.0 + W4A16_TENSOR_CORE_REL_L1_TOL;

/// The W4A16 bound of `regime`: regime A sums exact codes in f32 FMAs, B per group restarts its
/// MMA accumulator every group (one bound); B and C per channel run the whole K through a tensor
/// core accumulator; C per group adds the bf16/f16 rounding of `q·s`.
pub fn w4a16_tol(regime: Regime, act: Act, per_channel: bool) -> f32 {
    match (regime, per_channel, act) {
        (Regime::Mma | Regime::Dense, true, _) => W4A16_TENSOR_CORE_REL_L1_TOL,
        (Regime::Dense, false, Act::Bf16) => W4A16_DENSE_GROUP_REL_TOL_BF16,
        (Regime::Dense, false, Act::F16) => W4A16_DENSE_GROUP_REL_TOL_F16,
        _ => W4A16_REL_L1_TOL,
    }
}

/// Dense path (an unquantized bf16 / f16 weight through the vendor BLAS's `GemmEx`, f32 compute)
/// against [`dense_ref`] on the same rounded operands: the whole K runs through the tensor-core
/// accumulator as in regime C, so the bound is regime C's per-channel one,
/// `|y − y_ref| ≤ DENSE_REL_L1_TOL · Σ_k |w·x| + ABS_FLOOR`.
pub const DENSE_REL_L1_TOL: f32 = W4A16_TENSOR_CORE_REL_L1_TOL;

/// The plain reference of the dense path: `y [m, n] = x [m, k] · w [n, k]ᵀ` in f32
/// (`ops::linear_ref`, one sequential sum per output) over the operands' values in `dtype`.
pub fn dense_ref(w: &[u16], x: &[u16], dtype: Act, m: usize, n: usize, k: usize) -> Vec<f32> {
    ops::linear_ref(&act_to_f32(x, dtype), m, k, &act_to_f32(w, dtype), n)
}

/// `Σ_k |w[n,k]·x[m,k]|` per output of the dense path: the scale of [`DENSE_REL_L1_TOL`].
pub fn dense_abs_l1(w: &[u16], x: &[u16], dtype: Act, m: usize, n: usize, k: usize) -> Vec<f32> {
    let abs = |v: &[u16]| -> Vec<f32> { v.iter().map(|&h| dtype.to_f32(h).abs()).collect() };
    ops::linear(&abs(x), m, k, &abs(w), n)
}

/// Whether `(vb, ib)` comes before `(va, ia)` in the order of `kq_argmax_rows`: NaN above every
/// number, then the larger value, then the smaller index (`-0.0 == +0.0` ties).
pub fn argmax_before((va, ia): (f32, usize), (vb, ib): (f32, usize)) -> bool {
    match (va.is_nan(), vb.is_nan()) {
        (false, false) => vb > va || (vb == va && ib < ia),
        (na, nb) => nb && (!na || ib < ia),
    }
}

/// The index `kq_argmax_rows` returns for `row` (non-empty): the first NaN if there is one
/// (`torch.argmax`), else the first of the largest values. Differs from `ops::argmax` (the CPU
/// runtimes' argmax, which never picks a NaN over a number) only on rows holding a NaN.
pub fn argmax_ref(row: &[f32]) -> usize {
    (1..row.len()).fold(0, |best, j| {
        if argmax_before((row[best], best), (row[j], j)) {
            j
        } else {
            best
        }
    })
}

/// Activations to f32.
pub fn act_to_f32(x: &[u16], act: Act) -> Vec<f32> {
    x.iter().map(|&h| act.to_f32(h)).collect()
}

/// Reference W4A16: `y [m, n] = x · dequantize(w)ᵀ` in f32.
pub fn gemm_ref(w: &W4Layout, x: &[f32], m: usize) -> Vec<f32> {
    Prepared::new(w).gemm(x, m)
}

/// `Σ_k |w[n,k]·x[m,k]|` per output, `[m, n]`: the scale of the W4A16 bound.
pub fn abs_l1(w: &W4Layout, x: &[f32], m: usize) -> Vec<f32> {
    Prepared::new(w).abs_l1(x, m)
}

/// The references of one layout with its decodes done once (for many calls with different M).
pub struct Prepared {
    n: usize,
    k: usize,
    w: Vec<f32>,
    wabs: Vec<f32>,
    codes: Vec<i32>,
    scales: Vec<f32>,
}

impl Prepared {
    pub fn new(l: &W4Layout) -> Prepared {
        let q = l.to_int4();
        let w = q.dequantize_ref();
        Prepared {
            n: l.n,
            k: l.k,
            wabs: w.iter().map(|v| v.abs()).collect(),
            w,
            codes: q.codes.iter().map(|&c| c as i32).collect(),
            scales: l.scales.clone(),
        }
    }
    /// [`gemm_ref`].
    pub fn gemm(&self, x: &[f32], m: usize) -> Vec<f32> {
        ops::linear(x, m, self.k, &self.w, self.n)
    }
    /// [`abs_l1`].
    pub fn abs_l1(&self, x: &[f32], m: usize) -> Vec<f32> {
        let xa: Vec<f32> = x.iter().map(|v| v.abs()).collect();
        ops::linear(&xa, m, self.k, &self.wabs, self.n)
    }
    /// `Σ_k f(q·a)` in i64 per `(token, channel)`, `[m, n]`.
    fn int_dots(&self, a: &ActI8, m: usize, f: fn(i64) -> i64) -> Vec<i64> {
        let cols: Vec<Vec<i64>> = self
            .codes
            .par_chunks(self.k)
            .map(|q| {
                a.codes
                    .chunks(self.k)
                    .take(m)
                    .map(|ar| {
                        q.iter()
                            .zip(ar)
                            .map(|(&q, &a)| f((q * a as i32) as i64))
                            .sum()
                    })
                    .collect()
            })
            .collect();
        let mut y = vec![0i64; m * self.n];
        for (n, c) in cols.iter().enumerate() {
            for (i, v) in c.iter().enumerate() {
                y[i * self.n + n] = *v;
            }
        }
        y
    }
    /// [`w4a8_ref`] (per channel).
    pub fn w4a8(&self, a: &ActI8, m: usize) -> Vec<f32> {
        let t = self.int_dots(a, m, |v| v);
        (0..m * self.n)
            .map(|i| t[i] as i32 as f32 * self.scales[i % self.n] * a.scales[i / self.n])
            .collect()
    }
    /// [`w4a8_abs_l1`] (per channel).
    pub fn w4a8_abs_l1(&self, a: &ActI8, m: usize) -> Vec<f32> {
        let t = self.int_dots(a, m, i64::abs);
        (0..m * self.n)
            .map(|i| t[i] as f32 * self.scales[i % self.n] * a.scales[i / self.n])
            .collect()
    }
}

/// Per-token int8 activations: codes `[m, k]`, scales `[m]`, code sums `[m]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ActI8 {
    pub codes: Vec<i8>,
    pub scales: Vec<f32>,
    pub sums: Vec<i32>,
}

/// `s = absmax/127` (1 for a zero row), `a = clamp(round_half_even(x/s), −127, 127)` — the
/// arithmetic of `kq_quant_act_i8` (true f32 division, `rint`).
pub fn quantize_act_ref(x: &[u16], act: Act, m: usize, k: usize) -> ActI8 {
    let mut out = ActI8 {
        codes: Vec::with_capacity(m * k),
        scales: Vec::with_capacity(m),
        sums: Vec::with_capacity(m),
    };
    for row in x.chunks(k).take(m) {
        let v = act_to_f32(row, act);
        let amax = v.iter().fold(0f32, |a, b| a.max(b.abs()));
        let s = if amax > 0.0 { amax / 127.0 } else { 1.0 };
        let mut sum = 0i32;
        for x in v {
            let a = (x / s).round_ties_even().clamp(-127.0, 127.0) as i8;
            sum += a as i32;
            out.codes.push(a);
        }
        out.scales.push(s);
        out.sums.push(sum);
    }
    out
}

/// Reference W4A8: `y = (Σ_k q·a) · s_w[n] · s_x[m]`, the sum exact in i64. Per channel only.
pub fn w4a8_ref(w: &W4Layout, a: &ActI8, m: usize) -> Vec<f32> {
    Prepared::new(w).w4a8(a, m)
}

/// `Σ_k |q·s_w·a·s_x|` per output: the scale of the W4A8 bound.
pub fn w4a8_abs_l1(w: &W4Layout, a: &ActI8, m: usize) -> Vec<f32> {
    Prepared::new(w).w4a8_abs_l1(a, m)
}

/// Int8 activations as `kq_quant_act_i8` writes them: rows padded to `⌈k/32⌉·32` with zeros,
/// each 8 elements in the byte order `[a0,a4,a1,a5,a2,a6,a3,a7]`.
pub fn permute_act_i8(a: &ActI8, m: usize, k: usize) -> Vec<i8> {
    let kp = k.div_ceil(CHUNK) * CHUNK;
    let mut out = vec![0i8; m * kp];
    for i in 0..m {
        for c in 0..k {
            let e = c & 7;
            let slot = if e < 4 { 2 * e } else { 2 * e - 7 };
            out[i * kp + (c & !7) + slot] = a.codes[i * k + c];
        }
    }
    out
}

/// `dp4a`: signed 4×int8 dot product plus `c`.
fn dp4a(a: u32, b: u32, c: i32) -> i32 {
    (0..4).fold(c, |s, i| {
        s + ((a >> (8 * i)) as u8 as i8 as i32) * ((b >> (8 * i)) as u8 as i8 as i32)
    })
}

/// `kq_w4a16_gemv_*` replayed over the 32-weight chunks `chunks` of K (one split of the grid):
/// per chunk the magic-number dequant (f16) and f32 dot products, group scales per chunk, the
/// channel scale at the end. `[m, n]`.
pub fn gemv_w4a16(w: &W4Layout, x: &[u16], act: Act, m: usize, chunks: Range<usize>) -> Vec<f32> {
    let (wpr, g) = (w.words_per_row(), w.groups());
    let xf = act_to_f32(x, act);
    let cols: Vec<Vec<f32>> = (0..w.n)
        .into_par_iter()
        .map(|n| {
            let mut acc = vec![0f32; m];
            for c in chunks.clone() {
                let mut part = vec![0f32; m];
                for j in 0..4 {
                    let k0 = c * CHUNK + 8 * j;
                    if k0 >= w.k {
                        break;
                    }
                    let wv = dequant8_magic(w.qweight[n * wpr + c * 4 + j]);
                    for (i, p) in part.iter_mut().enumerate() {
                        let xr = &xf[i * w.k + k0..i * w.k + k0 + 8];
                        *p += wv.iter().zip(xr).map(|(a, b)| a * b).sum::<f32>();
                    }
                }
                let s = if w.per_channel() {
                    1.0
                } else {
                    w.scales[n * g + c * CHUNK / w.group]
                };
                for (a, p) in acc.iter_mut().zip(&part) {
                    *a += if w.per_channel() { *p } else { p * s };
                }
            }
            let s = if w.per_channel() { w.scales[n] } else { 1.0 };
            acc.iter().map(|a| a * s).collect()
        })
        .collect();
    transpose(&cols, m, w.n)
}

/// `kq_w4a8_gemv_*` replayed over the chunks `chunks` of K (one split of the grid) on the int8
/// activations as `kq_quant_act_i8` stores them (`ap`: rows of `⌈k/32⌉·32` permuted bytes, with
/// their scales `xs` and code sums `xsum`): dp4a over offset-binary bytes, the `−8·Σa` correction
/// in the first split only, then `t · s_w · s_x` in f32. `[m, n]`.
pub fn gemv_w4a8(
    w: &W4Layout,
    ap: &[i8],
    xs: &[f32],
    xsum: &[i32],
    m: usize,
    chunks: Range<usize>,
) -> Vec<f32> {
    let kp = w.k.div_ceil(CHUNK) * CHUNK;
    let aw: Vec<u32> = ap
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8]))
        .collect();
    let wpr = w.words_per_row();
    let cols: Vec<Vec<f32>> = (0..w.n)
        .into_par_iter()
        .map(|n| {
            (0..m)
                .map(|i| {
                    let mut t = 0i32;
                    for j in 4 * chunks.start..(4 * chunks.end).min(wpr) {
                        let q = w.qweight[n * wpr + j];
                        let base = (i * kp) / 4 + 2 * j;
                        t = dp4a(q & 0x0f0f_0f0f, aw[base], t);
                        t = dp4a((q >> 4) & 0x0f0f_0f0f, aw[base + 1], t);
                    }
                    if chunks.start == 0 {
                        t -= 8 * xsum[i];
                    }
                    t as f32 * w.scales[n] * xs[i]
                })
                .collect()
        })
        .collect();
    transpose(&cols, m, w.n)
}

/// `[n][m]` columns to `[m, n]` row-major.
pub fn transpose(cols: &[Vec<f32>], m: usize, n: usize) -> Vec<f32> {
    let mut y = vec![0f32; m * n];
    for (j, c) in cols.iter().enumerate() {
        for i in 0..m {
            y[i * n + j] = c[i];
        }
    }
    y
}

/// First `(index, got, want, bound)` where `|got − want| > rel · scale + ABS_FLOOR`.
pub fn first_violation(
    got: &[f32],
    want: &[f32],
    scale: &[f32],
    rel: f32,
) -> Option<(usize, f32, f32, f32)> {
    got.iter()
        .zip(want)
        .zip(scale)
        .enumerate()
        .find_map(|(i, ((&g, &w), &s))| {
            let b = rel * s + ABS_FLOOR;
            let ok = (g - w).abs() <= b; // false for NaN too
            (!ok).then_some((i, g, w, b))
        })
}
