//! `kquant quantize --format quark` (`int4-pc`, and `int4-g32` per group) against the outputs of
//! AMD Quark itself (fixtures/goldens/, made by fixtures/gen/goldens/*.py with pinned amd-quark
//! 0.13 / 0.11.1): every tensor byte for byte, and the quantization_config on every field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

type Tensors = BTreeMap<String, (String, Vec<u64>, Vec<u8>)>;

fn load(p: &Path) -> Tensors {
    let b = std::fs::read(p).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let h: serde_json::Map<String, Value> = serde_json::from_slice(&b[8..8 + n]).unwrap();
    h.into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(k, v)| {
            let o = v["data_offsets"].as_array().unwrap();
            let (s, e) = (
                o[0].as_u64().unwrap() as usize,
                o[1].as_u64().unwrap() as usize,
            );
            let shape = v["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            (
                k,
                (
                    v["dtype"].as_str().unwrap().to_string(),
                    shape,
                    b[8 + n + s..8 + n + e].to_vec(),
                ),
            )
        })
        .collect()
}

fn quantize(src: &str, extra: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let o = Command::new(env!("CARGO_BIN_EXE_kquant"))
        .current_dir(root())
        .args(["quantize", src, "-o", out.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Only per-channel Quark INT4 is loaded by no engine; per-group loads in vLLM.
    let err = String::from_utf8_lossy(&o.stderr);
    let per_group = extra.iter().any(|a| a.starts_with("int4-g"));
    assert_eq!(
        err.contains("warning: no serving engine loads"),
        !per_group,
        "{err}"
    );
    (t, out)
}

fn check(golden: &str, src_file: &str, golden_model: &str, extra: &[&str]) {
    let g = root().join("fixtures/goldens").join(golden);
    let (_t, out) = quantize(&format!("fixtures/goldens/{golden}/{src_file}"), extra);
    let ours = load(&out.join("model.safetensors"));
    let theirs = load(&g.join(golden_model));
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>(),
        "{golden}: tensor names"
    );
    for (name, (dt, shape, data)) in &theirs {
        let (odt, oshape, odata) = &ours[name];
        assert_eq!((odt, oshape), (dt, shape), "{golden}: {name} dtype/shape");
        assert!(odata == data, "{golden}: {name} bytes differ");
    }
    // Config: every field equal, except that kquant's exclude adds `re:` patterns for engines.
    let ours: Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    let theirs: Value =
        serde_json::from_slice(&std::fs::read(g.join("export_config.json")).unwrap()).unwrap();
    let (mut oq, mut tq) = (
        ours["quantization_config"].clone(),
        theirs["quantization_config"].clone(),
    );
    let oex: Vec<String> = serde_json::from_value(oq["exclude"].take()).unwrap();
    let tex: Vec<String> = serde_json::from_value(tq["exclude"].take()).unwrap();
    let mut concrete: Vec<&String> = oex.iter().filter(|e| !e.starts_with("re:")).collect();
    let mut want: Vec<&String> = tex.iter().collect();
    concrete.sort();
    want.sort();
    assert_eq!(concrete, want, "{golden}: concrete exclude names");
    assert_eq!(
        oex.iter().filter(|e| e.starts_with("re:")).count(),
        tex.len(),
        "{golden}: one engine pattern per name"
    );
    assert_eq!(oq, tq, "{golden}: quantization_config");
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
    use kquant::quant::pack::Order;
    use kquant::quant::quark_group;
    let g = root().join("fixtures/goldens/quark-0.13/int4_g32_bfloat16");
    let src = load(&g.join("orig.safetensors"));
    let out = load(&g.join("export_model.safetensors"));
    let m = "model.layers.0.mlp.down_proj";
    let (_, shape, w) = &src[&format!("{m}.weight")];
    let (rows, cols) = (shape[0] as usize, shape[1] as usize);
    let bf = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(2)
            .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
            .collect()
    };
    let scale_t = bf(&out[&format!("{m}.weight_scale")].2);
    let q = quark_group::decode(
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
    let mut b = (json.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(json);
    b.extend(std::iter::repeat_n(0u8, 3328));
    std::fs::write(&f, b).unwrap();
    let out = t.path().join("o");
    for format in ["quark", "compressed-tensors"] {
        let o = Command::new(env!("CARGO_BIN_EXE_kquant"))
            .args(["quantize", f.to_str().unwrap(), "-o", out.to_str().unwrap()])
            .args(["--scheme", "int4-g32", "--format", format])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{format}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("tensor `b.weight`")
                && err.contains("not a multiple of the group size 32")
                && err.contains("m.safetensors"),
            "{err}"
        );
        assert!(!out.exists());
    }
    // Excluding it makes the rest quantizable.
    let o = Command::new(env!("CARGO_BIN_EXE_kquant"))
        .args(["quantize", f.to_str().unwrap(), "-o", out.to_str().unwrap()])
        .args(["--scheme", "int4-g32", "--exclude", "b"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn per_group_file2file_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_kquant"))
        .current_dir(root())
        .args(["quantize", "fixtures/tiny/eagle3-specforge", "-o"])
        .arg(t.path().join("o"))
        .args(["--scheme", "int4-g32", "--quark-layout", "file2file"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("file2file"));
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

#[test]
fn file2file_0111_bf16() {
    check(
        "file2file/q0111_bfloat16",
        "src_model.safetensors",
        "export_model.safetensors",
        &[
            "--exclude",
            "fc,lm_head",
            "--quark-layout",
            "file2file",
            "--quark-version",
            "0.11.1",
        ],
    );
}

#[test]
fn file2file_0111_f16() {
    check(
        "file2file/q0111_float16",
        "src_model.safetensors",
        "export_model.safetensors",
        &[
            "--exclude",
            "fc,lm_head",
            "--quark-layout",
            "file2file",
            "--quark-version",
            "0.11.1",
        ],
    );
}

#[test]
fn quantized_output_is_detected_and_refused_as_input() {
    let (_t, out) = quantize(
        "fixtures/tiny/eagle3-specforge",
        &["--exclude", "fc,lm_head"],
    );
    let o = Command::new(env!("CARGO_BIN_EXE_kquant"))
        .args(["inspect", out.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["quantization"]["method"], "quark");
    assert_eq!(j["quantization"]["quantized_modules"], 7);
    assert_eq!(j["family"], "eagle3", "still detected as the same draft");
    let o = Command::new(env!("CARGO_BIN_EXE_kquant"))
        .args([
            "quantize",
            out.to_str().unwrap(),
            "-o",
            out.with_extension("again").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("already quantized"));
    let v = Command::new(env!("CARGO_BIN_EXE_kquant"))
        .args(["verify-files", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(v.status.success());
}

#[test]
fn dry_run_plans_without_writing() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("o");
    let o = Command::new(env!("CARGO_BIN_EXE_kquant"))
        .current_dir(root())
        .args([
            "quantize",
            "fixtures/tiny/eagle3-specforge",
            "-o",
            out.to_str().unwrap(),
            "--exclude",
            "fc,lm_head",
            "--dry-run",
            "--json",
        ])
        .output()
        .unwrap();
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
    let mut b = (json.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(json);
    let mut vals = [0.5f32; 16];
    vals[11] = f32::NAN;
    for v in vals {
        b.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(&f, b).unwrap();
    let out = t.path().join("o");
    let o = Command::new(env!("CARGO_BIN_EXE_kquant"))
        .args(["quantize", f.to_str().unwrap(), "-o", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("tensor `l.weight`")
            && err.contains("row 1 column 3")
            && err.contains("m.safetensors"),
        "{err}"
    );
    assert!(!out.exists(), "no partial output");
    assert_eq!(
        std::fs::read_dir(t.path()).unwrap().count(),
        1,
        "temporary directory removed"
    );
}
