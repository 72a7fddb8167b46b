//! The degenerate-output check every verify runs (docs/verify.md, "Degenerate output"):
//! figures that come from output no real workload produces. Three causes, each with its
//! thresholds below:
//!
//! - **a repetition loop**: a request's continuation ends in a short cycle repeated to its end
//!   (a raw-completion benchmark of a chat model looping on two tokens: every draft accepted);
//!   said per request, and raised for a set where most of its requests loop;
//! - **an accept length at or near K+1** over a set: nearly every draft of every step accepted;
//! - **a per-depth acceptance of exactly 0 or 1** over a set: a draft that accepts nothing (a
//!   synthetic or broken draft, accept length 1.000) or a draft that sees the token it is asked
//!   to predict (an off-by-one tap).
//!
//! The findings go to the report (`degenerate`), as `note:` lines in the table, and
//! `verify --fail-on-degenerate` makes them an error (exit 2: bad data, not a gate verdict).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::verify::walk::Walk;

/// A loop's cycle is at most this many tokens.
pub const LOOP_MAX_PERIOD: usize = 8;
/// A loop repeats its cycle at least this many times…
pub const LOOP_MIN_REPEATS: usize = 4;
/// …over at least this many tokens…
pub const LOOP_MIN_TOKENS: usize = 16;
/// …that are at least this share of the continuation.
pub const LOOP_MIN_SHARE: f64 = 0.5;
/// A set is raised for loops when at least this share of its requests loop.
pub const LOOP_SET_SHARE: f64 = 0.5;
/// A set's accept length is near K+1 when its steps accept at least this share of K drafts on
/// average, i.e. AL ≥ 1 + 0.9·K.
pub const NEAR_MAX_SHARE: f64 = 0.9;
/// A set is judged for its accept length only over at least this many verify steps.
pub const MIN_STEPS: u64 = 20;
/// A depth's rate is judged only over at least this many positions (verify steps, live): a
/// draft whose first draft is accepted with probability p is accepted at every one of n steps
/// with probability pⁿ, under 1 % for p ≤ 0.95 at n = 100.
pub const MIN_AT_DEPTH: u64 = 100;
/// A set is raised for loops only when at least this many of its requests loop.
pub const LOOP_MIN_REQUESTS: usize = 3;
/// Text without token ids (a live response that returned none) is checked as characters,
/// a token counted as this many.
pub const CHARS_PER_TOKEN: usize = 4;

/// Why a set's figures are said to be degenerate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    RepetitionLoop,
    AcceptLengthNearMax,
    PerDepthRateExact,
}

impl Cause {
    /// The cause as the table names it.
    pub fn name(self) -> &'static str {
        match self {
            Cause::RepetitionLoop => "repetition loop",
            Cause::AcceptLengthNearMax => "accept length near K+1",
            Cause::PerDepthRateExact => "per-depth acceptance exactly 0 or 1",
        }
    }
}

/// A set whose figures are degenerate.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub cause: Cause,
    /// `draft` or `baseline` (a loop: the continuations the side generated; offline both
    /// replay the trace's, named `trace`).
    pub side: String,
    /// `overall` or the category.
    pub scope: String,
    pub detail: String,
}

/// A request whose continuation ends in a loop.
#[derive(Debug, Clone, Serialize)]
pub struct LoopingRequest {
    pub side: String,
    pub id: String,
    pub category: String,
    /// The cycle's length and the looping tail's, in tokens (characters where the response
    /// had no token ids).
    pub period: usize,
    pub tail: usize,
    pub length: usize,
    pub unit: &'static str,
}

/// The thresholds, stated in the report.
#[derive(Debug, Clone, Serialize)]
pub struct Thresholds {
    pub loop_max_period: usize,
    pub loop_min_repeats: usize,
    pub loop_min_tokens: usize,
    pub loop_min_share: f64,
    pub loop_set_share: f64,
    pub loop_min_requests: usize,
    pub near_max_share: f64,
    pub min_steps: u64,
    pub min_at_depth: u64,
}

const THRESHOLDS: Thresholds = Thresholds {
    loop_max_period: LOOP_MAX_PERIOD,
    loop_min_repeats: LOOP_MIN_REPEATS,
    loop_min_tokens: LOOP_MIN_TOKENS,
    loop_min_share: LOOP_MIN_SHARE,
    loop_set_share: LOOP_SET_SHARE,
    loop_min_requests: LOOP_MIN_REQUESTS,
    near_max_share: NEAR_MAX_SHARE,
    min_steps: MIN_STEPS,
    min_at_depth: MIN_AT_DEPTH,
};

/// The report's `degenerate`.
#[derive(Debug, Clone, Serialize)]
pub struct Degenerate {
    /// Whether any set was found degenerate (a looping request alone does not raise it).
    pub flagged: bool,
    pub findings: Vec<Finding>,
    pub looping_requests: Vec<LoopingRequest>,
    pub thresholds: Thresholds,
}

/// A loop at the end of a continuation: its period and the looping tail's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loop {
    pub period: usize,
    pub tail: usize,
}

/// The longest tail of `x` that is periodic with a period of at most `max_period`, taking the
/// shortest period for that length: `(period, tail)`, the tail counting the first cycle.
pub fn periodic_tail<T: PartialEq>(x: &[T], max_period: usize) -> Option<Loop> {
    let mut best: Option<Loop> = None;
    for p in 1..=max_period.min(x.len() / 2) {
        // x[i] == x[i + p] for every i of the tail but its last p.
        let mut start = x.len() - p;
        while start > 0 && x[start - 1] == x[start - 1 + p] {
            start -= 1;
        }
        let tail = x.len() - start;
        if best.is_none_or(|b| tail > b.tail) {
            best = Some(Loop { period: p, tail });
        }
    }
    best
}

/// A loop by the thresholds (`scale` units a token: 1 for tokens, [`CHARS_PER_TOKEN`] for
/// characters).
pub fn find_loop<T: PartialEq>(x: &[T], scale: usize) -> Option<Loop> {
    let l = periodic_tail(x, LOOP_MAX_PERIOD * scale)?;
    (l.tail >= l.period * LOOP_MIN_REPEATS
        && l.tail >= LOOP_MIN_TOKENS * scale
        && l.tail as f64 >= LOOP_MIN_SHARE * x.len() as f64)
        .then_some(l)
}

/// A request's continuation, as a response or a trace gives it.
#[derive(Debug, Clone, Copy)]
pub enum Continuation<'a> {
    Tokens(&'a [u32]),
    Text(&'a str),
}

/// One side's requests: their walks and continuations, in the order of `categories`.
pub struct Side<'a> {
    pub name: &'a str,
    /// The side's walks (`None`: continuations only, offline the trace's).
    pub walks: Option<&'a [Walk]>,
    /// Each request's id and continuation (`None`: not known); empty where the side's
    /// continuations are checked under another side's name (offline: the trace's, once).
    pub continuations: Vec<(String, Option<Continuation<'a>>)>,
}

/// The check over each side, overall and per category (`categories[i]` is request i's), K =
/// `k` drafts a step.
pub fn check(sides: &[Side], categories: &[String], k: usize) -> Degenerate {
    let mut cats: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, c) in categories.iter().enumerate() {
        cats.entry(c.as_str()).or_default().push(i);
    }
    let all: Vec<usize> = (0..categories.len()).collect();
    let scopes: Vec<(&str, &[usize])> = std::iter::once(("overall", all.as_slice()))
        .chain(cats.iter().map(|(c, v)| (*c, v.as_slice())))
        .collect();
    let mut findings = Vec::new();
    let mut looping_requests = Vec::new();
    for side in sides {
        let looping = loops(side, categories, &mut looping_requests);
        for &(scope, idx) in &scopes {
            let mut found = |cause, detail: String| {
                findings.push(Finding {
                    cause,
                    side: side.name.to_string(),
                    scope: scope.to_string(),
                    detail,
                })
            };
            if !side.continuations.is_empty() {
                let n = idx.iter().filter(|&&i| looping[i]).count();
                if n >= LOOP_MIN_REQUESTS && n as f64 >= LOOP_SET_SHARE * idx.len() as f64 {
                    found(Cause::RepetitionLoop, format!(
                        "{n} of {} requests end in a cycle of at most {LOOP_MAX_PERIOD} tokens repeated to the end",
                        idx.len()
                    ));
                }
            }
            let Some(walks) = side.walks else {
                continue;
            };
            let w = Walk::sum(idx.iter().map(|&i| &walks[i]));
            if let Some(d) = near_max(&w, k) {
                found(Cause::AcceptLengthNearMax, d);
            }
            let exact = exact_depths(&w);
            if !exact.is_empty() {
                found(Cause::PerDepthRateExact, exact.join("; "));
            }
        }
    }
    Degenerate {
        flagged: !findings.is_empty(),
        findings,
        looping_requests,
        thresholds: THRESHOLDS,
    }
}

/// Which of a side's requests loop (listed in `out`).
fn loops(side: &Side, categories: &[String], out: &mut Vec<LoopingRequest>) -> Vec<bool> {
    let mut looping = vec![false; categories.len()];
    for (i, (id, c)) in side.continuations.iter().enumerate() {
        let (l, len, unit) = match c {
            Some(Continuation::Tokens(t)) => (find_loop(t, 1), t.len(), "tokens"),
            Some(Continuation::Text(s)) => {
                let ch: Vec<char> = s.chars().collect();
                (find_loop(&ch, CHARS_PER_TOKEN), ch.len(), "characters")
            }
            None => (None, 0, "tokens"),
        };
        if let Some(l) = l {
            looping[i] = true;
            out.push(LoopingRequest {
                side: side.name.to_string(),
                id: id.clone(),
                category: categories[i].clone(),
                period: l.period,
                tail: l.tail,
                length: len,
                unit,
            });
        }
    }
    looping
}

/// A set's steps accepting nearly every draft.
fn near_max(w: &Walk, k: usize) -> Option<String> {
    if w.rounds < MIN_STEPS || k == 0 {
        return None;
    }
    let al = w.al_walk();
    (al >= 1.0 + NEAR_MAX_SHARE * k as f64).then(|| {
        format!(
            "accept length {al:.3} over {} steps, at least 1 + {NEAR_MAX_SHARE}·K = {:.3} (K = {k})",
            w.rounds,
            1.0 + NEAR_MAX_SHARE * k as f64
        )
    })
}

/// The depths whose unconditional acceptance is exactly 0 or 1 over at least
/// [`MIN_AT_DEPTH`] positions (teacher-forced, offline) or verify steps (live, from the
/// engine's histogram): a depth that never matches (depth 0: nothing accepted, AL 1.000), or
/// a first draft accepted everywhere (with the deeper depths accepted at every step).
fn exact_depths(w: &Walk) -> Vec<String> {
    let says = |depth: usize, n: u64, of: u64, what: &str| {
        format!(
            "depth {depth} accepted {n} of {of} {what} ({})",
            if n == 0 { "exactly 0" } else { "exactly 1" }
        )
    };
    let mut out = Vec::new();
    if w.positions > 0 {
        let what = "teacher-forced positions";
        let at0 = w.cond_den.first().copied().unwrap_or(0);
        if at0 < MIN_AT_DEPTH {
            return out;
        }
        for d in 0..w.cond_num.len() {
            // Matched at no position: `uncond` counts the positions where depth d was compared
            // (`at_depth`: a short sample has no token at its deeper depths, which is no miss),
            // with `--after-miss skip` only those whose earlier depths matched: the conditional
            // count, over the positions that reached it.
            let (n, of) = if w.after_miss_skipped {
                (w.cond_num[d], w.cond_den[d])
            } else {
                (
                    w.uncond.get(d).copied().unwrap_or(0),
                    w.at_depth.get(d).copied().unwrap_or(0),
                )
            };
            if n == 0 && of >= MIN_AT_DEPTH {
                out.push(says(d, 0, of, what));
            }
        }
        if w.cond_num[0] == at0 {
            out.push(says(0, at0, at0, what));
        }
    } else if !w.accepted_hist.is_empty() && w.accepted_hist.iter().sum::<u64>() == w.rounds {
        // Only where the histogram counts every step of the set: a set whose responses carry
        // it only in part says nothing of the others' steps.
        let what = "verify steps";
        let at_least = |k: usize| w.accepted_hist.iter().skip(k).sum::<u64>();
        if w.rounds < MIN_AT_DEPTH {
            return out;
        }
        if at_least(1) == 0 {
            out.push(says(0, 0, w.rounds, what));
        }
        for k in 1..w.accepted_hist.len() {
            if at_least(k) == w.rounds {
                out.push(says(k - 1, w.rounds, w.rounds, what));
            }
        }
    } else {
        // No histogram (server counters, TensorRT-LLM), or one for only some of the set's
        // requests: only "nothing accepted" is known.
        let accepted = (w.committed + w.engine_extra).saturating_sub(w.rounds);
        if w.rounds >= MIN_AT_DEPTH && accepted == 0 {
            out.push(says(0, 0, w.rounds, "verify steps"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_cycle_to_the_end_is_a_loop_and_prose_is_not() {
        let mut x: Vec<u32> = (0..40).collect();
        x.extend([7, 9].repeat(30));
        assert_eq!(
            find_loop(&x, 1),
            Some(Loop {
                period: 2,
                tail: 60
            })
        );
        // The same cycle stopping before the end is not "repeated to the end".
        x.extend(100..160);
        assert_eq!(find_loop(&x, 1), None);
        // Too short a share of the continuation.
        let mut y: Vec<u32> = (0..100).collect();
        y.extend([5].repeat(20));
        assert_eq!(find_loop(&y, 1), None);
        // A cycle longer than LOOP_MAX_PERIOD is not a short loop.
        let z: Vec<u32> = (0..9).cycle().take(90).collect();
        assert_eq!(find_loop(&z, 1), None);
        // Characters: the thresholds scaled.
        let s: Vec<char> = "ab".repeat(40).chars().collect();
        assert!(find_loop(&s, CHARS_PER_TOKEN).is_some());
    }

    /// A request's walk: `hist[j]` rounds that committed j drafts, no teacher-forced positions
    /// (as a live one), or `tf` = (cond_num, cond_den, uncond) per depth.
    fn walk(hist: &[u64], tf: Option<[Vec<u64>; 3]>) -> Walk {
        let rounds: u64 = hist.iter().sum();
        let drafts: u64 = hist.iter().enumerate().map(|(j, c)| j as u64 * c).sum();
        let mut w = Walk {
            rounds,
            committed: rounds + drafts,
            requests: 1,
            accepted_hist: hist.to_vec(),
            ..Walk::default()
        };
        if let Some([num, den, uncond]) = tf {
            w.positions = den[0];
            // Long samples: every depth compared at every position.
            w.at_depth = vec![den[0]; den.len()];
            w.cond_num = num;
            w.cond_den = den;
            w.uncond = uncond;
        }
        w
    }

    fn causes(d: &Degenerate) -> Vec<(Cause, String, String)> {
        d.findings
            .iter()
            .map(|f| (f.cause, f.side.clone(), f.scope.clone()))
            .collect()
    }

    fn cats(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| if i % 2 == 0 { "a" } else { "b" }.to_string())
            .collect()
    }

    /// A healthy set: mixed acceptance, prose-like continuations: nothing found.
    fn healthy() -> Vec<Walk> {
        (0..4).map(|_| walk(&[10, 10, 10, 10], None)).collect()
    }

    #[test]
    fn loops_in_most_requests_raise_the_set_and_each_looping_request_is_listed() {
        let prose: Vec<Vec<u32>> = (0..6).map(|i| (i * 100..i * 100 + 96).collect()).collect();
        let mut looped = prose.clone();
        for t in looped.iter_mut().take(4) {
            t.truncate(16);
            t.extend([3, 4].repeat(40));
        }
        let w: Vec<Walk> = (0..6).map(|_| walk(&[10, 10, 10, 10], None)).collect();
        let run = |conts: &[Vec<u32>]| {
            let side = Side {
                name: "draft",
                walks: Some(&w),
                continuations: conts
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (i.to_string(), Some(Continuation::Tokens(t))))
                    .collect(),
            };
            check(&[side], &cats(6), 3)
        };
        let ok = run(&prose);
        assert!(!ok.flagged && ok.looping_requests.is_empty(), "{ok:?}");
        // Requests 0..4 loop: 4 of 6 overall (raised); 2 of 3 in each category, fewer than
        // LOOP_MIN_REQUESTS (listed, not raised).
        let d = run(&looped);
        assert_eq!(d.looping_requests.len(), 4);
        assert_eq!(d.looping_requests[0].period, 2);
        assert!(d.flagged);
        assert_eq!(
            causes(&d),
            vec![(
                Cause::RepetitionLoop,
                "draft".to_string(),
                "overall".to_string()
            )]
        );
        // Two looping requests of six are listed, not raised.
        let mut two = prose.clone();
        two[..2].clone_from_slice(&looped[..2]);
        let d = run(&two);
        assert_eq!(d.looping_requests.len(), 2);
        assert!(!d.flagged, "{d:?}");
    }

    #[test]
    fn an_accept_length_near_k_plus_1_over_a_set_is_raised() {
        // K = 3: 1 + 0.9·3 = 3.7. 80 steps all accepting 3 but 10 accepting 1: AL 3.75.
        let near: Vec<Walk> = (0..4).map(|_| walk(&[0, 3, 0, 17], None)).collect();
        let d = check(
            &[Side {
                name: "draft",
                walks: Some(&near),
                continuations: Vec::new(),
            }],
            &cats(4),
            3,
        );
        assert!(causes(&d).contains(&(
            Cause::AcceptLengthNearMax,
            "draft".into(),
            "overall".into()
        )));
        // Below the threshold (AL 3.5): not near K+1.
        let below: Vec<Walk> = (0..4).map(|_| walk(&[0, 5, 0, 15], None)).collect();
        let d = check(
            &[Side {
                name: "draft",
                walks: Some(&below),
                continuations: Vec::new(),
            }],
            &cats(4),
            3,
        );
        assert!(
            !causes(&d).iter().any(|c| c.0 == Cause::AcceptLengthNearMax),
            "{d:?}"
        );
        // Too few steps to say.
        let few = vec![walk(&[0, 0, 0, 5], None)];
        let d = check(
            &[Side {
                name: "draft",
                walks: Some(&few),
                continuations: Vec::new(),
            }],
            &["a".into()],
            3,
        );
        assert!(!causes(&d).iter().any(|c| c.0 == Cause::AcceptLengthNearMax));
    }

    /// Short samples compare their deeper depths at few positions or none: a depth never
    /// compared is no "accepted 0"; one compared at enough positions and never matched is.
    #[test]
    fn a_depth_no_sample_reaches_is_not_an_exact_0() {
        let side = |w| Side {
            name: "draft",
            walks: Some(w),
            continuations: Vec::new(),
        };
        // 60 samples of 3 generated tokens: depth 0 compared at 120 positions, depth 1 at 60,
        // depth 2 at none.
        let short = |uncond: Vec<u64>| {
            let mut w = walk(&[1, 1], None);
            w.positions = 2;
            w.cond_den = vec![2, 1, 0];
            w.cond_num = vec![1, 1, 0];
            w.uncond = uncond;
            w.at_depth = vec![2, 1, 0];
            w
        };
        let walks: Vec<Walk> = (0..60).map(|_| short(vec![1, 1, 0])).collect();
        let d = check(&[side(&walks)], &cats(60), 3);
        assert!(!d.flagged, "{d:?}");
        // Depth 1 compared at 120 positions and never matched: raised, out of those 120.
        let walks: Vec<Walk> = (0..120)
            .map(|_| {
                let mut w = short(vec![1, 0, 0]);
                w.cond_num = vec![1, 0, 0];
                w
            })
            .collect();
        let d = check(&[side(&walks)], &cats(120), 3);
        let exact: Vec<&str> = d
            .findings
            .iter()
            .filter(|f| f.scope == "overall")
            .map(|f| f.detail.as_str())
            .collect();
        assert_eq!(
            exact,
            ["depth 1 accepted 0 of 120 teacher-forced positions (exactly 0)"]
        );
    }

    /// A live set where only some responses carry the per-step histogram: the histogram counts
    /// only their steps, so it says nothing of "every step" or "no step".
    #[test]
    fn a_histogram_of_part_of_the_set_is_not_read_as_the_whole() {
        let side = |w| Side {
            name: "draft",
            walks: Some(w),
            continuations: Vec::new(),
        };
        // 60 requests: 30 with a histogram whose steps accepted nothing, 30 without one that
        // accepted 2 drafts a step.
        let walks: Vec<Walk> = (0..60)
            .map(|i| {
                if i % 2 == 0 {
                    walk(&[10], None)
                } else {
                    let mut w = walk(&[0, 0, 10], None);
                    w.accepted_hist.clear();
                    w
                }
            })
            .collect();
        let d = check(&[side(&walks)], &cats(60), 3);
        assert!(
            !d.findings.iter().any(|f| f.scope == "overall"),
            "{:?}",
            d.findings
        );
        // Category `a` alone is all histogram and accepted nothing: raised.
        assert!(d
            .findings
            .iter()
            .any(|f| f.scope == "a"
                && f.detail == "depth 0 accepted 0 of 300 verify steps (exactly 0)"));
    }

    #[test]
    fn a_per_depth_acceptance_of_exactly_0_or_1_is_raised() {
        let side = |w| Side {
            name: "baseline",
            walks: Some(w),
            continuations: Vec::new(),
        };
        // Teacher-forced: no depth ever matched (a draft that accepts nothing).
        let none: Vec<Walk> = (0..2)
            .map(|_| walk(&[40], Some([vec![0, 0, 0], vec![60, 0, 0], vec![0, 0, 0]])))
            .collect();
        let d = check(&[side(&none)], &cats(2), 3);
        assert!(d
            .findings
            .iter()
            .any(|f| f.cause == Cause::PerDepthRateExact
                && f.scope == "overall"
                && f.detail.starts_with("depth 0 accepted 0 of 120")));
        // Teacher-forced: the first draft matched at every position (a draft that sees the
        // token it predicts).
        let all: Vec<Walk> = (0..2)
            .map(|_| {
                walk(
                    &[10, 10, 10, 10],
                    Some([vec![60, 50, 30], vec![60, 60, 50], vec![60, 55, 40]]),
                )
            })
            .collect();
        let d = check(&[side(&all)], &cats(2), 3);
        let exact: Vec<&str> = d
            .findings
            .iter()
            .filter(|f| f.cause == Cause::PerDepthRateExact)
            .map(|f| f.detail.as_str())
            .collect();
        assert_eq!(
            exact,
            ["depth 0 accepted 120 of 120 teacher-forced positions (exactly 1)"]
        );
        // Live, from the histogram: every step accepted every draft.
        let full: Vec<Walk> = (0..2).map(|_| walk(&[0, 0, 0, 60], None)).collect();
        let d = check(&[side(&full)], &cats(2), 3);
        let exact: Vec<&Finding> = d
            .findings
            .iter()
            .filter(|f| f.cause == Cause::PerDepthRateExact && f.scope == "overall")
            .collect();
        assert_eq!(exact.len(), 1, "{d:?}");
        assert_eq!(exact[0].detail.matches("(exactly 1)").count(), 3, "{d:?}");
        // Live, from the histogram: nothing accepted.
        let zero: Vec<Walk> = (0..2).map(|_| walk(&[60], None)).collect();
        let d = check(&[side(&zero)], &cats(2), 3);
        assert!(d
            .findings
            .iter()
            .any(|f| f.detail == "depth 0 accepted 0 of 120 verify steps (exactly 0)"));
        // A healthy set and too few positions: nothing.
        let h = healthy();
        let d = check(&[side(&h)], &cats(4), 3);
        assert!(!d.flagged, "{d:?}");
        let few = vec![walk(
            &[10],
            Some([vec![0, 0, 0], vec![10, 0, 0], vec![0, 0, 0]]),
        )];
        assert!(!check(&[side(&few)], &["a".into()], 3).flagged);
    }
}
