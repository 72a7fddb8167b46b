//! Every verb on the trained Kimi-K3 fixture (`fixtures/kimi-k3-tiny/`, made by
//! fixtures/gen/kimi-k3/run_all.sh; `--target kimi-k3-tiny`): `inspect` of the target and of its
//! K3 DSpark drafter (vLLM's `K3DSparkModel` layout), `verify` on the committed trace (kquant's
//! replay equals the PyTorch reference's walk) and live with kquant's CPU K3 runtime, `quantize`
//! with the paired gate, `sensitivity`, `convert` to vLLM. The runtime's parity with the
//! reference is tests/parity_kimi_k3.rs; the profile, tests/targets.rs.

use crate::common;

use std::path::PathBuf;

use common::{kquant, kquant_json, read_json, root, stderr};
use serde_json::Value;

const FX: &str = "fixtures/kimi-k3-tiny";

fn fix(p: &str) -> PathBuf {
    root().join(FX).join(p)
}

fn s(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

/// `inspect` reads the K3 target (its `text_config`) and the DSpark drafter (its layout, its taps
/// on this target, the profile that names it).
#[test]
fn inspect_reads_the_k3_target_and_its_dspark() {
    let j = common::inspect_json(&fix("target"));
    assert!(j["draft_target"].is_null(), "a target has no draft target");
    let o = kquant(&["inspect", s(&fix("target"))]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("KimiK3ForConditionalGeneration"), "{out}");

    let j = common::inspect_json(&fix("dspark"));
    assert_eq!(j["block_draft"]["layout"], "k3-dspark", "{j}");
    let cfg = read_json(&fix("dspark/config.json"));
    assert_eq!(cfg["target_layer_ids"], serde_json::json!([1, 3, 6]));
    assert_eq!(cfg["num_target_layers"], 3);
    let o = kquant(&["inspect", s(&fix("dspark"))]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// `verify` on the committed `partial` trace replays the drafter as the PyTorch reference does
/// (fixtures/gen/kimi-k3/replay_ref.py): the same walk, to the last digit, and above 1.5.
#[test]
fn verify_on_the_trace_equals_the_reference_walk() {
    let py = read_json(&fix("reference/replay-dspark.json"));
    assert_eq!(py["tap_stream"], "partial");
    let rep = kquant_json(&[
        "verify",
        "--target",
        "kimi-k3-tiny",
        "--draft",
        s(&fix("dspark")),
        "--trace",
        s(&fix("trace")),
        "--json",
        "-",
    ]);
    let al = rep["draft"]["accept_length"].as_f64().unwrap();
    let want = py["aggregate"]["all"]["al_walk"].as_f64().unwrap();
    eprintln!("kimi-k3-tiny dspark: kquant AL {al:.6}, reference {want:.6}");
    assert!((al - want).abs() < 1e-9, "{al} vs {want}: {rep}");
    assert!(al > 1.5, "{al}");
    for c in ["code", "prose", "arith"] {
        let a = rep["per_category"][c]["draft"].as_f64();
        let b = py["aggregate"][c]["al_walk"].as_f64();
        assert!(
            matches!((a, b), (Some(a), Some(b)) if (a - b).abs() < 1e-9),
            "{c}: {a:?} vs {b:?}"
        );
    }
}

/// `verify --target kimi-k3-tiny` with no trace captures one held-out prompt per category with
/// kquant's CPU K3 runtime (taps on `partial`, the drafter's stream) and replays: the same accept
/// length as the committed trace's first prompt per category; a quantized drafter is gated
/// against it, paired on the same live capture.
#[test]
fn live_verify_and_the_quantize_gate_run_on_the_k3_runtime() {
    let d = fix("dspark");
    let verify = |draft: &std::path::Path, trace: Option<&std::path::Path>| {
        let mut a = vec![
            "verify",
            "--target",
            "kimi-k3-tiny",
            "--draft",
            s(draft),
            "--baseline",
            s(&d),
            "--limit",
            "1",
            "--json",
            "-",
        ];
        if let Some(t) = trace {
            a.extend(["--trace", s(t)]);
        }
        let o = kquant(&a);
        assert!(
            matches!(o.status.code(), Some(0) | Some(1)),
            "{a:?}: {}",
            stderr(&o)
        );
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        (o.status.code(), v)
    };
    let (code, live) = verify(&d, None);
    assert_eq!(code, Some(0), "{live}");
    assert_eq!(live["trace"], "live capture");
    assert_eq!(live["target"], "kimi-k3-tiny");
    assert_eq!(live["delta"].as_f64(), Some(0.0));
    assert_eq!(live["per_category"].as_object().unwrap().len(), 3);
    let (_, committed) = verify(&d, Some(&fix("trace")));
    assert_eq!(
        committed["draft"]["accept_length"], live["draft"]["accept_length"],
        "the live capture is the committed trace"
    );
    assert!(
        live["draft"]["accept_length"].as_f64().unwrap() > 1.5,
        "{live}"
    );

    let t = tempfile::tempdir().unwrap();
    let q = t.path().join("q");
    let o = kquant(&["quantize", s(&d), "-o", s(&q), "--scheme", "int4-pc"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j = common::inspect_json(&q);
    assert_eq!(j["block_draft"]["layout"], "k3-dspark");
    assert_eq!(j["quantization"]["quantized"], true);
    let (code, r) = verify(&q, None);
    let (al, base) = (
        r["draft"]["accept_length"].as_f64().unwrap(),
        r["baseline"]["accept_length"].as_f64().unwrap(),
    );
    eprintln!("kimi-k3-tiny dspark int4-pc: AL {al:.4} vs {base:.4}, exit {code:?}");
    assert_eq!(r["trace"], "live capture");
    assert_eq!(
        r["baseline"]["accept_length"],
        live["draft"]["accept_length"]
    );
    assert_eq!(code, Some(if r["passed"] == true { 0 } else { 1 }), "{r}");
}

/// `sensitivity` of the K3 DSpark drafter on a live capture of the K3 target: every module group
/// measured, seven proposals per block.
#[test]
fn k3_dspark_sensitivity_runs_on_the_live_k3_target() {
    let o = kquant(&[
        "sensitivity",
        s(&fix("dspark")),
        "--target",
        "kimi-k3-tiny",
        "--limit",
        "1",
        "--max-regression",
        "1000",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["schema"], "kquant.sensitivity/1");
    assert_eq!(doc["samples"], 3, "one live prompt per category");
    let groups = doc["groups"].as_array().unwrap();
    assert!(groups.len() >= 3, "{doc}");
    for g in groups {
        let m = &g["measured"];
        assert!(m["delta"].as_f64().unwrap().is_finite(), "{g}");
        assert_eq!(m["agreement_per_depth"].as_array().unwrap().len(), 7, "{g}");
    }
}

/// `convert dspark --to vllm` keeps the drafter byte for byte (vLLM's own layout), and the other
/// engines are refused with the reason.
#[test]
fn the_k3_dspark_converts_to_vllm_only() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("v");
    let o = kquant(&[
        "convert",
        "dspark",
        s(&fix("dspark")),
        "--to",
        "vllm",
        "-o",
        s(&out),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let (a, b) = (
        read_json(&out.join("config.json")),
        read_json(&fix("dspark/config.json")),
    );
    assert_eq!(a["architectures"], b["architectures"]);
    assert_eq!(a["target_layer_ids"], b["target_layer_ids"]);
    assert_eq!(a["num_target_layers"], 3);
    assert_eq!(
        common::load(&out.join("model.safetensors")),
        common::load(&fix("dspark/model.safetensors"))
    );
    for to in ["sglang", "specforge", "speculators"] {
        let o = kquant(&[
            "convert",
            "dspark",
            s(&fix("dspark")),
            "--to",
            to,
            "-o",
            s(&t.path().join(to)),
        ]);
        assert_eq!(o.status.code(), Some(2), "{to}");
        let e = stderr(&o);
        assert!(e.starts_with("error:") && e.contains("hint:"), "{to}: {e}");
    }
}

/// The measured example of docs/verify.md, "Tap streams": the drafter (trained on `partial`,
/// named so by the profile's `published_drafts`) is refused on the `mixture` trace, and replayed
/// there with `--allow-stream-mismatch` gives the PyTorch reference's walk on that trace, well
/// below its own stream's.
#[test]
fn the_drafter_on_the_other_stream_is_refused_and_measured_when_allowed() {
    let args = |trace: &str| {
        vec![
            "verify".to_string(),
            "--target".into(),
            "kimi-k3-tiny".into(),
            "--draft".into(),
            s(&fix("dspark")).into(),
            "--trace".into(),
            s(&fix(trace)).into(),
        ]
    };
    let a = args("trace-mixture");
    let o = kquant(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("trained on the `partial` tap stream")
            && err.contains("the trace holds the `mixture` stream")
            && err.contains("--allow-stream-mismatch"),
        "{err}"
    );
    let mut a = args("trace-mixture");
    a.extend(["--allow-stream-mismatch", "--json", "-"].map(String::from));
    let rep = kquant_json(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let py = read_json(&fix("reference/replay-dspark-mixture.json"));
    assert_eq!(py["tap_stream"], "mixture");
    let al = rep["draft"]["accept_length"].as_f64().unwrap();
    let want = py["aggregate"]["all"]["al_walk"].as_f64().unwrap();
    assert!((al - want).abs() < 1e-9, "{al} vs {want}");
    assert_eq!(rep["tap_stream"]["trace"], "mixture");
    assert_eq!(rep["tap_stream"]["mismatch_allowed"], true);
    let own = read_json(&fix("reference/replay-dspark.json"))["aggregate"]["all"]["al_walk"]
        .as_f64()
        .unwrap();
    assert!(own - al > 0.3, "partial {own} vs mixture {al}");
}

/// `bench replay --stream` records a synthetic trace on the stream asked: on the drafter's own
/// (`partial`) `verify` replays it, on the other it refuses; on a target without attention
/// residuals `--stream mixture` is refused before any work.
#[test]
fn bench_replay_records_its_synthetic_trace_on_the_stream_asked() {
    let tmp = tempfile::tempdir().unwrap();
    for (stream, code) in [("partial", 0), ("mixture", 2)] {
        let tr = tmp.path().join(stream);
        let o = kquant(&[
            "bench",
            "replay",
            s(&fix("dspark")),
            "--target-checkpoint",
            s(&fix("target")),
            "--synthetic-trace",
            "48",
            "--write-trace",
            s(&tr),
            "--stream",
            stream,
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert_eq!(read_json(&tr.join("manifest.json"))["tap_stream"], stream);
        let o = kquant(&[
            "verify",
            "--target",
            "kimi-k3-tiny",
            "--draft",
            s(&fix("dspark")),
            "--trace",
            s(&tr),
        ]);
        assert_eq!(o.status.code(), Some(code), "{stream}: {}", stderr(&o));
    }
    let o = kquant(&[
        "bench",
        "replay",
        s(&root().join("fixtures/kimi-k2.5-tiny/eagle3")),
        "--target-checkpoint",
        s(&root().join("fixtures/kimi-k2.5-tiny/target")),
        "--synthetic-trace",
        "48",
        "--stream",
        "mixture",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("has no attention residuals"),
        "{}",
        stderr(&o)
    );
}
