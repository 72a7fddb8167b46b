//! Device-resident tensors: a [`DevTensor`] is a typed device buffer (f32, int32 indices with the
//! bound they were checked against, or 16-bit activations), uploaded from [`Host`] values; a
//! [`Strided`] names the columns of its rows an op reads or writes.

use std::any::Any;

use crate::gpu::{Act, Elem, GpuError, Result};

/// A typed device buffer of `len` elements.
pub struct DevTensor {
    elem: Elem,
    len: usize,
    /// For int32 index tensors: every value is in `0..bound` (checked at upload).
    bound: Option<usize>,
    inner: Box<dyn Any + Send + Sync>,
}

impl DevTensor {
    pub fn new(
        elem: Elem,
        len: usize,
        bound: Option<usize>,
        inner: Box<dyn Any + Send + Sync>,
    ) -> DevTensor {
        DevTensor {
            elem,
            len,
            bound,
            inner,
        }
    }
    pub fn elem(&self) -> Elem {
        self.elem
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The bound an index tensor's values were checked against.
    pub fn bound(&self) -> Option<usize> {
        self.bound
    }
    /// The backend's buffer, or an error if the tensor lives on another device.
    pub fn get<T: 'static>(&self, backend: &'static str) -> Result<&T> {
        self.inner.downcast_ref::<T>().ok_or(GpuError::Backend {
            backend,
            msg: "a tensor of a different device".into(),
        })
    }
}

/// Host values for an upload.
#[derive(Clone, Copy)]
pub enum Host<'a> {
    F32(&'a [f32]),
    /// Bit patterns of a 16-bit float.
    Half(Act, &'a [u16]),
    /// Indices, each checked to be in `0..bound`.
    Index(&'a [i32], usize),
    /// f32 or 16-bit values as little-endian bytes (a mapped file's tensor, uploaded as it is).
    Le(Elem, &'a [u8]),
}

impl Host<'_> {
    pub fn elem(&self) -> Elem {
        match self {
            Host::F32(_) => Elem::F32,
            Host::Half(a, _) => Elem::Half(*a),
            Host::Index(..) => Elem::I32,
            Host::Le(e, _) => *e,
        }
    }
    pub fn len(&self) -> usize {
        match self {
            Host::F32(v) => v.len(),
            Host::Half(_, v) => v.len(),
            Host::Index(v, _) => v.len(),
            Host::Le(e, b) => b.len() / e.size(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Every index in `0..bound`; raw bytes whole values of a float type, in the device's
    /// (little-endian) order.
    pub fn check(&self) -> Result<()> {
        if let Host::Le(e, b) = *self {
            if e == Elem::I32 || !b.len().is_multiple_of(e.size()) || cfg!(target_endian = "big") {
                return Err(GpuError::Layout(format!(
                    "{} bytes of little-endian {} on a {} host",
                    b.len(),
                    e.name(),
                    if cfg!(target_endian = "big") {
                        "big-endian"
                    } else {
                        "little-endian"
                    }
                )));
            }
        }
        if let Host::Index(v, bound) = *self {
            if let Some(bad) = v.iter().find(|&&i| i < 0 || i as usize >= bound) {
                return Err(GpuError::Layout(format!("index {bad} outside 0..{bound}")));
            }
        }
        Ok(())
    }
}

/// Rows of `ld` values, the op's `w` of them from column `off`.
#[derive(Debug, Clone, Copy)]
pub struct Strided {
    pub ld: usize,
    pub off: usize,
}
