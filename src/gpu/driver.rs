//! The thin per-vendor layer under [`super::Device`]: a [`Driver`] allocates and copies device
//! bytes, launches one kernel ([`super::source::Kernel`]: its name and its argument list, written
//! once) on a grid, runs the vendor BLAS's `GemmEx` and times a loop with events. Three implement
//! it: CUDA (`gpu::cuda`, cudarc), HIP (`gpu::hip`, libloading) and the CPU emulation
//! ([`super::emu`], which runs each kernel's CPU replay). Everything above it — the regime
//! choice, scratch growth, which kernels a call launches and with what — is
//! [`super::dispatch`], written once for all three.

use super::source::Kernel;
use super::tune::Arch;
use super::{Act, Result};

/// A launch's grid or block dimensions.
pub type Dim3 = (u32, u32, u32);

/// `out [m, n] f32 = a [m, k] · w [n, k]ᵀ`, `a` and `w` in `act` (row major; the BLAS call sees
/// it column major: `outᵀ = w · aᵀ`, so `op(A) = wᵀ-as-stored`, `op(B) = a`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    pub n: usize,
    pub k: usize,
    pub m: usize,
    pub act: Act,
}

/// Plain values that go to a device as their bytes (no padding, every bit pattern valid).
pub trait Pod: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The value of `bytes` (native order, `size_of::<Self>()` of them).
    fn from_ne(bytes: &[u8]) -> Self;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! pod {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Pod for $t {
            fn from_ne(bytes: &[u8]) -> Self {
                <$t>::from_ne_bytes(bytes.try_into().expect("one value's bytes"))
            }
        }
    )*};
}
pod!(u8, i8, u16, i32, u32, f32);

/// The bytes of `host`, as a device sees them (native order).
pub fn as_bytes<T: Pod>(host: &[T]) -> &[u8] {
    // SAFETY: `Pod` is sealed to primitive integers and f32: no padding, no invalid bytes; u8
    // needs no alignment; the length is the slice's size in bytes.
    unsafe { std::slice::from_raw_parts(host.as_ptr().cast::<u8>(), std::mem::size_of_val(host)) }
}

/// The first `n` values of type `T` in `bytes`.
pub fn from_bytes<T: Pod>(bytes: &[u8], n: usize) -> Vec<T> {
    bytes
        .chunks_exact(std::mem::size_of::<T>())
        .take(n)
        .map(T::from_ne)
        .collect()
}

/// One device: memory, kernel launches, the vendor GEMM and event timing. Work is queued in
/// order on one stream; [`Driver::dtoh_f32`] waits for it.
pub trait Driver: Send + Sync + 'static {
    /// A device allocation, freed on drop.
    type Buf: Send + Sync + 'static;
    /// The backend's name in errors (`cuda`, `hip`, `cpu`).
    const BACKEND: &'static str;
    /// Human name, with the device (e.g. `cuda:0 NVIDIA H200 (sm_90)`).
    fn name(&self) -> String;
    /// The tuning row the kernels were compiled for and launch with.
    fn arch(&self) -> Arch;
    /// Where the kernel module came from (`module_cache::Origin::describe`), for a device that
    /// compiles one.
    fn module_origin(&self) -> Option<String> {
        None
    }
    /// `bytes` zeroed device bytes.
    fn alloc(&self, bytes: usize) -> Result<Self::Buf>;
    /// Size of `buf` in bytes.
    fn size(buf: &Self::Buf) -> usize;
    /// A new device buffer holding `host`.
    fn htod<T: Pod>(&self, host: &[T]) -> Result<Self::Buf>;
    /// The first `n` f32 of `buf`, after the queued work.
    fn dtoh_f32(&self, buf: &Self::Buf, n: usize) -> Result<Vec<f32>>;
    /// The first `n` int32 of `buf`, after the queued work (`kq_argmax_rows`' indices).
    fn dtoh_i32(&self, buf: &Self::Buf, n: usize) -> Result<Vec<i32>>;
    /// Queue `kernel` on `grid` × `block`, its arguments in [`Kernel::args`]'s order.
    ///
    /// # Safety
    /// Every buffer must hold what the kernel reads and writes at this geometry (the sizes each
    /// call in [`super::dispatch`] states), and the geometry must be the one the kernel is
    /// written for ([`super::tune`]); a device kernel does not check either.
    unsafe fn launch(&self, kernel: &Kernel<'_, Self::Buf>, grid: Dim3, block: Dim3) -> Result<()>;
    /// Queue the vendor BLAS's `GemmEx` for `g` (f32 output and compute).
    ///
    /// # Safety
    /// `w` must hold `n·k`, `a` `m·k` elements of `g.act` and `out` `m·n` f32.
    unsafe fn gemm(&self, g: Gemm, w: &Self::Buf, a: &Self::Buf, out: &Self::Buf) -> Result<()>;
    /// Device-to-device copy of all of `src` into `dst` (at least as large).
    fn copy(&self, src: &Self::Buf, dst: &mut Self::Buf) -> Result<()>;
    /// Seconds per call of `f`: one warm-up call (`f(0)`), then `iters` calls (`f(1..=iters)`)
    /// between two events (the host clock on the CPU).
    fn time(&self, iters: usize, f: &mut dyn FnMut(usize) -> Result<()>) -> Result<f64>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip() {
        let v = [1.5f32, -0.0, f32::MAX];
        let b = as_bytes(&v);
        assert_eq!(b.len(), 12);
        assert_eq!(from_bytes::<f32>(b, 3), v);
        assert_eq!(from_bytes::<f32>(b, 2), v[..2]);
        assert_eq!(from_bytes::<u16>(as_bytes(&[7u16, 9]), 2), [7, 9]);
        assert_eq!(from_bytes::<i8>(as_bytes(&[-3i8]), 1), [-3]);
    }
}
