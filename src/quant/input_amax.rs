//! `--input-amax FILE`: the calibrated activation range of each Linear's input, which a W4A4
//! scheme (`nvfp4`) turns into its static per-tensor input scale. kquant sees no activations,
//! so it never invents one; the file comes from a calibration run (a later `kquant calibrate`,
//! or the reference tool's own calibration, as the goldens' `input_amax.json`).
//!
//! The file is JSON, either `{"schema": "kquant.input-amax/1", "amax": {MODULE: AMAX, …}}` or
//! the bare `{MODULE: AMAX, …}` map. MODULE is the checkpoint's module name (the weight's tensor
//! name without `.weight`); AMAX is `max |x|` over the calibration inputs of that module, a
//! finite number ≥ 0. Modules that are not quantized may be listed; every quantized module must
//! be.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};

/// The schema name of the wrapped form.
pub const SCHEMA: &str = "kquant.input-amax/1";

/// How an existing `calibrate -o` file is recognised as kquant's (and so may be replaced).
pub const FILE_KIND: crate::io::output::Kind = crate::io::output::Kind::File {
    what: "input-amax file",
    flag: "-o",
    is_ours: |b| crate::io::output::is_json_with_schema(b, SCHEMA),
};

/// A loaded `--input-amax` file.
#[derive(Debug, Clone, PartialEq)]
pub struct InputAmax {
    pub path: PathBuf,
    /// Module → amax, as f32 (the tools keep amax in F32 or the model dtype).
    pub amax: BTreeMap<String, f32>,
    /// `--fixed-input-amax`: this amax for every module the map lacks (ModelOpt's
    /// calibration-free drafter quantizer gives every static input quantizer 448).
    pub fixed: Option<f32>,
}

fn bad(path: &Path, msg: String) -> Error {
    Error::Source {
        path: path.to_path_buf(),
        msg,
        hint: Some(format!(
            "write `{{\"schema\": \"{SCHEMA}\", \"amax\": {{\"model.layers.0.self_attn.q_proj\": 3.89, …}}}}`: one finite amax ≥ 0 per quantized module (docs/quantize.md, NVFP4)"
        )),
    }
}

impl InputAmax {
    /// Read and check a file.
    pub fn load(path: &Path) -> Result<InputAmax> {
        let bytes =
            crate::io::text::read_regular(path, crate::io::text::MAX_CONFIG, "input-amax file")?;
        let v: Value =
            serde_json::from_slice(&bytes).map_err(|e| bad(path, format!("is not JSON: {e}")))?;
        InputAmax::from_json(path, &v)
    }

    /// Check a parsed document (`path` names it in errors).
    pub fn from_json(path: &Path, v: &Value) -> Result<InputAmax> {
        let map = match v {
            Value::Object(o) if o.contains_key("schema") => {
                if o["schema"] != SCHEMA {
                    return Err(bad(
                        path,
                        format!("has schema {}, not `{SCHEMA}`", o["schema"]),
                    ));
                }
                o.get("amax")
                    .and_then(Value::as_object)
                    .ok_or_else(|| bad(path, "has no `amax` object of module → amax".into()))?
            }
            Value::Object(o) => o,
            _ => return Err(bad(path, "is not a JSON object".into())),
        };
        let mut amax = BTreeMap::new();
        for (k, x) in map {
            match x.as_f64() {
                Some(f) if f.is_finite() && f >= 0.0 && (f as f32).is_finite() => {
                    amax.insert(k.clone(), f as f32);
                }
                _ => return Err(bad(path, format!("`{k}`: {x} is not a finite amax ≥ 0"))),
            }
        }
        Ok(InputAmax {
            path: path.to_path_buf(),
            amax,
            fixed: None,
        })
    }

    /// Every module's input amax is `amax` (`--fixed-input-amax`; no file).
    pub fn fixed(amax: f32) -> InputAmax {
        InputAmax {
            path: "--fixed-input-amax".into(),
            amax: BTreeMap::new(),
            fixed: Some(amax),
        }
    }

    /// The amax of every module in `modules`, or an error naming the ones the file lacks.
    pub fn for_modules(&self, modules: &[String]) -> Result<BTreeMap<String, f32>> {
        if let Some(a) = self.fixed {
            return Ok(modules.iter().map(|m| (m.clone(), a)).collect());
        }
        let missing: Vec<&str> = modules
            .iter()
            .filter(|m| !self.amax.contains_key(*m))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            let shown: Vec<String> = missing.iter().take(5).map(|m| format!("`{m}`")).collect();
            return Err(Error::Source {
                path: self.path.clone(),
                msg: format!(
                    "has no input amax for {} quantized module(s): {}{}",
                    missing.len(),
                    shown.join(", "),
                    if missing.len() > 5 { ", …" } else { "" }
                ),
                hint: Some("add them (the module name is the weight's tensor name without `.weight`), --exclude them, or use --scheme nvfp4-a16 (weight-only: no input scale)".into()),
            });
        }
        Ok(modules.iter().map(|m| (m.clone(), self.amax[m])).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn both_forms_and_refusals() {
        let p = Path::new("x.json");
        let a =
            InputAmax::from_json(p, &json!({"schema": SCHEMA, "amax": {"a.q_proj": 3.5}})).unwrap();
        assert_eq!(a.amax["a.q_proj"], 3.5);
        let b = InputAmax::from_json(p, &json!({"a.q_proj": 3.5, "b": 0})).unwrap();
        assert_eq!(b.amax["b"], 0.0);
        for bad in [
            json!({"a": -1.0}),
            json!({"a": "3"}),
            json!({"a": 1e300}),
            json!([1, 2]),
            json!({"schema": "other/1", "amax": {}}),
            json!({"schema": SCHEMA}),
        ] {
            assert!(InputAmax::from_json(p, &bad).is_err(), "{bad}");
        }
        let got = b
            .for_modules(&["a.q_proj".to_string(), "b".to_string()])
            .unwrap();
        assert_eq!(got.len(), 2);
        let f = InputAmax::fixed(448.0).for_modules(&["a".into()]).unwrap();
        assert_eq!(f["a"], 448.0);
        let e = b.for_modules(&["a.k_proj".to_string()]).unwrap_err();
        assert!(e.to_string().contains("`a.k_proj`"), "{e}");
        assert!(e.hint().unwrap().contains("nvfp4-a16"));
    }
}
