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

pub mod bench;
pub mod dense;
pub mod dispatch;
pub mod driver;
pub mod emu;
pub mod emu_dense;
pub mod emu_launch;
pub mod emu_mma;
pub mod fragment;
pub mod layout;
pub mod linear;
pub mod module_cache;
pub mod ops;
pub mod reference;
pub mod source;
pub mod tensors;
pub mod tune;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "hip")]
pub mod hip;

use std::any::Any;

pub use bench::Bench;
pub use dense::{DenseLinear, DeviceDense};
pub use dispatch::Device;
pub use emu::CpuEmu;
pub use layout::W4Layout;
pub use linear::{DeviceLinear, DeviceLinears};
pub use ops::{AttendDims, DevTensor, Host, Op, Strided};
pub use tensors::Tensors;
pub use tune::{Arch, Regime};

/// Errors of the GPU path (layout checks, missing runtime, driver/compiler failures).
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("kernel layout: {0}")]
    Layout(String),
    #[error("{0} is not supported by this kernel: {1}")]
    Unsupported(&'static str, String),
    #[error("{backend}: {msg}")]
    Backend { backend: &'static str, msg: String },
    #[error("device `{0}`: this kquant was built without the `{1}` feature")]
    NotBuilt(String, &'static str),
    #[error("unknown device `{0}` (cpu, cuda[:N], hip[:N])")]
    UnknownDevice(String),
}

impl GpuError {
    /// A `hint:` line for the user.
    pub fn hint(&self) -> Option<String> {
        match self {
            GpuError::NotBuilt(_, feature) => Some(format!("rebuild with --features {feature}")),
            GpuError::UnknownDevice(_) => Some("use --device cpu, cuda, cuda:1, hip, …".into()),
            GpuError::Backend { backend, .. } => Some(format!(
                "check that the {backend} driver and runtime libraries are installed and visible \
                 (LD_LIBRARY_PATH), or use --device cpu"
            )),
            _ => None,
        }
    }
}

/// A GPU error as the CLI reports it (`error:` and its `hint:`). Here, not in `crate::error`, so
/// that the error module depends on nothing above it.
impl From<GpuError> for crate::error::Error {
    fn from(e: GpuError) -> Self {
        crate::error::Error::Device {
            hint: e.hint(),
            msg: e.to_string(),
        }
    }
}

pub type Result<T> = std::result::Result<T, GpuError>;

/// Activation dtype (bit patterns passed as `u16`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    Bf16,
    F16,
}

impl Act {
    pub fn name(self) -> &'static str {
        match self {
            Act::Bf16 => "bf16",
            Act::F16 => "f16",
        }
    }
    pub fn to_f32(self, h: u16) -> f32 {
        match self {
            Act::Bf16 => half::bf16::from_bits(h).to_f32(),
            Act::F16 => half::f16::from_bits(h).to_f32(),
        }
    }
    pub fn from_f32(self, v: f32) -> u16 {
        match self {
            Act::Bf16 => half::bf16::from_f32(v).to_bits(),
            Act::F16 => half::f16::from_f32(v).to_bits(),
        }
    }
}

/// Element type of a device tensor ([`ops::DevTensor`]) or of an embedding table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    F32,
    I32,
    /// 16-bit floats (bit patterns as `u16`).
    Half(Act),
}

impl Elem {
    pub fn name(self) -> &'static str {
        match self {
            Elem::F32 => "f32",
            Elem::I32 => "i32",
            Elem::Half(a) => a.name(),
        }
    }
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Elem::F32 | Elem::I32 => 4,
            Elem::Half(_) => 2,
        }
    }
}

/// Weights uploaded to one device once (kernel layout `kq-w4-gemv/1`), used by every regime.
pub struct DeviceW4 {
    pub n: usize,
    pub k: usize,
    pub group: usize,
    /// Uploaded with [`Backend::upload_kept`] (regime C keeps its dense copy).
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
    /// The regime `dev` picks for `m` tokens on these weights.
    pub fn regime_on(&self, dev: &dyn Backend, m: usize) -> Regime {
        if self.kept {
            dev.regime_kept(m)
        } else {
            dev.regime(m)
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
    /// ([`module_cache`]); `None` for the emulation.
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
        "cuda" => Ok(T::new(Device::new(cuda::Cuda::new(ordinal)?))),
        #[cfg(not(feature = "cuda"))]
        "cuda" => Err(GpuError::NotBuilt(spec.into(), "cuda")),
        #[cfg(feature = "hip")]
        "hip" => Ok(T::new(Device::new(hip::Hip::new(ordinal)?))),
        #[cfg(not(feature = "hip"))]
        "hip" => Err(GpuError::NotBuilt(spec.into(), "hip")),
        _ => Err(GpuError::UnknownDevice(spec.into())),
    }
}
