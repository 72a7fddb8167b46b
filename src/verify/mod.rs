//! `verify`: accept length of a draft against a target, from a trace (or a target kquant can
//! run), with the regression gate. `trace` is the capture format, `capture` writes one with the
//! CPU target runtime, `walk` turns per-root leading matches into accept lengths the way the
//! engines count them, `gate` decides.

pub mod capture;
pub mod gate;
pub mod ngram;
pub mod report;
pub mod trace;
pub mod walk;
