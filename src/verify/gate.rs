//! The regression gate (docs/verify.md, "The gate"): both drafts on identical positions,
//! ΔAL = draft − baseline (micro-averaged over prompts), a 95 % paired bootstrap interval over
//! prompts, and the pass/fail decision.

use serde::Serialize;

use super::walk::Walk;

/// Bootstrap resamples (fixed, with a fixed seed: the interval is deterministic).
pub const BOOTSTRAP_RESAMPLES: usize = 2000;
const SEED: u64 = 0x6b71_7561_6e74; // "kquant"

/// Which accept length the gate decides on (`verify --gate-on`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GateOn {
    /// The walked accept length: tokens committed per verify step, the bonus token counted
    /// (what an engine's steps commit).
    #[default]
    Walk,
    /// The teacher-forced all-positions accept length: 1 + the leading matches averaged over
    /// every root position (the offline figure DFlash cards quote). Offline only.
    AllPositions,
}

impl GateOn {
    /// This accept length of an aggregate.
    pub fn of(self, w: &Walk) -> f64 {
        match self {
            GateOn::Walk => w.al_walk(),
            GateOn::AllPositions => w.al_allpos(),
        }
    }
    /// The report's field for it.
    pub fn field(self) -> &'static str {
        match self {
            GateOn::Walk => "accept_length",
            GateOn::AllPositions => "accept_length_all_positions",
        }
    }
    /// How the gate's reasons name it.
    pub fn label(self) -> &'static str {
        match self {
            GateOn::Walk => "accept length",
            GateOn::AllPositions => "all-positions accept length (teacher-forced)",
        }
    }
}

/// Micro-averaged walk AL over a set of samples.
pub fn micro_al(samples: &[&Walk]) -> f64 {
    micro_al_on(samples, GateOn::Walk)
}

/// Micro-averaged accept length `on` over a set of samples.
pub fn micro_al_on(samples: &[&Walk], on: GateOn) -> f64 {
    on.of(&Walk::sum(samples.iter().copied()))
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// ΔAL of paired samples and its 95 % bootstrap interval (resampling prompts).
pub fn paired_delta(draft: &[Walk], baseline: &[Walk]) -> (f64, [f64; 2]) {
    paired_delta_on(draft, baseline, GateOn::Walk)
}

/// Δ of accept length `on` over paired samples and its 95 % bootstrap interval (resampling
/// prompts, the same resamples whichever accept length).
pub fn paired_delta_on(draft: &[Walk], baseline: &[Walk], on: GateOn) -> (f64, [f64; 2]) {
    assert_eq!(draft.len(), baseline.len(), "paired samples");
    let all = |w: &[Walk], idx: &[usize]| on.of(&Walk::sum(idx.iter().map(|&i| &w[i])));
    let n = draft.len();
    let idx: Vec<usize> = (0..n).collect();
    let delta = all(draft, &idx) - all(baseline, &idx);
    if n == 0 {
        return (0.0, [0.0, 0.0]);
    }
    let mut rng = SEED;
    let mut ds: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
        .map(|_| {
            let pick: Vec<usize> = (0..n)
                .map(|_| (splitmix(&mut rng) % n as u64) as usize)
                .collect();
            all(draft, &pick) - all(baseline, &pick)
        })
        .collect();
    ds.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| ds[((p * (ds.len() - 1) as f64).round() as usize).min(ds.len() - 1)];
    (delta, [q(0.025), q(0.975)])
}

/// The gate's thresholds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Thresholds {
    /// Fail when ΔAL < −max_regression.
    pub max_regression: f64,
    /// Fail when the draft's AL < min_accept.
    pub min_accept: Option<f64>,
}

impl Thresholds {
    /// The gate's thresholds, refused (an error naming the flag) when they cannot gate.
    pub fn new(max_regression: f64, min_accept: Option<f64>) -> crate::error::Result<Thresholds> {
        let th = Thresholds {
            max_regression,
            min_accept,
        };
        th.check().map_err(|msg| crate::error::Error::Flags {
            msg,
            hint: "give finite thresholds: a comparison with `nan` is always false, so the gate would pass anything".into(),
        })?;
        Ok(th)
    }

    /// Why these thresholds cannot gate anything: a non-finite one (a comparison with `nan` is
    /// always false, and `inf` allows anything), which would pass every draft.
    pub fn check(&self) -> Result<(), String> {
        if !self.max_regression.is_finite() {
            return Err(format!(
                "--max-regression {} is not a finite number",
                self.max_regression
            ));
        }
        match self.min_accept {
            Some(m) if !m.is_finite() => Err(format!("--min-accept {m} is not a finite number")),
            _ => Ok(()),
        }
    }
}

/// Pass/fail with the reasons.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    pub passed: bool,
    pub reasons: Vec<String>,
}

/// The gate. It fails closed: thresholds that cannot gate ([`Thresholds::check`]) or an
/// accept length or ΔAL that is not a number fail, never pass.
pub fn decide(draft_al: f64, delta: Option<f64>, th: Thresholds) -> Decision {
    decide_on(draft_al, delta, th, GateOn::Walk)
}

/// [`decide`] on accept length `on` (`draft_al` and `delta` are that figure's), the reasons
/// naming it.
pub fn decide_on(draft_al: f64, delta: Option<f64>, th: Thresholds, on: GateOn) -> Decision {
    let what = on.label();
    let mut reasons = Vec::new();
    if let Err(e) = th.check() {
        reasons.push(e);
    }
    if !draft_al.is_finite() || delta.is_some_and(|d| !d.is_finite()) {
        reasons.push(format!(
            "{what} {draft_al} / ΔAL {delta:?} is not a number: nothing was measured"
        ));
    }
    if let Some(d) = delta {
        if d < -th.max_regression {
            reasons.push(format!(
                "{what} regressed by {:.4} (> {:.4} allowed)",
                -d, th.max_regression
            ));
        }
    }
    if let Some(m) = th.min_accept {
        if draft_al < m {
            reasons.push(format!("{what} {draft_al:.4} is below --min-accept {m}"));
        }
    }
    Decision {
        passed: reasons.is_empty(),
        reasons,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(rounds: u64, committed: u64) -> Walk {
        Walk {
            rounds,
            committed,
            ..Walk::default()
        }
    }

    #[test]
    fn identical_drafts_give_exactly_zero() {
        let a = vec![w(10, 30), w(5, 9), w(7, 20)];
        let (d, ci) = paired_delta(&a, &a);
        assert_eq!(d, 0.0);
        assert_eq!(ci, [0.0, 0.0]);
        assert!(
            decide(
                2.9,
                Some(d),
                Thresholds {
                    max_regression: 0.03,
                    min_accept: None
                }
            )
            .passed
        );
    }

    #[test]
    fn a_worse_draft_fails_and_its_interval_is_below_zero() {
        let base: Vec<Walk> = (0..20).map(|i| w(10, 28 + i % 3)).collect();
        let worse: Vec<Walk> = (0..20).map(|i| w(10, 18 + i % 3)).collect();
        let (d, ci) = paired_delta(&worse, &base);
        assert!((d + 1.0).abs() < 1e-9, "{d}");
        assert!(ci[0] <= d && d <= ci[1] && ci[1] < 0.0, "{ci:?}");
        let dec = decide(
            micro_al(&worse.iter().collect::<Vec<_>>()),
            Some(d),
            Thresholds {
                max_regression: 0.03,
                min_accept: Some(2.5),
            },
        );
        assert!(!dec.passed);
        assert_eq!(dec.reasons.len(), 2);
    }

    #[test]
    fn interval_is_deterministic() {
        let a: Vec<Walk> = (0..9).map(|i| w(10, 20 + i)).collect();
        let b: Vec<Walk> = (0..9).map(|i| w(10, 22 + (i * 5) % 7)).collect();
        assert_eq!(paired_delta(&a, &b), paired_delta(&a, &b));
    }

    #[test]
    fn non_finite_thresholds_and_measures_fail_closed() {
        let th = |max_regression, min_accept| Thresholds {
            max_regression,
            min_accept,
        };
        for t in [
            th(f64::NAN, None),
            th(f64::INFINITY, None),
            th(0.03, Some(f64::NAN)),
            th(0.03, Some(f64::NEG_INFINITY)),
        ] {
            assert!(t.check().is_err(), "{t:?}");
            assert!(!decide(2.9, Some(-5.0), t).passed, "{t:?}");
            assert!(!decide(2.9, Some(0.0), t).passed, "{t:?}");
        }
        assert!(!decide(f64::NAN, None, th(0.03, None)).passed);
        assert!(!decide(2.9, Some(f64::NAN), th(0.03, None)).passed);
        assert!(decide(2.9, Some(0.0), th(0.03, Some(2.5))).passed);
    }
}
