//! Fused siblings: the Linear modules a serving engine loads as ONE Linear (vLLM's
//! `QKVParallelLinear` / `MergedColumnParallelLinear`, TensorRT-LLM's `qkv_proj` /
//! `gate_up_proj`), which therefore must carry one per-tensor scale. Schemes with a per-tensor
//! scale (NVFP4's global scale and static input scale) share it across the family: each
//! member's statistic is replaced by the family's largest, as the reference tools do:
//!
//! - llm-compressor 0.14 (`observers/helpers.py` `FUSED_LAYER_NAMES` + `fuse_weight_observers`;
//!   `Observer.get_global_scale` takes the absmax over the group; older releases:
//!   `modifiers/utils/helpers.py::update_fused_layer_weight_global_scales`, the min of the
//!   global scales, the same value): `(gate_proj, up_proj)`, `(q_proj, k_proj, v_proj)`,
//!   `(q_a_proj, kv_a_proj_with_mqa)`, `(w1, w3)`; a group that is only partly quantized
//!   is an error ("need all fused layers to have same quantization").
//! - nvidia-modelopt 0.47 (`export/unified_export_hf.py::_fuse_shared_input_modules` +
//!   `export/quant_utils.py::preprocess_linear_fusion`): every group of quantized Linears fed
//!   the same input gets the max of their weight amax and of their input amax; a group whose
//!   members are quantized differently fails ("Modules have different quantization formats").
//!
//! kquant finds the families by name (a checkpoint has no forward pass): under one parent,
//! `q_proj`+`k_proj`+`v_proj`; `q_a_proj` (or, without it, `q_proj`) + `kv_a_proj_with_mqa`
//! (MLA, as llm-compressor's `get_fused_attention_linears`); `gate_proj`+`up_proj`;
//! `w1`+`w3`. A family needs all its members present.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::error::Result;
use crate::quant::input_amax::InputAmax;
use crate::quant::stats::Stats;

/// The fused families among `modules` (Linear module names): each a list of ≥ 2 members, in
/// the order above; a module is in at most one family.
pub fn families<'a>(modules: impl IntoIterator<Item = &'a str>) -> Vec<Vec<String>> {
    let mut by_parent: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for m in modules {
        let (parent, leaf) = m.rsplit_once('.').unwrap_or(("", m));
        by_parent.entry(parent).or_default().insert(leaf);
    }
    let mut out = Vec::new();
    for (parent, leaves) in by_parent {
        let has = |l: &str| leaves.contains(l);
        let mut groups: Vec<Vec<&str>> = Vec::new();
        if has("kv_a_proj_with_mqa") {
            if has("q_a_proj") {
                groups.push(vec!["q_a_proj", "kv_a_proj_with_mqa"]);
            } else if has("q_proj") && !has("k_proj") {
                groups.push(vec!["q_proj", "kv_a_proj_with_mqa"]);
            }
        }
        if has("q_proj") && has("k_proj") && has("v_proj") {
            groups.push(vec!["q_proj", "k_proj", "v_proj"]);
        }
        if has("gate_proj") && has("up_proj") {
            groups.push(vec!["gate_proj", "up_proj"]);
        }
        if has("w1") && has("w3") {
            groups.push(vec!["w1", "w3"]);
        }
        for g in groups {
            out.push(
                g.iter()
                    .map(|l| {
                        if parent.is_empty() {
                            l.to_string()
                        } else {
                            format!("{parent}.{l}")
                        }
                    })
                    .collect(),
            );
        }
    }
    out
}

/// The first family that is only partly in `quantized`, as (quantized members, the others).
pub fn partial<'a>(
    families: &'a [Vec<String>],
    quantized: &HashSet<&str>,
) -> Option<(Vec<&'a str>, Vec<&'a str>)> {
    families.iter().find_map(|f| {
        let (q, rest): (Vec<&str>, Vec<&str>) = f
            .iter()
            .map(String::as_str)
            .partition(|m| quantized.contains(m));
        (!q.is_empty() && !rest.is_empty()).then_some((q, rest))
    })
}

/// Each module's value replaced by the largest over its family (members missing from
/// `values` are skipped; modules in no family keep theirs).
pub fn share_max(
    values: &BTreeMap<String, f32>,
    families: &[Vec<String>],
) -> BTreeMap<String, f32> {
    let mut out = values.clone();
    for f in families {
        let top = f
            .iter()
            .filter_map(|m| values.get(m))
            .fold(None, |a: Option<f32>, &v| Some(a.map_or(v, |a| a.max(v))));
        if let Some(top) = top {
            for m in f {
                if let Some(v) = out.get_mut(m) {
                    *v = top;
                }
            }
        }
    }
    out
}

/// The per-tensor amax a fused-scale target encodes with, each already the largest over the
/// module's family: the weight's, and (W4A4) the input's from `--input-amax`.
#[derive(Debug, Clone, Default)]
pub struct SharedAmax {
    /// Empty on `--dry-run`.
    pub weight: BTreeMap<String, f32>,
    pub input: Option<BTreeMap<String, f32>>,
}

impl SharedAmax {
    /// Share `p`'s weight amax, and `input`'s amax of every quantized module (an error names the
    /// modules the file lacks), across the families.
    pub fn compute(p: &Stats, input: Option<&InputAmax>) -> Result<SharedAmax> {
        let input = match input {
            Some(i) => Some(share_max(&i.for_modules(&p.quantized)?, &p.families)),
            None => None,
        };
        let weight = p
            .weight_amax
            .as_ref()
            .map(|w| share_max(w, &p.families))
            .unwrap_or_default();
        Ok(SharedAmax { weight, input })
    }

    /// The shared weight amax of `module` (the pre-pass read every quantized one; nothing is
    /// encoded on `--dry-run`, where it read none).
    pub fn weight(&self, module: &str) -> f32 {
        *self
            .weight
            .get(module)
            .unwrap_or_else(|| panic!("{module}: no weight amax (not a quantized module)"))
    }

    /// The shared input amax of `module`, for a W4A4 target.
    pub fn input(&self, module: &str) -> Option<f32> {
        self.input.as_ref().map(|m| {
            *m.get(module)
                .unwrap_or_else(|| panic!("{module}: no input amax (not a quantized module)"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_by_name() {
        let mods = [
            "model.layers.0.self_attn.q_proj",
            "model.layers.0.self_attn.k_proj",
            "model.layers.0.self_attn.v_proj",
            "model.layers.0.self_attn.o_proj",
            "model.layers.0.mlp.gate_proj",
            "model.layers.0.mlp.up_proj",
            "model.layers.0.mlp.down_proj",
            "layers.1.self_attn.q_a_proj",
            "layers.1.self_attn.q_b_proj",
            "layers.1.self_attn.kv_a_proj_with_mqa",
            "layers.1.self_attn.kv_b_proj",
            "layers.2.self_attn.q_proj",
            "layers.2.self_attn.kv_a_proj_with_mqa",
            "layers.3.experts.0.w1",
            "layers.3.experts.0.w2",
            "layers.3.experts.0.w3",
            "midlayer.self_attn.q_proj",
            "midlayer.self_attn.k_proj",
            "fc",
        ];
        let f = families(mods);
        assert_eq!(
            f,
            vec![
                vec![
                    "layers.1.self_attn.q_a_proj",
                    "layers.1.self_attn.kv_a_proj_with_mqa"
                ],
                vec![
                    "layers.2.self_attn.q_proj",
                    "layers.2.self_attn.kv_a_proj_with_mqa"
                ],
                vec!["layers.3.experts.0.w1", "layers.3.experts.0.w3"],
                vec!["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"],
                vec![
                    "model.layers.0.self_attn.q_proj",
                    "model.layers.0.self_attn.k_proj",
                    "model.layers.0.self_attn.v_proj"
                ],
            ]
        );
        // q/k without v is no family.
        assert!(families(["a.q_proj", "a.k_proj"]).is_empty());
    }

    #[test]
    fn partial_and_share() {
        let f = families([
            "a.q_proj",
            "a.k_proj",
            "a.v_proj",
            "a.gate_proj",
            "a.up_proj",
        ]);
        let all: HashSet<&str> = [
            "a.q_proj",
            "a.k_proj",
            "a.v_proj",
            "a.gate_proj",
            "a.up_proj",
        ]
        .into_iter()
        .collect();
        assert!(partial(&f, &all).is_none());
        let some: HashSet<&str> = ["a.q_proj", "a.v_proj"].into_iter().collect();
        assert_eq!(
            partial(&f, &some),
            Some((vec!["a.q_proj", "a.v_proj"], vec!["a.k_proj"]))
        );
        // gate/up both left out is fine.
        let qkv: HashSet<&str> = ["a.q_proj", "a.k_proj", "a.v_proj"].into_iter().collect();
        assert!(partial(&f, &qkv).is_none());

        let v: BTreeMap<String, f32> = [
            ("a.q_proj", 1.0),
            ("a.k_proj", 3.0),
            ("a.v_proj", 2.0),
            ("a.gate_proj", 0.5),
            ("a.up_proj", 0.25),
            ("a.o_proj", 9.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let s = share_max(&v, &f);
        assert_eq!(s["a.q_proj"], 3.0);
        assert_eq!(s["a.k_proj"], 3.0);
        assert_eq!(s["a.v_proj"], 3.0);
        assert_eq!(s["a.gate_proj"], 0.5);
        assert_eq!(s["a.up_proj"], 0.5);
        assert_eq!(s["a.o_proj"], 9.0);
    }
}
