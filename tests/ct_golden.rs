//! `kquant quantize --format compressed-tensors` against the outputs of compressed-tensors 0.20.0
//! itself (fixtures/goldens/compressed-tensors-0.20/, made by
//! fixtures/gen/goldens/make_ct_golden.py on CPU): every tensor byte for byte, and the
//! quantization_config on every field.

use crate::common;

use std::path::PathBuf;

use common::load;

fn golden(name: &str) -> PathBuf {
    common::golden("compressed-tensors-0.20").join(name)
}

fn quantize(src: &str, extra: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let (t, out, err) =
        common::quantize(src, &[&["--format", "compressed-tensors"], extra].concat());
    assert!(!err.contains("warning: no"), "W4A16 loads in vLLM: {err}");
    (t, out)
}

/// The golden's source weights, alone in a temporary directory.
fn source(name: &str) -> (tempfile::TempDir, String) {
    common::source(&golden(name))
}

fn check(name: &str, extra: &[&str]) {
    let g = golden(name);
    let (_s, src) = source(name);
    let (_t, out) = quantize(&src, extra);
    let ours = load(&out.join("model.safetensors"));
    let theirs = load(&g.join("model.safetensors"));
    common::assert_tensors_match(name, &ours, &theirs, |_| true);
    // Config: every field equal, except that kquant's ignore adds `re:` patterns for engines.
    let oig = common::assert_config_matches(
        name,
        &out.join("config.json"),
        &g.join("config.json"),
        "ignore",
    );
    for m in oig.iter().filter(|e| !e.starts_with("re:")) {
        let pat = format!("re:^(.*\\.)?{}$", m.replace('.', "\\."));
        assert!(
            oig.contains(&pat),
            "{name}: no engine pattern for {m}: {oig:?}"
        );
    }
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
    let s = common::read_json(&golden("W4A16").join("summary.json"));
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
    common::assert_detected(&out, "compressed-tensors");
    let cfg = common::read_json(&out.join("config.json"));
    let ignore = &cfg["quantization_config"]["ignore"];
    assert_eq!(
        ignore,
        &serde_json::json!(["fc", "lm_head", "re:^(.*\\.)?fc$", "re:^(.*\\.)?lm_head$"]),
        "only Linear modules, never norms or embeddings"
    );
    common::assert_refused_as_input(&out, &out.with_extension("again"), "compressed-tensors");
    common::assert_verifies(&out);
}

#[test]
fn quark_flags_are_refused_with_compressed_tensors() {
    let (_t, _, err) = common::quantize_refused(
        "fixtures/tiny/eagle3-specforge",
        &[
            "--format",
            "compressed-tensors",
            "--quark-layout",
            "file2file",
        ],
    );
    assert!(err.contains("--format quark only"));
}

#[test]
fn dry_run_names_scheme_and_format() {
    let (_s, src) = source("W4A16");
    let j = common::quantize_dry_run(
        &src,
        &["--format", "compressed-tensors", "--scheme", "int4-g128"],
    );
    assert_eq!(j["scheme"], "int4-g128");
    assert_eq!(j["format"], "compressed-tensors");
    let want = common::data_bytes(&golden("W4A16").join("model.safetensors"));
    assert_eq!(
        j["bytes_after"], want,
        "planned sizes = the golden's tensor bytes"
    );
}
