//! JUnit XML rendered from the [`Report`]: a `gate` testcase that fails exactly when verify
//! exits 1 (every reason in its message), one per category (failing when its Δ is below
//! −max_regression), one per card figure (`--published`); the figures as suite properties and
//! in each testcase's output.

use super::schema::{Category, CategoryAllPositions, Report};
use super::table::known;
use crate::verify::gate::GateOn;

/// A figure to 4 decimals, `-` where it is not known.
fn num(x: Option<f64>) -> String {
    known(x).map_or_else(|| "-".into(), |x| format!("{x:.4}"))
}

fn num1(x: f64) -> String {
    num(Some(x))
}

/// ` (95% CI [lo, hi])`, or nothing without an interval.
fn ci_text(c: Option<[f64; 2]>) -> String {
    c.map(|c| format!(" (95% CI [{}, {}])", num1(c[0]), num1(c[1])))
        .unwrap_or_default()
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

/// A testcase: its name, its failure message (`None`: it passed), its output.
type Case = (String, Option<String>, String);

/// A category's all-positions figure.
fn tf_of(v: &Category, pick: fn(&CategoryAllPositions) -> Option<f64>) -> Option<f64> {
    v.all_positions.as_ref().and_then(pick)
}

/// The figure the thresholds judge (`--gate-on`), as the report's figures name it.
struct Gated {
    what: &'static str,
    al: Option<f64>,
    delta: Option<f64>,
    /// A category's Δ, draft AL and baseline AL of that figure.
    cat: fn(&Category) -> [Option<f64>; 3],
}

impl Gated {
    fn of(r: &Report) -> Gated {
        match r.gated_on {
            GateOn::Walk => Gated {
                what: "accept length",
                al: Some(r.draft.accept_length),
                delta: r.delta,
                cat: |v| [v.delta, Some(v.draft), v.baseline],
            },
            GateOn::AllPositions => Gated {
                what: "all-positions accept length",
                al: r.draft.accept_length_all_positions,
                delta: r.all_positions.and_then(|a| a.delta_all_positions),
                cat: |v| {
                    [
                        tf_of(v, |a| a.delta_all_positions),
                        tf_of(v, |a| Some(a.draft_all_positions)),
                        tf_of(v, |a| a.baseline_all_positions),
                    ]
                },
            },
        }
    }
}

/// The report's `max_regression` as the JSON holds it (0 where not finite).
fn max_regression(r: &Report) -> f64 {
    known(Some(r.max_regression)).unwrap_or(0.0)
}

/// The gate's testcase: fails exactly when verify exits 1, with every reason, once (each
/// overall threshold is a line of its output, not a second failing testcase for the same
/// reason).
fn gate_case(r: &Report, g: &Gated) -> Case {
    let maxr = max_regression(r);
    // The teacher-forced all-positions figures beside a baseline's (offline only).
    let all_positions = match &r.all_positions {
        Some(a) => format!(
            "; draft AL (all-positions, teacher-forced) {}, baseline AL (all-positions) {}, delta {}{}",
            num(r.draft.accept_length_all_positions),
            num(r.baseline.as_ref().and_then(|b| b.accept_length_all_positions)),
            num(a.delta_all_positions),
            ci_text(a.ci95_all_positions)
        ),
        None => String::new(),
    };
    let figures = format!(
        "draft AL (walk) {}, baseline AL (walk) {}, delta {}{}{all_positions}, {} samples, {} steps",
        num1(r.draft.accept_length),
        num(r.baseline.as_ref().map(|b| b.accept_length)),
        num(r.delta),
        ci_text(r.ci95),
        r.samples,
        r.steps,
    );
    let what = g.what;
    let mut checks = Vec::new();
    if r.baseline.is_some() {
        checks.push(format!(
            "overall: {what} regression at most {maxr}: {}",
            match known(g.delta) {
                Some(d) if d < -maxr => format!("failed, regressed by {:.4}", -d),
                Some(_) => "ok".into(),
                None => "not measured".into(),
            }
        ));
    }
    if let Some(m) = known(r.min_accept) {
        checks.push(format!(
            "overall: {what} at least {m}: {}",
            match known(g.al) {
                Some(a) if a < m => format!("failed, {a:.4}"),
                Some(_) => "ok".into(),
                None => "not measured".into(),
            }
        ));
    }
    (
        "gate".into(),
        (!r.passed).then(|| {
            if r.reasons.is_empty() {
                "the gate failed".into()
            } else {
                r.reasons.join("; ")
            }
        }),
        std::iter::once(figures)
            .chain(checks)
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// One testcase per category: failing when its gated Δ is below −max_regression.
fn category_cases(r: &Report, g: &Gated) -> Vec<Case> {
    let maxr = max_regression(r);
    let mut cases = Vec::new();
    for (c, v) in &r.per_category {
        let [d, cat_draft, cat_base] = (g.cat)(v);
        let mut out = format!(
            "n {}, draft AL (walk) {}, baseline AL (walk) {}, delta {}",
            v.n,
            num1(v.draft),
            num(v.baseline),
            num(v.delta)
        );
        if r.all_positions.is_some() {
            out.push_str(&format!(
                "; draft AL (all-positions, teacher-forced) {}, baseline AL (all-positions) {}, delta {}{}",
                num(tf_of(v, |a| Some(a.draft_all_positions))),
                num(tf_of(v, |a| a.baseline_all_positions)),
                num(tf_of(v, |a| a.delta_all_positions)),
                ci_text(v.all_positions.as_ref().and_then(|a| a.ci95_all_positions))
            ));
        }
        cases.push((
            format!("category {c}"),
            known(d).filter(|d| *d < -maxr).map(|d| {
                format!(
                    "{} regressed by {:.4} (max {maxr}): draft {}, baseline {}",
                    g.what,
                    -d,
                    num(cat_draft),
                    num(cat_base)
                )
            }),
            out,
        ));
    }
    cases
}

/// `verify --published`: each figure the target's profile quotes for the draft.
fn published_cases(r: &Report) -> Vec<Case> {
    let maxr = max_regression(r);
    r.published()
        .iter()
        .map(|c| {
            let cat = c.category.as_deref().unwrap_or("overall");
            let bench = c.benchmark.as_str();
            let out = format!(
                "{cat}: measured {} over {} prompts, published {} on {bench} ({})",
                num1(c.measured),
                c.n,
                num1(c.published),
                c.source
            );
            // `MT-Bench writing` names its category already.
            let named = if c.category.is_none() {
                format!("{bench} (overall)")
            } else if bench
                .to_lowercase()
                .ends_with(&format!(" {}", cat.to_lowercase()))
            {
                bench.to_string()
            } else {
                format!("{bench} ({cat})")
            };
            (
                format!("published {named}: at least {} - {maxr}", num1(c.published)),
                (!c.passed).then(|| {
                    format!(
                        "accept length {} is below the published {} by more than {maxr}",
                        num1(c.measured),
                        num1(c.published)
                    )
                }),
                out,
            )
        })
        .collect()
}

/// The suite's properties: the figures, the thresholds and the notes.
fn properties(r: &Report) -> String {
    let mut props = String::new();
    let mut prop = |k: &str, v: String| {
        props.push_str(&format!(
            "    <property name=\"{k}\" value=\"{}\"/>\n",
            xml_escape(&v)
        ));
    };
    prop("passed", r.passed.to_string());
    prop("draft_accept_length", num1(r.draft.accept_length));
    prop(
        "draft_accept_length_engine",
        num(r.draft.accept_length_engine),
    );
    prop(
        "gated_on",
        match r.gated_on {
            GateOn::Walk => "accept_length (committed tokens per verify step)",
            GateOn::AllPositions => {
                "accept_length_all_positions (teacher-forced, every anchor; --gate-on all-positions)"
            }
        }
        .into(),
    );
    if let Some(b) = &r.baseline {
        prop("baseline_accept_length", num1(b.accept_length));
        prop("baseline_accept_length_engine", num(b.accept_length_engine));
        prop("delta", num(r.delta));
    }
    if let Some(c) = r.ci95 {
        prop("ci95_low", num1(c[0]));
        prop("ci95_high", num1(c[1]));
    }
    if let Some(a) = &r.all_positions {
        prop(
            "draft_accept_length_all_positions",
            num(r.draft.accept_length_all_positions),
        );
        prop(
            "baseline_accept_length_all_positions",
            num(r
                .baseline
                .as_ref()
                .and_then(|b| b.accept_length_all_positions)),
        );
        prop("delta_all_positions", num(a.delta_all_positions));
        if let Some(c) = a.ci95_all_positions {
            prop("ci95_all_positions_low", num1(c[0]));
            prop("ci95_all_positions_high", num1(c[1]));
        }
    }
    prop("max_regression", max_regression(r).to_string());
    if let Some(m) = known(r.min_accept) {
        prop("min_accept", m.to_string());
    }
    prop("samples", r.samples.to_string());
    if !r.interval_notes.is_empty() {
        prop("interval_notes", r.interval_notes.join("; "));
    }
    prop("steps", r.steps.to_string());
    props
}

/// JUnit XML: a `gate` testcase that fails exactly when verify exits 1 (every reason in its
/// message), one per threshold (`--max-regression` over all samples, `--min-accept`), one per
/// category (failing when its Δ is below −max_regression); the figures as suite properties and
/// in each testcase's output.
pub fn junit(r: &Report) -> String {
    let g = Gated::of(r);
    let mut cases = vec![gate_case(r, &g)];
    cases.extend(category_cases(r, &g));
    cases.extend(published_cases(r));
    let failures = cases.iter().filter(|c| c.1.is_some()).count();
    let props = properties(r);
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
