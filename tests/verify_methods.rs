//! The quantize methods on the held-out split (#16), held as a regression test.
//!
//! `fixtures/kimi-k2.5-tiny/reference/method-delta.json` is written by
//! `fixtures/gen/verify/measure_methods.sh` with kquant itself: traces of
//! `prompts/calibration.jsonl` and `prompts/eval.jsonl` captured by the tiny target (the two
//! sets share no document), then per draft × symmetric INT4 scheme × method `quantize
//! --calibrate CAL` and `verify --trace EVAL`, and per draft `sensitivity --method gptq --pick`.
//! Here:
//! - the table in docs/verify.md is exactly the one rendered from the file;
//! - the targets hold on the recorded rows: on every draft the seed recipe with GPTQ
//!   recovers at least half of round-to-nearest's accept-length loss, and an INT4 configuration
//!   kquant finds passes the default gate;
//! - (ignored tier: it captures both traces, about 2 minutes) the EAGLE-3 seed-recipe rows for
//!   `rtn` and `gptq` are re-measured through the binary and must match the recorded figures.

use crate::common;

use common::{kquant, read_json, root, stderr};
use serde_json::Value;

const FIX: &str = "fixtures/kimi-k2.5-tiny";
const TABLE: &str = "fixtures/kimi-k2.5-tiny/reference/method-delta.json";
const METHODS: [&str; 4] = ["rtn", "search", "gptq", "search-gptq"];

fn table() -> Value {
    let t = read_json(&root().join(TABLE));
    assert_eq!(t["schema"], "kquant.method-delta/1");
    assert_eq!(t["max_regression"], 0.03);
    t
}

fn row<'a>(t: &'a Value, draft: &str, scheme: &str, method: &str) -> &'a Value {
    t["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["draft"] == draft && r["scheme"] == scheme && r["method"] == method)
        .unwrap_or_else(|| panic!("no row {draft} {scheme} {method}"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The Markdown table docs/verify.md carries, rendered from the file.
fn render(t: &Value) -> String {
    let mut s = String::from(
        "| draft | scheme | rtn | search | gptq | search-gptq |\n|---|---|---|---|---|---|\n",
    );
    let drafts = [
        ("eagle3", "EAGLE-3"),
        ("eagle3-mla", "EAGLE-3 MLA"),
        ("dflash", "DFlash"),
    ];
    for (d, name) in drafts {
        for scheme in ["int4-pc", "int4-g128", "int4-g64", "int4-g32"] {
            s += &format!("| {name} | `{scheme}` |");
            for m in METHODS {
                let r = row(t, d, scheme, m);
                let cell = format!(
                    "{:+.3} [{:+.3}, {:+.3}] · {:.3}",
                    f(&r["delta"]),
                    f(&r["ci95"][0]),
                    f(&r["ci95"][1]),
                    f(&r["agreement"])
                )
                .replace('-', "−");
                let cell = if r["passed"] == true {
                    format!("**{cell}**")
                } else {
                    cell
                };
                s += &format!(" {cell} |");
            }
            s += "\n";
        }
    }
    s
}

#[test]
fn docs_table_is_the_recorded_one() {
    let t = table();
    let doc = std::fs::read_to_string(root().join("docs/verify.md")).unwrap();
    let want = render(&t);
    assert!(
        doc.contains(&want),
        "docs/verify.md does not hold the methods table rendered from {TABLE}; it should read:\n{want}"
    );
}

#[test]
fn gptq_recovers_half_of_rtns_loss_and_a_found_configuration_passes() {
    let t = table();
    for d in ["eagle3", "eagle3-mla", "dflash"] {
        let rtn = f(&row(&t, d, "int4-pc", "rtn")["delta"]);
        let gptq = f(&row(&t, d, "int4-pc", "gptq")["delta"]);
        assert!(
            rtn < -0.03,
            "{d}: the seed recipe with RTN fails the gate ({rtn})"
        );
        let recovered = (gptq - rtn) / -rtn;
        assert!(
            recovered >= 0.5,
            "{d}: GPTQ recovers {recovered:.2} of RTN's loss"
        );
        // Every row: the baseline is the same draft on the same positions.
        for r in t["results"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["draft"] == d)
        {
            let delta = f(&r["draft_al"]) - f(&r["baseline_al"]);
            assert!((delta - f(&r["delta"])).abs() < 1e-9, "{r}");
            assert_eq!(r["passed"], f(&r["delta"]) >= -0.03, "{r}");
            assert_eq!(r["samples"], 240, "{r}");
        }
        // What kquant finds: the seed recipe with a method, else sensitivity's pick.
        let seed_passes = METHODS
            .iter()
            .any(|m| row(&t, d, "int4-pc", m)["passed"] == true);
        let s = t["sensitivity"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["draft"] == d)
            .unwrap_or_else(|| panic!("no sensitivity for {d}"));
        let picked = &s["pick"]["picked"];
        assert!(
            seed_passes || (picked.is_object() && f(&picked["delta"]) >= -0.03),
            "{d}: no INT4 configuration found passes"
        );
        if picked.is_object() {
            assert_eq!(picked["passed"], true);
        }
    }
}

/// `quantize` then `verify --json` of the EAGLE-3 seed recipe with `method` on the held-out
/// traces: (ΔAL, agreement).
fn measure(
    cal: &std::path::Path,
    eval: &std::path::Path,
    out: &std::path::Path,
    method: &str,
) -> (f64, f64) {
    let fix = root().join(FIX);
    let (e, tc) = (fix.join("eagle3"), fix.join("target"));
    let (e, tc) = (e.to_str().unwrap(), tc.to_str().unwrap());
    let o = out.to_str().unwrap();
    let mut q = vec![
        "quantize",
        e,
        "-o",
        o,
        "--scheme",
        "int4-pc",
        "--exclude",
        "fc,lm_head",
    ];
    let cal = cal.to_str().unwrap();
    if method != "rtn" {
        q.extend([
            "--method",
            method,
            "--calibrate",
            cal,
            "--target-checkpoint",
            tc,
        ]);
    }
    let r = kquant(&q);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    let r = kquant(&[
        "verify",
        "--draft",
        o,
        "--baseline",
        e,
        "--trace",
        eval.to_str().unwrap(),
        "--target-checkpoint",
        tc,
        "--max-regression",
        "1000",
        "--json",
    ]);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    let v: Value = serde_json::from_slice(&r.stdout).unwrap();
    (f(&v["delta"]), f(&v["agreement"]["overall"]))
}

#[test]
#[ignore = "captures the calibration and evaluation traces (about 2 minutes)"]
fn the_seed_recipe_rows_reproduce_through_the_binary() {
    let t = table();
    let d = tempfile::tempdir().unwrap();
    let fix = root().join(FIX);
    let capture = |prompts: &str, out: &std::path::Path, dataset: &str| {
        let p = fix.join("prompts").join(prompts);
        let r = kquant(&[
            "trace",
            "capture",
            "--target-checkpoint",
            fix.join("target").to_str().unwrap(),
            "--prompts",
            p.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--taps",
            "1,2,3",
            "--gen-len",
            "96",
            "--dataset",
            dataset,
        ]);
        assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    };
    let (cal, eval) = (d.path().join("cal"), d.path().join("eval"));
    capture("calibration.jsonl", &cal, "kquant-calibration");
    capture("eval.jsonl", &eval, "kquant-eval");
    for m in ["rtn", "gptq"] {
        let (delta, agreement) = measure(&cal, &eval, &d.path().join(m), m);
        let r = row(&t, "eagle3", "int4-pc", m);
        // The runtimes are deterministic: the same figures up to float formatting.
        assert!(
            (delta - f(&r["delta"])).abs() < 1e-9,
            "{m}: ΔAL {delta} vs {}",
            r["delta"]
        );
        assert!(
            (agreement - f(&r["agreement"])).abs() < 1e-9,
            "{m}: agreement"
        );
    }
}

/// #38.23: the share of RTN's loss each method recovers, as docs/verify.md and docs/quantize.md
/// state it, is the recorded file's (not a ratio of the table's rounded figures: EAGLE-3's
/// `search-gptq` recovers 77.2 %, not 78 %).
#[test]
fn the_docs_recovered_shares_are_the_files() {
    let t = table();
    let share = |d: &str, m: &str| {
        let rtn = f(&row(&t, d, "int4-pc", "rtn")["delta"]);
        let x = f(&row(&t, d, "int4-pc", m)["delta"]);
        format!("{:.0}", 100.0 * (x - rtn) / -rtn)
    };
    let [g, sg]: [Vec<String>; 2] = ["gptq", "search-gptq"].map(|m| {
        ["eagle3", "eagle3-mla", "dflash"]
            .map(|d| share(d, m))
            .to_vec()
    });
    let flat = |p: &str| {
        std::fs::read_to_string(root().join(p))
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (v, q) = (flat("docs/verify.md"), flat("docs/quantize.md"));
    let gptq = format!(
        "GPTQ recovers {} % (EAGLE-3), {} % (MLA) and {} % (DFlash)",
        g[0], g[1], g[2]
    );
    for (p, doc) in [("docs/verify.md", &v), ("docs/quantize.md", &q)] {
        assert!(doc.contains(&gptq), "{p} should say: {gptq}");
    }
    let s = format!("recovers {} %, {} % and {} % (", sg[0], sg[1], sg[2]);
    assert!(v.contains(&s), "docs/verify.md should say: {s}");
    let s = format!("`search-gptq` {} %, {} % and {} %:", sg[0], sg[1], sg[2]);
    assert!(q.contains(&s), "docs/quantize.md should say: {s}");
}
