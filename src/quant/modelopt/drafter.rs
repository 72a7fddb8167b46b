//! ModelOpt's calibration-free drafter quantizer (`examples/speculative_decoding/scripts/
//! quantize_drafter.py`, Model-Optimizer PR #2027, run on nvidia-modelopt 0.47.0) and the layout
//! it writes: `FP8` (`FP8_DEFAULT_CFG`, kquant `fp8-pt`), FP8 E4M3 weights with one scale per
//! tensor and a static per-tensor input scale.
//!
//! The script wraps every 2-D `*.weight` in a throwaway `nn.Linear` named by its checkpoint key
//! (no modeling code, no fusion), `mtq.quantize`s that flat view with no forward pass, gives
//! every static `input_quantizer` the fixed amax 448 ([`FIXED_INPUT_AMAX`]: `input_scale` 1.0)
//! and exports with ModelOpt's own arithmetic (`export/quant_utils.py`):
//!
//! - `s_w = f32(amax(|w|)) / 448` (`get_scaling_factor`, `export_amax`: 0 → 448, floored at the
//!   dtype's smallest normal); `code = e4m3(f32(w) / s_w)` (`to_quantized_weight`; the F32 `[1]`
//!   scale promotes the division to F32);
//! - `s_x = amax_x / 448` in F32, `amax_x` the fixed 448 or, kquant's calibrated form, the
//!   module's `--input-amax`;
//! - `X.weight` F8_E4M3 `[out, in]`, `X.weight_scale` F32 `[1]`, `X.input_scale` F32 `[1]`.
//!
//! Layout ([`drafter_exclude_modules`], [`config`]): the script's exclusion list is
//! `get_quant_config`'s (the disabled Linear views, prefix-wildcard summarized and sorted), then
//! every unquantized `*.weight` key (norms included), sorted, each as itself and as `*NAME`, then
//! `*qkv_proj` / `*gate_up_proj` when every part appears in some entry; `hf_quant_config.json`
//! is `json.dumps(indent=2)` of `producer` + `quantization` (`quant_algo`, `kv_cache_quant_algo`,
//! `exclude_modules`), and `config.json`'s `quantization_config` is that `quantization` plus
//! `quant_method "modelopt"` and `ignore` (the same list).
//!
//! Facts: docs/quantize.md, "ModelOpt's drafter quantizer"; checked against the script itself
//! (tests/modelopt_drafter.rs runs it from the fixture venv).

use std::collections::{BTreeMap, BTreeSet};

use rayon::prelude::*;
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::io::writer::TensorSpec;
use crate::io::Dtype;
use crate::quant::codec::{Codec, ConfigFiles, Encoded};
use crate::quant::input_amax::InputAmax;
use crate::quant::math::rowwise::{encode_floats, Path};
use crate::quant::modelopt::{fp8_code, scale_from_amax, FP8_MAXBOUND, VERSION};
use crate::quant::stats::Stats;

/// `STATIC_ACT_AMAX` of `quantize_drafter.py`: the amax every static input quantizer gets
/// (`FP8_E4M3_MAX`, so the FP8 `input_scale` is 1.0).
pub const FIXED_INPUT_AMAX: f32 = 448.0;

/// What to do about quantized modules the `--input-amax` file lacks.
pub const MISSING_AMAX_HINT: &str = "add them (the module name is the weight's tensor name without `.weight`), --exclude them, or pass --fixed-input-amax instead of the file (ModelOpt's calibration-free amax 448: input_scale 1.0)";

/// ModelOpt's name of the algorithm.
pub const QUANT_ALGO: &str = "FP8";

/// One FP8 per-tensor module: its scale and `[rows, cols]` E4M3 codes.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Tensor {
    pub scale: f32,
    pub codes: Vec<u8>,
}

fn quantize_on(path: Path, w: &[f32], dtype: Dtype) -> Fp8Tensor {
    let amax = match path {
        Path::Reference => w.iter().fold(0f32, |m, x| m.max(x.abs())),
        Path::Parallel => w
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0f32, |m, x| m.max(x.abs())))
            .reduce(|| 0.0, f32::max),
    };
    let scale = scale_from_amax(amax, FP8_MAXBOUND, dtype);
    let codes = match path {
        Path::Reference => w.iter().map(|&x| fp8_code(x, scale)).collect(),
        Path::Parallel => w.par_iter().map(|&x| fp8_code(x, scale)).collect(),
    };
    Fp8Tensor { scale, codes }
}

crate::quant::math::rowwise::paths! {
    /// `w` is the whole weight, row-major.
    quantize_on: quantize_ref, quantize(w: &[f32], dtype: Dtype) -> Fp8Tensor
}

/// The `input_scale` of a module whose input amax is `amax` (kept in F32, as the script does).
pub fn input_scale(amax: f32) -> f32 {
    scale_from_amax(amax, FP8_MAXBOUND, Dtype::F32)
}

/// `FP8` in the drafter layout as a [`Codec`], with each quantized module's input amax.
pub struct Fp8PerTensor {
    input_amax: BTreeMap<String, f32>,
}

impl Fp8PerTensor {
    /// From the `--input-amax` file (or the fixed amax) and the modules the plan quantizes;
    /// refuses a module the file lacks.
    pub fn new(input: Option<&InputAmax>, stats: &Stats) -> Result<Fp8PerTensor> {
        let input = input.expect("fp8-pt has a static input scale: resolve requires its amax");
        // The shared refusal names NVFP4's weight-only scheme; fp8-pt's own way out is the
        // calibration-free fixed amax.
        let input_amax = input.for_modules(&stats.quantized).map_err(|e| match e {
            Error::Source { path, msg, .. } => Error::Source {
                path,
                msg,
                hint: Some(MISSING_AMAX_HINT.into()),
            },
            e => e,
        })?;
        Ok(Fp8PerTensor { input_amax })
    }
}

impl Codec for Fp8PerTensor {
    fn describe(&self) -> String {
        format!("ModelOpt {VERSION} {QUANT_ALGO} (quantize_drafter.py layout)")
    }
    fn specs(&self, module: &str, rows: usize, cols: usize, _dtype: Dtype) -> Vec<TensorSpec> {
        vec![
            TensorSpec::new(format!("{module}.weight"), Dtype::F8_E4M3, vec![rows, cols]),
            TensorSpec::new(format!("{module}.weight_scale"), Dtype::F32, vec![1]),
            TensorSpec::new(format!("{module}.input_scale"), Dtype::F32, vec![1]),
        ]
    }
    fn encode(&self, module: &str, w: &[f32], _rows: usize, _cols: usize, dtype: Dtype) -> Encoded {
        let q = quantize(w, dtype);
        // On `--dry-run` and in the table's tests no amax is known: the fixed one stands in.
        let amax = self
            .input_amax
            .get(module)
            .copied()
            .unwrap_or(FIXED_INPUT_AMAX);
        vec![
            (format!("{module}.weight"), q.codes),
            (
                format!("{module}.weight_scale"),
                encode_floats(&[q.scale], Dtype::F32),
            ),
            (
                format!("{module}.input_scale"),
                encode_floats(&[input_scale(amax)], Dtype::F32),
            ),
        ]
    }
    fn config(&self, exclude_modules: &[String]) -> ConfigFiles {
        ConfigFiles {
            quantization_config: config(exclude_modules),
            side_files: vec![(
                "hf_quant_config.json".into(),
                python_json_indent2(&hf_quant_config(exclude_modules)),
            )],
        }
    }
    fn lists_every_weight(&self) -> bool {
        true
    }
}

/// `hf_quant_config.json` as the script writes it (`get_quant_config` with its list replaced).
pub fn hf_quant_config(exclude_modules: &[String]) -> Value {
    json!({
        "producer": {"name": "modelopt", "version": VERSION},
        "quantization": {
            "quant_algo": QUANT_ALGO,
            "kv_cache_quant_algo": null,
            "exclude_modules": exclude_modules,
        },
    })
}

/// `config.json`'s `quantization_config`: the `quantization` object, `quant_method`, `ignore`.
pub fn config(exclude_modules: &[String]) -> Value {
    json!({
        "quant_algo": QUANT_ALGO,
        "kv_cache_quant_algo": null,
        "exclude_modules": exclude_modules,
        "quant_method": "modelopt",
        "ignore": exclude_modules,
    })
}

/// Python `json.dumps(..., indent=2)` bytes (no final newline; kquant's names are ASCII).
pub fn python_json_indent2(v: &Value) -> Vec<u8> {
    serde_json::to_vec_pretty(v).expect("JSON")
}

/// `_prefix_wildcard_summarize_exclude_modules` (ModelOpt 0.47 `export/quant_utils.py`): the
/// unquantized Linear views, summarized by prefix wildcards no quantized name matches.
pub fn summarize(unquantized: &[String], quantized: &[String]) -> BTreeSet<String> {
    let mut negative: BTreeSet<String> = BTreeSet::new();
    for q in quantized {
        negative.insert(q.clone());
        for (i, _) in q.char_indices().chain([(q.len(), ' ')]) {
            negative.insert(format!("{}*", &q[..i]));
        }
    }
    let mut res: BTreeSet<String> = BTreeSet::new();
    for layer in unquantized {
        let mut options: Vec<Vec<String>> = Vec::new();
        for (i, c) in layer.char_indices() {
            if c == '.' {
                options.push(vec![format!("{}*", &layer[..i])]);
                options.push(vec![layer[..i].to_string(), format!("{}.*", &layer[..i])]);
            }
        }
        options.push(vec![layer.clone()]);
        let mut candidate: Vec<String> = Vec::new();
        for w in options {
            if w.iter().any(|x| negative.contains(x)) {
                continue;
            }
            if w.iter().all(|x| res.contains(x)) {
                candidate.clear();
                break;
            }
            candidate = w;
            break;
        }
        if candidate.len() == 2 {
            // The pair [prefix, prefix.*]: only prefix.* is written.
            res.insert(candidate.pop().expect("two"));
        } else {
            res.extend(candidate);
        }
    }
    res
}

/// The script's `exclude_modules` (and `ignore`): `weights` every source tensor's name and rank,
/// `quantized` the modules written quantized.
pub fn drafter_exclude_modules(weights: &[(String, usize)], quantized: &[String]) -> Vec<String> {
    let qset: BTreeSet<&str> = quantized.iter().map(String::as_str).collect();
    let module = |k: &str| k.strip_suffix(".weight").map(str::to_string);
    let disabled: Vec<String> = weights
        .iter()
        .filter(|(_, rank)| *rank == 2)
        .filter_map(|(k, _)| module(k))
        .filter(|m| !qset.contains(m.as_str()))
        .collect();
    let mut out: Vec<String> = summarize(&disabled, quantized).into_iter().collect();
    let mut unquantized: Vec<String> = weights
        .iter()
        .filter_map(|(k, _)| module(k))
        .filter(|m| !qset.contains(m.as_str()))
        .collect();
    unquantized.sort();
    for name in unquantized {
        let wild = format!("*{name}");
        if !out.contains(&name) {
            out.push(name);
        }
        if !out.contains(&wild) {
            out.push(wild);
        }
    }
    for (fused, parts) in [
        ("qkv_proj", &["q_proj", "k_proj", "v_proj"][..]),
        ("gate_up_proj", &["gate_proj", "up_proj"][..]),
    ] {
        let alias = format!("*{fused}");
        if parts.iter().all(|p| out.iter().any(|n| n.contains(p))) && !out.contains(&alias) {
            out.push(alias);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::dtype::f8_e4m3_to_f32;
    use crate::quant::math::rowwise::test_data_narrow as data;

    #[test]
    fn per_tensor_scale_and_codes() {
        let w = [448.0f32 * 0.01, -0.01, 0.0, 0.02];
        let q = quantize_ref(&w, Dtype::F32);
        assert_eq!(q.scale, 4.48 / 448.0);
        assert_eq!(q.codes[0], crate::quant::math::fp8::e4m3_from_f32(448.0));
        assert_eq!(f8_e4m3_to_f32(q.codes[2]), 0.0);
        // An all-zero tensor has scale 1 (export_amax: amax 0 → maxbound).
        assert_eq!(quantize_ref(&[0.0; 8], Dtype::BF16).scale, 1.0);
        assert_eq!(input_scale(FIXED_INPUT_AMAX), 1.0);
        assert_eq!(input_scale(0.0), 1.0);
        for (rows, cols) in [(7, 300), (64, 1024)] {
            let w = data(rows, cols, Dtype::BF16);
            assert_eq!(quantize(&w, Dtype::BF16), quantize_ref(&w, Dtype::BF16));
        }
    }

    /// What the script wrote for the tiny EAGLE-3 draft (fc and the decoder layer quantized).
    #[test]
    fn exclude_list_of_the_tiny_eagle3() {
        let w = |n: &str, r: usize| (n.to_string(), r);
        let weights = [
            w("d2t", 1),
            w("fc.weight", 2),
            w("lm_head.weight", 2),
            w("midlayer.hidden_norm.weight", 1),
            w("midlayer.self_attn.q_proj.weight", 2),
            w("norm.weight", 1),
        ];
        let q = vec!["fc".to_string(), "midlayer.self_attn.q_proj".to_string()];
        assert_eq!(
            drafter_exclude_modules(&weights, &q),
            [
                "lm_head",
                "*lm_head",
                "midlayer.hidden_norm",
                "*midlayer.hidden_norm",
                "norm",
                "*norm"
            ]
        );
        // A whole unquantized dotted subtree becomes one prefix wildcard; q/k/v excluded get the
        // fused alias.
        let weights = [
            w("model.embed_tokens.weight", 2),
            w("model.layers.0.self_attn.q_proj.weight", 2),
            w("model.layers.0.self_attn.k_proj.weight", 2),
            w("model.layers.0.self_attn.v_proj.weight", 2),
            w("mtp.proj.weight", 2),
            w("model.layers.0.mlp.down_proj.weight", 2),
        ];
        let q = vec!["model.layers.0.mlp.down_proj".to_string()];
        let got = drafter_exclude_modules(&weights, &q);
        assert_eq!(got[0], "model.embed_tokens");
        assert!(got.contains(&"mtp*".to_string()), "{got:?}");
        assert!(got.contains(&"model.layers.0.self_attn.q_proj".to_string()));
        assert_eq!(got.last().unwrap(), "*qkv_proj");
    }
}
