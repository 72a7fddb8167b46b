//! What a checkpoint is: its config, its tensors, and what kquant detects from them (family,
//! dialect, dimensions, aux-layer ids with their convention, quantization state). Which
//! engines load it is `crate::engines`.

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

    /// Run detection (ambiguous evidence is an error).
    pub fn detect(&self) -> Result<Detection> {
        detect::detect(self)
    }
}
