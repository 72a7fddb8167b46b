//! INT4 weights uploaded to a device once ([`DeviceW4`], kernel layout `kq-w4-gemv/1`) and the
//! checks every launcher makes of a call on them (`check_call`, `check_w4a8`).

use std::any::Any;

use super::error::{GpuError, Result};
use super::layout::{self, W4Layout};
use super::source;
use super::tune::Regime;

/// Weights uploaded to one device once (kernel layout `kq-w4-gemv/1`), used by every regime.
pub struct DeviceW4 {
    pub n: usize,
    pub k: usize,
    pub group: usize,
    /// Uploaded with [`Backend::upload_kept`](super::Backend::upload_kept) (regime C keeps its dense copy).
    pub kept: bool,
    /// The backend's own buffers.
    inner: Box<dyn Any + Send + Sync>,
}

impl DeviceW4 {
    pub fn new(w: &W4Layout, kept: bool, inner: Box<dyn Any + Send + Sync>) -> DeviceW4 {
        DeviceW4 {
            n: w.n,
            k: w.k,
            group: w.group,
            kept,
            inner,
        }
    }
    pub fn per_channel(&self) -> bool {
        self.group == self.k
    }
    /// Packed weight bytes (what a GEMV streams).
    pub fn weight_bytes(&self) -> usize {
        self.n * layout::words_per_row(self.k) * 4
    }
    /// The backend's buffers, or an error if these weights live on another device.
    pub fn get<T: 'static>(&self, backend: &'static str) -> Result<&T> {
        self.inner.downcast_ref::<T>().ok_or(GpuError::Backend {
            backend,
            msg: "weights were uploaded to a different device".into(),
        })
    }
}

/// Checks every launcher shares (the kernels' preconditions).
pub fn check_call(w: &DeviceW4, x_len: usize, m: usize, regime: Regime) -> Result<()> {
    if m == 0 {
        return Err(GpuError::Unsupported("M", "no rows".into()));
    }
    if regime == Regime::Gemv && m > source::GEMV_MAX_M {
        return Err(GpuError::Unsupported(
            "M",
            format!(
                "the GEMV kernels take 1..={} rows, got {m}",
                source::GEMV_MAX_M
            ),
        ));
    }
    if !w.k.is_multiple_of(8) {
        return Err(GpuError::Unsupported(
            "K",
            format!(
                "activation rows are read 16 bytes at a time: K % 8 must be 0, K = {}",
                w.k
            ),
        ));
    }
    if x_len != m * w.k {
        return Err(GpuError::Layout(format!(
            "x has {x_len} values, expected m·k = {}",
            m * w.k
        )));
    }
    Ok(())
}

/// W4A8 takes per-channel weights only.
pub fn check_w4a8(w: &DeviceW4) -> Result<()> {
    if w.per_channel() {
        Ok(())
    } else {
        Err(GpuError::Unsupported(
            "W4A8 group size",
            "per channel only".into(),
        ))
    }
}
