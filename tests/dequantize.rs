//! `kquant dequantize` and `kquant diff`, including on files AMD Quark itself wrote: the codes
//! and scales read back must be the ones Quark recorded in golden_rows.json.

use crate::common;

use std::path::{Path, PathBuf};

use common::{golden, kquant};
use serde_json::Value;

const TINY: &str = "fixtures/tiny/eagle3-specforge";

/// A checkpoint dir from a golden's exported model + config.
fn golden_dir(t: &Path, rel: &str) -> PathBuf {
    common::golden_checkpoint(
        t,
        &golden(rel),
        "export_model.safetensors",
        "export_config.json",
    )
}

fn f32_tensor(dir: &Path, name: &str) -> Vec<f32> {
    let (dtype, _, data) = &common::load(&dir.join("model.safetensors"))[name];
    assert_eq!(dtype, "F32");
    common::floats(dtype, data)
}

fn check_against_golden_rows(golden_rel: &str) {
    let t = tempfile::tempdir().unwrap();
    let src = golden_dir(t.path(), golden_rel);
    let out = t.path().join("dq");
    common::dequantize(&src, &out, &["--dtype", "f32"], golden_rel);
    let rows = common::read_json(&golden(golden_rel).join("golden_rows.json"));
    let name = rows["tensor"].as_str().unwrap();
    let w = f32_tensor(&out, name);
    for r in rows["rows"].as_array().unwrap() {
        let row = r["row"].as_u64().unwrap() as usize;
        let s = r
            .get("stored_scale_f32")
            .or_else(|| r.get("stored_scale"))
            .and_then(Value::as_f64)
            .unwrap() as f32;
        let q: Vec<f32> = r["q_int4"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap() as f32 * s)
            .collect();
        let cols = q.len();
        assert_eq!(
            &w[row * cols..(row + 1) * cols],
            q.as_slice(),
            "{golden_rel}: row {row}"
        );
    }
}

#[test]
fn quark_model_path_reads_back_quarks_codes() {
    check_against_golden_rows("quark-0.13/int4_pc_bf16");
    check_against_golden_rows("quark-0.13/int4_pc_bfloat16_quark_order");
}

#[test]
fn quark_file2file_is_read_as_sequential_despite_its_config() {
    // Quark's file-to-file export says pack_method "reorder" but packs sequentially; kquant
    // recognises the layout (no zero-point tensor) and decodes Quark's codes exactly.
    check_against_golden_rows("file2file/q013_bf16");
    check_against_golden_rows("file2file/q0111_bfloat16");
}

#[test]
fn dequantize_defaults_to_the_config_dtype_and_drops_quantization_config() {
    let (t, q, _) = common::quantize(TINY, &["--exclude", "fc,lm_head"]);
    let dq = t.path().join("dq");
    common::dequantize(&q, &dq, &[], TINY);
    let j = common::inspect_json(&dq);
    assert_eq!(j["quantization"]["quantized"], false);
    assert_eq!(j["family"], "eagle3");
    let q_proj = j["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "midlayer.self_attn.q_proj.weight")
        .unwrap();
    assert_eq!(q_proj["dtype"], "BF16");
    assert_eq!(q_proj["shape"], serde_json::json!([64, 128]));
    // Unquantized input: nothing to do, exit 2.
    let o = kquant(&[
        "dequantize",
        TINY,
        "-o",
        t.path().join("x").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no quantized modules"));
}

/// `--dry-run` prints each tensor (dequantized from which stored tensors, or copied) and writes
/// nothing, as text or as `kquant.dequantize-plan/1`; `--json` on a real run prints
/// `kquant.dequantize/1` with the output, its files and the next lines, and only that on stdout.
#[test]
fn dry_run_writes_nothing_and_json_describes_plan_and_result() {
    let (t, q, _) = common::quantize(TINY, &["--exclude", "fc,lm_head"]);
    let q = q.to_str().unwrap();
    let dq = t.path().join("dq");
    let dqs = dq.to_str().unwrap();
    let o = kquant(&["dequantize", q, "-o", dqs, "--dry-run"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!dq.exists() && !t.path().join(".dq.kquant-partial").exists());
    let q_line = text
        .lines()
        .find(|l| l.starts_with("midlayer.self_attn.q_proj.weight "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        q_line.contains("BF16")
            && q_line.contains("[64, 128]")
            && q_line.contains("dequantize <- "),
        "{q_line}"
    );
    let fc_line = text.lines().find(|l| l.starts_with("fc.weight ")).unwrap();
    assert!(fc_line.ends_with("copy"), "{fc_line}");
    assert!(
        text.contains("7 modules dequantized to BF16") && text.contains("nothing written"),
        "{text}"
    );

    let plan = common::kquant_json(&[
        "dequantize",
        q,
        "-o",
        dqs,
        "--dry-run",
        "--json",
        "--dtype",
        "f32",
    ]);
    assert!(!dq.exists());
    assert_eq!(plan["schema"], "kquant.dequantize-plan/1");
    assert_eq!(plan["dtype"], "F32");
    assert_eq!(plan["dequantized"], 7);
    assert!(plan["output"].as_str().unwrap().ends_with("/dq"), "{plan}");
    let tensors = plan["tensors"].as_array().unwrap();
    let q_proj = tensors
        .iter()
        .find(|t| t["name"] == "midlayer.self_attn.q_proj.weight")
        .unwrap();
    assert_eq!(q_proj["action"], "dequantize");
    assert_eq!(q_proj["dtype"], "F32");
    assert_eq!(q_proj["bytes"], 64 * 128 * 4);
    assert!(
        q_proj["from"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == "midlayer.self_attn.q_proj.weight_scale"),
        "{q_proj}"
    );
    assert_eq!(
        tensors
            .iter()
            .filter(|t| t["action"] == "dequantize")
            .count(),
        7
    );
    let total: u64 = tensors.iter().map(|t| t["bytes"].as_u64().unwrap()).sum();
    assert_eq!(plan["bytes_after"], total);

    let o = kquant(&["dequantize", q, "-o", dqs, "--json"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&o.stdout).expect("stdout is one JSON document");
    assert_eq!(doc["schema"], "kquant.dequantize/1");
    assert_eq!(doc["dequantized"], 7);
    assert_eq!(doc["dtype"], "BF16");
    assert_eq!(doc["warnings"], serde_json::json!([]));
    let out = doc["output"].as_str().unwrap();
    assert_eq!(std::path::Path::new(out), dq.canonicalize().unwrap());
    let files: Vec<&str> = doc["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["file"].as_str().unwrap())
        .collect();
    assert!(
        files.contains(&"model.safetensors") && files.contains(&"config.json"),
        "{files:?}"
    );
    let next: Vec<&str> = doc["next"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        next[0].starts_with(&format!("kquant diff ORIGINAL {out} ")),
        "{next:?}"
    );
    // The same next lines on stderr, and the checkpoint the plan described.
    let e = String::from_utf8_lossy(&o.stderr);
    for n in &next {
        assert!(e.contains(&format!("next: {n}")), "{e}");
    }
    let j = common::inspect_json(&dq);
    assert_eq!(j["quantization"]["quantized"], false);
}

#[test]
fn diff_reports_error_of_quantized_tensors_only() {
    let (_t, q, _) = common::quantize(TINY, &["--exclude", "fc,lm_head"]);
    let o = kquant(&["diff", TINY, q.to_str().unwrap(), "--json"]);
    assert!(o.status.success());
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["schema"], "kquant.diff/1");
    let ts = j["tensors"].as_array().unwrap();
    assert_eq!(ts.len(), 15);
    for t in ts {
        let name = t["name"].as_str().unwrap();
        let quantized = name.starts_with("midlayer.") && name.ends_with("proj.weight");
        if quantized {
            let sq = t["sqnr_db"].as_f64().unwrap();
            assert!((18.0..30.0).contains(&sq), "{name}: {sq} dB");
            assert!(t["cosine"].as_f64().unwrap() > 0.99);
        } else {
            assert!(t["sqnr_db"].is_null(), "{name} must be exact");
            assert_eq!(t["max_abs"], 0.0);
        }
    }
    assert_eq!(j["flagged"], 0);
    let o = kquant(&[
        "diff",
        TINY,
        q.to_str().unwrap(),
        "--json",
        "--min-sqnr",
        "40",
    ]);
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["flagged"], 7);
    let o = kquant(&["diff", TINY, "fixtures/tiny/eagle3-vllm", "--json"]);
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        !j["only_in_a"].as_array().unwrap().is_empty()
            && !j["only_in_b"].as_array().unwrap().is_empty()
    );
}

#[test]
fn diff_stats_are_right_on_known_vectors() {
    let s = kquant::cli::diff::stats(
        "x",
        vec![4],
        &[1.0, 2.0, 3.0, 4.0],
        &[1.0, 2.0, 3.0, 5.0],
        10.0,
    );
    assert_eq!(s.max_abs, 1.0);
    assert_eq!(s.rmse, 0.5);
    assert!((s.sqnr_db - 10.0 * 30f64.log10()).abs() < 1e-12);
    assert!((s.cosine - 34.0 / (30f64.sqrt() * 39f64.sqrt())).abs() < 1e-12);
    assert!(!s.flagged);
}

fn pack_order_check(golden_rel: &str, src_model: &str, src_config: Option<&str>) -> Vec<Value> {
    let t = tempfile::tempdir().unwrap();
    let q = golden_dir(t.path(), golden_rel);
    let g = golden(golden_rel);
    let s = t.path().join("src");
    std::fs::create_dir_all(&s).unwrap();
    std::fs::copy(g.join(src_model), s.join("model.safetensors")).unwrap();
    match src_config {
        Some(c) => std::fs::copy(g.join(c), s.join("config.json"))
            .map(|_| ())
            .unwrap(),
        None => std::fs::write(s.join("config.json"), b"{}").unwrap(),
    }
    let o = kquant(&[
        "inspect",
        q.to_str().unwrap(),
        "--source",
        s.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    j["pack_order_check"].as_array().unwrap().clone()
}

#[test]
fn inspect_source_exposes_quarks_file2file_order_mismatch() {
    let f2f = pack_order_check(
        "file2file/q013_bf16",
        "src_model.safetensors",
        Some("src_config.json"),
    );
    assert_eq!(f2f.len(), 7);
    for c in &f2f {
        assert_eq!(
            (c["config_says"].as_str(), c["data_is"].as_str()),
            (Some("reorder"), Some("order")),
            "{c}"
        );
    }
    let model = pack_order_check("quark-0.13/int4_pc_bf16", "orig.safetensors", None);
    assert!(!model.is_empty());
    for c in &model {
        assert_eq!(c["config_says"], c["data_is"], "{c}");
    }
}
