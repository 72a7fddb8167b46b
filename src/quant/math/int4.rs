//! Symmetric INT4 quantization, Quark's recipe (the spec), per output channel or per group of
//! input columns: `s = max(round_to_model_dtype(amax / 7.5), 2^-23)`,
//! `q = clamp(round_half_even(w · (1/s)), −8, 7)` (Quark multiplies by the reciprocal; dividing
//! changes 1–2 codes per layer). See docs/quantize.md, "`--format quark`".
//!
//! `quantize_ref` is the plain reference; `quantize` is the rayon fast path, tested to give
//! identical codes and scales (both [`crate::quant::math::rowwise::quantize`] with this recipe).

use crate::io::Dtype;
use crate::quant::math::rowwise::{self, amax, Path};

/// Quark's scale floor (`torch.finfo(torch.float32).eps`).
pub const SCALE_EPS: f32 = f32::EPSILON;
/// Symmetric INT4 range.
pub const QMIN: i32 = -8;
pub const QMAX: i32 = 7;
/// Quark's divisor `(qmax − qmin) / 2`.
pub const QUARK_DIVISOR: f32 = 7.5;

/// Round an f32 to the value it has in `dtype` (the dtype the observer computes in).
pub fn round_to(dtype: Dtype, v: f32) -> f32 {
    match dtype {
        Dtype::BF16 => half::bf16::from_f32(v).to_f32(),
        Dtype::F16 => half::f16::from_f32(v).to_f32(),
        _ => v,
    }
}

/// Quantized matrix: one scale per (row, group) and one code per element, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Int4 {
    pub rows: usize,
    pub cols: usize,
    /// Group size along the input dimension; `cols` means per channel.
    pub group: usize,
    /// `[rows, cols.div_ceil(group)]`, already rounded to the model dtype.
    pub scales: Vec<f32>,
    /// `[rows, cols]`, each in `−8..=7`.
    pub codes: Vec<i8>,
}

impl Int4 {
    /// Quantize `w` with one recipe's `run` over runs of `group` input columns
    /// ([`rowwise::quantize`]; `group == cols` is per channel).
    pub fn quantize_runs(
        path: Path,
        w: &[f32],
        rows: usize,
        cols: usize,
        group: usize,
        run: impl Fn(&[f32], &mut [i8]) -> f32 + Sync,
    ) -> Int4 {
        let (scales, codes) = rowwise::quantize(path, w, rows, cols, group, run);
        Int4 {
            rows,
            cols,
            group,
            scales,
            codes,
        }
    }
    pub fn groups_per_row(&self) -> usize {
        self.cols.div_ceil(self.group)
    }
    /// `w ≈ q · s` (the zero point is 0).
    pub fn dequantize_ref(&self) -> Vec<f32> {
        let g = self.groups_per_row();
        (0..self.rows * self.cols)
            .map(|i| {
                let (r, c) = (i / self.cols, i % self.cols);
                self.codes[i] as f32 * self.scales[r * g + c / self.group]
            })
            .collect()
    }
}

/// Scale of one run of weights (Quark: `amax / 7.5` in the model dtype, eps floor).
pub fn quark_scale(w: &[f32], dtype: Dtype) -> f32 {
    let s = round_to(dtype, amax(w) / QUARK_DIVISOR);
    if s < SCALE_EPS {
        round_to(dtype, SCALE_EPS)
    } else {
        s
    }
}

/// One code: `clamp(round_half_even(w · inv), −8, 7)`.
pub fn quark_code(w: f32, inv: f32) -> i8 {
    // Clamped as a float, then converted: the same code as converting first and clamping the
    // integer (every value in range converts exactly), but it vectorises.
    crate::quant::math::rne::rne(w * inv).clamp(QMIN as f32, QMAX as f32) as i8
}

/// One run, Quark's recipe: its scale `s`, and its codes against `inv = 1/s` (computed once).
pub fn quark_run(run: &[f32], out: &mut [i8], dtype: Dtype) -> f32 {
    let s = quark_scale(run, dtype);
    let inv = 1.0f32 / s;
    rowwise::codes(run, out, |x| quark_code(x, inv));
    s
}

fn quantize_on(path: Path, w: &[f32], rows: usize, cols: usize, group: usize, dt: Dtype) -> Int4 {
    Int4::quantize_runs(path, w, rows, cols, group, |run, out| {
        quark_run(run, out, dt)
    })
}

rowwise::paths! {
    quantize_on: quantize_ref, quantize(w: &[f32], rows: usize, cols: usize, group: usize, dtype: Dtype) -> Int4
}

/// Test support: the planted row (`rowwise::PLANTED_ROW`) quantized per channel as the INT4
/// recipes of Quark and compressed-tensors both give it: scale 1, ties to even.
#[cfg(test)]
pub(crate) fn assert_planted_codes(q: &Int4) {
    assert_eq!(q.scales, vec![1.0]);
    assert_eq!(q.codes, vec![7, -8, 0, 2, 2, 0, -2, -2]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The float clamp gives the integer clamp's code for every product, in range or not.
    #[test]
    fn quark_code_clamps_like_the_integer_clamp() {
        let near = (-400..=400).map(|i| i as f32 / 16.0);
        let far = (-10..=40).flat_map(|e| {
            let p = 2f32.powi(e);
            [p, -p, 1.5 * p, -1.5 * p]
        });
        for x in near.chain(far) {
            for inv in [1.0f32, 0.37, 1e-3, 1e7] {
                let want = ((x * inv).round_ties_even() as i32).clamp(QMIN, QMAX) as i8;
                assert_eq!(quark_code(x, inv), want, "{x} · {inv}");
            }
        }
    }

    fn data(rows: usize, cols: usize) -> Vec<f32> {
        rowwise::test_matrix(rows, cols, Dtype::BF16, 2.0, 0.1)
    }

    /// Quark's recipe on the planted row: scale 1, ties to even (compressed-tensors' gives the
    /// same, `compressed_tensors::tests::golden_word_is_offset_binary_sequential`).
    #[test]
    fn planted_ties_round_half_even() {
        assert_planted_codes(&quantize_ref(&rowwise::PLANTED_ROW, 1, 8, 8, Dtype::BF16));
    }

    #[test]
    fn zero_row_gets_the_eps_scale() {
        let q = quantize_ref(&[0.0; 8], 1, 8, 8, Dtype::BF16);
        assert_eq!(half::bf16::from_f32(q.scales[0]).to_bits(), 0x3400);
        assert_eq!(q.codes, vec![0; 8]);
    }

    #[test]
    fn fast_equals_reference() {
        for (rows, cols, group) in [(64, 128, 128), (33, 72, 32), (7, 13, 13)] {
            let w = data(rows, cols);
            for dt in [Dtype::BF16, Dtype::F16, Dtype::F32] {
                assert_eq!(
                    quantize(&w, rows, cols, group, dt),
                    quantize_ref(&w, rows, cols, group, dt)
                );
            }
        }
    }

    /// Named bound: |w − q·s| ≤ s/2 inside the range (rounding), and the reconstruction of the
    /// standard synthetic matrix has RMSE below `MAX_RMSE_INT4_PC`.
    #[test]
    fn error_bound() {
        const MAX_RMSE_INT4_PC: f32 = 0.16;
        let (rows, cols) = (32, 128);
        let w = data(rows, cols);
        let q = quantize_ref(&w, rows, cols, cols, Dtype::BF16);
        let rmse = rowwise::rmse_within(&w, &q.dequantize_ref(), |i, e| {
            // 7.5 s is the amax, the +7 code reaches 7 s: values beyond clamp by up to s/2 more.
            let s = q.scales[i / cols];
            e <= s * 0.5 + 1e-6 || w[i] > 7.0 * s
        });
        assert!(rmse < MAX_RMSE_INT4_PC, "rmse {rmse}");
    }
}
