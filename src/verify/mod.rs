//! `verify`: accept length of a draft against a target, from a trace (or a target kquant can
//! run) or live from a serving engine, with the regression gate.
//!
//! The trace and its producers: `trace` (the `kquant-trace/1` format), `capture` (written by
//! the CPU target runtime), `import_vllm` (from vLLM hidden-states connector files), `merge`
//! (traces of one capture joined), `synthetic` (real-shape traces for benchmarks), `prompts`
//! (text prompts tokenized with the target's tokenizer and chat template), `prompt_sets` (the
//! sets users already have: MT-Bench, Spec-Bench, SPEED-Bench, GSM8K, MATH-500, HumanEval,
//! plain text or token ids).
//!
//! The replay and the gate: `drafters` (a draft loaded for its family and replayed over a
//! trace), `walk` (leading matches to accept lengths, as the engines count them, and what
//! near-ties can do), `ngram` (the prompt-lookup baseline), `sim` (the engine's greedy loop on
//! a target kquant runs), `agreement` (two drafters' proposals position by position), `gate`
//! (the paired ΔAL and its decision), `report` (table, JSON, JUnit), `profile` (what kquant
//! knows of each target), `published` (the accept lengths the model cards quote).
//!
//! Live measurement: `live` (a serving engine's own per-request counts).

pub mod agreement;
pub mod capture;
pub mod drafters;
pub mod gate;
pub mod import_vllm;
pub mod live;
pub mod merge;
pub mod ngram;
pub mod profile;
pub mod prompt_sets;
pub mod prompts;
pub mod published;
pub mod report;
pub mod sim;
pub mod synthetic;
pub mod trace;
pub mod walk;
