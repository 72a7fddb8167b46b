//! Accept length from teacher-forced depth matches (docs/verify.md, "What it computes", pass B):
//! walk the engine's schedule over the per-root leading-match counts, and the secondary
//! statistics (all-positions mean, per-depth conditional and unconditional rates, simulated
//! accept length).

use serde::Serialize;

pub use crate::runtime::matches::{Flip, Matches, MAX_DEPTHS};

/// Accept-length statistics of one sample (or an aggregate).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Walk {
    /// Verify rounds.
    pub rounds: u64,
    /// Tokens committed by those rounds, bonus included (Σ (n+1)).
    pub committed: u64,
    /// Root positions in the generated region (for the all-positions mean).
    pub positions: u64,
    /// Σ n(t) over those positions.
    pub leading_sum: u64,
    /// Per depth k: positions where depths < k all matched, and where depth k matched too.
    pub cond_den: Vec<u64>,
    pub cond_num: Vec<u64>,
    /// Per depth k: positions where depth k matched (unconditional, teacher-forced).
    pub uncond: Vec<u64>,
    /// Per depth k: positions where depth k was compared (a token of the sample lies there,
    /// before the stop): what `uncond[k]` counts out of. Short samples leave the deeper depths
    /// fewer (none where a sample generates no more than k + 1 tokens).
    pub at_depth: Vec<u64>,
    /// The depths after a root's first miss were not computed (`--after-miss skip`): `uncond`
    /// undercounts, and neither the unconditional rates nor the simulated accept length are
    /// measured.
    pub after_miss_skipped: bool,
    /// Requests (samples) summed into this walk: SGLang's per-request convention counts one
    /// prefill-sampled token per request.
    pub requests: u64,
    /// Draft tokens the engine counts as accepted beyond the committed ones: vLLM counts a
    /// request's final step before cutting it at `max_tokens` or EOS
    /// (`vllm/v1/core/sched/scheduler.py`: `num_accepted = len(generated_token_ids) − 1`, then
    /// `check_stop` trims), so its figures hold drafts that were never committed.
    pub engine_extra: u64,
    /// Requests whose `engine_extra` is not known (a trace without tokens past the stop, so the
    /// final step's untrimmed acceptance cannot be replayed): the engine's figure is then not
    /// modelled.
    pub engine_unknown: u64,
    /// Per count j: verify rounds that accepted exactly j drafts as the engine counts them
    /// (vLLM's `acceptance_histogram`: a request's final step before its cut at the stop, as
    /// `engine_extra` models it): what the per-position rates a synthetic-acceptance benchmark
    /// takes are counted from (`verify::synthetic`). A final step the sample ends within
    /// counts the matches the sample shows (`censored_hist`).
    pub accepted_hist: Vec<u64>,
    /// Per count j: the rounds of `accepted_hist[j]` whose next draft the sample has no token
    /// to judge (a final step without the tokens past the stop): they accepted at least j.
    pub censored_hist: Vec<u64>,
}

impl Walk {
    /// vLLM / SGLang-server convention: `(committed − 1) / rounds` of the engine, i.e. tokens
    /// per verify step counting the bonus token.
    pub fn al_walk(&self) -> f64 {
        if self.rounds == 0 {
            return 1.0;
        }
        self.committed as f64 / self.rounds as f64
    }
    /// SGLang's per-request `meta_info` convention, `completion_tokens / spec_verify_ct`, which
    /// counts each request's prefill-sampled token: `(committed + requests) / rounds` (over a
    /// set, Σ completion tokens / Σ verify steps).
    pub fn al_sglang_request(&self) -> f64 {
        if self.rounds == 0 {
            return 1.0;
        }
        (self.committed + self.requests.max(1)) as f64 / self.rounds as f64
    }
    /// The engine's own count, where it differs from the committed tokens (vLLM: the final
    /// step's drafts before the cut at `max_tokens` / EOS): `(committed + engine_extra) /
    /// rounds`; `None` where a request's final step could not be modelled.
    pub fn al_engine(&self) -> Option<f64> {
        if self.engine_unknown > 0 {
            return None;
        }
        if self.rounds == 0 {
            return Some(1.0);
        }
        Some((self.committed + self.engine_extra) as f64 / self.rounds as f64)
    }
    /// 1 + mean n(t) over every root position of the generated region.
    pub fn al_allpos(&self) -> f64 {
        if self.positions == 0 {
            return 1.0;
        }
        1.0 + self.leading_sum as f64 / self.positions as f64
    }
    /// P(depth k accepted | depths < k accepted); `None` where no position had depths < k all
    /// accepted (the rate is undefined there, not 0).
    pub fn conditional(&self) -> Vec<Option<f64>> {
        self.cond_num
            .iter()
            .zip(&self.cond_den)
            .map(|(&n, &d)| (d > 0).then(|| n as f64 / d as f64))
            .collect()
    }
    /// Unconditional teacher-forced rate of depth k: out of the positions where depth k was
    /// compared (`at_depth`; the last k root positions of a sample have no token there), 0
    /// where none was.
    pub fn unconditional(&self) -> Vec<f64> {
        self.uncond
            .iter()
            .enumerate()
            .map(|(d, &u)| {
                let of = self.at_depth.get(d).copied().unwrap_or(self.positions);
                if of == 0 {
                    0.0
                } else {
                    u as f64 / of as f64
                }
            })
            .collect()
    }
    /// SpecForge/TorchSpec "simulated acc len" + 1: 1 + Σ_k Π_{i≤k} acc_i.
    pub fn simulated(&self) -> f64 {
        let mut p = 1.0;
        let mut s = 1.0;
        for a in self.unconditional() {
            p *= a;
            s += p;
        }
        s
    }
    /// The walks summed (their micro-average's counts).
    pub fn sum<'a>(walks: impl IntoIterator<Item = &'a Walk>) -> Walk {
        let mut t = Walk::default();
        for w in walks {
            t.add(w);
        }
        t
    }
    pub fn add(&mut self, o: &Walk) {
        self.after_miss_skipped |= o.after_miss_skipped;
        self.requests += o.requests;
        self.engine_extra += o.engine_extra;
        self.engine_unknown += o.engine_unknown;
        self.rounds += o.rounds;
        self.committed += o.committed;
        self.positions += o.positions;
        self.leading_sum += o.leading_sum;
        for (v, w) in [
            (&mut self.cond_den, &o.cond_den),
            (&mut self.cond_num, &o.cond_num),
            (&mut self.uncond, &o.uncond),
            (&mut self.at_depth, &o.at_depth),
            (&mut self.accepted_hist, &o.accepted_hist),
            (&mut self.censored_hist, &o.censored_hist),
        ] {
            if v.len() < w.len() {
                v.resize(w.len(), 0);
            }
            for (a, b) in v.iter_mut().zip(w) {
                *a += b;
            }
        }
    }
}

/// Pass B: walk the engine's schedule (root ← root + accepted + 1) and gather the statistics,
/// over the whole sample.
pub fn walk(m: &Matches) -> Walk {
    walk_to(m, m.total_len)
}

/// [`walk`] with the engine stopping the request after `stop` tokens (prompt included): the
/// tokens past it are lookahead, the target's greedy continuation beyond the stop, which is
/// what the engine's final verify step compared its drafts with before cutting them
/// ([`Walk::engine_extra`]). `stop` is clamped to the sample.
pub fn walk_to(m: &Matches, stop: usize) -> Walk {
    let k = m.depths;
    let mut w = Walk {
        cond_den: vec![0; k],
        cond_num: vec![0; k],
        uncond: vec![0; k],
        at_depth: vec![0; k],
        accepted_hist: vec![0; k + 1],
        censored_hist: vec![0; k + 1],
        requests: 1,
        ..Walk::default()
    };
    let (p, t_end) = (m.prompt_len, stop.min(m.total_len));
    if p == 0 || p >= t_end {
        return w;
    }
    for st in schedule(m, stop) {
        // Every step but the final one commits its leading matches (`n == full`); the engine
        // counts the final one's before its cut (`full`).
        let counted = st.full.min(k);
        if st.last {
            // The final step. Its untrimmed acceptance is known where the first miss (or the
            // last depth) was compared with a real token of the sample.
            let known = st.full >= k || st.t + 2 + st.full < m.total_len;
            if known {
                w.engine_extra += (st.full - st.n) as u64;
            } else {
                w.engine_unknown += 1;
                w.censored_hist[counted] += 1;
            }
        }
        w.rounds += 1;
        w.committed += (st.n + 1) as u64;
        w.accepted_hist[counted] += 1;
    }
    // Every root position of the generated region (up to the stop).
    for t in p - 1..t_end.saturating_sub(1) {
        let n = m.leading(t).min(t_end.saturating_sub(t + 2));
        w.positions += 1;
        w.leading_sum += n as u64;
        let avail = t_end.saturating_sub(t + 2);
        for d in 0..k.min(avail) {
            w.at_depth[d] += 1;
            if m.c[t] >> d & 1 == 1 {
                w.uncond[d] += 1;
            }
            if n >= d {
                w.cond_den[d] += 1;
                if n > d {
                    w.cond_num[d] += 1;
                }
            }
        }
    }
    w
}

/// One verify step of the engine's schedule: root pair `t`, its leading matches `full`, the
/// `n` of them committed (cut at the stop), and whether it is the request's last.
#[derive(Debug, Clone, Copy)]
struct Step {
    t: usize,
    full: usize,
    n: usize,
    last: bool,
}

/// The engine's schedule over `m` up to `stop`: each step commits its leading matches and the
/// bonus token, and the next root is the last committed token.
fn schedule(m: &Matches, stop: usize) -> impl Iterator<Item = Step> + '_ {
    let (p, t_end) = (m.prompt_len, stop.min(m.total_len));
    let mut t = p.saturating_sub(1);
    let mut committed = 1usize; // x_P, from prefill
    std::iter::from_fn(move || {
        if p == 0 || p + committed >= t_end {
            return None;
        }
        let full = m.leading(t);
        let n = full.min(t_end - (p + committed) - 1);
        let st = Step {
            t,
            full,
            n,
            last: p + committed + n + 1 >= t_end,
        };
        committed += n + 1;
        t += n + 1;
        Some(st)
    })
}

/// What the near-ties of one sample can do to its walk (docs/verify.md, "Near-ties"): an
/// engine that runs the draft in a coarser dtype than the replay may pick either candidate
/// of a proposal whose margin is below `tie`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Ties {
    /// Verify steps of the replay's walk decided by a near-tie: an accepted proposal within
    /// the margin, or the first miss within it with the true token as runner-up. An engine
    /// whose walk differs from the replay's first differs at such a step.
    pub steps: u64,
    /// The walk with every near-tie turned to a miss, and the one with every near-tie whose
    /// runner-up is the true token turned to a match: the replay's extremes.
    pub down: Walk,
    pub up: Walk,
}

/// [`Ties`] of one sample; `None` where its matches kept no margins (a device argmax).
pub fn near_ties(m: &Matches, stop: usize, tie: f64) -> Option<Ties> {
    if !m.has_ties() {
        return None;
    }
    let t_end = stop.min(m.total_len);
    let steps = schedule(m, stop)
        .filter(|st| {
            let accepted = (0..st.n).any(|d| m.near_tie(st.t, d, tie));
            let miss = st.n == st.full
                && st.n < m.depths
                && st.t + 2 + st.n < t_end
                && m.alt[st.t] >> st.n & 1 == 1
                && m.near_tie(st.t, st.n, tie);
            accepted || miss
        })
        .count() as u64;
    Some(Ties {
        steps,
        down: walk_to(&m.flipped(tie, Flip::Down), stop),
        up: walk_to(&m.flipped(tie, Flip::Up), stop),
    })
}

/// Depth matches of a drafter that proposes `proposals[t][k]` for root pair `t` (the token at
/// `x[t+2+k]`), against the sequence `x`.
pub fn matches_from_proposals(
    x: &[u32],
    prompt_len: usize,
    depths: usize,
    proposals: impl Fn(usize) -> Vec<u32>,
) -> Matches {
    let mut m = Matches::empty(depths, prompt_len, x.len());
    for t in prompt_len.saturating_sub(1)..m.c.len() {
        for (k, &d) in proposals(t).iter().take(depths).enumerate() {
            m.record(x, t, k, d, None);
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A direct simulation of the engine loop with a drafter that proposes `prop(t)`:
    /// accept leading matches, commit n + 1, move the root. The walk must agree with it.
    fn simulate(x: &[u32], p: usize, k: usize, prop: &dyn Fn(usize) -> Vec<u32>) -> (u64, u64) {
        let (mut root, mut rounds, mut committed) = (p, 0u64, 0u64);
        while root + 1 < x.len() {
            let d = prop(root - 1);
            let mut n = 0;
            while n < k && root + 1 + n < x.len() && d.get(n) == Some(&x[root + 1 + n]) {
                n += 1;
            }
            let n = n.min(x.len() - root - 2);
            rounds += 1;
            committed += n as u64 + 1;
            root += n + 1;
        }
        (rounds, committed)
    }

    /// A drafter of `k` depths right at some and wrong at others, depending on the position:
    /// its proposal for `t + j` misses (99) where `(t + j) % period == period - 1`.
    fn periodic(x: &[u32], k: usize, period: usize) -> impl Fn(usize) -> Vec<u32> + '_ {
        move |t| {
            (0..k)
                .map(|j| {
                    if (t + j) % period == period - 1 {
                        99
                    } else {
                        x.get(t + 2 + j).copied().unwrap_or(0)
                    }
                })
                .collect()
        }
    }

    #[test]
    fn walk_equals_direct_simulation() {
        let x: Vec<u32> = (0..200).map(|i| (i * 7 % 13) as u32).collect();
        for p in [1, 5, 17, 100] {
            for k in [1, 3, 5] {
                let prop = periodic(&x, k, 4);
                let w = walk(&matches_from_proposals(&x, p, k, &prop));
                let (rounds, committed) = simulate(&x, p, k, &prop);
                assert_eq!((w.rounds, w.committed), (rounds, committed), "p {p} k {k}");
            }
        }
    }

    /// The engine loop stopping after `stop` tokens, counting its final step as vLLM does:
    /// the drafts it accepted against the target's tokens past the stop (`x` runs on), then
    /// cut. Returns (rounds, committed, drafts counted beyond the committed).
    fn simulate_stop(
        x: &[u32],
        p: usize,
        k: usize,
        stop: usize,
        prop: &dyn Fn(usize) -> Vec<u32>,
    ) -> (u64, u64, u64) {
        let (mut root, mut rounds, mut committed, mut extra) = (p, 0u64, 0u64, 0u64);
        while root + 1 < stop {
            let d = prop(root - 1);
            let mut full = 0;
            while full < k && root + 1 + full < x.len() && d.get(full) == Some(&x[root + 1 + full])
            {
                full += 1;
            }
            let n = full.min(stop - root - 2);
            extra = (full - n) as u64;
            rounds += 1;
            committed += n as u64 + 1;
            root += n + 1;
        }
        (rounds, committed, extra)
    }

    #[test]
    fn a_stop_with_lookahead_counts_the_final_step_as_the_engine_does() {
        let x: Vec<u32> = (0..200).map(|i| (i * 7 % 13) as u32).collect();
        let mut cut_steps = 0;
        for p in [1, 5, 17] {
            for k in [1, 3, 5] {
                let prop = periodic(&x, k, 5);
                let m = matches_from_proposals(&x, p, k, &prop);
                for stop in [p + 1, p + 2, p + 3, p + 10, p + 57, x.len() - k] {
                    let w = walk_to(&m, stop);
                    let (rounds, committed, extra) = simulate_stop(&x, p, k, stop, &prop);
                    assert_eq!(
                        (w.rounds, w.committed, w.engine_extra, w.engine_unknown),
                        (rounds, committed, extra, 0),
                        "p {p} k {k} stop {stop}"
                    );
                    cut_steps += usize::from(extra > 0);
                    // The committed figures are the walk of the sample cut at the stop.
                    let c = walk(&matches_from_proposals(&x[..stop], p, k, &prop));
                    assert_eq!(
                        (c.rounds, c.committed, c.positions, c.leading_sum),
                        (w.rounds, w.committed, w.positions, w.leading_sum)
                    );
                    assert_eq!(
                        (&c.cond_den, &c.cond_num, &c.uncond),
                        (&w.cond_den, &w.cond_num, &w.uncond)
                    );
                    if rounds > 0 {
                        let al = (committed + extra) as f64 / rounds as f64;
                        assert_eq!(w.al_engine(), Some(al));
                    }
                    // Without the lookahead the final step is known only where its first miss
                    // (or its last depth) lies before the stop; then it is the same.
                    if c.engine_unknown == 0 {
                        assert_eq!(c.engine_extra, w.engine_extra, "p {p} k {k} stop {stop}");
                    }
                }
            }
        }
        assert!(cut_steps > 5, "the cases cut few final steps: {cut_steps}");
    }

    #[test]
    fn the_sglang_convention_counts_one_prefill_token_per_request() {
        let x: Vec<u32> = (0..42).collect();
        let one = walk(&matches_from_proposals(&x, 1, 3, |_| vec![999; 3]));
        let mut two = one.clone();
        two.add(&one);
        assert_eq!(two.requests, 2);
        assert_eq!(
            two.al_sglang_request(),
            (two.committed + 2) as f64 / two.rounds as f64
        );
        assert_eq!(two.al_sglang_request(), one.al_sglang_request());
    }

    #[test]
    fn perfect_and_useless_drafters() {
        // P = 1, T = 42: 40 tokens after the prefill token, 10 full rounds of 4.
        let x: Vec<u32> = (0..42).collect();
        let perfect = walk(&matches_from_proposals(&x, 1, 3, |t| {
            (0..3).map(|j| (t + 2 + j) as u32).collect()
        }));
        assert_eq!(perfect.rounds, 10);
        assert_eq!(perfect.al_walk(), 4.0);
        assert_eq!(perfect.conditional(), vec![Some(1.0); 3]);
        let none = walk(&matches_from_proposals(&x, 1, 3, |_| vec![999; 3]));
        assert_eq!(none.al_walk(), 1.0);
        assert_eq!(none.al_allpos(), 1.0);
        assert_eq!(none.simulated(), 1.0);
        assert_eq!(
            none.al_sglang_request(),
            (none.committed + 1) as f64 / none.rounds as f64
        );
    }

    /// Near-ties on a hand example: P = 2, T = 8, 2 depths; roots t = 1, 3, 5 on the walk.
    #[test]
    fn near_ties_flip_the_decisive_proposals_both_ways() {
        let nan = f32::NAN;
        // margin[t][k]; alt[t]: bit k when the runner-up is the true token.
        let m = Matches {
            depths: 2,
            prompt_len: 2,
            total_len: 8,
            c: vec![0, 0b01, 0, 0b00, 0, 0b11, 0],
            // Pair 0 is in the prompt: nothing proposed, no margin.
            proposals: [vec![crate::runtime::matches::NOT_PROPOSED; 2], vec![0; 12]].concat(),
            margin: vec![
                nan, nan, // t0 (prompt)
                0.01, 0.5, // t1: accepted depth 0 a near-tie
                0.01, 0.01, // t2: off the walk
                0.01, 0.5, // t3: first miss a near-tie, runner-up true
                0.5, 0.5, // t4
                0.5, 0.5, // t5: no near-tie
                0.5, 0.5, // t6
            ],
            alt: vec![0, 0, 0, 0b01, 0, 0, 0],
        };
        let base = walk_to(&m, 8);
        assert_eq!((base.rounds, base.committed), (4, 5), "roots 1, 3, 4, 5");
        let t = near_ties(&m, 8, 0.02).unwrap();
        assert_eq!(t.steps, 2, "roots 1 and 3");
        // Down: root 1 accepts nothing, so the walk takes roots 1, 2, 3, 4, 5.
        assert_eq!(t.down, walk_to(&m.flipped(0.02, Flip::Down), 8));
        assert!(t.down.rounds > base.rounds);
        // Up: root 3 accepts depth 0 too.
        assert!(t.up.al_walk() >= base.al_walk());
        assert_eq!(m.flipped(0.02, Flip::Up).c[3], 0b01);
        // A margin below every gap: nothing moves.
        let none = near_ties(&m, 8, 0.001).unwrap();
        assert_eq!((none.steps, &none.down, &none.up), (0, &base, &base));
        // Without margins (a device argmax) there is nothing to say.
        let dev = Matches {
            margin: vec![nan; 14],
            ..m.clone()
        };
        assert!(near_ties(&dev, 8, 0.02).is_none());
    }

    #[test]
    fn statistics_on_a_hand_example() {
        // P = 2, T = 7: roots at pair t = 1..5. n = [2, 0, 1, 0, 0] (truncated at the end).
        let m = Matches {
            depths: 3,
            prompt_len: 2,
            total_len: 7,
            c: vec![0, 0b011, 0, 0b101, 0b111, 0b111],
            ..Matches::default()
        };
        assert_eq!(
            (1..6).map(|t| m.leading(t)).collect::<Vec<_>>(),
            vec![2, 0, 1, 1, 0]
        );
        let w = walk(&m);
        // t=1: n=2 → commit 3, t=4: n=min(1, 7-(2+4)-1=0)=0 → commit 1, t=5: stop (P+5 = 7).
        assert_eq!((w.rounds, w.committed), (2, 4));
        assert_eq!(w.al_walk(), 2.0);
        assert_eq!(w.positions, 5);
        assert_eq!(w.leading_sum, 4);
        // Depth d is compared at the roots t with t + 2 + d < 7 + 1: depth 0 at t = 1..4, depth
        // 1 at t = 1..3, depth 2 at t = 1..2 (root 5 has no token after it); each rate is out
        // of those, not out of all 5 roots.
        assert_eq!(w.at_depth, vec![4, 3, 2]);
        assert_eq!(w.uncond, vec![3, 1, 0]);
        assert_eq!(w.unconditional(), vec![3.0 / 4.0, 1.0 / 3.0, 0.0]);
    }
}
