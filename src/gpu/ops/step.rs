//! What every step op shares: the [`DeviceOp`] trait (its checks and its launch), the words its
//! checks are written in ([`holds`], [`indexes`], [`size`]: every size a kernel relies on,
//! computed checked), and the geometry of an element-wise kernel ([`elementwise`]).

use super::tensor::DevTensor;
use crate::gpu::driver::Dim3;
use crate::gpu::source::{Kernel, OPS_THREADS};
use crate::gpu::{Act, Elem, GpuError, Result};

/// One launch: the kernel with its arguments, its grid and its block.
pub type Launch<'a, B> = (Kernel<'a, B>, Dim3, Dim3);

/// Maps each tensor of an op to the driver's buffer behind it.
pub type Bufs<'a, 'f, B> = dyn Fn(&'a DevTensor) -> Result<&'a B> + 'f;

/// One step kernel (`kernels/ops.cu`) over device tensors: what it checks, and the launch it
/// becomes. Its CPU replay sits beside it (`replay`, read by [`crate::gpu::emu`]).
pub trait DeviceOp<'a> {
    /// Every size, element type and index bound the kernel relies on: an op that passes reads
    /// and writes inside its tensors only.
    fn check(&self) -> Result<()>;
    /// The kernel over the buffers `buf` maps each tensor to, its grid and block for a
    /// `warp`-lane device ([`DeviceOp::check`] passed first).
    fn launch<B: 'a>(&self, buf: &Bufs<'a, '_, B>, warp: u32) -> Result<Launch<'a, B>>;
}

pub(super) fn layout(msg: String) -> GpuError {
    GpuError::Layout(msg)
}

/// `t` holds at least `need` elements of `elem`.
pub(super) fn holds(what: &str, t: &DevTensor, elem: Elem, need: usize) -> Result<()> {
    if t.elem() != elem {
        return Err(layout(format!(
            "{what}: a {} tensor where {} was expected",
            t.elem().name(),
            elem.name()
        )));
    }
    if t.len() < need {
        return Err(layout(format!(
            "{what}: {} elements, the op needs {need}",
            t.len()
        )));
    }
    Ok(())
}

/// `t` is an index tensor of at least `need` values, each below `limit`.
pub(super) fn indexes(what: &str, t: &DevTensor, need: usize, limit: usize) -> Result<()> {
    holds(what, t, Elem::I32, need)?;
    match t.bound() {
        Some(b) if b <= limit => Ok(()),
        Some(b) => Err(layout(format!(
            "{what}: indices up to {b}, the op indexes {limit}"
        ))),
        None => Err(layout(format!("{what}: indices never checked"))),
    }
}

/// `Σ` of products of `terms` (each a product of its factors), computed checked, and fitting a
/// kernel's `int`: every size [`DeviceOp::check`] compares is one, so a hostile geometry is an
/// error, never a wrapped product that passes (#38.11).
pub(super) fn size(what: &str, terms: &[&[usize]]) -> Result<usize> {
    let v = terms
        .iter()
        .try_fold(0usize, |acc, t| {
            t.iter()
                .try_fold(1usize, |a, &b| a.checked_mul(b))
                .and_then(|x| acc.checked_add(x))
        })
        .ok_or_else(|| GpuError::Unsupported("size", format!("{what} {terms:?} overflows")))?;
    int(what, v)
}

/// `v` fits a kernel's `int`.
pub(super) fn int(what: &str, v: usize) -> Result<usize> {
    if i32::try_from(v).is_ok() {
        Ok(v)
    } else {
        Err(GpuError::Unsupported(
            "size",
            format!("{what} = {v} exceeds a kernel's int"),
        ))
    }
}

/// The 16-bit dtype of `t`.
pub(super) fn half(t: &DevTensor, what: &str) -> Result<Act> {
    match t.elem() {
        Elem::Half(a) => Ok(a),
        e => Err(layout(format!(
            "{what}: a {} tensor where bf16/f16 was expected",
            e.name()
        ))),
    }
}

/// Grid and block of an element-wise step kernel over `len` outputs.
pub(super) fn elementwise(len: usize) -> (Dim3, Dim3) {
    (
        (len.div_ceil(OPS_THREADS as usize).max(1) as u32, 1, 1),
        (OPS_THREADS, 1, 1),
    )
}
