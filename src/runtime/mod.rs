//! CPU forward passes for drafts and the Kimi-K2 target, each built on the plain reference ops
//! in `crate::ops` and their tested fast paths, and the `Drafter` trait the verify replay runs them
//! through.

pub mod d2t;
pub mod deepseek;
pub mod dflash;
pub mod eagle3;
pub mod embed;
pub mod hessian;
pub mod kimi_k3;
pub mod kimi_linear;
pub mod linears;
pub mod lm;
pub mod matches;
pub mod on_device;
pub mod packed;
pub mod rope;
pub mod target;
pub mod weights;

use matches::Matches;

/// Bound on a runtime's fast path against its plain reference path: max |fast − ref| over
/// max |ref| (the DFlash block logits and context keys/values) or over max(1, max |ref|) (the
/// DeepSeek-V3 target's logits and hidden states). The fast paths only reorder f32 sums
/// (batched, vectorised matmuls, rayon over heads and experts); measured ≈ 1e-6 on the tiny
/// fixtures.
pub const FAST_REL_TOL: f32 = 1e-4;

/// A draft the replay can run: teacher-forced depth matches for one sequence (pass A of
/// docs/verify.md, "What it computes") from the target's tapped hidden states.
pub trait Drafter: Send + Sync {
    /// HF `hidden_states[i]` indices read, in the order the draft concatenates them.
    fn taps(&self) -> &[usize];
    /// Width of one tap (the target's hidden size).
    fn target_hidden(&self) -> usize;
    /// Target vocabulary the proposals are ids of.
    fn vocab(&self) -> usize;
    /// The `steps` a replay uses when none is asked for: an EAGLE-3 chain's 3 (the Kimi-K2.5
    /// setting, sgl-project/sglang#19689); a block drafter's block size − 1.
    fn default_steps(&self) -> usize {
        3
    }
    /// The most `steps` this draft can propose (a block drafter: its block size − 1).
    fn max_steps(&self) -> Option<usize> {
        None
    }
    /// The target's layer count as the draft's config records it (a DFlash drafter's
    /// `num_target_layers`), for a synthetic trace's manifest.
    fn target_layers(&self) -> Option<usize> {
        None
    }
    /// Depth matches over one sequence: `x` the T tokens, `taps[j]` the `[T, target_hidden]`
    /// rows of tap `taps()[j]`, `prompt_len` P.
    fn matches(&self, x: &[u32], taps: &[Vec<f32>], prompt_len: usize, steps: usize) -> Matches;
    /// [`Drafter::matches`] computing a root's depth k only where its depths < k all matched:
    /// the leading-match counts exactly, the bits after a root's first miss 0. `None` where that
    /// saves nothing (a block drafter computes every depth of a block at once).
    fn matches_accepted(
        &self,
        _x: &[u32],
        _taps: &[Vec<f32>],
        _prompt_len: usize,
        _steps: usize,
    ) -> Option<Matches> {
        None
    }
    /// The draft's own proposals after the last token of `x` (the root), as the engine's draft
    /// step makes them: `depths(steps)` target ids. `taps[j]` holds at least the rows of
    /// positions `0..x.len() - 1` (rows from `x.len() - 1` on are ignored).
    fn propose(&self, x: &[u32], taps: &[Vec<f32>], steps: usize) -> Vec<u32>;
    /// The draft's linears: where they run, the input observer, the first device failure.
    fn linears(&self) -> &linears::LinearSet;
    /// On a device: `Ok` when the whole step stays there (only token ids cross), `Err(why)`
    /// when only the linears do; `None` on the CPU.
    fn device_step(&self) -> Option<Result<(), String>> {
        None
    }
}
