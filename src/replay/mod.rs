//! The replay of a draft over a `kquant-trace/1` (docs/verify.md, "What it computes"): the
//! draft loaded with its family's runtime ([`load`]), pass A (its teacher-forced depth matches
//! at every root of every sample) and pass B ([`walk`]: the engine's schedule over them, as
//! accept lengths). `verify` gates on it; `quantize` (calibration, input abs-max) and `bench`
//! replay through it without the gate.

pub mod load;
pub mod walk;

pub use load::{load_drafter, placement_line};

use crate::error::{Error, Result};
use crate::runtime::matches::Matches;
use crate::runtime::Drafter;
use crate::trace::file::{SampleMeta, Trace};
use walk::{walk_to, Walk};

/// What pass A computes after a root's first miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AfterMiss {
    /// Every depth of every root, teacher-forced: every figure, the unconditional per-depth
    /// rates and the simulated accept length included.
    Run,
    /// Depth k of a root only where its depths < k all matched (EAGLE-3 chains; a block
    /// drafter computes a block at once): the walk's accept length, the all-positions mean and
    /// the conditional rates exactly, not the unconditional rates.
    Skip,
}

/// How a replay runs: the draft tokens per step, what pass A does after a miss, the samples
/// replayed (the first `limit`), and who hears of each sample's generated positions once it
/// is replayed.
pub struct Pass<'a> {
    pub steps: usize,
    pub after_miss: AfterMiss,
    pub limit: usize,
    pub progress: &'a dyn Fn(u64),
}

/// Pass A + pass B over every trace sample for one drafter; `progress` gets each sample's
/// generated positions once it is replayed.
pub fn replay(
    d: &dyn Drafter,
    trace: &Trace,
    steps: usize,
    after_miss: AfterMiss,
    progress: &dyn Fn(u64),
) -> Result<Vec<Walk>> {
    let pass = Pass {
        steps,
        after_miss,
        limit: usize::MAX,
        progress,
    };
    replay_each(d, trace, &pass, |w, _| w)
}

/// The draft tokens per step a replay of `d` uses: `asked`, or the draft's own default
/// ([`Drafter::default_steps`]); more than a block drafter proposes is refused.
pub fn steps_for(d: &dyn Drafter, asked: Option<usize>, spec: &str) -> Result<usize> {
    let steps = asked.unwrap_or_else(|| d.default_steps());
    match d.max_steps() {
        Some(max) if steps > max => Err(Error::Flags {
            msg: format!(
                "--steps {steps}: draft `{}` proposes at most {max} tokens a step (its block_size {} less the root)",
                crate::escape::printable(spec),
                max + 1
            ),
            hint: format!(
                "pass --steps 1..={max} (vLLM's num_speculative_tokens; SGLang's --speculative-num-draft-tokens − 1), or leave it out for {max}"
            ),
        }),
        _ => Ok(steps),
    }
}

/// Pass A of one sample: its depth matches, and whether the depths after a miss were skipped.
pub fn sample_matches(
    d: &dyn Drafter,
    x: &[u32],
    taps: &[Vec<f32>],
    prompt_len: usize,
    steps: usize,
    after_miss: AfterMiss,
) -> (Matches, bool) {
    if after_miss == AfterMiss::Skip {
        if let Some(m) = d.matches_accepted(x, taps, prompt_len, steps) {
            return (m, true);
        }
    }
    (d.matches(x, taps, prompt_len, steps), false)
}

/// [`replay`] over the first `limit` samples of the trace, keeping each sample's depth matches
/// (and proposals) beside its walk.
pub fn replay_matches(
    d: &dyn Drafter,
    trace: &Trace,
    steps: usize,
    after_miss: AfterMiss,
    limit: usize,
    progress: &dyn Fn(u64),
) -> Result<Vec<(Walk, Matches)>> {
    let pass = Pass {
        steps,
        after_miss,
        limit,
        progress,
    };
    replay_each(d, trace, &pass, |w, m| (w, m))
}

/// A sample's tokens and the taps the draft reads.
pub fn sample_inputs(
    d: &dyn Drafter,
    trace: &Trace,
    s: &SampleMeta,
) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
    let taps = d
        .taps()
        .iter()
        .map(|&t| trace.tap(s, t))
        .collect::<Result<_>>()?;
    Ok((trace.tokens(s)?, taps))
}

/// Refuse a trace the draft `spec` cannot replay: a tap it reads missing, another hidden size
/// or a token past its vocabulary.
pub fn check_fits(d: &dyn Drafter, trace: &Trace, spec: &str) -> Result<()> {
    trace.require(
        d.taps(),
        d.target_hidden(),
        Some(d.vocab()),
        &format!("draft `{spec}`"),
    )
}

/// Pass A + pass B over the samples `pass` names, what `keep` makes of each sample's walk and
/// depth matches kept (one sample's matches at a time otherwise).
pub fn replay_each<T>(
    d: &dyn Drafter,
    trace: &Trace,
    pass: &Pass,
    mut keep: impl FnMut(Walk, Matches) -> T,
) -> Result<Vec<T>> {
    let mut samples = Vec::new();
    for s in trace.manifest.samples.iter().take(pass.limit) {
        let (x, taps) = sample_inputs(d, trace, s)?;
        let (m, skipped) = sample_matches(d, &x, &taps, s.prompt_len, pass.steps, pass.after_miss);
        let mut w = walk_to(&m, s.stop());
        w.after_miss_skipped = skipped;
        samples.push(keep(w, m));
        if let Some(e) = d.linears().take_error() {
            return Err(e);
        }
        (pass.progress)(s.gen_len as u64);
    }
    Ok(samples)
}
