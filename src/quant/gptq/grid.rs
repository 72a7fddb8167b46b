//! The quantizer GPTQ's sweep applies to one weight with a fixed scale: the symmetric integer
//! grid `qmin..=qmax` and the scale's stored dtype.
//!
//! - code: `clamp(round_half_even(w / s), qmin, qmax)`, with true division (compressed-tensors
//!   0.19/0.20 `forward_helpers.py::_quantize_dequantize`: `scaled = x / scale`, then
//!   `round_to_quantized_type_args` clamps and `torch.round`s, half to even; clamping to integer
//!   bounds before or after rounding gives the same code). AMD Quark's fake-quantize multiplies
//!   by the reciprocal instead (kquant's Quark RTN recipe, `quant::math::int4`), which moves
//!   1–2 codes per layer; GPTQ here follows compressed-tensors, whose sweep is the golden.
//! - dequantized value fed back into the sweep: `dtype(code · s)`, the product rounded to the
//!   scale's dtype (compressed-tensors: `quantized.to(scale.dtype) * scale`; with a bf16 scale
//!   `7 · s` needs 11 significant bits and is rounded to bf16's 8). The f32 product is exact for
//!   bf16/f16 scales and |code| ≤ 128, so the one rounding is torch's.
//!
//! Division happens in the sweep's precision: f32 in the fast path, f64 in the reference (as
//! llm-compressor with `GPTQ_PRECISION = torch.float64`, where `x / scale` promotes to f64).

use crate::io::Dtype;
use crate::quant::math::int4::round_to;
use crate::quant::math::rne::rne;

/// A symmetric integer grid and the dtype its scales are stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    pub qmin: i32,
    pub qmax: i32,
    /// BF16, F16 or F32: the dtype of the stored scale, and of the dequantized product.
    pub scale_dtype: Dtype,
}

impl Grid {
    /// Symmetric INT4: codes −8..=7.
    pub fn int4(scale_dtype: Dtype) -> Self {
        Self {
            qmin: -8,
            qmax: 7,
            scale_dtype,
        }
    }

    /// Symmetric INT8: codes −128..=127.
    pub fn int8(scale_dtype: Dtype) -> Self {
        Self {
            qmin: -128,
            qmax: 127,
            scale_dtype,
        }
    }

    /// The code of `w` with scale `s`, in f32 (the fast path).
    #[inline(always)]
    pub fn code_f32(&self, w: f32, s: f32) -> i8 {
        rne((w / s).clamp(self.qmin as f32, self.qmax as f32)) as i8
    }

    /// The code of `w` with scale `s`, in f64 (the reference).
    #[inline]
    pub fn code_f64(&self, w: f64, s: f64) -> i8 {
        (w / s)
            .clamp(self.qmin as f64, self.qmax as f64)
            .round_ties_even() as i8
    }

    /// The dequantized value `dtype(code · s)`.
    #[inline(always)]
    pub fn dequant(&self, code: i8, s: f32) -> f32 {
        round_to(self.scale_dtype, code as f32 * s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_half_to_even_and_clamp() {
        let g = Grid::int4(Dtype::BF16);
        let cases = [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-2.5, -2),
            (7.4, 7),
            (7.5, 7),
            (9.0, 7),
            (-8.5, -8),
            (-100.0, -8),
        ];
        for (w, k) in cases {
            assert_eq!(g.code_f32(w, 1.0), k, "{w}");
            assert_eq!(g.code_f64(w as f64, 1.0), k, "{w}");
        }
        let g8 = Grid::int8(Dtype::F32);
        assert_eq!(g8.code_f32(127.5, 1.0), 127);
        assert_eq!(g8.code_f32(-128.5, 1.0), -128);
        assert_eq!(g8.code_f32(126.5, 1.0), 126);
    }

    /// Division, not multiplication by the reciprocal: find a scale where `2.5·s / s` and
    /// `2.5·s · (1/s)` round to different codes (a tie nudged to either side) and check the code
    /// follows the division.
    #[test]
    fn divides_by_the_scale() {
        let g = Grid::int8(Dtype::F32);
        let mut found = false;
        for i in 1..20_000u32 {
            let s = 0.01 + i as f32 * 1e-5;
            let w = 2.5 * s;
            let div = w / s;
            let mul = w * (1.0 / s);
            if rne(div) != rne(mul) {
                assert_eq!(g.code_f32(w, s), rne(div) as i8);
                found = true;
                break;
            }
        }
        assert!(found, "no scale where w / s and w · (1/s) round apart");
    }

    #[test]
    fn dequant_rounds_to_the_scale_dtype() {
        // bf16 scale 1 + 2^-7: 7 · s = 7 + 7·2^-7 needs 11 significant bits, bf16 keeps 8.
        let s = 1.0 + 2f32.powi(-7);
        assert_eq!(round_to(Dtype::BF16, s), s);
        let q = Grid::int4(Dtype::BF16).dequant(7, s);
        assert_ne!(q, 7.0 * s);
        assert_eq!(q, half::bf16::from_f32(7.0 * s).to_f32());
        assert_eq!(Grid::int4(Dtype::F32).dequant(7, s), 7.0 * s);
    }
}
