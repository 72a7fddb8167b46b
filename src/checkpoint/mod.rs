//! What a checkpoint is: its config, its tensors, and what kquant detects from them (family,
//! dialect, dimensions, aux-layer ids with their convention, quantization state). Which
//! engines load it is `crate::engines`. DSpark and DFlash2 drafts are described in [`block`].

pub mod block;
pub mod config;
pub mod detect;
pub mod quant_state;

pub use config::Config;
pub use detect::{AuxConvention, AuxLayers, Detection, Dialect, Dims, Family, TargetKind};

use crate::error::Result;
use crate::io::source::{self, Weights};

/// An opened checkpoint: weights plus parsed config.
pub struct Checkpoint {
    pub weights: Weights,
    pub config: Option<Config>,
}

impl Checkpoint {
    /// Open a directory, a `.safetensors` file, or a hub id. Only headers are read.
    pub fn open(spec: &str) -> Result<Checkpoint> {
        let weights = source::open(spec)?;
        let config = weights
            .config_path
            .as_deref()
            .map(Config::read)
            .transpose()?;
        Ok(Checkpoint { weights, config })
    }
}

/// Tensors, parameters and bytes of one dtype (or of the whole checkpoint).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    pub tensors: u64,
    pub params: u64,
    pub bytes: u64,
}

impl Checkpoint {
    /// The totals per dtype name (in name order) and over every tensor.
    pub fn totals(&self) -> (std::collections::BTreeMap<String, Totals>, Totals) {
        let mut by: std::collections::BTreeMap<String, Totals> = Default::default();
        let mut all = Totals::default();
        for t in self.weights.infos() {
            let e = by.entry(t.dtype.name().into()).or_default();
            for x in [e, &mut all] {
                x.tensors += 1;
                x.params += t.numel();
                x.bytes += t.nbytes();
            }
        }
        (by, all)
    }
}
