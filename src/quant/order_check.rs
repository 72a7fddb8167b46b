//! Which nibble order a Quark INT4 checkpoint's data really uses, found by re-quantizing a few
//! rows of the original weights: Quark's file-to-file export writes sequential nibbles while its
//! config says `"pack_method": "reorder"`, and only a comparison with the source can prove it.

use serde::Serialize;

use crate::checkpoint::Checkpoint;
use crate::quant::decode::{Logical, Stored};
use crate::quant::math::int4;
use crate::quant::math::pack::{self, Order};

/// Rows compared per module.
const ROWS: usize = 4;

/// The verdict for one module.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrderCheck {
    pub module: String,
    /// What the config's `export.pack_method` claims.
    pub config_says: &'static str,
    /// What the data matches: `reorder`, `order` (sequential), or `neither`.
    pub data_is: &'static str,
}

impl OrderCheck {
    pub fn mismatch(&self) -> bool {
        self.config_says != self.data_is
    }
}

fn name(o: Order) -> &'static str {
    match o {
        Order::Reorder => "reorder",
        Order::Sequential => "order",
    }
}

/// Compare every Quark per-channel module of `q` with the same weight in `src`.
pub fn check(q: &Checkpoint, src: &Checkpoint) -> crate::Result<Vec<OrderCheck>> {
    let lg = Logical::new(q)?;
    let claimed = q
        .config
        .as_ref()
        .and_then(|c| c.root.get("quantization_config"))
        .and_then(|c| c.pointer("/export/pack_method"))
        .and_then(|v| v.as_str())
        .map(|s| {
            if s == "order" {
                Order::Sequential
            } else {
                Order::Reorder
            }
        })
        .unwrap_or(Order::Reorder);
    let mut out = Vec::new();
    for m in lg.modules.values() {
        if !matches!(m.stored, Stored::QuarkChannel { .. }) {
            continue;
        }
        let Some(orig) = src.weights.tensor(&format!("{}.weight", m.module)) else {
            continue;
        };
        if orig.shape() != [m.rows, m.cols] || !orig.dtype().is_float() {
            continue;
        }
        let rows = ROWS.min(m.rows);
        let w = &orig.to_f32()[..rows * m.cols];
        let codes = int4::quantize_ref(w, rows, m.cols, m.cols, orig.dtype()).codes;
        let stored = q
            .weights
            .tensor(&format!("{}.weight", m.module))
            .expect("decoded module");
        let wpr = m.cols.div_ceil(8);
        let data = &stored.data[..rows * wpr * 4];
        let matches = |o: Order| {
            let mut words = Vec::new();
            for r in 0..rows {
                pack::pack(&codes[r * m.cols..(r + 1) * m.cols], o, &mut words);
            }
            words
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .eq(data.iter().copied())
        };
        let data_is = match (matches(Order::Reorder), matches(Order::Sequential)) {
            (true, true) | (false, false) => {
                if matches(claimed) {
                    name(claimed)
                } else {
                    "neither"
                }
            }
            (true, false) => "reorder",
            (false, true) => "order",
        };
        out.push(OrderCheck {
            module: m.module.clone(),
            config_says: name(claimed),
            data_is,
        });
    }
    Ok(out)
}
