//! How often two drafters propose the same token at the same position and depth, teacher-forced
//! over one trace (#16: a measure of a quantized draft against its original with far less
//! variance than the accept-length difference, since every position counts, not only the
//! rounds the walk visits). Compared: every root of the generated region whose depth-k token
//! exists in the trace (the positions the unconditional rates count), where both drafters
//! computed a proposal (with `--after-miss skip` only the rows both reached).

use serde::Serialize;

use crate::runtime::matches::Matches;

/// Per depth: positions compared and positions where the two proposals agree.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Agreement {
    pub compared: Vec<u64>,
    pub agree: Vec<u64>,
}

impl Agreement {
    /// Over one sample replayed by both drafters (the same tokens). `None` when either did not
    /// keep its proposals.
    pub fn of(a: &Matches, b: &Matches) -> Option<Agreement> {
        if a.proposals.is_empty() || b.proposals.is_empty() || a.total_len != b.total_len {
            return None;
        }
        let depths = a.depths.min(b.depths);
        let mut g = Agreement {
            compared: vec![0; depths],
            agree: vec![0; depths],
        };
        let (p, t_end) = (a.prompt_len.max(1), a.total_len);
        for t in p - 1..t_end.saturating_sub(1) {
            for k in 0..depths.min(t_end.saturating_sub(t + 2)) {
                if let (Some(x), Some(y)) = (a.proposal(t, k), b.proposal(t, k)) {
                    g.compared[k] += 1;
                    g.agree[k] += (x == y) as u64;
                }
            }
        }
        Some(g)
    }

    pub fn add(&mut self, o: &Agreement) {
        for (v, w) in [
            (&mut self.compared, &o.compared),
            (&mut self.agree, &o.agree),
        ] {
            if v.len() < w.len() {
                v.resize(w.len(), 0);
            }
            for (a, b) in v.iter_mut().zip(w) {
                *a += b;
            }
        }
    }

    /// Per depth, the share of compared positions that agree (`None` where none compared).
    pub fn rates(&self) -> Vec<Option<f64>> {
        self.agree
            .iter()
            .zip(&self.compared)
            .map(|(&a, &c)| (c > 0).then(|| a as f64 / c as f64))
            .collect()
    }

    /// Over every depth together.
    pub fn overall(&self) -> Option<f64> {
        let c: u64 = self.compared.iter().sum();
        (c > 0).then(|| self.agree.iter().sum::<u64>() as f64 / c as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::walk::matches_from_proposals;

    #[test]
    fn counts_the_positions_both_proposed() {
        let x: Vec<u32> = (0..12).collect();
        // a: the truth everywhere; b: wrong at depth 1 of even roots.
        let a = matches_from_proposals(&x, 3, 3, |t| (0..3).map(|k| (t + 2 + k) as u32).collect());
        let b = matches_from_proposals(&x, 3, 3, |t| {
            (0..3)
                .map(|k| {
                    if k == 1 && t % 2 == 0 {
                        99
                    } else {
                        (t + 2 + k) as u32
                    }
                })
                .collect()
        });
        let g = Agreement::of(&a, &b).unwrap();
        // Roots t = 2..=10; depth k exists while t + 2 + k < 12.
        assert_eq!(g.compared, vec![8, 7, 6]);
        // Even roots with depth 1: t = 2, 4, 6, 8 (t + 3 < 12).
        assert_eq!(g.agree, vec![8, 3, 6]);
        assert_eq!(g.rates()[1], Some(3.0 / 7.0));
        assert_eq!(g.overall(), Some(17.0 / 21.0));
        let mut none = a.clone();
        none.proposals.clear();
        assert!(Agreement::of(&a, &none).is_none());
    }
}
