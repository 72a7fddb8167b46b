//! `verify`: accept length of a draft against a target, from a trace (or a target kquant can
//! run), with the regression gate. `trace` is the capture format, `walk` turns per-root
//! leading matches into accept lengths the way the engines count them, `gate` decides.
//! `import_vllm` turns vLLM hidden-states connector files into a trace; `profile` holds what
//! kquant knows about each target (shape, default taps, published accept lengths).

pub mod gate;
pub mod import_vllm;
pub mod ngram;
pub mod profile;
pub mod report;
pub mod trace;
pub mod walk;
