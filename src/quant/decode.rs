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
//! arithmetic, dispatched from [`Stored`] (the layouts and [`QModule`] are `quant::stored`'s). `dequantize`, `diff`, `inspect` and the runtimes are
//! built on this.

use std::collections::{BTreeMap, BTreeSet};

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::io::Dtype;
use crate::quant::format::Format;
use crate::quant::math::fp4::Nvfp4;
use crate::quant::math::fp8::Fp8;
use crate::quant::math::int4::Int4;
use crate::quant::stored::Probe;
pub use crate::quant::stored::{QModule, Stored};
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

    /// Codes and scales of an integer-coded module (for `int4_fp8`: the INT4 stage, scales
    /// `s2`). Panics for FP8 weights, which have no integer codes ([`Logical::fp8`]).
    pub fn int4(&self, m: &QModule) -> Int4 {
        let w = &self.ck.weights;
        let data = |suffix: &str| {
            w.tensor(&format!("{}.{suffix}", m.module))
                .expect("checked")
        };
        let scale = data("weight_scale").to_f32();
        match m.stored {
            Stored::QuarkChannel { order } => {
                quark::decode(data("weight").data, &scale, m.rows, m.cols, order)
            }
            Stored::QuarkGroupAsym { group, order } => {
                // Codes carried as `q − zp` (−15..=15), so `dequantize_ref` gives `(q − zp) · s`.
                let o = quark::Options {
                    layout: quark::Layout::Model,
                    version: quark::Version::V013,
                    order,
                };
                let u = quark::uint4::decode(
                    data("weight").data,
                    &scale,
                    data("weight_zero_point").data,
                    m.rows,
                    m.cols,
                    group,
                    &o,
                );
                let g = m.cols / group;
                Int4 {
                    rows: m.rows,
                    cols: m.cols,
                    group,
                    codes: (0..m.rows * m.cols)
                        .map(|i| {
                            let j = (i / m.cols) * g + (i % m.cols) / group;
                            u.codes[i] as i8 - u.zero_points[j] as i8
                        })
                        .collect(),
                    scales: u.scales,
                }
            }
            Stored::QuarkGroup { group, order } => {
                quark::int4_group::decode(data("weight").data, &scale, m.rows, m.cols, group, order)
            }
            Stored::CtPacked { group } => compressed_tensors::decode(
                data("weight_packed").data,
                &scale,
                m.rows,
                m.cols,
                group,
            ),
            Stored::QuarkInt4Fp8 { order } => {
                let s2 = data("weight_scale_2").to_f32();
                quark::decode(data("weight").data, &s2, m.rows, m.cols, order)
            }
            Stored::CtInt { group } => compressed_tensors::fp8_w4a8::int_decode(
                data("weight").data,
                &scale,
                m.rows,
                m.cols,
                group,
            ),
            Stored::ModeloptInt4 { group } => {
                modelopt::int4_decode(data("weight").data, &scale, m.rows, m.cols, group)
            }
            Stored::Fp8 { .. } => panic!("{}: FP8 weights have no integer codes", m.module),
            Stored::ModeloptNvfp4 | Stored::CtNvfp4 => {
                panic!("{}: NVFP4 weights have no integer codes", m.module)
            }
        }
    }

    /// Codes and scales of an FP8 module. Panics for other layouts.
    pub fn fp8(&self, m: &QModule) -> Fp8 {
        let w = &self.ck.weights;
        let data = |suffix: &str| {
            w.tensor(&format!("{}.{suffix}", m.module))
                .expect("checked")
        };
        match m.stored {
            Stored::Fp8 { per_row } => {
                let mut scales = data("weight_scale").to_f32();
                if !per_row {
                    scales.truncate(1);
                }
                Fp8 {
                    rows: m.rows,
                    cols: m.cols,
                    scales,
                    codes: data("weight").data.to_vec(),
                }
            }
            _ => panic!("{}: not an FP8 layout", m.module),
        }
    }

    /// Codes, block scales and per-tensor scale of an NVFP4 module (`global` is ModelOpt's
    /// `weight_scale_2` or compressed-tensors' `weight_global_scale`). Panics for other layouts.
    pub fn nvfp4(&self, m: &QModule) -> Nvfp4 {
        let w = &self.ck.weights;
        let data = |suffix: &str| {
            w.tensor(&format!("{}.{suffix}", m.module))
                .expect("checked")
        };
        match m.stored {
            Stored::ModeloptNvfp4 => modelopt::nvfp4::decode(
                data("weight").data,
                data("weight_scale").data,
                data("weight_scale_2").to_f32()[0],
                m.rows,
                m.cols,
            ),
            Stored::CtNvfp4 => compressed_tensors::nvfp4::decode(
                data("weight_packed").data,
                data("weight_scale").data,
                data("weight_global_scale").to_f32()[0],
                m.rows,
                m.cols,
            ),
            _ => panic!("{}: not an NVFP4 layout", m.module),
        }
    }

    /// The dequantized weights of a quantized module, `[rows, cols]` f32.
    pub fn dequantize(&self, m: &QModule) -> Vec<f32> {
        match m.stored {
            Stored::Fp8 { .. } => self.fp8(m).dequantize_ref(),
            Stored::CtNvfp4 => compressed_tensors::nvfp4::dequantize(&self.nvfp4(m)),
            Stored::QuarkInt4Fp8 { order } => {
                let w = &self.ck.weights;
                let data = |suffix: &str| {
                    w.tensor(&format!("{}.{suffix}", m.module))
                        .expect("checked")
                };
                quark::fp8::int4_fp8_decode(
                    data("weight").data,
                    data("weight_scale").to_f32()[0],
                    &data("weight_scale_2").to_f32(),
                    m.rows,
                    m.cols,
                    order,
                )
                .dequantize_ref()
            }
            Stored::ModeloptInt4 { .. } | Stored::ModeloptNvfp4 => {
                let w = &self.ck.weights;
                let mut v = match m.stored {
                    Stored::ModeloptNvfp4 => modelopt::nvfp4::dequantize(&self.nvfp4(m)),
                    _ => self.int4(m).dequantize_ref(),
                };
                // TensorRT-LLM multiplies the input by pre_quant_scale: the weight it computes
                // with is `w · pqs` along the input dimension.
                if let Some(p) = w.tensor(&format!("{}.pre_quant_scale", m.module)) {
                    let p = p.to_f32();
                    for row in v.chunks_mut(m.cols.max(1)) {
                        for (x, s) in row.iter_mut().zip(&p) {
                            *x *= s;
                        }
                    }
                }
                v
            }
            _ => self.int4(m).dequantize_ref(),
        }
    }

    /// Values of a logical tensor as f32 (dequantized `q · s` for quantized modules).
    pub fn read_f32(&self, name: &str) -> Option<Vec<f32>> {
        match self.module(name) {
            Some(m) => Some(self.dequantize(m)),
            None => self.ck.weights.tensor(name).map(|v| v.to_f32()),
        }
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
    Ok(Some(QModule {
        module: module.into(),
        stored: Stored::Fp8 { per_row },
        rows,
        cols,
        parts,
    }))
}
