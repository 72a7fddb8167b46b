//! The CUDA [`Driver`] (feature `cuda`): cudarc glue with dynamic loading, so the crate builds
//! with no toolkit and `libcuda` / `libnvrtc` / `libcublas` are only looked for at run time. The
//! kernels ([`super::source::module`]: regimes A, B and C in one module) are compiled by NVRTC for
//! the device's own `sm_XY` when the device opens; the vendor GEMM is cuBLAS `cublasGemmEx`
//! (bf16/f16 inputs, f32 output and compute). All work is queued on the context's default
//! stream. What runs when is [`super::dispatch`]'s.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::{result as blas, sys as blas_sys, CudaBlas};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{
    CudaContext, CudaModule, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

use super::driver::{as_bytes, Dim3, Driver, Gemm, Pod};
use super::module_cache;
use super::source::{self, Arg, Kernel};
use super::tune::Arch;
use super::{Act, GpuError, Result};

/// The names the run-time loader (cudarc, built for the CUDA 12.8 API) tries for NVRTC and
/// cuBLAS: CUDA 13 installs without the development links (the `nvidia-*-cu13` wheels, a runtime-
/// only toolkit) ship only `libnvrtc.so.13` / `libcublas.so.13`, which it does not try; linking
/// them as `libnvrtc.so` / `libcublas.so` in a directory on `LD_LIBRARY_PATH` is enough (the H200
/// run in docs/kernels.md did exactly that, with PyTorch's CUDA 13 wheels).
const NVRTC_NAMES: &str = "libnvrtc.so, libnvrtc.so.12, .11, .10; with CUDA 13 link \
    libnvrtc.so.13 as libnvrtc.so (and libcublas.so.13 as libcublas.so) in a directory on \
    LD_LIBRARY_PATH";

fn err(e: impl std::fmt::Debug) -> GpuError {
    GpuError::Backend {
        backend: "cuda",
        msg: format!("{e:?}"),
    }
}

/// One CUDA device with the kernel module loaded.
pub struct Cuda {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
    /// cuBLAS, or why it could not be loaded (only regime C and the bf16 baseline need it).
    blas: std::result::Result<CudaBlas, String>,
    arch: Arch,
    name: String,
    /// Where the kernel module came from (the on-disk cache, or compiled now).
    pub origin: module_cache::Origin,
}

fn sm_name(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 9) => "sm_89",
        (9, 0) => "sm_90",
        (10, 0) => "sm_100",
        (10, 3) => "sm_103",
        (12, 0) => "sm_120",
        _ => "compute_80", // PTX the driver JITs for anything newer
    }
}

/// The NVRTC options besides the architecture.
fn nvrtc_options() -> Vec<String> {
    vec!["-std=c++17".into()]
}

/// The kernel module compiled by NVRTC for `arch` (`sm_90`, …): needs `libnvrtc`, not a GPU.
pub fn compile(arch: &'static str) -> Result<Ptx> {
    compile_ptx_with_opts(
        source::module(),
        CompileOptions {
            arch: Some(arch),
            options: nvrtc_options(),
            ..Default::default()
        },
    )
    .map_err(err)
}

/// NVRTC's version, `NVRTC major.minor` (part of the module cache's key).
fn nvrtc_version() -> Result<String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-parameters, written by NVRTC.
    let rc = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(err(format!("nvrtcVersion: {rc:?}")));
    }
    Ok(format!("NVRTC {major}.{minor}"))
}

/// The module for `arch`: from the on-disk cache when this NVRTC compiled this source for it
/// before, else compiled and stored ([`super::module_cache`]).
pub fn module_ptx(arch: &'static str) -> Result<(Ptx, module_cache::Origin)> {
    let key = module_cache::Key::new(
        "cuda",
        arch,
        &nvrtc_version()?,
        &source::module(),
        &nvrtc_options(),
    );
    let (bytes, origin) =
        module_cache::load_or_compile(module_cache::dir().as_deref(), &key, || {
            compile(arch).map(|p| p.to_src().into_bytes())
        })?;
    let text = String::from_utf8(bytes).map_err(|_| err("the cached module is not PTX text"))?;
    Ok((Ptx::from_src(text), origin))
}

impl Cuda {
    /// Whether `libcuda` and `libnvrtc` can be loaded.
    pub fn available() -> bool {
        // SAFETY: only tries to dlopen the libraries.
        unsafe { cudarc::driver::sys::is_culib_present() && cudarc::nvrtc::sys::is_culib_present() }
    }

    pub fn new(ordinal: usize) -> Result<Cuda> {
        if !Self::available() {
            // SAFETY: only tries to dlopen the libraries.
            let (driver, nvrtc) = unsafe {
                (
                    cudarc::driver::sys::is_culib_present(),
                    cudarc::nvrtc::sys::is_culib_present(),
                )
            };
            let mut missing = Vec::new();
            if !driver {
                missing.push("libcuda.so.1 (the NVIDIA driver)".to_string());
            }
            if !nvrtc {
                missing.push(format!("libnvrtc (NVRTC; looked for as {NVRTC_NAMES})"));
            }
            return Err(GpuError::Backend {
                backend: "cuda",
                msg: format!("not found: {}", missing.join(", ")),
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(err)?;
        let (major, minor) = ctx.compute_capability().map_err(err)?;
        let arch_name = sm_name(major, minor);
        let (ptx, origin) = module_ptx(arch_name)?;
        let module = ctx.load_module(ptx).map_err(err)?;
        let stream = ctx.default_stream();
        // SAFETY: only tries to dlopen the library.
        let blas = if unsafe { blas_sys::is_culib_present() } {
            CudaBlas::new(stream.clone()).map_err(|e| format!("{e:?}"))
        } else {
            Err("libcublas not found (looked for as libcublas.so, libcublas.so.12, …; with CUDA 13 \
                 link libcublas.so.13 as libcublas.so in a directory on LD_LIBRARY_PATH)"
                .into())
        };
        let device = ctx.name().unwrap_or_else(|_| "?".into());
        Ok(Cuda {
            ctx,
            stream,
            module,
            blas,
            arch: Arch::from_cuda_cc(major, minor),
            name: format!("cuda:{ordinal} {device} ({arch_name})"),
            origin,
        })
    }

    fn blas(&self) -> Result<&CudaBlas> {
        self.blas.as_ref().map_err(|e| err(format!("cuBLAS: {e}")))
    }
}

impl Driver for Cuda {
    type Buf = CudaSlice<u8>;
    const BACKEND: &'static str = "cuda";

    fn module_origin(&self) -> Option<String> {
        Some(self.origin.describe())
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn arch(&self) -> Arch {
        self.arch
    }

    fn alloc(&self, bytes: usize) -> Result<CudaSlice<u8>> {
        self.stream.alloc_zeros::<u8>(bytes.max(1)).map_err(err)
    }

    fn size(buf: &CudaSlice<u8>) -> usize {
        buf.len()
    }

    fn htod<T: Pod>(&self, host: &[T]) -> Result<CudaSlice<u8>> {
        self.stream.clone_htod(as_bytes(host)).map_err(err)
    }

    fn dtoh_f32(&self, buf: &CudaSlice<u8>, n: usize) -> Result<Vec<f32>> {
        // SAFETY: every bit pattern is an f32; `transmute` checks that n of them fit.
        let view = unsafe { buf.transmute::<f32>(n) }
            .ok_or_else(|| err(format!("{n} f32 read from a {}-byte buffer", buf.len())))?;
        self.stream.clone_dtoh(&view).map_err(err)
    }

    fn dtoh_i32(&self, buf: &CudaSlice<u8>, n: usize) -> Result<Vec<i32>> {
        // SAFETY: every bit pattern is an i32; `transmute` checks that n of them fit.
        let view = unsafe { buf.transmute::<i32>(n) }
            .ok_or_else(|| err(format!("{n} int32 read from a {}-byte buffer", buf.len())))?;
        self.stream.clone_dtoh(&view).map_err(err)
    }

    unsafe fn launch(&self, kernel: &Kernel<'_, Self::Buf>, grid: Dim3, block: Dim3) -> Result<()> {
        let f = self.module.load_function(&kernel.name()).map_err(err)?;
        let args = kernel.args();
        let mut b = self.stream.launch_builder(&f);
        for a in &args {
            match a {
                Arg::Buf(p) => b.arg(*p),
                Arg::Int(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: block,
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments are the kernel's C signature (`Kernel::args`); the buffer sizes
        // and geometry are the caller's contract (`Driver::launch`).
        unsafe { b.launch(cfg) }.map_err(err)?;
        Ok(())
    }

    unsafe fn gemm(
        &self,
        g: Gemm,
        w: &CudaSlice<u8>,
        a: &CudaSlice<u8>,
        out: &CudaSlice<u8>,
    ) -> Result<()> {
        let h = self.blas()?;
        let dt = match g.act {
            Act::Bf16 => blas_sys::cudaDataType::CUDA_R_16BF,
            Act::F16 => blas_sys::cudaDataType::CUDA_R_16F,
        };
        let (n, k, m) = (g.n as i32, g.k as i32, g.m as i32);
        let (alpha, beta) = (1f32, 0f32);
        let (wp, _rw) = w.device_ptr(&self.stream);
        let (ap, _ra) = a.device_ptr(&self.stream);
        let (op, _ro) = out.device_ptr(&self.stream);
        // SAFETY: the sizes are the caller's contract (`Driver::gemm`); the handle is bound to
        // self.stream.
        unsafe {
            blas::gemm_ex(
                *h.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                n,
                m,
                k,
                &alpha as *const f32 as *const c_void,
                wp as *const c_void,
                dt,
                k,
                ap as *const c_void,
                dt,
                k,
                &beta as *const f32 as *const c_void,
                op as *mut c_void,
                blas_sys::cudaDataType::CUDA_R_32F,
                n,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(err)
    }

    fn copy(&self, src: &CudaSlice<u8>, dst: &mut CudaSlice<u8>) -> Result<()> {
        self.stream.memcpy_dtod(src, dst).map_err(err)
    }

    fn time(&self, iters: usize, f: &mut dyn FnMut(usize) -> Result<()>) -> Result<f64> {
        f(0)?;
        let start = self
            .ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(err)?;
        let end = self
            .ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(err)?;
        start.record(&self.stream).map_err(err)?;
        for i in 0..iters.max(1) {
            f(i + 1)?;
        }
        end.record(&self.stream).map_err(err)?;
        let ms = start.elapsed_ms(&end).map_err(err)?;
        Ok(ms as f64 / 1e3 / iters.max(1) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVRTC compiles the header-free single-TU module for every arch the launcher can ask for
    /// (no GPU needed, only `libnvrtc`; run with `LD_LIBRARY_PATH` pointing at one, e.g. the
    /// PyPI `nvidia-cuda-nvrtc` wheel that kernels/check.sh installs). Ignored unless asked for
    /// (`-- --include-ignored`, as .ci/run does), and then a missing NVRTC is a failure.
    #[test]
    #[ignore = "needs libnvrtc on LD_LIBRARY_PATH (kernels/check.sh installs it; .ci/run runs this)"]
    fn nvrtc_compiles_the_module() {
        // SAFETY: only tries to dlopen the library.
        assert!(
            unsafe { cudarc::nvrtc::sys::is_culib_present() },
            "libnvrtc does not load: link libnvrtc.so.13 as libnvrtc.so in a directory on \
             LD_LIBRARY_PATH ({NVRTC_NAMES})"
        );
        for arch in ["sm_80", "sm_90", "sm_100", "sm_120"] {
            let ptx = compile(arch)
                .unwrap_or_else(|e| panic!("{arch}: {e}"))
                .to_src();
            for f in [
                source::w4a16_name(Act::Bf16, true, 8),
                source::w4a16_mma_name(Act::F16, false, 64),
                source::w4a8_mma_name(128),
                source::dequant_name(Act::Bf16, false),
                source::W4A8_REDUCE.to_string(),
                source::ARGMAX_ROWS.to_string(),
            ] {
                assert!(ptx.contains(&format!(".entry {f}(")), "{arch}: {f}");
            }
            assert!(ptx.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
            assert!(ptx.contains("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"));
        }
    }
}
