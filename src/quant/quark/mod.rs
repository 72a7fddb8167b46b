//! AMD Quark's on-disk format for INT4 per-channel weights, both paths Quark has:
//! - `model` (ModelQuantizer + export_safetensors): I32 `[out, in/8]` words in `pack_method`
//!   order (default reorder), scale `[out]` in the model dtype, I32 zero-point `[out/8]` (zeros);
//! - `file2file` (direct_quantize_checkpoint): sequential nibble order although the config says
//!   `reorder`, no zero-point, scale in the source dtype (0.11.1) or F32 (0.13).
//!
//! Facts and verbatim configs: AMD Quark 0.13 and 0.11.1 (PyPI `amd-quark`), their outputs in
//! fixtures/goldens/quark-*; docs/quantize.md (`--format quark`).

pub mod fp8;
pub mod int4_group;
pub mod read;
pub mod uint4;

use serde_json::{json, Value};

use crate::io::writer::TensorSpec;
use crate::io::Dtype;
use crate::quant::codec::{Codec, ConfigFiles, Encoded, IntGrid, RawEncoded, StoredWeight};
use crate::quant::math::int4::{Int4, QMAX, QMIN};
use crate::quant::math::pack::{self, Order};
use crate::quant::math::rowwise::{self, encode_floats};
use crate::quant::stored::{Gemv, IntLayout, Parts};

/// Which Quark export path to reproduce.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    Model,
    File2file,
}

/// Which Quark release's output to reproduce.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize, serde::Serialize,
)]
pub enum Version {
    #[value(name = "0.13")]
    #[serde(rename = "0.13")]
    V013,
    #[value(name = "0.11.1")]
    #[serde(rename = "0.11.1")]
    V0111,
}

impl Version {
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V013 => "0.13",
            Version::V0111 => "0.11.1",
        }
    }
}

/// Quark output settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    pub layout: Layout,
    pub version: Version,
    /// Model path only: `reorder` (default) or `order`.
    pub order: Order,
}

impl Options {
    /// Quark 0.13's model path with nibble order `order`.
    pub fn model_v013(order: Order) -> Options {
        Options {
            layout: Layout::Model,
            version: Version::V013,
            order,
        }
    }
    fn pack_order(&self) -> Order {
        match self.layout {
            Layout::Model => self.order,
            Layout::File2file => Order::Sequential,
        }
    }
    fn scale_dtype(&self, model: Dtype) -> Dtype {
        match (self.layout, self.version) {
            (Layout::File2file, Version::V013) => Dtype::F32,
            _ => model,
        }
    }
}

/// The tensors one quantized module becomes.
pub fn specs(module: &str, rows: usize, cols: usize, model: Dtype, o: &Options) -> Vec<TensorSpec> {
    let mut v = vec![
        TensorSpec::new(
            format!("{module}.weight"),
            Dtype::I32,
            vec![rows, cols.div_ceil(8)],
        ),
        TensorSpec::new(
            format!("{module}.weight_scale"),
            o.scale_dtype(model),
            vec![rows],
        ),
    ];
    if o.layout == Layout::Model {
        v.push(TensorSpec::new(
            format!("{module}.weight_zero_point"),
            Dtype::I32,
            vec![rows.div_ceil(8)],
        ));
    }
    v
}

/// Encode a quantized module into `(name, bytes)` for each of its [`specs`].
pub fn encode(module: &str, q: &Int4, model: Dtype, o: &Options) -> Vec<(String, Vec<u8>)> {
    assert_eq!(q.group, q.cols, "Quark per-channel");
    let words = pack::pack_rows(&q.codes, q.rows, q.cols, |row, v| {
        pack::pack(row, o.pack_order(), v)
    });
    tensors(module, pack::le_bytes(&words), &q.scales, model, o)
}

/// [`encode`] of [`int4::quantize`](crate::quant::math::int4::quantize) of the stored weight, fused row by
/// row from its bytes (see [`rowwise::packed_from_raw`]); `Err(i)`: the first non-finite
/// weight.
pub fn encode_raw(
    module: &str,
    raw: &[u8],
    rows: usize,
    cols: usize,
    model: Dtype,
    o: &Options,
) -> RawEncoded {
    let (scales, words) = rowwise::packed_from_raw(
        raw,
        model,
        rows,
        cols,
        cols,
        |run, out| crate::quant::math::int4::quark_run(run, out, model),
        |row, v| pack::pack(row, o.pack_order(), v),
    )?;
    Ok(tensors(module, words, &scales, model, o))
}

/// The tensors of one module from its packed weight bytes and per-row scales.
fn tensors(
    module: &str,
    words: Vec<u8>,
    scales: &[f32],
    model: Dtype,
    o: &Options,
) -> Vec<(String, Vec<u8>)> {
    let mut out = vec![
        (format!("{module}.weight"), words),
        (
            format!("{module}.weight_scale"),
            encode_floats(scales, o.scale_dtype(model)),
        ),
    ];
    if o.layout == Layout::Model {
        out.push((
            format!("{module}.weight_zero_point"),
            vec![0u8; scales.len().div_ceil(8) * 4],
        ));
    }
    out
}

/// Decode a Quark per-channel module back to codes and scales (for `dequantize` and tests).
pub fn decode(weight: &[u8], scale: &[f32], rows: usize, cols: usize, order: Order) -> Int4 {
    Int4 {
        rows,
        cols,
        group: cols,
        scales: scale.to_vec(),
        codes: pack::unpack_rows(&pack::words(weight), rows, cols, order),
    }
}

/// Quark INT4 per channel read back (`Stored::QuarkChannel`): I32 `weight` `[rows, ⌈cols/8⌉]`
/// in `order`, scale `[rows]`; the GEMV kernels take it (`reorder` is their nibble order).
pub struct ChannelLayout {
    pub order: Order,
}

impl IntLayout for ChannelLayout {
    fn codes(&self, p: &Parts) -> Int4 {
        let (w, s, rows, cols) = p.int_tensors("weight");
        decode(w, &s, rows, cols, self.order)
    }
    fn gemv(&self) -> Option<Gemv> {
        Some(Gemv::QuarkWords { order: self.order })
    }
}

/// `quantization_config` as Quark writes it for int4 per-channel weight-only, with `exclude`.
pub fn config(o: &Options, exclude: &[String]) -> Value {
    let mut weight = json!({
        "dtype": "int4", "is_dynamic": false, "qscheme": "per_channel", "ch_axis": 0, "group_size": null,
        "block_size": null, "symmetric": true, "round_method": "half_even", "scale_type": "float",
        "zero_point_type": "int32", "scale_format": null, "scale_calculation_mode": null,
        "mx_element_dtype": null, "observer_cls": "PerChannelMinMaxObserver", "is_scale_quant": false,
        "enable_buffer_reuse": false, "max_input_numel": 4194304,
    });
    if o.version == Version::V0111 {
        let w = weight.as_object_mut().unwrap();
        for k in [
            "zero_point_type",
            "block_size",
            "enable_buffer_reuse",
            "max_input_numel",
        ] {
            w.remove(k);
        }
    }
    let pack_method = match (o.layout, o.order) {
        (Layout::Model, Order::Sequential) => "order",
        _ => "reorder",
    };
    json!({
        "global_quant_config": {"input_tensors": null, "output_tensors": null, "weight": weight, "bias": null, "target_device": null},
        "exclude": exclude,
        "algo_config": null,
        "softmax_quant_spec": null,
        "quant_method": "quark",
        "layer_type_quant_config": {},
        "layer_quant_config": {},
        "kv_cache_quant_config": {},
        "kv_cache_post_rope": false,
        "quant_mode": "eager_mode",
        "version": o.version.as_str(),
        "export": {"kv_cache_group": [], "min_kv_scale": 0.0, "pack_method": pack_method,
                   "weight_format": "real_quantized", "weight_merge_groups": null},
    })
}

/// A `re:` pattern that matches `module` under the names engines give it after their own
/// renaming (vLLM `model.fc`, `model.layers.0.*` for `midlayer.*`, SGLang `model.midlayer.*`).
pub fn engine_pattern(module: &str) -> String {
    let mut esc = String::new();
    for c in module.chars() {
        if ".^$*+?()[]{}|\\".contains(c) {
            esc.push('\\');
        }
        esc.push(c);
    }
    for p in ["midlayer\\.", "layers\\.0\\."] {
        if let Some(rest) = esc.strip_prefix(p) {
            esc = format!("(midlayer|layers\\.0)\\.{rest}");
            break;
        }
    }
    format!("re:^(.*\\.)?{esc}$")
}

/// Quark INT4 per-channel as a [`Codec`].
pub struct Int4PerChannel(pub Options);

impl Codec for Int4PerChannel {
    fn describe(&self) -> String {
        format!("Quark {:?} layout", self.0.layout)
    }
    fn specs(&self, module: &str, rows: usize, cols: usize, dtype: Dtype) -> Vec<TensorSpec> {
        specs(module, rows, cols, dtype, &self.0)
    }
    fn encode(&self, module: &str, w: &[f32], rows: usize, cols: usize, dtype: Dtype) -> Encoded {
        encode(
            module,
            &crate::quant::math::int4::quantize(w, rows, cols, cols, dtype),
            dtype,
            &self.0,
        )
    }
    fn encode_stored(&self, module: &str, w: &StoredWeight<'_>, _: &mut Vec<f32>) -> RawEncoded {
        encode_raw(module, w.raw, w.rows, w.cols, w.dtype, &self.0)
    }
    fn config(&self, exclude: &[String]) -> ConfigFiles {
        ConfigFiles::config(config(&self.0, exclude))
    }
    fn advice(&self) -> Option<String> {
        Some(format!(
            "This {:?}-layout output is for kquant's own kernels, `kquant verify`, and Quark-compatible pipelines. For vLLM or SGLang use `--format compressed-tensors` (W4A16); for vLLM, a per-group Quark scheme such as `--scheme int4-g128` (QuarkW4A16Int4) also works.",
            self.0.layout
        ))
    }
    fn int_grid(&self) -> Option<&dyn IntGrid> {
        Some(self)
    }
}

impl IntGrid for Int4PerChannel {
    fn group(&self, cols: usize) -> usize {
        cols
    }
    fn range(&self) -> (i8, i8) {
        (QMIN as i8, QMAX as i8)
    }
    fn scale_dtype(&self, model: Dtype) -> Dtype {
        self.0.scale_dtype(model)
    }
    fn code(&self, w: f32, s: f32, _model: Dtype) -> i8 {
        crate::quant::math::int4::quark_code(w, 1.0f32 / s)
    }
    fn rtn(&self, w: &[f32], rows: usize, cols: usize, model: Dtype) -> Int4 {
        crate::quant::math::int4::quantize(w, rows, cols, cols, model)
    }
    fn write(&self, module: &str, q: &Int4, model: Dtype) -> Encoded {
        encode(module, q, model, &self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_patterns() {
        assert_eq!(engine_pattern("fc"), "re:^(.*\\.)?fc$");
        assert_eq!(
            engine_pattern("midlayer.mlp.down_proj"),
            "re:^(.*\\.)?(midlayer|layers\\.0)\\.mlp\\.down_proj$"
        );
    }
}
