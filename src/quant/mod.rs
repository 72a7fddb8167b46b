//! Quantization: schemes (reference math + fast paths), packing, exclusion rules and the file
//! formats they are written in. Each format keeps its own recipe; they are never unified.

pub mod exclude;
pub mod int4;
pub mod pack;
pub mod quark;
