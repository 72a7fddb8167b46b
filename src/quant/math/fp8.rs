//! FP8 E4M3 (the OCP `e4m3fn` variant: no infinities, NaN = S.1111.111, max ±448) encoding, and
//! the matrix of FP8 codes with one scale per output row (or one per tensor) that the FP8 schemes
//! of every format share. The per-format recipes that fill it live with their formats
//! (`quark/fp8.rs`, `compressed_tensors/fp8_w4a8.rs`, `modelopt/mod.rs`, each run by `rowwise::quantize`); they are
//! never unified.
//!
//! [`e4m3_from_f32`] is torch's `c10::Float8_e4m3fn` conversion (`fp8e4m3fn_from_fp32_value`),
//! bit for bit: round to nearest, ties to even, subnormals included; it does **not** saturate
//! (a magnitude that rounds past 448, i.e. above 464, becomes NaN `0x7f`/`0xff`). Both reference
//! tools clamp to ±448 before casting ([`e4m3_from_f32_clamped`]), so NaN never appears in
//! their outputs.

use crate::io::dtype::f8_e4m3_to_f32;
use crate::io::writer::TensorSpec;
use crate::io::Dtype;
use crate::quant::math::rowwise::{self, Path};

/// Largest finite E4M3 magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// f32 → E4M3 code, as torch casts (`tensor.to(torch.float8_e4m3fn)` on CPU).
pub fn e4m3_from_f32(f: f32) -> u8 {
    // 480.0: the first magnitude not representable (rounding from 464 up reaches it).
    const FP8_MAX: u32 = 1087 << 20;
    // ((127 − 7) + (23 − 3) + 1) << 23: adding it aligns a subnormal's bits for RNE.
    const DENORM_MASK: u32 = 141 << 23;
    let mut bits = f.to_bits();
    let sign = bits & 0x8000_0000;
    bits ^= sign;
    let r: u8 = if bits >= FP8_MAX {
        0x7f
    } else if bits < (121 << 23) {
        // Below 2^-6, the smallest normal: the float addition rounds to nearest even.
        let b = (f32::from_bits(bits) + f32::from_bits(DENORM_MASK)).to_bits();
        b.wrapping_sub(DENORM_MASK) as u8
    } else {
        let mant_odd = (bits >> 20) & 1;
        bits = bits.wrapping_add((((7i32 - 127) as u32) << 23).wrapping_add(0x7ffff));
        bits = bits.wrapping_add(mant_odd);
        (bits >> 20) as u8
    };
    r | (sign >> 24) as u8
}

/// Clamp to ±448, then [`e4m3_from_f32`]: what both tools do (`clamp(x, −448, 448).to(fp8)`).
pub fn e4m3_from_f32_clamped(f: f32) -> u8 {
    e4m3_from_f32(f.clamp(-E4M3_MAX, E4M3_MAX))
}

/// A matrix of FP8 E4M3 codes with scales, `w ≈ f8(code) · s`.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8 {
    pub rows: usize,
    pub cols: usize,
    /// One per row (`[rows]`), or one for the whole tensor (`[1]`).
    pub scales: Vec<f32>,
    /// `[rows, cols]` E4M3 bytes.
    pub codes: Vec<u8>,
}

impl Fp8 {
    /// Quantize `w` with one recipe's `run`, one run (and scale) per row
    /// ([`rowwise::quantize`] with `group == cols`).
    pub fn quantize_rows(
        path: Path,
        w: &[f32],
        rows: usize,
        cols: usize,
        run: impl Fn(&[f32], &mut [u8]) -> f32 + Sync,
    ) -> Fp8 {
        let (scales, codes) = rowwise::quantize(path, w, rows, cols, cols, run);
        Fp8 {
            rows,
            cols,
            scales,
            codes,
        }
    }
    /// The tensors of the FP8 layout every format writes: `X.weight` F8_E4M3 `[rows, cols]`
    /// and `X.weight_scale` of `scale_dtype`, in the format's own `scale_shape`.
    pub fn specs(
        module: &str,
        rows: usize,
        cols: usize,
        scale_dtype: Dtype,
        scale_shape: Vec<usize>,
    ) -> Vec<TensorSpec> {
        vec![
            TensorSpec::new(format!("{module}.weight"), Dtype::F8_E4M3, vec![rows, cols]),
            TensorSpec::new(format!("{module}.weight_scale"), scale_dtype, scale_shape),
        ]
    }
    /// `X.weight` (the E4M3 codes) and `X.weight_scale` (the scales as `scale_dtype`): the FP8
    /// layout of every format ([`Fp8::specs`]).
    pub fn encode(self, module: &str, scale_dtype: Dtype) -> Vec<(String, Vec<u8>)> {
        vec![
            (format!("{module}.weight"), self.codes),
            (
                format!("{module}.weight_scale"),
                rowwise::encode_floats(&self.scales, scale_dtype),
            ),
        ]
    }
    fn scale_of_row(&self, r: usize) -> f32 {
        if self.scales.len() == 1 {
            self.scales[0]
        } else {
            self.scales[r]
        }
    }
    /// `w ≈ f8(code) · s` in f32.
    pub fn dequantize_ref(&self) -> Vec<f32> {
        (0..self.rows * self.cols)
            .map(|i| f8_e4m3_to_f32(self.codes[i]) * self.scale_of_row(i / self.cols.max(1)))
            .collect()
    }
}

/// Test helper: every element of `q` is within FP8's half step of `w` (relative 2^-4, plus the
/// BF16 rounding of the quotient and the subnormal step near zero); returns the RMSE.
#[cfg(test)]
pub(crate) fn per_row_rmse_within_half_step(w: &[f32], q: &Fp8) -> f32 {
    let d = q.dequantize_ref();
    rowwise::rmse_within(w, &d, |i, e| {
        e <= w[i].abs() * (1.0 / 16.0 + 1.0 / 256.0) + q.scales[i / q.cols] * 2f32.powi(-9)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every one of the 256 codes: decoding then encoding gives the code back (the two NaN codes
    /// give a NaN code: `f8_e4m3_to_f32` does not keep a NaN's sign), and `−0` stays `0x80`.
    #[test]
    fn all_256_codes_round_trip() {
        for b in 0..=255u8 {
            let v = f8_e4m3_to_f32(b);
            if v.is_nan() {
                assert_eq!(e4m3_from_f32(v) & 0x7f, 0x7f, "{b:#x}");
                assert_eq!(e4m3_from_f32(-v), 0xff, "{b:#x}");
            } else {
                assert_eq!(e4m3_from_f32(v), b, "{b:#x} = {v}");
                assert_eq!(e4m3_from_f32_clamped(v), b, "{b:#x} = {v}");
            }
        }
        assert_eq!(e4m3_from_f32(-0.0), 0x80);
        assert_eq!(e4m3_from_f32(0.0), 0x00);
    }

    /// Independent reference: the nearest finite code by value, ties to the even mantissa.
    fn nearest(x: f32) -> u8 {
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        let a = x.abs();
        if a > 464.0 {
            return sign | 0x7f;
        }
        let mut best = 0u8;
        for b in 0..=0x7eu8 {
            let (d, db) = (
                (f8_e4m3_to_f32(b) as f64 - a as f64).abs(),
                (f8_e4m3_to_f32(best) as f64 - a as f64).abs(),
            );
            if d < db || (d == db && b & 1 == 0) {
                best = b;
            }
        }
        sign | best
    }

    /// Midpoints between neighbours (ties), values just either side of them, and every BF16
    /// value in range: the bit trick equals the by-value reference.
    #[test]
    fn rounds_to_nearest_even_like_the_reference() {
        for b in 0..0x7eu8 {
            let (lo, hi) = (f8_e4m3_to_f32(b), f8_e4m3_to_f32(b + 1));
            let mid = (lo + hi) / 2.0;
            for x in [mid, mid.next_up(), mid.next_down(), -mid, -mid.next_up()] {
                assert_eq!(e4m3_from_f32(x), nearest(x), "{x}");
            }
            let tie = e4m3_from_f32(mid);
            assert_eq!(tie & 1, 0, "tie {mid} goes to the even code, got {tie:#x}");
        }
        for h in 0..=0xffffu16 {
            let x = f32::from_bits((h as u32) << 16);
            if x.is_finite() {
                assert_eq!(e4m3_from_f32(x), nearest(x), "bf16 {h:#06x} = {x}");
            }
        }
    }

    #[test]
    fn saturation_and_nan() {
        assert_eq!(e4m3_from_f32(448.0), 0x7e);
        assert_eq!(
            e4m3_from_f32(464.0),
            0x7e,
            "the tie at 464 rounds to even (448)"
        );
        assert_eq!(
            e4m3_from_f32(464.0f32.next_up()),
            0x7f,
            "no saturation: NaN"
        );
        assert_eq!(e4m3_from_f32(-1e9), 0xff);
        assert_eq!(e4m3_from_f32(f32::INFINITY), 0x7f);
        assert_eq!(e4m3_from_f32(f32::NAN) & 0x7f, 0x7f);
        assert_eq!(e4m3_from_f32_clamped(1e9), 0x7e);
        assert_eq!(e4m3_from_f32_clamped(-500.0), 0xfe);
        // Smallest subnormal 2^-9; half of it ties to 0, a bit more rounds up.
        assert_eq!(e4m3_from_f32(2f32.powi(-10)), 0x00);
        assert_eq!(e4m3_from_f32(2f32.powi(-10).next_up()), 0x01);
        assert_eq!(e4m3_from_f32(3.0 * 2f32.powi(-10)), 0x02);
    }

    #[test]
    fn dequantize_per_row_and_per_tensor() {
        let q = Fp8 {
            rows: 2,
            cols: 2,
            scales: vec![2.0, 0.5],
            codes: vec![0x38, 0xb8, 0x40, 0x00],
        };
        assert_eq!(q.dequantize_ref(), vec![2.0, -2.0, 1.0, 0.0]);
        let q = Fp8 {
            scales: vec![3.0],
            ..q
        };
        assert_eq!(q.dequantize_ref(), vec![3.0, -3.0, 6.0, 0.0]);
    }
}
