//! Reading compressed-tensors layouts back: which modules a checkpoint stores as
//! `nvfp4-pack-quantized` (U8 `weight_packed`, F8 block scales, a global scale),
//! `pack-quantized` (I32 `weight_packed` + `weight_shape`) or `int-quantized` (I8 `weight`), with
//! their shapes checked; `quant::decode` dispatches here and decodes them.

use crate::error::Result;
use crate::io::Dtype;
use crate::quant::stored::{Probe, QModule, Stored};

/// The module `p` holds in this format's layouts, if any (`None`: not one of them).
pub fn read(p: &Probe) -> Result<Option<QModule>> {
    let (module, t, w) = (p.module, p.t, p.w);
    let Some(s) = p.scale else {
        return Ok(None);
    };
    Ok(match (p.last, t.dtype) {
        ("weight_packed", Dtype::U8) => {
            let g = w.info(&format!("{module}.weight_global_scale"));
            let (rows, cols) = match (t.shape.as_slice(), s.dtype, s.shape.as_slice()) {
                    ([r, half], Dtype::F8_E4M3, [so, b])
                        if so == r
                            && half * 2 == b * 16
                            && g.is_some_and(|g| g.shape.iter().product::<usize>() == 1) =>
                    {
                        (*r, half * 2)
                    }
                    _ => return Err(p.err(t, format!("U8 weight_packed {:?} with {} scale {:?} is no nvfp4-pack-quantized layout kquant knows (F8_E4M3 scale per 16 inputs and a weight_global_scale)", t.shape, s.dtype, s.shape))),
                };
            let mut parts = vec![t.name.clone(), s.name.clone()];
            for extra in ["weight_global_scale", "input_global_scale"] {
                parts.extend(w.info(&format!("{module}.{extra}")).map(|z| z.name.clone()));
            }
            Some(p.found(Stored::CtNvfp4, rows, cols, parts))
        }
        ("weight_packed", Dtype::I32) => {
            let shape_t = w
                .info(&format!("{module}.weight_shape"))
                .ok_or_else(|| p.err(t, "`weight_packed` without `weight_shape`".into()))?;
            let shape = w.tensor(&shape_t.name).expect("routed").to_f32();
            let (rows, cols) = match shape.as_slice() {
                [r, c] if *r >= 0.0 && *c >= 0.0 => (*r as usize, *c as usize),
                _ => return Err(p.err(shape_t, "must hold two non-negative dimensions".into())),
            };
            let groups = s.shape.get(1).copied().unwrap_or(1).max(1);
            if t.shape != [rows, cols.div_ceil(8)]
                || s.shape.first() != Some(&rows)
                || cols % groups != 0
            {
                return Err(p.err(
                    t,
                    format!(
                        "shape {:?} / scale {:?} do not fit weight_shape [{rows}, {cols}]",
                        t.shape, s.shape
                    ),
                ));
            }
            let mut parts = vec![t.name.clone(), s.name.clone(), shape_t.name.clone()];
            parts.extend(
                w.info(&format!("{module}.weight_zero_point"))
                    .map(|z| z.name.clone()),
            );
            Some(p.found(
                Stored::CtPacked {
                    group: cols / groups,
                },
                rows,
                cols,
                parts,
            ))
        }
        ("weight", Dtype::I8) => {
            let (rows, cols, groups) = match (t.shape.as_slice(), s.shape.as_slice()) {
                ([r, c], [so, g]) if so == r && *g > 0 && c % g == 0 => (*r, *c, *g),
                _ => {
                    return Err(p.err(
                        t,
                        format!(
                        "I8 weight {:?} with scale {:?} is no int-quantized layout kquant knows",
                        t.shape, s.shape
                    ),
                    ))
                }
            };
            if let Some(z) = w.info(&format!("{module}.weight_zero_point")) {
                return Err(p.err(z, "asymmetric int-quantized weights (with a zero point) cannot be dequantized yet".into()));
            }
            Some(p.found(
                Stored::CtInt {
                    group: cols / groups,
                },
                rows,
                cols,
                vec![t.name.clone(), s.name.clone()],
            ))
        }
        _ => None,
    })
}
