//! The measured acceptance as the engines' synthetic-acceptance benchmarks take it
//! (docs/verify.md, "Synthetic acceptance rates"): the unconditional per-position rates of a
//! run's verify rounds, rate_k = the share of rounds that accepted at least k drafts
//! (k = 1..K), overall and per category, written in vLLM's `--speculative-config` form
//! (`rejection_sample_method: "synthetic"`, `synthetic_acceptance_rates`;
//! `vllm/config/speculative.py`) and in SGLang's (`SGLANG_SIMULATE_ACC_LEN`, a mean accept
//! length; `sglang/srt/speculative/spec_utils.py`).
//!
//! The rates come from a histogram of rounds by accepted drafts, counted as the engine counts
//! them (a walk's `accepted_hist` offline: a request's final round before its cut at the stop;
//! the engine's per-request histogram live), so 1 + Σ rates is the accept length the engine
//! reports (`accept_length_engine`): the expectation a synthetic run draws its acceptance from.
//! A final round the sample ends within (no token past the stop to judge its next draft) is
//! censored, not a miss: there the rates are the product-limit (Kaplan–Meier) estimate, each
//! position's conditional rate over the rounds that judged it.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::verify::walk::Walk;

/// Decimals the rates are written with.
pub const DECIMALS: u32 = 4;
const SCALE: u64 = 10u64.pow(DECIMALS);

/// What the rates count.
pub const CONVENTION: &str = "unconditional per-position acceptance of the verify rounds: rate k (k = 1..K) = the probability that a round accepts at least k drafts (vLLM's synthetic_acceptance_rates: position i's entry is the probability that the first i+1 drafts are all accepted) = rounds that accepted at least k / rounds, a request's final round counted before its cut at the stop as the engine counts it; where a sample ends within its final round (its next draft never judged) the product-limit estimate, each position's conditional rate over the rounds that judged it; non-increasing, rounded to 4 decimals; accept_length = 1 + Σ rates";

/// `value` rounded to [`DECIMALS`].
fn rounded(value: f64) -> f64 {
    (value * SCALE as f64).round() / SCALE as f64
}

/// The rates (k = 1..`k`) of the rounds `hist` counts (index j = rounds that accepted j
/// drafts), `censored[j]` of them accepting at least j (their next draft never judged), each
/// rounded to [`DECIMALS`], non-increasing and within [0, 1] (vLLM refuses anything else).
/// `None` without rounds, where some position no round judged could be accepted (the rounds
/// that reached it were all censored), or where a round accepted more than `k` drafts (the
/// histogram contradicts K).
pub fn rates(hist: &[u64], censored: &[u64], k: usize) -> Option<Vec<f64>> {
    if hist.iter().skip(k + 1).any(|&c| c > 0) {
        return None;
    }
    if censored.iter().all(|&c| c == 0) {
        uncensored(hist, k)
    } else {
        product_limit(hist, censored, k)
    }
}

/// Rounds accepted at least k drafts (k = 1..`k`) over all rounds, from `hist` (index j =
/// rounds that accepted j drafts), each rounded to [`DECIMALS`] from the counts by integer
/// arithmetic, half up. The counts are non-increasing in k and rounding is monotone, so the
/// rates are non-increasing as vLLM requires, and within [0, 1]. `None` without rounds.
fn uncensored(hist: &[u64], k: usize) -> Option<Vec<f64>> {
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

/// The product-limit estimate: position i's conditional rate is the rounds that accepted at
/// least i drafts over those that judged draft i (accepted at least i − 1, less the ones
/// censored at i − 1), and rate_k the product of the first k. Each factor is at most 1, so the
/// products (and their roundings) never increase. Without censored rounds it is the share of
/// [`uncensored`] (the product telescopes). `None` without rounds.
fn product_limit(hist: &[u64], censored: &[u64], k: usize) -> Option<Vec<f64>> {
    let at_least = |j: usize| hist.iter().skip(j).sum::<u64>();
    if at_least(0) == 0 {
        return None;
    }
    let mut p = 1.0f64;
    let mut out = Vec::with_capacity(k);
    for i in 1..=k {
        let judged = at_least(i - 1).saturating_sub(censored.get(i - 1).copied().unwrap_or(0));
        if judged > 0 {
            p *= at_least(i) as f64 / judged as f64;
        } else if p > 0.0 {
            // Rounds reached draft i, but none judged it.
            return None;
        }
        out.push(rounded(p));
    }
    Some(out)
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
    /// The rates of the rounds `hist` counts (`censored` as [`rates`] takes it), K = `k`.
    pub fn of(hist: &[u64], censored: &[u64], k: usize) -> Option<Rates> {
        if k == 0 {
            return None;
        }
        let rates = rates(hist, censored, k)?;
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

/// Offline: the rounds of the walk; `Walk::accepted_hist` counts them as the engine does.
pub const SOURCE_WALK: &str = "the replay's walk: drafts accepted per verify round as the engine counts them, a request's final round before its cut at the stop (1 + Σ rates = accept_length_engine where the trace holds the tokens past every stop; a final round the sample ends within is censored)";
/// Live: the engines' per-request histograms.
pub const SOURCE_ENGINE: &str = "the engine's per-request histogram (vLLM acceptance_histogram, SGLang spec_correct_drafts_histogram): its own count (1 + Σ rates = accept_length_engine); null where a response had none";

/// The draft's rates from its per-sample walks (`categories[i]` is sample i's), K = `k`.
/// A sample without a histogram (a live response without one) leaves its sets `null`.
pub fn of(samples: &[Walk], categories: &[String], k: usize, source: &'static str) -> Synthetic {
    let rates_of = |idx: &mut dyn Iterator<Item = usize>| -> Option<Rates> {
        let mut w = Walk::default();
        for i in idx {
            if samples[i].accepted_hist.is_empty() && samples[i].rounds > 0 {
                return None;
            }
            w.add(&samples[i]);
        }
        Rates::of(&w.accepted_hist, &w.censored_hist, k)
    };
    let mut cats: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, c) in categories.iter().enumerate() {
        cats.entry(c.clone()).or_default().push(i);
    }
    Synthetic {
        convention: CONVENTION,
        source,
        num_speculative_tokens: k,
        overall: rates_of(&mut (0..samples.len())),
        per_category: cats
            .into_iter()
            .map(|(c, idx)| (c, rates_of(&mut idx.into_iter())))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_the_unconditional_shares_rounded_and_non_increasing() {
        // 10 rounds: 2 accepted 0, 3 accepted 1, 1 accepted 2, 4 accepted 3.
        let r = rates(&[2, 3, 1, 4], &[], 3).unwrap();
        assert_eq!(r, vec![0.8, 0.5, 0.4]);
        // 1 + Σ = 1 + (3 + 2 + 12) / 10, the histogram's accept length.
        assert_eq!(Rates::of(&[2, 3, 1, 4], &[], 3).unwrap().accept_length, 2.7);
        // Thirds: rounding half up from the counts keeps equal counts equal and the order.
        let r = rates(&[1, 0, 1, 1], &[], 3).unwrap();
        assert_eq!(r, vec![0.6667, 0.6667, 0.3333]);
        assert!(rates(&[0, 0], &[], 1).is_none());
        // Many rounds, every count: never increasing, always in [0, 1].
        for a in 0..40u64 {
            for b in 0..40u64 {
                let h = [7, a, b, 40 - a.min(40), 3];
                let r = rates(&h, &[], 4).unwrap();
                assert!(r.windows(2).all(|w| w[1] <= w[0]), "{h:?} {r:?}");
                assert!(r.iter().all(|x| (0.0..=1.0).contains(x)));
            }
        }
    }

    /// A round the sample ends within is censored, not a miss: the rates are the
    /// product-limit estimate over the rounds that judged each position.
    #[test]
    fn censored_rounds_are_not_misses() {
        // 8 rounds accepted all 3 drafts; 2 final rounds ended with the sample before their
        // first draft could be judged. Counted as misses they gave 0.8 everywhere.
        assert_eq!(rates(&[2, 0, 0, 8], &[2], 3).unwrap(), vec![1.0, 1.0, 1.0]);
        // 10 rounds: 2 missed draft 1, 4 accepted 1 then missed, 4 accepted 2 and the sample
        // ended (censored at 2): c1 = 8/10, c2 = 4/8, c3 unjudged by anything that reached it.
        assert!(rates(&[2, 4, 4, 0], &[0, 0, 4], 3).is_none());
        // The same with 2 rounds that judged draft 3 (one accepted it): c3 = 1/2.
        assert_eq!(
            rates(&[2, 4, 5, 1], &[0, 0, 4], 3).unwrap(),
            vec![0.8333, 0.5, 0.25]
        );
        // Nothing judged at all (samples that end within their first round): not measured.
        assert!(rates(&[60], &[60], 3).is_none());
        assert!(Rates::of(&[60], &[60], 3).is_none());
        // Without censored rounds the product telescopes to the shares.
        for h in [[2u64, 3, 1, 4], [0, 0, 0, 9], [5, 0, 0, 0], [1, 2, 3, 4]] {
            let plain = uncensored(&h, 3).unwrap();
            let pl = product_limit(&h, &[0, 0, 0], 3).unwrap();
            for (a, b) in plain.iter().zip(&pl) {
                assert!((a - b).abs() <= 1e-4, "{h:?} {plain:?} {pl:?}");
            }
        }
        // Every histogram and censoring: non-increasing, within [0, 1].
        for a in 0..12u64 {
            for c0 in 0..=3u64 {
                for c2 in 0..=a {
                    let h = [3 + c0, 5, a, 4];
                    if let Some(r) = rates(&h, &[c0, 0, c2], 3) {
                        assert!(r.windows(2).all(|w| w[1] <= w[0]), "{h:?} {r:?}");
                        assert!(r.iter().all(|x| (0.0..=1.0).contains(x)), "{r:?}");
                    }
                }
            }
        }
        // A round that accepted more drafts than K contradicts K.
        assert!(rates(&[5, 0, 0, 0, 1], &[], 3).is_none());
    }

    #[test]
    fn the_vllm_fragment_is_one_line_of_its_keys() {
        let r = Rates::of(&[0, 1, 1], &[], 2).unwrap();
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
