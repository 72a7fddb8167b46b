//! Accept length from teacher-forced depth matches (docs/verify.md, "What it computes", pass B):
//! walk the engine's schedule over the per-root leading-match counts, and the secondary
//! statistics (all-positions mean, per-depth conditional and unconditional rates, simulated
//! accept length).

use serde::Serialize;

pub use crate::runtime::matches::{Matches, MAX_DEPTHS};

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
    /// The depths after a root's first miss were not computed (`--after-miss skip`): `uncond`
    /// undercounts, and neither the unconditional rates nor the simulated accept length are
    /// measured.
    pub after_miss_skipped: bool,
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
    /// SGLang per-request `meta_info` convention (counts the prefill token): `(committed+1)/rounds`.
    pub fn al_sglang_request(&self) -> f64 {
        if self.rounds == 0 {
            return 1.0;
        }
        (self.committed + 1) as f64 / self.rounds as f64
    }
    /// 1 + mean n(t) over every root position of the generated region.
    pub fn al_allpos(&self) -> f64 {
        if self.positions == 0 {
            return 1.0;
        }
        1.0 + self.leading_sum as f64 / self.positions as f64
    }
    /// P(depth k accepted | depths < k accepted).
    pub fn conditional(&self) -> Vec<f64> {
        self.cond_num
            .iter()
            .zip(&self.cond_den)
            .map(|(&n, &d)| if d == 0 { 0.0 } else { n as f64 / d as f64 })
            .collect()
    }
    /// Unconditional teacher-forced rate of depth k.
    pub fn unconditional(&self) -> Vec<f64> {
        self.uncond
            .iter()
            .map(|&u| {
                if self.positions == 0 {
                    0.0
                } else {
                    u as f64 / self.positions as f64
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
    pub fn add(&mut self, o: &Walk) {
        self.after_miss_skipped |= o.after_miss_skipped;
        self.rounds += o.rounds;
        self.committed += o.committed;
        self.positions += o.positions;
        self.leading_sum += o.leading_sum;
        for (v, w) in [
            (&mut self.cond_den, &o.cond_den),
            (&mut self.cond_num, &o.cond_num),
            (&mut self.uncond, &o.uncond),
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

/// Pass B: walk the engine's schedule (root ← root + accepted + 1) and gather the statistics.
pub fn walk(m: &Matches) -> Walk {
    let k = m.depths;
    let mut w = Walk {
        cond_den: vec![0; k],
        cond_num: vec![0; k],
        uncond: vec![0; k],
        ..Walk::default()
    };
    let (p, t_end) = (m.prompt_len, m.total_len);
    if p == 0 || p >= t_end {
        return w;
    }
    // The engine's schedule.
    let mut t = p - 1;
    let mut committed = 1usize; // x_P, from prefill
    while p + committed < t_end {
        let n = m.leading(t).min(t_end - (p + committed) - 1);
        committed += n + 1;
        w.rounds += 1;
        w.committed += (n + 1) as u64;
        t += n + 1;
    }
    // Every root position of the generated region.
    for t in p - 1..t_end.saturating_sub(1) {
        let n = m.leading(t);
        w.positions += 1;
        w.leading_sum += n as u64;
        let avail = t_end.saturating_sub(t + 2);
        for d in 0..k.min(avail) {
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

/// Depth matches of a drafter that proposes `proposals[t][k]` for root pair `t` (the token at
/// `x[t+2+k]`), against the sequence `x`.
pub fn matches_from_proposals(
    x: &[u32],
    prompt_len: usize,
    depths: usize,
    proposals: impl Fn(usize) -> Vec<u32>,
) -> Matches {
    let total_len = x.len();
    let mut c = vec![0u32; total_len.saturating_sub(1)];
    let mut kept = vec![crate::runtime::matches::NOT_PROPOSED; c.len() * depths];
    for (t, bits) in c.iter_mut().enumerate().skip(prompt_len.saturating_sub(1)) {
        for (k, &d) in proposals(t).iter().take(depths).enumerate() {
            kept[t * depths + k] = d;
            if x.get(t + 2 + k) == Some(&d) {
                *bits |= 1 << k;
            }
        }
    }
    Matches {
        depths,
        prompt_len,
        total_len,
        c,
        proposals: kept,
    }
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

    #[test]
    fn walk_equals_direct_simulation() {
        let x: Vec<u32> = (0..200).map(|i| (i * 7 % 13) as u32).collect();
        for p in [1, 5, 17, 100] {
            for k in [1, 3, 5] {
                // A drafter right at some depths, wrong at others, depending on position.
                let prop = |t: usize| -> Vec<u32> {
                    (0..k)
                        .map(|j| {
                            if (t + j) % 4 == 3 {
                                99
                            } else {
                                x.get(t + 2 + j).copied().unwrap_or(0)
                            }
                        })
                        .collect()
                };
                let w = walk(&matches_from_proposals(&x, p, k, prop));
                let (rounds, committed) = simulate(&x, p, k, &prop);
                assert_eq!((w.rounds, w.committed), (rounds, committed), "p {p} k {k}");
            }
        }
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
        assert_eq!(perfect.conditional(), vec![1.0, 1.0, 1.0]);
        let none = walk(&matches_from_proposals(&x, 1, 3, |_| vec![999; 3]));
        assert_eq!(none.al_walk(), 1.0);
        assert_eq!(none.al_allpos(), 1.0);
        assert_eq!(none.simulated(), 1.0);
        assert_eq!(
            none.al_sglang_request(),
            (none.committed + 1) as f64 / none.rounds as f64
        );
    }

    #[test]
    fn statistics_on_a_hand_example() {
        // P = 2, T = 7: roots at pair t = 1..5. n = [2, 0, 1, 0, 0] (truncated at the end).
        let m = Matches {
            depths: 3,
            prompt_len: 2,
            total_len: 7,
            c: vec![0, 0b011, 0, 0b101, 0b111, 0b111],
            proposals: Vec::new(),
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
    }
}
