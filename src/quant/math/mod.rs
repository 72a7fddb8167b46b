//! The arithmetic every format's recipe is built from, with no format's knowledge: INT4 and FP8
//! / FP4 (E2M1) encodings and the symmetric INT4 reference quantizer, round-half-even, nibble
//! packing, and the row-/group-wise loop (plain reference and rayon paths) the recipes run in.
//! The recipes themselves (scale and code arithmetic as each tool does it) live in each
//! format's folder.

pub mod fp4;
pub mod fp8;
pub mod int4;
pub mod pack;
pub mod rne;
pub mod rowwise;
