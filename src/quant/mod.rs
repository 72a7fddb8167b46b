//! Quantization: schemes (reference math + fast paths), packing, exclusion rules and the file
//! formats they are written in. Each format keeps its own recipe; they are never unified.

pub mod compressed_tensors;
pub mod decode;
pub mod exclude;
pub mod int4;
pub mod order_check;
pub mod pack;
pub mod preset;
pub mod quark;
pub mod quark_group;
pub mod registry;
pub mod target;
