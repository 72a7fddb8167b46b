//! Reading a quantized checkpoint back as plain weights: finds each quantized module and how it
//! is stored (Quark per-channel, per-group, `ptpc_fp8` or two-stage `int4_fp8`;
//! compressed-tensors `pack-quantized`, `float-quantized`, `int-quantized` or
//! `nvfp4-pack-quantized`; ModelOpt `W4A16_AWQ`/`W4A8_AWQ`, FP8 or `NVFP4`/`W4A16_NVFP4`), and
//! gives every tensor the original model would have had, dequantized (`w = q · s`, `f8 · s`,
//! `q · s2 · s1`, or NVFP4's `e2m1 · f8(s) / g` / `e2m1 · f8(s) · s2`) where needed, each
//! format by its own tool's arithmetic.
//! Which format the checkpoint is in is [`Format::of`]'s to say; which layout a module is in,
//! each format's reader's (`quark::read`, `compressed_tensors::read`, `modelopt::read`, shown a
//! [`Probe`], and the FP8 layout they share, here); the decoding is each format's own
//! arithmetic, its [`Layout`] beside its encoder, reached from a [`Stored`] by [`layout`], the
//! one exhaustive match (the layouts and [`QModule`] are `quant::stored`'s). `dequantize`,
//! `diff`, `inspect` and the runtimes (`runtime::packed`, `gpu::layout`) are built on this.

use std::collections::{BTreeMap, BTreeSet};

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::io::Dtype;
use crate::quant::format::Format;
use crate::quant::math::fp8::Fp8;
use crate::quant::math::int4::Int4;
use crate::quant::stored::{Gemv, Packing, Parts, Probe};
pub use crate::quant::stored::{Layout, QModule, Stored};
use crate::quant::{compressed_tensors, modelopt, quark};

/// A checkpoint seen as its unquantized tensors.
pub struct Logical<'a> {
    pub ck: &'a Checkpoint,
    /// Logical tensor names (quantized modules appear once, as `X.weight`), sorted.
    pub names: Vec<String>,
    pub modules: BTreeMap<String, QModule>,
}

impl<'a> Logical<'a> {
    /// Find the quantized modules of `ck` (none for an unquantized checkpoint).
    pub fn new(ck: &'a Checkpoint) -> Result<Logical<'a>> {
        let cfg = ck
            .config
            .as_ref()
            .and_then(|c| c.root.get("quantization_config"));
        let hf_quant_config = ck.weights.dir.join("hf_quant_config.json").is_file();
        let format = Format::of(cfg, hf_quant_config).and_then(|f| f.ok());
        let mut modules = BTreeMap::new();
        let w = &ck.weights;
        for t in w.infos() {
            let (module, last) = t.name.rsplit_once('.').unwrap_or(("", &t.name));
            let p = Probe {
                w,
                module,
                last,
                t,
                scale: w.info(&format!("{module}.weight_scale")),
                config: cfg,
            };
            let q = match format {
                Some(Format::Quark) => quark::read::read(&p)?,
                Some(Format::CompressedTensors) => compressed_tensors::read::read(&p)?,
                Some(Format::Modelopt) => modelopt::read::read(&p)?,
                None => None,
            };
            let q = match (q, format) {
                (None, Some(_)) => read_fp8(&p)?,
                (q, _) => q,
            };
            if let Some(q) = q {
                modules.insert(q.module.clone(), q);
            }
        }
        let hidden: BTreeSet<&str> = modules
            .values()
            .flat_map(|m| m.parts.iter().map(String::as_str))
            .collect();
        let mut names: BTreeSet<String> = w
            .names()
            .filter(|n| !hidden.contains(n))
            .map(String::from)
            .collect();
        names.extend(modules.keys().map(|m| format!("{m}.weight")));
        Ok(Logical {
            ck,
            names: names.into_iter().collect(),
            modules,
        })
    }

    /// The quantized module behind logical tensor `name`, if any.
    pub fn module(&self, name: &str) -> Option<&QModule> {
        name.strip_suffix(".weight")
            .and_then(|m| self.modules.get(m))
    }

    /// Shape of a logical tensor.
    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        match self.module(name) {
            Some(m) => Some(vec![m.rows, m.cols]),
            None => self.ck.weights.info(name).map(|t| t.shape.clone()),
        }
    }

    /// The tensors of module `m`, as its [`Layout`] reads them.
    pub fn parts<'m>(&'m self, m: &'m QModule) -> Parts<'m> {
        Parts {
            w: &self.ck.weights,
            m,
        }
    }

    /// Codes and scales of an integer-coded module (for `int4_fp8`: the INT4 stage, scales
    /// `s2`). Panics for FP8 and NVFP4 weights, which have no integer codes.
    pub fn int4(&self, m: &QModule) -> Int4 {
        layout(&m.stored)
            .int4(&self.parts(m))
            .unwrap_or_else(|kind| panic!("{}: {kind} weights have no integer codes", m.module))
    }

    /// The dequantized weights of a quantized module, `[rows, cols]` f32.
    pub fn dequantize(&self, m: &QModule) -> Vec<f32> {
        layout(&m.stored).dequantize(&self.parts(m))
    }

    /// Values of a logical tensor as f32 (dequantized `q · s` for quantized modules).
    pub fn read_f32(&self, name: &str) -> Option<Vec<f32>> {
        match self.module(name) {
            Some(m) => Some(self.dequantize(m)),
            None => self.ck.weights.tensor(name).map(|v| v.to_f32()),
        }
    }
}

/// The read side of layout `s`, implemented beside its format's encoder: the one place a
/// [`Stored`] meets its decoder (exhaustive, so a new layout without one does not compile).
pub fn layout(s: &Stored) -> Box<dyn Layout> {
    match *s {
        Stored::QuarkChannel { order } => Box::new(quark::ChannelLayout { order }),
        Stored::QuarkGroup { group, order } => {
            Box::new(quark::int4_group::GroupLayout { group, order })
        }
        Stored::QuarkGroupAsym { group, order } => {
            Box::new(quark::uint4::AsymLayout { group, order })
        }
        Stored::QuarkInt4Fp8 { order } => Box::new(quark::fp8::Int4Fp8Layout { order }),
        Stored::CtPacked { group } => Box::new(compressed_tensors::PackedLayout { group }),
        Stored::CtInt { group } => Box::new(compressed_tensors::fp8_w4a8::IntLayoutW4A8 { group }),
        Stored::CtNvfp4 => Box::new(compressed_tensors::nvfp4::LAYOUT),
        Stored::ModeloptInt4 { group } => Box::new(modelopt::Int4Layout { group }),
        Stored::ModeloptNvfp4 => Box::new(modelopt::nvfp4::LAYOUT),
        Stored::Fp8 { per_row } => Box::new(Fp8Layout { per_row }),
    }
}

/// The FP8 layout every format writes alike (`Stored::Fp8`), read back: `f8(code) · s`, kept
/// packed as its codes.
pub struct Fp8Layout {
    pub per_row: bool,
}

impl Fp8Layout {
    fn codes(&self, p: &Parts) -> Fp8 {
        let mut scales = p.f32("weight_scale");
        if !self.per_row {
            scales.truncate(1);
        }
        Fp8 {
            rows: p.m.rows,
            cols: p.m.cols,
            scales,
            codes: p.data("weight").to_vec(),
        }
    }
}

impl Layout for Fp8Layout {
    fn dequantize(&self, p: &Parts) -> Vec<f32> {
        self.codes(p).dequantize_ref()
    }
    fn int4(&self, _: &Parts) -> std::result::Result<Int4, &'static str> {
        Err("FP8")
    }
    fn packed(&self, p: &Parts) -> Option<Packing> {
        Some(Packing::Fp8(self.codes(p)))
    }
    fn gemv(&self) -> Option<Gemv> {
        None
    }
}

/// The FP8 layout every format writes alike (Quark `ptpc_fp8`, compressed-tensors
/// `float-quantized`, ModelOpt FP8): an F8_E4M3 `weight` with one scale per row or per tensor.
fn read_fp8(p: &Probe) -> Result<Option<QModule>> {
    let (module, t, w) = (p.module, p.t, p.w);
    let Some(s) = p.scale else {
        return Ok(None);
    };
    if (p.last, t.dtype) != ("weight", Dtype::F8_E4M3) {
        return Ok(None);
    }
    let (rows, cols) = match t.shape.as_slice() {
        [r, c] => (*r, *c),
        _ => return Err(p.err(t, format!("FP8 weight of shape {:?} is not 2-D", t.shape))),
    };
    let per_row = match s.shape.as_slice() {
                    [] | [1] | [1, 1] => false,
                    [o] | [o, 1] if *o == rows => true,
                    _ => return Err(p.err(t, format!("FP8 weight {:?} with scale {:?} is no FP8 layout kquant knows (one scale per row or per tensor)", t.shape, s.shape))),
                };
    let mut parts = vec![t.name.clone(), s.name.clone()];
    for extra in ["weight_zero_point", "input_scale", "input_zero_point"] {
        parts.extend(w.info(&format!("{module}.{extra}")).map(|z| z.name.clone()));
    }
    Ok(Some(p.found(Stored::Fp8 { per_row }, rows, cols, parts)))
}
