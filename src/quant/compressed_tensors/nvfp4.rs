//! compressed-tensors 0.20.0 `nvfp4-pack-quantized`, presets `NVFP4A16` (kquant `nvfp4-a16`,
//! weight-only) and `NVFP4` (kquant `nvfp4`, W4A4 with a static input global scale), as
//! llm-compressor 0.14's observers compute the scales and `NVFP4PackedCompressor` writes them on
//! CPU. compressed-tensors' own arithmetic, never ModelOpt's (`modelopt/nvfp4.rs`); here
//! `dtype(x)` rounds to the model dtype, `e4m3(x)` is torch's cast to FP8 E4M3:
//!
//! - Global scale (`quantization/utils/helpers.py::generate_gparam`, on the weight's dtype):
//!   `g = dtype(dtype(1 / max(amax, tiny)) · 2688)`, stored F32: the Python expression
//!   `448.0 * 6.0 / amax` is `Tensor.__rtruediv__`, which torch implements as
//!   `amax.reciprocal() * 2688`, two roundings to the dtype (true division differs: BF16 amax
//!   0.0825195 gives 32640, not 32512). A non-finite result (amax tiny, or an F16 model with
//!   amax < 0.041) becomes 1.0. `amax` is the largest `|w|` of the module and its fused
//!   siblings ([`crate::quant::fused`]).
//! - Block scale per 16 inputs (`calculate_qparams` with the global scale, `scale_dtype`
//!   float8_e4m3fn): `s = e4m3(clamp(g · dtype(amax16 / 6), ±448))` (the product in F32);
//!   exactly 0 becomes the FP8 eps 0.125 (`_get_dtype_eps`).
//! - Code (`quantize` → `_quantize` → `cast_to_fp4`, then `pack_fp4_to_uint8`):
//!   `x = clamp(w / (f8(s) / g), ±6)` in F32; `|x| ≤ 0.25 → 0`, `< 0.75 → 0.5`, `≤ 1.25 → 1`,
//!   `< 1.75 → 1.5`, `≤ 2.5 → 2`, `< 3.5 → 3`, `≤ 5 → 4`, else 6 (ties to the even code); the
//!   sign bit is set when `x < 0` (`signbit(sign(x) · |q|)`: a negative that rounds to 0 gives
//!   code 8, `−0` gives 0).
//! - Input global scale (W4A4; the `static_minmax` observer's amax through `generate_gparam`):
//!   the same `g` of `dtype(amax_in)`, `amax_in` from `--input-amax`, shared across fused
//!   siblings like the weight's (they read the same input, so the tool's values are equal).
//!
//! Tensors: `X.weight_packed` U8 `[out, in/2]`, `X.weight_scale` F8_E4M3 `[out, in/16]`,
//! `X.weight_global_scale` F32 `[1]`, and (W4A4) `X.input_global_scale` F32 `[1]`. Dequantized,
//! `w = e2m1 · (f8(s) / g)` (`_dequantize`: the scale divided by the global scale in F32).
//!
//! Facts: the installed compressed-tensors 0.20.0 (`compressors/nvfp4/{base,helpers}.py`,
//! `quantization/utils/{helpers,fp4_utils}.py`, `quantization/lifecycle/forward{,_helpers}.py`,
//! `quantization/quant_scheme.py`) and llm-compressor 0.14.0.1 (`observers/`); checked byte for
//! byte against fixtures/goldens/compressed-tensors-0.20/NVFP4A16, NVFP4 (tests/nvfp4_golden.rs).
//! On GPU compressed-tensors quantizes with a Triton kernel (`tl.div_rn` on the F32 scale; not
//! run): kquant matches the CPU path.

use serde_json::{json, Value};

use crate::error::Result;
use crate::io::dtype::f8_e4m3_to_f32;
use crate::io::writer::TensorSpec;
use crate::io::Dtype;
use crate::quant::codec::{Codec, ConfigFiles, Encoded};
use crate::quant::compressed_tensors::{self, Ignore, VERSION};
use crate::quant::fused::SharedAmax;
use crate::quant::input_amax::InputAmax;
use crate::quant::math::fp4::{self, Nvfp4, Nvfp4Names, E2M1_MAX};
use crate::quant::math::fp8::{e4m3_from_f32, e4m3_from_f32_clamped, E4M3_MAX};
use crate::quant::math::int4::round_to;
use crate::quant::math::rowwise::{self, amax, Path};
use crate::quant::stats::Stats;
use crate::quant::stored::F32Layout;

/// The FP8 eps compressed-tensors puts in place of a zero block scale.
pub const FP8_EPS: f32 = 0.125;

/// `torch.finfo(dtype).tiny`.
fn tiny(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::F16 => half::f16::MIN_POSITIVE.to_f32(),
        _ => f32::MIN_POSITIVE,
    }
}

/// `generate_gparam` on an amax of `dtype`: `dtype(dtype(1 / max(amax, tiny)) · 448·6)` (torch's
/// scalar-over-tensor division is a reciprocal and a product), non-finite → 1.0.
pub fn global_scale(amax: f32, dtype: Dtype) -> f32 {
    let r = round_to(dtype, 1.0 / amax.max(tiny(dtype)));
    let g = round_to(dtype, r * (E4M3_MAX * E2M1_MAX));
    if g.is_finite() {
        g
    } else {
        1.0
    }
}

/// The E4M3 block scale of one block: `e4m3(clamp(g · dtype(amax / 6), ±448))`, 0 → 0.125.
pub fn block_scale(block: &[f32], global: f32, dtype: Dtype) -> u8 {
    let c = e4m3_from_f32_clamped(global * round_to(dtype, amax(block) / E2M1_MAX));
    if f8_e4m3_to_f32(c) == 0.0 {
        e4m3_from_f32(FP8_EPS)
    } else {
        c
    }
}

/// One code: `cast_to_fp4(clamp(w / eff, ±6))` with its sign bit (`eff = f8(s) / g`).
pub fn code(w: f32, eff: f32) -> u8 {
    let x = (w / eff).clamp(-E2M1_MAX, E2M1_MAX);
    let a = x.abs();
    let idx = if a <= 0.25 {
        0
    } else if a < 0.75 {
        1
    } else if a <= 1.25 {
        2
    } else if a < 1.75 {
        3
    } else if a <= 2.5 {
        4
    } else if a < 3.5 {
        5
    } else if a <= 5.0 {
        6
    } else {
        7
    };
    idx | if x < 0.0 { 8 } else { 0 }
}

fn quantize_on(path: Path, w: &[f32], rows: usize, cols: usize, amax_t: f32, dt: Dtype) -> Nvfp4 {
    let g = global_scale(amax_t, dt);
    Nvfp4::quantize_blocks(path, w, rows, cols, g, |block, out| {
        let s = block_scale(block, g, dt);
        let eff = f8_e4m3_to_f32(s) / g;
        for (c, &x) in out.iter_mut().zip(block) {
            *c = code(x, eff);
        }
        s
    })
}

rowwise::paths! {
    /// `amax_t` is the (family-shared) weight amax; `cols` a multiple of 16.
    quantize_on: quantize_ref, quantize(w: &[f32], rows: usize, cols: usize, amax_t: f32, dtype: Dtype) -> Nvfp4
}

/// compressed-tensors' dequantization: `e2m1 · (f8(s) / g)` in F32.
pub fn dequantize(q: &Nvfp4) -> Vec<f32> {
    q.dequantize_with(fp4::value, |s| s / q.global)
}

/// `nvfp4-pack-quantized` read back (`Stored::CtNvfp4`): [`dequantize`] of
/// [`Nvfp4::from_stored`]; it stays on the f32 path.
pub const LAYOUT: F32Layout = F32Layout {
    kind: "NVFP4",
    dequantize: |p| {
        let (packed, scales) = (p.data("weight_packed"), p.data("weight_scale"));
        let g = p.scalar("weight_global_scale");
        dequantize(&Nvfp4::from_stored(packed, scales, g, p.m.rows, p.m.cols))
    },
};

/// The tensors one module becomes (`weight_packed`, `weight_scale`, `weight_global_scale` and for
/// W4A4 `input_global_scale`, the scales `[1]`), and their encoding.
pub const NAMES: Nvfp4Names = Nvfp4Names {
    packed: "weight_packed",
    global: "weight_global_scale",
    input: "input_global_scale",
    scalar: &[1],
};

/// `quantization_config`, as `ModelCompressor.update_config` writes it for the preset.
pub fn config(w4a4: bool, ignore: &[String]) -> Value {
    let args = |extra: Option<Value>| {
        let mut a = json!({"dynamic": false, "group_size": 16, "num_bits": 4,
                           "scale_dtype": "torch.float8_e4m3fn", "strategy": "tensor_group",
                           "symmetric": true, "type": "float"});
        if let Some(Value::Object(e)) = extra {
            for (k, v) in e {
                a[k] = v;
            }
        }
        a
    };
    let input = if w4a4 {
        args(Some(
            json!({"dynamic": "local", "observer": "static_minmax"}),
        ))
    } else {
        Value::Null
    };
    let format = "nvfp4-pack-quantized";
    compressed_tensors::quantization_config(format, args(None), input, ignore, Ignore::Sorted)
}

/// compressed-tensors NVFP4 as a [`Codec`]: weight-only (`NVFP4A16`) without an input amax
/// file, W4A4 (`NVFP4`) with one; the per-tensor amax shared by fused siblings.
pub struct Nvfp4PackQuantized {
    w4a4: bool,
    shared: SharedAmax,
}

impl Nvfp4PackQuantized {
    /// From the pre-pass's statistics (and, W4A4, the calibrated input amax).
    pub fn new(input: Option<&InputAmax>, stats: &Stats) -> Result<Nvfp4PackQuantized> {
        Ok(Nvfp4PackQuantized {
            w4a4: input.is_some(),
            shared: SharedAmax::compute(stats, input)?,
        })
    }
}

impl Codec for Nvfp4PackQuantized {
    fn describe(&self) -> String {
        let p = if self.w4a4 { "NVFP4" } else { "NVFP4A16" };
        format!("compressed-tensors {VERSION} nvfp4-pack-quantized ({p})")
    }
    fn specs(&self, module: &str, rows: usize, cols: usize, _dtype: Dtype) -> Vec<TensorSpec> {
        NAMES.specs(module, rows, cols, self.w4a4)
    }
    fn encode(&self, module: &str, w: &[f32], rows: usize, cols: usize, dtype: Dtype) -> Encoded {
        let q = quantize(w, rows, cols, self.shared.weight(module), dtype);
        let input = self
            .shared
            .input(module)
            .map(|a| global_scale(round_to(dtype, a), dtype));
        NAMES.encode(module, &q, input)
    }
    fn config(&self, ignore: &[String]) -> ConfigFiles {
        ConfigFiles::config(config(self.w4a4, ignore))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_scale_as_generate_gparam() {
        assert_eq!(global_scale(5.25, Dtype::BF16), 512.0);
        // 2688 / 0.1 = 26880 → BF16 26880 (exact: 0x46d2) vs F32 26880.
        assert_eq!(global_scale(0.1, Dtype::F32), 2688.0 / 0.1);
        assert_eq!(
            global_scale(0.1, Dtype::BF16),
            round_to(Dtype::BF16, 2688.0 / 0.1)
        );
        // Zero and tiny amax overflow → 1.0; F16 overflows already below 2688 / 65504.
        assert_eq!(global_scale(0.0, Dtype::BF16), 1.0);
        assert_eq!(global_scale(0.0, Dtype::F32), 1.0);
        assert_eq!(global_scale(0.02, Dtype::F16), 1.0);
        assert_eq!(global_scale(0.5, Dtype::F16), 5376.0);
    }

    /// The planted block of the golden: scale 256 at g = 512 (effective 0.5), every tie.
    #[test]
    fn ties_round_to_the_even_code_and_signs() {
        let block = [
            3.0f32, -3.0, 0.125, 0.375, 0.625, 0.875, 1.25, 1.75, 2.5, -0.125, -0.375, -0.625,
            -0.875, -1.25, -1.75, -2.5,
        ];
        let s = block_scale(&block, 512.0, Dtype::BF16);
        assert_eq!(f8_e4m3_to_f32(s), 256.0);
        let codes: Vec<u8> = block.iter().map(|&x| code(x, 256.0 / 512.0)).collect();
        let packed = fp4::pack(&codes);
        assert_eq!(packed, [0xf7, 0x20, 0x42, 0x64, 0x86, 0xaa, 0xcc, 0xee]);
        assert_eq!(code(-0.0, 1.0), 0);
        assert_eq!(code(-0.1, 1.0), 8);
        assert_eq!(code(100.0, 1.0), 7);
        // A zero block → eps 0.125; a block scale below half the smallest subnormal too.
        assert_eq!(
            f8_e4m3_to_f32(block_scale(&[0.0; 16], 512.0, Dtype::BF16)),
            0.125
        );
        let tiny = [5e-6f32; 16];
        assert_eq!(
            f8_e4m3_to_f32(block_scale(&tiny, 512.0, Dtype::BF16)),
            0.125
        );
    }

    #[test]
    fn fast_equals_reference_and_round_trips() {
        rowwise::assert_paths_agree(&[(64, 128), (7, 48), (1, 16)], |w, rows, cols, dt| {
            let a = amax(w);
            let r = quantize_ref(w, rows, cols, a, dt);
            let enc = NAMES.encode("m", &r, Some(3.0));
            assert_eq!(
                Nvfp4::from_stored(&enc[0].1, &enc[1].1, r.global, rows, cols),
                r
            );
            (quantize(w, rows, cols, a, dt), r)
        });
    }

    /// Named bounds: every weight is within `MAX_ERR_STEPS` effective block scales
    /// (`eff = f8(s)/g`) of its dequantized value. E2M1's widest gap is 2 (between 4 and 6), so
    /// rounding costs at most 1·eff; a block whose E4M3 scale rounded down (by ≤ 2^-4) reaches
    /// at most 6·(1 + 2^-4) = 6.375 before the clamp to 6, an error of 0.375·eff. The RMSE on
    /// the test matrix is below `MAX_RMSE_CT_NVFP4`.
    #[test]
    fn error_bound() {
        const MAX_ERR_STEPS: f32 = 1.0;
        const MAX_RMSE_CT_NVFP4: f32 = 0.0045;
        let quantize = |w: &[f32], r, c, a| quantize_ref(w, r, c, a, Dtype::BF16);
        let eff = |s: f32, g: f32| s / g;
        fp4::assert_error_bound(quantize, dequantize, eff, MAX_ERR_STEPS, MAX_RMSE_CT_NVFP4);
    }
}
