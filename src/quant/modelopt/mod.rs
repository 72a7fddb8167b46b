//! NVIDIA ModelOpt's Hugging Face ("unified") checkpoint, as nvidia-modelopt 0.47.0's
//! `export_hf_checkpoint` writes it, for TensorRT-LLM. Each scheme with ModelOpt's own arithmetic
//! (`export/quant_utils.py`: `get_scaling_factor`, `to_quantized_weight`, `pack_int4_in_uint8`;
//! `TensorQuantizer.export_amax`), never another format's:
//!
//! - `W4A16_AWQ` (`INT4_AWQ_CFG`; kquant `int4-g128`), without the AWQ search:
//!   - `amax` over each run of 128 input columns, exact; an `amax` of 0 becomes the maxbound 7
//!     (so the scale is 1.0), and it is floored at the smallest normal of the model dtype
//!     (`export_amax`); `s = f32(amax) / 7` in F32 (maxbound 7, not 7.5);
//!   - `q = clamp(round_half_even(f32(w) / s), −8, 7)`: true division in F32 (a model-dtype
//!     weight divided by an F32 scale), rounding, then the clamp;
//!   - packed along the **output** dimension: byte `[k, j]` = `q[2k, j] & 0xF | q[2k+1, j] << 4`
//!     (two's complement nibbles, low nibble = even row);
//!   - `X.weight` U8 `[out/2, in]`, `X.weight_scale` F32 `[out, in/128]`, and
//!     `X.pre_quant_scale` (ones, model dtype, `[in]`) on every module TensorRT-LLM loads
//!     unfused — all but `q/k/v_proj` and `gate/up_proj`, whose AWQ smoothing ModelOpt folds
//!     into the preceding norm. TensorRT-LLM's `W4A16_AWQ_LinearMethod.load_weights_vanilla`
//!     reads `pre_quant_scale` unconditionally.
//! - `FP8_PER_CHANNEL_PER_TOKEN` (kquant `fp8-pc`): `s = f32(amax_row) / 448` (zero → 1.0),
//!   `code = e4m3(f32(w) / s)` (torch's RNE cast, no clamp: `|w / s| ≤ 448` by construction);
//!   `X.weight` F8_E4M3 `[out, in]`, `X.weight_scale` F32 `[out]`; activations are quantized
//!   dynamically per token by the engine, so there is no `input_scale`.
//!
//! - `NVFP4` / `W4A16_NVFP4`: `modelopt/nvfp4.rs` (its scales are shared across fused siblings).
//!
//! Config: `hf_quant_config.json` (`producer` + `quantization`, `exclude_modules`) beside
//! `config.json`, whose `quantization_config` is the flat form (`ignore`, `quant_algo`,
//! `producer`, `quant_method "modelopt"`). TensorRT-LLM reads either and matches each entry with
//! `fnmatch.fnmatchcase` against its own module names ([`exclude_modules`]).
//!
//! Facts: docs/quantize.md, "`--format modelopt`"; checked against
//! fixtures/goldens/modelopt-0.47/ (tests/modelopt_golden.rs): FP8 byte for byte; INT4 on
//! everything the golden's AWQ search does not change (see docs/quantize.md).
//!
//! `*_ref` are the plain references; the unsuffixed functions are the rayon fast paths, tested
//! identical.

pub mod drafter;
pub mod nvfp4;
pub mod read;

use rayon::prelude::*;
use serde_json::{json, Value};

use crate::io::writer::TensorSpec;
use crate::io::Dtype;
use crate::quant::codec::{Codec, ConfigFiles, Encoded, IntGrid};
use crate::quant::math::fp8::{e4m3_from_f32, Fp8};
use crate::quant::math::int4::Int4;
use crate::quant::math::rowwise::{self, amax, encode_floats, Path};
use crate::quant::stored::{self, Gemv, Packing, Parts};

/// The ModelOpt release whose output this reproduces (written as `producer.version`).
pub const VERSION: &str = "0.47.0";
/// `TensorQuantizer.maxbound` of a 4-bit integer quantizer.
pub const INT4_MAXBOUND: f32 = 7.0;
/// `TensorQuantizer.maxbound` of an FP8 E4M3 quantizer.
pub const FP8_MAXBOUND: f32 = 448.0;
/// ModelOpt's (and TensorRT-LLM's) group size for `W4A16_AWQ`.
pub const AWQ_GROUP: usize = 128;

/// Which ModelOpt `quant_algo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algo {
    /// `W4A16_AWQ` with this group size.
    W4a16Awq { group: usize },
    /// `FP8_PER_CHANNEL_PER_TOKEN`.
    Fp8PerChannelPerToken,
}

impl Algo {
    pub fn quant_algo(self) -> &'static str {
        match self {
            Algo::W4a16Awq { .. } => "W4A16_AWQ",
            Algo::Fp8PerChannelPerToken => "FP8_PER_CHANNEL_PER_TOKEN",
        }
    }
}

/// `torch.finfo(dtype).tiny` of the dtype the quantizer's `amax` is kept in (the weight's).
fn amax_tiny(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::F16 => half::f16::MIN_POSITIVE.to_f32(),
        _ => f32::MIN_POSITIVE,
    }
}

/// `get_scaling_factor`: `export_amax` (0 → maxbound, floor at the dtype's smallest normal),
/// then `amax.float() / maxbound` in F32.
pub fn scale_from_amax(amax: f32, maxbound: f32, dtype: Dtype) -> f32 {
    let a = if amax == 0.0 {
        maxbound
    } else {
        amax.max(amax_tiny(dtype))
    };
    a / maxbound
}

// ---------------------------------------------------------------------------------------------
// W4A16_AWQ

/// One INT4 code: `clamp(round_half_even(w / s), −8, 7)` (`pack_int4_in_uint8`).
pub fn int4_code(w: f32, s: f32) -> i8 {
    crate::quant::math::rne::rne(w / s).clamp(-8.0, 7.0) as i8
}

fn int4_on(path: Path, w: &[f32], rows: usize, cols: usize, group: usize, dt: Dtype) -> Int4 {
    assert_eq!(cols % group, 0, "group must divide the input dimension");
    let recipe = rowwise::scaled(|b| scale_from_amax(amax(b), INT4_MAXBOUND, dt), int4_code);
    Int4::quantize_runs(path, w, rows, cols, group, recipe)
}

rowwise::paths! {
    /// `group` must divide `cols` (the driver refuses otherwise).
    int4_on: int4_quantize_ref, int4_quantize(w: &[f32], rows: usize, cols: usize, group: usize, dtype: Dtype) -> Int4
}

/// Pack codes two output rows per byte: `[⌈rows/2⌉, cols]` U8, byte `[k, j]` =
/// `q[2k, j] & 0xF | (q[2k+1, j] & 0xF) << 4`. ModelOpt refuses an odd row count; kquant pads
/// the last byte row with a zero high nibble (TensorRT-LLM cannot load such a module either).
pub fn pack_rows(codes: &[i8], rows: usize, cols: usize) -> Vec<u8> {
    assert_eq!(codes.len(), rows * cols);
    let mut out = vec![0u8; rows.div_ceil(2) * cols];
    if cols > 0 {
        out.par_chunks_mut(cols).enumerate().for_each(|(k, o)| {
            let lo = &codes[2 * k * cols..(2 * k + 1) * cols];
            let hi = codes.get((2 * k + 1) * cols..(2 * k + 2) * cols);
            for (j, b) in o.iter_mut().enumerate() {
                let h = hi.map_or(0, |h| h[j]);
                *b = (lo[j] as u8 & 0xf) | ((h as u8 & 0xf) << 4);
            }
        });
    }
    out
}

/// Unpack [`pack_rows`] (sign-extending nibbles) into `[rows, cols]` codes.
pub fn unpack_rows(bytes: &[u8], rows: usize, cols: usize) -> Vec<i8> {
    assert_eq!(bytes.len(), rows.div_ceil(2) * cols);
    let nib = |v: u8| ((v << 4) as i8) >> 4;
    let mut out = vec![0i8; rows * cols];
    for r in 0..rows {
        let src = &bytes[(r / 2) * cols..(r / 2 + 1) * cols];
        for (o, &b) in out[r * cols..(r + 1) * cols].iter_mut().zip(src) {
            *o = if r % 2 == 0 {
                nib(b & 0xf)
            } else {
                nib(b >> 4)
            };
        }
    }
    out
}

/// Whether TensorRT-LLM loads `module` into a fused Linear (`qkv_proj`, `gate_up_proj`), where
/// ModelOpt folds the AWQ smoothing into the preceding norm and writes no `pre_quant_scale`.
pub fn trtllm_fused(module: &str) -> bool {
    let last = module.rsplit('.').next().unwrap_or(module);
    matches!(
        last,
        "q_proj" | "k_proj" | "v_proj" | "gate_proj" | "up_proj"
    )
}

/// The tensors one `W4A16_AWQ` module becomes.
pub fn int4_specs(module: &str, rows: usize, cols: usize, g: usize, dt: Dtype) -> Vec<TensorSpec> {
    let groups = rowwise::groups(module, cols, g);
    let mut v = vec![
        TensorSpec::new(
            format!("{module}.weight"),
            Dtype::U8,
            vec![rows.div_ceil(2), cols],
        ),
        TensorSpec::new(
            format!("{module}.weight_scale"),
            Dtype::F32,
            vec![rows, groups],
        ),
    ];
    if !trtllm_fused(module) {
        v.push(TensorSpec::new(
            format!("{module}.pre_quant_scale"),
            dt,
            vec![cols],
        ));
    }
    v
}

/// Encode a `W4A16_AWQ` module for each of its [`int4_specs`].
pub fn int4_encode(module: &str, q: &Int4, model: Dtype) -> Vec<(String, Vec<u8>)> {
    let mut v = vec![
        (
            format!("{module}.weight"),
            pack_rows(&q.codes, q.rows, q.cols),
        ),
        (
            format!("{module}.weight_scale"),
            encode_floats(&q.scales, Dtype::F32),
        ),
    ];
    if !trtllm_fused(module) {
        v.push((
            format!("{module}.pre_quant_scale"),
            encode_floats(&vec![1.0; q.cols], model),
        ));
    }
    v
}

/// Decode a `W4A16_AWQ` module: `weight` `[⌈rows/2⌉, cols]` U8, `scales` `[rows, cols/G]`.
pub fn int4_decode(weight: &[u8], scales: &[f32], rows: usize, cols: usize, group: usize) -> Int4 {
    Int4 {
        rows,
        cols,
        group,
        scales: scales.to_vec(),
        codes: unpack_rows(weight, rows, cols),
    }
}

/// `W4A16_AWQ` / `W4A8_AWQ` read back (`Stored::ModeloptInt4`): [`int4_decode`]'s codes, and
/// the optional `pre_quant_scale` multiplied into each weight after its scale; the GEMV kernels
/// take it (a transpose), the caller scaling the activations by `pre_quant_scale`.
pub struct Int4Layout {
    pub group: usize,
}

impl Int4Layout {
    fn codes(&self, p: &Parts) -> Int4 {
        let (w, s, rows, cols) = p.int_tensors("weight");
        int4_decode(w, &s, rows, cols, self.group)
    }
}

impl stored::Layout for Int4Layout {
    fn dequantize(&self, p: &Parts) -> Vec<f32> {
        with_pre_quant_scale(p, self.codes(p).dequantize_ref())
    }
    fn int4(&self, p: &Parts) -> Result<Int4, &'static str> {
        Ok(self.codes(p))
    }
    fn packed(&self, p: &Parts) -> Option<Packing> {
        let pre = p.get("pre_quant_scale").map(|t| t.to_f32());
        Some(Packing::Int {
            q: self.codes(p),
            pre,
        })
    }
    fn gemv(&self) -> Option<Gemv> {
        Some(Gemv::RowPairs { group: self.group })
    }
}

/// `v` `[rows, cols]` times the module's `pre_quant_scale` along the input, if it has one:
/// TensorRT-LLM multiplies the input by it, so the weight it computes with is `w · pqs`.
pub fn with_pre_quant_scale(p: &Parts, mut v: Vec<f32>) -> Vec<f32> {
    if let Some(pqs) = p.get("pre_quant_scale") {
        let pqs = pqs.to_f32();
        for row in v.chunks_mut(p.m.cols.max(1)) {
            for (x, s) in row.iter_mut().zip(&pqs) {
                *x *= s;
            }
        }
    }
    v
}

// ---------------------------------------------------------------------------------------------
// FP8_PER_CHANNEL_PER_TOKEN

/// One FP8 code: `e4m3(f32(w) / s)`.
pub fn fp8_code(w: f32, s: f32) -> u8 {
    e4m3_from_f32(w / s)
}

fn fp8_quantize_on(path: Path, w: &[f32], rows: usize, cols: usize, dtype: Dtype) -> Fp8 {
    let scale = |r: &[f32]| scale_from_amax(amax(r), FP8_MAXBOUND, dtype);
    Fp8::quantize_rows(path, w, rows, cols, rowwise::scaled(scale, fp8_code))
}

rowwise::paths! {
    fp8_quantize_on: fp8_quantize_ref, fp8_quantize(w: &[f32], rows: usize, cols: usize, dtype: Dtype) -> Fp8
}

/// The tensors one `FP8_PER_CHANNEL_PER_TOKEN` module becomes: one F32 scale per row, `[rows]`.
pub fn fp8_specs(module: &str, rows: usize, cols: usize) -> Vec<TensorSpec> {
    Fp8::specs(module, rows, cols, Dtype::F32, vec![rows])
}

// ---------------------------------------------------------------------------------------------
// Config

/// Escape `*`, `?` and `[` for Python `fnmatch` (`[*]`, `[?]`, `[[]`).
pub fn fnmatch_escape(name: &str) -> String {
    let mut s = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '*' | '?' | '[' => {
                s.push('[');
                s.push(c);
                s.push(']');
            }
            c => s.push(c),
        }
    }
    s
}

/// The names TensorRT-LLM's PyTorch backend gives checkpoint module `module` when it is not
/// the name itself: an EAGLE-3 draft (`Eagle3ForCausalLM`) prefixes everything but `lm_head`
/// with `model.` and maps `layers.0.*` to `midlayer.*` (one layer) or `midlayer.0.*` (several);
/// names that already start with `model.` (HF decoder models) are kept.
pub fn trtllm_names(module: &str) -> Vec<String> {
    if module == "lm_head" || module.starts_with("model.") {
        return Vec::new();
    }
    if let Some(rest) = module.strip_prefix("layers.") {
        if let Some((n, tail)) = rest.split_once('.') {
            if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                let mut v = Vec::new();
                if n == "0" {
                    v.push(format!("model.midlayer.{tail}"));
                }
                v.push(format!("model.midlayer.{n}.{tail}"));
                return v;
            }
        }
    }
    vec![format!("model.{module}")]
}

/// ModelOpt's `exclude_modules` / `ignore` for the unquantized modules in `exclude` (the
/// driver's list; its `re:` entries, which TensorRT-LLM does not understand, are dropped):
/// the concrete names sorted, as `process_layer_quant_config` writes them (kquant never merges
/// them into prefix wildcards), then, for each, the fnmatch-escaped names TensorRT-LLM gives
/// that module ([`trtllm_names`]), so its `fnmatchcase` matcher finds it after renaming, and
/// for each complete fused group (`q/k/v_proj`, `gate/up_proj`) the fused module's name.
pub fn exclude_modules(exclude: &[String]) -> Vec<String> {
    let mut concrete: Vec<String> = exclude
        .iter()
        .filter(|e| !e.starts_with("re:"))
        .cloned()
        .collect();
    concrete.sort();
    concrete.dedup();
    let mut out: Vec<String> = concrete.iter().map(|m| fnmatch_escape(m)).collect();
    let mut push = |n: String| {
        let n = fnmatch_escape(&n);
        if !out.contains(&n) {
            out.push(n);
        }
    };
    for m in &concrete {
        trtllm_names(m).into_iter().for_each(&mut push);
    }
    // A whole fused group also by its fused name: TensorRT-LLM releases that match only the
    // fused module's own name (`qkv_proj`, `gate_up_proj`) still find it.
    for m in &concrete {
        for (fused, parts) in FUSED {
            let Some(prefix) = m.strip_suffix(parts[0]) else {
                continue;
            };
            if prefix.ends_with('.')
                && parts
                    .iter()
                    .all(|p| concrete.contains(&format!("{prefix}{p}")))
            {
                let f = format!("{prefix}{fused}");
                match trtllm_names(&f) {
                    v if v.is_empty() => push(f),
                    v => v.into_iter().for_each(&mut push),
                }
            }
        }
    }
    out
}

/// The modules TensorRT-LLM loads as one Linear: fused name, checkpoint names.
const FUSED: [(&str, &[&str]); 2] = [
    ("qkv_proj", &["q_proj", "k_proj", "v_proj"]),
    ("gate_up_proj", &["gate_proj", "up_proj"]),
];

/// `hf_quant_config.json`, as `get_quant_config` + `process_layer_quant_config` build it.
pub fn hf_quant_config(algo: Algo, exclude_modules: &[String]) -> Value {
    let mut q = serde_json::Map::new();
    q.insert("quant_algo".into(), json!(algo.quant_algo()));
    q.insert("kv_cache_quant_algo".into(), Value::Null);
    if let Algo::W4a16Awq { group } = algo {
        q.insert("group_size".into(), json!(group));
        q.insert("has_zero_point".into(), json!(false));
        q.insert("pre_quant_scale".into(), json!(true));
    }
    q.insert("exclude_modules".into(), json!(exclude_modules));
    json!({"producer": {"name": "modelopt", "version": VERSION}, "quantization": q})
}

/// `quantization_config` in `config.json`, as `convert_hf_quant_config_format` writes it for
/// these algorithms (no `config_groups`: ModelOpt adds them for FP8 per-tensor and NVFP4 only;
/// NVFP4 is `modelopt/nvfp4.rs`).
pub fn config(algo: Algo, ignore: &[String]) -> Value {
    json!({
        "ignore": ignore,
        "quant_algo": algo.quant_algo(),
        "producer": {"name": "modelopt", "version": VERSION},
        "quant_method": "modelopt",
    })
}

/// Python `json.dump(..., indent=4)` bytes (ModelOpt's `hf_quant_config.json`; no final newline).
pub fn python_json_indent4(v: &Value) -> Vec<u8> {
    use serde::Serialize;
    let mut out = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    v.serialize(&mut ser).expect("JSON");
    out
}

/// ModelOpt INT4 AWQ-layout and FP8 per-channel as a [`Codec`].
pub struct Modelopt(pub Algo);

impl Codec for Modelopt {
    fn describe(&self) -> String {
        format!("ModelOpt {VERSION} {}", self.0.quant_algo())
    }
    fn specs(&self, module: &str, rows: usize, cols: usize, dtype: Dtype) -> Vec<TensorSpec> {
        match self.0 {
            Algo::W4a16Awq { group } => int4_specs(module, rows, cols, group, dtype),
            Algo::Fp8PerChannelPerToken => fp8_specs(module, rows, cols),
        }
    }
    fn encode(&self, module: &str, w: &[f32], rows: usize, cols: usize, dtype: Dtype) -> Encoded {
        match self.0 {
            Algo::W4a16Awq { group } => {
                int4_encode(module, &int4_quantize(w, rows, cols, group, dtype), dtype)
            }
            Algo::Fp8PerChannelPerToken => {
                fp8_quantize(w, rows, cols, dtype).encode(module, Dtype::F32)
            }
        }
    }
    /// `exclude_modules`: every module a pattern matched (embeddings too: ModelOpt lists every
    /// module that has a disabled quantizer, `Embedding` included) plus unquantized Linear
    /// candidates, as [`exclude_modules`] writes them.
    fn config(&self, exclude_modules: &[String]) -> ConfigFiles {
        ConfigFiles {
            quantization_config: config(self.0, exclude_modules),
            side_files: vec![(
                "hf_quant_config.json".into(),
                python_json_indent4(&hf_quant_config(self.0, exclude_modules)),
            )],
        }
    }
    fn int_grid(&self) -> Option<&dyn IntGrid> {
        matches!(self.0, Algo::W4a16Awq { .. }).then_some(self as &dyn IntGrid)
    }
}

/// `W4A16_AWQ`'s grid (the codec answers [`Codec::int_grid`] only for that algorithm).
impl IntGrid for Modelopt {
    fn group(&self, cols: usize) -> usize {
        match self.0 {
            Algo::W4a16Awq { group } => group,
            Algo::Fp8PerChannelPerToken => cols,
        }
    }
    fn range(&self) -> (i8, i8) {
        (-8, 7)
    }
    fn scale_dtype(&self, _model: Dtype) -> Dtype {
        Dtype::F32
    }
    fn code(&self, w: f32, s: f32, _model: Dtype) -> i8 {
        int4_code(w, s)
    }
    fn rtn(&self, w: &[f32], rows: usize, cols: usize, model: Dtype) -> Int4 {
        int4_quantize(w, rows, cols, self.group(cols), model)
    }
    fn write(&self, module: &str, q: &Int4, model: Dtype) -> Encoded {
        int4_encode(module, q, model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::dtype::f8_e4m3_to_f32;
    use crate::quant::math::rowwise::test_data_narrow as data;

    /// The divisor is 7 (not 7.5): a block with amax 7 has scale 1 and codes equal to the
    /// rounded weights, ties to even; nothing reaches −8.
    #[test]
    fn int4_scale_is_amax_over_7_and_ties_round_to_even() {
        let row = [7.0f32, -7.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5];
        let q = int4_quantize_ref(&row, 1, 8, 8, Dtype::BF16);
        assert_eq!(q.scales, vec![1.0]);
        assert_eq!(q.codes, vec![7, -7, 0, 2, 2, 0, -2, -2]);
        // F32 division, not a reciprocal multiply: amax 0.1 → s = 0.1/7 in F32.
        let s = scale_from_amax(0.1, INT4_MAXBOUND, Dtype::BF16);
        assert_eq!(s, 0.1f32 / 7.0);
        assert_eq!(int4_code(0.1, s), 7);
        assert_eq!(int4_code(-0.1, s), -7);
    }

    #[test]
    fn zero_block_has_scale_one() {
        let q = int4_quantize_ref(&[0.0; 16], 1, 16, 8, Dtype::BF16);
        assert_eq!(q.scales, vec![1.0, 1.0]);
        assert_eq!(q.codes, vec![0; 16]);
        let f = fp8_quantize_ref(&[0.0; 4], 1, 4, Dtype::BF16);
        assert_eq!(f.scales, vec![1.0]);
        assert_eq!(f.codes, vec![0; 4]);
        // Tiny amax is floored at the dtype's smallest normal.
        assert_eq!(
            scale_from_amax(1e-40, FP8_MAXBOUND, Dtype::F32),
            f32::MIN_POSITIVE / 448.0
        );
        assert_eq!(
            scale_from_amax(1e-6, FP8_MAXBOUND, Dtype::F16),
            half::f16::MIN_POSITIVE.to_f32() / 448.0
        );
    }

    /// Two output rows per byte, the even row in the low nibble, two's complement.
    #[test]
    fn packs_along_the_output_dimension() {
        // rows 0..4, cols 2: q[r][c]
        let codes: Vec<i8> = vec![1, -1, 2, -8, 7, 0, -2, 3];
        let b = pack_rows(&codes, 4, 2);
        assert_eq!(b, vec![0x21, 0x8f, 0xe7, 0x30]);
        assert_eq!(unpack_rows(&b, 4, 2), codes);
        // An odd row count pads the last high nibble with 0.
        let b = pack_rows(&codes[..6], 3, 2);
        assert_eq!(b, vec![0x21, 0x8f, 0x07, 0x00]);
        assert_eq!(unpack_rows(&b, 3, 2), codes[..6].to_vec());
    }

    #[test]
    fn fast_equals_reference_and_round_trips() {
        for (rows, cols, group) in [(64, 256, 128), (6, 128, 128), (7, 256, 64), (2, 8, 8)] {
            for dt in [Dtype::BF16, Dtype::F16, Dtype::F32] {
                let w = data(rows, cols, dt);
                let r = int4_quantize_ref(&w, rows, cols, group, dt);
                assert_eq!(int4_quantize(&w, rows, cols, group, dt), r);
                let enc = int4_encode("m.o_proj", &r, dt);
                assert_eq!(enc.len(), 3);
                assert_eq!(int4_decode(&enc[0].1, &r.scales, rows, cols, group), r);
                let f = fp8_quantize_ref(&w, rows, cols, dt);
                assert_eq!(fp8_quantize(&w, rows, cols, dt), f);
            }
        }
        assert_eq!(int4_specs("a.q_proj", 2, 8, 8, Dtype::BF16).len(), 2);
    }

    /// Named bounds: INT4 reconstruction within s/2 (amax/7 never clamps), FP8 within half an
    /// E4M3 step of the value (relative 2^-4) or half the smallest subnormal step.
    #[test]
    fn error_bounds() {
        const MAX_RMSE_MODELOPT_INT4_G128: f32 = 0.0025;
        let (rows, cols) = (32, 256);
        let w = data(rows, cols, Dtype::BF16);
        let q = int4_quantize_ref(&w, rows, cols, 128, Dtype::BF16);
        let d = q.dequantize_ref();
        let mut se = 0f64;
        for i in 0..rows * cols {
            let s = q.scales[(i / cols) * 2 + (i % cols) / 128];
            let e = (w[i] - d[i]).abs();
            assert!(e <= s * 0.5 * (1.0 + 1e-6), "{i}: {e} vs {s}");
            se += (e as f64).powi(2);
        }
        let rmse = (se / (rows * cols) as f64).sqrt() as f32;
        assert!(rmse < MAX_RMSE_MODELOPT_INT4_G128, "rmse {rmse}");
        let f = fp8_quantize_ref(&w, rows, cols, Dtype::BF16);
        for (i, (&x, &c)) in w.iter().zip(&f.codes).enumerate() {
            let s = f.scales[i / cols];
            let v = f8_e4m3_to_f32(c) * s;
            let e = (x - v).abs();
            assert!(
                e <= (x.abs() / 16.0).max(s * 2f32.powi(-10)) * (1.0 + 1e-5),
                "{i}: {x} vs {v}"
            );
        }
    }

    #[test]
    fn trtllm_names_of_draft_modules() {
        assert_eq!(trtllm_names("fc"), vec!["model.fc"]);
        assert!(trtllm_names("lm_head").is_empty());
        assert!(trtllm_names("model.embed_tokens").is_empty());
        assert_eq!(
            trtllm_names("midlayer.mlp.down_proj"),
            vec!["model.midlayer.mlp.down_proj"]
        );
        assert_eq!(
            trtllm_names("layers.0.self_attn.o_proj"),
            vec![
                "model.midlayer.self_attn.o_proj",
                "model.midlayer.0.self_attn.o_proj"
            ]
        );
        assert_eq!(
            trtllm_names("layers.2.mlp.up_proj"),
            vec!["model.midlayer.2.mlp.up_proj"]
        );
        assert_eq!(fnmatch_escape("a[1]*?"), "a[[]1][*][?]");
        let ex: Vec<String> = ["lm_head", "fc", "re:^(.*\\.)?fc$", "fc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let got = exclude_modules(&ex);
        assert_eq!(got, vec!["fc", "lm_head", "model.fc"]);
        // What TensorRT-LLM's `is_module_excluded_from_quantization` does with them.
        use crate::quant::exclude::fnmatch;
        for name in ["model.fc", "lm_head"] {
            assert!(got.iter().any(|p| fnmatch(p, name)), "{name}");
        }
        assert!(!got
            .iter()
            .any(|p| fnmatch(p, "model.midlayer.mlp.down_proj")));
        // Whole fused groups also by the fused name; a partial group does not get it.
        let ex: Vec<String> = [
            "midlayer.self_attn.q_proj",
            "midlayer.self_attn.k_proj",
            "midlayer.self_attn.v_proj",
            "model.layers.3.mlp.gate_proj",
            "model.layers.3.mlp.up_proj",
            "model.layers.4.mlp.up_proj",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let got = exclude_modules(&ex);
        assert_eq!(
            &got[6..],
            [
                "model.midlayer.self_attn.k_proj",
                "model.midlayer.self_attn.q_proj",
                "model.midlayer.self_attn.v_proj",
                "model.midlayer.self_attn.qkv_proj",
                "model.layers.3.mlp.gate_up_proj",
            ]
        );
    }

    /// `hf_quant_config.json` as `hf` makes it for the goldens' excluded modules, byte for byte
    /// as ModelOpt 0.47 wrote it for the golden of `recipe`.
    pub(super) fn assert_golden_hf_quant_config(recipe: &str, hf: impl Fn(&[String]) -> Value) {
        let want = std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
                "fixtures/goldens/modelopt-0.47/{recipe}/hf_quant_config.json"
            )),
        )
        .unwrap();
        let ex = vec!["lm_head".to_string(), "model.embed_tokens".to_string()];
        let got = python_json_indent4(&hf(&exclude_modules(&ex)));
        assert_eq!(
            String::from_utf8(got).unwrap(),
            String::from_utf8(want).unwrap()
        );
    }

    /// `hf_quant_config.json` byte for byte as ModelOpt 0.47 wrote it for the INT4 golden.
    #[test]
    fn hf_quant_config_bytes() {
        assert_golden_hf_quant_config("INT4_AWQ_CFG", |ex| {
            hf_quant_config(Algo::W4a16Awq { group: 128 }, ex)
        });
    }
}
