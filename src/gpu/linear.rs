//! Device-resident quantized linear layers: [`DeviceLinear`] uploads one INT4 module of a checkpoint to
//! a [`Backend`] once (kernel layout `kq-w4-gemv/1`, repacked straight from the stored tensors)
//! and runs `y = x · Wᵀ` there with the regime the device picks for M; [`DeviceLinears`] does that for
//! every quantized module of a draft, keyed by logical tensor name, for a runtime to route its
//! matmuls through (`kquant verify --device`). Activations enter in f32 and are rounded to the
//! layer's activation dtype (bf16 by default, what the engines run), outputs come back in f32.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Act, Backend, DevTensor, DeviceW4, Elem, GpuError, Result, W4Layout};
use crate::quant::decode::Logical;

/// One quantized linear layer on one device.
pub struct DeviceLinear {
    dev: Arc<dyn Backend>,
    w: DeviceW4,
    /// Activation dtype the kernels read.
    pub act: Act,
}

impl DeviceLinear {
    /// Upload `w` to `dev` ([`Backend::upload_kept`]: a layer's weights never change, so regime
    /// C keeps its dense copy after the first call).
    pub fn new(dev: Arc<dyn Backend>, w: &W4Layout, act: Act) -> Result<DeviceLinear> {
        let w = dev.upload_kept(w)?;
        Ok(DeviceLinear { dev, w, act })
    }

    /// Upload logical tensor `name` (e.g. `midlayer.self_attn.q_proj.weight`) of a quantized
    /// checkpoint; an unquantized tensor or a layout the kernels do not take is an error.
    pub fn from_logical(
        dev: Arc<dyn Backend>,
        lg: &Logical,
        name: &str,
        act: Act,
    ) -> Result<DeviceLinear> {
        let m = lg.module(name).ok_or_else(|| {
            GpuError::Unsupported("tensor", format!("`{name}` is not a quantized module"))
        })?;
        DeviceLinear::new(dev, &W4Layout::from_module(lg, m)?, act)
    }

    /// Output features.
    pub fn n(&self) -> usize {
        self.w.n
    }
    /// Input features.
    pub fn k(&self) -> usize {
        self.w.k
    }

    /// `y [m, n] = x [m, k] · Wᵀ` on the device (`x` rounded to [`DeviceLinear::act`] first).
    pub fn forward(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        let xb: Vec<u16> = x.iter().map(|&v| self.act.from_f32(v)).collect();
        self.dev
            .w4a16_on(&self.w, &xb, self.act, m, self.w.regime_on(&*self.dev, m))
    }

    /// The index of the largest output of each of the `m` rows of [`DeviceLinear::forward`],
    /// reduced on the device (`kq_argmax_rows`: first on ties, a NaN counts as the largest).
    pub fn argmax_rows(&self, x: &[f32], m: usize) -> Result<Vec<usize>> {
        let xb: Vec<u16> = x.iter().map(|&v| self.act.from_f32(v)).collect();
        self.dev
            .w4a16_argmax_on(&self.w, &xb, self.act, m, self.w.regime_on(&*self.dev, m))
    }
}

impl DeviceLinear {
    /// [`DeviceLinear::forward`] on tensors: `x [m, k]` already in [`DeviceLinear::act`], the
    /// `[m, n]` f32 output left on the device.
    pub fn forward_dev(&self, x: &DevTensor, m: usize) -> Result<DevTensor> {
        let out = self.dev.zeros(Elem::F32, m * self.w.n)?;
        self.dev.w4a16_dev(&self.w, x, m, &out)?;
        Ok(out)
    }
}

/// Every quantized linear of a checkpoint, uploaded once.
pub struct DeviceLinears {
    pub device: String,
    layers: BTreeMap<String, DeviceLinear>,
}

impl DeviceLinears {
    /// Upload every INT4 module of `lg` to `dev`; modules stored otherwise (FP8, NVFP4,
    /// asymmetric) are skipped and listed in the second return value for the caller to run on
    /// the CPU.
    pub fn load(
        dev: Arc<dyn Backend>,
        lg: &Logical,
        act: Act,
    ) -> Result<(DeviceLinears, Vec<String>)> {
        let mut layers = BTreeMap::new();
        let mut skipped = Vec::new();
        for m in lg.modules.values() {
            let name = format!("{}.weight", m.module);
            match W4Layout::from_module(lg, m) {
                Ok(l) => {
                    layers.insert(name, DeviceLinear::new(dev.clone(), &l, act)?);
                }
                Err(GpuError::Unsupported(..)) => skipped.push(name),
                Err(e) => return Err(e),
            }
        }
        Ok((
            DeviceLinears {
                device: dev.name(),
                layers,
            },
            skipped,
        ))
    }

    /// The layer behind logical tensor `name`, if it was uploaded.
    pub fn get(&self, name: &str) -> Option<&DeviceLinear> {
        self.layers.get(name)
    }

    /// Logical names of the uploaded layers.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.layers.keys().map(|s| s.as_str())
    }
}

/// The `kquant verify --device` hand-off: `cpu` is the f32 runtime (`None`); `cpu-emu` is the
/// CPU replay of the kernels (the device tests run through); `cuda[:N]` / `hip[:N]` open that
/// device, so a build without its feature or a missing driver fails here with its own hint,
/// before anything is read. The draft runtimes then route their quantized linears to the device
/// (`runtime::linears`).
pub fn verify_device(spec: &str) -> Result<Option<Arc<dyn Backend>>> {
    match spec {
        "cpu" => Ok(None),
        "cpu-emu" => Ok(Some(Arc::from(super::open::<Box<dyn Backend>>("cpu")?))),
        _ => Ok(Some(Arc::from(super::open::<Box<dyn Backend>>(spec)?))),
    }
}
