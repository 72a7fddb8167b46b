//! `kquant quantize --format modelopt` against the outputs of nvidia-modelopt 0.47.0 itself
//! (fixtures/goldens/modelopt-0.47/, made by fixtures/gen/goldens/make_modelopt_golden.py:
//! `mtq.quantize` with the named config and 4 random calibration batches, then
//! `export_hf_checkpoint`).
//!
//! - `FP8_PER_CHANNEL_PER_TOKEN_CFG` (max calibration of the weights only): every tensor byte
//!   for byte, `hf_quant_config.json` byte for byte, `quantization_config` on every field.
//! - `INT4_AWQ_CFG` ran ModelOpt's AWQ search (`awq_lite`): its `pre_quant_scale`s are not ones,
//!   the norms before q/k/v and gate/up are rescaled and every quantized weight was smoothed
//!   first. kquant does no search, so those tensors cannot match; everything else is checked:
//!   names, dtypes, shapes, the untouched tensors byte for byte, both configs, the recipe on the
//!   golden's own smoothing, and the golden decoded by kquant.
//! - `W4A8_AWQ_BETA_CFG` (not written by kquant) and `NVFP4_DEFAULT_CFG` (written; its
//!   byte-exact test is tests/nvfp4_golden.rs, on the planted NVFP4 golden): read back by
//!   `kquant dequantize` / `kquant diff`.

use crate::common;

use std::path::{Path, PathBuf};

use common::{kquant, load, read_json, Tensors};
use kquant::io::Dtype;
use kquant::quant::modelopt;
use serde_json::Value;

fn golden(cfg: &str) -> PathBuf {
    common::golden("modelopt-0.47").join(cfg)
}

fn f32s(t: &(String, Vec<u64>, Vec<u8>)) -> Vec<f32> {
    common::floats(&t.0, &t.2)
}

fn bf16(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

/// The golden's source weights, alone in a temporary directory (the golden directory's config
/// is the quantized one).
fn source(cfg: &str) -> (tempfile::TempDir, String) {
    common::source(&golden(cfg))
}

/// Quantize `src` as ModelOpt; the output dir.
fn quantize(src: &str, extra: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let (t, out, err) = common::quantize(src, &[&["--format", "modelopt"], extra].concat());
    assert!(
        !err.contains("warning: no"),
        "ModelOpt output loads in TensorRT-LLM: {err}"
    );
    (t, out)
}

/// A checkpoint directory made of a golden's export (model, config, hf_quant_config.json).
fn golden_dir(t: &Path, cfg: &str) -> PathBuf {
    common::golden_checkpoint(
        t,
        &golden(cfg),
        "export_model.safetensors",
        "export_config.json",
    )
}

/// Both configs: `hf_quant_config.json` byte for byte, `quantization_config` on every field.
fn check_configs(cfg: &str, out: &Path) {
    let g = golden(cfg);
    assert_eq!(
        String::from_utf8(std::fs::read(out.join("hf_quant_config.json")).unwrap()).unwrap(),
        String::from_utf8(std::fs::read(g.join("hf_quant_config.json")).unwrap()).unwrap(),
        "{cfg}: hf_quant_config.json"
    );
    assert_eq!(
        read_json(&out.join("config.json"))["quantization_config"],
        read_json(&g.join("export_config.json"))["quantization_config"],
        "{cfg}: quantization_config"
    );
}

const LAYER: &str = "model.layers.0.";
const MODULES: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

/// `FP8_PER_CHANNEL_PER_TOKEN_CFG`: every tensor and both configs, byte for byte.
#[test]
fn fp8_per_channel_per_token_is_byte_exact() {
    let cfg = "FP8_PER_CHANNEL_PER_TOKEN_CFG";
    let (_s, src) = source(cfg);
    let (_t, out) = quantize(
        &src,
        &["--scheme", "fp8-pc", "--exclude", "lm_head,*embed_tokens"],
    );
    let ours = load(&out.join("model.safetensors"));
    let theirs = load(&golden(cfg).join("export_model.safetensors"));
    common::assert_tensors_match(cfg, &ours, &theirs, |_| true);
    check_configs(cfg, &out);
}

/// `INT4_AWQ_CFG`, quantized without the AWQ search: the same tensors (names, dtypes, shapes:
/// U8 `[out/2, in]`, F32 `[out, in/128]`, `pre_quant_scale` on o_proj/down_proj only), the
/// tensors the search does not touch byte for byte, and both configs byte/field for field.
#[test]
fn int4_awq_layout_and_config() {
    let cfg = "INT4_AWQ_CFG";
    let (_s, src) = source(cfg);
    let (_t, out) = quantize(
        &src,
        &[
            "--scheme",
            "int4-g128",
            "--exclude",
            "lm_head,*embed_tokens",
        ],
    );
    let ours = load(&out.join("model.safetensors"));
    let theirs = load(&golden(cfg).join("export_model.safetensors"));
    let orig = load(&golden(cfg).join("orig.safetensors"));
    // What the AWQ search changes: the smoothed weights and their scales, the pre_quant_scales,
    // and the two norms the q/k/v and gate/up smoothing is folded into.
    let searched = |n: &str| {
        n.ends_with("_proj.weight")
            || n.ends_with("weight_scale")
            || n.ends_with("pre_quant_scale")
            || n.ends_with("input_layernorm.weight")
            || n.ends_with("post_attention_layernorm.weight")
    };
    common::assert_tensors_match(cfg, &ours, &theirs, |n| !searched(n));
    // kquant leaves the norms as they were (no smoothing to fold) and writes ones.
    for n in ["input_layernorm", "post_attention_layernorm"] {
        let name = format!("{LAYER}{n}.weight");
        assert_eq!(ours[&name].2, orig[&name].2, "{name}");
        assert_ne!(
            theirs[&name].2, orig[&name].2,
            "the golden's {name} was rescaled"
        );
    }
    for m in ["self_attn.o_proj", "mlp.down_proj"] {
        let p = &ours[&format!("{LAYER}{m}.pre_quant_scale")];
        assert_eq!(p.0, "BF16");
        assert!(f32s(p).iter().all(|&x| x == 1.0), "{m}: ones");
        let g = f32s(&theirs[&format!("{LAYER}{m}.pre_quant_scale")]);
        assert!(
            g.iter().any(|&x| x != 1.0),
            "{m}: the golden ran the search"
        );
    }
    check_configs(cfg, &out);
}

/// Unpack a golden `[out/2, in]` U8 weight and its `[out, in/G]` F32 scales.
fn golden_int4(t: &Tensors, module: &str) -> (Vec<i8>, Vec<f32>, usize, usize) {
    let s = &t[&format!("{module}.weight_scale")];
    let (rows, groups) = (s.1[0] as usize, s.1[1] as usize);
    let w = &t[&format!("{module}.weight")];
    let cols = w.1[1] as usize;
    assert_eq!(w.1[0] as usize, rows / 2);
    let q = modelopt::int4_decode(&w.2, &f32s(s), rows, cols, cols / groups);
    (q.codes, q.scales, rows, groups)
}

/// The recipe on the golden's own numbers. Every golden scale is `f32(a) / 7` for a BF16 `a`
/// (the block amax), every block's largest code is ±7 and no code is −8. On o_proj/down_proj,
/// whose smoothing the golden records (`pre_quant_scale`), kquant's quantizer applied to
/// `bf16(w / pqs)` agrees with the golden on ≥ 99 % of the codes and every scale within 1 %:
/// ModelOpt smoothed with the F32 `pre_quant_scale` and stored it rounded to BF16, so the
/// smoothed weights cannot be rebuilt exactly.
#[test]
fn int4_recipe_on_the_goldens_own_smoothing() {
    for cfg in ["INT4_AWQ_CFG", "W4A8_AWQ_BETA_CFG"] {
        let theirs = load(&golden(cfg).join("export_model.safetensors"));
        let orig = load(&golden(cfg).join("orig.safetensors"));
        for m in MODULES {
            let module = format!("{LAYER}{m}");
            let (codes, scales, rows, groups) = golden_int4(&theirs, &module);
            let cols = codes.len() / rows;
            let g = cols / groups;
            for &s in &scales {
                assert_eq!(bf16(s * 7.0) / 7.0, s, "{cfg} {m}: scale {s} is not bf16/7");
            }
            assert!(codes.iter().all(|&q| q >= -7), "{cfg} {m}: −8 never occurs");
            for r in 0..rows {
                for b in 0..groups {
                    let blk = &codes[r * cols + b * g..r * cols + (b + 1) * g];
                    assert_eq!(blk.iter().map(|q| q.abs()).max(), Some(7), "{cfg} {m}");
                }
            }
            let Some(p) = theirs.get(&format!("{module}.pre_quant_scale")) else {
                continue;
            };
            let pqs = f32s(p);
            let w = f32s(&orig[&format!("{module}.weight")]);
            let smoothed: Vec<f32> = w
                .iter()
                .enumerate()
                .map(|(i, &x)| bf16(x * (1.0 / pqs[i % cols])))
                .collect();
            let q = modelopt::int4_quantize_ref(&smoothed, rows, cols, g, Dtype::BF16);
            let same = q.codes.iter().zip(&codes).filter(|(a, b)| a == b).count();
            assert!(
                same as f64 >= 0.99 * codes.len() as f64,
                "{cfg} {m}: {same} of {} codes",
                codes.len()
            );
            for (a, b) in q.scales.iter().zip(&scales) {
                assert!((a / b - 1.0).abs() <= 0.01, "{cfg} {m}: scale {a} vs {b}");
            }
        }
    }
}

/// Dequantize a checkpoint dir to F32 with kquant; its tensors.
fn dequantize(dir: &Path, t: &Path) -> Tensors {
    let out = tempfile::tempdir_in(t).unwrap().keep().join("dq");
    common::dequantize(dir, &out, &["--dtype", "f32"], "modelopt");
    load(&out.join("model.safetensors"))
}

/// kquant reads ModelOpt's own INT4 layout back: what TensorRT-LLM computes with
/// (`q · s · pre_quant_scale`, times the rescaled norm for the norm-fused q/k/v and gate/up)
/// is the source model within half a step plus the BF16 rounding of the smoothing.
#[test]
fn golden_int4_decodes_to_the_source_function() {
    let t = tempfile::tempdir().unwrap();
    for cfg in ["INT4_AWQ_CFG", "W4A8_AWQ_BETA_CFG"] {
        let dir = golden_dir(t.path(), cfg);
        let dq = dequantize(&dir, t.path());
        let theirs = load(&golden(cfg).join("export_model.safetensors"));
        let orig = load(&golden(cfg).join("orig.safetensors"));
        assert_eq!(
            dq.keys().collect::<Vec<_>>(),
            orig.keys().collect::<Vec<_>>(),
            "{cfg}: the original tensor names, nothing else"
        );
        for m in MODULES {
            let module = format!("{LAYER}{m}");
            let (_, scales, rows, groups) = golden_int4(&theirs, &module);
            let d = f32s(&dq[&format!("{module}.weight")]);
            let w = f32s(&orig[&format!("{module}.weight")]);
            let cols = w.len() / rows;
            let norm = match m {
                "self_attn.o_proj" | "mlp.down_proj" => None,
                _ if m.starts_with("self_attn") => Some("input_layernorm"),
                _ => Some("post_attention_layernorm"),
            };
            let (n_new, n_old, pqs) = match norm {
                Some(n) => (
                    f32s(&theirs[&format!("{LAYER}{n}.weight")]),
                    f32s(&orig[&format!("{LAYER}{n}.weight")]),
                    vec![1.0; cols],
                ),
                None => (
                    vec![1.0; cols],
                    vec![1.0; cols],
                    f32s(&theirs[&format!("{module}.pre_quant_scale")]),
                ),
            };
            for i in 0..rows * cols {
                let (r, c) = (i / cols, i % cols);
                let s = scales[r * groups + c / (cols / groups)];
                let (got, want) = (d[i] * n_new[c], w[i] * n_old[c]);
                let tol = 0.5 * s * pqs[c] * n_new[c].abs() + want.abs() / 128.0 + 1e-9;
                assert!(
                    (got - want).abs() <= tol,
                    "{cfg} {m} [{r},{c}]: {got} vs {want} (tol {tol})"
                );
            }
        }
    }
}

/// `kquant diff` of each golden against its source: every tensor compared, the quantized
/// ones (W4A8_AWQ included, which kquant reads but does not write) above 17 dB.
#[test]
fn every_golden_diffs_against_its_source() {
    let t = tempfile::tempdir().unwrap();
    for (cfg, min_db) in [
        ("INT4_AWQ_CFG", 17.0),
        ("W4A8_AWQ_BETA_CFG", 17.0),
        ("NVFP4_DEFAULT_CFG", 19.0),
        ("FP8_PER_CHANNEL_PER_TOKEN_CFG", 30.0),
    ] {
        let dir = golden_dir(t.path(), cfg);
        let o = kquant(&[
            "diff",
            golden(cfg).join("orig.safetensors").to_str().unwrap(),
            dir.to_str().unwrap(),
            "--json",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let j: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(j["only_in_a"], serde_json::json!([]), "{cfg}");
        assert_eq!(j["only_in_b"], serde_json::json!([]), "{cfg}");
        let rows = j["tensors"].as_array().unwrap();
        assert_eq!(rows.len(), 12, "{cfg}");
        for r in rows {
            let name = r["name"].as_str().unwrap();
            if name.ends_with("_proj.weight") {
                let db = r["sqnr_db"].as_f64().unwrap();
                assert!(db > min_db, "{cfg} {name}: {db} dB");
            }
        }
    }
}

/// kquant's own INT4 and FP8 output reads back within half a step of the source.
#[test]
fn own_output_round_trips() {
    let t = tempfile::tempdir().unwrap();
    let (_s, src) = source("INT4_AWQ_CFG");
    let orig = load(Path::new(&src));
    for scheme in ["int4-g128", "fp8-pc"] {
        let (_o, out) = quantize(
            &src,
            &["--scheme", scheme, "--exclude", "lm_head,*embed_tokens"],
        );
        let ours = load(&out.join("model.safetensors"));
        let dq = dequantize(&out, t.path());
        assert_eq!(
            dq.keys().collect::<Vec<_>>(),
            orig.keys().collect::<Vec<_>>()
        );
        for m in MODULES {
            let module = format!("{LAYER}{m}");
            let w = f32s(&orig[&format!("{module}.weight")]);
            let d = f32s(&dq[&format!("{module}.weight")]);
            let s = f32s(&ours[&format!("{module}.weight_scale")]);
            let rows = ours[&format!("{module}.weight_scale")].1[0] as usize;
            let cols = w.len() / rows;
            for i in 0..w.len() {
                let e = (w[i] - d[i]).abs();
                let tol = if scheme == "fp8-pc" {
                    (w[i].abs() / 16.0).max(s[i / cols] / 1024.0) * 1.0001
                } else {
                    s[(i / cols) * (cols / 128) + (i % cols) / 128] * 0.5 * 1.0001
                };
                assert!(e <= tol, "{scheme} {m} {i}: {} vs {}", w[i], d[i]);
            }
        }
    }
}

/// On an EAGLE-3 draft: detected as ModelOpt by `inspect`, refused as input, the exclusion
/// list names what TensorRT-LLM calls the modules (`model.fc`, `model.midlayer.*`), and
/// `pre_quant_scale` sits on every module TensorRT-LLM does not fuse.
#[test]
fn eagle3_draft_is_detected_and_lists_trtllm_names() {
    let (_t, out) = quantize(
        "fixtures/tiny/eagle3-specforge",
        &["--scheme", "fp8-pc", "--exclude", "fc,lm_head"],
    );
    let j = common::assert_detected(&out, "modelopt");
    assert_eq!(j["quantization"]["hf_quant_config"], true);
    let want = serde_json::json!(["fc", "lm_head", "model.fc"]);
    assert_eq!(
        read_json(&out.join("hf_quant_config.json"))["quantization"]["exclude_modules"],
        want
    );
    assert_eq!(
        read_json(&out.join("config.json"))["quantization_config"]["ignore"],
        want
    );
    common::assert_refused_as_input(&out, &out.with_extension("again"), "modelopt");
    common::assert_verifies(&out);

    // int4-g128: fc (in 192), o_proj, gate_proj and up_proj (in 64) have no whole group of 128.
    let (_t, _, err) = common::quantize_refused(
        "fixtures/tiny/eagle3-specforge",
        &[
            "--format",
            "modelopt",
            "--scheme",
            "int4-g128",
            "--exclude",
            "lm_head",
        ],
    );
    assert!(err.contains("not a multiple of the group size 128"));
    let (_t, out) = quantize(
        "fixtures/tiny/eagle3-specforge",
        &[
            "--scheme",
            "int4-g128",
            "--exclude",
            "fc,lm_head,*o_proj,*gate_proj,*up_proj",
        ],
    );
    let ours = load(&out.join("model.safetensors"));
    assert!(ours.contains_key("midlayer.mlp.down_proj.pre_quant_scale"));
    assert!(!ours.contains_key("midlayer.self_attn.q_proj.pre_quant_scale"));
    assert!(!ours.contains_key("midlayer.self_attn.k_proj.pre_quant_scale"));
    assert_eq!(ours["midlayer.mlp.down_proj.weight"].0, "U8");
    assert_eq!(ours["midlayer.mlp.down_proj.weight"].1, vec![32, 128]);
    assert_eq!(
        read_json(&out.join("hf_quant_config.json"))["quantization"]["exclude_modules"],
        serde_json::json!([
            "fc",
            "lm_head",
            "midlayer.mlp.gate_proj",
            "midlayer.mlp.up_proj",
            "midlayer.self_attn.o_proj",
            "model.fc",
            "model.midlayer.mlp.gate_proj",
            "model.midlayer.mlp.up_proj",
            "model.midlayer.self_attn.o_proj",
            "model.midlayer.mlp.gate_up_proj"
        ])
    );
    let t2 = tempfile::tempdir().unwrap();
    let dq = dequantize(&out, t2.path());
    assert_eq!(dq["midlayer.mlp.down_proj.weight"].1, vec![64, 128]);
    assert!(dq.contains_key("d2t") && !dq.contains_key("midlayer.mlp.down_proj.pre_quant_scale"));
}

/// `--dry-run --json` plans exactly the golden's tensor bytes.
#[test]
fn dry_run_sizes_equal_the_goldens() {
    for (cfg, scheme) in [
        ("FP8_PER_CHANNEL_PER_TOKEN_CFG", "fp8-pc"),
        ("INT4_AWQ_CFG", "int4-g128"),
    ] {
        let (_s, src) = source(cfg);
        let j = common::quantize_dry_run(
            &src,
            &[
                "--format",
                "modelopt",
                "--scheme",
                scheme,
                "--exclude",
                "lm_head,*embed_tokens",
            ],
        );
        assert_eq!(j["format"], "modelopt");
        assert_eq!(j["scheme"], scheme);
        let want = common::data_bytes(&golden(cfg).join("export_model.safetensors"));
        assert_eq!(j["bytes_after"], want, "{cfg}");
    }
}

/// Schemes ModelOpt has no layout for (or kquant no exact reference) are refused, naming the
/// formats that do work; so are the Quark-only flags.
#[test]
fn unsupported_combinations_are_refused() {
    for extra in [
        vec!["--scheme", "int4-pc"],
        vec!["--scheme", "int4-g32"],
        vec!["--scheme", "fp8-pc", "--quark-layout", "file2file"],
    ] {
        let (_t, _, err) = common::quantize_refused(
            "fixtures/tiny/eagle3-specforge",
            &[&["--format", "modelopt"], &extra[..]].concat(),
        );
        assert!(
            err.contains("is written as --format") || err.contains("--format quark only"),
            "{extra:?}: {err}"
        );
    }
}

#[test]
fn odd_output_rows_are_refused_before_writing() {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("m.safetensors");
    let json = br#"{"l.weight":{"dtype":"BF16","shape":[3,128],"data_offsets":[0,768]}}"#;
    common::write_safetensors(&f, json, std::iter::repeat_n([0x80u8, 0x3f], 384).flatten());
    let (_o, out, err) = common::quantize_refused(
        f.to_str().unwrap(),
        &["--format", "modelopt", "--scheme", "int4-g128"],
    );
    assert!(
        err.contains("`l.weight` [")
            && err.contains("output dimension 3 is odd")
            && err.contains("--exclude"),
        "{err}"
    );
    assert!(!out.exists());
}
