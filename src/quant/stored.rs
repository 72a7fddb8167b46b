//! The vocabulary of reading a quantized checkpoint back, shared by each format's reader
//! (`quark::read`, `compressed_tensors::read`, `modelopt::read`) and by `quant::decode`, which
//! calls them: the tensor a reader is shown ([`Probe`]), and what it finds ([`QModule`]: one
//! quantized module, stored as one of the [`Stored`] layouts).

use crate::error::Error;
use crate::io::source::Weights;
use crate::io::TensorInfo;
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
        }
    }
}
