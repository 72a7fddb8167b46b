//! `kquant dequantize` and `kquant diff`, including on files AMD Quark itself wrote: the codes
//! and scales read back must be the ones Quark recorded in golden_rows.json.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn kq(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kquant"))
        .current_dir(root())
        .args(args)
        .output()
        .unwrap()
}

/// A checkpoint dir from a golden's exported model + config.
fn golden_dir(t: &Path, golden: &str) -> PathBuf {
    let g = root().join("fixtures/goldens").join(golden);
    let d = t.join(golden.replace('/', "_"));
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(
        g.join("export_model.safetensors"),
        d.join("model.safetensors"),
    )
    .unwrap();
    std::fs::copy(g.join("export_config.json"), d.join("config.json")).unwrap();
    d
}

fn f32_tensor(dir: &Path, name: &str) -> Vec<f32> {
    let b = std::fs::read(dir.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let h: Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    assert_eq!(h[name]["dtype"], "F32");
    let o = h[name]["data_offsets"].as_array().unwrap();
    let (s, e) = (
        o[0].as_u64().unwrap() as usize,
        o[1].as_u64().unwrap() as usize,
    );
    b[8 + n + s..8 + n + e]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn check_against_golden_rows(golden: &str) {
    let t = tempfile::tempdir().unwrap();
    let src = golden_dir(t.path(), golden);
    let out = t.path().join("dq");
    let o = kq(&[
        "dequantize",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--dtype",
        "f32",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows: Value = serde_json::from_slice(
        &std::fs::read(
            root()
                .join("fixtures/goldens")
                .join(golden)
                .join("golden_rows.json"),
        )
        .unwrap(),
    )
    .unwrap();
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
            "{golden}: row {row}"
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
    let t = tempfile::tempdir().unwrap();
    let q = t.path().join("q");
    let dq = t.path().join("dq");
    assert!(kq(&[
        "quantize",
        "fixtures/tiny/eagle3-specforge",
        "-o",
        q.to_str().unwrap(),
        "--exclude",
        "fc,lm_head"
    ])
    .status
    .success());
    let o = kq(&[
        "dequantize",
        q.to_str().unwrap(),
        "-o",
        dq.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: Value =
        serde_json::from_slice(&kq(&["inspect", dq.to_str().unwrap(), "--json"]).stdout).unwrap();
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
    let o = kq(&[
        "dequantize",
        "fixtures/tiny/eagle3-specforge",
        "-o",
        t.path().join("x").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no quantized modules"));
}

#[test]
fn diff_reports_error_of_quantized_tensors_only() {
    let t = tempfile::tempdir().unwrap();
    let q = t.path().join("q");
    assert!(kq(&[
        "quantize",
        "fixtures/tiny/eagle3-specforge",
        "-o",
        q.to_str().unwrap(),
        "--exclude",
        "fc,lm_head"
    ])
    .status
    .success());
    let o = kq(&[
        "diff",
        "fixtures/tiny/eagle3-specforge",
        q.to_str().unwrap(),
        "--json",
    ]);
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
    let o = kq(&[
        "diff",
        "fixtures/tiny/eagle3-specforge",
        q.to_str().unwrap(),
        "--json",
        "--min-sqnr",
        "40",
    ]);
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["flagged"], 7);
    let o = kq(&[
        "diff",
        "fixtures/tiny/eagle3-specforge",
        "fixtures/tiny/eagle3-vllm",
        "--json",
    ]);
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

fn pack_order_check(golden: &str, src_model: &str, src_config: Option<&str>) -> Vec<Value> {
    let t = tempfile::tempdir().unwrap();
    let q = golden_dir(t.path(), golden);
    let g = root().join("fixtures/goldens").join(golden);
    let s = t.path().join("src");
    std::fs::create_dir_all(&s).unwrap();
    std::fs::copy(g.join(src_model), s.join("model.safetensors")).unwrap();
    match src_config {
        Some(c) => std::fs::copy(g.join(c), s.join("config.json"))
            .map(|_| ())
            .unwrap(),
        None => std::fs::write(s.join("config.json"), b"{}").unwrap(),
    }
    let o = kq(&[
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
