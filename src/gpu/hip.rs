//! HIP launcher (feature `hip`): a minimal binding that loads `libamdhip64` and `libhiprtc` at
//! run time with `libloading` (no ROCm at build time; the choice is argued in docs/kernels.md).
//! The kernels are compiled by hipRTC for `KQUANT_HIP_ARCH` (default `gfx942`, MI300X/MI325X):
//! reading `gcnArchName` needs the version-dependent `hipDeviceProp_t` layout, left for the
//! first run on AMD hardware.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::ptr;

use libloading::Library;

use super::layout::{W4Layout, CHUNK};
use super::tune::{self, Arch};
use super::{check_gemv, source, Act, Backend, GpuError, Result};

type HipError = c_int;
type Module = *mut c_void;
type Function = *mut c_void;
type Program = *mut c_void;
const HIP_MEMCPY_HOST_TO_DEVICE: c_int = 1;
const HIP_MEMCPY_DEVICE_TO_HOST: c_int = 2;

fn err(msg: impl Into<String>) -> GpuError {
    GpuError::Backend {
        backend: "hip",
        msg: msg.into(),
    }
}

fn open(names: &[&str]) -> Result<Library> {
    for n in names {
        // SAFETY: loading the vendor runtime runs its initialisers, as linking would.
        if let Ok(l) = unsafe { Library::new(n) } {
            return Ok(l);
        }
    }
    Err(err(format!("none of {names:?} could be loaded")))
}

/// The HIP runtime and hipRTC entry points kquant uses.
struct Api {
    hip: Library,
    rtc: Library,
}

macro_rules! sym {
    ($lib:expr, $name:literal, $ty:ty) => {{
        // SAFETY: the signature is the one in hip_runtime_api.h / hiprtc.h.
        let s: libloading::Symbol<$ty> = unsafe { $lib.get(concat!($name, "\0").as_bytes()) }
            .map_err(|e| err(format!("{}: {e}", $name)))?;
        s
    }};
}

impl Api {
    fn check(&self, what: &str, e: HipError) -> Result<()> {
        if e == 0 {
            Ok(())
        } else {
            Err(err(format!("{what} failed with hipError_t {e}")))
        }
    }

    fn malloc_copy<T: Copy>(&self, host: &[T]) -> Result<DevBuf<'_>> {
        let b = self.malloc(std::mem::size_of_val(host))?;
        let f = sym!(
            self.hip,
            "hipMemcpy",
            unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> HipError
        );
        // SAFETY: b.ptr has room for the whole slice.
        self.check("hipMemcpy", unsafe {
            f(
                b.ptr,
                host.as_ptr() as *const c_void,
                b.bytes,
                HIP_MEMCPY_HOST_TO_DEVICE,
            )
        })?;
        Ok(b)
    }

    fn malloc(&self, bytes: usize) -> Result<DevBuf<'_>> {
        let f = sym!(
            self.hip,
            "hipMalloc",
            unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError
        );
        let z = sym!(
            self.hip,
            "hipMemset",
            unsafe extern "C" fn(*mut c_void, c_int, usize) -> HipError
        );
        let mut p = ptr::null_mut();
        // SAFETY: out-pointer to a local.
        self.check("hipMalloc", unsafe { f(&mut p, bytes.max(1)) })?;
        let b = DevBuf {
            api: self,
            ptr: p,
            bytes,
        };
        // SAFETY: p points at `bytes` device bytes.
        self.check("hipMemset", unsafe { z(p, 0, bytes.max(1)) })?;
        Ok(b)
    }

    fn read_f32(&self, b: &DevBuf, n: usize) -> Result<Vec<f32>> {
        let f = sym!(
            self.hip,
            "hipMemcpy",
            unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> HipError
        );
        let mut v = vec![0f32; n];
        // SAFETY: the device buffer holds at least n f32 (callers size it).
        self.check("hipMemcpy", unsafe {
            f(
                v.as_mut_ptr() as *mut c_void,
                b.ptr,
                n * 4,
                HIP_MEMCPY_DEVICE_TO_HOST,
            )
        })?;
        Ok(v)
    }

    /// Launch `name` with `args` (pointers to each argument value) and wait for it.
    fn launch(
        &self,
        module: Module,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        args: &mut [*mut c_void],
    ) -> Result<()> {
        let get = sym!(
            self.hip,
            "hipModuleGetFunction",
            unsafe extern "C" fn(*mut Function, Module, *const c_char) -> HipError
        );
        let launch = sym!(
            self.hip,
            "hipModuleLaunchKernel",
            unsafe extern "C" fn(
                Function,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                c_uint,
                *mut c_void,
                *mut *mut c_void,
                *mut *mut c_void,
            ) -> HipError
        );
        let sync = sym!(
            self.hip,
            "hipDeviceSynchronize",
            unsafe extern "C" fn() -> HipError
        );
        let cname = CString::new(name).unwrap();
        let mut f = ptr::null_mut();
        // SAFETY: module is a loaded code object; name is NUL-terminated.
        self.check("hipModuleGetFunction", unsafe {
            get(&mut f, module, cname.as_ptr())
        })?;
        // SAFETY: args match the kernel's parameter list (callers build them from the .cu).
        self.check(name, unsafe {
            launch(
                f,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                0,
                ptr::null_mut(),
                args.as_mut_ptr(),
                ptr::null_mut(),
            )
        })?;
        // SAFETY: no arguments.
        self.check("hipDeviceSynchronize", unsafe { sync() })
    }
}

/// A device allocation, freed on drop.
struct DevBuf<'a> {
    api: &'a Api,
    ptr: *mut c_void,
    bytes: usize,
}

impl Drop for DevBuf<'_> {
    fn drop(&mut self) {
        if let Ok(f) = unsafe {
            self.api
                .hip
                .get::<unsafe extern "C" fn(*mut c_void) -> HipError>(b"hipFree\0")
        } {
            // SAFETY: ptr came from hipMalloc and is freed once.
            unsafe { f(self.ptr) };
        }
    }
}

/// One HIP device with the GEMV module loaded.
pub struct Hip {
    api: Api,
    module: Module,
    name: String,
}

impl Hip {
    pub fn new(ordinal: usize) -> Result<Hip> {
        let api = Api {
            hip: open(&["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"])?,
            rtc: open(&["libhiprtc.so", "libhiprtc.so.6", "libhiprtc.so.5"])?,
        };
        let init = sym!(api.hip, "hipInit", unsafe extern "C" fn(c_uint) -> HipError);
        let set = sym!(
            api.hip,
            "hipSetDevice",
            unsafe extern "C" fn(c_int) -> HipError
        );
        // SAFETY: plain calls.
        api.check("hipInit", unsafe { init(0) })?;
        api.check("hipSetDevice", unsafe { set(ordinal as c_int) })?;
        let arch = std::env::var("KQUANT_HIP_ARCH").unwrap_or_else(|_| "gfx942".into());
        let code = Self::compile(&api, &arch)?;
        let load = sym!(
            api.hip,
            "hipModuleLoadData",
            unsafe extern "C" fn(*mut Module, *const c_void) -> HipError
        );
        let mut module = ptr::null_mut();
        // SAFETY: code is a complete code object from hipRTC.
        api.check("hipModuleLoadData", unsafe {
            load(&mut module, code.as_ptr() as *const c_void)
        })?;
        Ok(Hip {
            api,
            module,
            name: format!("hip:{ordinal} ({arch})"),
        })
    }

    fn compile(api: &Api, arch: &str) -> Result<Vec<u8>> {
        let create = sym!(
            api.rtc,
            "hiprtcCreateProgram",
            unsafe extern "C" fn(
                *mut Program,
                *const c_char,
                *const c_char,
                c_int,
                *const *const c_char,
                *const *const c_char,
            ) -> c_int
        );
        let compile = sym!(
            api.rtc,
            "hiprtcCompileProgram",
            unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int
        );
        let log_size = sym!(
            api.rtc,
            "hiprtcGetProgramLogSize",
            unsafe extern "C" fn(Program, *mut usize) -> c_int
        );
        let log = sym!(
            api.rtc,
            "hiprtcGetProgramLog",
            unsafe extern "C" fn(Program, *mut c_char) -> c_int
        );
        let code_size = sym!(
            api.rtc,
            "hiprtcGetCodeSize",
            unsafe extern "C" fn(Program, *mut usize) -> c_int
        );
        let get_code = sym!(
            api.rtc,
            "hiprtcGetCode",
            unsafe extern "C" fn(Program, *mut c_char) -> c_int
        );
        let destroy = sym!(
            api.rtc,
            "hiprtcDestroyProgram",
            unsafe extern "C" fn(*mut Program) -> c_int
        );
        let src = CString::new(source::w4_gemv()).unwrap();
        let name = CString::new("w4_gemv.cu").unwrap();
        let opts: Vec<CString> = [
            format!("--offload-arch={arch}"),
            "-O3".into(),
            "-std=c++17".into(),
        ]
        .into_iter()
        .map(|s| CString::new(s).unwrap())
        .collect();
        let optp: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog = ptr::null_mut();
        // SAFETY: all strings NUL-terminated and alive for the calls; no headers passed.
        unsafe {
            if create(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                0,
                ptr::null(),
                ptr::null(),
            ) != 0
            {
                return Err(err("hiprtcCreateProgram failed"));
            }
            let rc = compile(prog, optp.len() as c_int, optp.as_ptr());
            if rc != 0 {
                let mut n = 0;
                log_size(prog, &mut n);
                let mut buf = vec![0u8; n.max(1)];
                log(prog, buf.as_mut_ptr() as *mut c_char);
                destroy(&mut prog);
                return Err(err(format!(
                    "hipRTC for {arch}: {}",
                    String::from_utf8_lossy(&buf)
                )));
            }
            let mut n = 0;
            code_size(prog, &mut n);
            let mut code = vec![0u8; n];
            get_code(prog, code.as_mut_ptr() as *mut c_char);
            destroy(&mut prog);
            Ok(code)
        }
    }

    fn reduce(&self, part: &DevBuf, m: usize, n: usize, splits: usize) -> Result<Vec<f32>> {
        if splits == 1 {
            return self.api.read_f32(part, m * n);
        }
        let out = self.api.malloc(m * n * 4)?;
        let (mut pp, mut op, mut mn, mut sp) =
            (part.ptr, out.ptr, (m * n) as c_int, splits as c_int);
        let mut args = [arg(&mut pp), arg(&mut op), arg(&mut mn), arg(&mut sp)];
        self.api.launch(
            self.module,
            source::SPLITK_REDUCE,
            ((m * n).div_ceil(256) as u32, 1, 1),
            (256, 1, 1),
            &mut args,
        )?;
        self.api.read_f32(&out, m * n)
    }
}

fn arg<T>(v: &mut T) -> *mut c_void {
    v as *mut T as *mut c_void
}

impl Backend for Hip {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn w4a16(&self, w: &W4Layout, x: &[u16], act: Act, m: usize) -> Result<Vec<f32>> {
        check_gemv(w, x.len(), m)?;
        let g = tune::gemv(Arch::Gfx942, w.n, w.k);
        let (qw, sc, xd) = (
            self.api.malloc_copy(&w.qweight)?,
            self.api.malloc_copy(&w.scales)?,
            self.api.malloc_copy(x)?,
        );
        let part = self.api.malloc(g.splits * m * w.n * 4)?;
        let (mut a0, mut a1, mut a2, mut a3) = (qw.ptr, sc.ptr, xd.ptr, part.ptr);
        let (mut n, mut k, mut grp, mut cps) = (
            w.n as c_int,
            w.k as c_int,
            w.group as c_int,
            g.chunks_per_split as c_int,
        );
        let mut args = [
            arg(&mut a0),
            arg(&mut a1),
            arg(&mut a2),
            arg(&mut a3),
            arg(&mut n),
            arg(&mut k),
            arg(&mut grp),
            arg(&mut cps),
        ];
        self.api.launch(
            self.module,
            &source::w4a16_name(act, w.per_channel(), m),
            g.grid,
            g.block,
            &mut args,
        )?;
        self.reduce(&part, m, w.n, g.splits)
    }

    fn w4a8(&self, w: &W4Layout, x: &[u16], act: Act, m: usize) -> Result<Vec<f32>> {
        check_gemv(w, x.len(), m)?;
        if !w.per_channel() {
            return Err(GpuError::Unsupported(
                "W4A8 group size",
                "per channel only".into(),
            ));
        }
        let g = tune::gemv(Arch::Gfx942, w.n, w.k);
        let kp = w.k.div_ceil(CHUNK) * CHUNK;
        let xd = self.api.malloc_copy(x)?;
        let (xq, xs, xsum) = (
            self.api.malloc(m * kp)?,
            self.api.malloc(m * 4)?,
            self.api.malloc(m * 4)?,
        );
        let (mut p0, mut p1, mut p2, mut p3, mut k) =
            (xd.ptr, xq.ptr, xs.ptr, xsum.ptr, w.k as c_int);
        let mut args = [
            arg(&mut p0),
            arg(&mut p1),
            arg(&mut p2),
            arg(&mut p3),
            arg(&mut k),
        ];
        self.api.launch(
            self.module,
            &source::quant_act_name(act),
            (m as u32, 1, 1),
            (256, 1, 1),
            &mut args,
        )?;
        let (qw, sc) = (
            self.api.malloc_copy(&w.qweight)?,
            self.api.malloc_copy(&w.scales)?,
        );
        let part = self.api.malloc(g.splits * m * w.n * 4)?;
        let (mut a0, mut a1, mut a2, mut a3, mut a4, mut a5) =
            (qw.ptr, sc.ptr, xq.ptr, xs.ptr, xsum.ptr, part.ptr);
        let (mut n, mut cps) = (w.n as c_int, g.chunks_per_split as c_int);
        let mut args = [
            arg(&mut a0),
            arg(&mut a1),
            arg(&mut a2),
            arg(&mut a3),
            arg(&mut a4),
            arg(&mut a5),
            arg(&mut n),
            arg(&mut k),
            arg(&mut cps),
        ];
        self.api.launch(
            self.module,
            &source::w4a8_name(m),
            g.grid,
            g.block,
            &mut args,
        )?;
        self.reduce(&part, m, w.n, g.splits)
    }
}
