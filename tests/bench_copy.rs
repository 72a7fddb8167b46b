//! `kquant bench quantize` and `bench convert` end to end on the tiny trained EAGLE-3 draft:
//! interleaved rounds of `cp`, `cp && sync` and the command, the medians and ratios in the
//! JSON report, a `--baseline` command, and an output that is removed after each step.

use crate::common;

use common::{kquant, kquant_json, root};
use serde_json::Value;

const EAGLE3: &str = "fixtures/kimi-k2.5-tiny/eagle3";

/// The runs, their median, and the ratio built from the medians.
fn check(j: &Value, repeat: usize) {
    assert_eq!(j["repeat"], repeat);
    for (runs, med) in [
        ("cp_runs_s", "cp_s"),
        ("cp_sync_runs_s", "cp_sync_s"),
        ("kquant_runs_s", "kquant_s"),
    ] {
        let mut v: Vec<f64> = j[runs]
            .as_array()
            .unwrap_or_else(|| panic!("{runs} missing: {j}"))
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(v.len(), repeat, "{runs}");
        assert!(v.iter().all(|t| *t > 0.0 && t.is_finite()), "{runs}: {v:?}");
        v.sort_by(f64::total_cmp);
        let m = if repeat % 2 == 1 {
            v[repeat / 2]
        } else {
            (v[repeat / 2 - 1] + v[repeat / 2]) / 2.0
        };
        let got = j[med].as_f64().unwrap();
        assert!(
            (got - m).abs() <= 1e-12 * m,
            "{med} {got} is the median {m} of {runs}"
        );
    }
    let r = j["kquant_vs_cp_sync"].as_f64().unwrap();
    let want = j["kquant_s"].as_f64().unwrap() / j["cp_sync_s"].as_f64().unwrap();
    assert!((r - want).abs() < 1e-12);
    assert!(j["kquant_rss_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn bench_quantize_and_convert_report_medians_of_interleaved_rounds() {
    let t = tempfile::tempdir().unwrap();
    let scratch = t.path().join("scratch");
    let src = root().join(EAGLE3);
    let src = src.to_str().unwrap();
    let s = scratch.to_str().unwrap();
    let j = kquant_json(&[
        "bench",
        "quantize",
        src,
        "--scratch",
        s,
        "--json",
        "--repeat",
        "2",
        "--baseline",
        "cp -r {src} {out}",
        "--",
        "--exclude",
        "fc,lm_head",
    ]);
    check(&j, 2);
    assert!(j["baseline_s"].as_f64().unwrap() > 0.0);
    assert_eq!(
        j["baseline_runs_s"].as_array().unwrap().len(),
        2,
        "the baseline runs every round"
    );
    assert!(
        !scratch.join("out").exists(),
        "the output is removed after each step"
    );
    let j = kquant_json(&[
        "bench",
        "convert",
        src,
        "--scratch",
        s,
        "--json",
        "--repeat",
        "3",
        "--",
        "eagle3",
        "--to",
        "vllm",
    ]);
    check(&j, 3);
    assert!(j["baseline_s"].is_null() && j["baseline_runs_s"].is_null());
    let e = kquant(&[
        "bench",
        "convert",
        src,
        "--scratch",
        s,
        "--repeat",
        "0",
        "--",
        "eagle3",
    ]);
    assert_eq!(e.status.code(), Some(2));
    // Nothing after `--`: the hint names the kinds and engines `convert` takes.
    let e = kquant(&["bench", "convert", src, "--scratch", s]);
    assert_eq!(e.status.code(), Some(2));
    let err = String::from_utf8_lossy(&e.stderr);
    let hint = err
        .lines()
        .find_map(|l| l.strip_prefix("hint: "))
        .unwrap_or_else(|| panic!("{err}"));
    for v in [
        "eagle3",
        "dflash",
        "sglang",
        "vllm",
        "trtllm",
        "specforge",
        "torchspec",
        "eagle",
        "zlab",
    ] {
        assert!(hint.contains(v), "{v} missing from: {hint}");
    }
}
