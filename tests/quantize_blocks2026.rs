//! `kquant quantize` on the 2026 block drafters (#40 item 3): the trained tiny DSpark
//! (vLLM `Qwen3DSparkModel`) and DFlash2 fixtures, in every format with a scheme their shapes
//! take. The modules vLLM 0.33 loads only unquantized (DSpark's Markov embedding and confidence
//! head, DFlash2's selector projection, codebooks and convolution base kernels; DSpark's Markov
//! projection by default, like lm_head) are named in the plan with why and stay byte for byte;
//! the output is detected as the same family and layout; `kquant verify` replays it (decoding
//! the quantized linears) and reports the gate; GPTQ calibrates them on a trace.

use crate::common;

use std::path::{Path, PathBuf};

use serde_json::Value;

use common::{inspect_json, kquant, load, quantize, quantize_dry_run, read_json, root};

const FIX: &str = "fixtures/kimi-k2.5-tiny";

fn fix(rel: &str) -> PathBuf {
    root().join(FIX).join(rel)
}

/// Per family: the fixture, its layout, the tensors kept unquantized by default (with a word
/// of the reason the plan gives) and the linears quantized beside the decoder's.
struct Case {
    name: &'static str,
    layout: &'static str,
    kept: &'static [(&'static str, &'static str)],
    extra_quantized: &'static [&'static str],
}

const CASES: [Case; 2] = [
    Case {
        name: "dspark",
        layout: "qwen3-dspark",
        kept: &[
            ("markov_head.markov_w1.weight", "nn.Embedding"),
            ("markov_head.markov_w2.weight", "like lm_head"),
            ("confidence_head.proj.weight", "without the quant config"),
            ("confidence_head.proj.bias", "without the quant config"),
        ],
        extra_quantized: &["fc.weight"],
    },
    Case {
        name: "dflash2",
        layout: "dflash2",
        kept: &[
            (
                "candidate_selector.hidden_projection.weight",
                "without the quant config",
            ),
            ("candidate_selector.predecessor_codebook", "not a linear"),
            ("candidate_selector.successor_codebook", "not a linear"),
            ("layers.0.attention_conv.base_kernel", "not a linear"),
            ("layers.1.mlp_conv.base_kernel", "not a linear"),
        ],
        extra_quantized: &[
            "fc.weight",
            "layers.0.attention_conv.kernel_projection.weight",
            "layers.1.mlp_conv.kernel_projection.weight",
        ],
    },
];

/// The (scheme, format) pairs the fixtures' shapes take, one or two per format.
const CHOICES: [(&str, &str); 6] = [
    ("int4-pc", "quark"),
    ("int4-g32", "quark"),
    ("int4-pc", "compressed-tensors"),
    ("int4-g128", "compressed-tensors"),
    ("int4-g128", "modelopt"),
    ("nvfp4-a16", "modelopt"),
];

/// The choices the gate runs on: one per format (and int4-pc Quark for DSpark).
fn gated(name: &str, i: usize) -> bool {
    matches!(i, 1 | 3 | 5) || (i == 0 && name == "dspark")
}

/// A copy of the fixture trace with one sample per category: the gate's replay in seconds.
fn short_trace(dir: &Path) -> PathBuf {
    let out = dir.join("trace");
    common::one_sample_per_category(&fix("trace"), &out);
    out
}

/// The kept tensors are the source's bytes; the others named are quantized (gone as `.weight`
/// of their dtype, replaced by the format's tensors).
fn assert_kept(c: &Case, out: &Path, label: &str) {
    let src = load(&fix(c.name).join("model.safetensors"));
    let ours = load(&out.join("model.safetensors"));
    for (name, _) in c.kept {
        assert_eq!(ours.get(*name), src.get(*name), "{label}: {name} kept");
        assert_eq!(ours[*name].0, "BF16", "{label}: {name}");
    }
    for name in c.extra_quantized {
        assert_ne!(ours.get(*name), src.get(*name), "{label}: {name} quantized");
    }
}

#[test]
fn the_plan_names_the_kept_modules_and_why() {
    for c in &CASES {
        let src = fix(c.name);
        let plan = quantize_dry_run(src.to_str().unwrap(), &[]);
        let rows = plan["tensors"].as_array().unwrap();
        let row = |n: &str| rows.iter().find(|r| r["name"] == n).unwrap().clone();
        for (name, why) in c.kept {
            let r = row(name);
            assert_eq!(r["action"], "excluded", "{name}");
            assert!(r["reason"].as_str().unwrap().contains(why), "{name}: {r}");
        }
        for name in c.extra_quantized {
            assert_eq!(row(name)["action"], "quantize", "{name}");
        }
        // An explicit --exclude replaces the defaults (DSpark's Markov projection is then
        // quantized) but never the modules the engine builds unquantized.
        let plan = quantize_dry_run(src.to_str().unwrap(), &["--exclude", "fc"]);
        let rows = plan["tensors"].as_array().unwrap();
        let row = |n: &str| rows.iter().find(|r| r["name"] == n).unwrap().clone();
        for (name, why) in c.kept {
            let want = if *why == "like lm_head" {
                "quantize"
            } else {
                "excluded"
            };
            assert_eq!(row(name)["action"], want, "--exclude fc: {name}");
        }
        assert_eq!(row("fc.weight")["action"], "excluded");
    }
}

/// `kquant verify` of the quantized draft `out` against its source over `trace`, as JSON: exit 0
/// when the gate passes, 1 when it fails (the tiny drafts regress), with its reasons.
fn gate(out: &Path, baseline: &str, trace: &Path, label: &str) -> Value {
    let o = kquant(&[
        "verify",
        "--draft",
        out.to_str().unwrap(),
        "--baseline",
        baseline,
        "--trace",
        trace.to_str().unwrap(),
        "--target-checkpoint",
        fix("target").to_str().unwrap(),
        "--json",
        "-",
    ]);
    let rep: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{label}: {e}: {}", common::stderr(&o)));
    let code = if rep["passed"] == true { 0 } else { 1 };
    assert_eq!(o.status.code(), Some(code), "{label}: {rep}");
    assert!(rep["passed"].is_boolean(), "{label}: {rep}");
    assert!(rep["reasons"].is_array(), "{label}: {rep}");
    rep
}

#[test]
fn quantized_in_every_format_they_stay_the_same_draft_and_verify_replays_them() {
    let t = tempfile::tempdir().unwrap();
    let trace = short_trace(t.path());
    for c in &CASES {
        let src = fix(c.name);
        let s = src.to_str().unwrap();
        for (i, (scheme, format)) in CHOICES.iter().enumerate() {
            let label = format!("{} {scheme} {format}", c.name);
            let (_t, out, err) = quantize(s, &["--scheme", scheme, "--format", format]);
            assert!(!err.contains("panicked"), "{label}: {err}");
            assert_kept(c, &out, &label);
            let j = inspect_json(&out);
            assert_eq!(j["family"], c.name, "{label}");
            assert_eq!(j["block_draft"]["layout"], c.layout, "{label}");
            assert_eq!(j["quantization"]["quantized"], true, "{label}");
            // The engine-loader tier's verdicts: the scheme's claim in vLLM; in SGLang `no`
            // while `fc` is quantized (kquant's default: SGLang builds it plain).
            let loads = |e: &str| {
                j["engines"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|x| x["engine"] == e)
                    .unwrap()["loads"]
                    .clone()
            };
            match (*scheme, *format) {
                ("int4-pc", "quark") => assert_eq!(loads("sglang"), "no", "{label}"),
                (_, "compressed-tensors") => {
                    assert_eq!(loads("vllm"), "yes", "{label}");
                    assert_eq!(loads("sglang"), "no", "{label}");
                }
                ("int4-g128", "modelopt") => assert_eq!(loads("vllm"), "no", "{label}"),
                _ => {}
            }
            // The gate, once per format: the replay decodes the quantized linears.
            if gated(c.name, i) {
                let rep = gate(&out, s, &trace, &label);
                let (d, b) = (
                    rep["draft"]["accept_length"].as_f64().unwrap(),
                    rep["baseline"]["accept_length"].as_f64().unwrap(),
                );
                assert!(d > 1.0 && b > 1.0, "{label}: {d} {b}");
                eprintln!("{label}: accept length {d:.3} vs {b:.3} bf16");
            }
        }
    }
}

/// The gate's `next:` line: the tiny profile lists DSpark's taps (the fixture's), so the draft is
/// matched to its live target and the line is the live gate against the unquantized draft.
#[test]
fn next_is_the_gate() {
    let src = fix("dspark");
    let (_t, out, err) = quantize(src.to_str().unwrap(), &["--scheme", "int4-g32"]);
    let next: Vec<&str> = err.lines().filter(|l| l.starts_with("next: ")).collect();
    assert_eq!(next.len(), 1, "{err}");
    assert!(
        next[0].contains(&format!(
            "kquant verify --target kimi-k2.5-tiny --draft {} --baseline {}",
            out.display(),
            src.display()
        )),
        "{err}"
    );
}

#[test]
fn gptq_calibrates_them() {
    let t = tempfile::tempdir().unwrap();
    let trace = short_trace(t.path());
    for c in &CASES {
        let (_t, out, err) = quantize(
            fix(c.name).to_str().unwrap(),
            &[
                "--scheme",
                "int4-g32",
                "--method",
                "gptq",
                "--calibrate",
                trace.to_str().unwrap(),
                "--target-checkpoint",
                fix("target").to_str().unwrap(),
            ],
        );
        assert!(!err.contains("panicked"), "{err}");
        assert_kept(c, &out, c.name);
        let cfg = read_json(&out.join("config.json"));
        assert_eq!(cfg["kquant_quantization"]["method"], "gptq", "{}", c.name);
        assert_eq!(inspect_json(&out)["family"], c.name);
    }
}

/// Inferact's MLA DSpark (`k3-dspark`): vLLM's `K3DSparkModel` builds `context_proj`, the MLA
/// projections and the MLP with the quant config and its heads as `Qwen3DSparkModel` does; the
/// `embed_tokens` copy (vLLM drops it) is never quantized. Quantized, it stays a k3-dspark draft
/// and the replay runs it.
#[test]
fn the_mla_dspark_is_quantized_like_the_gqa_one() {
    let src = fix("k3-dspark");
    let s = src.to_str().unwrap();
    let plan = quantize_dry_run(s, &[]);
    let rows = plan["tensors"].as_array().unwrap();
    let row = |n: &str| rows.iter().find(|r| r["name"] == n).unwrap().clone();
    for (name, why) in CASES[0].kept {
        assert_eq!(row(name)["action"], "excluded", "{name}");
        assert!(
            row(name)["reason"].as_str().unwrap().contains(why),
            "{name}"
        );
    }
    for name in [
        "context_proj.weight",
        "layers.0.self_attn.q_a_proj.weight",
        "layers.0.self_attn.kv_a_proj_with_mqa.weight",
        "layers.0.self_attn.q_b_proj.weight",
        "layers.0.self_attn.kv_b_proj.weight",
        "layers.1.self_attn.o_proj.weight",
        "layers.1.mlp.down_proj.weight",
    ] {
        assert_eq!(row(name)["action"], "quantize", "{name}");
    }
    assert_ne!(row("embed_tokens.weight")["action"], "quantize");
    let t = tempfile::tempdir().unwrap();
    let trace = short_trace(t.path());
    for (scheme, format) in [("int4-pc", "quark"), ("nvfp4-a16", "modelopt")] {
        let label = format!("k3-dspark {scheme} {format}");
        let (_t, out, err) = quantize(s, &["--scheme", scheme, "--format", format]);
        assert!(!err.contains("panicked"), "{label}: {err}");
        let ours = load(&out.join("model.safetensors"));
        let theirs = load(&src.join("model.safetensors"));
        for (name, _) in CASES[0].kept {
            assert_eq!(ours.get(*name), theirs.get(*name), "{label}: {name} kept");
        }
        assert_ne!(
            ours.get("context_proj.weight"),
            theirs.get("context_proj.weight")
        );
        let j = inspect_json(&out);
        assert_eq!(j["block_draft"]["layout"], "k3-dspark", "{label}");
        assert_eq!(j["quantization"]["quantized"], true, "{label}");
        let rep = gate(&out, s, &trace, &label);
        let (d, b) = (&rep["draft"], &rep["baseline"]);
        assert!(d["rounds"].as_u64().is_some(), "{label}: {rep}");
        assert!(
            d["accept_length"].as_f64().unwrap() >= 1.0,
            "{label}: {rep}"
        );
        eprintln!(
            "{label}: accept length {} vs {} bf16 (random weights)",
            d["accept_length"], b["accept_length"]
        );
    }
}

#[test]
fn the_mla_dflash2_layout_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("d");
    std::fs::create_dir_all(&d).unwrap();
    let mut cfg = read_json(&fix("dflash2/config.json"));
    cfg["dflash_config"]["attention_mode"] = serde_json::json!("mla");
    std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(
        fix("dflash2/model.safetensors"),
        d.join("model.safetensors"),
    )
    .unwrap();
    let out = t.path().join("out");
    let o = kquant(&["quantize", d.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains("MLA `dflash2-mla` layout"), "{err}");
    assert!(err.contains("hint: "), "{err}");
    assert!(!out.exists());
}

/// docs/quantize.md ("DSpark and DFlash2") names every tensor pattern the families keep.
#[test]
fn the_doc_names_every_kept_pattern() {
    use kquant::quant::exclude::{DFLASH2_KEPT, DSPARK_KEPT};
    let doc = std::fs::read_to_string(root().join("docs/quantize.md")).unwrap();
    for k in DSPARK_KEPT.iter().chain(DFLASH2_KEPT) {
        assert!(
            doc.contains(&format!("| `{}` |", k.pattern)),
            "docs/quantize.md does not name `{}`",
            k.pattern
        );
    }
}

/// Quantizing DSpark's Markov projection (an explicit `--exclude` without it) warns what vLLM
/// does with it, per format; ModelOpt nvfp4-a16 (gathered by `dspark_draft_topk`) does not.
#[test]
fn a_quantized_markov_projection_warns() {
    let s = fix("dspark");
    let s = s.to_str().unwrap();
    for (scheme, format, says) in [
        ("int4-g32", "quark", Some("cannot load these tensors")),
        ("int4-g32", "compressed-tensors", Some("dspark_draft_topk")),
        ("nvfp4-a16", "modelopt", None),
    ] {
        let (_t, out, err) = quantize(
            s,
            &[
                "--scheme",
                scheme,
                "--format",
                format,
                "--exclude",
                "lm_head",
            ],
        );
        let w = err
            .lines()
            .find(|l| l.contains("`markov_head.markov_w2` (DSpark's Markov projection"));
        match says {
            Some(x) => assert!(w.is_some_and(|w| w.contains(x)), "{scheme} {format}: {err}"),
            None => assert!(w.is_none(), "{scheme} {format}: {err}"),
        }
        let name = "markov_head.markov_w2.weight";
        let t = load(&out.join("model.safetensors"));
        let src = load(&fix("dspark").join("model.safetensors"));
        assert_ne!(t.get(name), src.get(name), "{format}: quantized");
    }
}
