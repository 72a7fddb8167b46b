//! The measured acceptance as the engines' synthetic-acceptance benchmarks take it
//! (docs/verify.md, "Synthetic acceptance rates"): the unconditional per-position rates of a
//! run's verify rounds, rate_k = the share of rounds that accepted at least k drafts
//! (k = 1..K), overall and per category, written in vLLM's `--speculative-config` form
//! (`rejection_sample_method: "synthetic"`, `synthetic_acceptance_rates`;
//! `vllm/config/speculative.py`) and in SGLang's (`SGLANG_SIMULATE_ACC_LEN`, a mean accept
//! length; `sglang/srt/speculative/spec_utils.py`).
//!
//! The rates come from a histogram of rounds by accepted drafts (a walk's `accepted_hist`
//! offline, the engine's per-request histogram live), so 1 + Σ rates is exactly the accept
//! length the histogram counts: the expectation a synthetic run draws its acceptance from.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::verify::walk::Walk;

/// Decimals the rates are written with.
pub const DECIMALS: u32 = 4;
const SCALE: u64 = 10u64.pow(DECIMALS);

/// What the rates count.
pub const CONVENTION: &str = "unconditional per-position acceptance of the verify rounds: rate k (k = 1..K) = rounds that accepted at least k drafts / rounds (vLLM's synthetic_acceptance_rates: position i's entry is the probability that the first i+1 drafts are all accepted); non-increasing, rounded to 4 decimals from the counts; accept_length = 1 + Σ rates";

/// Rounds accepted at least k drafts (k = 1..`k`) over all rounds, from `hist` (index j =
/// rounds that accepted j drafts), each rounded to [`DECIMALS`] from the counts by integer
/// arithmetic, half up. The counts are non-increasing in k and rounding is monotone, so the
/// rates are non-increasing as vLLM requires, and within [0, 1]. `None` without rounds.
pub fn rates(hist: &[u64], k: usize) -> Option<Vec<f64>> {
    let rounds: u64 = hist.iter().sum();
    if rounds == 0 {
        return None;
    }
    Some(
        (1..=k)
            .map(|pos| {
                let at_least: u64 = hist.iter().skip(pos).sum();
                let q =
                    (2 * at_least as u128 * SCALE as u128 + rounds as u128) / (2 * rounds as u128);
                q as f64 / SCALE as f64
            })
            .collect(),
    )
}

/// vLLM's `--speculative-config` fragment: merge it into the draft's own (`method`, `model`).
#[derive(Debug, Clone, Serialize)]
pub struct VllmFragment {
    pub num_speculative_tokens: usize,
    pub rejection_sample_method: &'static str,
    pub synthetic_acceptance_rates: Vec<f64>,
}

/// One set's rates and each engine's form of them.
#[derive(Debug, Clone, Serialize)]
pub struct Rates {
    pub rounds: u64,
    pub rates: Vec<f64>,
    /// 1 + Σ rates: the accept length a synthetic run is drawn at.
    pub accept_length: f64,
    pub vllm_speculative_config: VllmFragment,
    /// SGLang's equivalent, a mean accept length only (the bonus token counted).
    pub sglang_env: String,
}

impl Rates {
    /// The rates of the rounds `hist` counts, K = `k`.
    pub fn of(hist: &[u64], k: usize) -> Option<Rates> {
        if k == 0 {
            return None;
        }
        let rates = rates(hist, k)?;
        // Σ of the rounded rates, itself at DECIMALS (an exact sum of multiples of 10^-4).
        let q: u64 = rates
            .iter()
            .map(|r| (r * SCALE as f64).round() as u64)
            .sum();
        let accept_length = (SCALE + q) as f64 / SCALE as f64;
        Some(Rates {
            rounds: hist.iter().sum(),
            accept_length,
            sglang_env: format!(
                "SGLANG_SIMULATE_ACC_LEN={accept_length} SGLANG_SIMULATE_ACC_METHOD=match-expected"
            ),
            vllm_speculative_config: VllmFragment {
                num_speculative_tokens: k,
                rejection_sample_method: "synthetic",
                synthetic_acceptance_rates: rates.clone(),
            },
            rates,
        })
    }

    /// The vLLM fragment as one line of JSON, ready to paste.
    pub fn vllm_line(&self) -> String {
        serde_json::to_string(&self.vllm_speculative_config).expect("JSON")
    }
}

/// The report's `synthetic_acceptance`: the draft's rates overall and per category.
#[derive(Debug, Clone, Serialize)]
pub struct Synthetic {
    pub convention: &'static str,
    /// Which rounds were counted: the walk's committed drafts (offline) or the engine's own
    /// histogram (live).
    pub source: &'static str,
    pub num_speculative_tokens: usize,
    pub overall: Option<Rates>,
    pub per_category: BTreeMap<String, Option<Rates>>,
}

/// Offline: the rounds of the walk; `Walk::accepted_hist` counts committed drafts.
pub const SOURCE_WALK: &str =
    "the replay's walk: drafts committed per verify round (1 + Σ rates = accept_length)";
/// Live: the engines' per-request histograms.
pub const SOURCE_ENGINE: &str = "the engine's per-request histogram (vLLM acceptance_histogram, SGLang spec_correct_drafts_histogram): its own count (1 + Σ rates = accept_length_engine); null where a response had none";

/// The draft's rates from its per-sample walks (`categories[i]` is sample i's), K = `k`.
/// A sample without a histogram (a live response without one) leaves its sets `null`.
pub fn of(samples: &[Walk], categories: &[String], k: usize, source: &'static str) -> Synthetic {
    let hist_of = |idx: &mut dyn Iterator<Item = usize>| -> Option<Vec<u64>> {
        let mut h: Vec<u64> = Vec::new();
        for i in idx {
            let w = &samples[i];
            if w.accepted_hist.is_empty() && w.rounds > 0 {
                return None;
            }
            if h.len() < w.accepted_hist.len() {
                h.resize(w.accepted_hist.len(), 0);
            }
            for (a, b) in h.iter_mut().zip(&w.accepted_hist) {
                *a += b;
            }
        }
        Some(h)
    };
    let mut cats: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, c) in categories.iter().enumerate() {
        cats.entry(c.clone()).or_default().push(i);
    }
    Synthetic {
        convention: CONVENTION,
        source,
        num_speculative_tokens: k,
        overall: hist_of(&mut (0..samples.len())).and_then(|h| Rates::of(&h, k)),
        per_category: cats
            .into_iter()
            .map(|(c, idx)| {
                let r = hist_of(&mut idx.into_iter()).and_then(|h| Rates::of(&h, k));
                (c, r)
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_the_unconditional_shares_rounded_and_non_increasing() {
        // 10 rounds: 2 accepted 0, 3 accepted 1, 1 accepted 2, 4 accepted 3.
        let r = rates(&[2, 3, 1, 4], 3).unwrap();
        assert_eq!(r, vec![0.8, 0.5, 0.4]);
        // 1 + Σ = 1 + (3 + 2 + 12) / 10, the histogram's accept length.
        assert_eq!(Rates::of(&[2, 3, 1, 4], 3).unwrap().accept_length, 2.7);
        // Thirds: rounding half up from the counts keeps equal counts equal and the order.
        let r = rates(&[1, 0, 1, 1], 3).unwrap();
        assert_eq!(r, vec![0.6667, 0.6667, 0.3333]);
        assert!(rates(&[0, 0], 1).is_none());
        // Many rounds, every count: never increasing, always in [0, 1].
        for a in 0..40u64 {
            for b in 0..40u64 {
                let h = [7, a, b, 40 - a.min(40), 3];
                let r = rates(&h, 4).unwrap();
                assert!(r.windows(2).all(|w| w[1] <= w[0]), "{h:?} {r:?}");
                assert!(r.iter().all(|x| (0.0..=1.0).contains(x)));
            }
        }
    }

    #[test]
    fn the_vllm_fragment_is_one_line_of_its_keys() {
        let r = Rates::of(&[0, 1, 1], 2).unwrap();
        assert_eq!(
            r.vllm_line(),
            r#"{"num_speculative_tokens":2,"rejection_sample_method":"synthetic","synthetic_acceptance_rates":[1.0,0.5]}"#
        );
        assert_eq!(
            r.sglang_env,
            "SGLANG_SIMULATE_ACC_LEN=2.5 SGLANG_SIMULATE_ACC_METHOD=match-expected"
        );
    }
}
