//! NVIDIA ModelOpt 0.47.0's NVFP4 export (`export_hf_checkpoint`), `quant_algo` `W4A16_NVFP4`
//! (`W4A16_NVFP4_CFG`, kquant `nvfp4-a16`) and `NVFP4` (`NVFP4_DEFAULT_CFG`, kquant `nvfp4`:
//! W4A4 with a static input scale). ModelOpt's own arithmetic (`qtensor/nvfp4_tensor.py`
//! `NVFP4QTensor`, `export/quant_utils.py`), never compressed-tensors' (`compressed_tensors/nvfp4.rs`):
//!
//! - `weight_scale_2 = f32(amax) / (6·448)` in F32 (`get_weights_scaling_factor_2_from_quantizer`),
//!   `amax` the largest `|w|` over the module and its fused siblings (`preprocess_linear_fusion`
//!   sets every member's amax to the group's max; [`crate::quant::fused`]). An amax of 0 would give NaN
//!   scales; kquant refuses such a family.
//! - Block scale per 16 inputs (`get_weights_scaling_factor`): `b = f32(amax16) / (6 · ws2)`
//!   (the product in F32), `b == 0 → 1.0`, then `e4m3(clamp(b, 2^-9, 448))`: unlike
//!   compressed-tensors, a tiny block scale is raised to the smallest subnormal instead of
//!   rounding to 0.
//! - Code (`NVFP4QTensor.quantize` → `_cast_fp4`): `x = w / (f8(s) · ws2)` in F32; the
//!   magnitude index is `searchsorted([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5], |x|)` plus one
//!   where `|x|` equals an odd bound 0.75, 1.75 or 3.5 (ties to the even code); the sign bit is
//!   `x < 0`. No clamp: anything above 5 is code 7 (6.0).
//! - `input_scale` (W4A4; `get_activation_scaling_factor`): `f32(amax_in) / (6·448)`, where an
//!   amax of 0 or NaN is first replaced by the maxbound 6 (`_sanitize_export_amax`); `amax_in`
//!   from `--input-amax`, the max over fused siblings (`preprocess_linear_fusion`).
//!
//! Tensors: `X.weight` U8 `[out, in/2]`, `X.weight_scale` F8_E4M3 `[out, in/16]`,
//! `X.weight_scale_2` F32 `[]`, (W4A4) `X.input_scale` F32 `[]`. Dequantized (as
//! `NVFP4QTensor.dequantize`): `w = e2m1 · (f8(s) · ws2)`, where ModelOpt's `e2m1_values`
//! table maps code 8 to +0 (compressed-tensors' unpacker gives −0). Config: `hf_quant_config.json`
//! with `group_size` 16, and `config_groups` in `config.json`'s `quantization_config`
//! (`convert_hf_config.py`).
//!
//! Facts: the installed nvidia-modelopt 0.47.0; checked byte for byte against
//! fixtures/goldens/modelopt-0.47/{W4A16_NVFP4_CFG,NVFP4_planted} (tests/nvfp4_golden.rs), run on
//! CPU. ModelOpt would call TensorRT-LLM's `fp4_quantize` on a CUDA device with TensorRT-LLM
//! installed (`try_tensorrt`, off in the export path).

use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::io::dtype::f8_e4m3_to_f32;
use crate::io::writer::TensorSpec;
use crate::io::Dtype;
use crate::quant::codec::{Codec, ConfigFiles, Encoded};
use crate::quant::fused::SharedAmax;
use crate::quant::input_amax::InputAmax;
use crate::quant::math::fp4::{Nvfp4, Nvfp4Names, BLOCK, E2M1_MAX};
use crate::quant::math::fp8::{e4m3_from_f32, E4M3_MAX};
use crate::quant::math::rowwise::{self, amax, Path};
use crate::quant::modelopt::{python_json_indent4, VERSION};
use crate::quant::stats::Stats;
use crate::quant::stored::F32Layout;

/// `e2m1_values` of `nvfp4_tensor.py`, by code: code 8 is +0, not −0.
pub const VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];
/// `e2m1_bounds` of `nvfp4_tensor.py`.
pub const BOUNDS: [f32; 7] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0];
/// The smallest E4M3 subnormal, ModelOpt's floor for a block scale.
pub const MIN_BLOCK_SCALE: f32 = 1.0 / 512.0;

/// `weight_scale_2` (and `input_scale`): `amax / (6·448)` in F32.
pub fn scale_2(amax: f32) -> f32 {
    amax / (E2M1_MAX * E4M3_MAX)
}

/// The input scale: `scale_2` of the sanitized amax (0 or NaN → the maxbound 6).
pub fn input_scale(amax: f32) -> f32 {
    scale_2(if amax == 0.0 || amax.is_nan() {
        E2M1_MAX
    } else {
        amax
    })
}

/// The E4M3 block scale of one block: `e4m3(clamp(amax16 / (6 · ws2), 2^-9, 448))`, 0 → 1.0.
pub fn block_scale(block: &[f32], ws2: f32) -> u8 {
    let b = amax(block) / (E2M1_MAX * ws2);
    let b = if b == 0.0 { 1.0 } else { b };
    e4m3_from_f32(b.clamp(MIN_BLOCK_SCALE, E4M3_MAX))
}

/// `_cast_fp4` of one scaled value.
pub fn code(x: f32) -> u8 {
    let a = x.abs();
    let ord = BOUNDS.iter().take_while(|&&b| b < a).count() as u8;
    let odd = (a == 0.75 || a == 1.75 || a == 3.5) as u8;
    (((x < 0.0) as u8) << 3) + ord + odd
}

fn quantize_on(path: Path, w: &[f32], rows: usize, cols: usize, amax_t: f32) -> Nvfp4 {
    let ws2 = scale_2(amax_t);
    Nvfp4::quantize_blocks(path, w, rows, cols, ws2, |block, out| {
        let s = block_scale(block, ws2);
        let eff = f8_e4m3_to_f32(s) * ws2;
        for (c, &x) in out.iter_mut().zip(block) {
            *c = code(x / eff);
        }
        s
    })
}

rowwise::paths! {
    /// `amax_t` is the (family-shared) weight amax, > 0.
    quantize_on: quantize_ref, quantize(w: &[f32], rows: usize, cols: usize, amax_t: f32) -> Nvfp4
}

/// ModelOpt's dequantization: `VALUES[code] · (f8(s) · ws2)` in F32.
pub fn dequantize(q: &Nvfp4) -> Vec<f32> {
    q.dequantize_with(|c| VALUES[c as usize], |s| s * q.global)
}

/// `NVFP4` / `W4A16_NVFP4` read back (`Stored::ModeloptNvfp4`): [`dequantize`] of
/// [`Nvfp4::from_stored`], then `pre_quant_scale`; it stays on the f32 path.
pub const LAYOUT: F32Layout = F32Layout {
    kind: "NVFP4",
    dequantize: |p| {
        let (w, scales) = (p.data("weight"), p.data("weight_scale"));
        let s2 = p.scalar("weight_scale_2");
        let v = dequantize(&Nvfp4::from_stored(w, scales, s2, p.m.rows, p.m.cols));
        super::with_pre_quant_scale(p, v)
    },
};

/// The tensors one module becomes (`weight`, `weight_scale`, `weight_scale_2` and for W4A4
/// `input_scale`, each scale a scalar `[]`), and their encoding.
pub const NAMES: Nvfp4Names = Nvfp4Names {
    packed: "weight",
    global: "weight_scale_2",
    input: "input_scale",
    scalar: &[],
};

/// The `quant_algo`.
pub fn quant_algo(w4a4: bool) -> &'static str {
    if w4a4 {
        "NVFP4"
    } else {
        "W4A16_NVFP4"
    }
}

/// `hf_quant_config.json`, as `get_quant_config` writes it for NVFP4.
pub fn hf_quant_config(w4a4: bool, exclude_modules: &[String]) -> Value {
    json!({"producer": {"name": "modelopt", "version": VERSION},
           "quantization": {"quant_algo": quant_algo(w4a4), "kv_cache_quant_algo": null,
                            "group_size": BLOCK, "exclude_modules": exclude_modules}})
}

/// `quantization_config` in `config.json` (`convert_hf_quant_config_format`): with
/// `config_groups`.
pub fn config(w4a4: bool, ignore: &[String]) -> Value {
    let args = json!({"dynamic": false, "num_bits": 4, "type": "float", "group_size": BLOCK});
    let group = if w4a4 {
        json!({"input_activations": args, "weights": args, "targets": ["Linear"]})
    } else {
        json!({"weights": args, "targets": ["Linear"]})
    };
    json!({
        "config_groups": {"group_0": group},
        "ignore": ignore,
        "quant_algo": quant_algo(w4a4),
        "producer": {"name": "modelopt", "version": VERSION},
        "quant_method": "modelopt",
    })
}

/// ModelOpt NVFP4 as a [`Codec`]: `W4A16_NVFP4` without an input amax file, `NVFP4` with one;
/// the per-tensor amax shared by fused siblings.
pub struct Nvfp4Codec {
    w4a4: bool,
    shared: SharedAmax,
}

impl Nvfp4Codec {
    /// From the pre-pass's statistics (and, W4A4, the calibrated input amax); refuses a family
    /// whose shared weight amax is zero.
    pub fn new(input: Option<&InputAmax>, stats: &Stats) -> Result<Nvfp4Codec> {
        let shared = SharedAmax::compute(stats, input)?;
        if let Some((m, _)) = shared.weight.iter().find(|(_, &a)| a == 0.0) {
            return Err(Error::Flags {
                msg: format!(
                    "`{m}` (with its fused siblings) is all zeros: ModelOpt's NVFP4 export would divide by weight_scale_2 = 0 and write NaN scales"
                ),
                hint: format!("--exclude `{m}` (and its fused siblings), or use --format compressed-tensors"),
            });
        }
        Ok(Nvfp4Codec {
            w4a4: input.is_some(),
            shared,
        })
    }
}

impl Codec for Nvfp4Codec {
    fn describe(&self) -> String {
        format!("ModelOpt {VERSION} {}", quant_algo(self.w4a4))
    }
    fn specs(&self, module: &str, rows: usize, cols: usize, _dtype: Dtype) -> Vec<TensorSpec> {
        NAMES.specs(module, rows, cols, self.w4a4)
    }
    fn encode(&self, module: &str, w: &[f32], rows: usize, cols: usize, _dtype: Dtype) -> Encoded {
        let q = quantize(w, rows, cols, self.shared.weight(module));
        NAMES.encode(module, &q, self.shared.input(module).map(input_scale))
    }
    fn config(&self, exclude_modules: &[String]) -> ConfigFiles {
        ConfigFiles {
            quantization_config: config(self.w4a4, exclude_modules),
            side_files: vec![(
                "hf_quant_config.json".into(),
                python_json_indent4(&hf_quant_config(self.w4a4, exclude_modules)),
            )],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::compressed_tensors::nvfp4 as ct_nvfp4;
    use crate::quant::math::fp4;

    /// The planted row of the golden: amax 5.25 gives ws2 = 2^-9 exactly; block 0 (amax 3)
    /// scale 256, every tie to the even code; a zero block scale 1.0; a tiny block 2^-9.
    #[test]
    fn planted_blocks() {
        let ws2 = scale_2(5.25);
        assert_eq!(ws2, 1.0 / 512.0);
        let block = [
            3.0f32, -3.0, 0.125, 0.375, 0.625, 0.875, 1.25, 1.75, 2.5, -0.125, -0.375, -0.625,
            -0.875, -1.25, -1.75, -2.5,
        ];
        let s = block_scale(&block, ws2);
        assert_eq!(f8_e4m3_to_f32(s), 256.0);
        let codes: Vec<u8> = block.iter().map(|&x| code(x / (256.0 * ws2))).collect();
        assert_eq!(
            fp4::pack(&codes),
            [0xf7, 0x20, 0x42, 0x64, 0x86, 0xaa, 0xcc, 0xee]
        );
        assert_eq!(f8_e4m3_to_f32(block_scale(&[0.0; 16], ws2)), 1.0);
        assert_eq!(
            f8_e4m3_to_f32(block_scale(&[5e-6; 16], ws2)),
            MIN_BLOCK_SCALE
        );
        assert_eq!(code(-0.0), 0);
        assert_eq!(code(-0.1), 8);
        assert_eq!(code(7.0), 7);
        assert_eq!(input_scale(0.0), 6.0 / 2688.0);
        assert_eq!(input_scale(3.890625), 3.890625f32 / 2688.0);
        // ModelOpt reads code 8 as +0, compressed-tensors as −0.
        let q = Nvfp4::from_stored(&[0x88; 8], &[0x38], 1.0, 1, 16);
        assert!(dequantize(&q).iter().all(|x| x.to_bits() == 0));
        assert!(ct_nvfp4::dequantize(&q)
            .iter()
            .all(|x| x.to_bits() == 0x8000_0000));
    }

    /// Both tools round a scaled value to the same E2M1 code by different arithmetic
    /// (searchsorted + odd-bound adjustment here, thresholds there): equal on every bound, its
    /// neighbours, and a sweep.
    #[test]
    fn code_rounding_agrees_with_compressed_tensors() {
        let mut xs: Vec<f32> = Vec::new();
        for b in BOUNDS.iter().chain(&fp4::E2M1[..]) {
            for x in [*b, -*b] {
                xs.extend([
                    x,
                    f32::from_bits(x.to_bits() + 1),
                    f32::from_bits(x.to_bits().max(1) - 1),
                ]);
            }
        }
        xs.extend((0..20000).map(|i| (i as f32 - 10000.0) * 0.000_73));
        for x in xs {
            if x.abs() <= 6.0 {
                assert_eq!(code(x), ct_nvfp4::code(x, 1.0), "{x}");
            }
        }
    }

    #[test]
    fn fast_equals_reference_and_round_trips() {
        rowwise::assert_paths_agree(&[(64, 128), (7, 48), (1, 16)], |w, rows, cols, _| {
            let r = quantize_ref(w, rows, cols, amax(w));
            let enc = NAMES.encode("m", &r, Some(0.5));
            assert_eq!(
                Nvfp4::from_stored(&enc[0].1, &enc[1].1, r.global, rows, cols),
                r
            );
            (quantize(w, rows, cols, amax(w)), r)
        });
    }

    /// Named bounds, as `ct_nvfp4::tests::error_bound`: within `MAX_ERR_STEPS` effective block
    /// scales (`f8(s)·ws2`) of the weight, RMSE below `MAX_RMSE_MODELOPT_NVFP4`.
    #[test]
    fn error_bound() {
        const MAX_ERR_STEPS: f32 = 1.0;
        const MAX_RMSE_MODELOPT_NVFP4: f32 = 0.0045;
        let eff = |s: f32, ws2: f32| s * ws2;
        let max_rmse = MAX_RMSE_MODELOPT_NVFP4;
        fp4::assert_error_bound(quantize_ref, dequantize, eff, MAX_ERR_STEPS, max_rmse);
    }

    /// The pre-pass shares the weight amax over a family and refuses an all-zero one.
    #[test]
    fn stats_are_shared_and_zero_families_refused() {
        let fam = vec![vec!["a.gate_proj".to_string(), "a.up_proj".to_string()]];
        let p = |g: f32, u: f32| Stats {
            quantized: vec![
                "a.gate_proj".into(),
                "a.up_proj".into(),
                "a.down_proj".into(),
            ],
            families: fam.clone(),
            weight_amax: Some(
                [("a.gate_proj", g), ("a.up_proj", u), ("a.down_proj", 1.0)]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
            ),
        };
        let t = Nvfp4Codec::new(None, &p(0.5, 2.0)).unwrap();
        assert_eq!(t.shared.weight("a.gate_proj"), 2.0);
        assert_eq!(t.shared.weight("a.down_proj"), 1.0);
        let e = Nvfp4Codec::new(None, &p(0.0, 0.0)).err().unwrap();
        assert!(e.to_string().contains("all zeros"), "{e}");
        // One zero member of a non-zero family is fine (it takes the family's scale).
        Nvfp4Codec::new(None, &p(0.0, 2.0)).unwrap();
    }

    /// `hf_quant_config.json` byte for byte as ModelOpt 0.47 wrote it for the NVFP4 golden.
    #[test]
    fn hf_quant_config_bytes() {
        let hf = |ex: &[String]| hf_quant_config(true, ex);
        crate::quant::modelopt::tests::assert_golden_hf_quant_config("NVFP4_DEFAULT_CFG", hf);
    }
}
