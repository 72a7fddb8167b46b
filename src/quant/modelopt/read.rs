//! Reading ModelOpt layouts back: which modules a checkpoint stores as `W4A16_AWQ` /
//! `W4A8_AWQ` (U8 `[⌈out/2⌉, in]`, F32 group scales, optional `pre_quant_scale`) or NVFP4 (U8
//! `[out, in/2]`, F8 block scales, `weight_scale_2`), with their shapes checked;
//! `quant::decode` dispatches here and decodes them.

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
        ("weight", Dtype::U8) => {
            let ws2 = w.info(&format!("{module}.weight_scale_2"));
            let (stored, rows, cols) = match (t.shape.as_slice(), s.dtype, s.shape.as_slice()) {
                    ([half, c], Dtype::F32, [r, g]) if *g > 0 && c % g == 0 && r.div_ceil(2) == *half => (Stored::ModeloptInt4 { group: c / g }, *r, *c),
                    ([r, half], Dtype::F8_E4M3, [so, b]) if so == r && half * 2 == b * 16 && ws2.is_some_and(|x| x.shape.iter().product::<usize>() == 1) => (Stored::ModeloptNvfp4, *r, half * 2),
                    _ => return Err(p.err(t, format!("U8 weight {:?} with {} scale {:?} is no ModelOpt layout kquant knows (W4A16_AWQ/W4A8_AWQ or NVFP4)", t.shape, s.dtype, s.shape))),
                };
            let mut parts = vec![t.name.clone(), s.name.clone()];
            for extra in ["weight_scale_2", "input_scale", "pre_quant_scale"] {
                parts.extend(w.info(&format!("{module}.{extra}")).map(|z| z.name.clone()));
            }
            if let Some(pqs) = w.info(&format!("{module}.pre_quant_scale")) {
                if pqs.shape != [cols] {
                    return Err(p.err(
                        pqs,
                        format!(
                            "pre_quant_scale {:?} does not fit the input dimension {cols}",
                            pqs.shape
                        ),
                    ));
                }
            }
            Some(p.found(stored, rows, cols, parts))
        }
        _ => None,
    })
}
