//! Checkpoint bytes: safetensors reading (mmap, validation), index files, hub resolution,
//! the streaming writer and the manifest. No quantization math and no GPU here.

pub mod budget;
pub mod dtype;
pub mod hash;
pub mod header;
pub mod hub;
pub mod index;
pub mod interrupt;
pub mod manifest;
pub mod output;
pub mod process;
pub mod reads;
pub mod shard;
pub mod sink;
pub mod source;
pub mod stdio;
pub mod text;
pub mod writer;

pub use dtype::Dtype;
pub use header::TensorInfo;
pub use shard::{Shard, TensorView};
pub use source::Weights;
