//! compressed-tensors (llm-compressor's format) `pack-quantized` W4A16: symmetric INT4 weights per
//! output channel (`strategy: channel`) or per group of `G` input columns (`strategy: group`).
//! Its own recipe, as compressed-tensors 0.20.0 computes it on CPU (`calculate_qparams` +
//! `PackedQuantizationCompressor`), never Quark's:
//!
//! - `s = dtype(amax / 7.5)` in the model dtype; an exactly-zero `s` becomes the model dtype's
//!   eps (BF16 `2^-7`, F16 `2^-10`, F32 `2^-23`): a replacement, not a floor;
//! - `q = round_half_even(clamp(dtype(w / s), −8, 7))`: true division whose quotient is rounded to
//!   the model dtype (torch divides two BF16 tensors into a BF16 tensor), clamp *before* rounding;
//! - nibble `q + 8` (offset binary), eight codes per I32 word along the input dimension in
//!   sequential order, a partial last word padded with raw zero nibbles.
//!
//! Tensors: `X.weight_packed` I32 `[out, ⌈in/8⌉]`, `X.weight_scale` model dtype `[out, in/G]`
//! (`[out, 1]` per channel), `X.weight_shape` I64 `[2] = [out, in]`; no zero point (symmetric).
//! Group sizes must divide `in` (compressed-tensors raises otherwise; the caller refuses).
//!
//! Facts: docs/quantize.md, "`--format compressed-tensors`", checked byte for byte against
//! fixtures/goldens/compressed-tensors-0.20/ (tests/ct_golden.rs).
//!
//! `quantize_ref` is the plain reference; `quantize` is the rayon fast path, tested identical.

pub mod fp8_w4a8;
pub mod nvfp4;
pub mod read;

use serde_json::{json, Value};

use crate::io::writer::TensorSpec;
use crate::io::Dtype;
use crate::quant::codec::{Codec, ConfigFiles, Encoded, IntGrid, RawEncoded, StoredWeight};
use crate::quant::math::int4::{round_to, Int4, QMAX, QMIN};
use crate::quant::math::pack::{self, Order};
use crate::quant::math::rowwise::{self, amax, encode_floats, Path};
use crate::quant::stored::{Gemv, IntLayout, Parts};

/// The compressed-tensors release whose output this reproduces (written as `version`).
pub const VERSION: &str = "0.20.0";
/// compressed-tensors' divisor `(qmax − qmin) / 2`.
pub const DIVISOR: f32 = 7.5;
/// Offset that turns a signed code into the stored nibble.
pub const OFFSET: i8 = 8;

/// `torch.finfo(dtype).eps`: what compressed-tensors stores for an all-zero group.
pub fn dtype_eps(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::BF16 => half::bf16::EPSILON.to_f32(),
        Dtype::F16 => half::f16::EPSILON.to_f32(),
        _ => f32::EPSILON,
    }
}

/// compressed-tensors' symmetric scale of one run of weights (`calculate_qparams`):
/// `dtype(amax / divisor)`, a zero replaced by the dtype's eps. `divisor` is `(qmax − qmin) / 2`.
pub fn symmetric_scale(w: &[f32], divisor: f32, dtype: Dtype) -> f32 {
    let s = round_to(dtype, amax(w) / divisor);
    if s == 0.0 {
        dtype_eps(dtype)
    } else {
        s
    }
}

/// Scale of one run of weights: `dtype(amax / 7.5)`, a zero replaced by the dtype's eps.
pub fn ct_scale(w: &[f32], dtype: Dtype) -> f32 {
    symmetric_scale(w, DIVISOR, dtype)
}

/// One code: `round_half_even(clamp(dtype(w / s), −8, 7))`.
pub fn ct_code(w: f32, s: f32, dtype: Dtype) -> i8 {
    crate::quant::math::rne::rne(round_to(dtype, w / s).clamp(QMIN as f32, QMAX as f32)) as i8
}

fn quantize_on(path: Path, w: &[f32], rows: usize, cols: usize, group: usize, dt: Dtype) -> Int4 {
    assert_eq!(cols % group, 0, "group must divide the input dimension");
    let recipe = rowwise::scaled(|r| ct_scale(r, dt), |x, s| ct_code(x, s, dt));
    Int4::quantize_runs(path, w, rows, cols, group, recipe)
}

rowwise::paths! {
    /// `group == cols` is per channel.
    quantize_on: quantize_ref, quantize(w: &[f32], rows: usize, cols: usize, group: usize, dtype: Dtype) -> Int4
}

/// Pack one row of codes: nibble `q + 8`, sequential, raw-zero padding (`pack_to_int32`).
pub fn pack_row(codes: &[i8], out: &mut Vec<i32>) {
    let biased: Vec<i8> = codes.iter().map(|&q| q + OFFSET).collect();
    pack::pack(&biased, Order::Sequential, out);
}

/// The tensors one quantized `[rows = out, cols = in]` module becomes.
pub fn specs(module: &str, rows: usize, cols: usize, group: usize, dt: Dtype) -> Vec<TensorSpec> {
    let groups = rowwise::groups(module, cols, group);
    vec![
        TensorSpec::new(
            format!("{module}.weight_packed"),
            Dtype::I32,
            vec![rows, cols.div_ceil(8)],
        ),
        TensorSpec::new(format!("{module}.weight_scale"), dt, vec![rows, groups]),
        TensorSpec::new(format!("{module}.weight_shape"), Dtype::I64, vec![2]),
    ]
}

/// Encode a quantized module into `(name, bytes)` for each of its [`specs`].
pub fn encode(module: &str, q: &Int4, model: Dtype) -> Vec<(String, Vec<u8>)> {
    let words = pack::pack_rows(&q.codes, q.rows, q.cols, pack_row);
    tensors(
        module,
        pack::le_bytes(&words),
        &q.scales,
        q.rows,
        q.cols,
        model,
    )
}

/// [`encode`] of [`quantize`] of the stored weight, fused row by row from its bytes (see
/// [`rowwise::packed_from_raw`]); `Err(i)`: the first non-finite weight.
pub fn encode_raw(
    module: &str,
    raw: &[u8],
    rows: usize,
    cols: usize,
    group: usize,
    model: Dtype,
) -> RawEncoded {
    assert_eq!(cols % group, 0, "group must divide the input dimension");
    let (scales, words) = rowwise::packed_from_raw(
        raw,
        model,
        rows,
        cols,
        group,
        |run, out| {
            let s = ct_scale(run, model);
            rowwise::codes(run, out, |x| ct_code(x, s, model));
            s
        },
        pack_row,
    )?;
    Ok(tensors(module, words, &scales, rows, cols, model))
}

/// The tensors of one module from its packed weight bytes and scales.
fn tensors(
    module: &str,
    words: Vec<u8>,
    scales: &[f32],
    rows: usize,
    cols: usize,
    model: Dtype,
) -> Vec<(String, Vec<u8>)> {
    let shape: Vec<u8> = [rows as i64, cols as i64]
        .iter()
        .flat_map(|d| d.to_le_bytes())
        .collect();
    vec![
        (format!("{module}.weight_packed"), words),
        (
            format!("{module}.weight_scale"),
            encode_floats(scales, model),
        ),
        (format!("{module}.weight_shape"), shape),
    ]
}

/// Decode `weight_packed` (`[rows, ⌈cols/8⌉]` words) and `[rows, cols/G]` scales: the stored
/// nibble minus 8.
pub fn decode(weight: &[u8], scales: &[f32], rows: usize, cols: usize, group: usize) -> Int4 {
    let codes = pack::unpack_rows(&pack::words(weight), rows, cols, Order::Sequential)
        .into_iter()
        .map(|q| (q as u8 & 0xf) as i8 - OFFSET)
        .collect();
    Int4 {
        rows,
        cols,
        group,
        scales: scales.to_vec(),
        codes,
    }
}

/// `pack-quantized` read back (`Stored::CtPacked`): [`decode`]'s layout; the GEMV kernels take it
/// (a nibble shuffle).
pub struct PackedLayout {
    pub group: usize,
}

impl IntLayout for PackedLayout {
    fn codes(&self, p: &Parts) -> Int4 {
        let (w, s, rows, cols) = p.int_tensors("weight_packed");
        decode(w, &s, rows, cols, self.group)
    }
    fn gemv(&self) -> Option<Gemv> {
        Some(Gemv::OffsetWords { group: self.group })
    }
}

/// `quantization_config` as compressed-tensors 0.20.0 writes it for W4A16 `pack-quantized`:
/// `group: None` is per channel. `ignore` entries are exact module names or `re:` regexes.
pub fn config(group: Option<usize>, ignore: &[String]) -> Value {
    let strategy = if group.is_some() { "group" } else { "channel" };
    let weights = json!({"dynamic": false, "group_size": group, "num_bits": 4,
                         "strategy": strategy, "symmetric": true, "type": "int"});
    quantization_config(
        "pack-quantized",
        weights,
        Value::Null,
        ignore,
        Ignore::Sorted,
    )
}

/// Where a `quantization_config` holds its `ignore` list: in its sorted place (what
/// `ModelCompressor.update_config` writes for `pack-quantized` and NVFP4), or last (the
/// `float-quantized` and `int-quantized` presets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignore {
    Sorted,
    Last,
}

/// The `quantization_config` compressed-tensors 0.20.0 writes for one `Linear` group of
/// `format` with `weights` and `input` activation arguments, every format's alike.
pub fn quantization_config(
    format: &str,
    weights: Value,
    input: Value,
    ignore: &[String],
    at: Ignore,
) -> Value {
    let mut c = json!({
        "config_groups": {"group_0": {
            "format": format, "input_activations": input, "output_activations": null,
            "targets": ["Linear"], "weights": weights,
        }},
        "format": format,
        "global_compression_ratio": null,
    });
    if at == Ignore::Sorted {
        c["ignore"] = json!(ignore);
    }
    let tail = json!({
        "kv_cache_scheme": null,
        "moe_sparsity_config": null,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": VERSION,
    });
    for (k, v) in tail.as_object().expect("an object") {
        c[k] = v.clone();
    }
    if at == Ignore::Last {
        c["ignore"] = json!(ignore);
    }
    c
}

/// compressed-tensors `pack-quantized` W4A16 as a [`Codec`]; `group: None` is per channel.
pub struct PackQuantized {
    pub group: Option<usize>,
}

impl Codec for PackQuantized {
    fn describe(&self) -> String {
        format!("compressed-tensors {VERSION} pack-quantized")
    }
    fn specs(&self, module: &str, rows: usize, cols: usize, dtype: Dtype) -> Vec<TensorSpec> {
        specs(module, rows, cols, self.group.unwrap_or(cols), dtype)
    }
    fn encode(&self, module: &str, w: &[f32], rows: usize, cols: usize, dtype: Dtype) -> Encoded {
        let group = self.group.unwrap_or(cols);
        encode(module, &quantize(w, rows, cols, group, dtype), dtype)
    }
    fn encode_stored(&self, module: &str, w: &StoredWeight<'_>, _: &mut Vec<f32>) -> RawEncoded {
        let group = self.group.unwrap_or(w.cols);
        encode_raw(module, w.raw, w.rows, w.cols, group, w.dtype)
    }
    fn config(&self, ignore: &[String]) -> ConfigFiles {
        ConfigFiles::config(config(self.group, ignore))
    }
    fn int_grid(&self) -> Option<&dyn IntGrid> {
        Some(self)
    }
}

impl IntGrid for PackQuantized {
    fn group(&self, cols: usize) -> usize {
        self.group.unwrap_or(cols)
    }
    fn range(&self) -> (i8, i8) {
        (QMIN as i8, QMAX as i8)
    }
    fn scale_dtype(&self, model: Dtype) -> Dtype {
        model
    }
    fn code(&self, w: f32, s: f32, model: Dtype) -> i8 {
        ct_code(w, s, model)
    }
    fn rtn(&self, w: &[f32], rows: usize, cols: usize, model: Dtype) -> Int4 {
        quantize(w, rows, cols, self.group.unwrap_or(cols), model)
    }
    fn write(&self, module: &str, q: &Int4, model: Dtype) -> Encoded {
        encode(module, q, model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::math::rowwise::test_data_narrow as data;

    /// The golden row of `fixtures/goldens/compressed-tensors-0.20/*/summary.json`.
    #[test]
    fn golden_word_is_offset_binary_sequential() {
        let q = quantize_ref(&rowwise::PLANTED_ROW, 1, 8, 8, Dtype::BF16);
        crate::quant::math::int4::assert_planted_codes(&q);
        let enc = encode("m", &q, Dtype::BF16);
        assert_eq!(
            u32::from_le_bytes(enc[0].1[..4].try_into().unwrap()),
            0x668aa80f
        );
        assert_eq!(
            enc[2].1,
            [1i64, 8]
                .iter()
                .flat_map(|d| d.to_le_bytes())
                .collect::<Vec<_>>()
        );
    }

    /// The quotient is rounded to BF16 before rounding to an integer: 2.5077 → 2.5 → 2
    /// (an f32 quotient would give 3). Quark's multiply-by-reciprocal is not used.
    #[test]
    fn quotient_rounds_to_the_model_dtype_first() {
        // BF16 bit patterns 0x3DA3 and 0x3D02.
        let (w, s) = (f32::from_bits(0x3DA3_0000), f32::from_bits(0x3D02_0000));
        assert_eq!(ct_code(w, s, Dtype::BF16), 2);
        assert_eq!(ct_code(w, s, Dtype::F32), 3);
        // Clamp before rounding: 7.5 → 7 (and −8.4 → −8).
        assert_eq!(ct_code(7.5, 1.0, Dtype::BF16), 7);
        assert_eq!(ct_code(-8.4, 1.0, Dtype::F32), -8);
    }

    #[test]
    fn zero_group_gets_the_dtype_eps() {
        for (dt, bits) in [(Dtype::BF16, 0x3c00u16), (Dtype::F16, 0x1400)] {
            let q = quantize_ref(&[0.0; 16], 1, 16, 8, dt);
            let b = encode_floats(&q.scales, dt);
            assert_eq!(u16::from_le_bytes([b[0], b[1]]), bits, "{dt}");
            assert_eq!(q.codes, vec![0; 16]);
            let enc = encode("m", &q, dt);
            assert_eq!(&enc[0].1[..4], &0x8888_8888u32.to_le_bytes());
        }
        assert_eq!(ct_scale(&[0.0], Dtype::F32), f32::EPSILON);
    }

    #[test]
    fn padding_nibbles_are_raw_zero() {
        let q = quantize_ref(&[0.0; 12], 1, 12, 12, Dtype::BF16);
        let enc = encode("m", &q, Dtype::BF16);
        let w1 = u32::from_le_bytes(enc[0].1[4..8].try_into().unwrap());
        assert_eq!(w1, 0x0000_8888);
    }

    #[test]
    fn fast_equals_reference_and_round_trips() {
        for (rows, cols, group) in [(64, 128, 128), (33, 96, 32), (7, 13, 13), (5, 256, 64)] {
            for dt in [Dtype::BF16, Dtype::F16, Dtype::F32] {
                let w = data(rows, cols, dt);
                let r = quantize_ref(&w, rows, cols, group, dt);
                assert_eq!(quantize(&w, rows, cols, group, dt), r);
                let enc = encode("m", &r, dt);
                assert_eq!(decode(&enc[0].1, &r.scales, rows, cols, group), r);
            }
        }
    }

    /// Named bound: inside the range the reconstruction error is at most s/2 plus the model-dtype
    /// rounding of the quotient (half an ulp of a value ≤ 8, in units of s: BF16 2^-6·s).
    #[test]
    fn error_bound() {
        const MAX_RMSE_CT_INT4_PC: f32 = 0.003;
        let (rows, cols) = (32, 128);
        let w = data(rows, cols, Dtype::BF16);
        let q = quantize_ref(&w, rows, cols, cols, Dtype::BF16);
        let rmse = rowwise::rmse_within(&w, &q.dequantize_ref(), |i, e| {
            let s = q.scales[i / cols];
            e <= s * (0.5 + 1.0 / 64.0) + 1e-6 || w[i] > 7.0 * s
        });
        assert!(rmse < MAX_RMSE_CT_INT4_PC, "rmse {rmse}");
    }

    #[test]
    fn config_fields() {
        let c = config(Some(128), &["lm_head".into()]);
        let w = &c["config_groups"]["group_0"]["weights"];
        assert_eq!(w["strategy"], "group");
        assert_eq!(w["group_size"], 128);
        let c = config(None, &[]);
        let w = &c["config_groups"]["group_0"]["weights"];
        assert_eq!(w["strategy"], "channel");
        assert!(w["group_size"].is_null());
        assert_eq!(c["quant_method"], "compressed-tensors");
    }
}
