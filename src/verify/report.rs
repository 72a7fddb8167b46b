//! Verify results as people and CI read them: a table like the seed model cards (category, N,
//! AL baseline, AL draft, Δ), the JSON document, and JUnit XML (one testcase per category).

use crate::io::output::{self, Kind};
use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::gate::{paired_delta, Decision, Thresholds};
use super::walk::Walk;

/// Per-sample results of one drafter.
pub struct Run {
    pub name: String,
    pub samples: Vec<Walk>,
}

fn total(ws: &[&Walk]) -> Walk {
    let mut t = Walk::default();
    for w in ws {
        t.add(w);
    }
    t
}

fn stats(w: &Walk) -> Value {
    json!({
        "accept_length": w.al_walk(),
        "accept_length_sglang_request": w.al_sglang_request(),
        "accept_length_all_positions": w.al_allpos(),
        "conditional_acceptance": w.conditional(),
        "unconditional_acceptance": w.unconditional(),
        "simulated_accept_length": w.simulated(),
        "rounds": w.rounds,
    })
}

fn named(name: &str, w: &Walk) -> Value {
    let mut v = stats(w);
    v["name"] = json!(name);
    v
}

/// Build the report. `categories[i]` is sample i's category.
pub fn build(
    draft: &Run,
    baseline: Option<&Run>,
    categories: &[String],
    th: Thresholds,
    decision: &Decision,
    steps: usize,
) -> Value {
    let all: Vec<usize> = (0..draft.samples.len()).collect();
    let mut cats: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, c) in categories.iter().enumerate() {
        cats.entry(c.as_str()).or_default().push(i);
    }
    let part =
        |r: &Run, idx: &[usize]| total(&idx.iter().map(|&i| &r.samples[i]).collect::<Vec<_>>());
    let delta_of = |idx: &[usize]| {
        baseline.map(|b| {
            let d: Vec<Walk> = idx.iter().map(|&i| draft.samples[i].clone()).collect();
            let bb: Vec<Walk> = idx.iter().map(|&i| b.samples[i].clone()).collect();
            paired_delta(&d, &bb)
        })
    };
    let (delta, ci) = match delta_of(&all) {
        Some((d, ci)) => (Some(d), Some(ci)),
        None => (None, None),
    };
    let per_category: serde_json::Map<String, Value> = cats
        .iter()
        .map(|(c, idx)| {
            let d = part(draft, idx);
            let b = baseline.map(|b| part(b, idx));
            let dl = delta_of(idx);
            (
                c.to_string(),
                json!({
                    "n": idx.len(),
                    "draft": d.al_walk(),
                    "baseline": b.as_ref().map(Walk::al_walk),
                    "delta": dl.map(|x| x.0),
                    "ci95": dl.map(|x| x.1),
                }),
            )
        })
        .collect();
    json!({
        "schema": "kquant.verify/1",
        "steps": steps,
        "samples": draft.samples.len(),
        "draft": named(&draft.name, &part(draft, &all)),
        "baseline": baseline.map(|b| named(&b.name, &part(b, &all))),
        "delta": delta,
        "ci95": ci,
        "max_regression": th.max_regression,
        "min_accept": th.min_accept,
        "passed": decision.passed,
        "reasons": decision.reasons,
        "per_category": per_category,
    })
}

/// The table printed on stdout.
pub fn table(r: &Value) -> String {
    let mut s = String::new();
    let has_base = !r["baseline"].is_null();
    s.push_str(&format!(
        "{:<14} {:>4} {:>12} {:>10} {:>9}\n",
        "category", "N", "AL baseline", "AL draft", "Δ"
    ));
    let f = |v: &Value| {
        v.as_f64()
            .map(|x| format!("{x:.3}"))
            .unwrap_or_else(|| "-".into())
    };
    if let Some(m) = r["per_category"].as_object() {
        for (c, v) in m {
            // Categories come from the trace manifest: escaped for the terminal.
            s.push_str(&format!(
                "{:<14} {:>4} {:>12} {:>10} {:>9}\n",
                crate::escape::printable(c),
                v["n"],
                f(&v["baseline"]),
                f(&v["draft"]),
                if has_base { f(&v["delta"]) } else { "-".into() }
            ));
        }
    }
    s.push_str(&format!(
        "{:<14} {:>4} {:>12} {:>10} {:>9}\n",
        "overall",
        r["samples"],
        f(&r["baseline"]["accept_length"]),
        f(&r["draft"]["accept_length"]),
        f(&r["delta"])
    ));
    if let Some(ci) = r["ci95"].as_array() {
        s.push_str(&format!(
            "ΔAL 95% CI (paired bootstrap over prompts): [{}, {}]\n",
            f(&ci[0]),
            f(&ci[1])
        ));
    }
    s.push_str(&format!(
        "draft: all-positions AL {}, SGLang per-request AL {}, per-depth conditional acceptance {}\n",
        f(&r["draft"]["accept_length_all_positions"]),
        f(&r["draft"]["accept_length_sglang_request"]),
        r["draft"]["conditional_acceptance"]
    ));
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

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// JUnit XML, one testcase per category (failing when its Δ is below −max_regression).
/// How an existing `--json` report is recognised as kquant's (and so may be replaced).
pub const JSON_REPORT: Kind = Kind::File {
    what: "verify JSON report",
    is_ours: |b| output::is_json_with_schema(b, "kquant.verify/"),
};

/// How an existing `--junit` report is recognised as kquant's.
pub const JUNIT_REPORT: Kind = Kind::File {
    what: "JUnit report",
    is_ours: |b| {
        const MARK: &[u8] = b"<testsuite name=\"kquant verify\"";
        b.starts_with(b"<?xml") && b.windows(MARK.len()).any(|w| w == MARK)
    },
};

pub fn junit(r: &Value) -> String {
    let maxr = r["max_regression"].as_f64().unwrap_or(0.0);
    let cats = r["per_category"].as_object().cloned().unwrap_or_default();
    let mut failures = 0;
    let mut cases = String::new();
    for (c, v) in &cats {
        let d = v["delta"].as_f64();
        cases.push_str(&format!(
            "  <testcase classname=\"kquant.verify\" name=\"{}\">\n",
            xml_escape(c)
        ));
        if let Some(d) = d.filter(|d| *d < -maxr) {
            failures += 1;
            cases.push_str(&format!(
                "    <failure message=\"accept length regressed by {:.4} (max {maxr})\">draft {:.4}, baseline {:.4}</failure>\n",
                -d,
                v["draft"].as_f64().unwrap_or(0.0),
                v["baseline"].as_f64().unwrap_or(0.0)
            ));
        }
        cases.push_str("  </testcase>\n");
    }
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"kquant verify\" tests=\"{}\" failures=\"{failures}\">\n{cases}</testsuite>\n",
        cats.len()
    )
}
