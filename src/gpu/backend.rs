//! [`Backend`]: one device that runs the kernels, by what it serves — its linears (W4A16 and
//! W4A8 in a regime, the dense vendor GEMM, each with its row-argmax variant); its device
//! tensors and step ops are the supertrait [`Tensors`].

use super::dense::DeviceDense;
use super::elem::Act;
use super::error::{GpuError, Result};
use super::layout::W4Layout;
use super::ops::Host;
use super::tensors::Tensors;
use super::tune::{self, Arch, Regime};
use super::weights::DeviceW4;

impl DeviceW4 {
    /// The regime `dev` picks for `m` tokens on these weights.
    pub fn regime_on(&self, dev: &dyn Backend, m: usize) -> Regime {
        if self.kept {
            dev.regime_kept(m)
        } else {
            dev.regime(m)
        }
    }
}

/// One device that runs the kernels, by what it serves: here its linears — `y [m, n] (f32) =
/// x [m, k] · Wᵀ` on host slices (weights uploaded once; W4A16 and W4A8 in a regime, the dense
/// vendor GEMM, each with its row-argmax variant); its device tensors and the step ops over
/// them are [`Tensors`] (a supertrait: every backend has both).
pub trait Backend: Tensors {
    /// Human name, with the device (e.g. `cuda:0 (sm_90)`).
    fn name(&self) -> String;
    /// The tuning row this device launches with (regime thresholds, geometry).
    fn arch(&self) -> Arch;
    /// Where its kernel module came from: the on-disk cache or a compile in this process
    /// ([`module_cache`](super::module_cache)); `None` for the emulation.
    fn module_origin(&self) -> Option<String> {
        None
    }
    /// Copy the weights to the device once.
    fn upload(&self, w: &W4Layout) -> Result<DeviceW4>;
    /// [`Backend::upload`] for weights that never change between calls (a verify replay):
    /// regime C dequantizes them at the first call and keeps the dense matrix on the device
    /// (`n·k` 16-bit values beside the packed ones), so a later call is the vendor GEMM alone,
    /// numerically the same as dequantizing every call.
    fn upload_kept(&self, w: &W4Layout) -> Result<DeviceW4>;
    /// W4A16 through `regime`: `x` holds `m × k` activations in `act`.
    fn w4a16_on(
        &self,
        w: &DeviceW4,
        x: &[u16],
        act: Act,
        m: usize,
        regime: Regime,
    ) -> Result<Vec<f32>>;
    /// W4A8 through `regime` (per channel only): activations quantized per token to int8 on the
    /// device, exact int32 dot products. Regime C runs the MMA kernel (int8 tensor cores are the
    /// compute-bound path already).
    fn w4a8_on(
        &self,
        w: &DeviceW4,
        x: &[u16],
        act: Act,
        m: usize,
        regime: Regime,
    ) -> Result<Vec<f32>>;
    /// W4A16 through `regime`, then each row's argmax on the device (`kq_argmax_rows`): `m`
    /// indices come back instead of `m·n` outputs.
    fn w4a16_argmax_on(
        &self,
        w: &DeviceW4,
        x: &[u16],
        act: Act,
        m: usize,
        regime: Regime,
    ) -> Result<Vec<usize>>;
    /// Copy an unquantized weight `[n, k]` (bit patterns of `dtype`) to the device once.
    fn upload_dense(&self, w: &[u16], n: usize, k: usize, dtype: Act) -> Result<DeviceDense>;
    /// `y [m, n] (f32) = x [m, k] · Wᵀ` through the vendor BLAS's `GemmEx` (f32 compute), `x`
    /// in the weight's dtype.
    fn dense_on(&self, w: &DeviceDense, x: &[u16], m: usize) -> Result<Vec<f32>>;
    /// [`Backend::dense_on`], then each row's argmax on the device: `m` indices come back.
    fn dense_argmax_on(&self, w: &DeviceDense, x: &[u16], m: usize) -> Result<Vec<usize>>;
    /// `kq_argmax_rows` over `y [m, n]` (uploaded first): each row's index of its largest value,
    /// a NaN counting as the largest, the first on ties (`reference::argmax_ref`). The same
    /// product as [`Tensors::argmax_dev`], from the host.
    fn argmax_rows(&self, y: &[f32], m: usize, n: usize) -> Result<Vec<usize>> {
        if y.len() != m * n {
            return Err(GpuError::Layout(format!(
                "y has {} values, expected m·n = {}",
                y.len(),
                m * n
            )));
        }
        let yd = self.upload_tensor(Host::F32(y))?;
        self.argmax_dev(&yd, m, n)
    }
    /// The regime this device uses for `m` tokens.
    fn regime(&self, m: usize) -> Regime {
        tune::regime(self.arch(), m)
    }
    /// The regime this device uses for `m` tokens on kept weights ([`Backend::upload_kept`]).
    fn regime_kept(&self, m: usize) -> Regime {
        tune::regime_kept(self.arch(), m)
    }
    /// Upload `w` and run W4A16 in the regime for `m`.
    fn w4a16(&self, w: &W4Layout, x: &[u16], act: Act, m: usize) -> Result<Vec<f32>> {
        let d = self.upload(w)?;
        self.w4a16_on(&d, x, act, m, self.regime(m))
    }
    /// Upload `w` and run W4A8 in the regime for `m`.
    fn w4a8(&self, w: &W4Layout, x: &[u16], act: Act, m: usize) -> Result<Vec<f32>> {
        let d = self.upload(w)?;
        self.w4a8_on(&d, x, act, m, self.regime(m))
    }
}
