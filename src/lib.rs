//! kquant: quantize, convert and verify speculative-decoding draft models for Kimi targets.
//!
//! The library is the whole product; `src/main.rs` only parses arguments, runs a command and
//! renders errors. See `docs/architecture.md` for the data path and the module map.

pub mod bench;
pub mod checkpoint;
pub mod cli;
pub mod convert;
pub mod engines;
pub mod error;
pub mod escape;
pub mod gpu;
pub mod io;
mod layering;
pub mod ops;
pub mod progress;
pub mod quant;
pub mod quantize;
pub mod replay;
pub mod runtime;
pub mod synth;
pub mod target;
#[cfg(test)]
mod test_rng;
pub mod tokenizer;
pub mod trace;
pub mod verify;

pub use error::{Error, Result};

/// Every allocation goes to the system allocator; a thread's open `io::budget` is charged.
#[global_allocator]
static ALLOC: io::budget::Counting = io::budget::Counting;
