//! The emulation's side of one launch: "device" memory in host memory ([`HostBuf`]) and the
//! launch being replayed ([`Replay`]: the entry point's name, its grid and block on the
//! emulated vendor), with the checks every replay makes — a grid that leaves part of the output
//! unwritten, a block that is not one warp, a read or write past a buffer is an error here (on a
//! GPU it would be garbage). Each kernel's replay reads its arguments through these: the step
//! kernels beside their ops ([`super::ops`]), the linear ones in [`super::emu`].

use std::sync::Mutex;

use super::driver::{as_bytes, from_bytes, Dim3, Pod};
use super::emu_mma::Vendor;
use super::{GpuError, Result};

/// An error of the emulation.
pub fn err(msg: String) -> GpuError {
    GpuError::Backend {
        backend: "cpu",
        msg,
    }
}

/// "Device" bytes in host memory.
pub struct HostBuf(pub(super) Mutex<Vec<u8>>);

impl HostBuf {
    /// The first `n` values, or an error if the buffer is smaller.
    pub fn read<T: Pod>(&self, n: usize) -> Result<Vec<T>> {
        let b = self.0.lock().expect("buffer");
        let bytes = n * std::mem::size_of::<T>();
        if b.len() < bytes {
            return Err(err(format!(
                "a kernel reads {bytes} bytes of a {}-byte buffer",
                b.len()
            )));
        }
        Ok(from_bytes(&b, n))
    }
    /// Every whole value of type `T` the buffer holds.
    pub fn all<T: Pod>(&self) -> Vec<T> {
        from_bytes(&self.0.lock().expect("buffer"), usize::MAX)
    }
    /// Store `v` at the start, or an error if the buffer is smaller.
    pub fn write<T: Pod>(&self, v: &[T]) -> Result<()> {
        let mut b = self.0.lock().expect("buffer");
        let src = as_bytes(v);
        let len = b.len();
        b.get_mut(..src.len())
            .ok_or_else(|| {
                err(format!(
                    "a kernel writes {} bytes to a {len}-byte buffer",
                    src.len()
                ))
            })?
            .copy_from_slice(src);
        Ok(())
    }
}

/// One launch being replayed: its entry point, grid and block, on `vendor`'s atoms.
pub struct Replay<'a> {
    pub name: &'a str,
    pub grid: Dim3,
    pub block: Dim3,
    pub vendor: Vendor,
}

impl Replay<'_> {
    /// Lanes of the emulated warp / wavefront.
    pub fn lanes(&self) -> usize {
        self.vendor.lanes()
    }
    /// Threads along x over the whole grid.
    pub fn threads(&self) -> usize {
        self.grid.0 as usize * self.block.0 as usize
    }
    /// An error naming the kernel.
    pub fn err(&self, what: std::fmt::Arguments<'_>) -> GpuError {
        err(format!("{}: {what}", self.name))
    }
    /// `have ≥ need`, or an error naming the kernel: its grid leaves outputs unwritten.
    pub fn covers(&self, what: &str, have: usize, need: usize) -> Result<()> {
        if have >= need {
            Ok(())
        } else {
            Err(err(format!(
                "{}: the launch covers {have} {what}, the output needs {need}",
                self.name
            )))
        }
    }
    /// The grid's threads along x cover `need` outputs.
    pub fn threads_cover(&self, need: usize) -> Result<()> {
        self.covers("threads", self.threads(), need)
    }
    /// The grid's blocks along x cover `need` rows.
    pub fn rows_cover(&self, need: usize) -> Result<()> {
        self.covers("rows", self.grid.0 as usize, need)
    }
    /// One warp / wavefront along `threadIdx.x`, as the GEMV, MMA and attention kernels are
    /// written.
    pub fn warp(&self) -> Result<()> {
        let lanes = self.lanes();
        if self.block.0 as usize == lanes {
            Ok(())
        } else {
            Err(err(format!(
                "{}: block.x {}, the warp is {lanes}",
                self.name, self.block.0
            )))
        }
    }
}

/// `idx` as a usize below `len` (an index a replay reads; the launcher's checks make an error
/// here unreachable).
pub fn at(what: &str, idx: i32, len: usize) -> Result<usize> {
    usize::try_from(idx)
        .ok()
        .filter(|&i| i < len)
        .ok_or_else(|| err(format!("{what}: index {idx} outside 0..{len}")))
}
