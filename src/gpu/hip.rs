//! HIP launcher (feature `hip`): a minimal binding that loads `libamdhip64`, `libhiprtc` and
//! (for regime C) `libhipblas` at run time with `libloading` (no ROCm at build time; the choice
//! is argued in docs/kernels.md). The kernels ([`super::source::module`]) are compiled by hipRTC
//! for `KQUANT_HIP_ARCH` (default `gfx942`, MI300X/MI325X): reading `gcnArchName` needs the
//! version-dependent `hipDeviceProp_t` layout, left for the first run on AMD hardware.
//!
//! hipBLAS `GemmEx` changed its enum types between releases: hipBLAS 2.x (ROCm 6) exports
//! `hipblasGemmEx` with `hipblasDatatype_t` (`HIPBLAS_R_16B = 168`, …) and `hipblasGemmEx_v2`
//! with `hipDataType` (`HIP_R_16BF = 14`, …) + `hipblasComputeType_t`; hipBLAS 3.0 (ROCm 7)
//! made the v2 signature the plain name. We use `_v2` when exported, the plain name with v2
//! enums from `libhipblas.so.3` on, v1 enums otherwise; `KQUANT_HIPBLAS_API=v1|v2` overrides.
//! Not checked on hardware yet (docs/kernels.md).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::ptr;
use std::sync::{Arc, Mutex};

use libloading::Library;

use super::layout::{W4Layout, CHUNK};
use super::tune::{self, Arch, Regime};
use super::{check_call, check_w4a8, source, Act, Backend, DeviceW4, GpuError, Result};

type HipError = c_int;
type Module = *mut c_void;
type Function = *mut c_void;
type Program = *mut c_void;
type Event = *mut c_void;
const HIP_MEMCPY_HOST_TO_DEVICE: c_int = 1;
const HIP_MEMCPY_DEVICE_TO_HOST: c_int = 2;
const HIP_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;

fn err(msg: impl Into<String>) -> GpuError {
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
struct Blas {
    _lib: Library,
    handle: *mut c_void,
    gemm_ex: GemmEx,
    /// `hipDataType` + `hipblasComputeType_t` (v2) or `hipblasDatatype_t` (v1).
    v2: bool,
}

impl Blas {
    fn load() -> Result<Blas> {
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
}

/// The HIP runtime entry points kquant uses, resolved once.
struct Api {
    _hip: Library,
    rtc: Library,
    /// hipRTC came from libamdhip64 (ROCm < 5.3, whose comgr predates gfx94x).
    rtc_in_hip: bool,
    malloc: Malloc,
    free: Free,
    memcpy: Memcpy,
    memset: Memset,
    get_function: GetFunction,
    launch_kernel: LaunchKernel,
    sync: NoArgs,
    event_create: EventCreate,
    event_record: EventRecord,
    event_sync: EventSync,
    event_elapsed: EventElapsed,
    event_destroy: EventDestroy,
}

impl Api {
    fn load() -> Result<Api> {
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
            _hip: hip,
            rtc,
            rtc_in_hip,
        })
    }

    fn check(&self, what: &str, e: HipError) -> Result<()> {
        if e == 0 {
            Ok(())
        } else {
            Err(err(format!("{what} failed with hipError_t {e}")))
        }
    }
}

/// A device allocation, freed on drop.
struct DevBuf {
    api: Arc<Api>,
    ptr: *mut c_void,
    bytes: usize,
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

fn malloc(api: &Arc<Api>, bytes: usize) -> Result<DevBuf> {
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

fn upload<T: Copy>(api: &Arc<Api>, host: &[T]) -> Result<DevBuf> {
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

fn read_f32(api: &Api, b: &DevBuf, n: usize) -> Result<Vec<f32>> {
    let mut v = vec![0f32; n];
    // SAFETY: the device buffer holds at least n f32 (callers size it); hipMemcpy waits for
    // the preceding kernels on the null stream.
    api.check("hipMemcpy", unsafe {
        (api.memcpy)(
            v.as_mut_ptr() as *mut c_void,
            b.ptr,
            n * 4,
            HIP_MEMCPY_DEVICE_TO_HOST,
        )
    })?;
    Ok(v)
}

/// Weights on the device.
struct HipW4 {
    qweight: DevBuf,
    scales: DevBuf,
}

/// Reusable device buffers, grown on demand.
#[derive(Default)]
struct Scratch {
    part: Option<DevBuf>,
    part_i: Option<DevBuf>,
    dense: Option<DevBuf>,
    xq: Option<DevBuf>,
    xs: Option<DevBuf>,
    xsum: Option<DevBuf>,
}

fn grow(api: &Arc<Api>, slot: &mut Option<DevBuf>, bytes: usize) -> Result<*mut c_void> {
    if slot.as_ref().is_none_or(|b| b.bytes < bytes) {
        *slot = Some(malloc(api, bytes)?);
    }
    Ok(slot.as_ref().expect("just set").ptr)
}

fn arg<T>(v: &mut T) -> *mut c_void {
    v as *mut T as *mut c_void
}

/// One HIP device with the kernel module loaded.
pub struct Hip {
    api: Arc<Api>,
    module: Module,
    functions: Mutex<HashMap<String, usize>>,
    blas: std::result::Result<Blas, String>,
    scratch: Mutex<Scratch>,
    name: String,
}

// SAFETY: the module handle is immutable after load and the HIP runtime API is thread-safe;
// scratch buffers and the function cache are behind mutexes; the hipBLAS handle is only used
// while the scratch mutex is held (every GEMM call holds it).
unsafe impl Send for Hip {}
unsafe impl Sync for Hip {}

impl Hip {
    pub fn new(ordinal: usize) -> Result<Hip> {
        let api = Arc::new(Api::load()?);
        let init = sym!(
            api._hip,
            "hipInit",
            unsafe extern "C" fn(c_uint) -> HipError
        );
        let set = sym!(
            api._hip,
            "hipSetDevice",
            unsafe extern "C" fn(c_int) -> HipError
        );
        // SAFETY: plain calls.
        api.check("hipInit", unsafe { init(0) })?;
        api.check("hipSetDevice", unsafe { set(ordinal as c_int) })?;
        let arch = std::env::var("KQUANT_HIP_ARCH").unwrap_or_else(|_| "gfx942".into());
        if api.rtc_in_hip && arch.starts_with("gfx94") {
            // ROCm < 5.3's comgr aborts the process on gfx94x instead of returning an error.
            return Err(err(format!(
                "this HIP runtime (hipRTC inside libamdhip64, ROCm < 5.3) cannot compile for \
                 {arch}; gfx94x needs ROCm >= 6"
            )));
        }
        let code = Self::compile(&api, &arch)?;
        let load = sym!(
            api._hip,
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
            functions: Mutex::new(HashMap::new()),
            blas: Blas::load().map_err(|e| e.to_string()),
            scratch: Mutex::new(Scratch::default()),
            name: format!("hip:{ordinal} ({arch})"),
        })
    }

    /// The kernel module compiled by hipRTC for `arch` (`gfx942`, …): needs the HIP runtime
    /// libraries (hipRTC + comgr), not a GPU.
    pub fn compile_only(arch: &str) -> Result<Vec<u8>> {
        Self::compile(&Api::load()?, arch)
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
        let src = CString::new(source::module()).unwrap();
        let name = CString::new("kquant_kernels.cu").unwrap();
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

    fn function(&self, name: &str) -> Result<Function> {
        let mut cache = self.functions.lock().expect("function cache");
        if let Some(&f) = cache.get(name) {
            return Ok(f as Function);
        }
        let cname = CString::new(name).unwrap();
        let mut f = ptr::null_mut();
        // SAFETY: module is a loaded code object; name is NUL-terminated.
        self.api.check("hipModuleGetFunction", unsafe {
            (self.api.get_function)(&mut f, self.module, cname.as_ptr())
        })?;
        cache.insert(name.into(), f as usize);
        Ok(f)
    }

    /// Queue `name` on the null stream with `args` (pointers to each argument value).
    fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        args: &mut [*mut c_void],
    ) -> Result<()> {
        let f = self.function(name)?;
        // SAFETY: args match the kernel's parameter list (callers build them from the .cu).
        self.api.check(name, unsafe {
            (self.api.launch_kernel)(
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
        })
    }

    fn elementwise(&self, name: &str, len: usize, args: &mut [*mut c_void]) -> Result<()> {
        self.launch(name, (len.div_ceil(256) as u32, 1, 1), (256, 1, 1), args)
    }

    fn blas(&self) -> Result<&Blas> {
        self.blas.as_ref().map_err(|e| err(format!("hipBLAS: {e}")))
    }

    /// `out [m, n] f32 = a [m, k] · w [n, k]ᵀ` with hipBLAS (column-major view, as cuBLAS).
    #[allow(clippy::too_many_arguments)]
    fn gemm_ex(
        &self,
        w: *mut c_void,
        a: *mut c_void,
        out: *mut c_void,
        n: usize,
        k: usize,
        m: usize,
        act: Act,
    ) -> Result<()> {
        let b = self.blas()?;
        let (alpha, beta) = (1f32, 0f32);
        let compute = if b.v2 { 2 } else { b.dtype(None) }; // HIPBLAS_COMPUTE_32F / R_32F
                                                            // SAFETY: w holds n·k, a m·k, out m·n elements; 111/112 = HIPBLAS_OP_N/T, 160 =
                                                            // HIPBLAS_GEMM_DEFAULT.
        let rc = unsafe {
            (b.gemm_ex)(
                b.handle,
                112,
                111,
                n as c_int,
                m as c_int,
                k as c_int,
                &alpha as *const f32 as *const c_void,
                w,
                b.dtype(Some(act)),
                k as c_int,
                a,
                b.dtype(Some(act)),
                k as c_int,
                &beta as *const f32 as *const c_void,
                out,
                b.dtype(None),
                n as c_int,
                compute,
                160,
            )
        };
        if rc != 0 {
            return Err(err(format!(
                "hipblasGemmEx ({} enums) failed with status {rc}",
                if b.v2 { "v2" } else { "v1" }
            )));
        }
        Ok(())
    }

    /// W4A16 on device pointers: `x` (m·k) in, `out` (m·n f32) out. Queued, not synchronised.
    #[allow(clippy::too_many_arguments)]
    fn run_w4a16(
        &self,
        w: &HipW4,
        meta: &DeviceW4,
        x: *mut c_void,
        act: Act,
        m: usize,
        regime: Regime,
        out: *mut c_void,
        sc: &mut Scratch,
    ) -> Result<()> {
        let (n, k, pc) = (meta.n, meta.k, meta.per_channel());
        let (mut ni, mut ki, mut mi, mut gi) =
            (n as c_int, k as c_int, m as c_int, meta.group as c_int);
        let (mut qw, mut s, mut xp, mut op) = (w.qweight.ptr, w.scales.ptr, x, out);
        let reduce = |part: *mut c_void, splits: usize| -> Result<()> {
            let (mut pp, mut o, mut mn, mut sp) = (part, out, (m * n) as c_int, splits as c_int);
            self.elementwise(
                source::SPLITK_REDUCE,
                m * n,
                &mut [arg(&mut pp), arg(&mut o), arg(&mut mn), arg(&mut sp)],
            )
        };
        match regime {
            Regime::Gemv => {
                let g = tune::gemv(Arch::Gfx942, n, k);
                let mut part = grow(&self.api, &mut sc.part, g.splits * m * n * 4)?;
                let mut cps = g.chunks_per_split as c_int;
                self.launch(
                    &source::w4a16_name(act, pc, m),
                    g.grid,
                    g.block,
                    &mut [
                        arg(&mut qw),
                        arg(&mut s),
                        arg(&mut xp),
                        arg(&mut part),
                        arg(&mut ni),
                        arg(&mut ki),
                        arg(&mut gi),
                        arg(&mut cps),
                    ],
                )?;
                reduce(part, g.splits)
            }
            Regime::Mma => {
                let g = tune::mma(Arch::Gfx942, n, k, m, !pc);
                let mut part = grow(&self.api, &mut sc.part, g.splits * m * n * 4)?;
                let mut tps = g.tiles_per_split as c_int;
                self.launch(
                    &source::w4a16_mma_name(act, pc, g.toks),
                    g.grid,
                    g.block,
                    &mut [
                        arg(&mut qw),
                        arg(&mut s),
                        arg(&mut xp),
                        arg(&mut part),
                        arg(&mut mi),
                        arg(&mut ni),
                        arg(&mut ki),
                        arg(&mut gi),
                        arg(&mut tps),
                    ],
                )?;
                reduce(part, g.splits)
            }
            Regime::Dense => {
                let mut dense = grow(&self.api, &mut sc.dense, n * k * 2)?;
                self.launch(
                    &source::dequant_name(act, pc),
                    tune::dense(n, k),
                    (tune::DENSE_THREADS, 1, 1),
                    &mut [
                        arg(&mut qw),
                        arg(&mut s),
                        arg(&mut dense),
                        arg(&mut ni),
                        arg(&mut ki),
                        arg(&mut gi),
                    ],
                )?;
                self.gemm_ex(dense, x, out, n, k, m, act)?;
                if pc {
                    self.elementwise(
                        source::SCALE_COLS,
                        m * n,
                        &mut [arg(&mut op), arg(&mut s), arg(&mut mi), arg(&mut ni)],
                    )?;
                }
                Ok(())
            }
        }
    }

    /// W4A8 on device pointers. Queued, not synchronised.
    #[allow(clippy::too_many_arguments)]
    fn run_w4a8(
        &self,
        w: &HipW4,
        meta: &DeviceW4,
        x: *mut c_void,
        act: Act,
        m: usize,
        regime: Regime,
        out: *mut c_void,
        sc: &mut Scratch,
    ) -> Result<()> {
        let (n, k) = (meta.n, meta.k);
        let (mut ni, mut ki, mut mi) = (n as c_int, k as c_int, m as c_int);
        let kp = k.div_ceil(CHUNK) * CHUNK;
        let mut xq = grow(&self.api, &mut sc.xq, m * kp)?;
        let mut xs = grow(&self.api, &mut sc.xs, m * 4)?;
        let mut xsum = grow(&self.api, &mut sc.xsum, m * 4)?;
        let (mut qw, mut s, mut xp, mut op) = (w.qweight.ptr, w.scales.ptr, x, out);
        self.launch(
            &source::quant_act_name(act),
            (m as u32, 1, 1),
            (256, 1, 1),
            &mut [
                arg(&mut xp),
                arg(&mut xq),
                arg(&mut xs),
                arg(&mut xsum),
                arg(&mut ki),
            ],
        )?;
        match regime {
            Regime::Gemv => {
                let g = tune::gemv(Arch::Gfx942, n, k);
                let mut part = grow(&self.api, &mut sc.part, g.splits * m * n * 4)?;
                let mut cps = g.chunks_per_split as c_int;
                self.launch(
                    &source::w4a8_name(m),
                    g.grid,
                    g.block,
                    &mut [
                        arg(&mut qw),
                        arg(&mut s),
                        arg(&mut xq),
                        arg(&mut xs),
                        arg(&mut xsum),
                        arg(&mut part),
                        arg(&mut ni),
                        arg(&mut ki),
                        arg(&mut cps),
                    ],
                )?;
                let (mut mn, mut sp) = ((m * n) as c_int, g.splits as c_int);
                self.elementwise(
                    source::SPLITK_REDUCE,
                    m * n,
                    &mut [arg(&mut part), arg(&mut op), arg(&mut mn), arg(&mut sp)],
                )
            }
            Regime::Mma | Regime::Dense => {
                let g = tune::mma(Arch::Gfx942, n, k, m, false);
                let mut part = grow(&self.api, &mut sc.part_i, g.splits * m * n * 4)?;
                let mut tps = g.tiles_per_split as c_int;
                self.launch(
                    &source::w4a8_mma_name(g.toks),
                    g.grid,
                    g.block,
                    &mut [
                        arg(&mut qw),
                        arg(&mut xq),
                        arg(&mut part),
                        arg(&mut mi),
                        arg(&mut ni),
                        arg(&mut ki),
                        arg(&mut tps),
                    ],
                )?;
                let mut sp = g.splits as c_int;
                self.elementwise(
                    source::W4A8_REDUCE,
                    m * n,
                    &mut [
                        arg(&mut part),
                        arg(&mut s),
                        arg(&mut xs),
                        arg(&mut xsum),
                        arg(&mut op),
                        arg(&mut mi),
                        arg(&mut ni),
                        arg(&mut sp),
                    ],
                )
            }
        }
    }

    fn sync(&self) -> Result<()> {
        // SAFETY: no arguments.
        self.api
            .check("hipDeviceSynchronize", unsafe { (self.api.sync)() })
    }

    /// Seconds per call of `f`, with HIP events around `iters` calls after one warm-up.
    fn time(&self, iters: usize, mut f: impl FnMut(usize) -> Result<()>) -> Result<f64> {
        f(0)?;
        self.sync()?;
        let (mut start, mut end) = (ptr::null_mut(), ptr::null_mut());
        let a = &self.api;
        // SAFETY: out-pointers to locals; events destroyed below.
        unsafe {
            a.check("hipEventCreate", (a.event_create)(&mut start))?;
            a.check("hipEventCreate", (a.event_create)(&mut end))?;
            a.check("hipEventRecord", (a.event_record)(start, ptr::null_mut()))?;
        }
        let run = (0..iters.max(1)).try_for_each(|i| f(i + 1));
        let mut ms = 0f32;
        // SAFETY: both events were created above.
        let timed = unsafe {
            a.check("hipEventRecord", (a.event_record)(end, ptr::null_mut()))
                .and_then(|_| a.check("hipEventSynchronize", (a.event_sync)(end)))
                .and_then(|_| {
                    a.check(
                        "hipEventElapsedTime",
                        (a.event_elapsed)(&mut ms, start, end),
                    )
                })
        };
        // SAFETY: created above, destroyed once.
        unsafe {
            (a.event_destroy)(start);
            (a.event_destroy)(end);
        }
        run?;
        timed?;
        Ok(ms as f64 / 1e3 / iters.max(1) as f64)
    }
}

impl Backend for Hip {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn arch(&self) -> Arch {
        Arch::Gfx942
    }

    fn upload(&self, w: &W4Layout) -> Result<DeviceW4> {
        w.check()?;
        let d = HipW4 {
            qweight: upload(&self.api, &w.qweight)?,
            scales: upload(&self.api, &w.scales)?,
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
        let dw = w.get::<HipW4>("hip")?;
        let xd = upload(&self.api, x)?;
        let out = malloc(&self.api, m * w.n * 4)?;
        let mut sc = self.scratch.lock().expect("scratch");
        self.run_w4a16(dw, w, xd.ptr, act, m, regime, out.ptr, &mut sc)?;
        self.sync()?;
        read_f32(&self.api, &out, m * w.n)
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
        let dw = w.get::<HipW4>("hip")?;
        let xd = upload(&self.api, x)?;
        let out = malloc(&self.api, m * w.n * 4)?;
        let mut sc = self.scratch.lock().expect("scratch");
        self.run_w4a8(dw, w, xd.ptr, act, m, regime, out.ptr, &mut sc)?;
        self.sync()?;
        read_f32(&self.api, &out, m * w.n)
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
        let dws: Vec<&HipW4> = ws
            .iter()
            .map(|w| w.get::<HipW4>("hip"))
            .collect::<Result<_>>()?;
        check_call(first, m * first.k, m, regime)?;
        let xd = upload(&self.api, &vec![act.from_f32(0.5); m * first.k])?;
        let out = malloc(&self.api, m * first.n * 4)?;
        let mut sc = self.scratch.lock().expect("scratch");
        self.time(iters, |i| {
            let j = i % ws.len();
            self.run_w4a16(dws[j], &ws[j], xd.ptr, act, m, regime, out.ptr, &mut sc)
        })
    }

    fn copy_bandwidth(&self, bytes: usize, iters: usize) -> Result<f64> {
        let count = (2 * self.arch().tune().llc_bytes).div_ceil(bytes.max(1)) + 1;
        let src: Vec<DevBuf> = (0..count)
            .map(|_| malloc(&self.api, bytes))
            .collect::<Result<_>>()?;
        let dst = malloc(&self.api, bytes)?;
        let t = self.time(iters, |i| {
            // SAFETY: both buffers hold `bytes`.
            self.api.check("hipMemcpy", unsafe {
                (self.api.memcpy)(
                    dst.ptr,
                    src[i % count].ptr,
                    bytes,
                    HIP_MEMCPY_DEVICE_TO_DEVICE,
                )
            })
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
        let ws: Vec<DevBuf> = (0..copies.max(1))
            .map(|_| malloc(&self.api, n * k * 2))
            .collect::<Result<_>>()?;
        let x = upload(&self.api, &vec![Act::Bf16.from_f32(0.5); m * k])?;
        let out = malloc(&self.api, m * n * 4)?;
        let _guard = self.scratch.lock().expect("scratch");
        let t = self.time(iters, |i| {
            self.gemm_ex(ws[i % ws.len()].ptr, x.ptr, out.ptr, n, k, m, Act::Bf16)
        })?;
        Ok(Some(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// hipRTC compiles the header-free single-TU module (no GPU needed, only the HIP runtime
    /// libraries). `KQUANT_HIPRTC_ARCHS` picks the targets; the default is gfx942, or gfx90a
    /// where hipRTC still lives in libamdhip64 (ROCm < 5.3, e.g. Debian 12's 5.2, whose comgr
    /// aborts on gfx94x). Ignored unless asked for (`-- --include-ignored`, as .ci/run does
    /// after kernels/check.sh installed Debian's ROCm runtime), and then a missing hipRTC is a
    /// failure.
    #[test]
    #[ignore = "needs the HIP runtime with hipRTC (kernels/check.sh installs Debian's; .ci/run runs this)"]
    fn hiprtc_compiles_the_module() {
        let api = Api::load().unwrap_or_else(|e| panic!("hipRTC does not load: {e}"));
        let default = if api.rtc_in_hip { "gfx90a" } else { "gfx942" };
        let archs = std::env::var("KQUANT_HIPRTC_ARCHS").unwrap_or_else(|_| default.into());
        for arch in archs.split(',') {
            let code = Hip::compile_only(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
            assert_eq!(&code[..4], b"\x7fELF", "{arch}: an AMDGPU code object");
            for f in [
                source::w4a16_name(Act::Bf16, true, 8),
                source::w4a16_mma_name(Act::F16, false, 64),
                source::w4a8_mma_name(128),
                source::dequant_name(Act::Bf16, false),
            ] {
                let found = code.windows(f.len()).any(|w| w == f.as_bytes());
                assert!(found, "{arch}: {f}");
            }
        }
    }
}
