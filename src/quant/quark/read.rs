//! Reading Quark layouts back: which modules a checkpoint stores as two-stage `int4_fp8` (I32
//! `weight` with `weight_scale_2`), INT4 per channel (I32 `[out, in/8]`, with a zero point on
//! the model path, without one from file2file) or per group, symmetric or UINT4 asymmetric
//! (transposed `[in, out/8]`), with the nibble order the config's `pack_method` says;
//! `quant::decode` dispatches here and decodes them.

use crate::error::Result;
use crate::io::Dtype;
use crate::quant::math::pack::Order;
use crate::quant::stored::{Probe, QModule, Stored};

/// The module `p` holds in this format's layouts, if any (`None`: not one of them).
pub fn read(p: &Probe) -> Result<Option<QModule>> {
    let (module, t, w) = (p.module, p.t, p.w);
    let Some(s) = p.scale else {
        return Ok(None);
    };
    let quark_order = match p
        .config
        .and_then(|q| q.pointer("/export/pack_method"))
        .and_then(|m| m.as_str())
    {
        Some("order") => Order::Sequential,
        _ => Order::Reorder,
    };
    let quark_uint4 = p
        .config
        .and_then(|q| q.pointer("/global_quant_config/weight/dtype"))
        .and_then(|d| d.as_str())
        == Some("uint4");
    Ok(match (p.last, t.dtype) {
        ("weight", Dtype::I32) if w.info(&format!("{module}.weight_scale_2")).is_some() => {
            let s2 = w.info(&format!("{module}.weight_scale_2")).expect("guard");
            let (rows, words) = match t.shape.as_slice() {
                [r, w] => (*r, *w),
                _ => (0, 0),
            };
            if t.shape.len() != 2 || s.shape.iter().product::<usize>() != 1 || s2.shape != [rows] {
                return Err(p.err(t, format!("two-stage Quark weight {:?} with weight_scale {:?} and weight_scale_2 {:?} is no int4_fp8 layout kquant knows", t.shape, s.shape, s2.shape)));
            }
            let mut parts = vec![t.name.clone(), s.name.clone(), s2.name.clone()];
            parts.extend(
                w.info(&format!("{module}.weight_zero_point_2"))
                    .map(|z| z.name.clone()),
            );
            Some(p.found(
                Stored::QuarkInt4Fp8 { order: quark_order },
                rows,
                words * 8,
                parts,
            ))
        }
        ("weight", Dtype::I32) => {
            let zp = w.info(&format!("{module}.weight_zero_point"));
            let mut parts = vec![t.name.clone(), s.name.clone()];
            parts.extend(zp.map(|z| z.name.clone()));
            let (stored, rows, cols) = match (t.shape.as_slice(), s.shape.as_slice()) {
                // Per channel. Without a zero-point tensor this is Quark's file-to-file
                // path, which packs sequentially whatever its config says.
                ([out, words], [so]) if so == out => {
                    let order = if zp.is_some() {
                        quark_order
                    } else {
                        Order::Sequential
                    };
                    (Stored::QuarkChannel { order }, *out, words * 8)
                }
                ([inp, _], [ng, out])
                    if *ng > 0
                        && inp % ng == 0
                        && quark_uint4
                        && zp.is_some_and(|z| z.shape == [*ng, out.div_ceil(8)]) =>
                {
                    (
                        Stored::QuarkGroupAsym {
                            group: inp / ng,
                            order: quark_order,
                        },
                        *out,
                        *inp,
                    )
                }
                ([inp, _], [ng, out]) if *ng > 0 && inp % ng == 0 && !quark_uint4 => (
                    Stored::QuarkGroup {
                        group: inp / ng,
                        order: quark_order,
                    },
                    *out,
                    *inp,
                ),
                _ => {
                    return Err(p.err(
                        t,
                        format!(
                            "I32 weight {:?} with scale {:?} is no Quark INT4 layout kquant knows",
                            t.shape, s.shape
                        ),
                    ))
                }
            };
            Some(p.found(stored, rows, cols, parts))
        }
        _ => None,
    })
}
