//! [`Tensors`]: what a device serves besides its linears — device-resident tensors (uploaded
//! from the host with their index bounds checked, zeroed, read back), the step ops over them
//! ([`super::ops`]: each checked, then launched) and the linears and the row argmax on tensors
//! through the same regimes and launches as the host-slice calls of [`super::Backend`]. Written
//! once for every driver, on `Device` (`device_tensors.rs`).

use super::dense::DeviceDense;
use super::elem::Elem;
use super::error::Result;
use super::ops::{DevTensor, Host, Op};
use super::weights::DeviceW4;

/// Device tensors and the step ops over them: what lets a draft's whole step stay on a device.
pub trait Tensors: Send + Sync {
    /// A device tensor holding `data` (an index tensor's values checked against its bound).
    fn upload_tensor(&self, data: Host<'_>) -> Result<DevTensor>;
    /// A zeroed f32 or 16-bit tensor of `len` values.
    fn zeros(&self, elem: Elem, len: usize) -> Result<DevTensor>;
    /// The f32 values of a tensor, after the queued work.
    fn read_f32(&self, t: &DevTensor) -> Result<Vec<f32>>;
    /// Queue one step kernel ([`Op::check`] first: a bad size or bound is an error, not a
    /// launch).
    fn op(&self, op: &Op<'_>) -> Result<()>;
    /// W4A16 on tensors: `out [m, n]` f32 = `x [m, k]` (16-bit, the dtype the kernels read) ·
    /// Wᵀ, in the regime for `m`.
    fn w4a16_dev(&self, w: &DeviceW4, x: &DevTensor, m: usize, out: &DevTensor) -> Result<()>;
    /// The dense path on tensors: `out [m, n]` f32 = `x [m, k]` (in the weight's dtype) · Wᵀ.
    fn dense_dev(&self, w: &DeviceDense, x: &DevTensor, m: usize, out: &DevTensor) -> Result<()>;
    /// Each row's argmax of `y [m, n]` (f32), reduced on the device: `m` indices come back.
    fn argmax_dev(&self, y: &DevTensor, m: usize, n: usize) -> Result<Vec<usize>>;
}
