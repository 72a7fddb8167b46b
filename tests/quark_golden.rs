//! `kquant quantize --format quark` (`int4-pc`, and `int4-g32` per group) against the outputs of
//! AMD Quark itself (fixtures/goldens/, made by fixtures/gen/goldens/*.py with pinned amd-quark
//! 0.13 / 0.11.1): every tensor byte for byte, and the quantization_config on every field.

use crate::common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use common::{golden, kquant, load};
use serde_json::Value;

fn quantize(src: &str, extra: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let (t, out, err) = common::quantize(src, extra);
    // Only per-channel Quark INT4 is loaded by no engine; per-group loads in vLLM.
    let per_group = extra.iter().any(|a| a.starts_with("int4-g"));
    assert_eq!(
        err.contains("warning: no serving engine loads"),
        !per_group,
        "{err}"
    );
    (t, out)
}

fn check(golden_rel: &str, src_file: &str, golden_model: &str, extra: &[&str]) {
    let g = golden(golden_rel);
    let (_t, out) = quantize(&format!("fixtures/goldens/{golden_rel}/{src_file}"), extra);
    let ours = load(&out.join("model.safetensors"));
    let theirs = load(&g.join(golden_model));
    common::assert_tensors_match(golden_rel, &ours, &theirs, |_| true);
    // Config: every field equal, except that kquant's exclude adds `re:` patterns for engines.
    common::assert_config_matches(
        golden_rel,
        &out.join("config.json"),
        &g.join("export_config.json"),
        "exclude",
    );
}

#[test]
fn model_path_bf16() {
    check(
        "quark-0.13/int4_pc_bf16",
        "orig.safetensors",
        "export_model.safetensors",
        &["--exclude", "lm_head,*embed_tokens"],
    );
}

#[test]
fn model_path_f16() {
    check(
        "quark-0.13/int4_pc_float16",
        "orig.safetensors",
        "export_model.safetensors",
        &["--exclude", "lm_head,*embed_tokens"],
    );
}

#[test]
fn model_path_sequential_order() {
    check(
        "quark-0.13/int4_pc_bfloat16_quark_order",
        "orig.safetensors",
        "export_model.safetensors",
        &["--exclude", "lm_head,*embed_tokens", "--quark-sequential"],
    );
}

#[test]
fn model_path_per_group_g32_bf16() {
    check(
        "quark-0.13/int4_g32_bfloat16",
        "orig.safetensors",
        "export_model.safetensors",
        &["--scheme", "int4-g32", "--exclude", "lm_head,*embed_tokens"],
    );
}

/// The same golden read back: kquant's decoder of the transposed layout recovers codes that
/// dequantize within half a step of the source weights.
#[test]
fn per_group_golden_decodes_to_the_source() {
    use kquant::quant::math::pack::Order;
    use kquant::quant::quark::int4_group;
    let g = golden("quark-0.13/int4_g32_bfloat16");
    let src = load(&g.join("orig.safetensors"));
    let out = load(&g.join("export_model.safetensors"));
    let m = "model.layers.0.mlp.down_proj";
    let (_, shape, w) = &src[&format!("{m}.weight")];
    let (rows, cols) = (shape[0] as usize, shape[1] as usize);
    let bf = |b: &[u8]| common::floats("BF16", b);
    let scale_t = bf(&out[&format!("{m}.weight_scale")].2);
    let q = int4_group::decode(
        &out[&format!("{m}.weight")].2,
        &scale_t,
        rows,
        cols,
        32,
        Order::Reorder,
    );
    let (wf, d) = (bf(w), q.dequantize_ref());
    for i in 0..rows * cols {
        let s = q.scales[(i / cols) * (cols / 32) + (i % cols) / 32];
        // +7.5 s (the amax) clamps to the +7 code; the scale is rounded to BF16.
        assert!(
            (wf[i] - d[i]).abs() <= s * 0.5 + 1e-6 || wf[i] > 7.0 * s,
            "element {i}: {} vs {}",
            wf[i],
            d[i]
        );
    }
}

#[test]
fn per_group_input_not_divisible_is_refused_with_the_tensor() {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("m.safetensors");
    let json = br#"{"a.weight":{"dtype":"F32","shape":[8,64],"data_offsets":[0,2048]},"b.weight":{"dtype":"F32","shape":[8,40],"data_offsets":[2048,3328]}}"#;
    common::write_safetensors(&f, json, std::iter::repeat_n(0u8, 3328));
    let f = f.to_str().unwrap();
    for format in ["quark", "compressed-tensors"] {
        let (_o, out, err) =
            common::quantize_refused(f, &["--scheme", "int4-g32", "--format", format]);
        assert!(
            err.contains("`b.weight` [")
                && err.contains("not a multiple of the group size 32")
                && err.contains("m.safetensors"),
            "{err}"
        );
        assert!(!out.exists());
    }
    // Excluding it makes the rest quantizable.
    common::quantize(f, &["--scheme", "int4-g32", "--exclude", "b"]);
}

#[test]
fn per_group_file2file_is_refused() {
    let (_t, _, err) = common::quantize_refused(
        "fixtures/tiny/eagle3-specforge",
        &["--scheme", "int4-g32", "--quark-layout", "file2file"],
    );
    assert!(err.contains("file2file"));
}

#[test]
fn file2file_013_bf16() {
    check(
        "file2file/q013_bf16",
        "src_model.safetensors",
        "export_model.safetensors",
        &["--exclude", "fc,lm_head", "--quark-layout", "file2file"],
    );
}

/// The flags of the Quark 0.11.1 file-to-file goldens.
const F2F_0111: &[&str] = &[
    "--exclude",
    "fc,lm_head",
    "--quark-layout",
    "file2file",
    "--quark-version",
    "0.11.1",
];

#[test]
fn file2file_0111_bf16() {
    check(
        "file2file/q0111_bfloat16",
        "src_model.safetensors",
        "export_model.safetensors",
        F2F_0111,
    );
}

#[test]
fn file2file_0111_f16() {
    check(
        "file2file/q0111_float16",
        "src_model.safetensors",
        "export_model.safetensors",
        F2F_0111,
    );
}

#[test]
fn quantized_output_is_detected_and_refused_as_input() {
    let (_t, out) = quantize(
        "fixtures/tiny/eagle3-specforge",
        &["--exclude", "fc,lm_head"],
    );
    common::assert_detected(&out, "quark");
    common::assert_refused_as_input(&out, &out.with_extension("again"), "quark");
    common::assert_verifies(&out);
}

#[test]
fn dry_run_plans_without_writing() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("o");
    let o = kquant(&[
        "quantize",
        "fixtures/tiny/eagle3-specforge",
        "-o",
        out.to_str().unwrap(),
        "--exclude",
        "fc,lm_head",
        "--dry-run",
        "--json",
    ]);
    assert!(o.status.success());
    assert!(!out.exists());
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    let by: BTreeMap<String, &Value> = j["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap().to_string(), t))
        .collect();
    assert_eq!(by["midlayer.self_attn.q_proj.weight"]["action"], "quantize");
    assert_eq!(by["fc.weight"]["reason"], "excluded by `fc`");
    assert_eq!(by["midlayer.hidden_norm.weight"]["reason"], "norm");
    assert_eq!(by["d2t"]["reason"], "vocab map");
    assert!(j["bytes_after"].as_u64().unwrap() < j["bytes_before"].as_u64().unwrap());
}

#[test]
fn non_finite_weights_are_refused_with_tensor_and_row() {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("m.safetensors");
    let json = br#"{"l.weight":{"dtype":"F32","shape":[2,8],"data_offsets":[0,64]}}"#;
    let mut vals = [0.5f32; 16];
    vals[11] = f32::NAN;
    common::write_safetensors(&f, json, vals.iter().flat_map(|v| v.to_le_bytes()));
    let out = t.path().join("o");
    let o = kquant(&["quantize", f.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("tensor `l.weight`")
            && err.contains("row 1 column 3")
            && err.contains("m.safetensors")
            && err.contains("hint: NaN or infinite weights"),
        "{err}"
    );
    assert!(!out.exists(), "no partial output");
    assert_eq!(
        std::fs::read_dir(t.path()).unwrap().count(),
        1,
        "temporary directory removed"
    );
}
