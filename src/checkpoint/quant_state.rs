//! Quantization state of a checkpoint: which tool's config is present (Quark,
//! compressed-tensors, ModelOpt) and which tensors are stored packed or low-precision.

use std::collections::BTreeMap;

use serde::Serialize;

use super::Checkpoint;
use crate::io::Dtype;

/// Suffixes of the tensors that quantization tools add next to (or instead of) `.weight`.
pub const QUANT_SUFFIXES: [&str; 8] = [
    "weight_packed",
    "weight_scale",
    "weight_scale_2",
    "weight_zero_point",
    "weight_shape",
    "weight_global_scale",
    "input_scale",
    "pre_quant_scale",
];

/// What kquant found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QuantState {
    /// `quantization_config.quant_method` (`quark`, `compressed-tensors`, `modelopt`, …).
    pub method: Option<String>,
    /// `hf_quant_config.json` (ModelOpt legacy) is present.
    pub hf_quant_config: bool,
    /// Modules (tensor name without the last component) with quantization tensors.
    pub quantized_modules: usize,
    /// dtype → number of `.weight`/`.weight_packed` tensors stored in a non-float type.
    pub packed_weights: BTreeMap<String, usize>,
    pub quantized: bool,
}

/// Inspect config and tensor names.
pub fn detect(ck: &Checkpoint) -> QuantState {
    let mut s = QuantState {
        method: ck
            .config
            .as_ref()
            .and_then(|c| c.root.get("quantization_config"))
            .and_then(|q| q.get("quant_method"))
            .and_then(|m| m.as_str())
            .map(String::from),
        hf_quant_config: ck.weights.dir.join("hf_quant_config.json").is_file(),
        ..QuantState::default()
    };
    let mut modules = std::collections::BTreeSet::new();
    for t in ck.weights.infos() {
        let (module, last) = t.name.rsplit_once('.').unwrap_or(("", &t.name));
        if QUANT_SUFFIXES.contains(&last) {
            modules.insert(module.to_string());
        }
        let low = matches!(
            t.dtype,
            Dtype::I32 | Dtype::U8 | Dtype::I8 | Dtype::F8_E4M3 | Dtype::F8_E5M2
        );
        if (last == "weight" || last == "weight_packed") && low && t.shape.len() == 2 {
            *s.packed_weights
                .entry(t.dtype.name().to_string())
                .or_default() += 1;
            modules.insert(module.to_string());
        }
    }
    s.quantized_modules = modules.len();
    if s.method.is_none() && s.hf_quant_config {
        s.method = Some("modelopt".into());
    }
    s.quantized = s.method.is_some() || s.quantized_modules > 0;
    s
}
