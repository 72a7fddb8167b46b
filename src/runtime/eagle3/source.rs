//! What an EAGLE-3 attention variant's loader reads ([`Source`]): the draft layer's tensors, the
//! dimensions detection found and config.json, with the checks and the RoPE table they share.
//! Its own file so that `load` (which picks the variant) and the variants' loaders
//! (`llama_attn`, `mla_attn`) both depend on it and not on each other.

use std::path::Path;

use crate::checkpoint::{Config, Dims};
use crate::error::{Error, Result};
use crate::runtime::rope::Rope;
use crate::runtime::weights::Loader;

/// What an attention variant's loader reads: the draft layer's tensors (`layer`, under the
/// layer prefix), the dimensions detection found, and config.json.
pub(super) struct Source<'s, 'a, 'c> {
    pub layer: Loader<'a, 'c>,
    pub dims: &'s Dims,
    pub(super) dir: &'s Path,
    pub(super) cfg: Option<&'s Config>,
}

impl Source<'_, '_, '_> {
    pub fn err(&self, msg: String) -> Error {
        Error::source(self.dir, msg)
    }

    /// Dimension `key` of the draft, which it must have.
    pub fn need(&self, v: Option<u64>, key: &str) -> Result<usize> {
        match v {
            Some(0) => Err(self.err(format!("`{key}` is 0"))),
            Some(x) => Ok(x as usize),
            None => Err(self.err(format!("`{key}` unknown"))),
        }
    }

    pub fn num(&self, key: &str) -> Option<f64> {
        self.cfg.and_then(|c| c.get(key)).and_then(|v| v.as_f64())
    }

    /// The RoPE table over `dim` dims and the softmax multiplier ([`Rope::from_config`]) from
    /// `rope_theta` and `rope_scaling` (or transformers 5's `rope_parameters`).
    pub fn rope(&self, dim: usize) -> (Rope, f32) {
        let params = self.cfg.and_then(|c| c.get("rope_parameters"));
        let theta = self
            .num("rope_theta")
            .or_else(|| {
                params
                    .and_then(|r| r.get("rope_theta"))
                    .and_then(|v| v.as_f64())
            })
            .unwrap_or(10000.0);
        let scaling = self
            .cfg
            .and_then(|c| c.get("rope_scaling"))
            .filter(|v| !v.is_null())
            .or(params);
        Rope::from_config(dim, theta, scaling)
    }
}
