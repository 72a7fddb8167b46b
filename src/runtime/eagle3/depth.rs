//! What one depth of an EAGLE-3 forward gives ([`DepthOut`]: logits, hidden states, proposals
//! with their runner-up and margin), which token each depth is fed (`Feed`), and the rows a
//! depth did not compute ([`NOT_COMPUTED`]); shared by the f32 forward and the step on a device.

/// One depth of a forward over rows (pairs) `start..T-1`.
#[derive(Debug, Clone)]
pub struct DepthOut {
    /// Draft-vocabulary logits `[rows, draft_vocab]` (before d2t); empty where only the
    /// proposals were asked for (pass A, the chain). With `Feed::Accepted` the logits and the
    /// hidden states cover the computed rows only, in order.
    pub logits: Vec<f32>,
    /// The pre-norm layer output g^k `[rows, H]`.
    pub hidden: Vec<f32>,
    /// The proposal per row: the logits' argmax mapped to a target id (d2t); [`NOT_COMPUTED`]
    /// for a row the depth skipped.
    pub pred: Vec<u32>,
    /// Per row, the runner-up (a target id, [`NOT_COMPUTED`] where unknown) and its gap to the
    /// proposal's logit (NaN where unknown): `Matches::runner_up` / `margin`.
    pub second: Vec<u32>,
    pub margin: Vec<f32>,
}

/// Which token depth k ≥ 1 of row t is fed.
#[derive(Clone, Copy)]
pub(super) enum Feed {
    /// The ground truth x[t+1+k] (0 past the end of x): the teacher-forced replay.
    Truth,
    /// The draft's own depth k−1 proposal: the engine's chain.
    Own,
    /// The ground truth, to the rows whose depths < k all matched only (a row stops at its
    /// first miss): what the walk's accept length needs, not the unconditional rates.
    Accepted,
}

/// With `Feed::Accepted`: the positions in `live` of the rows that go on to the next depth —
/// those whose proposal at the depth before (`prev`, by row) is the token the next depth is fed
/// (`truth`, by row).
pub(super) fn still_accepted(
    live: &[usize],
    prev: &[u32],
    truth: impl Fn(usize) -> u32,
) -> Vec<usize> {
    (0..live.len())
        .filter(|&s| prev[live[s]] == truth(live[s]))
        .collect()
}

/// The proposal of a row a depth did not compute (`Feed::Accepted`): no
/// token id, so it matches nothing.
pub const NOT_COMPUTED: u32 = u32::MAX;

/// A depth's outputs before any row is computed.
pub(super) fn not_computed(n: usize) -> DepthOut {
    DepthOut {
        logits: vec![],
        hidden: vec![],
        pred: vec![NOT_COMPUTED; n],
        second: vec![NOT_COMPUTED; n],
        margin: vec![f32::NAN; n],
    }
}
