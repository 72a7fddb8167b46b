//! Reading a quantized checkpoint back as plain weights: finds each quantized module and how it
//! is stored (Quark per-channel or per-group, compressed-tensors `pack-quantized`), and gives
//! every tensor the original model would have had, dequantized (`w = q · s`) where needed.
//! `dequantize` and `diff` are built on this.

use std::collections::{BTreeMap, BTreeSet};

use super::int4::Int4;
use super::pack::Order;
use super::{compressed_tensors, quark, quark_group};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::io::{Dtype, TensorInfo};

/// How one quantized module is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// Quark per-channel: I32 `[out, in/8]`, scale `[out]`.
    QuarkChannel { order: Order },
    /// Quark per-group: I32 `[in, out/8]` (transposed), scale `[in/G, out]`.
    QuarkGroup { group: usize, order: Order },
    /// compressed-tensors `pack-quantized`: `weight_packed` `[out, in/8]`, scale `[out, in/G]`.
    CtPacked { group: usize },
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
        let method = cfg
            .and_then(|q| q.get("quant_method"))
            .and_then(|m| m.as_str())
            .unwrap_or("");
        let quark_order = match cfg
            .and_then(|q| q.pointer("/export/pack_method"))
            .and_then(|m| m.as_str())
        {
            Some("order") => Order::Sequential,
            _ => Order::Reorder,
        };
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
                ("quark", "weight", Dtype::I32, Some(s)) => {
                    if info(&format!("{module}.weight_scale_2")).is_some() {
                        return Err(err(
                            t,
                            "two-stage Quark weights (int4_fp8) cannot be dequantized yet".into(),
                        ));
                    }
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
                        ([inp, _], [ng, out]) if *ng > 0 && inp % ng == 0 => (Stored::QuarkGroup { group: inp / ng, order: quark_order }, *out, *inp),
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

    /// Codes and scales of a quantized module.
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
            Stored::QuarkGroup { group, order } => {
                quark_group::decode(data("weight").data, &scale, m.rows, m.cols, group, order)
            }
            Stored::CtPacked { group } => compressed_tensors::decode(
                data("weight_packed").data,
                &scale,
                m.rows,
                m.cols,
                group,
            ),
        }
    }

    /// Values of a logical tensor as f32 (dequantized `q · s` for quantized modules).
    pub fn read_f32(&self, name: &str) -> Option<Vec<f32>> {
        match self.module(name) {
            Some(m) => Some(self.int4(m).dequantize_ref()),
            None => self.ck.weights.tensor(name).map(|v| v.to_f32()),
        }
    }
}
