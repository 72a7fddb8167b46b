//! CPU forward passes for drafts (and, later, the Kimi-K2 target), each built on the plain
//! reference ops in `ops` and their tested fast paths.

pub mod eagle3;
pub mod ops;
