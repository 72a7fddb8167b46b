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
#[derive(Debug, Clone, PartialEq, Default)]
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
    /// Per proposal (laid out as `proposals`), the gap between the draft's best logit and its
    /// runner-up's: how near a tie the choice was (NaN where not known, e.g. an argmax reduced
    /// on a device); empty where the producer did not keep them.
    pub margin: Vec<f32>,
    /// Per pair, bit `k` set when the depth-`k` runner-up equals `x[t+2+k]`: the proposal
    /// would have matched had the near-tie gone the other way. Empty where not kept.
    pub alt: Vec<u32>,
}

/// Which way [`Matches::flipped`] turns the near-ties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flip {
    /// Every matched proposal within the margin misses (its runner-up is another token).
    Down,
    /// Every missed proposal within the margin whose runner-up is the true token matches.
    Up,
}

impl Matches {
    /// No proposal yet: `total_len − 1` pairs of `depths` depths, nothing matched or known.
    pub fn empty(depths: usize, prompt_len: usize, total_len: usize) -> Matches {
        let pairs = total_len.saturating_sub(1);
        Matches {
            depths,
            prompt_len,
            total_len,
            c: vec![0; pairs],
            proposals: vec![NOT_PROPOSED; pairs * depths],
            margin: vec![f32::NAN; pairs * depths],
            alt: vec![0; pairs],
        }
    }

    /// Record the depth-`k` proposal of pair `t` against the sequence `x` (its true token is
    /// `x[t+2+k]`): the proposal and its match bit, and where the runner-up is known (`(id,
    /// margin)`) the margin and whether the runner-up is the true token.
    pub fn record(
        &mut self,
        x: &[u32],
        t: usize,
        k: usize,
        proposal: u32,
        runner_up: Option<(u32, f32)>,
    ) {
        let truth = x.get(t + 2 + k);
        self.proposals[t * self.depths + k] = proposal;
        if truth == Some(&proposal) {
            self.c[t] |= 1 << k;
        }
        if let Some((second, margin)) = runner_up {
            self.margin[t * self.depths + k] = margin;
            if truth == Some(&second) {
                self.alt[t] |= 1 << k;
            }
        }
    }

    /// The depth-`k` proposal of pair `t`, if it was computed and kept.
    pub fn proposal(&self, t: usize, k: usize) -> Option<u32> {
        self.proposals
            .get(t * self.depths + k)
            .copied()
            .filter(|&p| p != NOT_PROPOSED)
    }

    /// Whether the depth-`k` proposal of pair `t` was within `tie` of its runner-up.
    pub fn near_tie(&self, t: usize, k: usize, tie: f64) -> bool {
        self.margin
            .get(t * self.depths + k)
            .is_some_and(|&m| f64::from(m) < tie)
    }

    /// Whether the near-ties were kept ([`Matches::margin`] and [`Matches::alt`]) for every
    /// proposal computed (a device argmax gives no margin: NaN).
    pub fn has_ties(&self) -> bool {
        self.margin.len() == self.proposals.len()
            && self.alt.len() == self.c.len()
            && self
                .proposals
                .iter()
                .zip(&self.margin)
                .all(|(&p, m)| p == NOT_PROPOSED || !m.is_nan())
    }

    /// These matches with every near-tie (margin below `tie`) turned one way: the replay's
    /// extremes when an engine computing in a coarser dtype may pick either candidate.
    pub fn flipped(&self, tie: f64, flip: Flip) -> Matches {
        let mut m = self.clone();
        if !self.has_ties() {
            return m;
        }
        for (t, bits) in m.c.iter_mut().enumerate() {
            for k in 0..self.depths {
                if !self.near_tie(t, k, tie) {
                    continue;
                }
                match flip {
                    Flip::Down => *bits &= !(1 << k),
                    Flip::Up if self.alt[t] >> k & 1 == 1 => *bits |= 1 << k,
                    Flip::Up => {}
                }
            }
        }
        m
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
