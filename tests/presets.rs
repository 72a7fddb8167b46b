//! `quantize --config`: every shipped preset parses, builds, and gives the same bytes as the
//! equivalent flags; flags override presets; a preset for another family is refused.

use crate::common;

use common::kquant;

#[test]
fn every_file_in_quant_configs_is_a_builtin_that_builds() {
    common::assert_files_are_builtin("quant-configs", kquant::quant::preset::BUILTIN);
    for (name, _) in kquant::quant::preset::BUILTIN {
        let p = kquant::quant::preset::load(name).unwrap();
        let flags = kquant::quant::registry::QuarkFlags {
            layout: p.quark_layout,
            version: p.quark_version,
            sequential: p.quark_sequential,
        };
        assert!(
            kquant::quant::registry::build(p.scheme.parse().unwrap(), p.format, flags, None)
                .is_ok(),
            "{name}"
        );
        assert!(!p.description.is_empty() && !p.loads.is_empty());
    }
}

#[test]
fn preset_equals_its_flags() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let o = kquant(&[
        "quantize",
        "fixtures/tiny/eagle3-specforge",
        "-o",
        a.to_str().unwrap(),
        "--config",
        "kimi-k2.5-eagle3-int4-pc",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = kquant(&[
        "quantize",
        "fixtures/tiny/eagle3-specforge",
        "-o",
        b.to_str().unwrap(),
        "--exclude",
        "fc,lm_head",
        "--quark-layout",
        "file2file",
        "--quark-version",
        "0.11.1",
    ]);
    assert!(o.status.success());
    for f in ["model.safetensors", "config.json"] {
        assert_eq!(
            std::fs::read(a.join(f)).unwrap(),
            std::fs::read(b.join(f)).unwrap(),
            "{f}"
        );
    }
    // A file path works too, and flags override the preset.
    let c = t.path().join("c");
    let o = kquant(&[
        "quantize",
        "fixtures/tiny/eagle3-specforge",
        "-o",
        c.to_str().unwrap(),
        "--config",
        "quant-configs/kimi-k2.5-eagle3-int4-pc.json",
        "--format",
        "compressed-tensors",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let cfg = common::read_json(&c.join("config.json"));
    assert_eq!(
        cfg["quantization_config"]["quant_method"],
        "compressed-tensors"
    );
    assert!(
        cfg["quantization_config"]["ignore"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v == "fc"),
        "preset exclude kept"
    );
}

#[test]
fn wrong_family_and_unknown_preset_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let bad = t.path().join("bad.json");
    std::fs::write(&bad, br#"{"scheme":"int4-pc","format":"quark","typo":1}"#).unwrap();
    for (src, config, says) in [
        // The hint names what exists, not `kquant --help`.
        (
            "fixtures/tiny/eagle3-specforge",
            "kimi-k2.5-eagle3-mla-int4-pc",
            "is eagle3\n\nhint: presets for eagle3 drafts: kimi-k2.5-eagle3-int4-pc,",
        ),
        (
            "fixtures/tiny/dflash-zlab",
            "kimi-k2.5-eagle3-int4-pc",
            "hint: no built-in preset is for dflash drafts: pass --scheme/--format/--exclude",
        ),
        (
            "fixtures/tiny/eagle3-specforge",
            "nope",
            "hint: the built-in presets are kimi-k2.5-eagle3-int4-pc",
        ),
        (
            "fixtures/tiny/eagle3-specforge",
            bad.to_str().unwrap(),
            "bad.json",
        ),
    ] {
        let (_o, _, err) = common::quantize_refused(src, &["--config", config]);
        assert!(err.contains(says), "{err}");
        assert!(!err.contains("see `kquant --help`"), "{err}");
    }
}

/// `quantize` says what comes next, and it runs: each printed `kquant convert` succeeds, its
/// engines are the ones the claims table says load the result, and `--json` carries the scheme,
/// format, warnings and next steps. A target checkpoint gets a note instead.
#[test]
fn quantize_says_what_comes_next_and_it_runs() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("q");
    let o = kquant(&[
        "quantize",
        "fixtures/tiny/eagle3-specforge",
        "-o",
        out.to_str().unwrap(),
        "--scheme",
        "fp8-pc",
        "--format",
        "modelopt",
        "--exclude",
        "fc,lm_head",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["scheme"], "fp8-pc");
    assert_eq!(j["format"], "modelopt");
    assert!(j["warnings"].as_array().unwrap().is_empty(), "{j}");
    let next: Vec<String> = j["next"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect();
    let err = String::from_utf8_lossy(&o.stderr);
    for n in &next {
        assert!(err.contains(&format!("next: {n}")), "{err}");
    }
    let converts: Vec<&String> = next
        .iter()
        .filter(|n| n.starts_with("kquant convert"))
        .collect();
    // ModelOpt FP8 per channel: vLLM and TensorRT-LLM load it, SGLang does not.
    let to: Vec<&str> = converts
        .iter()
        .map(|c| c.split("--to ").nth(1).unwrap().split(' ').next().unwrap())
        .collect();
    assert_eq!(to, ["vllm", "trtllm"], "{next:?}");
    for c in converts {
        let args: Vec<&str> = c
            .split(" (")
            .next()
            .unwrap()
            .split_whitespace()
            .skip(1)
            .collect();
        let r = kquant(&args);
        assert!(
            r.status.success(),
            "{c}: {}",
            String::from_utf8_lossy(&r.stderr)
        );
    }
    assert!(next.last().unwrap().starts_with("kquant verify --target"));
    let o = kquant(&[
        "quantize",
        "fixtures/tiny/target-kimi-k2",
        "-o",
        t.path().join("target").to_str().unwrap(),
        "--scheme",
        "fp8-pc",
    ]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("is not a draft (family target)") && !err.contains("next:"),
        "{err}"
    );
}
