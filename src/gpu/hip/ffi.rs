//! The HIP runtime as kquant loads it (feature `hip`): the `libloading` tables of
//! `libamdhip64` (memory, modules, launches, events), `libhiprtc` (or, before ROCm 5.3, the
//! hipRTC inside `libamdhip64`) and `libhipblas`, each entry point typed as in
//! `hip_runtime_api.h` / `hiprtc.h` / `hipblas.h`, and device allocations freed on drop. No ROCm
//! at build time.
//!
//! hipBLAS `GemmEx` changed its enum types between releases: hipBLAS 2.x (ROCm 6) exports
//! `hipblasGemmEx` with `hipblasDatatype_t` (`HIPBLAS_R_16B = 168`, …) and `hipblasGemmEx_v2`
//! with `hipDataType` (`HIP_R_16BF = 14`, …) + `hipblasComputeType_t`; hipBLAS 3.0 (ROCm 7)
//! made the v2 signature the plain name. We use `_v2` when exported, the plain name with v2
//! enums from `libhipblas.so.3` on, v1 enums otherwise; `KQUANT_HIPBLAS_API=v1|v2` overrides.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::ptr;
use std::sync::Arc;

use libloading::Library;

use super::super::driver::{from_bytes, Gemm, Pod};
use super::super::{Act, GpuError, Result};

pub(super) type HipError = c_int;
pub(super) type Module = *mut c_void;
pub(super) type Function = *mut c_void;
type Program = *mut c_void;
type Event = *mut c_void;
const HIP_MEMCPY_HOST_TO_DEVICE: c_int = 1;
const HIP_MEMCPY_DEVICE_TO_HOST: c_int = 2;
pub(super) const HIP_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;

pub(super) fn err(msg: impl Into<String>) -> GpuError {
    GpuError::Backend {
        backend: "hip",
        msg: msg.into(),
    }
}

fn open(names: &[&'static str]) -> Result<(Library, &'static str)> {
    for n in names {
        // SAFETY: loading the vendor runtime runs its initialisers, as linking would.
        if let Ok(l) = unsafe { Library::new(n) } {
            return Ok((l, n));
        }
    }
    Err(err(format!("none of {names:?} could be loaded")))
}

macro_rules! sym {
    ($lib:expr, $name:literal, $ty:ty) => {{
        // SAFETY: the signature is the one in hip_runtime_api.h / hiprtc.h / hipblas.h.
        let s: libloading::Symbol<$ty> = unsafe { $lib.get(concat!($name, "\0").as_bytes()) }
            .map_err(|e| err(format!("{}: {e}", $name)))?;
        *s
    }};
}
pub(super) use sym;

type Malloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError;
type Free = unsafe extern "C" fn(*mut c_void) -> HipError;
type Memcpy = unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> HipError;
type Memset = unsafe extern "C" fn(*mut c_void, c_int, usize) -> HipError;
type GetFunction = unsafe extern "C" fn(*mut Function, Module, *const c_char) -> HipError;
type LaunchKernel = unsafe extern "C" fn(
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
) -> HipError;
type NoArgs = unsafe extern "C" fn() -> HipError;
type EventCreate = unsafe extern "C" fn(*mut Event) -> HipError;
type EventRecord = unsafe extern "C" fn(Event, *mut c_void) -> HipError;
type EventSync = unsafe extern "C" fn(Event) -> HipError;
type EventElapsed = unsafe extern "C" fn(*mut f32, Event, Event) -> HipError;
type EventDestroy = unsafe extern "C" fn(Event) -> HipError;
/// `hipblasGemmEx` (either enum flavour: both are C `int`s on the wire).
type GemmEx = unsafe extern "C" fn(
    *mut c_void,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    *mut c_void,
    c_int,
    c_int,
    c_int,
    c_int,
) -> c_int;

/// hipBLAS, loaded and with a handle.
pub(super) struct Blas {
    _lib: Library,
    handle: *mut c_void,
    gemm_ex: GemmEx,
    /// `hipDataType` + `hipblasComputeType_t` (v2) or `hipblasDatatype_t` (v1).
    v2: bool,
}

// SAFETY: the handle is plain data; the owner uses it from one thread at a time (behind a mutex).
unsafe impl Send for Blas {}

impl Blas {
    pub(super) fn load() -> Result<Blas> {
        let (lib, name) = open(&[
            "libhipblas.so.3",
            "libhipblas.so.2",
            "libhipblas.so.1",
            "libhipblas.so.0",
            "libhipblas.so",
        ])?;
        let create = sym!(
            lib,
            "hipblasCreate",
            unsafe extern "C" fn(*mut *mut c_void) -> c_int
        );
        // SAFETY: the symbol lookup only reads the library's export table.
        let v2_sym: Option<GemmEx> = unsafe { lib.get::<GemmEx>(b"hipblasGemmEx_v2\0") }
            .ok()
            .map(|s| *s);
        let forced = std::env::var("KQUANT_HIPBLAS_API").ok();
        let (gemm_ex, v2) = match (v2_sym, forced.as_deref()) {
            (Some(f), None | Some("v2")) => (f, true),
            (_, Some("v1")) => (sym!(lib, "hipblasGemmEx", GemmEx), false),
            (_, Some("v2")) => (sym!(lib, "hipblasGemmEx", GemmEx), true),
            _ => (
                sym!(lib, "hipblasGemmEx", GemmEx),
                name == "libhipblas.so.3",
            ),
        };
        let mut handle = ptr::null_mut();
        // SAFETY: out-pointer to a local.
        let rc = unsafe { create(&mut handle) };
        if rc != 0 {
            return Err(err(format!("hipblasCreate failed with status {rc}")));
        }
        Ok(Blas {
            _lib: lib,
            handle,
            gemm_ex,
            v2,
        })
    }

    /// The enum value of `act` (`None`: f32) in this hipBLAS's flavour.
    fn dtype(&self, act: Option<Act>) -> c_int {
        match (self.v2, act) {
            (true, Some(Act::Bf16)) => 14,   // HIP_R_16BF
            (true, Some(Act::F16)) => 2,     // HIP_R_16F
            (true, None) => 0,               // HIP_R_32F
            (false, Some(Act::Bf16)) => 168, // HIPBLAS_R_16B
            (false, Some(Act::F16)) => 150,  // HIPBLAS_R_16F
            (false, None) => 151,            // HIPBLAS_R_32F
        }
    }

    /// `out [m, n] f32 = a [m, k] · w [n, k]ᵀ` (column-major view, as cuBLAS), queued.
    ///
    /// # Safety
    /// `w` must hold `n·k`, `a` `m·k` elements of `g.act` and `out` `m·n` f32.
    pub(super) unsafe fn gemm_ex(
        &mut self,
        g: Gemm,
        w: *mut c_void,
        a: *mut c_void,
        out: *mut c_void,
    ) -> Result<()> {
        let (n, k, m) = (g.n as c_int, g.k as c_int, g.m as c_int);
        let (alpha, beta) = (1f32, 0f32);
        let compute = if self.v2 { 2 } else { self.dtype(None) }; // HIPBLAS_COMPUTE_32F / R_32F
        let dt = self.dtype(Some(g.act));
        // SAFETY: sizes per the contract above; 111/112 = HIPBLAS_OP_N/T, 160 =
        // HIPBLAS_GEMM_DEFAULT; `&mut self` keeps the handle to one caller.
        let rc = unsafe {
            (self.gemm_ex)(
                self.handle,
                112,
                111,
                n,
                m,
                k,
                &alpha as *const f32 as *const c_void,
                w,
                dt,
                k,
                a,
                dt,
                k,
                &beta as *const f32 as *const c_void,
                out,
                self.dtype(None),
                n,
                compute,
                160,
            )
        };
        if rc != 0 {
            return Err(err(format!(
                "hipblasGemmEx ({} enums) failed with status {rc}",
                if self.v2 { "v2" } else { "v1" }
            )));
        }
        Ok(())
    }
}

/// The HIP runtime entry points kquant uses, resolved once.
pub(super) struct Api {
    pub(super) hip: Library,
    rtc: Library,
    /// hipRTC came from libamdhip64 (ROCm < 5.3, whose comgr predates gfx94x).
    pub(super) rtc_in_hip: bool,
    malloc: Malloc,
    free: Free,
    pub(super) memcpy: Memcpy,
    memset: Memset,
    pub(super) get_function: GetFunction,
    pub(super) launch_kernel: LaunchKernel,
    pub(super) sync: NoArgs,
    pub(super) event_create: EventCreate,
    pub(super) event_record: EventRecord,
    pub(super) event_sync: EventSync,
    pub(super) event_elapsed: EventElapsed,
    pub(super) event_destroy: EventDestroy,
}

impl Api {
    pub(super) fn load() -> Result<Api> {
        let (hip, _) = open(&["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"])?;
        // hipRTC is its own library from ROCm 5.3 on; before, libamdhip64 exported it.
        let mut rtc_in_hip = false;
        let rtc = match open(&[
            "libhiprtc.so",
            "libhiprtc.so.7",
            "libhiprtc.so.6",
            "libhiprtc.so.5",
        ]) {
            Ok((l, _)) => l,
            Err(e) => {
                let (l, _) = open(&["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"])?;
                // SAFETY: only reads the export table.
                if unsafe { l.get::<unsafe extern "C" fn()>(b"hiprtcCreateProgram\0") }.is_err() {
                    return Err(e);
                }
                rtc_in_hip = true;
                l
            }
        };
        Ok(Api {
            malloc: sym!(hip, "hipMalloc", Malloc),
            free: sym!(hip, "hipFree", Free),
            memcpy: sym!(hip, "hipMemcpy", Memcpy),
            memset: sym!(hip, "hipMemset", Memset),
            get_function: sym!(hip, "hipModuleGetFunction", GetFunction),
            launch_kernel: sym!(hip, "hipModuleLaunchKernel", LaunchKernel),
            sync: sym!(hip, "hipDeviceSynchronize", NoArgs),
            event_create: sym!(hip, "hipEventCreate", EventCreate),
            event_record: sym!(hip, "hipEventRecord", EventRecord),
            event_sync: sym!(hip, "hipEventSynchronize", EventSync),
            event_elapsed: sym!(hip, "hipEventElapsedTime", EventElapsed),
            event_destroy: sym!(hip, "hipEventDestroy", EventDestroy),
            hip,
            rtc,
            rtc_in_hip,
        })
    }

    pub(super) fn check(&self, what: &str, e: HipError) -> Result<()> {
        if e == 0 {
            Ok(())
        } else {
            Err(err(format!("{what} failed with hipError_t {e}")))
        }
    }
}

/// A device allocation, freed on drop.
pub struct DevBuf {
    api: Arc<Api>,
    pub(super) ptr: *mut c_void,
    pub(super) bytes: usize,
}

// SAFETY: a device pointer is plain data; the HIP runtime API is thread-safe.
unsafe impl Send for DevBuf {}
unsafe impl Sync for DevBuf {}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: ptr came from hipMalloc and is freed once.
        unsafe { (self.api.free)(self.ptr) };
    }
}

/// `bytes` zeroed device bytes.
pub(super) fn malloc(api: &Arc<Api>, bytes: usize) -> Result<DevBuf> {
    let mut p = ptr::null_mut();
    // SAFETY: out-pointer to a local.
    api.check("hipMalloc", unsafe { (api.malloc)(&mut p, bytes.max(1)) })?;
    let b = DevBuf {
        api: api.clone(),
        ptr: p,
        bytes,
    };
    // SAFETY: p points at `bytes` device bytes.
    api.check("hipMemset", unsafe { (api.memset)(p, 0, bytes.max(1)) })?;
    Ok(b)
}

/// A new device buffer holding `host`.
pub(super) fn upload(api: &Arc<Api>, host: &[u8]) -> Result<DevBuf> {
    let b = malloc(api, std::mem::size_of_val(host))?;
    // SAFETY: b.ptr has room for the whole slice.
    api.check("hipMemcpy", unsafe {
        (api.memcpy)(
            b.ptr,
            host.as_ptr() as *const c_void,
            b.bytes,
            HIP_MEMCPY_HOST_TO_DEVICE,
        )
    })?;
    Ok(b)
}

/// The first `n` values of `b`.
pub(super) fn read<T: Pod>(api: &Api, b: &DevBuf, n: usize) -> Result<Vec<T>> {
    let bytes = n * std::mem::size_of::<T>();
    if b.bytes < bytes {
        return Err(err(format!(
            "{bytes} bytes read from a {}-byte buffer",
            b.bytes
        )));
    }
    let mut v = vec![0u8; bytes];
    // SAFETY: the device buffer holds at least `bytes` (checked); hipMemcpy waits for the
    // preceding kernels on the null stream.
    api.check("hipMemcpy", unsafe {
        (api.memcpy)(
            v.as_mut_ptr() as *mut c_void,
            b.ptr,
            bytes,
            HIP_MEMCPY_DEVICE_TO_HOST,
        )
    })?;
    Ok(from_bytes(&v, n))
}

/// hipRTC's options for `arch`.
pub(super) fn options(arch: &str) -> Vec<String> {
    vec![
        format!("--offload-arch={arch}"),
        "-O3".into(),
        "-std=c++17".into(),
    ]
}

/// hipRTC's version, `hipRTC major.minor` (part of the module cache's key).
pub(super) fn compiler_version(api: &Api) -> Result<String> {
    let version = sym!(
        api.rtc,
        "hiprtcVersion",
        unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int
    );
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-parameters, written by hipRTC.
    if unsafe { version(&mut major, &mut minor) } != 0 {
        return Err(err("hiprtcVersion failed"));
    }
    Ok(format!("hipRTC {major}.{minor}"))
}

/// The kernel module compiled by hipRTC for `arch` (`gfx942`, …), as a code object.
pub(super) fn compile(api: &Api, arch: &str) -> Result<Vec<u8>> {
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
    // A hipRTC entry point returning its status (`hiprtcResult`, 0 on success).
    macro_rules! rtc {
        ($name:literal, $($arg:ty),*) => {
            sym!(api.rtc, $name, unsafe extern "C" fn($($arg),*) -> c_int)
        };
    }
    let compile = rtc!("hiprtcCompileProgram", Program, c_int, *const *const c_char);
    let log_size = rtc!("hiprtcGetProgramLogSize", Program, *mut usize);
    let log = rtc!("hiprtcGetProgramLog", Program, *mut c_char);
    let code_size = rtc!("hiprtcGetCodeSize", Program, *mut usize);
    let get_code = rtc!("hiprtcGetCode", Program, *mut c_char);
    let destroy = rtc!("hiprtcDestroyProgram", *mut Program);
    let src = CString::new(super::super::source::module()).unwrap();
    let name = CString::new("kquant_kernels.cu").unwrap();
    let opts: Vec<CString> = options(arch)
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
