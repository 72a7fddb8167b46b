//! Reading a model's weights by name under a prefix, the one loader of the EAGLE-3, DFlash and
//! DeepSeek-V3 runtimes (in the style of candle's `VarBuilder`: `vb.pp("layers.0").get(...)`).
//! Each tensor is checked to exist with the shape the config implies (the error names the
//! tensor), read as f32 through `quant::decode::Logical` (any dtype, and any quantized layout
//! kquant writes, dequantized), and its mapped pages are released once converted, so that loading
//! a multi-gigabyte model peaks near its f32 weights rather than those plus the whole mapped file.
//! A linear can instead go through a draft's [`LinearSet`] hook ([`Loader::linear`]).

use std::path::Path;

use super::linears::{Linear, LinearSet};
use crate::error::{Error, Result};
use crate::quant::decode::Logical;

/// The tensors of one checkpoint under a name prefix.
#[derive(Clone)]
pub struct Loader<'a, 'c> {
    lg: &'a Logical<'c>,
    /// Empty, or ends with `.`.
    prefix: String,
    /// What the checkpoint is, as a missing tensor's error says it (`draft`, `DFlash draft`,
    /// `target`).
    owner: &'static str,
    linears: Option<&'a LinearSet>,
}

impl<'a, 'c> Loader<'a, 'c> {
    /// The top-level tensors of `lg`; `owner` names the model in the error for a missing tensor
    /// (`"{owner} has no tensor `NAME`"`).
    pub fn new(lg: &'a Logical<'c>, owner: &'static str) -> Self {
        Loader {
            lg,
            prefix: String::new(),
            owner,
            linears: None,
        }
    }

    /// The same loader, with its linears ([`Loader::linear`]) loaded through `set`.
    pub fn with_linears(self, set: &'a LinearSet) -> Self {
        Loader {
            linears: Some(set),
            ..self
        }
    }

    /// The loader for the tensors under `name.` (candle's `pp`, "push prefix"):
    /// `vb.pp("layers.0").get("input_layernorm.weight", …)` reads `layers.0.input_layernorm.weight`.
    pub fn pp(&self, name: impl std::fmt::Display) -> Self {
        Loader {
            prefix: format!("{}{name}.", self.prefix),
            ..self.clone()
        }
    }

    /// The full name of `name` under this loader's prefix.
    pub fn path(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// The checkpoint's directory (what the errors name).
    pub fn dir(&self) -> &Path {
        &self.lg.ck.weights.dir
    }

    /// Whether tensor `name` exists.
    pub fn has(&self, name: &str) -> bool {
        self.shape(name).is_some()
    }

    /// The shape of tensor `name` (the logical `[rows, cols]` of a quantized module).
    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.lg.shape(&self.path(name))
    }

    /// An error about tensor `name` (its full name in the message).
    pub fn error(&self, name: &str, msg: impl Into<String>) -> Error {
        Error::Tensor {
            path: self.dir().to_path_buf(),
            tensor: self.path(name),
            msg: msg.into(),
            hint: None,
        }
    }

    /// Tensor `name` as f32, which must have `shape`.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let full = self.check(name, shape)?;
        let v = self.lg.read_f32(&full).expect("checked to exist");
        self.release(&full);
        Ok(v)
    }

    /// Linear `name` `[n, k]` through the [`LinearSet`] hook given to [`Loader::with_linears`]
    /// (on a device when the set places it there, else f32).
    ///
    /// # Panics
    /// On a loader made without a [`LinearSet`]: a programming error, not an input's.
    pub fn linear(&self, name: &str, n: usize, k: usize) -> Result<Linear> {
        let set = self
            .linears
            .expect("Loader::linear on a loader without with_linears");
        let full = self.check(name, &[n, k])?;
        let l = set.load(self.lg, &full, n, k)?;
        self.release(&full);
        Ok(l)
    }

    /// That tensor `name` exists with `shape`: its full name.
    fn check(&self, name: &str, shape: &[usize]) -> Result<String> {
        let full = self.path(name);
        let s = self.lg.shape(&full).ok_or_else(|| {
            Error::source(self.dir(), format!("{} has no tensor `{full}`", self.owner)).with_hint(
                "the weights and config.json describe different models: use the config.json that \
                 came with these weights (`kquant inspect --tensors DIR` lists the tensors)",
            )
        })?;
        if s != shape {
            return Err(self.error(name, format!("shape {s:?}, expected {shape:?}")));
        }
        Ok(full)
    }

    /// Drop the mapped pages of `full` (or of its quantized parts) once converted.
    fn release(&self, full: &str) {
        let w = &self.lg.ck.weights;
        let parts = self.lg.module(full).map(|m| m.parts.clone());
        for p in parts.unwrap_or_else(|| vec![full.to_string()]) {
            if let (Some(shard), Some(info)) = (w.shard_of(&p), w.info(&p)) {
                shard.release(info);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Checkpoint;

    fn fixture() -> Checkpoint {
        let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/kimi-k2.5-tiny/eagle3");
        Checkpoint::open(p.to_str().unwrap()).unwrap()
    }

    #[test]
    fn prefixes_nest_and_errors_name_the_full_tensor() {
        let ck = fixture();
        let lg = Logical::new(&ck).unwrap();
        let vb = Loader::new(&lg, "draft");
        let mid = vb.pp("midlayer");
        let mlp = mid.pp("mlp");
        assert_eq!(mlp.path("up_proj.weight"), "midlayer.mlp.up_proj.weight");
        let shape = mlp.shape("up_proj.weight").unwrap();
        assert_eq!(
            mlp.get("up_proj.weight", &shape).unwrap().len(),
            shape.iter().product::<usize>()
        );
        assert!(vb.has("midlayer.mlp.up_proj.weight") && !vb.has("up_proj.weight"));

        let e = mlp.get("nope.weight", &[1]).unwrap_err().to_string();
        assert!(
            e.ends_with("draft has no tensor `midlayer.mlp.nope.weight`"),
            "{e}"
        );
        let e = mlp.get("up_proj.weight", &[1, 2]).unwrap_err().to_string();
        assert!(
            e.ends_with(&format!(
                "tensor `midlayer.mlp.up_proj.weight`: shape {shape:?}, expected [1, 2]"
            )),
            "{e}"
        );
    }
}
