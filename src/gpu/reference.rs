//! The CPU reference the kernels are checked against (dequantize + f32 GEMM, with
//! [`crate::runtime::ops::linear`]), the W4A8 reference (per-token int8 activations, exact
//! integer dot products), and [`CpuEmu`]: the kernels' algorithm run on the CPU over the packed
//! layout (magic-number dequant in f16, the permuted int8 activations, the `−8·Σa` correction),
//! which is the "cpu" device of the shared device test.

use rayon::prelude::*;

use super::layout::{dequant8_magic, W4Layout, CHUNK};
use super::{check_gemv, Act, Backend, GpuError, Result};
use crate::runtime::ops;

/// W4A16 bound: `|y − y_ref| ≤ W4A16_REL_L1_TOL · Σ_k |w[n,k]·x[m,k]| + ABS_FLOOR` (f32
/// accumulation in a different order; both sides see the same bf16/f16 activations).
pub const W4A16_REL_L1_TOL: f32 = 1e-5;
/// W4A8 bound against [`w4a8_ref`]: the integer part is exact, only the f32 epilogue and the
/// split-K sum of partials round.
pub const W4A8_REL_L1_TOL: f32 = 1e-6;
/// Absolute floor of both bounds.
pub const ABS_FLOOR: f32 = 1e-6;

/// Activations to f32.
pub fn act_to_f32(x: &[u16], act: Act) -> Vec<f32> {
    x.iter().map(|&h| act.to_f32(h)).collect()
}

/// Reference W4A16: `y [m, n] = x · dequantize(w)ᵀ` in f32.
pub fn gemm_ref(w: &W4Layout, x: &[f32], m: usize) -> Vec<f32> {
    ops::linear(x, m, w.k, &w.dequantize(), w.n)
}

/// `Σ_k |w[n,k]·x[m,k]|` per output, `[m, n]`: the scale of the W4A16 bound.
pub fn abs_l1(w: &W4Layout, x: &[f32], m: usize) -> Vec<f32> {
    let wa: Vec<f32> = w.dequantize().iter().map(|v| v.abs()).collect();
    let xa: Vec<f32> = x.iter().map(|v| v.abs()).collect();
    ops::linear(&xa, m, w.k, &wa, w.n)
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
    let q = w.to_int4();
    let mut y = vec![0f32; m * w.n];
    for i in 0..m {
        for n in 0..w.n {
            let t: i64 = (0..w.k)
                .map(|c| q.codes[n * w.k + c] as i64 * a.codes[i * w.k + c] as i64)
                .sum();
            y[i * w.n + n] = t as i32 as f32 * w.scales[n] * a.scales[i];
        }
    }
    y
}

/// `Σ_k |q·s_w·a·s_x|` per output: the scale of the W4A8 bound.
pub fn w4a8_abs_l1(w: &W4Layout, a: &ActI8, m: usize) -> Vec<f32> {
    let q = w.to_int4();
    let mut y = vec![0f32; m * w.n];
    for i in 0..m {
        for n in 0..w.n {
            let t: i64 = (0..w.k)
                .map(|c| (q.codes[n * w.k + c] as i64 * a.codes[i * w.k + c] as i64).abs())
                .sum();
            y[i * w.n + n] = t as f32 * w.scales[n] * a.scales[i];
        }
    }
    y
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

/// The kernels' algorithm on the CPU (the "cpu" device).
pub struct CpuEmu;

impl Backend for CpuEmu {
    fn name(&self) -> String {
        "cpu (kernel emulation)".into()
    }

    fn w4a16(&self, w: &W4Layout, x: &[u16], act: Act, m: usize) -> Result<Vec<f32>> {
        check_gemv(w, x.len(), m)?;
        let (wpr, g) = (w.words_per_row(), w.groups());
        let xf = act_to_f32(x, act);
        let cols: Vec<Vec<f32>> = (0..w.n)
            .into_par_iter()
            .map(|n| {
                let mut acc = vec![0f32; m];
                for c in 0..w.k.div_ceil(CHUNK) {
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
        Ok(transpose(&cols, m, w.n))
    }

    fn w4a8(&self, w: &W4Layout, x: &[u16], act: Act, m: usize) -> Result<Vec<f32>> {
        check_gemv(w, x.len(), m)?;
        if !w.per_channel() {
            return Err(GpuError::Unsupported(
                "W4A8 group size",
                "per channel only".into(),
            ));
        }
        let a = quantize_act_ref(x, act, m, w.k);
        let ap = permute_act_i8(&a, m, w.k);
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
                        for j in 0..wpr {
                            let q = w.qweight[n * wpr + j];
                            let base = (i * kp) / 4 + 2 * j;
                            t = dp4a(q & 0x0f0f_0f0f, aw[base], t);
                            t = dp4a((q >> 4) & 0x0f0f_0f0f, aw[base + 1], t);
                        }
                        t -= 8 * a.sums[i];
                        t as f32 * w.scales[n] * a.scales[i]
                    })
                    .collect()
            })
            .collect();
        Ok(transpose(&cols, m, w.n))
    }
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
