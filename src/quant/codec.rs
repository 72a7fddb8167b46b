//! The per-module codec: which tensors one quantized Linear becomes, how they are computed
//! (each format with its own recipe, the reference beside the fast path) and the
//! `quantization_config` the result carries. One codec per (scheme, format) pair, built by
//! [`crate::quant::registry`] with everything it needs up front (options, and the [`crate::quant::stats`] a
//! scheme measures before it encodes); the per-checkpoint facts (which modules the config lists,
//! under which key) are the format's ([`crate::quant::format`]). `crate::quantize` drives any codec.

use serde_json::Value;

use crate::io::writer::TensorSpec;
use crate::io::Dtype;
use crate::quant::math::int4::Int4;
use crate::quant::math::rowwise;

/// The encoded tensors of one module, `(name, bytes)` in [`Codec::specs`] order.
pub type Encoded = Vec<(String, Vec<u8>)>;

/// What encoding a stored weight gives: the tensors, or the flat index of the first
/// non-finite weight.
pub type RawEncoded = std::result::Result<Encoded, usize>;

/// One stored `[rows, cols]` weight of `dtype` (`raw`: its little-endian bytes, mapped), and
/// the hook that drops its mapped pages once they are no longer needed.
pub struct StoredWeight<'a> {
    pub raw: &'a [u8],
    pub dtype: Dtype,
    pub rows: usize,
    pub cols: usize,
    pub release: &'a (dyn Fn() + Sync),
}

impl StoredWeight<'_> {
    /// The weight as f32 in `scratch` (one buffer reused for every tensor, converted in
    /// parallel), the mapped pages released as soon as they are converted; `Err(i)`: the flat
    /// index of the first non-finite weight.
    pub fn to_f32<'s>(&self, scratch: &'s mut Vec<f32>) -> std::result::Result<&'s [f32], usize> {
        crate::io::dtype::to_f32_par_into(self.dtype, self.raw, scratch);
        (self.release)();
        first_non_finite_par(scratch).map_or(Ok(&scratch[..]), Err)
    }
}

/// The first non-finite element of `w`: in parallel chunks, each with
/// [`rowwise::first_non_finite`]'s vectorised test.
pub fn first_non_finite_par(w: &[f32]) -> Option<usize> {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    w.par_chunks(CHUNK)
        .enumerate()
        .find_map_first(|(k, c)| rowwise::first_non_finite(c).map(|j| k * CHUNK + j))
}

/// The config a quantized checkpoint carries: `config.json`'s `quantization_config`, and the
/// files the reference tool writes beside it (ModelOpt's `hf_quant_config.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigFiles {
    pub quantization_config: Value,
    pub side_files: Vec<(String, Vec<u8>)>,
}

impl ConfigFiles {
    /// Just a `quantization_config`.
    pub fn config(quantization_config: Value) -> ConfigFiles {
        ConfigFiles {
            quantization_config,
            side_files: Vec::new(),
        }
    }
}

/// One scheme in one format, for every module of one checkpoint.
pub trait Codec: Send + Sync {
    /// For messages: `"Quark Model layout"`, `"compressed-tensors 0.20.0 pack-quantized"`, ….
    fn describe(&self) -> String;
    /// The tensors a quantized `module` (`[rows, cols]` weight of `dtype`) is written as.
    fn specs(&self, module: &str, rows: usize, cols: usize, dtype: Dtype) -> Vec<TensorSpec>;
    /// Quantize `w` (row-major f32 of the stored weight) and encode every tensor of
    /// [`specs`](Self::specs): the format's recipe over f32, the plain path.
    fn encode(&self, module: &str, w: &[f32], rows: usize, cols: usize, dtype: Dtype) -> Encoded;
    /// [`encode`](Self::encode) of a stored weight: what the driver calls. A codec with a fused
    /// path (row by row from the mapped bytes, no matrix-sized f32 copy) overrides it with the
    /// same bytes (tested for every codec); the default converts into `scratch` and encodes.
    fn encode_stored(
        &self,
        module: &str,
        w: &StoredWeight<'_>,
        scratch: &mut Vec<f32>,
    ) -> RawEncoded {
        let f = w.to_f32(scratch)?;
        Ok(self.encode(module, f, w.rows, w.cols, w.dtype))
    }
    /// The config files, with `unquantized` the module list exactly as the format writes it
    /// ([`crate::quant::format::Format::written_list`]).
    fn config(&self, unquantized: &[String]) -> ConfigFiles;
    /// What to use instead, printed after the warning `kquant quantize` gives when no engine
    /// loads the result (that fact comes from `crate::engines::quantized`).
    fn advice(&self) -> Option<String> {
        None
    }
    /// The integer grid of a codec that writes symmetric integer codes under per-(row, group)
    /// scales, for a calibrated method (GPTQ) to choose other codes under the format's own
    /// scales; `None` for the others (FP8, NVFP4, asymmetric UINT4, two-stage `int4_fp8`).
    fn int_grid(&self) -> Option<&dyn IntGrid> {
        None
    }
    /// The unquantized list [`config`](Self::config) gets is not the format's
    /// (`Format::written_list`) but ModelOpt's drafter quantizer's: every unquantized `*.weight`
    /// key, norms included ([`crate::quant::modelopt::drafter::drafter_exclude_modules`]).
    fn lists_every_weight(&self) -> bool {
        false
    }
}

/// What a calibrated method needs of a format that writes symmetric integer codes under
/// per-(row, group) scales: the format's own round-to-nearest (its scales are kept: only the
/// codes change), its code range and scale dtype, and how it writes codes and scales. For every
/// implementation `write(rtn(w))` is byte for byte what [`Codec::encode`] writes (tested in the
/// registry over every scheme × format that has one).
pub trait IntGrid: Sync {
    /// Group size along the input for a `cols`-wide weight (`cols`: per channel).
    fn group(&self, cols: usize) -> usize;
    /// The codes the format writes: `qmin..=qmax`.
    fn range(&self) -> (i8, i8);
    /// The dtype the format stores scales in for a `model`-dtype weight.
    fn scale_dtype(&self, model: Dtype) -> Dtype;
    /// The format's code for weight `w` under scale `s` (its rounding and clamp).
    fn code(&self, w: f32, s: f32, model: Dtype) -> i8;
    /// Round to nearest: the format's scales and codes for `w` `[rows, cols]` (each code is
    /// [`IntGrid::code`] of its weight under its scale).
    fn rtn(&self, w: &[f32], rows: usize, cols: usize, model: Dtype) -> Int4;
    /// The format's tensors (those of [`Codec::specs`]) for codes and scales `q`.
    fn write(&self, module: &str, q: &Int4, model: Dtype) -> Encoded;
}
