//! A direct simulation of the engine's greedy speculative loop with the Rust target
//! (docs/verify.md: "What it computes" for EAGLE-3 chains, "DFlash replay" for DFlash blocks): the draft
//! proposes from the committed prefix and the target's tapped features, the target verifies the
//! proposals in one forward, the leading matches and the target's bonus token are committed.
//! It is the independent check that the offline replay (pass A + `walk`) reports the accept
//! length the engine would see: same tokens, same rounds, same committed count.

use half::bf16;

use crate::error::Result;
use crate::ops::argmax;
use crate::runtime::target::Target;
use crate::runtime::Drafter;

/// What one simulated generation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Simulated {
    /// Prompt + generated tokens.
    pub tokens: Vec<u32>,
    /// Verify rounds (target forwards after the prefill).
    pub rounds: u64,
    /// Tokens committed by those rounds, bonus included.
    pub committed: u64,
    /// Accepted draft tokens per round (the last cut at `gen_len`).
    pub accepted: Vec<usize>,
    /// Drafts the final round accepted beyond its cut at `gen_len`: what vLLM counts as
    /// accepted there too (it counts a step before trimming it).
    pub overshoot: usize,
}

/// The target's greedy token after each position, and the draft's taps rounded to bf16 (what a
/// `kquant-trace/1` stores, so the draft sees what the replay feeds it).
fn verify_pass(target: &Target, seq: &[u32], taps: &[usize]) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
    let f = target.forward(seq)?;
    let v = target.vocab();
    let top1 = f.logits.chunks(v).map(|row| argmax(row) as u32).collect();
    let rows = taps
        .iter()
        .map(|&i| {
            f.hidden_states[i]
                .iter()
                .map(|&x| bf16::from_f32(x).to_f32())
                .collect()
        })
        .collect();
    Ok((top1, rows))
}

/// Generate `gen_len` tokens after `prompt` the way the engine does with `draft` proposing
/// `steps` tokens per round (stopping at `gen_len` like `max_new_tokens`: tokens
/// a round would add beyond it are dropped).
pub fn simulate(
    target: &Target,
    draft: &dyn Drafter,
    prompt: &[u32],
    gen_len: usize,
    steps: usize,
) -> Result<Simulated> {
    let p = prompt.len();
    let (top1, mut taps) = verify_pass(target, prompt, draft.taps())?;
    let mut seq = prompt.to_vec();
    seq.push(top1[p - 1]);
    let (mut rounds, mut committed, mut accepted) = (0u64, 0u64, Vec::new());
    let mut overshoot = 0;
    while seq.len() - p < gen_len {
        let root = seq.len() - 1;
        let d = draft.propose(&seq, &taps, steps);
        let mut cand = seq.clone();
        cand.extend_from_slice(&d);
        let (top1, cand_taps) = verify_pass(target, &cand, draft.taps())?;
        let mut n = 0;
        while n < d.len() && d[n] == top1[root + n] {
            n += 1;
        }
        let full = n;
        n = n.min(gen_len - (seq.len() - p) - 1);
        overshoot = full - n;
        seq.extend_from_slice(&d[..n]);
        seq.push(top1[root + n]);
        rounds += 1;
        committed += n as u64 + 1;
        accepted.push(n);
        // Rows of the committed positions (all but the new root) come from this verify pass:
        // its tokens agree with `seq` up to there and the target is causal.
        let keep = seq.len() - 1;
        taps = cand_taps
            .into_iter()
            .map(|r| r[..keep * target.hidden()].to_vec())
            .collect();
    }
    Ok(Simulated {
        tokens: seq,
        rounds,
        committed,
        accepted,
        overshoot,
    })
}
