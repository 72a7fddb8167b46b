//! The device a `--device` flag names ([`open`]): `cpu` (the kernel emulation), `cuda[:N]`,
//! `hip[:N]`, boxed as a compute [`Backend`] or a timing [`Bench`].

use super::backend::Backend;
use super::bench::Bench;
use super::dispatch::Device;
use super::driver;
use super::emu::CpuEmu;
use super::error::{GpuError, Result};

/// A box [`open`] can put a device in: `Box<dyn Backend>` (compute) or `Box<dyn Bench>` (compute
/// and timing, for `kquant bench gemm`).
pub trait Opened: Sized {
    fn new<D: driver::Driver>(d: Device<D>) -> Self;
}

impl Opened for Box<dyn Backend> {
    fn new<D: driver::Driver>(d: Device<D>) -> Self {
        Box::new(d)
    }
}

impl Opened for Box<dyn Bench> {
    fn new<D: driver::Driver>(d: Device<D>) -> Self {
        Box::new(d)
    }
}

/// The device a `--device` flag names: `cpu` (the kernel emulation), `cuda[:N]`, `hip[:N]`.
pub fn open<T: Opened>(spec: &str) -> Result<T> {
    let (kind, ordinal) = match spec.split_once(':') {
        Some((k, n)) => (
            k,
            n.parse::<usize>()
                .map_err(|_| GpuError::UnknownDevice(spec.into()))?,
        ),
        None => (spec, 0),
    };
    match kind {
        "cpu" if ordinal == 0 => Ok(T::new(CpuEmu::nvidia())),
        #[cfg(feature = "cuda")]
        "cuda" => Ok(T::new(Device::new(super::cuda::Cuda::new(ordinal)?))),
        #[cfg(not(feature = "cuda"))]
        "cuda" => Err(GpuError::NotBuilt(spec.into(), "cuda")),
        #[cfg(feature = "hip")]
        "hip" => Ok(T::new(Device::new(super::hip::Hip::new(ordinal)?))),
        #[cfg(not(feature = "hip"))]
        "hip" => Err(GpuError::NotBuilt(spec.into(), "hip")),
        _ => Err(GpuError::UnknownDevice(spec.into())),
    }
}
