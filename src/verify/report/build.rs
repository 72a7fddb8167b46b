//! The report built from the runs: the walked (and, offline, the teacher-forced) accept
//! lengths over every sample and per category, the paired Δ with its interval, the proposal
//! agreement, what the interval can say about the verdict, and the near-tie ranges.

use std::collections::BTreeMap;

use super::schema::{
    AgreementDoc, AllPositions, Category, CategoryAllPositions, NearTies, Report, Stats, TieSide,
    CONVENTIONS, SCHEMA,
};
use crate::verify::agreement::Agreement;
use crate::verify::gate::{paired_delta_on, Decision, GateOn, Thresholds};
use crate::verify::synthetic;
use crate::verify::walk::{near_ties as near_ties_of, Ties, Walk};

/// Per-sample results of one drafter.
pub struct Run {
    pub name: String,
    pub samples: Vec<Walk>,
    /// Each sample's depth matches with the proposals (for the agreement between draft and
    /// baseline); empty where not kept.
    pub matches: Vec<crate::runtime::matches::Matches>,
}

/// What a near-tie is, and what each figure of [`NearTies`] counts.
const NEAR_TIE_CONVENTION: &str = "a near-tie: a proposal whose logit is within `margin` of its runner-up's. accept_length is [every near-tie a miss, every near-tie whose runner-up is the true token a match], committed tokens per verify step; steps: verify steps of the replay's walk a near-tie decides (an accepted proposal within the margin, or the first miss within it with the true token as runner-up)";

/// A figure as the JSON document holds it: a number that is not finite is `null`, read back
/// as 0.
fn finite_or_zero(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

/// `verify --near-ties MARGIN` (docs/verify.md, "Near-ties"): per run, the accept length with
/// every near-tie turned to a miss and with every helpful one turned to a match, how many
/// requests and verify steps a near-tie decides, and the ΔAL range; per sample (in `samples`
/// order) its [`Ties`]. `None` where a run's matches kept no margins (an argmax reduced on a
/// device).
pub fn near_ties(
    draft: &Run,
    baseline: Option<&Run>,
    stops: &[usize],
    tie: f64,
) -> Option<(NearTies, Vec<Ties>, Option<Vec<Ties>>)> {
    let of = |r: &Run| -> Option<Vec<Ties>> {
        r.matches
            .iter()
            .zip(stops)
            .map(|(m, &stop)| near_ties_of(m, stop, tie))
            .collect()
    };
    let d = of(draft)?;
    let b = match baseline {
        Some(b) => Some(of(b)?),
        None => None,
    };
    let side = |ts: &[Ties]| {
        let down = total(&ts.iter().map(|t| &t.down).collect::<Vec<_>>());
        let up = total(&ts.iter().map(|t| &t.up).collect::<Vec<_>>());
        TieSide {
            accept_length: [down.al_walk(), up.al_walk()],
            requests_with_ties: ts.iter().filter(|t| t.steps > 0).count(),
            steps: ts.iter().map(|t| t.steps).sum::<u64>(),
        }
    };
    let mut doc = NearTies {
        margin: tie,
        convention: NEAR_TIE_CONVENTION,
        draft: side(&d),
        baseline: None,
        delta: None,
    };
    if let Some(b) = &b {
        let [lo, hi] = doc.draft.accept_length.map(finite_or_zero);
        let bs = side(b);
        let [blo, bhi] = bs.accept_length.map(finite_or_zero);
        doc.baseline = Some(bs);
        doc.delta = Some([lo - bhi, hi - blo]);
    }
    Some((doc, d, b))
}

/// The draft's and the baseline's proposal agreement over the samples `idx`, or `None` where
/// either run did not keep its proposals.
pub fn agreement_of(draft: &Run, baseline: &Run, idx: &[usize]) -> Option<Agreement> {
    let mut g = Agreement::default();
    for &i in idx {
        g.add(&Agreement::of(
            draft.matches.get(i)?,
            baseline.matches.get(i)?,
        )?);
    }
    Some(g)
}

fn agreement_doc(g: &Agreement) -> AgreementDoc {
    AgreementDoc {
        per_depth: g.rates(),
        overall: g.overall(),
        compared: g.compared.clone(),
        agree: g.agree.clone(),
    }
}

fn total(ws: &[&Walk]) -> Walk {
    let mut t = Walk::default();
    for w in ws {
        t.add(w);
    }
    t
}

/// A run's figures over the samples `w` totals, under its name.
fn stats(name: &str, w: &Walk) -> Stats {
    // A live measurement has the engine's steps and committed tokens only: no teacher-forced
    // positions, so none of the figures that come from them.
    let tf = w.positions > 0 || w.rounds == 0;
    Stats {
        accept_length: w.al_walk(),
        accept_length_engine: w.al_engine(),
        accept_length_sglang_request: w.al_sglang_request(),
        accept_length_all_positions: tf.then(|| w.al_allpos()),
        conditional_acceptance: tf.then(|| w.conditional()),
        // Not measured when pass A skipped the depths after a miss (`--after-miss skip`).
        unconditional_acceptance: (tf && !w.after_miss_skipped).then(|| w.unconditional()),
        simulated_accept_length: (tf && !w.after_miss_skipped).then(|| w.simulated()),
        rounds: w.rounds,
        name: name.to_string(),
        requests: None,
    }
}

/// Below this many paired samples the bootstrap interval is said not to mean a 95 % interval.
pub const MIN_CI_SAMPLES: usize = 20;

/// The runs a report is built over, and how the Δ of a set of samples is taken.
struct Runs<'a> {
    draft: &'a Run,
    baseline: Option<&'a Run>,
    /// Teacher-forced positions exist offline only (a live measurement has steps and tokens).
    teacher_forced: bool,
}

impl Runs<'_> {
    /// A run's samples `idx`, totalled.
    fn part(r: &Run, idx: &[usize]) -> Walk {
        total(&idx.iter().map(|&i| &r.samples[i]).collect::<Vec<_>>())
    }

    /// The paired Δ over the samples `idx` and its interval (`None` without a baseline).
    fn delta(&self, idx: &[usize], on: GateOn) -> Option<(f64, [f64; 2])> {
        self.baseline.map(|b| {
            let d: Vec<Walk> = idx.iter().map(|&i| self.draft.samples[i].clone()).collect();
            let bb: Vec<Walk> = idx.iter().map(|&i| b.samples[i].clone()).collect();
            paired_delta_on(&d, &bb, on)
        })
    }

    fn agreement(&self, idx: &[usize]) -> Option<AgreementDoc> {
        self.baseline
            .and_then(|b| agreement_of(self.draft, b, idx))
            .map(|g| agreement_doc(&g))
    }

    /// One category's figures.
    fn category(&self, idx: &[usize]) -> Category {
        let d = Self::part(self.draft, idx);
        let b = self.baseline.map(|b| Self::part(b, idx));
        let dl = self.delta(idx, GateOn::Walk);
        Category {
            n: idx.len(),
            draft: d.al_walk(),
            baseline: b.as_ref().map(Walk::al_walk),
            draft_engine: d.al_engine(),
            baseline_engine: b.as_ref().and_then(Walk::al_engine),
            delta: dl.map(|x| x.0),
            ci95: dl.map(|x| x.1),
            agreement: self.agreement(idx),
            all_positions: self.teacher_forced.then(|| {
                let tl = self.delta(idx, GateOn::AllPositions);
                CategoryAllPositions {
                    draft_all_positions: d.al_allpos(),
                    baseline_all_positions: b.as_ref().map(Walk::al_allpos),
                    delta_all_positions: tl.map(|x| x.0),
                    ci95_all_positions: tl.map(|x| x.1),
                }
            }),
        }
    }
}

/// What the interval of the gated Δ (`gated`: the Δ and its interval) can and cannot say
/// about this verdict over `n` samples.
fn interval_notes(
    gated: Option<(f64, [f64; 2])>,
    n: usize,
    th: Thresholds,
    on: GateOn,
) -> Vec<String> {
    let mut notes: Vec<String> = Vec::new();
    if let Some((d, [lo, hi])) = gated {
        if n < MIN_CI_SAMPLES {
            notes.push(format!(
                "too few prompts for the interval: {n} (a paired bootstrap needs about {MIN_CI_SAMPLES} to mean a 95 % interval)"
            ));
        }
        let t = -th.max_regression;
        if lo < t && t < hi {
            notes.push(format!(
                "the {}interval [{lo:+.3}, {hi:+.3}] straddles the threshold {t:+.3}: the verdict ({}) rests on the point estimate {d:+.3}; more prompts would settle it",
                if on == GateOn::AllPositions { "all-positions Δ's " } else { "" },
                if d >= t { "pass" } else { "fail" }
            ));
        }
    }
    notes
}

/// Build the report, gated on accept length `on` (`verify --gate-on`; live verify gates on
/// [`GateOn::Walk`]). `categories[i]` is sample i's category. Where the samples are
/// teacher-forced (offline), the all-positions accept length is reported beside the walked one
/// with a baseline's and its paired Δ and interval, overall and per category.
pub fn build_on(
    draft: &Run,
    baseline: Option<&Run>,
    categories: &[String],
    th: Thresholds,
    decision: &Decision,
    steps: usize,
    on: GateOn,
) -> Report {
    let all: Vec<usize> = (0..draft.samples.len()).collect();
    let mut cats: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, c) in categories.iter().enumerate() {
        cats.entry(c.as_str()).or_default().push(i);
    }
    let runs = Runs {
        draft,
        baseline,
        teacher_forced: draft.samples.iter().any(|w| w.positions > 0)
            && baseline.is_none_or(|b| b.samples.iter().any(|w| w.positions > 0)),
    };
    let walk = runs.delta(&all, GateOn::Walk);
    let tf_delta = runs
        .teacher_forced
        .then(|| runs.delta(&all, GateOn::AllPositions))
        .flatten();
    let gated = match on {
        GateOn::Walk => walk,
        GateOn::AllPositions => tf_delta,
    };
    Report {
        schema: SCHEMA,
        interval_notes: interval_notes(gated, draft.samples.len(), th, on),
        conventions: CONVENTIONS,
        gated_on: on,
        steps,
        samples: draft.samples.len(),
        draft: stats(&draft.name, &Runs::part(draft, &all)),
        baseline: baseline.map(|b| stats(&b.name, &Runs::part(b, &all))),
        delta: walk.map(|x| x.0),
        ci95: walk.map(|x| x.1),
        agreement: runs.agreement(&all),
        max_regression: th.max_regression,
        min_accept: th.min_accept,
        passed: decision.passed,
        reasons: decision.reasons.clone(),
        per_category: cats
            .iter()
            .map(|(c, idx)| (c.to_string(), runs.category(idx)))
            .collect(),
        all_positions: (runs.teacher_forced && baseline.is_some()).then(|| AllPositions {
            delta_all_positions: tf_delta.map(|x| x.0),
            ci95_all_positions: tf_delta.map(|x| x.1),
        }),
        tail: None,
        synthetic_acceptance: Some(synthetic::of(
            &draft.samples,
            categories,
            steps,
            if runs.teacher_forced {
                synthetic::SOURCE_WALK
            } else {
                synthetic::SOURCE_ENGINE
            },
        )),
        degenerate: None,
    }
}
