//! GPU kernels for INT4 per-output-channel weights (W4A16, W4A8): the kernel weight layout and
//! the CPU repack into it from every checkpoint format kquant writes ([`layout`]), the CPU
//! reference (dequantize + f32 GEMM) and a CPU emulation of the kernels ([`reference`]), the
//! launch geometry ([`tune`]), the kernel source as NVRTC / hipRTC compile it ([`source`]), and
//! the launchers behind cargo features: `cuda` ([`cuda`], cudarc with dynamic loading) and `hip`
//! ([`hip`], libamdhip64 + libhiprtc loaded at run time). Without those features nothing here
//! needs a GPU toolkit. Design and the GPU checks still to run: docs/kernels.md.

pub mod layout;
pub mod reference;
pub mod source;
pub mod tune;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "hip")]
pub mod hip;

pub use layout::W4Layout;

/// Errors of the GPU path (layout checks, missing runtime, driver/compiler failures).
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("kernel layout: {0}")]
    Layout(String),
    #[error("{0} is not supported by this kernel: {1}")]
    Unsupported(&'static str, String),
    #[error("{backend}: {msg}")]
    Backend { backend: &'static str, msg: String },
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

/// Largest M the GEMV kernels (regime A) take.
pub const GEMV_MAX_M: usize = 8;

/// One device that runs the GEMV kernels: `y [m, n] (f32) = x [m, k] · Wᵀ`.
pub trait Backend {
    /// Human name, with the device (e.g. `cuda:0 NVIDIA H100 (sm_90)`).
    fn name(&self) -> String;
    /// W4A16: `x` holds `m × k` activations in `act`.
    fn w4a16(&self, w: &W4Layout, x: &[u16], act: Act, m: usize) -> Result<Vec<f32>>;
    /// W4A8: activations quantized per token to int8 on the device, exact int32 dot products.
    /// Per-channel weights only.
    fn w4a8(&self, w: &W4Layout, x: &[u16], act: Act, m: usize) -> Result<Vec<f32>>;
}

/// Checks every launcher shares (the kernel's preconditions).
pub fn check_gemv(w: &W4Layout, x_len: usize, m: usize) -> Result<()> {
    w.check()?;
    if m == 0 || m > GEMV_MAX_M {
        return Err(GpuError::Unsupported(
            "M",
            format!("the GEMV kernels take 1..={GEMV_MAX_M} rows, got {m}"),
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

/// Every device this build can run on: the CPU emulation always, then CUDA device 0 and HIP
/// device 0 when their feature is on and their runtime loads (a missing runtime is reported on
/// stderr and skipped, unless `KQUANT_REQUIRE_GPU=1`, which makes it a panic).
pub fn devices() -> Vec<Box<dyn Backend>> {
    #[allow(unused_mut)]
    let mut v: Vec<Box<dyn Backend>> = vec![Box::new(reference::CpuEmu)];
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

#[allow(dead_code)]
fn skip(what: &str, e: &GpuError) {
    if std::env::var("KQUANT_REQUIRE_GPU").as_deref() == Ok("1") {
        panic!("KQUANT_REQUIRE_GPU=1 but {what} is unavailable: {e}");
    }
    eprintln!("gpu: {what} SKIPPED: {e}");
}
