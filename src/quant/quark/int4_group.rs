//! AMD Quark's per-group symmetric INT4 weights (`int4_wo_32/64/128`, `Int4PerGroupSpec(ch_axis=-1)`),
//! model path (`ModelQuantizer` + `export_safetensors`). The numbers are Quark's per-channel recipe
//! with the amax taken over each run of `G` input columns ([`crate::quant::math::int4::quantize`] with
//! `group = G`); the layout is transposed (`PER_GROUP_INT_TRANSPOSE_DTYPES`):
//! - `X.weight`: I32 `[in, ⌈out/8⌉]`, the codes transposed to `[in, out]` and packed along `out`
//!   in `pack_method` order (default reorder);
//! - `X.weight_scale`: model dtype `[in/G, out]` (the `[out, in/G]` scales transposed);
//! - `X.weight_zero_point`: I32 `[in/G, ⌈out/8⌉]`, zeros.
//!
//! `in` must be a multiple of `G` (the caller refuses other tensors). Facts:
//! docs/quantize.md, "`--format quark`" and "FP8, W4A8 and UINT4".

use serde_json::{json, Value};

use crate::io::writer::TensorSpec;
use crate::io::Dtype;
use crate::quant::codec::{Codec, ConfigFiles, Encoded, IntGrid};
use crate::quant::math::int4::{Int4, QMAX, QMIN};
use crate::quant::math::pack::{self, Order};
use crate::quant::math::rowwise::{self, encode_floats};
use crate::quant::quark::{self, Options};
use crate::quant::stored::{Gemv, IntLayout, Parts};

/// The tensors one quantized `[rows = out, cols = in]` module becomes.
pub fn specs(module: &str, rows: usize, cols: usize, group: usize, dt: Dtype) -> Vec<TensorSpec> {
    let groups = rowwise::groups(module, cols, group);
    vec![
        TensorSpec::new(
            format!("{module}.weight"),
            Dtype::I32,
            vec![cols, rows.div_ceil(8)],
        ),
        TensorSpec::new(format!("{module}.weight_scale"), dt, vec![groups, rows]),
        TensorSpec::new(
            format!("{module}.weight_zero_point"),
            Dtype::I32,
            vec![groups, rows.div_ceil(8)],
        ),
    ]
}

/// Pack the transposed codes: word `[c, k]` holds `codes[8k + ORDER[i], c]` in nibble `i`.
pub fn pack_transposed(q: &Int4, order: Order) -> Vec<i32> {
    pack::pack_runs(q.cols, q.rows, |c, v| {
        let column: Vec<i8> = (0..q.rows).map(|r| q.codes[r * q.cols + c]).collect();
        pack::pack(&column, order, v)
    })
}

/// Encode a per-group quantized module into `(name, bytes)` for each of its [`specs`].
pub fn encode(module: &str, q: &Int4, model: Dtype, o: &Options) -> Vec<(String, Vec<u8>)> {
    assert_eq!(
        q.cols % q.group,
        0,
        "{module}: in not a multiple of the group"
    );
    let groups = q.groups_per_row();
    let words = pack_transposed(q, o.order);
    let scale_t = rowwise::transpose(&q.scales, q.rows, groups);
    let zeros = vec![0u8; groups * q.rows.div_ceil(8) * 4];
    tensors(module, &words, &scale_t, model, zeros)
}

/// The per-group layout's tensors: the transposed code words, the transposed scales in the
/// model dtype, and the zero-point words `zp` (zeros for symmetric INT4).
pub fn tensors(module: &str, words: &[i32], scale_t: &[f32], model: Dtype, zp: Vec<u8>) -> Encoded {
    vec![
        (format!("{module}.weight"), pack::le_bytes(words)),
        (
            format!("{module}.weight_scale"),
            encode_floats(scale_t, model),
        ),
        (format!("{module}.weight_zero_point"), zp),
    ]
}

/// Decode a Quark per-group module (weight words `[in, ⌈out/8⌉]`, scales `[in/G, out]`) back to
/// row-major codes and `[out, in/G]` scales.
pub fn decode(
    weight: &[u8],
    scale_t: &[f32],
    rows: usize,
    cols: usize,
    group: usize,
    order: Order,
) -> Int4 {
    let codes_t = pack::unpack_rows(&pack::words(weight), cols, rows, order);
    Int4 {
        rows,
        cols,
        group,
        scales: rowwise::transpose(scale_t, cols / group, rows),
        codes: rowwise::transpose(&codes_t, cols, rows),
    }
}

/// Quark INT4 per group read back (`Stored::QuarkGroup`): the transposed layout [`decode`]
/// reads.
pub struct GroupLayout {
    pub group: usize,
    pub order: Order,
}

impl IntLayout for GroupLayout {
    fn codes(&self, p: &Parts) -> Int4 {
        let (w, s, rows, cols) = p.int_tensors("weight");
        decode(w, &s, rows, cols, self.group, self.order)
    }
    fn gemv(&self) -> Option<Gemv> {
        None
    }
}

/// `quantization_config` as Quark writes it for int4 per-group weight-only: the per-channel
/// config with the weight spec switched to `per_group`, `ch_axis: -1`, `group_size: G`.
pub fn config(o: &Options, group: usize, exclude: &[String]) -> Value {
    let mut c = quark::config(o, exclude);
    let w = &mut c["global_quant_config"]["weight"];
    w["qscheme"] = json!("per_group");
    w["ch_axis"] = json!(-1);
    w["group_size"] = json!(group);
    w["observer_cls"] = json!("PerGroupMinMaxObserver");
    c
}

/// Quark INT4 per-group (model path) as a [`Codec`].
pub struct Int4PerGroup {
    pub opts: Options,
    pub group: usize,
}

impl Codec for Int4PerGroup {
    fn describe(&self) -> String {
        format!("Quark Model layout, group {}", self.group)
    }
    fn specs(&self, module: &str, rows: usize, cols: usize, dtype: Dtype) -> Vec<TensorSpec> {
        specs(module, rows, cols, self.group, dtype)
    }
    fn encode(&self, module: &str, w: &[f32], rows: usize, cols: usize, dtype: Dtype) -> Encoded {
        encode(
            module,
            &crate::quant::math::int4::quantize(w, rows, cols, self.group, dtype),
            dtype,
            &self.opts,
        )
    }
    fn config(&self, exclude: &[String]) -> ConfigFiles {
        ConfigFiles::config(config(&self.opts, self.group, exclude))
    }
    fn int_grid(&self) -> Option<&dyn IntGrid> {
        Some(self)
    }
}

impl IntGrid for Int4PerGroup {
    fn group(&self, _cols: usize) -> usize {
        self.group
    }
    fn range(&self) -> (i8, i8) {
        (QMIN as i8, QMAX as i8)
    }
    fn scale_dtype(&self, model: Dtype) -> Dtype {
        self.opts.scale_dtype(model)
    }
    fn code(&self, w: f32, s: f32, _model: Dtype) -> i8 {
        crate::quant::math::int4::quark_code(w, 1.0f32 / s)
    }
    fn rtn(&self, w: &[f32], rows: usize, cols: usize, model: Dtype) -> Int4 {
        crate::quant::math::int4::quantize(w, rows, cols, self.group, model)
    }
    fn write(&self, module: &str, q: &Int4, model: Dtype) -> Encoded {
        encode(module, q, model, &self.opts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::math::int4;

    #[test]
    fn transposed_packing_round_trips() {
        for (rows, cols, group) in [(16, 64, 32), (13, 64, 64), (40, 128, 32)] {
            let w: Vec<f32> = (0..rows * cols)
                .map(|i| int4::round_to(Dtype::BF16, ((i as f32) * 0.61).sin() * 3.0))
                .collect();
            let q = int4::quantize(&w, rows, cols, group, Dtype::BF16);
            for order in [Order::Reorder, Order::Sequential] {
                let enc = encode("m", &q, Dtype::BF16, &Options::model_v013(order));
                let mut scale_t = Vec::new();
                crate::io::dtype::to_f32(Dtype::BF16, &enc[1].1, &mut scale_t);
                let back = decode(&enc[0].1, &scale_t, rows, cols, group, order);
                assert_eq!(back, q);
            }
        }
    }

    /// Word `[c, k]` packs eight consecutive *output* rows of input column `c`.
    #[test]
    fn packs_along_out() {
        let (rows, cols) = (8, 32);
        let mut codes = vec![0i8; rows * cols];
        for (r, v) in [7i8, -8, 0, 2, 2, 0, -2, -2].into_iter().enumerate() {
            codes[r * cols] = v;
        }
        let q = Int4 {
            rows,
            cols,
            group: 32,
            scales: vec![1.0; rows],
            codes,
        };
        let w = pack_transposed(&q, Order::Reorder);
        assert_eq!(w.len(), cols);
        assert_eq!(w[0] as u32, 0xe028e207);
        assert!(w[1..].iter().all(|&x| x == 0));
    }

    #[test]
    fn config_is_per_group() {
        let c = config(
            &Options::model_v013(Order::Reorder),
            64,
            &["lm_head".into()],
        );
        let w = &c["global_quant_config"]["weight"];
        assert_eq!(w["qscheme"], "per_group");
        assert_eq!(w["ch_axis"], -1);
        assert_eq!(w["group_size"], 64);
        assert_eq!(w["observer_cls"], "PerGroupMinMaxObserver");
        assert_eq!(c["export"]["pack_method"], "reorder");
    }
}
