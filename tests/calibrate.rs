//! `kquant calibrate` on the trained tiny Kimi EAGLE-3 draft and its trace, then
//! `kquant quantize --scheme nvfp4 --input-amax` with the file it wrote (compressed-tensors and
//! ModelOpt) and `kquant verify` on the W4A4 drafts: the observed amax is what the replay fed
//! each linear (fc's is the largest |tap| it read, checked from the trace directly), fused
//! siblings read one input, and the static input scales are the formats' functions of it.

use crate::common;

use std::path::Path;
use std::process::Output;

use common::{kquant, load, read_json};
use kquant::io::Dtype;
use kquant::quant::compressed_tensors::nvfp4::global_scale;
use kquant::quant::math::int4::round_to;
use kquant::trace::file::Trace;
use serde_json::Value;

const DRAFT: &str = "fixtures/kimi-k2.5-tiny/eagle3";
const TARGET: &str = "fixtures/kimi-k2.5-tiny/target";
const TRACE: &str = "fixtures/kimi-k2.5-tiny/trace";
const LIMIT: usize = 6;

/// `kquant calibrate --draft DRAFT --trace TRACE --target-checkpoint TARGET --limit LIMIT -o OUT
/// EXTRA…`.
fn calibrate_run(limit: usize, out: &Path, extra: &[&str]) -> Output {
    let limit = limit.to_string();
    let mut args = vec![
        "calibrate",
        "--draft",
        DRAFT,
        "--trace",
        TRACE,
        "--target-checkpoint",
        TARGET,
        "--limit",
        &limit,
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    kquant(&args)
}

/// A calibration over the first [`LIMIT`] samples, which must succeed: the file it wrote.
fn calibrate(out: &Path) -> Value {
    let o = calibrate_run(LIMIT, out, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("calibrated 9 linear(s) over 6 sample(s)"));
    read_json(out)
}

fn f32_scalar(t: &common::Tensors, name: &str) -> f32 {
    let (dtype, _, b) = &t[name];
    assert_eq!(dtype, "F32", "{name}");
    f32::from_le_bytes(b[..4].try_into().unwrap())
}

#[test]
fn calibrate_then_nvfp4_input_scales_and_verify() {
    let t = tempfile::tempdir().unwrap();
    let amax_path = t.path().join("amax.json");
    let doc = calibrate(&amax_path);
    assert_eq!(doc["schema"], "kquant.input-amax/1");
    assert_eq!(doc["samples"], LIMIT);
    let amax: std::collections::BTreeMap<String, f32> = doc["amax"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_f64().unwrap() as f32))
        .collect();
    let names: Vec<&str> = amax.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "fc",
            "lm_head",
            "midlayer.mlp.down_proj",
            "midlayer.mlp.gate_proj",
            "midlayer.mlp.up_proj",
            "midlayer.self_attn.k_proj",
            "midlayer.self_attn.o_proj",
            "midlayer.self_attn.q_proj",
            "midlayer.self_attn.v_proj",
        ],
        "checkpoint module names in the draft's own naming"
    );
    assert!(amax.values().all(|v| v.is_finite() && *v > 0.0), "{amax:?}");
    // One input each: q/k/v, gate/up.
    let a = |m: &str| amax[&format!("midlayer.{m}")];
    assert_eq!(a("self_attn.q_proj"), a("self_attn.k_proj"));
    assert_eq!(a("self_attn.q_proj"), a("self_attn.v_proj"));
    assert_eq!(a("mlp.gate_proj"), a("mlp.up_proj"));
    assert_ne!(a("self_attn.q_proj"), a("mlp.gate_proj"));
    // fc reads the taps of every pair t = 0..T−2 of every replayed sample: its amax is their
    // largest |value|, from the trace directly.
    let trace = Trace::open(&common::root().join(TRACE)).unwrap();
    let mut want = 0f32;
    for s in trace.manifest.samples.iter().take(LIMIT) {
        let rows = trace.tokens(s).unwrap().len() - 1;
        for i in [1, 2, 3] {
            let tap = trace.tap(s, i).unwrap();
            want = tap[..rows * 256].iter().fold(want, |m, v| m.max(v.abs()));
        }
    }
    assert_eq!(
        amax["fc"], want,
        "fc input amax = max |tap| over the replayed pairs"
    );

    let q = a("self_attn.q_proj");
    for (format, name) in [
        ("modelopt", "input_scale"),
        ("compressed-tensors", "input_global_scale"),
    ] {
        let out = t.path().join(format);
        let o = kquant(&[
            "quantize",
            DRAFT,
            "-o",
            out.to_str().unwrap(),
            "--scheme",
            "nvfp4",
            "--format",
            format,
            "--input-amax",
            amax_path.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let ts = load(&out.join("model.safetensors"));
        let s = |m: &str| f32_scalar(&ts, &format!("midlayer.{m}.{name}"));
        let got = s("self_attn.q_proj");
        assert_eq!(
            got,
            s("self_attn.k_proj"),
            "{format}: fused q/k/v share one scale"
        );
        assert_eq!(got, s("self_attn.v_proj"), "{format}");
        assert_eq!(s("mlp.gate_proj"), s("mlp.up_proj"), "{format}");
        let fc = f32_scalar(&ts, &format!("fc.{name}"));
        if format == "modelopt" {
            // amax / (6·448) in f32.
            assert_eq!(got, q / 2688.0);
            assert_eq!(fc, amax["fc"] / 2688.0);
        } else {
            // generate_gparam in the model dtype: bf16(bf16(1 / bf16(amax)) · 448·6).
            assert_eq!(got, global_scale(round_to(Dtype::BF16, q), Dtype::BF16));
            assert!(
                (got - 2688.0 / q).abs() <= 2688.0 / q * 2.0 / 128.0,
                "{got} vs {q}"
            );
            assert_eq!(
                fc,
                global_scale(round_to(Dtype::BF16, amax["fc"]), Dtype::BF16)
            );
        }
        // The W4A4 draft replays (weights dequantized; activations in f32).
        let o = kquant(&[
            "verify",
            "--draft",
            out.to_str().unwrap(),
            "--trace",
            TRACE,
            "--target-checkpoint",
            TARGET,
            "--json",
            "-",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        let al = v["draft"]["accept_length"].as_f64().unwrap();
        eprintln!("{format} nvfp4 W4A4: accept length {al:.4}");
        assert!(al > 2.5, "{format}: AL {al}");
    }
}

#[test]
fn calibrate_refuses_a_dflash_draft_without_its_target() {
    let t = tempfile::tempdir().unwrap();
    let o = kquant(&[
        "calibrate",
        "--draft",
        "fixtures/kimi-k2.5-tiny/dflash",
        "--trace",
        TRACE,
        "-o",
        t.path().join("a.json").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("hint: pass --target-checkpoint"));
    assert!(!t.path().join("a.json").exists());
}

/// `--json` prints one `kquant.calibrate/1` document on stdout: the file written, what the
/// replay observed (matching the file), the warnings and the `quantize` lines that use it, which
/// stderr prints as `next:` lines too.
#[test]
fn json_describes_the_calibration_and_what_comes_next() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("amax.json");
    let o = calibrate_run(1, &out, &["--json"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{e}");
    let doc: Value = serde_json::from_slice(&o.stdout).expect("stdout is one JSON document");
    assert_eq!(doc["schema"], "kquant.calibrate/1");
    assert_eq!(doc["output"], out.to_str().unwrap());
    assert_eq!(doc["draft"], DRAFT);
    assert_eq!(doc["target_checkpoint"], TARGET);
    assert_eq!(doc["samples"], 1);
    assert_eq!(doc["steps"], 3);
    assert_eq!(doc["warnings"], serde_json::json!([]));
    let file = read_json(&out);
    let amax: Vec<f64> = file["amax"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(doc["linears"], amax.len());
    let max = amax.iter().copied().fold(0f64, f64::max);
    assert!(
        (doc["amax_max"].as_f64().unwrap() - max).abs() <= max * 1e-6,
        "{doc}"
    );
    assert!(doc["accept_length"].as_f64().unwrap() >= 1.0, "{doc}");
    let next: Vec<&str> = doc["next"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(next.len(), 2, "{next:?}");
    for (n, format) in next.iter().zip(["compressed-tensors", "modelopt"]) {
        assert!(
            n.starts_with(&format!("kquant quantize {DRAFT} "))
                && n.contains(&format!(
                    "--scheme nvfp4 --format {format} --input-amax {}",
                    out.display()
                )),
            "{n}"
        );
        assert!(e.contains(&format!("next: {n}")), "{e}");
    }
}
