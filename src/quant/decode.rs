//! Reading a quantized checkpoint back as plain weights: finds each quantized module and how it
//! is stored (Quark per-channel, per-group, `ptpc_fp8` or two-stage `int4_fp8`;
//! compressed-tensors `pack-quantized`, `float-quantized`, `int-quantized` or
//! `nvfp4-pack-quantized`; ModelOpt `W4A16_AWQ`/`W4A8_AWQ`, FP8 or `NVFP4`/`W4A16_NVFP4`), and
//! gives every tensor the original model would have had, dequantized (`w = q · s`, `f8 · s`,
//! `q · s2 · s1`, or NVFP4's `e2m1 · f8(s) / g` / `e2m1 · f8(s) · s2`) where needed, each
//! format by its own tool's arithmetic.
//! `dequantize` and `diff` are built on this.

use std::collections::{BTreeMap, BTreeSet};

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::io::{Dtype, TensorInfo};
use crate::quant::math::fp4::Nvfp4;
use crate::quant::math::fp8::Fp8;
use crate::quant::math::int4::Int4;
use crate::quant::math::pack::Order;
use crate::quant::{compressed_tensors, modelopt, quark};

/// How one quantized module is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// Quark per-channel: I32 `[out, in/8]`, scale `[out]`.
    QuarkChannel { order: Order },
    /// Quark per-group: I32 `[in, out/8]` (transposed), scale `[in/G, out]`.
    QuarkGroup { group: usize, order: Order },
    /// Quark per-group asymmetric UINT4 (`uint4_wo_*`): the per-group layout with unsigned
    /// nibbles and zero points `[in/G, out/8]` packed the same way: `w = (q − zp) · s`.
    QuarkGroupAsym { group: usize, order: Order },
    /// compressed-tensors `pack-quantized`: `weight_packed` `[out, in/8]`, scale `[out, in/G]`.
    CtPacked { group: usize },
    /// FP8 E4M3 `weight` `[out, in]` with one scale per row (Quark `ptpc_fp8` `[out]`,
    /// compressed-tensors `float-quantized` `[out, 1]`) or one per tensor.
    Fp8 { per_row: bool },
    /// Quark two-stage `int4_fp8`: I32 `[out, in/8]`, `weight_scale` F32 `[]` (FP8 stage),
    /// `weight_scale_2` F32 `[out]` (INT4 stage); `w = q · s2 · s1`.
    QuarkInt4Fp8 { order: Order },
    /// compressed-tensors `int-quantized`: I8 `weight` `[out, in]`, scale `[out, in/G]`.
    CtInt { group: usize },
    /// ModelOpt `W4A16_AWQ` / `W4A8_AWQ`: U8 `weight` `[⌈out/2⌉, in]` (two output rows per
    /// byte), F32 scale `[out, in/G]`, optional `pre_quant_scale` `[in]`: `w = q · s · pqs`.
    ModeloptInt4 { group: usize },
    /// ModelOpt `NVFP4` / `W4A16_NVFP4`: U8 `weight` `[out, in/2]` (E2M1, two input columns per
    /// byte), E4M3 scale `[out, in/16]`, F32 `weight_scale_2` `[]`: `w = e2m1 · (s · s2)`.
    ModeloptNvfp4,
    /// compressed-tensors `nvfp4-pack-quantized`: U8 `weight_packed` `[out, in/2]`, E4M3
    /// `weight_scale` `[out, in/16]`, F32 `weight_global_scale` `[1]`: `w = e2m1 · (s / g)`.
    CtNvfp4,
}

/// One quantized module.
#[derive(Debug, Clone)]
pub struct QModule {
    pub module: String,
    pub stored: Stored,
    pub rows: usize,
    pub cols: usize,
    /// The checkpoint tensors that hold it.
    pub parts: Vec<String>,
}

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
        // ModelOpt's legacy form: no quant_method in config.json, only hf_quant_config.json.
        let method = cfg
            .and_then(|q| q.get("quant_method"))
            .and_then(|m| m.as_str())
            .unwrap_or(if ck.weights.dir.join("hf_quant_config.json").is_file() {
                "modelopt"
            } else {
                ""
            });
        let quark_order = match cfg
            .and_then(|q| q.pointer("/export/pack_method"))
            .and_then(|m| m.as_str())
        {
            Some("order") => Order::Sequential,
            _ => Order::Reorder,
        };
        let quark_uint4 = cfg
            .and_then(|q| q.pointer("/global_quant_config/weight/dtype"))
            .and_then(|d| d.as_str())
            == Some("uint4");
        let mut modules = BTreeMap::new();
        let w = &ck.weights;
        let info = |n: &str| w.info(n);
        let err = |t: &TensorInfo, msg: String| Error::Tensor {
            path: w
                .shard_of(&t.name)
                .map(|s| s.path().to_path_buf())
                .unwrap_or_default(),
            tensor: t.name.clone(),
            msg,
        };
        for t in w.infos() {
            let (module, last) = t.name.rsplit_once('.').unwrap_or(("", &t.name));
            let scale = info(&format!("{module}.weight_scale"));
            let q = match (method, last, t.dtype, scale) {
                ("compressed-tensors", "weight_packed", Dtype::U8, Some(s)) => {
                    let g = info(&format!("{module}.weight_global_scale"));
                    let (rows, cols) = match (t.shape.as_slice(), s.dtype, s.shape.as_slice()) {
                        ([r, half], Dtype::F8_E4M3, [so, b])
                            if so == r
                                && half * 2 == b * 16
                                && g.is_some_and(|g| g.shape.iter().product::<usize>() == 1) =>
                        {
                            (*r, half * 2)
                        }
                        _ => return Err(err(t, format!("U8 weight_packed {:?} with {} scale {:?} is no nvfp4-pack-quantized layout kquant knows (F8_E4M3 scale per 16 inputs and a weight_global_scale)", t.shape, s.dtype, s.shape))),
                    };
                    let mut parts = vec![t.name.clone(), s.name.clone()];
                    for extra in ["weight_global_scale", "input_global_scale"] {
                        parts.extend(info(&format!("{module}.{extra}")).map(|z| z.name.clone()));
                    }
                    Some(QModule {
                        module: module.into(),
                        stored: Stored::CtNvfp4,
                        rows,
                        cols,
                        parts,
                    })
                }
                ("compressed-tensors", "weight_packed", Dtype::I32, Some(s)) => {
                    let shape_t = info(&format!("{module}.weight_shape"))
                        .ok_or_else(|| err(t, "`weight_packed` without `weight_shape`".into()))?;
                    let shape = w.tensor(&shape_t.name).expect("routed").to_f32();
                    let (rows, cols) = match shape.as_slice() {
                        [r, c] if *r >= 0.0 && *c >= 0.0 => (*r as usize, *c as usize),
                        _ => {
                            return Err(err(
                                shape_t,
                                "must hold two non-negative dimensions".into(),
                            ))
                        }
                    };
                    let groups = s.shape.get(1).copied().unwrap_or(1).max(1);
                    if t.shape != [rows, cols.div_ceil(8)]
                        || s.shape.first() != Some(&rows)
                        || cols % groups != 0
                    {
                        return Err(err(
                            t,
                            format!(
                                "shape {:?} / scale {:?} do not fit weight_shape [{rows}, {cols}]",
                                t.shape, s.shape
                            ),
                        ));
                    }
                    let mut parts = vec![t.name.clone(), s.name.clone(), shape_t.name.clone()];
                    parts.extend(
                        info(&format!("{module}.weight_zero_point")).map(|z| z.name.clone()),
                    );
                    Some(QModule {
                        module: module.into(),
                        stored: Stored::CtPacked {
                            group: cols / groups,
                        },
                        rows,
                        cols,
                        parts,
                    })
                }
                ("quark", "weight", Dtype::I32, Some(s))
                    if info(&format!("{module}.weight_scale_2")).is_some() =>
                {
                    let s2 = info(&format!("{module}.weight_scale_2")).expect("guard");
                    let (rows, words) = match t.shape.as_slice() {
                        [r, w] => (*r, *w),
                        _ => (0, 0),
                    };
                    if t.shape.len() != 2
                        || s.shape.iter().product::<usize>() != 1
                        || s2.shape != [rows]
                    {
                        return Err(err(t, format!("two-stage Quark weight {:?} with weight_scale {:?} and weight_scale_2 {:?} is no int4_fp8 layout kquant knows", t.shape, s.shape, s2.shape)));
                    }
                    let mut parts = vec![t.name.clone(), s.name.clone(), s2.name.clone()];
                    parts.extend(
                        info(&format!("{module}.weight_zero_point_2")).map(|z| z.name.clone()),
                    );
                    Some(QModule {
                        module: module.into(),
                        stored: Stored::QuarkInt4Fp8 { order: quark_order },
                        rows,
                        cols: words * 8,
                        parts,
                    })
                }
                (
                    "quark" | "compressed-tensors" | "modelopt",
                    "weight",
                    Dtype::F8_E4M3,
                    Some(s),
                ) => {
                    let (rows, cols) = match t.shape.as_slice() {
                        [r, c] => (*r, *c),
                        _ => {
                            return Err(err(
                                t,
                                format!("FP8 weight of shape {:?} is not 2-D", t.shape),
                            ))
                        }
                    };
                    let per_row = match s.shape.as_slice() {
                        [] | [1] | [1, 1] => false,
                        [o] | [o, 1] if *o == rows => true,
                        _ => return Err(err(t, format!("FP8 weight {:?} with scale {:?} is no FP8 layout kquant knows (one scale per row or per tensor)", t.shape, s.shape))),
                    };
                    let mut parts = vec![t.name.clone(), s.name.clone()];
                    for extra in ["weight_zero_point", "input_scale", "input_zero_point"] {
                        parts.extend(info(&format!("{module}.{extra}")).map(|z| z.name.clone()));
                    }
                    Some(QModule {
                        module: module.into(),
                        stored: Stored::Fp8 { per_row },
                        rows,
                        cols,
                        parts,
                    })
                }
                ("compressed-tensors", "weight", Dtype::I8, Some(s)) => {
                    let (rows, cols, groups) = match (t.shape.as_slice(), s.shape.as_slice()) {
                        ([r, c], [so, g]) if so == r && *g > 0 && c % g == 0 => (*r, *c, *g),
                        _ => return Err(err(t, format!("I8 weight {:?} with scale {:?} is no int-quantized layout kquant knows", t.shape, s.shape))),
                    };
                    if let Some(z) = info(&format!("{module}.weight_zero_point")) {
                        return Err(err(z, "asymmetric int-quantized weights (with a zero point) cannot be dequantized yet".into()));
                    }
                    Some(QModule {
                        module: module.into(),
                        stored: Stored::CtInt {
                            group: cols / groups,
                        },
                        rows,
                        cols,
                        parts: vec![t.name.clone(), s.name.clone()],
                    })
                }
                ("quark", "weight", Dtype::I32, Some(s)) => {
                    let zp = info(&format!("{module}.weight_zero_point"));
                    let mut parts = vec![t.name.clone(), s.name.clone()];
                    parts.extend(zp.map(|z| z.name.clone()));
                    let (stored, rows, cols) = match (t.shape.as_slice(), s.shape.as_slice()) {
                        // Per channel. Without a zero-point tensor this is Quark's file-to-file
                        // path, which packs sequentially whatever its config says.
                        ([out, words], [so]) if so == out => {
                            let order = if zp.is_some() { quark_order } else { Order::Sequential };
                            (Stored::QuarkChannel { order }, *out, words * 8)
                        }
                        ([inp, _], [ng, out]) if *ng > 0 && inp % ng == 0 && quark_uint4 && zp.is_some_and(|z| z.shape == [*ng, out.div_ceil(8)]) => (Stored::QuarkGroupAsym { group: inp / ng, order: quark_order }, *out, *inp),
                        ([inp, _], [ng, out]) if *ng > 0 && inp % ng == 0 && !quark_uint4 => (Stored::QuarkGroup { group: inp / ng, order: quark_order }, *out, *inp),
                        _ => return Err(err(t, format!("I32 weight {:?} with scale {:?} is no Quark INT4 layout kquant knows", t.shape, s.shape))),
                    };
                    Some(QModule {
                        module: module.into(),
                        stored,
                        rows,
                        cols,
                        parts,
                    })
                }
                ("modelopt", "weight", Dtype::U8, Some(s)) => {
                    let ws2 = info(&format!("{module}.weight_scale_2"));
                    let (stored, rows, cols) = match (t.shape.as_slice(), s.dtype, s.shape.as_slice()) {
                        ([half, c], Dtype::F32, [r, g]) if *g > 0 && c % g == 0 && r.div_ceil(2) == *half => (Stored::ModeloptInt4 { group: c / g }, *r, *c),
                        ([r, half], Dtype::F8_E4M3, [so, b]) if so == r && half * 2 == b * 16 && ws2.is_some_and(|x| x.shape.iter().product::<usize>() == 1) => (Stored::ModeloptNvfp4, *r, half * 2),
                        _ => return Err(err(t, format!("U8 weight {:?} with {} scale {:?} is no ModelOpt layout kquant knows (W4A16_AWQ/W4A8_AWQ or NVFP4)", t.shape, s.dtype, s.shape))),
                    };
                    let mut parts = vec![t.name.clone(), s.name.clone()];
                    for extra in ["weight_scale_2", "input_scale", "pre_quant_scale"] {
                        parts.extend(info(&format!("{module}.{extra}")).map(|z| z.name.clone()));
                    }
                    if let Some(p) = info(&format!("{module}.pre_quant_scale")) {
                        if p.shape != [cols] {
                            return Err(err(
                                p,
                                format!(
                                    "pre_quant_scale {:?} does not fit the input dimension {cols}",
                                    p.shape
                                ),
                            ));
                        }
                    }
                    Some(QModule {
                        module: module.into(),
                        stored,
                        rows,
                        cols,
                        parts,
                    })
                }
                _ => None,
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
