//! CPU replay of regime C: the dequant-to-dense kernel (`kernels/w4_dense.cu`, bit for bit) and
//! the vendor GEMM after it, modelled as an f32 GEMM of the dense matrix (cuBLAS / hipBLAS
//! `GemmEx` with f32 output and f32 compute). The per-channel scale epilogue (`kq_scale_cols`)
//! is replayed with the other element-wise kernels in [`super::emu`].

use super::driver::Gemm;
use super::emu_mma::{dequant_bf16x4, dequant_f16x4};
use super::layout::{W4Layout, CHUNK};
use super::Act;
use crate::ops;

/// `kq_w4_dequant_{act}_{pc,g}`: the dense `[n, k]` matrix (bit patterns of `act`). Per channel
/// the exact codes; per group `q · s` rounded to nearest even in `act`.
pub fn dequant(w: &W4Layout, act: Act) -> Vec<u16> {
    let kchunks = w.k.div_ceil(CHUNK);
    let g = w.groups();
    let mut out = vec![0u16; w.n * w.k];
    for n in 0..w.n {
        for c in 0..kchunks {
            let s = if w.per_channel() {
                1.0
            } else {
                w.scales[n * g + c * CHUNK / w.group]
            };
            for j in 0..4 {
                let k = c * CHUNK + 8 * j;
                if k >= w.k {
                    break;
                }
                let q = w.qweight[(n * kchunks + c) * 4 + j];
                let pairs = if !w.per_channel() || act == Act::F16 {
                    dequant_f16x4(q)
                } else {
                    dequant_bf16x4(q)
                };
                for (p, &v) in pairs.iter().enumerate() {
                    for h in 0..2 {
                        let bits = (v >> (16 * h)) as u16;
                        out[n * w.k + k + 2 * p + h] = if w.per_channel() {
                            bits
                        } else {
                            act.from_f32(half::f16::from_bits(bits).to_f32() * s)
                        };
                    }
                }
            }
        }
    }
    out
}

/// The vendor `GemmEx` of `g` as an f32 GEMM: `y [m, n] = a [m, k] · w [n, k]ᵀ`, both in
/// `g.act` (the dense matrix and the activations).
pub fn blas(g: Gemm, w: &[u16], a: &[u16]) -> Vec<f32> {
    let dense: Vec<f32> = w.iter().map(|&h| g.act.to_f32(h)).collect();
    let af: Vec<f32> = a.iter().map(|&h| g.act.to_f32(h)).collect();
    ops::linear(&af, g.m, g.k, &dense, g.n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::Dtype;
    use crate::quant::compressed_tensors;
    use crate::quant::math::int4;

    fn weights(rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols)
            .map(|i| {
                let h = (i as u32).wrapping_mul(2654435761).rotate_left(7) ^ 0x2545_f491;
                int4::round_to(Dtype::BF16, ((h % 20001) as f32 / 10000.0 - 1.0) * 0.05)
            })
            .collect()
    }

    /// Per channel the dense matrix is exactly the codes; per group exactly `RNE_act(q·s)`.
    #[test]
    fn dense_matrix_is_codes_or_rounded_products() {
        for (rows, cols, group) in [(5, 200, 200), (3, 1000, 1000), (4, 256, 128), (3, 96, 32)] {
            let w = weights(rows, cols);
            let q = if group == cols {
                int4::quantize(&w, rows, cols, cols, Dtype::BF16)
            } else {
                compressed_tensors::quantize(&w, rows, cols, group, Dtype::BF16)
            };
            let l = W4Layout::from_int4(&q).unwrap();
            for act in [Act::Bf16, Act::F16] {
                let d = dequant(&l, act);
                for n in 0..rows {
                    for k in 0..cols {
                        let code = q.codes[n * cols + k] as f32;
                        let want = if group == cols {
                            act.from_f32(code)
                        } else {
                            act.from_f32(code * q.scales[n * (cols / group) + k / group])
                        };
                        assert_eq!(d[n * cols + k], want, "{act:?} n={n} k={k} group={group}");
                    }
                }
            }
        }
    }
}
