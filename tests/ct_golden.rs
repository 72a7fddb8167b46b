//! `kquant quantize --format compressed-tensors` against the outputs of compressed-tensors 0.20.0
//! itself (fixtures/goldens/compressed-tensors-0.20/, made by
//! fixtures/gen/goldens/make_ct_golden.py on CPU): every tensor byte for byte, and the
//! quantization_config on every field.

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

fn kquant(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kquant"))
        .current_dir(root())
        .args(args)
        .output()
        .unwrap()
}

fn quantize(src: &str, extra: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let mut args = vec![
        "quantize",
        src,
        "-o",
        out.to_str().unwrap(),
        "--format",
        "compressed-tensors",
    ];
    args.extend_from_slice(extra);
    let o = kquant(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("warning"), "W4A16 loads in vLLM: {err}");
    (t, out)
}

/// The golden's source weights, alone in a temporary directory: the golden directory's
/// `config.json` is the *quantized* config, which would make the source look quantized.
fn source(golden: &str) -> (tempfile::TempDir, String) {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("orig.safetensors");
    std::fs::copy(
        root()
            .join("fixtures/goldens/compressed-tensors-0.20")
            .join(golden)
            .join("orig.safetensors"),
        &p,
    )
    .unwrap();
    let s = p.to_str().unwrap().to_string();
    (t, s)
}

fn check(golden: &str, extra: &[&str]) {
    let g = root()
        .join("fixtures/goldens/compressed-tensors-0.20")
        .join(golden);
    let (_s, src) = source(golden);
    let (_t, out) = quantize(&src, extra);
    let ours = load(&out.join("model.safetensors"));
    let theirs = load(&g.join("model.safetensors"));
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>(),
        "{golden}: tensor names"
    );
    for (name, (dt, shape, data)) in &theirs {
        let (odt, oshape, odata) = &ours[name];
        assert_eq!((odt, oshape), (dt, shape), "{golden}: {name} dtype/shape");
        if odata != data {
            let diff = odata.iter().zip(data).filter(|(a, b)| a != b).count();
            panic!("{golden}: {name}: {diff} of {} bytes differ", data.len());
        }
    }
    // Config: every field equal, except that kquant's ignore adds `re:` patterns for engines.
    let ours: Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    let theirs: Value =
        serde_json::from_slice(&std::fs::read(g.join("config.json")).unwrap()).unwrap();
    let (mut oq, mut tq) = (
        ours["quantization_config"].clone(),
        theirs["quantization_config"].clone(),
    );
    let oig: Vec<String> = serde_json::from_value(oq["ignore"].take()).unwrap();
    let tig: Vec<String> = serde_json::from_value(tq["ignore"].take()).unwrap();
    let mut concrete: Vec<&String> = oig.iter().filter(|e| !e.starts_with("re:")).collect();
    let mut want: Vec<&String> = tig.iter().collect();
    concrete.sort();
    want.sort();
    assert_eq!(concrete, want, "{golden}: concrete ignore names");
    for name in &want {
        let pat = format!("re:^(.*\\.)?{}$", name.replace('.', "\\."));
        assert!(
            oig.contains(&pat),
            "{golden}: no engine pattern for {name}: {oig:?}"
        );
    }
    assert_eq!(
        oig.len(),
        2 * tig.len(),
        "{golden}: one engine pattern per name"
    );
    assert_eq!(oq, tq, "{golden}: quantization_config");
}

/// Preset `W4A16`: int4 symmetric, group 128 (`strategy: group`), `ignore: ["lm_head"]`.
#[test]
fn w4a16_group128_bf16() {
    check("W4A16", &["--scheme", "int4-g128", "--exclude", "lm_head"]);
}

/// int4 symmetric per output channel (`strategy: channel`), `ignore: ["lm_head"]`.
#[test]
fn w4a16_channel_bf16() {
    check("W4A16_CH", &["--scheme", "int4-pc", "--exclude", "lm_head"]);
}

/// The planted row of q_proj (summary.json `q_proj_row0`): words `0x668aa80f`, scale 1.0.
#[test]
fn golden_row_words() {
    let g = root().join("fixtures/goldens/compressed-tensors-0.20/W4A16/summary.json");
    let s: Value = serde_json::from_slice(&std::fs::read(g).unwrap()).unwrap();
    let want: Vec<u32> = s["q_proj_row0"]["weight_packed_u32_hex"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| u32::from_str_radix(h.as_str().unwrap().trim_start_matches("0x"), 16).unwrap())
        .collect();
    let (_s, src) = source("W4A16");
    let (_t, out) = quantize(&src, &["--scheme", "int4-g128"]);
    let ours = load(&out.join("model.safetensors"));
    let (_, _, data) = &ours["model.layers.0.self_attn.q_proj.weight_packed"];
    let row0: Vec<u32> = data[..want.len() * 4]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(row0, want);
}

#[test]
fn output_is_detected_as_compressed_tensors_and_refused_as_input() {
    let (_t, out) = quantize(
        "fixtures/tiny/eagle3-specforge",
        &["--scheme", "int4-pc", "--exclude", "fc,lm_head"],
    );
    let o = kquant(&["inspect", out.to_str().unwrap(), "--json"]);
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["quantization"]["method"], "compressed-tensors");
    assert_eq!(j["quantization"]["quantized_modules"], 7);
    assert_eq!(j["family"], "eagle3", "still detected as the same draft");
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    let ignore = &cfg["quantization_config"]["ignore"];
    assert_eq!(
        ignore,
        &serde_json::json!(["fc", "lm_head", "re:^(.*\\.)?fc$", "re:^(.*\\.)?lm_head$"]),
        "only Linear modules, never norms or embeddings"
    );
    let o = kquant(&[
        "quantize",
        out.to_str().unwrap(),
        "-o",
        out.with_extension("again").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("already quantized"));
    assert!(kquant(&["verify-files", out.to_str().unwrap()])
        .status
        .success());
}

#[test]
fn quark_flags_are_refused_with_compressed_tensors() {
    let t = tempfile::tempdir().unwrap();
    let o = kquant(&[
        "quantize",
        "fixtures/tiny/eagle3-specforge",
        "-o",
        t.path().join("o").to_str().unwrap(),
        "--format",
        "compressed-tensors",
        "--quark-layout",
        "file2file",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--format quark only"));
}

#[test]
fn dry_run_names_scheme_and_format() {
    let t = tempfile::tempdir().unwrap();
    let (_s, src) = source("W4A16");
    let o = kquant(&[
        "quantize",
        &src,
        "-o",
        t.path().join("o").to_str().unwrap(),
        "--format",
        "compressed-tensors",
        "--scheme",
        "int4-g128",
        "--dry-run",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["scheme"], "int4-g128");
    assert_eq!(j["format"], "compressed-tensors");
    let golden = root().join("fixtures/goldens/compressed-tensors-0.20/W4A16/model.safetensors");
    let want: u64 = load(&golden).values().map(|(_, _, d)| d.len() as u64).sum();
    assert_eq!(
        j["bytes_after"], want,
        "planned sizes = the golden's tensor bytes"
    );
}
