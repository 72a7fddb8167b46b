//! Verify results as people and CI read them: a table like the seed model cards (category, N,
//! AL baseline, AL draft, Δ), the JSON document, and JUnit XML (the gate, each threshold, each
//! category).

use crate::io::output::{self, Kind};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::agreement::Agreement;
use super::gate::{paired_delta_on, Decision, GateOn, Thresholds};
use super::walk::{near_ties as near_ties_of, Ties, Walk};

/// Per-sample results of one drafter.
pub struct Run {
    pub name: String,
    pub samples: Vec<Walk>,
    /// Each sample's depth matches with the proposals (for the agreement between draft and
    /// baseline); empty where not kept.
    pub matches: Vec<crate::runtime::matches::Matches>,
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
) -> Option<(Value, Vec<Ties>, Option<Vec<Ties>>)> {
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
        json!({
            "accept_length": [down.al_walk(), up.al_walk()],
            "requests_with_ties": ts.iter().filter(|t| t.steps > 0).count(),
            "steps": ts.iter().map(|t| t.steps).sum::<u64>(),
        })
    };
    let mut doc = json!({
        "margin": tie,
        "convention": "a near-tie: a proposal whose logit is within `margin` of its runner-up's. accept_length is [every near-tie a miss, every near-tie whose runner-up is the true token a match], committed tokens per verify step; steps: verify steps of the replay's walk a near-tie decides (an accepted proposal within the margin, or the first miss within it with the true token as runner-up)",
        "draft": side(&d),
    });
    if let Some(b) = &b {
        let lo = doc["draft"]["accept_length"][0].as_f64().unwrap_or(0.0);
        let hi = doc["draft"]["accept_length"][1].as_f64().unwrap_or(0.0);
        let bs = side(b);
        let blo = bs["accept_length"][0].as_f64().unwrap_or(0.0);
        let bhi = bs["accept_length"][1].as_f64().unwrap_or(0.0);
        doc["baseline"] = bs;
        doc["delta"] = json!([lo - bhi, hi - blo]);
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

fn agreement_json(g: &Agreement) -> Value {
    json!({
        "per_depth": g.rates(),
        "overall": g.overall(),
        "compared": g.compared,
        "agree": g.agree,
    })
}

fn total(ws: &[&Walk]) -> Walk {
    let mut t = Walk::default();
    for w in ws {
        t.add(w);
    }
    t
}

fn stats(w: &Walk) -> Value {
    // A live measurement has the engine's steps and committed tokens only: no teacher-forced
    // positions, so none of the figures that come from them.
    let tf = w.positions > 0 || w.rounds == 0;
    json!({
        "accept_length": w.al_walk(),
        "accept_length_engine": w.al_engine(),
        "accept_length_sglang_request": w.al_sglang_request(),
        "accept_length_all_positions": tf.then(|| w.al_allpos()),
        "conditional_acceptance": tf.then(|| w.conditional()),
        // Not measured when pass A skipped the depths after a miss (`--after-miss skip`).
        "unconditional_acceptance": (tf && !w.after_miss_skipped).then(|| w.unconditional()),
        "simulated_accept_length": (tf && !w.after_miss_skipped).then(|| w.simulated()),
        "rounds": w.rounds,
    })
}

fn named(name: &str, w: &Walk) -> Value {
    let mut v = stats(w);
    v["name"] = json!(name);
    v
}

/// Below this many paired samples the bootstrap interval is said not to mean a 95 % interval.
pub const MIN_CI_SAMPLES: usize = 20;

/// Build the report, gated on the walked accept length. `categories[i]` is sample i's category.
pub fn build(
    draft: &Run,
    baseline: Option<&Run>,
    categories: &[String],
    th: Thresholds,
    decision: &Decision,
    steps: usize,
) -> Value {
    build_on(
        draft,
        baseline,
        categories,
        th,
        decision,
        steps,
        GateOn::Walk,
    )
}

/// Build the report, gated on accept length `on` (`verify --gate-on`). Where the samples are
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
) -> Value {
    let all: Vec<usize> = (0..draft.samples.len()).collect();
    let mut cats: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, c) in categories.iter().enumerate() {
        cats.entry(c.as_str()).or_default().push(i);
    }
    // Teacher-forced positions exist offline only (a live measurement has steps and tokens).
    let teacher_forced = draft.samples.iter().any(|w| w.positions > 0)
        && baseline.is_none_or(|b| b.samples.iter().any(|w| w.positions > 0));
    let part =
        |r: &Run, idx: &[usize]| total(&idx.iter().map(|&i| &r.samples[i]).collect::<Vec<_>>());
    let delta_of = |idx: &[usize], on: GateOn| {
        baseline.map(|b| {
            let d: Vec<Walk> = idx.iter().map(|&i| draft.samples[i].clone()).collect();
            let bb: Vec<Walk> = idx.iter().map(|&i| b.samples[i].clone()).collect();
            paired_delta_on(&d, &bb, on)
        })
    };
    let (delta, ci) = match delta_of(&all, GateOn::Walk) {
        Some((d, ci)) => (Some(d), Some(ci)),
        None => (None, None),
    };
    let tf_delta = teacher_forced
        .then(|| delta_of(&all, GateOn::AllPositions))
        .flatten();
    let per_category: serde_json::Map<String, Value> = cats
        .iter()
        .map(|(c, idx)| {
            let d = part(draft, idx);
            let b = baseline.map(|b| part(b, idx));
            let dl = delta_of(idx, GateOn::Walk);
            let mut v = json!({
                "n": idx.len(),
                "draft": d.al_walk(),
                "baseline": b.as_ref().map(Walk::al_walk),
                "draft_engine": d.al_engine(),
                "baseline_engine": b.as_ref().and_then(Walk::al_engine),
                "delta": dl.map(|x| x.0),
                "ci95": dl.map(|x| x.1),
                "agreement": baseline
                    .and_then(|b| agreement_of(draft, b, idx))
                    .map(|g| agreement_json(&g)),
            });
            if teacher_forced {
                let tl = delta_of(idx, GateOn::AllPositions);
                v["draft_all_positions"] = json!(d.al_allpos());
                v["baseline_all_positions"] = json!(b.as_ref().map(Walk::al_allpos));
                v["delta_all_positions"] = json!(tl.map(|x| x.0));
                v["ci95_all_positions"] = json!(tl.map(|x| x.1));
            }
            (c.to_string(), v)
        })
        .collect();
    // What the interval of the gated Δ can and cannot say about this verdict.
    let mut interval_notes: Vec<String> = Vec::new();
    let gated = match on {
        GateOn::Walk => delta.zip(ci),
        GateOn::AllPositions => tf_delta,
    };
    if let Some((d, [lo, hi])) = gated {
        let n = draft.samples.len();
        if n < MIN_CI_SAMPLES {
            interval_notes.push(format!(
                "too few prompts for the interval: {n} (a paired bootstrap needs about {MIN_CI_SAMPLES} to mean a 95 % interval)"
            ));
        }
        let t = -th.max_regression;
        if lo < t && t < hi {
            interval_notes.push(format!(
                "the {}interval [{lo:+.3}, {hi:+.3}] straddles the threshold {t:+.3}: the verdict ({}) rests on the point estimate {d:+.3}; more prompts would settle it",
                if on == GateOn::AllPositions { "all-positions Δ's " } else { "" },
                if d >= t { "pass" } else { "fail" }
            ));
        }
    }
    let mut r = json!({
        "schema": "kquant.verify/1",
        "interval_notes": interval_notes,
        // Which count each accept length is (docs/verify.md, "Which accept length").
        "conventions": {
            "accept_length": "walked, gated by default: tokens committed per verify step, the bonus token counted, per token over the set (Σ committed / Σ verify steps)",
            "accept_length_engine": "the engine's own count: also the drafts a request's final step accepted before the cut at max_tokens or EOS (vLLM's per-request metrics and Prometheus counters); null where a sample has no lookahead past its stop",
            "accept_length_sglang_request": "SGLang's meta_info convention: completion tokens / verify steps, the prefill-sampled token counted once per request",
            "accept_length_all_positions": "teacher-forced, not walked: 1 + the leading proposals equal to the target's greedy continuation, averaged over every root position (anchor) of the generated region, each block's proposals from one parallel pass; the offline figure DFlash cards quote (the Kimi-Linear drafter's 5.2106 on Math500); gated with --gate-on all-positions (delta_all_positions, ci95_all_positions)",
        },
        "gated_on": on.field(),
        "steps": steps,
        "samples": draft.samples.len(),
        "draft": named(&draft.name, &part(draft, &all)),
        "baseline": baseline.map(|b| named(&b.name, &part(b, &all))),
        "delta": delta,
        "ci95": ci,
        // The draft's and the baseline's proposals compared position by position,
        // teacher-forced (null without a baseline that keeps them).
        "agreement": baseline
            .and_then(|b| agreement_of(draft, b, &all))
            .map(|g| agreement_json(&g)),
        "max_regression": th.max_regression,
        "min_accept": th.min_accept,
        "passed": decision.passed,
        "reasons": decision.reasons,
        "per_category": per_category,
    });
    if teacher_forced && baseline.is_some() {
        r["delta_all_positions"] = json!(tf_delta.map(|x| x.0));
        r["ci95_all_positions"] = json!(tf_delta.map(|x| x.1));
    }
    r
}

/// The table printed on stdout.
pub fn table(r: &Value) -> String {
    let mut s = String::new();
    let has_base = !r["baseline"].is_null();
    if let Some(l) = r["limit_per_category"].as_u64() {
        s.push_str(&format!(
            "work capped by --per-category: the first {l} samples of each category ({} replayed)\n",
            r["samples_replayed"]
        ));
    }
    if r["after_miss"] == "skip" {
        s.push_str("pass A skipped the depths after a miss (--after-miss skip): no unconditional per-depth rates, no simulated AL\n");
    }
    let all_positions_gated = r["gated_on"] == GateOn::AllPositions.field();
    s.push_str(if all_positions_gated {
        "AL: tokens committed per verify step, bonus token counted (Σ over the set); not gated (--gate-on all-positions)\n"
    } else {
        "AL: tokens committed per verify step, bonus token counted (Σ over the set)\n"
    });
    let f = |v: &Value| {
        v.as_f64()
            .map(|x| format!("{x:.3}"))
            .unwrap_or_else(|| "-".into())
    };
    // One row of an AL table: category (or `overall`), N, baseline, draft, Δ.
    let row = |s: &mut String, name: &str, n: &Value, b: String, d: String, delta: String| {
        s.push_str(&format!(
            "{:<14} {:>4} {:>12} {:>10} {:>9}\n",
            name, n, b, d, delta
        ));
    };
    let header = |s: &mut String| {
        s.push_str(&format!(
            "{:<14} {:>4} {:>12} {:>10} {:>9}\n",
            "category", "N", "AL baseline", "AL draft", "Δ"
        ))
    };
    header(&mut s);
    if let Some(m) = r["per_category"].as_object() {
        for (c, v) in m {
            // Categories come from the trace manifest: escaped for the terminal.
            let delta = if has_base { f(&v["delta"]) } else { "-".into() };
            row(
                &mut s,
                &crate::escape::printable(c),
                &v["n"],
                f(&v["baseline"]),
                f(&v["draft"]),
                delta,
            );
        }
    }
    row(
        &mut s,
        "overall",
        &r["samples"],
        f(&r["baseline"]["accept_length"]),
        f(&r["draft"]["accept_length"]),
        f(&r["delta"]),
    );
    if let Some(ci) = r["ci95"].as_array() {
        s.push_str(&format!(
            "ΔAL 95% CI (paired bootstrap over prompts): [{}, {}]\n",
            f(&ci[0]),
            f(&ci[1])
        ));
    }
    // The teacher-forced all-positions figures beside a baseline's (offline only).
    if r.get("delta_all_positions").is_some() {
        s.push_str(&format!(
            "all-positions AL: teacher-forced, 1 + leading matches over every anchor, not walked (the offline figure DFlash cards quote){}\n",
            if all_positions_gated { "; gated (--gate-on all-positions)" } else { "; not gated (--gate-on all-positions gates it)" }
        ));
        header(&mut s);
        for (c, v) in r["per_category"].as_object().into_iter().flatten() {
            row(
                &mut s,
                &crate::escape::printable(c),
                &v["n"],
                f(&v["baseline_all_positions"]),
                f(&v["draft_all_positions"]),
                f(&v["delta_all_positions"]),
            );
        }
        row(
            &mut s,
            "overall",
            &r["samples"],
            f(&r["baseline"]["accept_length_all_positions"]),
            f(&r["draft"]["accept_length_all_positions"]),
            f(&r["delta_all_positions"]),
        );
        if let Some(ci) = r["ci95_all_positions"].as_array() {
            s.push_str(&format!(
                "all-positions ΔAL 95% CI (paired bootstrap over prompts): [{}, {}]\n",
                f(&ci[0]),
                f(&ci[1])
            ));
        }
    }
    for n in r["interval_notes"].as_array().into_iter().flatten() {
        s.push_str(&format!("note: {}\n", n.as_str().unwrap_or("")));
    }
    // `--published`: each model-card figure the measurement is held against.
    for c in r["published"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "published {} ({}): measured {} {} vs {} on the card ({}): {}\n",
            crate::escape::printable(c["benchmark"].as_str().unwrap_or("")),
            crate::escape::printable(c["category"].as_str().unwrap_or("overall")),
            if c["count"] == "accept_length_all_positions" {
                "all-positions AL (teacher-forced)"
            } else {
                "AL (walk)"
            },
            f(&c["measured"]),
            f(&c["published"]),
            crate::escape::printable(c["source"].as_str().unwrap_or("")),
            if c["passed"].as_bool() == Some(true) {
                "at least the card less --max-regression"
            } else {
                "below the card by more than --max-regression"
            }
        ));
    }
    // A JSON list of rates, as `a, b, c`.
    let list = |v: &Value| -> String {
        let items: Vec<String> = v.as_array().into_iter().flatten().map(&f).collect();
        items.join(", ")
    };
    if let Some(a) = r["agreement"].as_object() {
        s.push_str(&format!(
            "proposal agreement with the baseline (teacher-forced, every position): {} overall, per depth [{}]\n",
            f(&a["overall"]),
            list(&a["per_depth"])
        ));
    }
    if !r["draft"]["accept_length_engine"].is_null() {
        let (d, b) = (
            &r["draft"]["accept_length_engine"],
            &r["baseline"]["accept_length_engine"],
        );
        if d != &r["draft"]["accept_length"] || (has_base && b != &r["baseline"]["accept_length"]) {
            s.push_str(&format!(
                "engine's own count (final step before the cut at max_tokens/EOS, as vLLM reports): draft {}{}; the gate uses committed tokens\n",
                f(d),
                if has_base { format!(", baseline {}", f(b)) } else { String::new() }
            ));
        }
    }
    if let Some(n) = r["near_ties"].as_object() {
        let range = |v: &Value| format!("[{}, {}]", f(&v[0]), f(&v[1]));
        let side = |name: &str| {
            n.get(name).map_or(String::new(), |x| {
                format!(
                    "{name} AL (walk) {} ({} requests, {} steps)",
                    range(&x["accept_length"]),
                    x["requests_with_ties"],
                    x["steps"]
                )
            })
        };
        s.push_str(&format!(
            "near-ties (logits within {} of the runner-up) can move: {}{}{}\n",
            n["margin"],
            side("draft"),
            if n.contains_key("baseline") {
                format!("; {}", side("baseline"))
            } else {
                String::new()
            },
            n.get("delta")
                .map_or(String::new(), |d| format!("; Δ {}", range(d)))
        ));
    }
    if !r["draft"]["accept_length_all_positions"].is_null() {
        s.push_str(&format!(
            "draft: all-positions AL {} (teacher-forced over every anchor: the offline figure DFlash cards quote), SGLang per-request AL {}, per-depth conditional acceptance [{}]\n",
            f(&r["draft"]["accept_length_all_positions"]),
            f(&r["draft"]["accept_length_sglang_request"]),
            list(&r["draft"]["conditional_acceptance"])
        ));
    }
    if let Some(l) = r["live"].as_object() {
        for side in ["draft", "baseline"] {
            let Some(e) = l.get(side).and_then(Value::as_object) else {
                continue;
            };
            s.push_str(&format!(
                "live {side}: {} {} at {}: {} requests measured ({}), {} failed\n",
                e["engine"].as_str().unwrap_or(""),
                // The server's own string: escaped for the terminal.
                crate::escape::printable(e["version"].as_str().unwrap_or("(version unknown)")),
                crate::escape::printable(e["endpoint"].as_str().unwrap_or("")),
                e["measured"],
                crate::escape::printable(
                    &e["sources"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                e["failed"].as_array().map_or(0, Vec::len),
            ));
        }
    }
    s.push_str(if r["passed"].as_bool() == Some(true) {
        "PASSED\n"
    } else {
        "FAILED\n"
    });
    for reason in r["reasons"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "  {}\n",
            crate::escape::printable(reason.as_str().unwrap_or(""))
        ));
    }
    s
}

/// `s` as XML attribute or text content: markup characters as entities, and every character
/// XML 1.0 does not allow at all (C0 controls other than tab, newline and carriage return;
/// U+FFFE, U+FFFF) written out as `\xNN` text, so a category or server string can never make
/// the report invalid.
fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out
}

/// How an existing `--json` report is recognised as kquant's (and so may be replaced).
pub const JSON_REPORT: Kind = Kind::File {
    what: "verify JSON report",
    flag: "--json",
    is_ours: |b| output::is_json_with_schema(b, "kquant.verify/"),
};

/// How an existing `--junit` report is recognised as kquant's.
pub const JUNIT_REPORT: Kind = Kind::File {
    what: "JUnit report",
    flag: "--junit",
    is_ours: |b| {
        const MARK: &[u8] = b"<testsuite name=\"kquant verify\"";
        b.starts_with(b"<?xml") && b.windows(MARK.len()).any(|w| w == MARK)
    },
};

/// JUnit XML: a `gate` testcase that fails exactly when verify exits 1 (every reason in its
/// message), one per threshold (`--max-regression` over all samples, `--min-accept`), one per
/// category (failing when its Δ is below −max_regression); the figures as suite properties and
/// in each testcase's output.
pub fn junit(r: &Value) -> String {
    let num = |v: &Value| {
        v.as_f64()
            .map(|x| format!("{x:.4}"))
            .unwrap_or_else(|| "-".into())
    };
    let maxr = r["max_regression"].as_f64().unwrap_or(0.0);
    let has_base = !r["baseline"].is_null();
    let draft_al = &r["draft"]["accept_length"];
    let base_al = &r["baseline"]["accept_length"];
    let ci = r["ci95"].as_array();
    let ci_text = |c: Option<&Vec<Value>>| {
        c.map(|c| format!(" (95% CI [{}, {}])", num(&c[0]), num(&c[1])))
            .unwrap_or_default()
    };
    // The teacher-forced all-positions figures beside a baseline's (offline only).
    let tf = r.get("delta_all_positions").is_some();
    let all_positions = if tf {
        format!(
            "; draft AL (all-positions, teacher-forced) {}, baseline AL (all-positions) {}, delta {}{}",
            num(&r["draft"]["accept_length_all_positions"]),
            num(&r["baseline"]["accept_length_all_positions"]),
            num(&r["delta_all_positions"]),
            ci_text(r["ci95_all_positions"].as_array())
        )
    } else {
        String::new()
    };
    let figures = format!(
        "draft AL (walk) {}, baseline AL (walk) {}, delta {}{}{all_positions}, {} samples, {} steps",
        num(draft_al),
        if has_base { num(base_al) } else { "-".into() },
        num(&r["delta"]),
        ci_text(ci),
        r["samples"],
        r["steps"],
    );
    // The figure the thresholds judge (`--gate-on`).
    let on = if r["gated_on"] == GateOn::AllPositions.field() {
        GateOn::AllPositions
    } else {
        GateOn::Walk
    };
    let (what, gated_al, gated_delta, cat_delta, cat_draft, cat_base) = match on {
        GateOn::Walk => (
            "accept length",
            draft_al,
            &r["delta"],
            "delta",
            "draft",
            "baseline",
        ),
        GateOn::AllPositions => (
            "all-positions accept length",
            &r["draft"]["accept_length_all_positions"],
            &r["delta_all_positions"],
            "delta_all_positions",
            "draft_all_positions",
            "baseline_all_positions",
        ),
    };
    let mut cases: Vec<(String, Option<String>, String)> = Vec::new();
    // The gate itself: fails exactly when verify exits 1, with every reason, once (each overall
    // threshold is a line of its output, not a second failing testcase for the same reason).
    let reasons: Vec<String> = r["reasons"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| x.as_str().map(String::from))
        .collect();
    let gate_failed = r["passed"].as_bool() != Some(true);
    let mut checks = Vec::new();
    if has_base {
        let d = gated_delta.as_f64();
        checks.push(format!(
            "overall: {what} regression at most {maxr}: {}",
            match d {
                Some(d) if d < -maxr => format!("failed, regressed by {:.4}", -d),
                Some(_) => "ok".into(),
                None => "not measured".into(),
            }
        ));
    }
    if let Some(m) = r["min_accept"].as_f64() {
        checks.push(format!(
            "overall: {what} at least {m}: {}",
            match gated_al.as_f64() {
                Some(a) if a < m => format!("failed, {a:.4}"),
                Some(_) => "ok".into(),
                None => "not measured".into(),
            }
        ));
    }
    cases.push((
        "gate".into(),
        gate_failed.then(|| {
            if reasons.is_empty() {
                "the gate failed".into()
            } else {
                reasons.join("; ")
            }
        }),
        std::iter::once(figures.clone())
            .chain(checks)
            .collect::<Vec<_>>()
            .join("\n"),
    ));
    for (c, v) in r["per_category"].as_object().into_iter().flatten() {
        let d = v[cat_delta].as_f64();
        let mut out = format!(
            "n {}, draft AL (walk) {}, baseline AL (walk) {}, delta {}",
            v["n"],
            num(&v["draft"]),
            num(&v["baseline"]),
            num(&v["delta"])
        );
        if tf {
            out.push_str(&format!(
                "; draft AL (all-positions, teacher-forced) {}, baseline AL (all-positions) {}, delta {}{}",
                num(&v["draft_all_positions"]),
                num(&v["baseline_all_positions"]),
                num(&v["delta_all_positions"]),
                ci_text(v["ci95_all_positions"].as_array())
            ));
        }
        cases.push((
            format!("category {c}"),
            d.filter(|d| *d < -maxr).map(|d| {
                format!(
                    "{what} regressed by {:.4} (max {maxr}): draft {}, baseline {}",
                    -d,
                    num(&v[cat_draft]),
                    num(&v[cat_base])
                )
            }),
            out,
        ));
    }
    // `verify --published`: each figure the target's profile quotes for the draft.
    for c in r["published"].as_array().into_iter().flatten() {
        let cat = c["category"].as_str().unwrap_or("overall");
        let out = format!(
            "{cat}: measured {} over {} prompts, published {} on {} ({})",
            num(&c["measured"]),
            c["n"],
            num(&c["published"]),
            c["benchmark"].as_str().unwrap_or(""),
            c["source"].as_str().unwrap_or("")
        );
        // `MT-Bench writing` names its category already.
        let bench = c["benchmark"].as_str().unwrap_or("");
        let named = if c["category"].is_null() {
            format!("{bench} (overall)")
        } else if bench
            .to_lowercase()
            .ends_with(&format!(" {}", cat.to_lowercase()))
        {
            bench.to_string()
        } else {
            format!("{bench} ({cat})")
        };
        cases.push((
            format!(
                "published {named}: at least {} - {maxr}",
                num(&c["published"])
            ),
            (c["passed"].as_bool() != Some(true)).then(|| {
                format!(
                    "accept length {} is below the published {} by more than {maxr}",
                    num(&c["measured"]),
                    num(&c["published"])
                )
            }),
            out,
        ));
    }
    let failures = cases.iter().filter(|c| c.1.is_some()).count();
    let mut props = String::new();
    let mut prop = |k: &str, v: String| {
        props.push_str(&format!(
            "    <property name=\"{k}\" value=\"{}\"/>\n",
            xml_escape(&v)
        ));
    };
    prop("passed", (!gate_failed).to_string());
    prop("draft_accept_length", num(draft_al));
    prop(
        "draft_accept_length_engine",
        num(&r["draft"]["accept_length_engine"]),
    );
    prop(
        "gated_on",
        match on {
            GateOn::Walk => "accept_length (committed tokens per verify step)",
            GateOn::AllPositions => {
                "accept_length_all_positions (teacher-forced, every anchor; --gate-on all-positions)"
            }
        }
        .into(),
    );
    if has_base {
        prop("baseline_accept_length", num(base_al));
        prop(
            "baseline_accept_length_engine",
            num(&r["baseline"]["accept_length_engine"]),
        );
        prop("delta", num(&r["delta"]));
    }
    if let Some(c) = ci {
        prop("ci95_low", num(&c[0]));
        prop("ci95_high", num(&c[1]));
    }
    if tf {
        prop(
            "draft_accept_length_all_positions",
            num(&r["draft"]["accept_length_all_positions"]),
        );
        prop(
            "baseline_accept_length_all_positions",
            num(&r["baseline"]["accept_length_all_positions"]),
        );
        prop("delta_all_positions", num(&r["delta_all_positions"]));
        if let Some(c) = r["ci95_all_positions"].as_array() {
            prop("ci95_all_positions_low", num(&c[0]));
            prop("ci95_all_positions_high", num(&c[1]));
        }
    }
    prop("max_regression", maxr.to_string());
    if let Some(m) = r["min_accept"].as_f64() {
        prop("min_accept", m.to_string());
    }
    prop("samples", r["samples"].to_string());
    let notes: Vec<&str> = r["interval_notes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !notes.is_empty() {
        prop("interval_notes", notes.join("; "));
    }
    prop("steps", r["steps"].to_string());
    let mut body = String::new();
    for (name, failure, out) in &cases {
        body.push_str(&format!(
            "  <testcase classname=\"kquant.verify\" name=\"{}\">\n",
            xml_escape(name)
        ));
        if let Some(f) = failure {
            body.push_str(&format!(
                "    <failure message=\"{}\">{}</failure>\n",
                xml_escape(f),
                xml_escape(out)
            ));
        }
        body.push_str(&format!(
            "    <system-out>{}</system-out>\n  </testcase>\n",
            xml_escape(out)
        ));
    }
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"kquant verify\" tests=\"{}\" failures=\"{failures}\">\n  <properties>\n{props}  </properties>\n{body}</testsuite>\n",
        cases.len()
    )
}
/// What a verify found: the report (table, JSON and JUnit are rendered from it), the gate's
/// decision, and the inputs an output may not overwrite.
pub struct Verdict {
    pub report: Value,
    pub passed: bool,
    pub sources: Vec<PathBuf>,
}

/// Print the report (the table, or the JSON with `--json` / `--json -`) and write `--json FILE`
/// and `--junit FILE`. Reports are regenerated on every run: an existing one is replaced when
/// kquant wrote it, anything else is refused (`io::output`), and none may be one of `sources`.
pub fn emit(
    rep: &Value,
    json_to: Option<&Path>,
    junit_to: Option<&Path>,
    sources: &[PathBuf],
) -> crate::error::Result<()> {
    let json_to_stdout = json_to == Some(Path::new("-"));
    if json_to_stdout {
        println!("{}", serde_json::to_string_pretty(rep).expect("JSON"));
    } else {
        print!("{}", table(rep));
    }
    if let Some(p) = json_to.filter(|_| !json_to_stdout) {
        output::write_file(
            p,
            JSON_REPORT,
            true,
            sources,
            &serde_json::to_vec_pretty(rep).expect("JSON"),
        )?;
    }
    if let Some(p) = junit_to {
        output::write_file(p, JUNIT_REPORT, true, sources, junit(rep).as_bytes())?;
    }
    Ok(())
}
