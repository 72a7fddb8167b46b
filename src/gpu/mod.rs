//! GPU kernels for INT4 per-output-channel / per-group weights (W4A16, W4A8): the kernel weight
//! layout and the CPU repack into it from every checkpoint format kquant writes ([`layout`]), the
//! CPU reference and the CPU replays of the three kernel regimes ([`reference`], [`emu_mma`] over
//! the documented MMA operand maps in [`fragment`], [`emu_dense`]), the launch geometry and
//! regime choice ([`tune`]), the kernel source as NVRTC / hipRTC compile it ([`source`]), a
//! device-resident linear layer ([`linear`]), and the launchers behind cargo features: `cuda`
//! ([`cuda`], cudarc with dynamic loading, cuBLAS) and `hip` ([`hip`], libamdhip64 + libhiprtc +
//! libhipblas loaded at run time). Without those features nothing here needs a GPU toolkit.
//! Design and the GPU checks still to run: docs/kernels.md.

pub mod driver;
pub mod emu_dense;
pub mod emu_mma;
pub mod fragment;
pub mod layout;
pub mod linear;
pub mod reference;
pub mod source;
pub mod tune;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "hip")]
pub mod hip;

use std::any::Any;

pub use layout::W4Layout;
pub use linear::{DeviceLinear, DeviceLinears};
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

/// Weights uploaded to one device once (kernel layout `kq-w4-gemv/1`), used by every regime.
pub struct DeviceW4 {
    pub n: usize,
    pub k: usize,
    pub group: usize,
    /// The backend's own buffers.
    inner: Box<dyn Any + Send + Sync>,
}

impl DeviceW4 {
    pub fn new(w: &W4Layout, inner: Box<dyn Any + Send + Sync>) -> DeviceW4 {
        DeviceW4 {
            n: w.n,
            k: w.k,
            group: w.group,
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

/// One device that runs the kernels: `y [m, n] (f32) = x [m, k] · Wᵀ`.
pub trait Backend: Send + Sync {
    /// Human name, with the device (e.g. `cuda:0 (sm_90)`).
    fn name(&self) -> String;
    /// The tuning row this device launches with (regime thresholds, geometry).
    fn arch(&self) -> Arch;
    /// Copy the weights to the device once.
    fn upload(&self, w: &W4Layout) -> Result<DeviceW4>;
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
    /// Seconds per W4A16 call on device-resident activations and output, cycling over `ws`
    /// (several copies of one matrix, so the weights stream from memory, not cache): mean of
    /// `iters` calls after a warm-up, host transfers excluded.
    fn time_w4a16(
        &self,
        ws: &[DeviceW4],
        act: Act,
        m: usize,
        regime: Regime,
        iters: usize,
    ) -> Result<f64>;
    /// Device-to-device copy bandwidth in bytes/s (read + write counted once each: 2·bytes per
    /// copy), copying `bytes` at a time over buffers totalling more than twice the LLC.
    fn copy_bandwidth(&self, bytes: usize, iters: usize) -> Result<f64>;
    /// Seconds per dense bf16 GEMM `[m, k] · [n, k]ᵀ → f32` with the vendor BLAS, cycling over
    /// `copies` weight matrices; `None` where the device has no vendor BLAS.
    fn time_dense_bf16(
        &self,
        n: usize,
        k: usize,
        m: usize,
        copies: usize,
        iters: usize,
    ) -> Result<Option<f64>>;

    /// The regime this device uses for `m` tokens.
    fn regime(&self, m: usize) -> Regime {
        tune::regime(self.arch(), m)
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
    if w.k % 8 != 0 {
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

/// Every device this build can run on: the CPU emulation, then CUDA device 0 and HIP device 0
/// when their feature is on and their runtime loads (a missing runtime is reported on stderr and
/// skipped, unless `KQUANT_REQUIRE_GPU=1`, which makes it a panic). `KQUANT_GPU_ONLY=1` leaves
/// the CPU emulation out: a hardware run at the full Kimi shapes, where replaying every shape on
/// the CPU would take hours.
pub fn devices() -> Vec<Box<dyn Backend>> {
    #[allow(unused_mut)]
    let mut v: Vec<Box<dyn Backend>> = Vec::new();
    if std::env::var("KQUANT_GPU_ONLY").as_deref() != Ok("1") {
        v.push(Box::new(reference::CpuEmu::nvidia()));
    }
    #[cfg(feature = "cuda")]
    match cuda::Cuda::new(0) {
        Ok(d) => v.push(Box::new(d)),
        Err(e) => skip("cuda", &e),
    }
    #[cfg(feature = "hip")]
    match hip::Hip::new(0) {
        Ok(d) => v.push(Box::new(d)),
        Err(e) => skip("hip", &e),
    }
    v
}

/// The device a `--device` flag names: `cpu` (the kernel emulation), `cuda[:N]`, `hip[:N]`.
pub fn open(spec: &str) -> Result<Box<dyn Backend>> {
    let (kind, ordinal) = match spec.split_once(':') {
        Some((k, n)) => (
            k,
            n.parse::<usize>()
                .map_err(|_| GpuError::UnknownDevice(spec.into()))?,
        ),
        None => (spec, 0),
    };
    match kind {
        "cpu" if ordinal == 0 => Ok(Box::new(reference::CpuEmu::nvidia())),
        #[cfg(feature = "cuda")]
        "cuda" => Ok(Box::new(cuda::Cuda::new(ordinal)?)),
        #[cfg(not(feature = "cuda"))]
        "cuda" => Err(GpuError::NotBuilt(spec.into(), "cuda")),
        #[cfg(feature = "hip")]
        "hip" => Ok(Box::new(hip::Hip::new(ordinal)?)),
        #[cfg(not(feature = "hip"))]
        "hip" => Err(GpuError::NotBuilt(spec.into(), "hip")),
        _ => Err(GpuError::UnknownDevice(spec.into())),
    }
}

#[allow(dead_code)]
fn skip(what: &str, e: &GpuError) {
    if std::env::var("KQUANT_REQUIRE_GPU").as_deref() == Ok("1") {
        panic!("KQUANT_REQUIRE_GPU=1 but {what} is unavailable: {e}");
    }
    eprintln!("gpu: {what} SKIPPED: {e}");
}
