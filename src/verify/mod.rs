//! `verify`: accept length of a draft against a target, from a trace (`crate::trace`) or a
//! target kquant can run, or live from a serving engine, with the regression gate.
//!
//! The gate over a replay (`crate::replay`: a draft loaded for its family and replayed over a
//! trace, and `walk`, leading matches to accept lengths as the engines count them, re-exported
//! here): `offline` (an offline verify: request → plan → run), `ngram` (the prompt-lookup
//! baseline), `sim` (the engine's greedy loop on a target kquant runs), `agreement` (two
//! drafters' proposals position by position), `gate` (the paired ΔAL and its decision),
//! `report` (table, JSON, JUnit), `published` (the accept lengths the model cards quote, from
//! the target profiles of `crate::target`), `stream` (the trace's tap stream against the drafts'
//! training streams).
//!
//! Live measurement: `live` (a serving engine's own per-request counts).

pub mod agreement;
pub mod degenerate;
pub mod gate;
pub mod join;
pub mod live;
pub mod ngram;
pub mod offline;
pub mod prompt_sets;
pub mod published;
pub mod report;
pub mod sim;
pub mod stream;
pub mod synthetic;
pub use crate::replay::walk;
