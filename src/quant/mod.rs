//! Quantization: schemes (reference math + fast paths), packing, exclusion rules and the file
//! formats they are written in. Each format keeps its own recipe; they are never unified: what
//! they share is only the row-/group-wise loop and the layout helpers (`rowwise`, `pack`).

pub mod compressed_tensors;
pub mod ct_nvfp4;
pub mod ct_quantized;
pub mod decode;
pub mod exclude;
pub mod fp4;
pub mod fp8;
pub mod fused;
pub mod identify;
pub mod input_amax;
pub mod int4;
pub mod modelopt;
pub mod modelopt_nvfp4;
pub mod order_check;
pub mod pack;
pub mod preset;
pub mod quark;
pub mod quark_fp8;
pub mod quark_group;
pub mod quark_uint4;
pub mod registry;
pub mod rne;
pub mod rowwise;
pub mod schedule;
pub mod target;
