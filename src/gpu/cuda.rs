//! CUDA launcher (feature `cuda`): cudarc with dynamic loading, so the crate builds with no
//! toolkit and `libcuda` / `libnvrtc` are only looked for at run time. The kernels are compiled
//! by NVRTC for the device's own `sm_XY` on first use ([`super::source::w4_gemv`]).

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use super::layout::{W4Layout, CHUNK};
use super::tune::{self, Arch};
use super::{check_gemv, source, Act, Backend, GpuError, Result};

fn err(e: impl std::fmt::Debug) -> GpuError {
    GpuError::Backend {
        backend: "cuda",
        msg: format!("{e:?}"),
    }
}

/// One CUDA device with the GEMV module loaded.
pub struct Cuda {
    stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
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

impl Cuda {
    /// Whether `libcuda` and `libnvrtc` can be loaded.
    pub fn available() -> bool {
        // SAFETY: only tries to dlopen the libraries.
        unsafe { cudarc::driver::sys::is_culib_present() && cudarc::nvrtc::sys::is_culib_present() }
    }

    pub fn new(ordinal: usize) -> Result<Cuda> {
        if !Self::available() {
            return Err(err(
                "libcuda / libnvrtc not found (no NVIDIA driver or NVRTC)",
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(err)?;
        let (major, minor) = ctx.compute_capability().map_err(err)?;
        let arch_name = sm_name(major, minor);
        let ptx = compile_ptx_with_opts(
            source::w4_gemv(),
            CompileOptions {
                arch: Some(arch_name),
                options: vec!["-std=c++17".into()],
                ..Default::default()
            },
        )
        .map_err(err)?;
        let module = ctx.load_module(ptx).map_err(err)?;
        Ok(Cuda {
            stream: ctx.default_stream(),
            module,
            arch: Arch::from_cuda_cc(major, minor),
            name: format!("cuda:{ordinal} ({arch_name})"),
        })
    }

    /// Run a GEMV kernel whose output is split-K partials, then reduce them.
    fn finish(&self, part: CudaSlice<f32>, m: usize, n: usize, splits: usize) -> Result<Vec<f32>> {
        if splits == 1 {
            return self.stream.clone_dtoh(&part).map_err(err);
        }
        let f = self
            .module
            .load_function(source::SPLITK_REDUCE)
            .map_err(err)?;
        let mut out = self.stream.alloc_zeros::<f32>(m * n).map_err(err)?;
        let (mn, sp) = ((m * n) as i32, splits as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&part).arg(&mut out).arg(&mn).arg(&sp);
        // SAFETY: argument types and counts match `kq_splitk_reduce`.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: ((m * n).div_ceil(256) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(err)?;
        self.stream.clone_dtoh(&out).map_err(err)
    }
}

impl Backend for Cuda {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn w4a16(&self, w: &W4Layout, x: &[u16], act: Act, m: usize) -> Result<Vec<f32>> {
        check_gemv(w, x.len(), m)?;
        let g = tune::gemv(self.arch, w.n, w.k);
        let s = &self.stream;
        let f = self
            .module
            .load_function(&source::w4a16_name(act, w.per_channel(), m))
            .map_err(err)?;
        let qw = s.clone_htod(&w.qweight).map_err(err)?;
        let sc = s.clone_htod(&w.scales).map_err(err)?;
        let xd = s.clone_htod(x).map_err(err)?;
        let mut part = s.alloc_zeros::<f32>(g.splits * m * w.n).map_err(err)?;
        let (n, k, group, cps) = (
            w.n as i32,
            w.k as i32,
            w.group as i32,
            g.chunks_per_split as i32,
        );
        let mut b = s.launch_builder(&f);
        b.arg(&qw).arg(&sc).arg(&xd).arg(&mut part);
        b.arg(&n).arg(&k).arg(&group).arg(&cps);
        // SAFETY: argument types and counts match `kq_w4a16_gemv_*`; buffers sized by the layout
        // check (qweight rows are whole 16-byte chunks, x is m·k with k % 8 == 0).
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: g.grid,
                block_dim: g.block,
                shared_mem_bytes: 0,
            })
        }
        .map_err(err)?;
        self.finish(part, m, w.n, g.splits)
    }

    fn w4a8(&self, w: &W4Layout, x: &[u16], act: Act, m: usize) -> Result<Vec<f32>> {
        check_gemv(w, x.len(), m)?;
        if !w.per_channel() {
            return Err(GpuError::Unsupported(
                "W4A8 group size",
                "per channel only".into(),
            ));
        }
        let g = tune::gemv(self.arch, w.n, w.k);
        let s = &self.stream;
        let kp = w.k.div_ceil(CHUNK) * CHUNK;
        let xd = s.clone_htod(x).map_err(err)?;
        let mut xq = s.alloc_zeros::<i8>(m * kp).map_err(err)?;
        let mut xs = s.alloc_zeros::<f32>(m).map_err(err)?;
        let mut xsum = s.alloc_zeros::<i32>(m).map_err(err)?;
        let k = w.k as i32;
        let fq = self
            .module
            .load_function(&source::quant_act_name(act))
            .map_err(err)?;
        let mut b = s.launch_builder(&fq);
        b.arg(&xd).arg(&mut xq).arg(&mut xs).arg(&mut xsum).arg(&k);
        // SAFETY: matches `kq_quant_act_i8_*`; blockDim 256 (a multiple of the warp, ≤ 1024).
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (m as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(err)?;
        let f = self
            .module
            .load_function(&source::w4a8_name(m))
            .map_err(err)?;
        let qw = s.clone_htod(&w.qweight).map_err(err)?;
        let sc = s.clone_htod(&w.scales).map_err(err)?;
        let mut part = s.alloc_zeros::<f32>(g.splits * m * w.n).map_err(err)?;
        let (n, cps) = (w.n as i32, g.chunks_per_split as i32);
        let mut b = s.launch_builder(&f);
        b.arg(&qw)
            .arg(&sc)
            .arg(&xq)
            .arg(&xs)
            .arg(&xsum)
            .arg(&mut part);
        b.arg(&n).arg(&k).arg(&cps);
        // SAFETY: matches `kq_w4a8_gemv_m*`; xq is m·kp bytes, 16-byte aligned rows.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: g.grid,
                block_dim: g.block,
                shared_mem_bytes: 0,
            })
        }
        .map_err(err)?;
        self.finish(part, m, w.n, g.splits)
    }
}
