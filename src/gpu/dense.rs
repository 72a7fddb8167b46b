//! Device-resident unquantized weights ([`DeviceDense`], and the checks of a call on them): a
//! [`DenseLinear`](super::DenseLinear) uploads a BF16 / F16 weight `[n, k]` to a
//! [`Backend`](super::Backend) once and runs `y = x · Wᵀ` there through the vendor BLAS's
//! `GemmEx` (cuBLAS / hipBLAS; bf16 or f16 operands, f32 output and compute — regime C's GEMM,
//! docs/kernels.md), and the row argmax (`kq_argmax_rows`) on the device, so that an lm_head
//! copies back one index per row instead of `[m, vocab]` logits.
//!
//! The GEMM runs in the weight's own dtype: activations are rounded to it (bf16 for a BF16
//! weight — every Kimi draft — as the engines run them; f16 for an F16 weight). An F32 weight is
//! uploaded only when every value is exactly a bf16 ([`DenseLinear::from_f32_exact`](super::DenseLinear::from_f32_exact): nothing
//! rounds); otherwise the caller keeps it on the CPU in f32 (`runtime::linears` does).

use std::any::Any;

use super::{Act, GpuError, Result};

/// An unquantized weight `[n, k]` (bit patterns of `dtype`) on one device.
pub struct DeviceDense {
    pub n: usize,
    pub k: usize,
    /// The weight's dtype, which the GEMM's activations are rounded to.
    pub dtype: Act,
    /// The backend's own buffers.
    inner: Box<dyn Any + Send + Sync>,
}

impl DeviceDense {
    pub fn new(n: usize, k: usize, dtype: Act, inner: Box<dyn Any + Send + Sync>) -> DeviceDense {
        DeviceDense { n, k, dtype, inner }
    }
    /// Weight bytes on the device.
    pub fn weight_bytes(&self) -> usize {
        self.n * self.k * 2
    }
    /// The backend's buffers, or an error if this weight lives on another device.
    pub fn get<T: 'static>(&self, backend: &'static str) -> Result<&T> {
        self.inner.downcast_ref::<T>().ok_or(GpuError::Backend {
            backend,
            msg: "weights were uploaded to a different device".into(),
        })
    }
}

/// The BLAS and the argmax kernel take `int` dimensions.
fn dim(what: &'static str, v: usize) -> Result<i32> {
    match i32::try_from(v) {
        Ok(v) if v > 0 => Ok(v),
        _ => Err(GpuError::Unsupported(
            what,
            format!("{v}: the dense path takes 1..=2^31-1"),
        )),
    }
}

/// An upload's preconditions: `w` holds `n·k` values, both dimensions in `1..=i32::MAX`.
pub fn check_dense(w_len: usize, n: usize, k: usize) -> Result<()> {
    dim("N", n)?;
    dim("K", k)?;
    if w_len != n * k {
        return Err(GpuError::Layout(format!(
            "dense weight has {w_len} values, expected n·k = {}",
            n * k
        )));
    }
    Ok(())
}

/// A call's preconditions: `x` holds `m·k` values, `m` and `m·n` (the logits, indexed as `int`
/// rows of `n` by the argmax) in range.
pub fn check_dense_call(w: &DeviceDense, x_len: usize, m: usize) -> Result<()> {
    if m == 0 {
        return Err(GpuError::Unsupported("M", "no rows".into()));
    }
    dim("M", m)?;
    if x_len != m * w.k {
        return Err(GpuError::Layout(format!(
            "x has {x_len} values, expected m·k = {}",
            m * w.k
        )));
    }
    Ok(())
}
