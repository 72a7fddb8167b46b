//! GPU kernels for INT4 per-output-channel / per-group weights (W4A16, W4A8): the kernel weight
//! layout and the CPU repack into it from every checkpoint format kquant writes ([`layout`]), the
//! CPU reference ([`reference`]), the launch geometry and regime choice ([`tune`]), the kernel
//! source as NVRTC / hipRTC compile it with each entry point's name and argument list
//! ([`source`]), and a device-resident linear layer ([`linear`]). Beside them, unquantized
//! BF16 / F16 layers on the device through the vendor BLAS, with each row's argmax reduced there
//! (`kernels/argmax.cu`) for an lm_head ([`dense`]).
//!
//! The host code is written once: [`Device`] ([`dispatch`]) is the one [`Backend`], over a thin
//! [`driver::Driver`] (memory, launch, vendor GEMM, event timing) that three implement — the CPU
//! emulation ([`emu`]: each kernel's CPU replay, [`emu_mma`] lane by lane over the documented MMA
//! operand maps in [`fragment`], [`emu_dense`]), and behind cargo features `cuda` ([`cuda`],
//! cudarc with dynamic loading, cuBLAS) and `hip` ([`hip`], libamdhip64 + libhiprtc + libhipblas
//! loaded at run time). Timing is apart from compute: [`Bench`] ([`mod@bench`]), for `kquant bench
//! gemm` only. Without the features nothing here needs a GPU toolkit.
//! Design and the GPU checks still to run: docs/kernels.md.

pub mod backend;
pub mod bench;
pub mod dense;
pub mod dense_linear;
pub mod device_tensors;
pub mod dispatch;
pub mod driver;
pub mod elem;
pub mod emu;
pub mod emu_dense;
pub mod emu_launch;
pub mod emu_mma;
pub mod error;
pub mod fragment;
pub mod layout;
pub mod linear;
pub mod module_cache;
pub mod open;
pub mod ops;
pub mod reference;
pub mod source;
pub mod tensors;
pub mod tune;
pub mod weights;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "hip")]
pub mod hip;

pub use backend::Backend;
pub use bench::Bench;
pub use dense::DeviceDense;
pub use dense_linear::DenseLinear;
pub use dispatch::Device;
pub use elem::{Act, Elem};
pub use emu::CpuEmu;
pub use error::{GpuError, Result};
pub use layout::W4Layout;
pub use linear::{DeviceLinear, DeviceLinears};
pub use open::{open, Opened};
pub use ops::{AttendDims, DevTensor, Host, Op, Strided};
pub use tensors::Tensors;
pub use tune::{Arch, Regime};
pub use weights::{check_call, check_w4a8, DeviceW4};
