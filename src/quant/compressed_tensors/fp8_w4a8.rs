//! compressed-tensors 0.20.0's unpacked formats, as its `NaiveQuantizationCompressor` writes them
//! on CPU (`quantize()` → `_quantize`, scales from `calculate_qparams`), never another tool's
//! recipe:
//!
//! - `float-quantized`, preset `FP8_DYNAMIC` (kquant `fp8-pc`): FP8 E4M3 weights per output
//!   channel, FP8 activations dynamic per token.
//!   - `s = dtype(amax_row / 448)`; an exactly-zero `s` becomes the model dtype's eps (BF16
//!     `2^-7`, F16 `2^-10`, F32 `2^-23`).
//!   - `code = e4m3(clamp(dtype(w / s) + zp, ±448))` with the all-zero FP8 zero point that
//!     compressed-tensors still holds while compressing: adding it turns `−0` into `+0` (so
//!     code `0x80` never appears) and changes nothing else.
//!   - `X.weight` F8_E4M3 `[out, in]`, `X.weight_scale` model dtype `[out, 1]`.
//! - `int-quantized`, preset `W4A8` (kquant `w4a8-int8`): INT4 symmetric weights per group of
//!   128 input columns, INT8 activations dynamic per token, symmetric. compressed-tensors 0.20.0
//!   picks `int-quantized` for it (activations are quantized), so the codes are stored
//!   **unpacked**, one I8 per weight:
//!   - the W4A16 recipe of `compressed_tensors/mod.rs`: `s = dtype(amax_group / 7.5)` (zero → dtype
//!     eps), `q = round_half_even(clamp(dtype(w / s), −8, 7))`;
//!   - `X.weight` I8 `[out, in]`, `X.weight_scale` model dtype `[out, in/128]`; no
//!     `weight_shape`, no zero point.
//!
//! Facts: the compressed-tensors 0.20.0 source (PyPI `compressed-tensors==0.20.0`,
//! `compressors/quantized_compressors/naive_quantized.py`) and docs/quantize.md; checked byte for byte against
//! fixtures/goldens/compressed-tensors-0.20/{FP8_DYNAMIC,W4A8} (tests/fp8_w4a8_golden.rs).
//!
//! `*_ref` are the plain references; the unsuffixed functions are the rayon fast paths, tested
//! identical.

use serde_json::{json, Value};

use crate::io::writer::TensorSpec;
use crate::io::Dtype;
use crate::quant::codec::{Codec, ConfigFiles, Encoded};
use crate::quant::compressed_tensors::{self, Ignore, VERSION};
use crate::quant::math::fp8::{e4m3_from_f32_clamped, Fp8, E4M3_MAX};
use crate::quant::math::int4::{round_to, Int4};
use crate::quant::math::rowwise::{self, encode_floats, Path};
use crate::quant::stored::{Gemv, IntLayout, Parts};

/// The group size of the `W4A8` preset.
pub const W4A8_GROUP: usize = 128;

/// FP8 scale of one row: `dtype(amax / 448)`, exactly zero → the dtype's eps.
pub fn fp8_scale(row: &[f32], dtype: Dtype) -> f32 {
    compressed_tensors::symmetric_scale(row, E4M3_MAX, dtype)
}

/// FP8 code: `e4m3(clamp(dtype(w / s) + 0, ±448))` (the `+ 0` is the zero point: `−0` → `+0`).
pub fn fp8_code(w: f32, s: f32, dtype: Dtype) -> u8 {
    e4m3_from_f32_clamped(round_to(dtype, w / s) + 0.0)
}

fn fp8_quantize_on(path: Path, w: &[f32], rows: usize, cols: usize, dtype: Dtype) -> Fp8 {
    let recipe = rowwise::scaled(|r| fp8_scale(r, dtype), |x, s| fp8_code(x, s, dtype));
    Fp8::quantize_rows(path, w, rows, cols, recipe)
}

rowwise::paths! {
    fp8_quantize_on: fp8_quantize_ref, fp8_quantize(w: &[f32], rows: usize, cols: usize, dtype: Dtype) -> Fp8
}

/// The tensors one `int-quantized` module (`[rows = out, cols = in]`, group `G`) becomes.
pub fn int_specs(
    module: &str,
    rows: usize,
    cols: usize,
    group: usize,
    dt: Dtype,
) -> Vec<TensorSpec> {
    let groups = rowwise::groups(module, cols, group);
    vec![
        TensorSpec::new(format!("{module}.weight"), Dtype::I8, vec![rows, cols]),
        TensorSpec::new(format!("{module}.weight_scale"), dt, vec![rows, groups]),
    ]
}

/// Encode an `int-quantized` module for each of its [`int_specs`]: one I8 per code.
pub fn int_encode(module: &str, q: &Int4, model: Dtype) -> Vec<(String, Vec<u8>)> {
    vec![
        (
            format!("{module}.weight"),
            q.codes.iter().map(|&c| c as u8).collect(),
        ),
        (
            format!("{module}.weight_scale"),
            encode_floats(&q.scales, model),
        ),
    ]
}

/// Decode an `int-quantized` module: I8 codes `[rows, cols]`, scales `[rows, cols/G]`.
pub fn int_decode(weight: &[u8], scales: &[f32], rows: usize, cols: usize, group: usize) -> Int4 {
    Int4 {
        rows,
        cols,
        group,
        scales: scales.to_vec(),
        codes: weight.iter().map(|&b| b as i8).collect(),
    }
}

/// `int-quantized` read back (`Stored::CtInt`): [`int_decode`]'s layout.
pub struct IntLayoutW4A8 {
    pub group: usize,
}

impl IntLayout for IntLayoutW4A8 {
    fn codes(&self, p: &Parts) -> Int4 {
        let (w, s, rows, cols) = p.int_tensors("weight");
        int_decode(w, &s, rows, cols, self.group)
    }
    fn gemv(&self) -> Option<Gemv> {
        None
    }
}

/// The config of one `Linear` group; `ignore` goes last, where compressed-tensors writes it.
fn config_group(format: &str, weights: Value, input: Value, ignore: &[String]) -> Value {
    compressed_tensors::quantization_config(format, weights, input, ignore, Ignore::Last)
}

/// `quantization_config` of the `FP8_DYNAMIC` preset.
pub fn fp8_config(ignore: &[String]) -> Value {
    config_group(
        "float-quantized",
        json!({"dynamic": false, "group_size": null, "num_bits": 8, "strategy": "channel",
               "symmetric": true, "type": "float"}),
        json!({"dynamic": true, "group_size": null, "num_bits": 8, "strategy": "token",
               "symmetric": true, "type": "float"}),
        ignore,
    )
}

/// `quantization_config` of the `W4A8` preset (`int-quantized`).
pub fn w4a8_config(ignore: &[String]) -> Value {
    config_group(
        "int-quantized",
        json!({"dynamic": false, "group_size": W4A8_GROUP, "num_bits": 4, "strategy": "group",
               "symmetric": true, "type": "int"}),
        json!({"dynamic": true, "group_size": null, "num_bits": 8, "strategy": "token",
               "symmetric": true, "type": "int"}),
        ignore,
    )
}

/// compressed-tensors `FP8_DYNAMIC` (`float-quantized`) as a [`Codec`].
pub struct FloatQuantized;

impl Codec for FloatQuantized {
    fn describe(&self) -> String {
        format!("compressed-tensors {VERSION} float-quantized (FP8_DYNAMIC)")
    }
    fn specs(&self, module: &str, rows: usize, cols: usize, dtype: Dtype) -> Vec<TensorSpec> {
        // `float-quantized`: one scale per row, `[rows, 1]`, in the model dtype.
        Fp8::specs(module, rows, cols, dtype, vec![rows, 1])
    }
    fn encode(&self, module: &str, w: &[f32], rows: usize, cols: usize, dtype: Dtype) -> Encoded {
        fp8_quantize(w, rows, cols, dtype).encode(module, dtype)
    }
    fn config(&self, exclude: &[String]) -> ConfigFiles {
        ConfigFiles::config(fp8_config(exclude))
    }
}

/// compressed-tensors `W4A8` (`int-quantized`, group 128) as a [`Codec`].
pub struct IntQuantizedW4A8;

impl Codec for IntQuantizedW4A8 {
    fn describe(&self) -> String {
        format!("compressed-tensors {VERSION} int-quantized (W4A8, group {W4A8_GROUP})")
    }
    fn specs(&self, module: &str, rows: usize, cols: usize, dtype: Dtype) -> Vec<TensorSpec> {
        int_specs(module, rows, cols, W4A8_GROUP, dtype)
    }
    fn encode(&self, module: &str, w: &[f32], rows: usize, cols: usize, dtype: Dtype) -> Encoded {
        int_encode(
            module,
            &compressed_tensors::quantize(w, rows, cols, W4A8_GROUP, dtype),
            dtype,
        )
    }
    fn config(&self, exclude: &[String]) -> ConfigFiles {
        ConfigFiles::config(w4a8_config(exclude))
    }
    fn advice(&self) -> Option<String> {
        Some(
            "The codes are stored unpacked (8 bits per weight on disk). For a GPU draft use `--scheme fp8-pc` or an INT4 W4A16 scheme (`int4-g128`)."
                .into(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::math::rowwise::test_data as data;

    #[test]
    fn fast_equals_reference() {
        rowwise::assert_paths_agree(&[(64, 128), (33, 72), (7, 13), (1, 1)], |w, r, c, dt| {
            (fp8_quantize(w, r, c, dt), fp8_quantize_ref(w, r, c, dt))
        });
    }

    /// The planted row of the FP8_DYNAMIC golden (summary.json `q_proj_row0`): scale
    /// 0.0167236328125; the first values 448, −448, 30 (summary.json lists them cast to I32:
    /// 0x1c0, 0xfffffe40, 0x1e) are the codes 0x7e, 0xfe, 0x5f.
    #[test]
    fn planted_row_zero_row_and_negative_zero() {
        let row = crate::quant::math::rowwise::PLANTED_ROW;
        let q = fp8_quantize_ref(&row, 1, 8, Dtype::BF16);
        assert_eq!(
            q.scales,
            vec![f32::from_bits(0x3c89_0000)],
            "0.0167236328125"
        );
        assert_eq!(&q.codes[..3], &[0x7e, 0xfe, 0x5f]);
        let z = fp8_quantize_ref(&[0.0, -0.0], 1, 2, Dtype::BF16);
        assert_eq!(
            z.scales,
            vec![2f32.powi(-7)],
            "BF16 eps replaces a zero scale"
        );
        assert_eq!(z.codes, vec![0, 0], "the zero point turns −0 into +0");
    }

    #[test]
    fn int_quantized_round_trips() {
        let (rows, cols) = (5, 256);
        let w = data(rows, cols, Dtype::BF16);
        let q = compressed_tensors::quantize(&w, rows, cols, W4A8_GROUP, Dtype::BF16);
        let enc = int_encode("m", &q, Dtype::BF16);
        assert_eq!(int_decode(&enc[0].1, &q.scales, rows, cols, W4A8_GROUP), q);
    }

    /// Named bound: FP8's relative step is 2^-3, so each element is within 2^-4 relative (plus
    /// the BF16 rounding of the quotient and the subnormal step near zero).
    #[test]
    fn error_bound() {
        const MAX_RMSE_CT_FP8_PC: f32 = 0.0015;
        let (rows, cols) = (32, 128);
        let w = data(rows, cols, Dtype::BF16);
        let q = fp8_quantize_ref(&w, rows, cols, Dtype::BF16);
        let rmse = crate::quant::math::fp8::per_row_rmse_within_half_step(&w, &q);
        assert!(rmse < MAX_RMSE_CT_FP8_PC, "rmse {rmse}");
    }

    #[test]
    fn configs() {
        let c = fp8_config(&["lm_head".into()]);
        assert_eq!(c["format"], "float-quantized");
        assert_eq!(c["config_groups"]["group_0"]["weights"]["type"], "float");
        assert_eq!(c["ignore"], json!(["lm_head"]));
        let c = w4a8_config(&[]);
        assert_eq!(c["format"], "int-quantized");
        let g = &c["config_groups"]["group_0"];
        assert_eq!(g["weights"]["group_size"], 128);
        assert_eq!(g["input_activations"]["type"], "int");
        assert_eq!(g["input_activations"]["strategy"], "token");
    }
}
