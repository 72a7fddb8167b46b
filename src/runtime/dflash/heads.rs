//! What turns a block drafter's final-normed predicting rows into proposals, greedy, as vLLM
//! 0.32/0.33 drafts:
//!
//! - DFlash: each row's argmax through the target's lm_head.
//! - DSpark (`vllm/v1/worker/gpu/spec_decode/dspark/speculator.py`, `_sample_sequential`): the
//!   base logits `logit_scale · lm_head(h_i)` plus, left to right, the Markov bias
//!   `logit_scale · markov_w2 @ markov_w1[prev]` of the previous token (the anchor for the first
//!   row, then the previous draft), argmax, mapped through `d2t` when the draft has a reduced
//!   vocabulary; with `dspark_draft_topk` k (`_sample_sequential_topk`) only the k best base
//!   logits of a row take the bias, every other entry is −∞. The confidence head
//!   `sigmoid(proj([h_i ; markov_w1[prev_i]]))` (fp32) is the per-row acceptance estimate.
//! - DFlash2 (`spec_decode/dflash2/speculator.py`, `qwen3_dflash2.py` `CandidateSelector`): the
//!   top-K of the target lm_head per row (soft cap, then `output_multiplier`, on the K values),
//!   edge scores `S[l, p, c] = unary[l, c] + ⟨A[pred(l, p)] ⊙ Hproj(h_l), B[cand(l, c)]⟩` with
//!   the anchor as every predecessor of row 0 and row l−1's candidates after, walked from
//!   `prev = 0` taking `argmax_c S[l, prev, c]` (`_selector_walk_kernel`, a Triton kernel:
//!   reproduced here from its source, greedy).

use super::super::linears::Linear;
use crate::ops::{top2, Top2};

/// How a block's rows become proposals.
pub enum Head {
    /// DFlash: each row's argmax.
    Argmax,
    Markov(Markov),
    Selector(Selector),
}

/// DSpark's Markov head (vLLM implements the `vanilla` kind only).
pub struct Markov {
    pub rank: usize,
    /// `markov_w1` `[vocab, rank]`, indexed by target token id.
    pub(super) w1: Vec<f32>,
    /// `markov_w2` `[draft_vocab, rank]`.
    pub(super) w2: Linear,
    /// `logit_scale` (vLLM's `LogitsProcessor` scale on the base logits and the bias alike).
    pub scale: f32,
    /// `dspark_draft_topk`.
    pub topk: Option<usize>,
    pub confidence: Option<Confidence>,
    /// The draft's own lm_head (reduced vocabulary) and `d2t`, when it ships them.
    pub(super) own_head: Option<Linear>,
    pub(super) d2t: Option<Vec<i64>>,
}

/// DSpark's confidence head: `proj` `[1, h (+ rank)]` and its bias, in fp32.
pub struct Confidence {
    pub with_markov: bool,
    pub(super) w: Vec<f32>,
    pub(super) b: f32,
}

/// DFlash2's candidate selector.
pub struct Selector {
    pub rank: usize,
    pub top_k: usize,
    /// `predecessor_codebook`, `successor_codebook` `[vocab, rank]`.
    pub(super) pred: Vec<f32>,
    pub(super) succ: Vec<f32>,
    /// `hidden_projection` `[rank, h]`.
    pub(super) hproj: Linear,
    /// `output_multiplier`, `final_logit_softcapping`.
    pub scale: f32,
    pub softcap: Option<f32>,
}

impl Head {
    pub fn name(&self) -> &'static str {
        match self {
            Head::Argmax => "argmax",
            Head::Markov(_) => "markov",
            Head::Selector(_) => "selector",
        }
    }

    /// The proposals of each root, with their runner-ups: `hid` holds `n` final-normed
    /// predicting rows per root (`[anchors.len() · n, h]`), `anchors` the roots' tokens.
    pub(super) fn propose(
        &self,
        lm_head: &Linear,
        hid: &[f32],
        anchors: &[u32],
        n: usize,
    ) -> Vec<Vec<Top2>> {
        let rows = anchors.len() * n;
        match self {
            Head::Argmax => lm_head
                .top2_rows(hid, rows)
                .chunks(n)
                .map(<[Top2]>::to_vec)
                .collect(),
            Head::Markov(m) => m.propose(lm_head, hid, anchors, n),
            Head::Selector(s) => s.propose(lm_head, hid, anchors, n),
        }
    }
}

impl Markov {
    fn embed(&self, tok: u32) -> &[f32] {
        let r = self.rank;
        &self.w1[tok as usize * r..(tok as usize + 1) * r]
    }

    fn to_target(&self, d: usize) -> u32 {
        match &self.d2t {
            Some(m) => (d as i64 + m[d]) as u32,
            None => d as u32,
        }
    }

    fn propose(&self, lm_head: &Linear, hid: &[f32], anchors: &[u32], n: usize) -> Vec<Vec<Top2>> {
        let head = self.own_head.as_ref().unwrap_or(lm_head);
        let rows = anchors.len() * n;
        let base = head.apply(hid, rows);
        let v = base.len() / rows.max(1);
        let keep: Option<Vec<Vec<usize>>> = self.topk.map(|k| {
            base.chunks(v.max(1))
                .map(|row| top_k(row, k).into_iter().map(|(i, _)| i).collect())
                .collect()
        });
        let mut out = vec![Vec::with_capacity(n); anchors.len()];
        let mut prev: Vec<u32> = anchors.to_vec();
        for i in 0..n {
            let e: Vec<f32> = prev.iter().flat_map(|&t| self.embed(t).to_vec()).collect();
            let bias = self.w2.apply(&e, prev.len());
            for (j, o) in out.iter_mut().enumerate() {
                let row = j * n + i;
                let z: Vec<f32> = base[row * v..(row + 1) * v]
                    .iter()
                    .zip(&bias[j * v..(j + 1) * v])
                    .map(|(a, b)| self.scale * (a + b))
                    .collect();
                let t = match &keep {
                    None => top2(&z),
                    Some(keep) => {
                        let mut masked = vec![f32::NEG_INFINITY; v];
                        for &c in &keep[row] {
                            masked[c] = z[c];
                        }
                        let mut t = top2(&masked);
                        if keep[row].len() < 2 {
                            t.second = usize::MAX;
                            t.margin = f32::NAN;
                        }
                        t
                    }
                };
                let best = self.to_target(t.best);
                prev[j] = best;
                o.push(Top2 {
                    best: best as usize,
                    second: if t.second == usize::MAX {
                        usize::MAX
                    } else {
                        self.to_target(t.second) as usize
                    },
                    margin: t.margin,
                });
            }
        }
        out
    }

    /// The confidence head over each root's rows given the tokens proposed
    /// (`prev_0` = the anchor, `prev_i` = draft i−1): `[roots][n]`, `None` without a head.
    pub fn confidences(
        &self,
        hid: &[f32],
        h: usize,
        anchors: &[u32],
        drafts: &[Vec<u32>],
    ) -> Option<Vec<Vec<f32>>> {
        let c = self.confidence.as_ref()?;
        let n = drafts.first().map_or(0, Vec::len);
        Some(
            anchors
                .iter()
                .zip(drafts)
                .enumerate()
                .map(|(j, (&a, d))| {
                    (0..n)
                        .map(|i| {
                            let prev = if i == 0 { a } else { d[i - 1] };
                            let x = &hid[(j * n + i) * h..(j * n + i + 1) * h];
                            let mut acc: f32 = x.iter().zip(&c.w).map(|(a, b)| a * b).sum();
                            if c.with_markov {
                                acc += self
                                    .embed(prev)
                                    .iter()
                                    .zip(&c.w[h..])
                                    .map(|(a, b)| a * b)
                                    .sum::<f32>();
                            }
                            1.0 / (1.0 + (-(acc + c.b)).exp())
                        })
                        .collect()
                })
                .collect(),
        )
    }
}

/// The `k` largest entries of `x`, largest first (the lower index first among equals).
fn top_k(x: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut best: Vec<(usize, f32)> = Vec::with_capacity(k + 1);
    for (i, &v) in x.iter().enumerate() {
        // Full, and not above the last kept (a NaN is never kept).
        let below = |&(_, w): &(usize, f32)| v.partial_cmp(&w) != Some(std::cmp::Ordering::Greater);
        if best.len() == k && best.last().is_some_and(below) {
            continue;
        }
        let at = best.iter().position(|&(_, w)| v > w).unwrap_or(best.len());
        best.insert(at, (i, v));
        best.truncate(k);
    }
    best
}

impl Selector {
    fn code<'a>(&self, book: &'a [f32], tok: usize) -> &'a [f32] {
        &book[tok * self.rank..(tok + 1) * self.rank]
    }

    fn propose(&self, lm_head: &Linear, hid: &[f32], anchors: &[u32], n: usize) -> Vec<Vec<Top2>> {
        let rows = anchors.len() * n;
        let logits = lm_head.apply(hid, rows);
        let v = logits.len() / rows.max(1);
        let hp = self.hproj.apply(hid, rows);
        let r = self.rank;
        let cands: Vec<Vec<(usize, f32)>> = logits
            .chunks(v.max(1))
            .map(|row| {
                top_k(row, self.top_k)
                    .into_iter()
                    .map(|(i, z)| {
                        let z = match self.softcap {
                            Some(cap) => (z / cap).tanh() * cap,
                            None => z,
                        };
                        (i, z * self.scale)
                    })
                    .collect()
            })
            .collect();
        anchors
            .iter()
            .enumerate()
            .map(|(j, &anchor)| {
                let mut prev = 0usize;
                (0..n)
                    .map(|l| {
                        let row = j * n + l;
                        let pred = if l == 0 {
                            anchor as usize
                        } else {
                            cands[row - 1].get(prev).map_or(0, |c| c.0)
                        };
                        let a = self.code(&self.pred, pred);
                        let hpl = &hp[row * r..(row + 1) * r];
                        let s: Vec<f32> = cands[row]
                            .iter()
                            .map(|&(c, u)| {
                                let b = self.code(&self.succ, c);
                                u + (0..r).map(|q| a[q] * hpl[q] * b[q]).sum::<f32>()
                            })
                            .collect();
                        let t = top2(&s);
                        prev = t.best;
                        Top2 {
                            best: cands[row][t.best].0,
                            second: cands[row].get(t.second).map_or(usize::MAX, |c| c.0),
                            margin: t.margin,
                        }
                    })
                    .collect()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_is_sorted_and_takes_the_lower_index_among_equals() {
        let x = [1.0, 5.0, 3.0, 5.0, -1.0, 4.0];
        assert_eq!(top_k(&x, 3), vec![(1, 5.0), (3, 5.0), (5, 4.0)]);
        assert_eq!(top_k(&x, 1), vec![(1, 5.0)]);
        assert_eq!(top_k(&x, 10).len(), 6);
    }
}
