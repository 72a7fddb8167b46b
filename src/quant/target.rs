//! The one trait every output (scheme × format) implements: which tensors a quantized module
//! becomes, how they are computed (each format with its own recipe), and the config fragment.
//! `cli::quantize` drives any `Target`; `quant::registry` builds them.

use serde_json::Value;

use super::fused::Prepass;
use crate::error::Result;
use crate::io::writer::TensorSpec;
use crate::io::Dtype;

/// How the config's list of unquantized modules is composed (each tool does it differently).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExcludeStyle {
    /// Every module matched by an exclude pattern (Linear or not) plus unquantized Linear
    /// candidates, in file order (Quark model path; ModelOpt, whose target sorts them).
    MatchedModules,
    /// Unquantized Linear candidates, sorted (Quark file-to-file).
    SortedCandidates,
    /// Unquantized Linear candidates, in file order (compressed-tensors `ignore`).
    Candidates,
}

/// The encoded tensors of one module, `(name, bytes)` in [`Target::specs`] order.
pub type Encoded = Vec<(String, Vec<u8>)>;

/// What a fused encoder gives: the tensors, or the flat index of the first non-finite weight.
pub type RawEncoded = std::result::Result<Encoded, usize>;

/// One output scheme in one file format.
pub trait Target: Send + Sync {
    /// For messages: `"Quark Model layout"`, `"compressed-tensors 0.20.0 pack-quantized"`, ….
    fn describe(&self) -> String;
    /// Group size along the input dimension (every quantized tensor's input dimension must be a
    /// multiple of it); `None` for per-channel or per-tensor schemes.
    fn group(&self) -> Option<usize> {
        None
    }
    /// Why a `[rows, cols]` weight cannot be written in this target (the reference tool refuses
    /// it or no engine can load it), or `None`. The default checks the group size.
    fn refuse_shape(&self, rows: usize, cols: usize) -> Option<String> {
        let _ = rows;
        match self.group() {
            Some(g) if cols % g != 0 => Some(format!(
                "input dimension {cols} is not a multiple of the group size {g}"
            )),
            _ => None,
        }
    }
    /// The tensors a quantized `module` (`[rows, cols]` weight of `dtype`) is written as.
    fn specs(&self, module: &str, rows: usize, cols: usize, dtype: Dtype) -> Vec<TensorSpec>;
    /// Quantize `w` (row-major f32 of the stored weight) and encode every tensor of `specs`.
    fn encode(
        &self,
        module: &str,
        w: &[f32],
        rows: usize,
        cols: usize,
        dtype: Dtype,
    ) -> Vec<(String, Vec<u8>)>;
    /// [`encode`](Self::encode) straight from the stored weight (`raw`: `[rows, cols]` of
    /// `dtype`), row by row, without the matrix-sized f32 copy: the same bytes, for a target
    /// with such a fused path (`None`: the driver converts the weight and calls `encode`).
    /// `Err(i)`: the flat index of the first non-finite weight.
    fn encode_raw(
        &self,
        module: &str,
        raw: &[u8],
        rows: usize,
        cols: usize,
        dtype: Dtype,
    ) -> Option<RawEncoded> {
        let _ = (module, raw, rows, cols, dtype);
        None
    }
    /// The `quantization_config` value, with `exclude` as the unquantized-module list.
    fn config(&self, exclude: &[String]) -> Value;
    /// The key of that list in the config (`exclude`, `ignore`, `exclude_modules`).
    fn exclude_key(&self) -> &'static str {
        "exclude"
    }
    fn exclude_style(&self) -> ExcludeStyle;
    /// What to use instead, printed after the warning `kquant quantize` gives when no engine
    /// loads the result (that fact comes from `crate::engines::quantized`).
    fn advice(&self) -> Option<String> {
        None
    }
    /// Extra files written beside `config.json` (e.g. ModelOpt's `hf_quant_config.json`).
    fn side_files(&self, _exclude: &[String]) -> Vec<(String, Vec<u8>)> {
        Vec::new()
    }
    /// Whether this target keeps a per-tensor scale that fused siblings (q/k/v, gate/up, …;
    /// see [`super::fused`]) must share. The driver then refuses a family that is only partly
    /// quantized and runs [`Target::prepare`] before encoding anything.
    fn shares_fused_scales(&self) -> bool {
        false
    }
    /// The sibling-aware pre-pass: the quantized modules, their fused families and (except on
    /// `--dry-run`) each module's own weight amax. A target that shares scales computes them
    /// here; it may refuse (e.g. a module its `--input-amax` file lacks).
    fn prepare(&mut self, _prepass: &Prepass) -> Result<()> {
        Ok(())
    }
}
