//! The `kquant.sensitivity/1` document as types: what `run` fills, what `--json` serializes
//! and the table reads. The fields are in the order the document has its keys.

use std::path::PathBuf;

use serde::Serialize;
use serde_json::Value;

use super::Group;
use crate::quant::registry::Scheme;
use crate::quantize::calibrate::Method;

/// The `schema` of a sensitivity document.
pub const SCHEMA: &str = "kquant.sensitivity/1";

/// One quantized variant, measured against the original.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    /// Groups left unquantized (besides `--exclude`).
    pub excluded: Vec<String>,
    /// Modules quantized.
    pub quantized: usize,
    pub bytes_after: u64,
    pub accept_length: f64,
    pub delta: f64,
    pub ci95: [f64; 2],
    pub agreement: Option<f64>,
    pub agreement_per_depth: Vec<Option<f64>>,
    pub passed: bool,
}

/// A sensitivity run's document.
#[derive(Debug, Clone, Serialize)]
pub struct Doc {
    pub schema: &'static str,
    pub draft: String,
    pub scheme: Scheme,
    pub format: &'static str,
    pub method: Method,
    pub calibration: Option<PathBuf>,
    pub trace: String,
    pub samples: usize,
    pub steps: usize,
    pub exclude: Vec<String>,
    pub baseline_accept_length: f64,
    pub max_regression: f64,
    pub every_group: Measured,
    pub groups: Vec<GroupDoc>,
    pub pick: Option<Pick>,
}

/// One group quantized alone: the group's keys (`group`, `modules`, `patterns`,
/// `bytes_before`, `bytes_after`), then `measured`.
#[derive(Debug, Clone, Serialize)]
pub struct GroupDoc {
    #[serde(flatten)]
    pub group: Group,
    pub measured: Measured,
}

/// `--pick`: the exclusion sets tried and the one picked.
#[derive(Debug, Clone, Serialize)]
pub struct Pick {
    pub trials: Vec<Trial>,
    pub picked: Option<Measured>,
    /// The picked set as a `quantize --config` preset (the file `--write-preset` writes).
    pub preset: Option<Value>,
    pub command: Option<String>,
}

/// One exclusion set tried: its predicted ΔAL, its cost and its measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Trial {
    pub predicted: f64,
    pub cost_bytes: u64,
    pub measured: Measured,
}

impl Doc {
    /// The method as the document writes it (`rtn`, `search`, `gptq`, `searchgptq`).
    pub fn method_written(&self) -> String {
        match serde_json::to_value(self.method) {
            Ok(Value::String(s)) => s,
            _ => String::new(),
        }
    }
}
