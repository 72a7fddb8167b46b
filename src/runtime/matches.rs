//! What a draft replay produces per sample: the depth-match bitmask of every root, which
//! `verify::walk` turns into accept lengths. It lives with the runtimes that fill it, below the
//! verify layer that reads it.

/// Most depths a `Matches` mask holds (one bit each in a `u32`).
pub const MAX_DEPTHS: usize = 32;

/// A proposal not computed (a prompt row, a depth skipped after a miss): no token id, so it
/// matches nothing.
pub const NOT_PROPOSED: u32 = u32::MAX;

/// Depth matches of one sample: for pair index `t` (root token `x[t+1]`), bit `k` of `c[t]` is
/// set when the draft's depth-`k` token equals `x[t+2+k]`. Only `t ≥ prompt_len − 1` is used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matches {
    pub depths: usize,
    pub prompt_len: usize,
    /// Sequence length T (prompt + generated).
    pub total_len: usize,
    /// One entry per pair index `0..total_len-1`.
    pub c: Vec<u32>,
    /// The proposals themselves, `[pair][depth]` flat (`(total_len − 1) · depths`, target ids,
    /// [`NOT_PROPOSED`] where not computed), for comparing two drafters position by position;
    /// empty where the producer did not keep them.
    pub proposals: Vec<u32>,
}

impl Matches {
    /// The depth-`k` proposal of pair `t`, if it was computed and kept.
    pub fn proposal(&self, t: usize, k: usize) -> Option<u32> {
        self.proposals
            .get(t * self.depths + k)
            .copied()
            .filter(|&p| p != NOT_PROPOSED)
    }

    /// Leading matches n(t), truncated to the tokens left after root `x[t+1]`.
    pub fn leading(&self, t: usize) -> usize {
        let mut n = 0;
        while n < self.depths && self.c[t] >> n & 1 == 1 {
            n += 1;
        }
        n.min(self.total_len.saturating_sub(t + 2))
    }
}
