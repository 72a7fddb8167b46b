//! Statistics a scheme measures over the checkpoint before it encodes anything, handed to its
//! codec at construction ([`crate::quant::registry::Choice::build`]), so that no codec exists without
//! them. Today that is NVFP4's per-tensor weight amax, shared by fused siblings
//! ([`crate::quant::fused`]); the scheme table says which schemes need what ([`Needs`]).
//! Calibrated methods (`--method search`, GPTQ) are not a scheme's statistics: they measure the
//! draft's inputs over a trace and choose codes and scales on the format's grid before the
//! writer runs (`crate::quantize::calibrate`).

use std::collections::BTreeMap;

/// What a scheme needs measured before it encodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Needs {
    /// Nothing: each module is encoded from its own weight alone.
    Nothing,
    /// The list of modules the plan quantizes (no weight is read): a static input scale per
    /// module, from the `--input-amax` file.
    Modules,
    /// Each quantized module's weight amax and the fused families, to share one per-tensor
    /// scale across fused siblings (the driver also refuses a partly quantized family).
    FusedWeightAmax,
}

/// The pre-pass's measurements.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// The modules that will be quantized, in file order.
    pub quantized: Vec<String>,
    /// Their fused families ([`crate::quant::fused::families`] of the quantized modules).
    pub families: Vec<Vec<String>>,
    /// Each quantized module's own weight amax (`max |w|`, exact); `None` on `--dry-run`,
    /// where nothing is read and the codec only validates.
    pub weight_amax: Option<BTreeMap<String, f32>>,
}
