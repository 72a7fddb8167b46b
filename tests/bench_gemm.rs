//! `kquant bench gemm` through the real binary: the CPU device (kernel replay) reports the regime
//! it picks per M, or every regime `--regime` names, with the figures and goals, and a device
//! this build lacks exits 2 with a hint.

use crate::common;

use common::kquant;
use serde_json::Value;

#[test]
fn cpu_device_reports_every_regime() {
    let out = kquant(&[
        "bench",
        "gemm",
        "--device",
        "cpu",
        "--shapes",
        "264x40,128x24",
        "--m",
        "1,16,130",
        "--iters",
        "1",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["schema"], "kquant.bench.gemm/1");
    assert_eq!(doc["emulated"], true);
    let rows = doc["results"].as_array().unwrap();
    assert_eq!(rows.len(), 6, "2 shapes × 3 M");
    let regimes: Vec<&str> = rows.iter().map(|r| r["regime"].as_str().unwrap()).collect();
    // The regime the device picks: the CPU replay has sm_90's thresholds (measured on an H200:
    // MMA from M = 1, dense above 64).
    assert_eq!(regimes, ["mma", "mma", "dense", "mma", "mma", "dense"]);
    for r in rows {
        let (k, n) = (r["k"].as_u64().unwrap(), r["n"].as_u64().unwrap());
        assert!((k, n) == (264, 40) || (k, n) == (128, 24));
        // Packed bytes: N rows of ⌈K/32⌉ 16-byte chunks.
        assert_eq!(r["weight_bytes"].as_u64().unwrap(), n * k.div_ceil(32) * 16);
        let t = r["seconds"].as_f64().unwrap();
        assert!(t > 0.0);
        let gbs = r["weight_gb_per_s"].as_f64().unwrap();
        assert!((gbs - r["weight_bytes"].as_f64().unwrap() / t / 1e9).abs() <= 1e-9 * gbs.max(1.0));
        assert!(r["pct_of_copy"].as_f64().unwrap() > 0.0);
        assert!(r["bf16_blas_seconds"].as_f64().unwrap() > 0.0);
        // The GPU goals mean nothing for the CPU replay: none set, none met or missed.
        assert!(r["goal"].is_null() && r["goal_met"].is_null(), "{r}");
        // Enough weight copies to stream more than twice the (sm_90) L2.
        let copies = r["weight_copies"].as_u64().unwrap();
        assert!(copies * r["weight_bytes"].as_u64().unwrap() > 2 * (50 << 20));
    }
    // One crossover per shape: where the measured INT4 kernels lose to the bf16 GEMM (timings of
    // the replay: any M, or none) and where the device's tuning sends M to regime C.
    let c = doc["crossovers"].as_array().unwrap();
    assert_eq!(c.len(), 2);
    for x in c {
        assert_eq!(x["regime_c_from_m"], 17);
        let m = &x["int4_slower_than_bf16_from_m"];
        assert!(
            m.is_null() || [1, 16, 130].contains(&m.as_u64().unwrap()),
            "{x}"
        );
    }
    // The emulation compiles nothing.
    assert!(doc["kernels"].is_null());
}

#[test]
fn cpu_table_names_the_replay() {
    let out = kquant(&[
        "bench",
        "gemm",
        "--shapes",
        "64x16",
        "--m",
        "1,9",
        "--iters",
        "1",
        "--regime",
        "gemv,mma,dense",
    ]);
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    // Every named regime at every M it takes: GEMV only at M = 1 (it takes M ≤ 8).
    let rows: Vec<(String, String)> = s
        .lines()
        .filter(|l| l.starts_with("64x16"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[3].to_string(), f[4].to_string())
        })
        .collect();
    let want = [
        ("1", "gemv"),
        ("1", "mma"),
        ("1", "dense"),
        ("9", "mma"),
        ("9", "dense"),
    ];
    assert_eq!(
        rows,
        want.map(|(m, r)| (m.to_string(), r.to_string())),
        "{s}"
    );
    assert!(s.contains("cpu (kernel emulation"), "{s}");
    assert!(
        s.lines()
            .any(|l| l.starts_with("crossover 64x16: INT4 kernels ") && l.contains("from M = 17")),
        "{s}"
    );
    assert!(s.contains("% copy") && s.contains("speed-up"), "{s}");
    assert!(
        s.contains("64x16") && s.contains("gemv") && s.contains("mma"),
        "{s}"
    );
    // No GPU goal on the CPU replay (it printed 25 "MISSED" for the default shapes), and the
    // note that says so comes first, before any figure.
    assert!(
        !s.contains("≥85% of copy") && !s.contains("MISSED") && !s.contains("  goal"),
        "{s}"
    );
    let note = s.find("note: cpu runs the kernels' CPU replay").expect(&s);
    assert!(note < s.find("64x16").unwrap(), "{s}");
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_without_the_feature_exits_2_with_a_hint() {
    let out = kquant(&["bench", "gemm", "--device", "cuda", "--shapes", "64x16"]);
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("error: device `cuda`"), "{e}");
    assert!(e.contains("hint: rebuild with --features cuda"), "{e}");
}

#[cfg(not(feature = "hip"))]
#[test]
fn hip_without_the_feature_exits_2_with_a_hint() {
    let out = kquant(&["bench", "gemm", "--device", "hip:1"]);
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("hint: rebuild with --features hip"), "{e}");
}

#[test]
fn bad_arguments_exit_2() {
    for args in [
        &["bench", "gemm", "--shapes", "36x4"][..],
        &["bench", "gemm", "--shapes", "64x8", "--m", "0"],
        &["bench", "gemm", "--device", "tpu"],
    ] {
        let out = kquant(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains("error:") && e.contains("hint:"), "{args:?}: {e}");
    }
    // A refused --shapes is answered with the forms it takes and what `kimi` stands for.
    for bad in ["36x4", "kimmi", "64,8,16"] {
        let out = kquant(&["bench", "gemm", "--shapes", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let e = String::from_utf8_lossy(&out.stderr);
        let hint = e
            .lines()
            .find_map(|l| l.strip_prefix("hint: "))
            .unwrap_or_else(|| panic!("{e}"));
        assert!(
            hint.contains("`kimi`") && hint.contains("`KxN,KxN,…`") && hint.contains("`K,N,K,N,…`"),
            "{hint}"
        );
        for (name, k, n) in kquant::cli::bench_gemm::KIMI {
            assert!(hint.contains(&format!("{name} {k}x{n}")), "{hint}");
        }
    }
}
