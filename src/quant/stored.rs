//! The vocabulary of reading a quantized checkpoint back, shared by each format's reader
//! (`quark::read`, `compressed_tensors::read`, `modelopt::read`), each format's layouts and
//! `quant::decode`, which calls them: the tensor a reader is shown ([`Probe`]), what it finds
//! ([`QModule`]: one quantized module, stored as one of the [`Stored`] layouts), and the read
//! side of one layout ([`Layout`]: its dequantization, integer view, the view the CPU product
//! keeps packed and the repack the GEMV kernels take), which each format implements beside
//! its encoder and `quant::decode::layout` reaches from a [`Stored`] in one exhaustive match.

use crate::error::Error;
use crate::io::shard::TensorView;
use crate::io::source::Weights;
use crate::io::TensorInfo;
use crate::quant::math::fp8::Fp8;
use crate::quant::math::int4::Int4;
use crate::quant::math::pack::Order;

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

/// One tensor as a format's reader (`quark::read`, `compressed_tensors::read`,
/// `modelopt::read`) sees it: its module, last name component, the module's `weight_scale`, the
/// checkpoint's `quantization_config`, and the weights to look siblings up in.
pub struct Probe<'a> {
    pub w: &'a Weights,
    pub module: &'a str,
    pub last: &'a str,
    pub t: &'a TensorInfo,
    pub scale: Option<&'a TensorInfo>,
    pub config: Option<&'a serde_json::Value>,
}

impl Probe<'_> {
    /// The module of this probe, found stored as `stored`, `[rows, cols]`, in tensors `parts`.
    pub fn found(&self, stored: Stored, rows: usize, cols: usize, parts: Vec<String>) -> QModule {
        QModule {
            module: self.module.into(),
            stored,
            rows,
            cols,
            parts,
        }
    }
    /// The refusal of tensor `t` (named with its shard's path).
    pub fn err(&self, t: &TensorInfo, msg: String) -> Error {
        Error::Tensor {
            path: self
                .w
                .shard_of(&t.name)
                .map(|s| s.path().to_path_buf())
                .unwrap_or_default(),
            tensor: t.name.clone(),
            msg,
            hint: None,
        }
    }
}

/// The tensors of one quantized module, as its [`Layout`] reads them.
pub struct Parts<'a> {
    pub w: &'a Weights,
    pub m: &'a QModule,
}

impl<'a> Parts<'a> {
    /// `{module}.{suffix}`, if the checkpoint has it.
    pub fn get(&self, suffix: &str) -> Option<TensorView<'a>> {
        self.w.tensor(&format!("{}.{suffix}", self.m.module))
    }
    /// `{module}.{suffix}`, which the format's reader checked is there.
    pub fn data(&self, suffix: &str) -> &'a [u8] {
        self.get(suffix).expect("checked").data
    }
    /// `{module}.{suffix}` as f32 (the reader checked it is there).
    pub fn f32(&self, suffix: &str) -> Vec<f32> {
        self.get(suffix).expect("checked").to_f32()
    }
    /// What an integer layout's decoder takes: the stored codes `{module}.{codes}`, the scales
    /// `weight_scale` as f32, and the logical `rows`, `cols`.
    pub fn int_tensors(&self, codes: &str) -> (&'a [u8], Vec<f32>, usize, usize) {
        let s = self.f32("weight_scale");
        (self.data(codes), s, self.m.rows, self.m.cols)
    }
    /// The first value of the per-tensor scale `{module}.{suffix}`.
    pub fn scalar(&self, suffix: &str) -> f32 {
        self.f32(suffix)[0]
    }
}

/// What the CPU product (`runtime::packed`) keeps of a module instead of its f32 weights.
pub enum Packing {
    /// Integer codes and scales, with ModelOpt's `pre_quant_scale` multiplied in after them.
    Int { q: Int4, pre: Option<Vec<f32>> },
    /// FP8 E4M3 codes with one scale per row or per tensor.
    Fp8(Fp8),
}

/// How the GEMV kernels' weight layout (`gpu::layout`, `kq-w4-gemv/1`) is repacked from a
/// module's stored words, for the symmetric INT4 layouts the kernels take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gemv {
    /// Quark per channel: I32 `weight` `[rows, ⌈cols/8⌉]`, two's complement nibbles in `order`.
    QuarkWords { order: Order },
    /// compressed-tensors `pack-quantized`: I32 `weight_packed`, sequential offset binary.
    OffsetWords { group: usize },
    /// ModelOpt: U8 `weight` `[⌈rows/2⌉, cols]`, two output rows per byte.
    RowPairs { group: usize },
}

impl Gemv {
    /// The module's tensor that holds the codes.
    pub fn tensor(self) -> &'static str {
        match self {
            Gemv::QuarkWords { .. } | Gemv::RowPairs { .. } => "weight",
            Gemv::OffsetWords { .. } => "weight_packed",
        }
    }
}

/// The read side of one stored layout, implemented by each format beside the encoder that
/// writes it; [`Stored`] names the layout and `quant::decode::layout` gives its implementation.
/// Every method is required: a layout that forgets one does not compile.
pub trait Layout {
    /// The logical weights `[rows, cols]` f32, by the format's own arithmetic.
    fn dequantize(&self, p: &Parts) -> Vec<f32>;
    /// Integer codes and scales (for `int4_fp8`: the INT4 stage, scales `s2`), or the name of
    /// the kind of weights that have none (`"FP8"`, `"NVFP4"`).
    fn int4(&self, p: &Parts) -> Result<Int4, &'static str>;
    /// What the CPU product keeps packed; `None`: the module stays on the f32 path.
    fn packed(&self, p: &Parts) -> Option<Packing>;
    /// The repack the GEMV kernels take; `None`: not a layout they take.
    fn gemv(&self) -> Option<Gemv>;
}

/// A layout read back only as f32 (NVFP4): `dequantize` is its format's arithmetic; it has no
/// integer view (`kind` names its weights), stays on the CPU's f32 path and has no kernel
/// repack.
pub struct F32Layout {
    pub kind: &'static str,
    pub dequantize: fn(&Parts) -> Vec<f32>,
}

impl Layout for F32Layout {
    fn dequantize(&self, p: &Parts) -> Vec<f32> {
        (self.dequantize)(p)
    }
    fn int4(&self, _: &Parts) -> Result<Int4, &'static str> {
        Err(self.kind)
    }
    fn packed(&self, _: &Parts) -> Option<Packing> {
        None
    }
    fn gemv(&self) -> Option<Gemv> {
        None
    }
}

/// A layout of integer codes under per-(row, group) scales, read back as `w = q · s` and kept
/// packed as its codes: its [`Layout`] follows from its codes.
pub trait IntLayout {
    /// Its codes and scales.
    fn codes(&self, p: &Parts) -> Int4;
    /// The repack the GEMV kernels take; `None`: not a layout they take.
    fn gemv(&self) -> Option<Gemv>;
}

impl<T: IntLayout> Layout for T {
    fn dequantize(&self, p: &Parts) -> Vec<f32> {
        self.codes(p).dequantize_ref()
    }
    fn int4(&self, p: &Parts) -> Result<Int4, &'static str> {
        Ok(self.codes(p))
    }
    fn packed(&self, p: &Parts) -> Option<Packing> {
        Some(Packing::Int {
            q: self.codes(p),
            pre: None,
        })
    }
    fn gemv(&self) -> Option<Gemv> {
        IntLayout::gemv(self)
    }
}
