//! `trace`: the `kquant-trace/1` file a replay reads, and everything that makes one.
//!
//! `file` (the format: header, manifest, samples, their checks and the writer), `capture`
//! (written by the CPU target runtime), `import` (from vLLM hidden-states connector files),
//! `merge` (traces of one capture joined), `synthetic` (real-shape traces for benchmarks),
//! `stream` (which hidden-state stream the taps hold: `tap_stream`),
//! `prompts` (text prompts tokenized with the target's tokenizer and chat template, which
//! `crate::tokenizer` loads). The prompt sets a live verify sends are `crate::verify`'s
//! (`verify::prompt_sets`).
//!
//! It knows nothing of drafts or gates: `crate::replay` replays what it holds, `crate::verify`
//! gates it; what it checks against a target comes from `crate::target`.

pub mod capture;
pub mod file;
pub mod import;
pub mod merge;
pub mod prompts;
pub mod stream;
pub mod synthetic;
