//! The draft runtimes' decoder linears, behind one hook: every `y = x · Wᵀ` of the EAGLE-3
//! (Llama and MLA attention) and DFlash forwards goes through [`Linear::apply`], which runs
//! either the CPU path — the blocked product `ops::gemm::matmul_nt` over the weights as they
//! are stored: unquantized BF16 / F16 tensors as their bytes, quantized INT4 / INT8 / FP8
//! modules as their codes and scales (`runtime::packed`), expanded a block at a time inside the
//! product; only NVFP4 and Quark's `int4_fp8` are dequantized to f32 at load;
//! [`Linear::apply_ref`] is the plain `ops::linear_ref` reference it is tested against — or a
//! device-resident layer (`kquant verify --device cuda|hip|cpu-emu`): a quantized one
//! ([`gpu::DeviceLinear`], the INT4 kernels) or an unquantized one ([`gpu::DenseLinear`], the
//! vendor BLAS). [`Linear::argmax_rows`] of a device layer reduces on the device and copies back
//! one index per row. A shared observer can record the abs-max of every linear's input (`kquant
//! calibrate`: NVFP4 W4A4's static input scales), and the first device failure is kept for the
//! replay to report as an error instead of a panic inside a forward pass.
//!
//! Which modules go to a device ([`LinearSet::load`]): the quantized ones whose stored layout the
//! INT4 kernels take (`gpu::W4Layout::from_module`: INT4 per channel / per group, symmetric) with
//! K a multiple of 8, and the unquantized ones (the drafts' lm_head and fc unless quantized, or
//! a whole unquantized draft) stored as BF16 / F16 — the GEMM in that dtype, activations rounded
//! to it — or as F32 holding only bf16 values (uploaded as bf16: exact). An F32 tensor that bf16
//! would round, and quantized modules the kernels do not take (FP8, NVFP4, asymmetric UINT4),
//! stay on the CPU path. [`LinearSet::placement`] (quantized) and
//! [`LinearSet::dense_placement`] (unquantized) list what went where.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::hessian::{Hessian, HessianSet};
use super::packed::Packed;
use crate::error::{Error, Result};
use crate::gpu::{self, Act, Backend, GpuError, W4Layout};
use crate::io::Dtype;
use crate::ops::gemm::{Decode, Rows};
use crate::ops::{self, gemm};
use crate::quant::decode::Logical;

/// Where a draft's quantized linears run.
#[derive(Clone)]
pub enum Exec {
    /// Every linear on the CPU, over the weights as stored (the reference runtime).
    F32,
    /// Quantized INT4 linears on `dev` with activations rounded to `act`, unquantized BF16 / F16
    /// ones on `dev` through its BLAS (in their own dtype); the rest in f32 on the CPU.
    Device {
        dev: Arc<dyn Backend>,
        act: Act,
        step: Step,
    },
    /// As [`Exec::F32`], but an unquantized BF16 / F16 tensor is read from its file at its first
    /// product instead of at load: for a calibration replay, which never multiplies the EAGLE-3
    /// lm_head (2.35 GB at Kimi shape) and so never reads it.
    F32Lazy,
}

impl Exec {
    /// `None` (the f32 runtime) or a device with bf16 activations, what the engines run.
    pub fn device(dev: Option<Arc<dyn Backend>>) -> Exec {
        match dev {
            None => Exec::F32,
            Some(dev) => Exec::Device {
                dev,
                act: Act::Bf16,
                step: Step::Whole,
            },
        }
    }

    /// The same device with every draft step run per linear ([`Step::PerLinear`]).
    pub fn per_linear(self) -> Exec {
        match self {
            Exec::Device { dev, act, .. } => Exec::Device {
                dev,
                act,
                step: Step::PerLinear,
            },
            other => other,
        }
    }

    /// The device's name, `None` for the f32 runtime.
    pub fn name(&self) -> Option<String> {
        match self {
            Exec::F32 | Exec::F32Lazy => None,
            Exec::Device { dev, .. } => Some(dev.name()),
        }
    }

    /// Where the device's kernel module came from (the on-disk cache or a compile now); `None`
    /// for the f32 runtime and the emulation.
    pub fn module_origin(&self) -> Option<String> {
        match self {
            Exec::F32 | Exec::F32Lazy => None,
            Exec::Device { dev, .. } => dev.module_origin(),
        }
    }
}

/// How much of a draft step a device runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Step {
    /// The whole step where the draft allows it (`runtime::eagle3::device`): only token ids
    /// cross, per depth.
    Whole,
    /// The linears only: their inputs go up and their outputs come back at every call, the rest
    /// of the step runs on the CPU.
    PerLinear,
}

/// Calls of device layers in this process and the wall time spent in them (the activations
/// rounded and copied up, the kernels, the outputs copied back: the host waits for each), for
/// `kquant bench replay --device`'s breakdown.
static DEVICE_CALLS: AtomicU64 = AtomicU64::new(0);
static DEVICE_NANOS: AtomicU64 = AtomicU64::new(0);

pub(crate) fn device_timed<R>(f: impl FnOnce() -> R) -> R {
    let t = std::time::Instant::now();
    let r = f();
    DEVICE_NANOS.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    DEVICE_CALLS.fetch_add(1, Ordering::Relaxed);
    r
}

/// Device-layer calls so far and the wall seconds spent in them (the runtimes call them from one
/// thread at a time).
pub fn device_time() -> (u64, f64) {
    (
        DEVICE_CALLS.load(Ordering::Relaxed),
        DEVICE_NANOS.load(Ordering::Relaxed) as f64 * 1e-9,
    )
}

/// What every linear of one draft shares: the observer and the first device error.
#[derive(Default)]
struct Shared {
    observing: AtomicBool,
    amax: Mutex<BTreeMap<String, f32>>,
    /// Input second moments being collected (`kquant quantize --calibrate`).
    hessians: Mutex<Option<HessianSet>>,
    collecting: AtomicBool,
    error: Mutex<Option<Fault>>,
}

/// The first failure inside a product, kept for [`LinearSet::take_error`].
enum Fault {
    /// A device call failed on `module`.
    Device(String, GpuError),
    /// A deferred tensor ([`Exec::F32Lazy`]) could not be read.
    Read(Error),
    /// A device-resident draft step failed at `what` (`runtime::eagle3::device`).
    Step(String, GpuError),
}

/// An unquantized BF16 / F16 tensor read from its file at the first product.
struct Deferred {
    dtype: Dtype,
    file: std::fs::File,
    path: std::path::PathBuf,
    offset: u64,
    len: usize,
    bytes: std::sync::OnceLock<std::result::Result<Vec<u8>, String>>,
}

impl Deferred {
    /// The stored bytes, read on the first call.
    fn get(&self) -> std::result::Result<&[u8], Error> {
        let r = self.bytes.get_or_init(|| {
            use std::os::unix::fs::FileExt;
            let mut b = vec![0u8; self.len];
            self.file
                .read_exact_at(&mut b, self.offset)
                .map(|()| b)
                .map_err(|e| e.to_string())
        });
        r.as_deref().map_err(|e| Error::Source {
            path: self.path.clone(),
            msg: format!(
                "reading {} bytes at offset {} failed: {e}",
                self.len, self.offset
            ),
            hint: Some("the file changed or became unreadable while kquant ran".into()),
        })
    }
}

/// How one layer computes.
enum Kind {
    /// f32 rows: a quantized module dequantized at load (each format's own arithmetic), or an
    /// F32 tensor.
    F32(Vec<f32>),
    /// A quantized module kept as its codes and scales (INT4 two to a byte, FP8 one), expanded
    /// a block at a time inside the product to exactly the format's dequantized values.
    Packed(Packed),
    /// An unquantized BF16 / F16 tensor kept as stored (two bytes a weight, half of f32), widened
    /// a panel of rows at a time inside the product (`ops::gemm`).
    Half {
        dtype: Dtype,
        bytes: Vec<u8>,
    },
    /// [`Kind::Half`] not yet read ([`Exec::F32Lazy`]).
    Lazy(Deferred),
    Device(gpu::DeviceLinear),
    /// An unquantized weight on the device (`Exec::Device`), through the vendor BLAS.
    Dense(gpu::DenseLinear),
}

/// A linear's layer on the device, for a step that stays there (`runtime::eagle3::device`):
/// activations in, f32 outputs out, both device tensors.
#[derive(Clone, Copy)]
pub enum DeviceLayer<'a> {
    W4(&'a gpu::DeviceLinear),
    Dense(&'a gpu::DenseLinear),
}

impl DeviceLayer<'_> {
    /// The 16-bit dtype the layer reads its input in.
    pub fn act(&self) -> Act {
        match self {
            DeviceLayer::W4(l) => l.act,
            DeviceLayer::Dense(l) => l.dtype(),
        }
    }
    /// `y [m, n]` f32 = `x [m, k]` (in [`DeviceLayer::act`]) · Wᵀ, on the device.
    pub fn forward(&self, x: &gpu::DevTensor, m: usize) -> gpu::Result<gpu::DevTensor> {
        match self {
            DeviceLayer::W4(l) => l.forward_dev(x, m),
            DeviceLayer::Dense(l) => l.forward_dev(x, m),
        }
    }
}

/// One linear layer of a draft: `y [m, n] = x [m, k] · Wᵀ`, `W` = checkpoint module `module`.
pub struct Linear {
    /// The checkpoint module (tensor name without `.weight`, in the draft's own naming).
    pub module: String,
    /// Output features.
    pub n: usize,
    /// Input features.
    pub k: usize,
    kind: Kind,
    shared: Arc<Shared>,
}

impl Linear {
    /// `y [m, n] = x [m, k] · Wᵀ`: the blocked product `ops::gemm::matmul_nt` over the weights
    /// in their stored precision (within `GEMM_REL_TOL` of [`Linear::apply_ref`], each row
    /// independent of the rows beside it), or the device layer. A device failure is recorded
    /// ([`LinearSet::take_error`]) and gives zeros.
    pub fn apply(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.observe(x);
        match self.rows() {
            Some(rows) => gemm::matmul_nt(x, m, self.k, rows, self.n),
            None => match &self.kind {
                Kind::Device(l) => self.on_device(|| l.forward(x, m), 0.0, m * self.n),
                Kind::Dense(l) => self.on_device(|| l.forward(x, m), 0.0, m * self.n),
                // Its read failed (kept for `take_error`).
                Kind::Lazy(_) => vec![0.0; m * self.n],
                _ => unreachable!("every CPU kind has rows"),
            },
        }
    }

    /// [`Linear::apply`] with the plain reference matmul `ops::linear_ref` on the f32 path (the
    /// runtimes' reference forwards); a device layer has one arithmetic and runs as `apply`.
    pub fn apply_ref(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.observe(x);
        match &self.kind {
            Kind::F32(w) => ops::linear_ref(x, m, self.k, w, self.n),
            Kind::Half { dtype, bytes } => {
                let mut w = Vec::new();
                crate::io::dtype::to_f32(*dtype, bytes, &mut w);
                ops::linear_ref(x, m, self.k, &w, self.n)
            }
            Kind::Packed(p) => {
                let mut w = vec![0f32; p.elements()];
                p.decode(0, &mut w);
                ops::linear_ref(x, m, self.k, &w, self.n)
            }
            Kind::Lazy(d) => match self.lazy_bytes(d) {
                Some(bytes) => {
                    let mut w = Vec::new();
                    crate::io::dtype::to_f32(d.dtype, bytes, &mut w);
                    ops::linear_ref(x, m, self.k, &w, self.n)
                }
                None => vec![0.0; m * self.n],
            },
            Kind::Device(l) => self.on_device(|| l.forward(x, m), 0.0, m * self.n),
            Kind::Dense(l) => self.on_device(|| l.forward(x, m), 0.0, m * self.n),
        }
    }

    /// The index of the largest output of each of the `m` rows of `x · Wᵀ` (`ops::argmax`: the
    /// first on ties, as `torch.argmax`): what a replay needs of an lm_head, without keeping
    /// the `[m, n]` logits. The rows are computed a bounded block at a time (a row's outputs
    /// do not depend on the rows beside it, so the indices are those of [`Linear::apply`]). A
    /// device layer reduces each row on the device (`kq_argmax_rows`) and copies back the
    /// indices only; its order differs from `ops::argmax` on rows holding a NaN alone (the first
    /// NaN wins, as `torch.argmax`: `gpu::reference::argmax_ref`).
    pub fn argmax_rows(&self, x: &[f32], m: usize) -> Vec<usize> {
        // About 256 MiB of logits at a time, at least one row.
        self.argmax_blocks(x, m, ((1usize << 26) / self.n.max(1)).max(1))
    }

    /// [`Linear::argmax_rows`] with each row's runner-up and margin ([`ops::Top2`]): what a
    /// replay needs to say where a proposal was a near-tie. `best` is `argmax_rows`'s on the
    /// host; a device layer gives its argmax only (runner-up `usize::MAX`, margin NaN: a
    /// near-tie cannot be told there).
    pub fn top2_rows(&self, x: &[f32], m: usize) -> Vec<ops::Top2> {
        let on_device = matches!(&self.kind, Kind::Device(_) | Kind::Dense(_)) && self.n > 0;
        if on_device {
            return self
                .argmax_rows(x, m)
                .into_iter()
                .map(|best| ops::Top2 {
                    best,
                    second: usize::MAX,
                    margin: f32::NAN,
                })
                .collect();
        }
        assert_eq!(x.len(), m * self.k, "x is [m, k]");
        let block = ((1usize << 26) / self.n.max(1)).max(1);
        let mut out = Vec::with_capacity(m);
        let mut i = 0;
        while i < m {
            let rows = block.min(m - i);
            let y = self.apply(&x[i * self.k..(i + rows) * self.k], rows);
            match self.n {
                0 => out.extend(std::iter::repeat_n(ops::top2(&[]), rows)),
                n => out.extend(y.chunks(n).map(ops::top2)),
            }
            i += rows;
        }
        out
    }

    fn argmax_blocks(&self, x: &[f32], m: usize, block: usize) -> Vec<usize> {
        assert_eq!(x.len(), m * self.k, "x is [m, k]");
        let mut out = Vec::with_capacity(m);
        let mut i = 0;
        while i < m {
            let rows = block.min(m - i);
            let xb = &x[i * self.k..(i + rows) * self.k];
            let device = match &self.kind {
                Kind::Device(l) if self.n > 0 => Some(device_timed(|| l.argmax_rows(xb, rows))),
                Kind::Dense(l) if self.n > 0 => Some(device_timed(|| l.argmax_rows(xb, rows))),
                _ => None,
            };
            match device {
                Some(r) => {
                    self.observe(xb);
                    out.extend(self.on_device(|| r, 0, rows));
                }
                None => {
                    let y = self.apply(xb, rows);
                    match self.n {
                        0 => out.extend(std::iter::repeat_n(0, rows)),
                        n => out.extend(y.chunks(n).map(ops::argmax)),
                    }
                }
            }
            i += rows;
        }
        out
    }

    /// Whether this layer runs on a device.
    pub fn is_on_device(&self) -> bool {
        matches!(self.kind, Kind::Device(_) | Kind::Dense(_))
    }

    /// The weights `[n, k]` of a layer on the CPU, as they are kept in memory.
    pub fn rows(&self) -> Option<Rows<'_>> {
        match &self.kind {
            Kind::F32(w) => Some(Rows::F32(w)),
            Kind::Half { dtype, bytes } => Rows::from_bytes(*dtype, bytes),
            Kind::Lazy(d) => Rows::from_bytes(d.dtype, self.lazy_bytes(d)?),
            Kind::Packed(p) => Some(Rows::Packed(p)),
            Kind::Device(_) | Kind::Dense(_) => None,
        }
    }

    /// A deferred tensor's bytes; `None` when the read failed (kept for `take_error`).
    fn lazy_bytes<'a>(&self, d: &'a Deferred) -> Option<&'a [u8]> {
        match d.get() {
            Ok(b) => Some(b),
            Err(e) => {
                let mut slot = self.shared.error.lock().expect("error slot");
                slot.get_or_insert(Fault::Read(e));
                None
            }
        }
    }

    /// The layer on the device, when this linear runs there.
    pub fn device_layer(&self) -> Option<DeviceLayer<'_>> {
        match &self.kind {
            Kind::Device(l) => Some(DeviceLayer::W4(l)),
            Kind::Dense(l) => Some(DeviceLayer::Dense(l)),
            _ => None,
        }
    }

    /// A device call's result (`len` values; none for no rows), or, on failure, `fill`s with the
    /// error kept for [`LinearSet::take_error`].
    fn on_device<T: Clone>(
        &self,
        r: impl FnOnce() -> gpu::Result<Vec<T>>,
        fill: T,
        len: usize,
    ) -> Vec<T> {
        if len == 0 {
            return Vec::new();
        }
        match device_timed(r) {
            Ok(y) => y,
            Err(e) => {
                let mut slot = self.shared.error.lock().expect("error slot");
                slot.get_or_insert(Fault::Device(self.module.clone(), e));
                vec![fill; len]
            }
        }
    }

    /// The hooks of [`Linear::apply`] on `x` (`[m, k]`) without the product: for a calibration
    /// that collects this linear's inputs but reads none of its outputs.
    pub fn observe_only(&self, x: &[f32]) {
        self.observe(x);
    }

    fn observe(&self, x: &[f32]) {
        if self.shared.collecting.load(Ordering::Relaxed) {
            if let Some(h) = self.shared.hessians.lock().expect("hessians").as_mut() {
                h.add(&self.module, x, x.len() / self.k.max(1), self.k);
            }
        }
        if !self.shared.observing.load(Ordering::Relaxed) {
            return;
        }
        // NaN-propagating: a NaN input makes the amax NaN, which calibrate refuses to write.
        let a = x.iter().fold(0f32, |m, v| {
            if v.is_nan() || m.is_nan() {
                f32::NAN
            } else {
                m.max(v.abs())
            }
        });
        let mut map = self.shared.amax.lock().expect("amax map");
        let e = map.entry(self.module.clone()).or_insert(0.0);
        *e = if a.is_nan() || e.is_nan() {
            f32::NAN
        } else {
            e.max(a)
        };
    }
}

/// The linears of one draft: how they are loaded ([`Exec`]), where each went, the input
/// observer and the first device error.
pub struct LinearSet {
    exec: Exec,
    shared: Arc<Shared>,
    /// Module → on the device (`true`) or the f32 path, for modules the checkpoint stores
    /// quantized.
    quantized: Mutex<BTreeMap<String, bool>>,
    /// Module → on the device (`true`) or the f32 path, for unquantized modules.
    dense: Mutex<BTreeMap<String, bool>>,
}

impl LinearSet {
    pub fn new(exec: Exec) -> LinearSet {
        LinearSet {
            exec,
            shared: Arc::default(),
            quantized: Mutex::default(),
            dense: Mutex::default(),
        }
    }

    /// How the set loads its layers.
    pub fn exec(&self) -> &Exec {
        &self.exec
    }

    /// Load logical tensor `name` (`….weight`, shape `[n, k]` already checked by the caller):
    /// with a device, to the device when it is a quantized module the kernels take or an
    /// unquantized one the dense path takes (module docs), else on the CPU.
    pub fn load(&self, lg: &Logical, name: &str, n: usize, k: usize) -> Result<Linear> {
        let module = name.strip_suffix(".weight").unwrap_or(name);
        self.load_as(lg, name, module, n, k)
    }

    /// [`LinearSet::load`] under another module name in the placement and the hooks: a tensor
    /// that is not the draft's own (the DFlash target's lm_head, `lm_head (target)`), so that a
    /// draft module of the same name is never taken for it.
    pub fn load_as(
        &self,
        lg: &Logical,
        name: &str,
        module: &str,
        n: usize,
        k: usize,
    ) -> Result<Linear> {
        let module = module.to_string();
        let qm = lg.module(name);
        let mut kind = None;
        if let (Exec::Device { dev, act, .. }, Some(m)) = (&self.exec, qm) {
            let layer = W4Layout::from_module(lg, m).and_then(|l| {
                if l.k % 8 != 0 {
                    return Err(GpuError::Unsupported("K", format!("{} % 8 != 0", l.k)));
                }
                gpu::DeviceLinear::new(dev.clone(), &l, *act)
            });
            match layer {
                Ok(l) => kind = Some(Kind::Device(l)),
                Err(GpuError::Unsupported(..)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if qm.is_some() {
            self.quantized
                .lock()
                .expect("placement")
                .insert(module.clone(), kind.is_some());
        }
        let missing = || Error::Source {
            path: lg.ck.weights.dir.clone(),
            msg: format!("has no tensor `{name}`"),
            hint: None,
        };
        let stored_half = match (qm, lg.ck.weights.info(name)) {
            (None, Some(t)) if matches!(t.dtype, Dtype::BF16 | Dtype::F16) => Some(t),
            _ => None,
        };
        // On a device, an unquantized tensor goes there too (`gpu::DenseLinear`).
        let dev = match &self.exec {
            Exec::Device { dev, .. } if qm.is_none() => Some(dev),
            _ => None,
        };
        let kind = match (kind, stored_half) {
            (Some(k), _) => k,
            (None, Some(t)) => {
                // Kept as stored (on the device in its own dtype), or read at its first product
                // (`Exec::F32Lazy`); the mapped pages are dropped once copied.
                let shard = lg.ck.weights.shard_of(name).ok_or_else(missing)?;
                let data = shard.view(t).data;
                let dense = match dev {
                    Some(dev) => dense_or_cpu(
                        gpu::DenseLinear::from_stored(dev.clone(), t.dtype, data, n, k).map(Some),
                    )?,
                    None => None,
                };
                let kind = match (dense, &self.exec) {
                    (Some(l), _) => Kind::Dense(l),
                    (None, Exec::F32Lazy) => Kind::Lazy(Deferred {
                        dtype: t.dtype,
                        file: shard.file().try_clone().map_err(|e| Error::Source {
                            path: shard.path().to_path_buf(),
                            msg: format!("cannot reopen: {e}"),
                            hint: None,
                        })?,
                        path: shard.path().to_path_buf(),
                        offset: shard.file_offset(t),
                        len: data.len(),
                        bytes: std::sync::OnceLock::new(),
                    }),
                    (None, _) => Kind::Half {
                        dtype: t.dtype,
                        bytes: data.to_vec(),
                    },
                };
                shard.release(t);
                kind
            }
            (None, None) if qm.is_some() => match qm.and_then(|m| Packed::load(lg, m)) {
                Some(p) => Kind::Packed(p),
                None => Kind::F32(lg.read_f32(name).ok_or_else(missing)?),
            },
            (None, None) => {
                let w = lg.read_f32(name).ok_or_else(missing)?;
                // An F32 tensor goes to the device only when bf16 holds it exactly.
                let dense = match dev {
                    Some(dev) => {
                        dense_or_cpu(gpu::DenseLinear::from_f32_exact(dev.clone(), &w, n, k))?
                    }
                    None => None,
                };
                match dense {
                    Some(l) => Kind::Dense(l),
                    None => Kind::F32(w),
                }
            }
        };
        if qm.is_none() {
            self.dense
                .lock()
                .expect("placement")
                .insert(module.clone(), matches!(kind, Kind::Dense(_)));
        }
        Ok(Linear {
            module,
            n,
            k,
            kind,
            shared: self.shared.clone(),
        })
    }

    /// The quantized modules loaded so far: (on the device, on the f32 path). With
    /// [`Exec::F32`] every one is on the f32 path.
    pub fn placement(&self) -> (Vec<String>, Vec<String>) {
        split(&self.quantized.lock().expect("placement"))
    }

    /// A layer from f32 values `[n, k]` that are no checkpoint's tensor (the tests' device
    /// layers), named `module` in the placement: with a device, uploaded when bf16 holds every
    /// value exactly, as [`LinearSet::load`] places an F32 tensor (recorded in
    /// [`LinearSet::dense_placement`] either way); `None` otherwise and with [`Exec::F32`].
    #[cfg(test)]
    pub fn load_values(
        &self,
        module: &str,
        w: &[f32],
        n: usize,
        k: usize,
    ) -> Result<Option<Linear>> {
        let Exec::Device { dev, .. } = &self.exec else {
            return Ok(None);
        };
        let dense = dense_or_cpu(gpu::DenseLinear::from_f32_exact(dev.clone(), w, n, k))?;
        self.dense
            .lock()
            .expect("placement")
            .insert(module.to_string(), dense.is_some());
        Ok(dense.map(|l| Linear {
            module: module.to_string(),
            n,
            k,
            kind: Kind::Dense(l),
            shared: self.shared.clone(),
        }))
    }

    /// The unquantized modules loaded so far: (on the device, on the f32 path — with a device,
    /// F32 tensors that bf16 would round). With [`Exec::F32`] every one is on the f32 path.
    pub fn dense_placement(&self) -> (Vec<String>, Vec<String>) {
        split(&self.dense.lock().expect("placement"))
    }

    /// Start (`true`) or stop recording the abs-max of every linear's input.
    pub fn observe(&self, on: bool) {
        self.shared.observing.store(on, Ordering::Relaxed);
    }

    /// Start collecting into `set` (`runtime::hessian`: `Σ x xᵀ` or its diagonal, of the
    /// inputs of the modules it wants), replacing any collection under way.
    pub fn collect_hessians(&self, set: HessianSet) {
        *self.shared.hessians.lock().expect("hessians") = Some(set);
        self.shared.collecting.store(true, Ordering::Relaxed);
    }

    /// While a collection runs, whether it wants `module`'s inputs (`None`: no collection). A
    /// runtime may skip a linear whose output only a figure the collection does not need reads
    /// (the EAGLE-3 lm_head during a calibration that does not quantize it).
    pub fn collects(&self, module: &str) -> Option<bool> {
        if !self.shared.collecting.load(Ordering::Relaxed) {
            return None;
        }
        self.shared
            .hessians
            .lock()
            .expect("hessians")
            .as_ref()
            .map(|h| h.wants(module))
    }

    /// Stop collecting and hand the moments over: module → its input's `Σ x xᵀ` (or its
    /// diagonal). Empty when nothing was collected.
    pub fn take_hessians(&self) -> BTreeMap<String, Arc<Hessian>> {
        self.shared.collecting.store(false, Ordering::Relaxed);
        match self.shared.hessians.lock().expect("hessians").take() {
            Some(h) => h.finish(),
            None => BTreeMap::new(),
        }
    }

    /// Module → `max |x|` over every input it saw while observing (modules never called are
    /// absent).
    pub fn input_amax(&self) -> BTreeMap<String, f32> {
        self.shared.amax.lock().expect("amax map").clone()
    }

    /// The first device failure since the last call, as an error naming the module.
    pub fn take_error(&self) -> Option<Error> {
        let (what, e) = match self.shared.error.lock().expect("error slot").take()? {
            Fault::Device(module, e) => (format!("linear `{module}`"), e),
            Fault::Step(what, e) => (format!("the draft step on the device ({what})"), e),
            Fault::Read(e) => return Some(e),
        };
        Some(Error::Device {
            msg: format!("{what} on {}: {e}", self.exec.name().unwrap_or_default()),
            hint: e.hint(),
        })
    }

    /// Keep a device-resident step's failure at `what` for [`LinearSet::take_error`] (the first
    /// failure wins).
    pub fn record_step_fault(&self, what: &str, e: GpuError) {
        let mut slot = self.shared.error.lock().expect("error slot");
        slot.get_or_insert(Fault::Step(what.to_string(), e));
    }
}

/// Module → on the device: (on the device, on the f32 path).
fn split(placed: &BTreeMap<String, bool>) -> (Vec<String>, Vec<String>) {
    let (dev, cpu): (Vec<_>, Vec<_>) = placed.iter().partition(|(_, &d)| d);
    (
        dev.into_iter().map(|(m, _)| m.clone()).collect(),
        cpu.into_iter().map(|(m, _)| m.clone()).collect(),
    )
}

/// A dense upload, or `None` (the CPU path) for a layer the dense path does not take.
fn dense_or_cpu(r: gpu::Result<Option<gpu::DenseLinear>>) -> Result<Option<gpu::DenseLinear>> {
    match r {
        Ok(l) => Ok(l),
        Err(GpuError::Unsupported(..)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Checkpoint;
    use std::path::Path;

    fn draft() -> Checkpoint {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/kimi-k2.5-tiny/eagle3");
        Checkpoint::open(p.to_str().unwrap()).unwrap()
    }

    /// `Exec::F32Lazy` reads an unquantized tensor at its first product, not at load, and gives
    /// the same products as `Exec::F32` bit for bit; a read that fails is an error naming the
    /// file (`take_error`), zeros in the meantime, not a panic.
    #[test]
    fn lazy_tensors_are_read_at_the_first_product_and_equal_the_loaded_ones() {
        let dir = tempfile::tempdir().unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/kimi-k2.5-tiny/eagle3");
        for e in std::fs::read_dir(&src).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
        }
        let ck = Checkpoint::open(dir.path().to_str().unwrap()).unwrap();
        let lg = Logical::new(&ck).unwrap();
        let name = "midlayer.mlp.down_proj.weight";
        let s = lg.shape(name).unwrap();
        let x: Vec<f32> = (0..3 * s[1]).map(|i| (i as f32 * 0.37).sin()).collect();
        let eager = LinearSet::new(Exec::F32)
            .load(&lg, name, s[0], s[1])
            .unwrap();
        let set = LinearSet::new(Exec::F32Lazy);
        let lazy = set.load(&lg, name, s[0], s[1]).unwrap();
        let Kind::Lazy(d) = &lazy.kind else {
            panic!("deferred")
        };
        assert!(d.bytes.get().is_none(), "not read at load");
        assert_eq!(lazy.apply(&x, 3), eager.apply(&x, 3));
        assert_eq!(lazy.apply_ref(&x, 3), eager.apply_ref(&x, 3));
        assert!(set.take_error().is_none());
        // A second layer whose file is cut short before its first product.
        let broken = set.load(&lg, name, s[0], s[1]).unwrap();
        let shard = ck.weights.shard_of(name).unwrap();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(shard.path())
            .unwrap();
        f.set_len(shard.file_offset(ck.weights.info(name).unwrap()))
            .unwrap();
        assert_eq!(broken.apply(&x, 3), vec![0.0; 3 * s[0]]);
        let e = set.take_error().expect("kept").to_string();
        assert!(e.contains(&shard.path().display().to_string()), "{e}");
    }

    /// The CPU path is `ops::gemm::matmul_nt` over the stored rows and `ops::linear_ref` over
    /// their f32 values bit for bit, the stored precision is kept (the fixture is BF16), and the
    /// observer records `max |x|` per module over every call while on, nothing while off.
    #[test]
    fn cpu_path_is_the_blocked_product_over_stored_rows_and_the_observer_takes_the_max() {
        let ck = draft();
        let lg = Logical::new(&ck).unwrap();
        let set = LinearSet::new(Exec::F32);
        let name = "midlayer.mlp.down_proj.weight";
        let s = lg.shape(name).unwrap();
        let l = set.load(&lg, name, s[0], s[1]).unwrap();
        assert_eq!(l.module, "midlayer.mlp.down_proj");
        let w = lg.read_f32(name).unwrap();
        let x: Vec<f32> = (0..3 * s[1]).map(|i| (i as f32 * 0.37).sin()).collect();
        assert!(matches!(l.rows(), Some(Rows::Bf16(_))), "kept as stored");
        let rows = l.rows().unwrap();
        assert_eq!(l.apply(&x, 3), gemm::matmul_nt(&x, 3, s[1], rows, s[0]));
        assert_eq!(l.apply_ref(&x, 3), ops::linear_ref(&x, 3, s[1], &w, s[0]));
        assert!(set.input_amax().is_empty(), "not observing");
        set.observe(true);
        l.apply(&x[..s[1]], 1);
        let mut y = x.clone();
        y[5] = -7.5;
        l.apply(&y, 3);
        set.observe(false);
        l.apply(&vec![100.0; s[1]], 1);
        assert_eq!(set.input_amax()["midlayer.mlp.down_proj"], 7.5);
        assert_eq!(set.placement(), (vec![], vec![]), "nothing quantized");
        assert!(set.take_error().is_none());
        // The argmax of each row, a block of rows at a time or all at once, is the argmax of
        // the rows of `apply`.
        let y = l.apply(&x, 3);
        let want: Vec<usize> = y.chunks(s[0]).map(ops::argmax).collect();
        assert_eq!(l.argmax_rows(&x, 3), want);
        assert_eq!(l.argmax_blocks(&x, 3, 2), want);
        assert_eq!(l.argmax_blocks(&x, 3, 1), want);
        // top2_rows: the same best, and each row's runner-up and margin from its outputs.
        let t = l.top2_rows(&x, 3);
        assert_eq!(t.iter().map(|t| t.best).collect::<Vec<_>>(), want);
        assert_eq!(t, y.chunks(s[0]).map(ops::top2).collect::<Vec<_>>());
    }

    /// With a device, every unquantized linear of the (BF16) fixture draft loads on it through
    /// the dense path: `apply` is the plain f32 product of the bf16-rounded input within
    /// `gpu::reference::DENSE_REL_L1_TOL`, `argmax_rows` is the device's argmax of those very
    /// outputs, and the placement says so; f32 values bf16 would round stay on the CPU.
    #[test]
    fn device_exec_puts_unquantized_linears_on_the_device() {
        use crate::gpu::reference::{argmax_ref, first_violation, DENSE_REL_L1_TOL};
        let ck = draft();
        let lg = Logical::new(&ck).unwrap();
        let set = LinearSet::new(Exec::device(Some(Arc::new(gpu::CpuEmu::nvidia()))));
        for name in ["lm_head.weight", "fc.weight"] {
            let s = lg.shape(name).unwrap();
            let (n, k) = (s[0], s[1]);
            let l = set.load(&lg, name, n, k).unwrap();
            assert!(l.is_on_device() && l.rows().is_none(), "{name}");
            let w = lg.read_f32(name).unwrap();
            let m = 5;
            let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
            let xr: Vec<f32> = x
                .iter()
                .map(|&v| Act::Bf16.to_f32(Act::Bf16.from_f32(v)))
                .collect();
            let y = l.apply(&x, m);
            assert_eq!(l.apply_ref(&x, m), y, "one arithmetic on a device");
            let want = ops::linear_ref(&xr, m, k, &w, n);
            let abs = |v: &[f32]| v.iter().map(|a| a.abs()).collect::<Vec<_>>();
            let l1 = ops::linear_ref(&abs(&xr), m, k, &abs(&w), n);
            assert_eq!(
                first_violation(&y, &want, &l1, DENSE_REL_L1_TOL),
                None,
                "{name}"
            );
            let best: Vec<usize> = y.chunks(n).map(argmax_ref).collect();
            assert_eq!(l.argmax_rows(&x, m), best);
            assert_eq!(l.argmax_blocks(&x, m, 2), best);
        }
        assert!(set.take_error().is_none());
        let head = ["fc".to_string(), "lm_head".to_string()];
        assert_eq!(set.dense_placement(), (head.to_vec(), vec![]));
        assert_eq!(set.placement(), (vec![], vec![]), "nothing quantized");
        // Values bf16 holds exactly go up; one that would round keeps the caller's f32 path.
        let exact = set.load_values("t", &[1.0, 2.0], 1, 2).unwrap().unwrap();
        assert_eq!(exact.apply(&[1.0, 1.0], 1), [3.0]);
        assert!(set.load_values("r", &[1.0, 0.1], 1, 2).unwrap().is_none());
        let (on, off) = set.dense_placement();
        assert!(
            on.contains(&"t".to_string()) && off == ["r"],
            "{on:?} {off:?}"
        );
        assert!(LinearSet::new(Exec::F32)
            .load_values("t", &[1.0], 1, 1)
            .unwrap()
            .is_none());
    }

    /// A device failure inside `apply` / `argmax_rows` is kept for `take_error`, not a panic.
    #[test]
    fn device_errors_are_kept_not_panics() {
        let set = LinearSet::new(Exec::device(Some(Arc::new(gpu::CpuEmu::nvidia()))));
        let l = set.load_values("t", &[1.0, 2.0], 1, 2).unwrap().unwrap();
        // A wrong input length is the device's typed error (the runtimes never pass one).
        assert_eq!(l.apply(&[1.0, 1.0, 1.0], 1), [0.0]);
        let e = set.take_error().expect("kept").to_string();
        assert!(
            e.contains("linear `t`") && e.contains("x has 3 values"),
            "{e}"
        );
    }
}
