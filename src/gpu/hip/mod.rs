//! The HIP [`Driver`] (feature `hip`): a minimal binding ([`ffi`]) that loads `libamdhip64`,
//! `libhiprtc` and (for the vendor GEMM) `libhipblas` at run time with `libloading` (no ROCm at
//! build time; the choice is argued in docs/kernels.md). The kernels
//! ([`super::source::module`]) are compiled by hipRTC for `KQUANT_HIP_ARCH` (default `gfx942`,
//! MI300X/MI325X): reading `gcnArchName` needs the version-dependent `hipDeviceProp_t` layout,
//! left for the first run on AMD hardware. All work is queued on the null stream. What runs when
//! is [`super::dispatch`]'s. Not checked on hardware yet (docs/kernels.md).

pub mod ffi;

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void, CString};
use std::ptr;
use std::sync::{Arc, Mutex};

use ffi::{err, sym, Api, Blas, DevBuf, Function, HipError, Module};

use super::driver::{as_bytes, Dim3, Driver, Gemm, Pod};
use super::module_cache;
use super::source::{Arg, Kernel};
use super::tune::Arch;
use super::Result;

/// One HIP device with the kernel module loaded.
pub struct Hip {
    api: Arc<Api>,
    module: Module,
    functions: Mutex<HashMap<String, usize>>,
    /// hipBLAS, or why it could not be loaded (only regime C and the bf16 baseline need it).
    blas: std::result::Result<Mutex<Blas>, String>,
    name: String,
    /// Where the kernel module came from (the on-disk cache, or compiled now).
    pub origin: module_cache::Origin,
}

// SAFETY: the module handle is immutable after load and the HIP runtime API is thread-safe; the
// function cache and the hipBLAS handle are behind mutexes.
unsafe impl Send for Hip {}
unsafe impl Sync for Hip {}

impl Hip {
    pub fn new(ordinal: usize) -> Result<Hip> {
        let api = Arc::new(Api::load()?);
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
        if api.rtc_in_hip && arch.starts_with("gfx94") {
            // ROCm < 5.3's comgr aborts the process on gfx94x instead of returning an error.
            return Err(err(format!(
                "this HIP runtime (hipRTC inside libamdhip64, ROCm < 5.3) cannot compile for \
                 {arch}; gfx94x needs ROCm >= 6"
            )));
        }
        let key = module_cache::Key::new(
            "hip",
            &arch,
            &ffi::compiler_version(&api)?,
            &super::source::module(),
            &ffi::options(&arch),
        );
        let (code, origin) =
            module_cache::load_or_compile(module_cache::dir().as_deref(), &key, || {
                ffi::compile(&api, &arch)
            })?;
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
            functions: Mutex::new(HashMap::new()),
            blas: Blas::load().map(Mutex::new).map_err(|e| e.to_string()),
            name: format!("hip:{ordinal} ({arch})"),
            origin,
        })
    }

    /// The kernel module compiled by hipRTC for `arch` (`gfx942`, …): needs the HIP runtime
    /// libraries (hipRTC + comgr), not a GPU.
    pub fn compile_only(arch: &str) -> Result<Vec<u8>> {
        ffi::compile(&Api::load()?, arch)
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

    fn sync(&self) -> Result<()> {
        // SAFETY: no arguments.
        self.api
            .check("hipDeviceSynchronize", unsafe { (self.api.sync)() })
    }
}

impl Driver for Hip {
    type Buf = DevBuf;
    const BACKEND: &'static str = "hip";

    fn module_origin(&self) -> Option<String> {
        Some(self.origin.describe())
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn arch(&self) -> Arch {
        Arch::Gfx942
    }

    fn alloc(&self, bytes: usize) -> Result<DevBuf> {
        ffi::malloc(&self.api, bytes)
    }

    fn size(buf: &DevBuf) -> usize {
        buf.bytes
    }

    fn htod<T: Pod>(&self, host: &[T]) -> Result<DevBuf> {
        ffi::upload(&self.api, as_bytes(host))
    }

    fn dtoh_f32(&self, buf: &DevBuf, n: usize) -> Result<Vec<f32>> {
        self.sync()?;
        ffi::read(&self.api, buf, n)
    }

    fn dtoh_i32(&self, buf: &DevBuf, n: usize) -> Result<Vec<i32>> {
        self.sync()?;
        ffi::read(&self.api, buf, n)
    }

    unsafe fn launch(&self, kernel: &Kernel<'_, DevBuf>, grid: Dim3, block: Dim3) -> Result<()> {
        let name = kernel.name();
        let f = self.function(&name)?;
        let args = kernel.args();
        // hipModuleLaunchKernel takes a pointer to each argument's value.
        let mut ptrs: Vec<*mut c_void> = args
            .iter()
            .map(|a| match a {
                Arg::Buf(b) => b.ptr,
                Arg::Int(_) => ptr::null_mut(),
            })
            .collect();
        let mut ints: Vec<c_int> = args
            .iter()
            .map(|a| match a {
                Arg::Int(v) => *v,
                Arg::Buf(_) => 0,
            })
            .collect();
        let mut params: Vec<*mut c_void> = args
            .iter()
            .zip(ptrs.iter_mut().zip(ints.iter_mut()))
            .map(|(a, (p, i))| match a {
                Arg::Buf(_) => p as *mut *mut c_void as *mut c_void,
                Arg::Int(_) => i as *mut c_int as *mut c_void,
            })
            .collect();
        // SAFETY: params point at values laid out as the kernel's C signature (`Kernel::args`),
        // alive for the call; buffer sizes and geometry are the caller's contract
        // (`Driver::launch`).
        self.api.check(&name, unsafe {
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
                params.as_mut_ptr(),
                ptr::null_mut(),
            )
        })
    }

    unsafe fn gemm(&self, g: Gemm, w: &DevBuf, a: &DevBuf, out: &DevBuf) -> Result<()> {
        let blas = self
            .blas
            .as_ref()
            .map_err(|e| err(format!("hipBLAS: {e}")))?;
        let mut blas = blas.lock().expect("hipBLAS");
        // SAFETY: the sizes are the caller's contract (`Driver::gemm`).
        unsafe { blas.gemm_ex(g, w.ptr, a.ptr, out.ptr) }
    }

    fn copy(&self, src: &DevBuf, dst: &mut DevBuf) -> Result<()> {
        if dst.bytes < src.bytes {
            return Err(err(format!(
                "copy of {} bytes into {}",
                src.bytes, dst.bytes
            )));
        }
        // SAFETY: both buffers hold src.bytes (checked).
        self.api.check("hipMemcpy", unsafe {
            (self.api.memcpy)(
                dst.ptr,
                src.ptr,
                src.bytes,
                ffi::HIP_MEMCPY_DEVICE_TO_DEVICE,
            )
        })
    }

    fn time(&self, iters: usize, f: &mut dyn FnMut(usize) -> Result<()>) -> Result<f64> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{source, Act};

    /// hipRTC compiles the header-free single-TU module (no GPU needed, only the HIP runtime
    /// libraries). `KQUANT_HIPRTC_ARCHS` picks the targets; the default is gfx942, or gfx90a
    /// where hipRTC still lives in libamdhip64 (ROCm < 5.3, e.g. Debian 12's 5.2, whose comgr
    /// aborts on gfx94x). Ignored unless asked for (`-- --include-ignored`, as .ci/run does
    /// after kernels/check.sh installed Debian's ROCm runtime), and then a missing hipRTC is a
    /// failure.
    #[test]
    #[ignore = "needs the HIP runtime with hipRTC (kernels/check.sh installs Debian's; .ci/run runs this)"]
    fn hiprtc_compiles_the_module() {
        let api = ffi::Api::load().unwrap_or_else(|e| panic!("hipRTC does not load: {e}"));
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
                source::ARGMAX_ROWS.to_string(),
            ] {
                let found = code.windows(f.len()).any(|w| w == f.as_bytes());
                assert!(found, "{arch}: {f}");
            }
        }
    }
}
