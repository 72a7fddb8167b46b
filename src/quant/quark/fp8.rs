//! AMD Quark 0.13's FP8 schemes, model path (`ModelQuantizer` + `export_safetensors`), each with
//! Quark's own arithmetic (`observer.py`, `hw_emulation_interface.py`, `realquantizer.py`):
//!
//! - `ptpc_fp8` (`PTPCFP8Scheme`; kquant `fp8-pc`): FP8 E4M3 weights per output channel, FP8
//!   activations dynamic per token.
//!   - `s = dtype(amax_row / 448)` (the observer divides in the model dtype); an exactly-zero `s`
//!     becomes `dtype(2^-23)` (f32 eps cast to the model dtype: a replacement, not a floor).
//!   - `code = e4m3(clamp(dtype(w / s), ±448))`: true division rounded to the model dtype
//!     (a BF16 tensor divided by a BF16 scale), clamp, then torch's RNE cast.
//!   - `X.weight` F8_E4M3 `[out, in]`, `X.weight_scale` model dtype `[out]`; nothing else.
//! - `int4_fp8` (`INT4_FP8Scheme`, "W4A8"; kquant `w4a8-fp8`): progressive two-stage weights,
//!   FP8 activations dynamic per tensor (amd-quark 0.13 on PyPI; docs/quantize.md):
//!   - stage 1, FP8 per tensor: `s1 = f32(amax) / 448` in F32 (scale_type float32), a zero
//!     replaced by `2^-23`; `w8 = e4m3(clamp(dtype(w / s1), ±448))` (a model-dtype tensor divided
//!     by an F32 0-d scale computes in F32 and rounds to the model dtype);
//!   - stage 2, INT4 per output channel on the FP8 values `f8(w8)` (in FP8 units, not times
//!     `s1`): Quark's INT4 recipe, `s2 = max(dtype(amax_row / 7.5), dtype(2^-23))` stored as
//!     F32, `q = clamp(round_half_even(f8(w8) · (1/s2)), −8, 7)`;
//!   - `X.weight` I32 `[out, ⌈in/8⌉]` packed along in (`pack_method` order, default reorder),
//!     `X.weight_scale` F32 `[]` = `s1`, `X.weight_scale_2` F32 `[out]` = `s2`,
//!     `X.weight_zero_point_2` I32 `[⌈out/8⌉]` zeros; `w ≈ q · s2 · s1`.
//!
//! Checked byte for byte against fixtures/goldens/quark-0.13/{ptpc,int4_fp8}_bfloat16
//! (tests/fp8_w4a8_golden.rs). F16 and F32 models use the same code with their own rounding
//! (no golden; UNVERIFIED).
//!
//! `*_ref` are the plain references; the unsuffixed functions are the rayon fast paths, tested
//! identical.

use rayon::prelude::*;
use serde_json::{json, Value};

use crate::io::dtype::f8_e4m3_to_f32;
use crate::io::writer::TensorSpec;
use crate::io::Dtype;
use crate::quant::codec::{Codec, ConfigFiles, Encoded};
use crate::quant::math::fp8::{e4m3_from_f32_clamped, Fp8, E4M3_MAX};
use crate::quant::math::int4::{quark_run, round_to, Int4, SCALE_EPS};
use crate::quant::math::pack::{self, Order};
use crate::quant::math::rowwise::{self, amax, encode_floats, Path};
use crate::quant::quark::{self, Options};
use crate::quant::stored::{self, Gemv, Packing, Parts};

// ---------------------------------------------------------------------------------------------
// ptpc_fp8

/// `ptpc_fp8` scale of one row: `dtype(amax / 448)`, exactly zero → `dtype(2^-23)`.
pub fn ptpc_scale(row: &[f32], dtype: Dtype) -> f32 {
    let s = round_to(dtype, amax(row) / E4M3_MAX);
    if s == 0.0 {
        round_to(dtype, SCALE_EPS)
    } else {
        s
    }
}

/// `ptpc_fp8` code: `e4m3(clamp(dtype(w / s), ±448))`.
pub fn ptpc_code(w: f32, s: f32, dtype: Dtype) -> u8 {
    e4m3_from_f32_clamped(round_to(dtype, w / s))
}

fn ptpc_quantize_on(path: Path, w: &[f32], rows: usize, cols: usize, dtype: Dtype) -> Fp8 {
    let recipe = rowwise::scaled(|r| ptpc_scale(r, dtype), |x, s| ptpc_code(x, s, dtype));
    Fp8::quantize_rows(path, w, rows, cols, recipe)
}

rowwise::paths! {
    ptpc_quantize_on: ptpc_quantize_ref, ptpc_quantize(w: &[f32], rows: usize, cols: usize, dtype: Dtype) -> Fp8
}

// ---------------------------------------------------------------------------------------------
// int4_fp8

/// A two-stage `int4_fp8` module: the INT4 stage (codes, `s2` per row) and the FP8 scale `s1`.
#[derive(Debug, Clone, PartialEq)]
pub struct Int4Fp8 {
    /// Stage 2: codes `[rows, cols]` and `s2` `[rows]` (in FP8 units).
    pub int4: Int4,
    /// Stage 1: the per-tensor FP8 scale.
    pub s1: f32,
}

impl Int4Fp8 {
    /// `w ≈ (q · s2) · s1` in f32 (Quark dequantizes stage 2, then stage 1).
    pub fn dequantize_ref(&self) -> Vec<f32> {
        self.int4
            .dequantize_ref()
            .into_iter()
            .map(|v| v * self.s1)
            .collect()
    }
}

/// Stage-1 scale: `f32(amax) / 448` in F32, exactly zero → `dtype(2^-23)`.
pub fn int4_fp8_s1(w: &[f32], dtype: Dtype) -> f32 {
    let s = amax(w) / E4M3_MAX;
    if s == 0.0 {
        round_to(dtype, SCALE_EPS)
    } else {
        s
    }
}

/// Stage-1 value of one weight, as the FP8 number it becomes: `f8(e4m3(clamp(dtype(w/s1))))`.
pub fn int4_fp8_stage1(w: f32, s1: f32, dtype: Dtype) -> f32 {
    f8_e4m3_to_f32(e4m3_from_f32_clamped(round_to(dtype, w / s1)))
}

/// Stage 2 on each row's stage-1 values: Quark's INT4 recipe per output channel.
fn int4_fp8_quantize_on(
    path: Path,
    w: &[f32],
    s1: f32,
    rows: usize,
    cols: usize,
    dtype: Dtype,
) -> Int4Fp8 {
    let int4 = Int4::quantize_runs(path, w, rows, cols, cols, |row, out| {
        let w8: Vec<f32> = row.iter().map(|&x| int4_fp8_stage1(x, s1, dtype)).collect();
        quark_run(&w8, out, dtype)
    });
    Int4Fp8 { int4, s1 }
}

/// The reference: plain loops.
pub fn int4_fp8_quantize_ref(w: &[f32], rows: usize, cols: usize, dtype: Dtype) -> Int4Fp8 {
    let s1 = int4_fp8_s1(w, dtype);
    int4_fp8_quantize_on(Path::Reference, w, s1, rows, cols, dtype)
}

/// The fast path: the amax and the rows in parallel. Identical to [`int4_fp8_quantize_ref`].
pub fn int4_fp8_quantize(w: &[f32], rows: usize, cols: usize, dtype: Dtype) -> Int4Fp8 {
    let amax = w
        .par_iter()
        .fold(|| 0f32, |m, &x| m.max(x.abs()))
        .reduce(|| 0f32, f32::max);
    let s1 = int4_fp8_s1(&[amax], dtype);
    int4_fp8_quantize_on(Path::Parallel, w, s1, rows, cols, dtype)
}

/// The tensors one `int4_fp8` module becomes.
pub fn int4_fp8_specs(module: &str, rows: usize, cols: usize) -> Vec<TensorSpec> {
    vec![
        TensorSpec::new(
            format!("{module}.weight"),
            Dtype::I32,
            vec![rows, cols.div_ceil(8)],
        ),
        TensorSpec::new(format!("{module}.weight_scale"), Dtype::F32, vec![]),
        TensorSpec::new(format!("{module}.weight_scale_2"), Dtype::F32, vec![rows]),
        TensorSpec::new(
            format!("{module}.weight_zero_point_2"),
            Dtype::I32,
            vec![rows.div_ceil(8)],
        ),
    ]
}

/// Encode an `int4_fp8` module for each of its [`int4_fp8_specs`], nibbles in `order`.
pub fn int4_fp8_encode(module: &str, q: &Int4Fp8, order: Order) -> Vec<(String, Vec<u8>)> {
    let (rows, cols) = (q.int4.rows, q.int4.cols);
    let words = pack::pack_rows(&q.int4.codes, rows, cols, |row, v| {
        pack::pack(row, order, v)
    });
    vec![
        (format!("{module}.weight"), pack::le_bytes(&words)),
        (
            format!("{module}.weight_scale"),
            q.s1.to_le_bytes().to_vec(),
        ),
        (
            format!("{module}.weight_scale_2"),
            encode_floats(&q.int4.scales, Dtype::F32),
        ),
        (
            format!("{module}.weight_zero_point_2"),
            vec![0u8; rows.div_ceil(8) * 4],
        ),
    ]
}

/// Decode an `int4_fp8` module: I32 words `[rows, ⌈cols/8⌉]`, `s1`, `s2` `[rows]`.
pub fn int4_fp8_decode(
    weight: &[u8],
    s1: f32,
    s2: &[f32],
    rows: usize,
    cols: usize,
    order: Order,
) -> Int4Fp8 {
    Int4Fp8 {
        int4: quark::decode(weight, s2, rows, cols, order),
        s1,
    }
}

/// Quark two-stage `int4_fp8` read back (`Stored::QuarkInt4Fp8`): its integer view is the INT4
/// stage (scales `s2`); it stays on the f32 path.
pub struct Int4Fp8Layout {
    pub order: Order,
}

impl stored::Layout for Int4Fp8Layout {
    fn dequantize(&self, p: &Parts) -> Vec<f32> {
        let (s1, s2) = (p.scalar("weight_scale"), p.f32("weight_scale_2"));
        int4_fp8_decode(p.data("weight"), s1, &s2, p.m.rows, p.m.cols, self.order).dequantize_ref()
    }
    fn int4(&self, p: &Parts) -> Result<Int4, &'static str> {
        let s2 = p.f32("weight_scale_2");
        Ok(quark::decode(
            p.data("weight"),
            &s2,
            p.m.rows,
            p.m.cols,
            self.order,
        ))
    }
    fn packed(&self, _: &Parts) -> Option<Packing> {
        None
    }
    fn gemv(&self) -> Option<Gemv> {
        None
    }
}

// ---------------------------------------------------------------------------------------------
// config

/// One Quark 0.13 quantization spec as `quantization_config` serialises it.
fn spec(
    dtype: &str,
    qscheme: &str,
    ch_axis: Option<i64>,
    is_dynamic: bool,
    scale_type: &str,
) -> Value {
    let observer = match qscheme {
        "per_tensor" => "PerTensorMinMaxObserver",
        _ => "PerChannelMinMaxObserver",
    };
    json!({
        "dtype": dtype, "is_dynamic": is_dynamic, "qscheme": qscheme, "ch_axis": ch_axis,
        "group_size": null, "block_size": null, "symmetric": true, "round_method": "half_even",
        "scale_type": scale_type, "zero_point_type": "int32", "scale_format": null,
        "scale_calculation_mode": null, "mx_element_dtype": null, "observer_cls": observer,
        "is_scale_quant": false, "enable_buffer_reuse": false, "max_input_numel": 4194304,
    })
}

/// `quantization_config` for `ptpc_fp8` (Quark 0.13).
pub fn ptpc_config(o: &Options, exclude: &[String]) -> Value {
    let mut c = quark::config(o, exclude);
    let g = &mut c["global_quant_config"];
    g["weight"] = spec("fp8_e4m3", "per_channel", Some(0), false, "float");
    g["input_tensors"] = spec("fp8_e4m3", "per_channel", Some(1), true, "float");
    c
}

/// `quantization_config` for `int4_fp8` (Quark 0.13): the weight is the two-stage list.
pub fn int4_fp8_config(o: &Options, exclude: &[String]) -> Value {
    let mut c = quark::config(o, exclude);
    let g = &mut c["global_quant_config"];
    g["weight"] = json!([
        spec("fp8_e4m3", "per_tensor", None, false, "float32"),
        spec("int4", "per_channel", Some(0), false, "float32"),
    ]);
    g["input_tensors"] = spec("fp8_e4m3", "per_tensor", None, true, "float32");
    c
}

// ---------------------------------------------------------------------------------------------
// codecs

/// Quark `ptpc_fp8` (model path) as a [`Codec`].
pub struct Ptpc(pub Options);

impl Codec for Ptpc {
    fn describe(&self) -> String {
        "Quark 0.13 ptpc_fp8".into()
    }
    fn specs(&self, module: &str, rows: usize, cols: usize, dtype: Dtype) -> Vec<TensorSpec> {
        // `ptpc_fp8`: one scale per row, `[rows]`, in the model dtype.
        Fp8::specs(module, rows, cols, dtype, vec![rows])
    }
    fn encode(&self, module: &str, w: &[f32], rows: usize, cols: usize, dtype: Dtype) -> Encoded {
        ptpc_quantize(w, rows, cols, dtype).encode(module, dtype)
    }
    fn config(&self, exclude: &[String]) -> ConfigFiles {
        ConfigFiles::config(ptpc_config(&self.0, exclude))
    }
}

/// Quark `int4_fp8` (model path) as a [`Codec`].
pub struct Int4Fp8Codec(pub Options);

impl Codec for Int4Fp8Codec {
    fn describe(&self) -> String {
        "Quark 0.13 int4_fp8 (two-stage)".into()
    }
    fn specs(&self, module: &str, rows: usize, cols: usize, _dtype: Dtype) -> Vec<TensorSpec> {
        int4_fp8_specs(module, rows, cols)
    }
    fn encode(&self, module: &str, w: &[f32], rows: usize, cols: usize, dtype: Dtype) -> Encoded {
        int4_fp8_encode(
            module,
            &int4_fp8_quantize(w, rows, cols, dtype),
            self.0.order,
        )
    }
    fn config(&self, exclude: &[String]) -> ConfigFiles {
        ConfigFiles::config(int4_fp8_config(&self.0, exclude))
    }
    fn advice(&self) -> Option<String> {
        Some(
            "This output is for kquant's own kernels and `kquant verify`. For a loadable draft use `--scheme fp8-pc` (Quark ptpc_fp8) or an INT4 W4A16 scheme (`kquant schemes` says where each loads)."
                .into(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::math::rowwise::test_data as data;
    use crate::quant::quark::{Layout, Version};

    fn opts() -> Options {
        Options {
            layout: Layout::Model,
            version: Version::V013,
            order: Order::Reorder,
        }
    }

    #[test]
    fn fast_equals_reference() {
        rowwise::assert_paths_agree(&[(64, 128), (33, 72), (7, 13), (1, 1)], |w, r, c, dt| {
            assert_eq!(
                int4_fp8_quantize(w, r, c, dt),
                int4_fp8_quantize_ref(w, r, c, dt)
            );
            (ptpc_quantize(w, r, c, dt), ptpc_quantize_ref(w, r, c, dt))
        });
    }

    /// The planted row `[7.5, −7.5, 0.5, …]`: amax 7.5, BF16 scale `7.5/448` = 0.016723…
    #[test]
    fn ptpc_planted_row_and_zero_row() {
        let row = crate::quant::math::rowwise::PLANTED_ROW;
        let q = ptpc_quantize_ref(&row, 1, 8, Dtype::BF16);
        assert_eq!(half::bf16::from_f32(q.scales[0]).to_bits(), 0x3c89);
        assert_eq!(q.codes[0], 0x7e, "7.5 / s clamps to 448");
        assert_eq!(q.codes[1], 0xfe);
        let z = ptpc_quantize_ref(&[0.0, -0.0], 1, 2, Dtype::BF16);
        assert_eq!(half::bf16::from_f32(z.scales[0]).to_bits(), 0x3400);
        assert_eq!(z.codes, vec![0x00, 0x80], "Quark keeps the sign of −0");
    }

    #[test]
    fn int4_fp8_zero_tensor_and_zero_row() {
        let q = int4_fp8_quantize_ref(&[0.0; 16], 2, 8, Dtype::BF16);
        assert_eq!(q.s1, f32::EPSILON);
        assert_eq!(q.int4.scales, vec![f32::EPSILON; 2]);
        assert_eq!(q.int4.codes, vec![0; 16]);
        let mut w = vec![0f32; 16];
        w[..8].copy_from_slice(&[7.5, -7.5, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5]);
        let q = int4_fp8_quantize_ref(&w, 2, 8, Dtype::BF16);
        assert_eq!(q.s1, 7.5 / 448.0);
        assert_eq!(q.int4.scales[0], 59.75, "bf16(448 / 7.5)");
        assert_eq!(
            q.int4.scales[1],
            f32::EPSILON,
            "all-zero row: the eps floor"
        );
        assert_eq!(&q.int4.codes[..2], &[7, -7]);
    }

    #[test]
    fn int4_fp8_round_trips() {
        let (rows, cols) = (13, 40);
        let w = data(rows, cols, Dtype::BF16);
        let q = int4_fp8_quantize(&w, rows, cols, Dtype::BF16);
        let enc = int4_fp8_encode("m", &q, Order::Reorder);
        let back = int4_fp8_decode(&enc[0].1, q.s1, &q.int4.scales, rows, cols, Order::Reorder);
        assert_eq!(back, q);
    }

    /// Named bounds. FP8 E4M3 has 3 mantissa bits: relative error ≤ 2^-4 per element (plus the
    /// model-dtype rounding of the quotient). The two-stage W4A8 error is INT4's half step of
    /// `s2 · s1` plus the FP8 error.
    #[test]
    fn error_bounds() {
        const MAX_RMSE_FP8_PC: f32 = 0.0015;
        const MAX_RMSE_W4A8_FP8: f32 = 0.006;
        let (rows, cols) = (32, 128);
        let w = data(rows, cols, Dtype::BF16);
        let p = ptpc_quantize_ref(&w, rows, cols, Dtype::BF16);
        let rmse = crate::quant::math::fp8::per_row_rmse_within_half_step(&w, &p);
        assert!(rmse < MAX_RMSE_FP8_PC, "fp8 rmse {rmse}");
        let q = int4_fp8_quantize_ref(&w, rows, cols, Dtype::BF16);
        let d = q.dequantize_ref();
        let mut se = 0f64;
        for (x, y) in w.iter().zip(&d) {
            se += ((x - y) as f64).powi(2);
        }
        let rmse = (se / w.len() as f64).sqrt() as f32;
        assert!(rmse < MAX_RMSE_W4A8_FP8, "w4a8 rmse {rmse}");
    }

    #[test]
    fn configs() {
        let c = ptpc_config(&opts(), &[]);
        let g = &c["global_quant_config"];
        assert_eq!(g["weight"]["dtype"], "fp8_e4m3");
        assert_eq!(g["input_tensors"]["ch_axis"], 1);
        assert_eq!(g["input_tensors"]["is_dynamic"], true);
        let c = int4_fp8_config(&opts(), &[]);
        let g = &c["global_quant_config"];
        assert_eq!(g["weight"].as_array().unwrap().len(), 2);
        assert_eq!(g["weight"][1]["dtype"], "int4");
        assert_eq!(g["input_tensors"]["qscheme"], "per_tensor");
    }
}
