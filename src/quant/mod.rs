//! Quantization: the scheme table (`registry`: the typed `Scheme` and each carrier's codec
//! constructor), per-module codecs (`codec`: reference math + fast paths per format), the
//! per-checkpoint format facts (`format`, which also says which format a checkpoint is in), the
//! statistics a scheme measures first (`stats`), GPTQ with scales fixed by a format's recipe
//! (`gptq`), packing, exclusion rules, and reading quantized tensors back (`stored`, the
//! layouts each format's reader finds; `decode`, `identify`). Each format keeps its own recipe;
//! they are never unified: what they share is only the row-/group-wise loop and the layout
//! helpers (`rowwise`, `pack`). Each stored layout is read back (`stored::Layout`) beside the
//! encoder that writes it. The quantize pipeline that drives a codec over a checkpoint is
//! `crate::quantize`.

pub mod codec;
pub mod compressed_tensors;
pub mod decode;
pub mod exclude;
pub mod format;
pub mod fused;
pub mod gptq;
pub mod identify;
pub mod input_amax;
pub mod math;
pub mod modelopt;
pub mod order_check;
pub mod preset;
pub mod quark;
pub mod registry;
pub mod search;
pub mod stats;
pub mod stored;
