//! `verify`: accept length of a draft against a target, from a trace (or a target kquant can
//! run), with the regression gate. `trace` is the capture format, `capture` writes one with the
//! CPU target runtime, `import_vllm` turns vLLM hidden-states connector files into one, `prompts` tokenizes text
//! prompts for both with the target's tokenizer, `prompt_sets` reads the prompt sets users already
//! have (MT-Bench, Spec-Bench, SPEED-Bench, GSM8K, MATH-500, HumanEval, plain text or token ids)
//! for a live verify against a serving engine, `walk`
//! turns per-root leading matches into accept lengths the way the engines count them,
//! `agreement` compares two drafters' proposals position by position, `gate` decides; `profile` holds what kquant knows about each target (shape, default taps,
//! published accept lengths).

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
