//! CUDA launcher (feature `cuda`): cudarc with dynamic loading, so the crate builds with no
//! toolkit and `libcuda` / `libnvrtc` / `libcublas` are only looked for at run time. The kernels
//! ([`super::source::module`]: regimes A, B and C in one module) are compiled by NVRTC for the
//! device's own `sm_XY` on first use; regime C's GEMM is cuBLAS `cublasGemmEx` (bf16/f16 inputs,
//! f32 output and compute). Weights stay on the device ([`super::DeviceW4`]); per call only the
//! activations go up and the result comes back.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublas::{result as blas, sys as blas_sys, CudaBlas};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

use super::layout::{W4Layout, CHUNK};
use super::tune::{self, Arch, Regime};
use super::{check_call, check_w4a8, source, Act, Backend, DeviceW4, GpuError, Result};

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

/// Weights on the device.
struct CudaW4 {
    qweight: CudaSlice<u32>,
    scales: CudaSlice<f32>,
}

/// Reusable device buffers (partials, int8 activations, the dense matrix), grown on demand so
/// that timed loops allocate nothing.
#[derive(Default)]
struct Scratch {
    part: Option<CudaSlice<f32>>,
    part_i: Option<CudaSlice<i32>>,
    dense: Option<CudaSlice<u16>>,
    xq: Option<CudaSlice<i8>>,
    xs: Option<CudaSlice<f32>>,
    xsum: Option<CudaSlice<i32>>,
}

fn grow<'a, T: DeviceRepr + ValidAsZeroBits>(
    slot: &'a mut Option<CudaSlice<T>>,
    len: usize,
    s: &Arc<CudaStream>,
) -> Result<&'a mut CudaSlice<T>> {
    if slot.as_ref().is_none_or(|b| b.len() < len) {
        *slot = Some(s.alloc_zeros::<T>(len.max(1)).map_err(err)?);
    }
    Ok(slot.as_mut().expect("just set"))
}

/// One CUDA device with the kernel module loaded.
pub struct Cuda {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
    /// cuBLAS, or why it could not be loaded (only regime C and the bf16 baseline need it).
    blas: std::result::Result<CudaBlas, String>,
    scratch: Mutex<Scratch>,
    arch: Arch,
    name: String,
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

/// The kernel module compiled by NVRTC for `arch` (`sm_90`, …): needs `libnvrtc`, not a GPU.
pub fn compile(arch: &'static str) -> Result<Ptx> {
    compile_ptx_with_opts(
        source::module(),
        CompileOptions {
            arch: Some(arch),
            options: vec!["-std=c++17".into()],
            ..Default::default()
        },
    )
    .map_err(err)
}

fn cfg(grid: (u32, u32, u32), block: (u32, u32, u32)) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: block,
        shared_mem_bytes: 0,
    }
}

fn elementwise(len: usize) -> LaunchConfig {
    cfg((len.div_ceil(256) as u32, 1, 1), (256, 1, 1))
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
        let module = ctx.load_module(compile(arch_name)?).map_err(err)?;
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
            scratch: Mutex::new(Scratch::default()),
            arch: Arch::from_cuda_cc(major, minor),
            name: format!("cuda:{ordinal} {device} ({arch_name})"),
        })
    }

    fn func(&self, name: &str) -> Result<CudaFunction> {
        self.module.load_function(name).map_err(err)
    }

    fn blas(&self) -> Result<&CudaBlas> {
        self.blas.as_ref().map_err(|e| err(format!("cuBLAS: {e}")))
    }

    /// `out [m, n] f32 = a [m, k] · w [n, k]ᵀ` with cuBLAS (row-major seen as column-major:
    /// `outᵀ = w · aᵀ`, so `op(A) = wᵀ-as-stored`, `op(B) = a`).
    #[allow(clippy::too_many_arguments)]
    fn gemm_ex(
        &self,
        w: &CudaSlice<u16>,
        a: &CudaSlice<u16>,
        out: &mut CudaSlice<f32>,
        n: usize,
        k: usize,
        m: usize,
        act: Act,
    ) -> Result<()> {
        let h = self.blas()?;
        let dt = match act {
            Act::Bf16 => blas_sys::cudaDataType::CUDA_R_16BF,
            Act::F16 => blas_sys::cudaDataType::CUDA_R_16F,
        };
        let (alpha, beta) = (1f32, 0f32);
        let (wp, _rw) = w.device_ptr(&self.stream);
        let (ap, _ra) = a.device_ptr(&self.stream);
        let (op, _ro) = out.device_ptr_mut(&self.stream);
        // SAFETY: w holds n·k, a m·k, out m·n elements (callers size them); the handle is bound
        // to self.stream.
        unsafe {
            blas::gemm_ex(
                *h.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                m as i32,
                k as i32,
                &alpha as *const f32 as *const c_void,
                wp as *const c_void,
                dt,
                k as i32,
                ap as *const c_void,
                dt,
                k as i32,
                &beta as *const f32 as *const c_void,
                op as *mut c_void,
                blas_sys::cudaDataType::CUDA_R_32F,
                n as i32,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(err)
    }

    /// `out[i] = Σ_split part[split][i]` (or a copy for one split).
    fn reduce(
        &self,
        part: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        mn: usize,
        splits: usize,
    ) -> Result<()> {
        let f = self.func(source::SPLITK_REDUCE)?;
        let (mn_i, sp) = (mn as i32, splits as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(part).arg(out).arg(&mn_i).arg(&sp);
        // SAFETY: argument types and counts match `kq_splitk_reduce`; part holds splits·mn.
        unsafe { b.launch(elementwise(mn)) }.map_err(err)?;
        Ok(())
    }

    /// W4A16 on device buffers: `x` (m·k) in, `out` (m·n f32) out.
    #[allow(clippy::too_many_arguments)]
    fn run_w4a16(
        &self,
        w: &CudaW4,
        meta: &DeviceW4,
        x: &CudaSlice<u16>,
        act: Act,
        m: usize,
        regime: Regime,
        out: &mut CudaSlice<f32>,
        sc: &mut Scratch,
    ) -> Result<()> {
        let (n, k, pc) = (meta.n, meta.k, meta.per_channel());
        let (ni, ki, mi, gi) = (n as i32, k as i32, m as i32, meta.group as i32);
        match regime {
            Regime::Gemv => {
                let g = tune::gemv(self.arch, n, k);
                let f = self.func(&source::w4a16_name(act, pc, m))?;
                let cps = g.chunks_per_split as i32;
                let part = grow(&mut sc.part, g.splits * m * n, &self.stream)?;
                let mut b = self.stream.launch_builder(&f);
                b.arg(&w.qweight).arg(&w.scales).arg(x).arg(&mut *part);
                b.arg(&ni).arg(&ki).arg(&gi).arg(&cps);
                // SAFETY: matches `kq_w4a16_gemv_*`; part holds splits·m·n, x m·k (k % 8 == 0).
                unsafe { b.launch(cfg(g.grid, g.block)) }.map_err(err)?;
                self.reduce(part, out, m * n, g.splits)
            }
            Regime::Mma => {
                let g = tune::mma(self.arch, n, k, m, !pc);
                let f = self.func(&source::w4a16_mma_name(act, pc, g.toks))?;
                let tps = g.tiles_per_split as i32;
                let part = grow(&mut sc.part, g.splits * m * n, &self.stream)?;
                let mut b = self.stream.launch_builder(&f);
                b.arg(&w.qweight).arg(&w.scales).arg(x).arg(&mut *part);
                b.arg(&mi).arg(&ni).arg(&ki).arg(&gi).arg(&tps);
                // SAFETY: matches `kq_w4a16_mma_*`; every (split, tok < m, row < n) is written.
                unsafe { b.launch(cfg(g.grid, g.block)) }.map_err(err)?;
                self.reduce(part, out, m * n, g.splits)
            }
            Regime::Dense => {
                let dense = grow(&mut sc.dense, n * k, &self.stream)?;
                let f = self.func(&source::dequant_name(act, pc))?;
                let mut b = self.stream.launch_builder(&f);
                b.arg(&w.qweight).arg(&w.scales).arg(&mut *dense);
                b.arg(&ni).arg(&ki).arg(&gi);
                // SAFETY: matches `kq_w4_dequant_*`; dense holds n·k.
                unsafe { b.launch(cfg(tune::dense(n, k), (tune::DENSE_THREADS, 1, 1))) }
                    .map_err(err)?;
                self.gemm_ex(dense, x, out, n, k, m, act)?;
                if pc {
                    let f = self.func(source::SCALE_COLS)?;
                    let mut b = self.stream.launch_builder(&f);
                    b.arg(&mut *out).arg(&w.scales).arg(&mi).arg(&ni);
                    // SAFETY: matches `kq_scale_cols`; out holds m·n.
                    unsafe { b.launch(elementwise(m * n)) }.map_err(err)?;
                }
                Ok(())
            }
        }
    }

    /// W4A8 on device buffers.
    #[allow(clippy::too_many_arguments)]
    fn run_w4a8(
        &self,
        w: &CudaW4,
        meta: &DeviceW4,
        x: &CudaSlice<u16>,
        act: Act,
        m: usize,
        regime: Regime,
        out: &mut CudaSlice<f32>,
        sc: &mut Scratch,
    ) -> Result<()> {
        let (n, k) = (meta.n, meta.k);
        let (ni, ki, mi) = (n as i32, k as i32, m as i32);
        let kp = k.div_ceil(CHUNK) * CHUNK;
        let xq = grow(&mut sc.xq, m * kp, &self.stream)?;
        let xs = grow(&mut sc.xs, m, &self.stream)?;
        let xsum = grow(&mut sc.xsum, m, &self.stream)?;
        let fq = self.func(&source::quant_act_name(act))?;
        let mut b = self.stream.launch_builder(&fq);
        b.arg(x)
            .arg(&mut *xq)
            .arg(&mut *xs)
            .arg(&mut *xsum)
            .arg(&ki);
        // SAFETY: matches `kq_quant_act_i8_*`; blockDim 256 (a multiple of the warp, ≤ 1024).
        unsafe { b.launch(cfg((m as u32, 1, 1), (256, 1, 1))) }.map_err(err)?;
        match regime {
            Regime::Gemv => {
                let g = tune::gemv(self.arch, n, k);
                let f = self.func(&source::w4a8_name(m))?;
                let cps = g.chunks_per_split as i32;
                let part = grow(&mut sc.part, g.splits * m * n, &self.stream)?;
                let mut b = self.stream.launch_builder(&f);
                b.arg(&w.qweight)
                    .arg(&w.scales)
                    .arg(&*xq)
                    .arg(&*xs)
                    .arg(&*xsum);
                b.arg(&mut *part).arg(&ni).arg(&ki).arg(&cps);
                // SAFETY: matches `kq_w4a8_gemv_m*`; xq is m·kp bytes, 16-byte aligned rows.
                unsafe { b.launch(cfg(g.grid, g.block)) }.map_err(err)?;
                self.reduce(part, out, m * n, g.splits)
            }
            Regime::Mma | Regime::Dense => {
                let g = tune::mma(self.arch, n, k, m, false);
                let f = self.func(&source::w4a8_mma_name(g.toks))?;
                let tps = g.tiles_per_split as i32;
                let part = grow(&mut sc.part_i, g.splits * m * n, &self.stream)?;
                let mut b = self.stream.launch_builder(&f);
                b.arg(&w.qweight).arg(&*xq).arg(&mut *part);
                b.arg(&mi).arg(&ni).arg(&ki).arg(&tps);
                // SAFETY: matches `kq_w4a8_mma_*`; part holds splits·m·n int32.
                unsafe { b.launch(cfg(g.grid, g.block)) }.map_err(err)?;
                let fr = self.func(source::W4A8_REDUCE)?;
                let sp = g.splits as i32;
                let mut b = self.stream.launch_builder(&fr);
                b.arg(&*part)
                    .arg(&w.scales)
                    .arg(&*xs)
                    .arg(&*xsum)
                    .arg(&mut *out);
                b.arg(&mi).arg(&ni).arg(&sp);
                // SAFETY: matches `kq_w4a8_reduce`.
                unsafe { b.launch(elementwise(m * n)) }.map_err(err)?;
                Ok(())
            }
        }
    }

    /// Seconds per call of `f`, with CUDA events around `iters` calls after one warm-up.
    fn time(&self, iters: usize, mut f: impl FnMut(usize) -> Result<()>) -> Result<f64> {
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

impl Backend for Cuda {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn arch(&self) -> Arch {
        self.arch
    }

    fn upload(&self, w: &W4Layout) -> Result<DeviceW4> {
        w.check()?;
        let d = CudaW4 {
            qweight: self.stream.clone_htod(&w.qweight).map_err(err)?,
            scales: self.stream.clone_htod(&w.scales).map_err(err)?,
        };
        Ok(DeviceW4::new(w, Box::new(d)))
    }

    fn w4a16_on(
        &self,
        w: &DeviceW4,
        x: &[u16],
        act: Act,
        m: usize,
        regime: Regime,
    ) -> Result<Vec<f32>> {
        check_call(w, x.len(), m, regime)?;
        let dw = w.get::<CudaW4>("cuda")?;
        let xd = self.stream.clone_htod(x).map_err(err)?;
        let mut out = self.stream.alloc_zeros::<f32>(m * w.n).map_err(err)?;
        let mut sc = self.scratch.lock().expect("scratch");
        self.run_w4a16(dw, w, &xd, act, m, regime, &mut out, &mut sc)?;
        self.stream.clone_dtoh(&out).map_err(err)
    }

    fn w4a8_on(
        &self,
        w: &DeviceW4,
        x: &[u16],
        act: Act,
        m: usize,
        regime: Regime,
    ) -> Result<Vec<f32>> {
        check_call(w, x.len(), m, regime)?;
        check_w4a8(w)?;
        let dw = w.get::<CudaW4>("cuda")?;
        let xd = self.stream.clone_htod(x).map_err(err)?;
        let mut out = self.stream.alloc_zeros::<f32>(m * w.n).map_err(err)?;
        let mut sc = self.scratch.lock().expect("scratch");
        self.run_w4a8(dw, w, &xd, act, m, regime, &mut out, &mut sc)?;
        self.stream.clone_dtoh(&out).map_err(err)
    }

    fn time_w4a16(
        &self,
        ws: &[DeviceW4],
        act: Act,
        m: usize,
        regime: Regime,
        iters: usize,
    ) -> Result<f64> {
        let Some(first) = ws.first() else {
            return Ok(0.0);
        };
        let dws: Vec<&CudaW4> = ws
            .iter()
            .map(|w| w.get::<CudaW4>("cuda"))
            .collect::<Result<_>>()?;
        check_call(first, m * first.k, m, regime)?;
        let xd = self
            .stream
            .clone_htod(&vec![act.from_f32(0.5); m * first.k])
            .map_err(err)?;
        let mut out = self.stream.alloc_zeros::<f32>(m * first.n).map_err(err)?;
        let mut sc = self.scratch.lock().expect("scratch");
        self.time(iters, |i| {
            let j = i % ws.len();
            self.run_w4a16(dws[j], &ws[j], &xd, act, m, regime, &mut out, &mut sc)
        })
    }

    fn copy_bandwidth(&self, bytes: usize, iters: usize) -> Result<f64> {
        let count = (2 * self.arch.tune().llc_bytes).div_ceil(bytes.max(1)) + 1;
        let src: Vec<CudaSlice<u8>> = (0..count)
            .map(|_| self.stream.alloc_zeros::<u8>(bytes))
            .collect::<std::result::Result<_, _>>()
            .map_err(err)?;
        let mut dst = self.stream.alloc_zeros::<u8>(bytes).map_err(err)?;
        let t = self.time(iters, |i| {
            self.stream
                .memcpy_dtod(&src[i % count], &mut dst)
                .map_err(err)
        })?;
        Ok(2.0 * bytes as f64 / t)
    }

    fn time_dense_bf16(
        &self,
        n: usize,
        k: usize,
        m: usize,
        copies: usize,
        iters: usize,
    ) -> Result<Option<f64>> {
        self.blas()?;
        let ws: Vec<CudaSlice<u16>> = (0..copies.max(1))
            .map(|_| self.stream.alloc_zeros::<u16>(n * k))
            .collect::<std::result::Result<_, _>>()
            .map_err(err)?;
        let x = self
            .stream
            .clone_htod(&vec![Act::Bf16.from_f32(0.5); m * k])
            .map_err(err)?;
        let mut out = self.stream.alloc_zeros::<f32>(m * n).map_err(err)?;
        let t = self.time(iters, |i| {
            self.gemm_ex(&ws[i % ws.len()], &x, &mut out, n, k, m, Act::Bf16)
        })?;
        Ok(Some(t))
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
            ] {
                assert!(ptx.contains(&format!(".entry {f}(")), "{arch}: {f}");
            }
            assert!(ptx.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
            assert!(ptx.contains("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"));
        }
    }
}
