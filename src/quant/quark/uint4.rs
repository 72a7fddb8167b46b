//! AMD Quark 0.13's asymmetric per-group UINT4 weights (`uint4_wo_32/64/128`,
//! `Uint4PerGroupSpec(ch_axis=-1)`, zero_point_type int32), model path, with Quark's arithmetic
//! (`observer.py::calculate_int_quant_params`, the "AWQ" branch, run by `PerGroupMinMaxObserver`
//! in the model dtype; `real_quantize_int_per_group_affine`):
//!
//! - per run of `G` input columns: `lo = min(min, 0)`, `hi = max(max, 0)`;
//!   `s = max(dtype(dtype(hi − lo) / 15), dtype(2^-23))` — the subtraction is rounded to the
//!   model dtype before dividing;
//!   `zp = clamp(−round_half_even(dtype(lo / s)), 0, 15)` — the quotient is rounded to the model
//!   dtype before rounding to an integer;
//! - `q = clamp(round_half_even(f32(w) · (1/s)) + zp, 0, 15)`: the zero point is added **after**
//!   rounding. The stored codes come from `freeze()`, which replaces each weight by its
//!   fake-quantized value (`fake_quantize_per_channel_affine`, torch's convention
//!   `nearbyint(x · inv_scale) + zero_point`); the export's own `round(x · inv + zp)` then only
//!   reproduces those codes. Rounding after adding the zero point instead changes the x.5 ties
//!   (37 of the golden's 36864 codes);
//! - layout as `quark/int4_group.rs`, with unsigned nibbles: `X.weight` I32 `[in, ⌈out/8⌉]` (codes
//!   transposed, packed along out), `X.weight_scale` model dtype `[in/G, out]`,
//!   `X.weight_zero_point` I32 `[in/G, ⌈out/8⌉]` holding the zero points, packed the same way;
//!   `w ≈ (q − zp) · s`.
//!
//! Checked byte for byte against fixtures/goldens/quark-0.13/uint4_g32_bfloat16
//! (tests/fp8_w4a8_golden.rs). §1.3 of quant-formats.md reports 8 of 8192 codes off with its
//! `round(w·(1/s) + zp)` recipe: those are the ties that the order of rounding and adding decides.

use serde_json::{json, Value};

use crate::io::writer::TensorSpec;
use crate::io::Dtype;
use crate::quant::codec::{Codec, ConfigFiles, Encoded};
use crate::quant::math::int4::{round_to, Int4, SCALE_EPS};
use crate::quant::math::pack;
use crate::quant::math::rowwise::{self, Path};
use crate::quant::quark::int4_group::{self, Int4PerGroup};
use crate::quant::quark::Options;
use crate::quant::stored::{Gemv, IntLayout, Parts};

/// UINT4 range.
pub const UMAX: i32 = 15;

/// An asymmetric per-group quantized matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Uint4 {
    pub rows: usize,
    pub cols: usize,
    pub group: usize,
    /// `[rows, cols/group]`, already in the model dtype.
    pub scales: Vec<f32>,
    /// `[rows, cols/group]`, each in `0..=15`.
    pub zero_points: Vec<u8>,
    /// `[rows, cols]`, each in `0..=15`.
    pub codes: Vec<u8>,
}

impl Uint4 {
    /// `w ≈ (q − zp) · s`.
    pub fn dequantize_ref(&self) -> Vec<f32> {
        let g = self.cols / self.group;
        (0..self.rows * self.cols)
            .map(|i| {
                let j = (i / self.cols) * g + (i % self.cols) / self.group;
                (self.codes[i] as f32 - self.zero_points[j] as f32) * self.scales[j]
            })
            .collect()
    }
}

/// Scale and zero point of one run of weights.
pub fn qparams(w: &[f32], dtype: Dtype) -> (f32, u8) {
    let (mn, mx) = w
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        });
    let (lo, hi) = (mn.min(0.0), mx.max(0.0));
    let s = round_to(dtype, round_to(dtype, hi - lo) / UMAX as f32).max(round_to(dtype, SCALE_EPS));
    let z = crate::quant::math::rne::rne(round_to(dtype, lo / s)) as i32;
    (s, (-z).clamp(0, UMAX) as u8)
}

/// One code: `clamp(round_half_even(w · inv) + zp, 0, 15)`.
pub fn code(w: f32, inv: f32, zp: u8) -> u8 {
    (crate::quant::math::rne::rne(w * inv) + zp as f32).clamp(0.0, UMAX as f32) as u8
}

fn quantize_on(path: Path, w: &[f32], rows: usize, cols: usize, group: usize, dt: Dtype) -> Uint4 {
    assert_eq!(cols % group, 0, "group must divide the input dimension");
    let (params, codes) = rowwise::quantize(path, w, rows, cols, group, |run, out| {
        let (s, zp) = qparams(run, dt);
        let inv = 1.0f32 / s;
        rowwise::codes(run, out, |x| code(x, inv, zp));
        (s, zp)
    });
    let (scales, zero_points) = params.into_iter().unzip();
    Uint4 {
        rows,
        cols,
        group,
        scales,
        zero_points,
        codes,
    }
}

rowwise::paths! {
    /// `group` must divide `cols`.
    quantize_on: quantize_ref, quantize(w: &[f32], rows: usize, cols: usize, group: usize, dtype: Dtype) -> Uint4
}

/// Codes (or zero points) `[rows, n]` as an [`Int4`] carrying nibbles `0..=15`, for the packer.
fn nibbles(rows: usize, n: usize, v: &[u8]) -> Int4 {
    Int4 {
        rows,
        cols: n,
        group: n.max(1),
        scales: Vec::new(),
        codes: v.iter().map(|&c| c as i8).collect(),
    }
}

/// Encode a module for each of the per-group layout's tensors ([`int4_group::specs`]).
pub fn encode(module: &str, q: &Uint4, model: Dtype, o: &Options) -> Vec<(String, Vec<u8>)> {
    let g = q.cols / q.group;
    let words = int4_group::pack_transposed(&nibbles(q.rows, q.cols, &q.codes), o.order);
    let zp_words = int4_group::pack_transposed(&nibbles(q.rows, g, &q.zero_points), o.order);
    let scale_t = rowwise::transpose(&q.scales, q.rows, g);
    int4_group::tensors(module, &words, &scale_t, model, pack::le_bytes(&zp_words))
}

/// Decode a module: weight words `[cols, ⌈rows/8⌉]`, scales `[cols/G, rows]`, zero-point words
/// `[cols/G, ⌈rows/8⌉]`.
pub fn decode(
    weight: &[u8],
    scale_t: &[f32],
    zp: &[u8],
    rows: usize,
    cols: usize,
    group: usize,
    o: &Options,
) -> Uint4 {
    let unsigned = |v: Vec<i8>| v.into_iter().map(|c| (c as u8) & 0xf).collect::<Vec<u8>>();
    let g = cols / group;
    let q = int4_group::decode(weight, scale_t, rows, cols, group, o.order);
    let z = int4_group::decode(zp, &vec![0.0; rows * g], rows, g, 1, o.order);
    Uint4 {
        rows,
        cols,
        group,
        scales: q.scales,
        zero_points: unsigned(z.codes),
        codes: unsigned(q.codes),
    }
}

/// Quark UINT4 per group read back (`Stored::QuarkGroupAsym`): its codes are carried as
/// `q − zp` (`−15..=15`), so `w = (q − zp) · s` is their `q · s`.
pub struct AsymLayout {
    pub group: usize,
    pub order: pack::Order,
}

impl IntLayout for AsymLayout {
    fn codes(&self, p: &Parts) -> Int4 {
        let (w, s, rows, cols) = p.int_tensors("weight");
        let group = self.group;
        let o = Options::model_v013(self.order);
        let u = decode(w, &s, p.data("weight_zero_point"), rows, cols, group, &o);
        let g = cols / group;
        Int4 {
            rows,
            cols,
            group,
            codes: (0..rows * cols)
                .map(|i| {
                    let j = (i / cols) * g + (i % cols) / group;
                    u.codes[i] as i8 - u.zero_points[j] as i8
                })
                .collect(),
            scales: u.scales,
        }
    }
    fn gemv(&self) -> Option<Gemv> {
        None
    }
}

/// `quantization_config` for `uint4_wo_G` (Quark 0.13): the per-group config with `uint4`,
/// `symmetric: false`.
pub fn config(o: &Options, group: usize, exclude: &[String]) -> Value {
    let mut c = int4_group::config(o, group, exclude);
    let w = &mut c["global_quant_config"]["weight"];
    w["dtype"] = json!("uint4");
    w["symmetric"] = json!(false);
    c
}

/// Quark UINT4 asymmetric per group (model path) as a [`Codec`]: the per-group layout of
/// [`Int4PerGroup`] (its tensors, options and group) with unsigned codes and zero points.
pub struct Uint4PerGroup(pub Int4PerGroup);

impl Codec for Uint4PerGroup {
    fn describe(&self) -> String {
        format!("Quark 0.13 uint4, group {}", self.0.group)
    }
    fn specs(&self, module: &str, rows: usize, cols: usize, dtype: Dtype) -> Vec<TensorSpec> {
        self.0.specs(module, rows, cols, dtype)
    }
    fn encode(&self, module: &str, w: &[f32], rows: usize, cols: usize, dtype: Dtype) -> Encoded {
        let Int4PerGroup { opts, group } = &self.0;
        encode(module, &quantize(w, rows, cols, *group, dtype), dtype, opts)
    }
    fn config(&self, exclude: &[String]) -> ConfigFiles {
        ConfigFiles::config(config(&self.0.opts, self.0.group, exclude))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::math::pack::Order;

    fn data(rows: usize, cols: usize) -> Vec<f32> {
        rowwise::test_matrix(rows, cols, Dtype::BF16, 0.05, 0.01)
    }

    #[test]
    fn fast_equals_reference_and_round_trips() {
        for (rows, cols, group) in [(16, 64, 32), (13, 64, 64), (40, 256, 128)] {
            let w = data(rows, cols);
            let q = quantize_ref(&w, rows, cols, group, Dtype::BF16);
            assert_eq!(quantize(&w, rows, cols, group, Dtype::BF16), q);
            for order in [Order::Reorder, Order::Sequential] {
                let enc = encode("m", &q, Dtype::BF16, &Options::model_v013(order));
                let mut scale_t = Vec::new();
                crate::io::dtype::to_f32(Dtype::BF16, &enc[1].1, &mut scale_t);
                let back = decode(
                    &enc[0].1,
                    &scale_t,
                    &enc[2].1,
                    rows,
                    cols,
                    group,
                    &Options::model_v013(order),
                );
                assert_eq!(back, q);
            }
        }
    }

    /// The golden's planted rows: `[7.5, −7.5, …]` → s 1.0, zp 8 (−7.5 rounds half-even to −8);
    /// amax-7 row → s bf16(14/15), zp 8 (−7/0.9336 = −7.498, bf16 −7.5 → −8); zero row → eps, 0.
    #[test]
    fn planted_rows() {
        let (s, z) = qparams(&[7.5, -7.5, 0.5, 1.5], Dtype::BF16);
        assert_eq!((s, z), (1.0, 8));
        let (s, z) = qparams(&[7.0, -7.0, 1.0], Dtype::BF16);
        assert_eq!((s, z), (0.93359375, 8));
        assert_eq!(qparams(&[0.0; 4], Dtype::BF16), (f32::EPSILON, 0));
        assert_eq!(code(7.5, 1.0, 8), 15);
        assert_eq!(code(-7.5, 1.0, 8), 0);
        assert_eq!(code(0.5, 1.0, 8), 8);
        // Ties round before the zero point is added: 1.5 → 2 (+7 = 9), not 8.5 → 8.
        assert_eq!(code(1.5, 1.0, 7), 9);
        assert_eq!(code(-0.5, 1.0, 9), 9);
    }

    /// Named bound: `|w − (q − zp)·s| ≤ s/2` plus the zero point's rounding (the range is
    /// shifted by at most s/2, so one end can clamp by up to another s/2).
    #[test]
    fn error_bound() {
        const MAX_RMSE_UINT4_G32: f32 = 0.004;
        let (rows, cols) = (32, 128);
        let w = data(rows, cols);
        let q = quantize_ref(&w, rows, cols, 32, Dtype::BF16);
        let d = q.dequantize_ref();
        let mut se = 0f64;
        for (i, (&x, &y)) in w.iter().zip(&d).enumerate() {
            let s = q.scales[(i / cols) * (cols / 32) + (i % cols) / 32];
            assert!((x - y).abs() <= s * 1.01 + 1e-6, "{i}: {x} vs {y} (s {s})");
            se += ((x - y) as f64).powi(2);
        }
        let rmse = (se / w.len() as f64).sqrt() as f32;
        assert!(rmse < MAX_RMSE_UINT4_G32, "rmse {rmse}");
    }

    #[test]
    fn config_is_uint4_asymmetric() {
        let c = config(&Options::model_v013(Order::Reorder), 32, &[]);
        let w = &c["global_quant_config"]["weight"];
        assert_eq!(w["dtype"], "uint4");
        assert_eq!(w["symmetric"], false);
        assert_eq!(w["qscheme"], "per_group");
        assert_eq!(w["group_size"], 32);
    }
}
