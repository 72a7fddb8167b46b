//! `kquant bench replay` end to end on the trained `kimi-k2.5-tiny` drafts: the JSON report's
//! fields and rates, the synthetic trace it builds (a valid trace for the draft: `kquant verify`
//! replays it and finds the same accept length), a slice of the committed trace, a DFlash draft's
//! depths, and the refusals.

use crate::common;

use std::path::Path;

use common::{kquant, kquant_json, read_json, root};
use serde_json::Value;

const EAGLE3: &str = "fixtures/kimi-k2.5-tiny/eagle3";
const MLA: &str = "fixtures/kimi-k2.5-tiny/eagle3-mla";
const DFLASH: &str = "fixtures/kimi-k2.5-tiny/dflash";
const TARGET: &str = "fixtures/kimi-k2.5-tiny/target";
const TRACE: &str = "fixtures/kimi-k2.5-tiny/trace";

fn positive(j: &Value, k: &str) -> f64 {
    let v = j[k]
        .as_f64()
        .unwrap_or_else(|| panic!("`{k}` missing: {j}"));
    assert!(v > 0.0 && v.is_finite(), "`{k}` = {v}");
    v
}

/// `kquant bench replay MLA --synthetic-trace 64 --samples 2 --write-trace TRACE --json`.
fn replay_synthetic(trace: &Path) -> Value {
    kquant_json(&[
        "bench",
        "replay",
        MLA,
        "--synthetic-trace",
        "64",
        "--samples",
        "2",
        "--write-trace",
        trace.to_str().unwrap(),
        "--json",
    ])
}

#[test]
fn synthetic_trace_report_and_the_trace_verify_accepts() {
    let t = tempfile::tempdir().unwrap();
    let tr = t.path().join("trace");
    let j = replay_synthetic(&tr);
    assert_eq!(j["schema"], "kquant.bench.replay/1");
    assert_eq!(j["family"], "eagle3-mla");
    assert_eq!(j["trace"], "synthetic");
    assert_eq!(j["synthetic"]["len"], 64);
    assert_eq!(j["synthetic"]["prompt_len"], 8, "LEN / 8 by default");
    assert_eq!(
        (j["samples"].as_u64(), j["depths"].as_u64()),
        (Some(2), Some(3))
    );
    assert_eq!(j["positions"], 2 * (64 - 8));
    for k in [
        "draft_bytes",
        "load_s",
        "pass_a_s",
        "token_depths_per_s",
        "positions_per_s",
        "rss_after_load_bytes",
        "peak_rss_after_load_bytes",
        "peak_rss_bytes",
        "accept_length",
    ] {
        positive(&j, k);
    }
    let rate = positive(&j, "token_depths_per_s");
    let want = j["positions"].as_f64().unwrap() * 3.0 / j["pass_a_s"].as_f64().unwrap();
    assert!((rate - want).abs() <= 1e-9 * want, "{rate} vs {want}");
    assert!(j["peak_rss_bytes"].as_u64() >= j["peak_rss_after_load_bytes"].as_u64());

    // The kept trace is a kquant-trace/1 fitting the draft: verify replays it (exit 0) and
    // counts the same accept length as the bench's replay.
    let m = read_json(&tr.join("manifest.json"));
    assert_eq!(m["format"], "kquant-trace/1");
    assert_eq!(m["taps"], serde_json::json!([1, 2, 3]), "the draft's taps");
    assert_eq!(
        (m["hidden_size"].as_u64(), m["vocab_size"].as_u64()),
        (Some(256), Some(2048))
    );
    let v = kquant_json(&[
        "verify",
        "--draft",
        MLA,
        "--trace",
        tr.to_str().unwrap(),
        "--json",
        "-",
    ]);
    assert_eq!(v["draft"]["accept_length"], j["accept_length"]);

    // Deterministic: a second synthetic trace has the same bytes.
    let tr2 = t.path().join("trace2");
    replay_synthetic(&tr2);
    assert_eq!(read_json(&tr2.join("manifest.json"))["shards"], m["shards"]);
}

#[test]
fn a_slice_of_the_committed_trace_and_a_dflash_draft() {
    let j = kquant_json(&[
        "bench",
        "replay",
        EAGLE3,
        "--target-checkpoint",
        TARGET,
        "--trace",
        TRACE,
        "--samples",
        "4",
        "--json",
    ]);
    let m = read_json(&root().join(TRACE).join("manifest.json"));
    let gen: u64 = m["samples"].as_array().unwrap()[..4]
        .iter()
        .map(|s| s["gen_len"].as_u64().unwrap())
        .sum();
    assert_eq!(
        (j["samples"].as_u64(), j["positions"].as_u64()),
        (Some(4), Some(gen))
    );
    assert_eq!(j["synthetic"], Value::Null);
    let al = positive(&j, "accept_length");
    assert!(
        al > 2.0,
        "the trained draft accepts on its own held-out trace: {al}"
    );
    positive(&j, "token_depths_per_s");

    // A block drafter reports its block size − 1 depths whatever --steps says.
    let d = kquant_json(&[
        "bench",
        "replay",
        DFLASH,
        "--target-checkpoint",
        TARGET,
        "--synthetic-trace",
        "40",
        "--prompt-len",
        "10",
        "--json",
    ]);
    assert_eq!(
        (d["family"].as_str(), d["depths"].as_u64()),
        (Some("dflash"), Some(7))
    );
    assert_eq!(d["positions"], 30);
    positive(&d, "token_depths_per_s");
}

#[test]
fn refusals_exit_2() {
    let o = kquant(&["bench", "replay", EAGLE3]);
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("--target-checkpoint"), "{e}");

    let o = kquant(&[
        "bench",
        "replay",
        MLA,
        "--synthetic-trace",
        "16",
        "--prompt-len",
        "16",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("prompt length"));

    let o = kquant(&[
        "bench",
        "replay",
        MLA,
        "--trace",
        TRACE,
        "--synthetic-trace",
        "16",
    ]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "--trace and --synthetic-trace conflict"
    );
}

/// `--device`: the replay with the linears on a device (here the kernels' CPU replay) splits pass
/// A into the CPU products, the device layers and the rest, and finds the accept length the f32
/// runtime finds; a device the build lacks is refused before anything is read.
#[test]
fn a_device_replay_reports_where_pass_a_went() {
    let args = |device: &str, step: &str| {
        kquant_json(&[
            "bench",
            "replay",
            EAGLE3,
            "--target-checkpoint",
            TARGET,
            "--trace",
            TRACE,
            "--samples",
            "3",
            "--device",
            device,
            "--step",
            step,
            "--json",
        ])
    };
    let (cpu, emu, per) = (
        args("cpu", "whole"),
        args("cpu-emu", "whole"),
        args("cpu-emu", "per-linear"),
    );
    assert!(cpu["device"].is_null() && cpu["device_calls"] == 0, "{cpu}");
    assert!(cpu["device_step"].is_null(), "{cpu}");
    assert!(emu["device"].as_str().unwrap().contains("kernel emulation"));
    // The whole step on the device: one pass per sample, no CPU product.
    assert_eq!(emu["device_step"]["whole"], true, "{emu}");
    assert_eq!(emu["device_calls"], 3, "{emu}");
    assert_eq!(emu["gemm_flops"], 0, "{emu}");
    // Per linear: fc, q/k/v/o, gate/up/down and the lm_head's argmax, once per depth and sample
    // at least.
    assert_eq!(per["device_step"]["whole"], false, "{per}");
    assert!(per["device_step"]["why"]
        .as_str()
        .unwrap()
        .contains("per-linear"));
    assert!(per["device_calls"].as_u64().unwrap() >= 3 * 3 * 9, "{per}");
    for r in [&emu, &per] {
        let (pass_a, device_s, gemm_s, rest_s) = (
            positive(r, "pass_a_s"),
            positive(r, "device_s"),
            r["gemm_s"].as_f64().unwrap(),
            r["rest_s"].as_f64().unwrap(),
        );
        assert!(
            (device_s + gemm_s + rest_s - pass_a).abs() <= 1e-6 * pass_a.max(1.0) + 1e-9,
            "the phases add up to pass A: {r}"
        );
    }
    let human = kquant(&[
        "bench",
        "replay",
        EAGLE3,
        "--target-checkpoint",
        TARGET,
        "--trace",
        TRACE,
        "--device",
        "cpu-emu",
    ]);
    let out = String::from_utf8_lossy(&human.stdout);
    assert!(
        out.contains("pass A phases   the whole step on cpu (kernel emulation"),
        "{out}"
    );
    // The emulation rounds activations to bf16 as a device does: within the bound docs/kernels.md
    // states for a device against the f32 runtime.
    for r in [&emu, &per] {
        let (a, b) = (
            positive(&cpu, "accept_length"),
            positive(r, "accept_length"),
        );
        assert!((a - b).abs() <= 0.05, "cpu {a} vs cpu-emu {b}");
    }
    if !cfg!(feature = "cuda") {
        let o = kquant(&["bench", "replay", EAGLE3, "--device", "cuda"]);
        assert_eq!(o.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&o.stderr).contains("--features cuda"));
    }
}
