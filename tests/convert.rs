//! `kquant convert`: every (family, source dialect, engine) through the real binary, checked by
//! `kquant inspect` on the output; round trips that must give byte-identical tensors; quantized
//! drafts; aux-id conventions; refusals.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;

use common::{kquant, kquant_cmd, kquant_json, root};
use serde_json::Value;

fn ok(o: Output) -> Output {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

fn inspect(dir: &Path) -> Value {
    kquant_json(&["inspect", dir.to_str().unwrap(), "--json"])
}

/// name → raw bytes of every tensor.
fn tensors(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let w = kquant::io::source::open(dir.to_str().unwrap()).unwrap();
    w.names()
        .map(|n| (n.to_string(), w.tensor(n).unwrap().data.to_vec()))
        .collect()
}

fn convert(kind: &str, src: &str, out: &Path, to: &str, extra: &[&str]) -> Output {
    let mut a = vec![
        "convert",
        kind,
        src,
        "-o",
        out.to_str().unwrap(),
        "--to",
        to,
    ];
    a.extend_from_slice(extra);
    kquant(&a)
}

const TARGET: &str = "fixtures/tiny/target-kimi-k2";

fn target_embed() -> Vec<u8> {
    tensors(&root().join(TARGET))["model.embed_tokens.weight"].clone()
}
const EAGLE3_ENGINES: [(&str, &str, &str); 6] = [
    // engine, dialect kquant detects in the output, layer prefix
    ("sglang", "specforge", "midlayer."),
    ("vllm", "vllm", "layers.0."),
    ("trtllm", "vllm", "layers.0."),
    ("specforge", "specforge", "midlayer."),
    ("torchspec", "torchspec", "midlayer."),
    ("eagle", "eagle", "midlayer."),
];

#[test]
fn every_eagle3_source_to_every_engine() {
    let t = tempfile::tempdir().unwrap();
    for src in [
        "eagle3-specforge",
        "eagle3-modelopt",
        "eagle3-speculators",
        "eagle3-torchspec",
        "eagle3-mla-torchspec",
        "eagle3-mla-vllm",
    ] {
        let family = inspect(&root().join("fixtures/tiny").join(src))["family"]
            .as_str()
            .unwrap()
            .to_string();
        for (engine, dialect, prefix) in EAGLE3_ENGINES {
            if family == "eagle3-mla" && engine == "eagle" {
                continue;
            }
            let out = t.path().join(format!("{src}-{engine}"));
            ok(convert(
                "eagle3",
                &format!("fixtures/tiny/{src}"),
                &out,
                engine,
                &["--target-checkpoint", TARGET],
            ));
            let j = inspect(&out);
            assert_eq!(j["family"], family.as_str(), "{src} -> {engine}");
            assert_eq!(j["dialect"], dialect, "{src} -> {engine}");
            assert_eq!(j["layer_prefix"], prefix, "{src} -> {engine}");
            if engine != "eagle" {
                assert_eq!(
                    j["aux_layers"]["hidden_states"],
                    serde_json::json!([2, 4, 5]),
                    "{src} -> {engine}: taps"
                );
            }
            let loads = j["engines"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["engine"] == engine)
                .map(|e| e["loads"].as_str().unwrap().to_string());
            if let Some(l) = loads {
                assert_eq!(
                    l, "yes",
                    "{src} -> {engine}: the engine it was converted for must load it"
                );
            }
            // vLLM 0.33.0 reads an MLA EAGLE-3 draft with model_type deepseek_v3 as DeepSeek
            // MTP and refuses it; every SGLang release loads deepseek_v3.
            if family == "eagle3-mla" && engine == "vllm" {
                assert_eq!(j["model_type"], "kimi_k2", "{src} -> vllm");
            }
            if family == "eagle3-mla" && engine == "sglang" {
                assert_eq!(j["model_type"], "deepseek_v3", "{src} -> sglang");
            }
        }
    }
}

#[test]
fn round_trips_give_identical_tensor_bytes() {
    let t = tempfile::tempdir().unwrap();
    for (src, back) in [
        ("eagle3-specforge", "specforge"),
        ("eagle3-torchspec", "torchspec"),
        ("eagle3-mla-torchspec", "torchspec"),
    ] {
        let orig = tensors(&root().join("fixtures/tiny").join(src));
        for (via, _, _) in EAGLE3_ENGINES {
            if src.contains("mla") && via == "eagle" {
                continue;
            }
            let a = t.path().join(format!("{src}-{via}"));
            let b = t.path().join(format!("{src}-{via}-back"));
            ok(convert(
                "eagle3",
                &format!("fixtures/tiny/{src}"),
                &a,
                via,
                &["--target-checkpoint", TARGET],
            ));
            ok(convert(
                "eagle3",
                a.to_str().unwrap(),
                &b,
                back,
                &["--target-checkpoint", TARGET],
            ));
            let got = tensors(&b);
            assert_eq!(
                got.keys().collect::<Vec<_>>(),
                orig.keys().collect::<Vec<_>>(),
                "{src} -> {via} -> {back}: names"
            );
            let drops_embed = matches!(via, "sglang" | "specforge" | "eagle" | "trtllm");
            for (n, bytes) in &orig {
                if n == "embed_tokens.weight" && drops_embed {
                    // The hop dropped the draft's own copy; it came back from --target-checkpoint.
                    assert!(
                        got[n] == target_embed(),
                        "{src} -> {via} -> {back}: embed_tokens must be the target's"
                    );
                    continue;
                }
                assert!(
                    got[n] == *bytes,
                    "{src} -> {via} -> {back}: `{n}` bytes differ"
                );
            }
            let (ja, jb) = (
                inspect(&root().join("fixtures/tiny").join(src)),
                inspect(&b),
            );
            for k in ["family", "dialect", "layer_prefix"] {
                assert_eq!(ja[k], jb[k], "{src} -> {via} -> {back}: {k}");
            }
            assert_eq!(
                ja["aux_layers"]["hidden_states"],
                jb["aux_layers"]["hidden_states"]
            );
            for k in [
                "hidden_size",
                "draft_vocab_size",
                "vocab_size",
                "kv_lora_rank",
                "q_lora_rank",
                "intermediate_size",
            ] {
                assert_eq!(
                    ja["dims"][k], jb["dims"][k],
                    "{src} -> {via} -> {back}: {k}"
                );
            }
        }
    }
}

#[test]
fn dflash_round_trip_between_zlab_and_torchspec_names() {
    let t = tempfile::tempdir().unwrap();
    let a = t.path().join("ts");
    let b = t.path().join("back");
    ok(convert(
        "dflash",
        "fixtures/tiny/dflash-zlab",
        &a,
        "torchspec",
        &["--target-checkpoint", TARGET],
    ));
    let j = inspect(&a);
    assert_eq!(
        (j["family"].as_str(), j["dialect"].as_str()),
        (Some("dflash"), Some("torchspec"))
    );
    let names: Vec<String> = tensors(&a).into_keys().collect();
    for n in [
        "context_proj.weight",
        "context_norm.weight",
        "final_norm.weight",
        "embed_tokens.weight",
    ] {
        assert!(names.contains(&n.to_string()), "{n}");
    }
    ok(convert("dflash", a.to_str().unwrap(), &b, "zlab", &[]));
    assert_eq!(
        tensors(&b),
        tensors(&root().join("fixtures/tiny/dflash-zlab"))
    );
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(b.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        cfg["dflash_config"]["target_layer_ids"],
        serde_json::json!([1, 4])
    );
    assert_eq!(cfg["block_size"], 16);
    for e in ["sglang", "vllm"] {
        let o = t.path().join(e);
        ok(convert(
            "dflash",
            "fixtures/tiny/dflash-torchspec",
            &o,
            e,
            &[],
        ));
        assert_eq!(inspect(&o)["dialect"], "zlab");
    }
}

/// `--target`, the spelling before `--target-checkpoint`, still copies the target's tensors,
/// with a warning naming the new spelling; the new one says nothing; both together are refused.
#[test]
fn the_deprecated_target_spelling_still_works_and_warns() {
    let t = tempfile::tempdir().unwrap();
    let (new, old) = (t.path().join("new"), t.path().join("old"));
    let src = "fixtures/tiny/dflash-zlab";
    let o = ok(convert(
        "dflash",
        src,
        &new,
        "torchspec",
        &["--target-checkpoint", TARGET],
    ));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("deprecated"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = ok(convert(
        "dflash",
        src,
        &old,
        "torchspec",
        &["--target", TARGET],
    ));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("warning: `--target` is deprecated for convert: say --target-checkpoint (accepted until the next release)"),
        "{e}"
    );
    let got = tensors(&old);
    assert_eq!(got, tensors(&new));
    assert_eq!(got["embed_tokens.weight"], target_embed());
    let both = convert(
        "dflash",
        src,
        &t.path().join("both"),
        "torchspec",
        &["--target", TARGET, "--target-checkpoint", TARGET],
    );
    assert_eq!(both.status.code(), Some(2));
    assert!(!t.path().join("both").exists());
}

#[test]
fn vllm_gets_both_id_keys_and_trtllm_gets_its_yaml_and_int32_d2t() {
    let t = tempfile::tempdir().unwrap();
    let v = t.path().join("v");
    ok(convert(
        "eagle3",
        "fixtures/tiny/eagle3-specforge",
        &v,
        "vllm",
        &[],
    ));
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(v.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        cfg["eagle_aux_hidden_state_layer_ids"],
        serde_json::json!([2, 4, 5]),
        "input of layer = hidden_states"
    );
    assert_eq!(
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
        serde_json::json!([2, 4, 5])
    );
    // A standard draft: `norm_output` (which vLLM reads as EAGLE-3.1 post-norm feedback) absent.
    assert!(cfg.get("norm_output").is_none(), "{cfg}");
    for k in [
        "norm_before_residual",
        "fc_norm",
        "target_hidden_size",
        "draft_vocab_size",
    ] {
        assert!(cfg.get(k).is_some(), "{k} written explicitly");
    }
    assert!(!tensors(&v).contains_key("t2d"), "no engine reads t2d");
    let o = t.path().join("trt");
    let out = ok(convert(
        "eagle3",
        "fixtures/tiny/eagle3-specforge",
        &o,
        "trtllm",
        &[],
    ));
    let yaml = std::fs::read_to_string(o.join("extra-llm-api-config.yml")).unwrap();
    assert!(
        yaml.contains("eagle3_layers_to_capture: [1, 3, 4]"),
        "{yaml}"
    );
    assert!(
        yaml.contains(&format!(
            "speculative_model_dir: {}",
            o.canonicalize().unwrap().display()
        )),
        "{yaml}"
    );
    // #27.23: the file names the releases its spelling is for (the model card's `Eagle` /
    // `speculative_model_dir`, and the newer `Eagle3` / `speculative_model`).
    assert!(
        yaml.contains("decoding_type: Eagle\n")
            && yaml.contains("NVIDIA/TensorRT-LLM#10124")
            && yaml.contains("`decoding_type: Eagle3` and `speculative_model`"),
        "{yaml}"
    );
    // A file edited to the newer spelling is still recognised when quantize retargets it.
    let newer = yaml.replace("decoding_type: Eagle\n", "decoding_type: Eagle3\n");
    let re = kquant::convert::retarget_trtllm_yaml(&newer, "/elsewhere").expect("retargeted");
    assert!(re.contains("speculative_model_dir: /elsewhere"), "{re}");
    let w = kquant::io::source::open(o.to_str().unwrap()).unwrap();
    assert_eq!(w.info("d2t").unwrap().dtype, kquant::io::Dtype::I32);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("trtllm-serve") && err.contains("extra-llm-api-config.yml"),
        "launch line: {err}"
    );
    let s = t.path().join("s");
    let out = ok(convert("eagle3", o.to_str().unwrap(), &s, "sglang", &[]));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--speculative-algorithm EAGLE3"));
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(s.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
        serde_json::json!([1, 3, 4]),
        "SGLang: output of layer, first id 1"
    );
    assert_eq!(
        tensors(&s)["d2t"],
        tensors(&root().join("fixtures/tiny/eagle3-specforge"))["d2t"],
        "int32 -> int64 restores the bytes"
    );
}

#[test]
fn unknown_convention_is_required_not_guessed() {
    let t = tempfile::tempdir().unwrap();
    let o = convert(
        "eagle3",
        "fixtures/tiny/eagle3-vllm",
        &t.path().join("x"),
        "sglang",
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("no known convention") && err.contains("--aux-convention"),
        "{err}"
    );
    let out = t.path().join("y");
    ok(convert(
        "eagle3",
        "fixtures/tiny/eagle3-vllm",
        &out,
        "sglang",
        &["--aux-convention", "input-of-layer"],
    ));
    assert_eq!(
        inspect(&out)["aux_layers"]["hidden_states"],
        serde_json::json!([2, 4, 5])
    );
    let out = t.path().join("z");
    ok(convert(
        "eagle3",
        "fixtures/tiny/eagle3-vllm",
        &out,
        "specforge",
        &["--from", "vllm"],
    ));
    assert_eq!(
        inspect(&out)["aux_layers"]["ids"],
        serde_json::json!([1, 3, 4])
    );
    let out = t.path().join("w");
    ok(convert(
        "eagle3",
        "fixtures/tiny/eagle3-specforge",
        &out,
        "vllm",
        &[
            "--aux-layers",
            "1,29,57",
            "--aux-convention",
            "output-of-layer",
        ],
    ));
    assert_eq!(
        inspect(&out)["aux_layers"]["ids"],
        serde_json::json!([2, 30, 58])
    );
}

#[test]
fn quantized_drafts_stay_quantized() {
    let t = tempfile::tempdir().unwrap();
    let q = t.path().join("q");
    ok(kquant(&[
        "quantize",
        "fixtures/tiny/eagle3-specforge",
        "-o",
        q.to_str().unwrap(),
        "--exclude",
        "fc,lm_head",
    ]));
    let v = t.path().join("v");
    // vLLM does not load Quark int4-pc (refused without --force): the layout is still checked.
    ok(convert(
        "eagle3",
        q.to_str().unwrap(),
        &v,
        "vllm",
        &["--force"],
    ));
    let names = tensors(&v);
    assert!(names.contains_key("layers.0.self_attn.q_proj.weight_scale"));
    assert!(names.contains_key("layers.0.self_attn.q_proj.weight_zero_point"));
    let j = inspect(&v);
    assert_eq!(j["quantization"]["method"], "quark");
    assert_eq!(j["quantization"]["quantized_modules"], 7);
    // Dequantizing either gives the same weights under the engine's names.
    let (dq1, dq2) = (t.path().join("dq1"), t.path().join("dq2"));
    ok(kquant(&[
        "dequantize",
        q.to_str().unwrap(),
        "-o",
        dq1.to_str().unwrap(),
        "--dtype",
        "f32",
    ]));
    ok(kquant(&[
        "dequantize",
        v.to_str().unwrap(),
        "-o",
        dq2.to_str().unwrap(),
        "--dtype",
        "f32",
    ]));
    let (a, b) = (tensors(&dq1), tensors(&dq2));
    assert_eq!(
        a["midlayer.mlp.down_proj.weight"],
        b["layers.0.mlp.down_proj.weight"]
    );
    // Quantize after converting gives the same bytes as converting after quantizing.
    let v2 = t.path().join("v2");
    let q2 = t.path().join("q2");
    ok(convert(
        "eagle3",
        "fixtures/tiny/eagle3-specforge",
        &v2,
        "vllm",
        &[],
    ));
    ok(kquant(&[
        "quantize",
        v2.to_str().unwrap(),
        "-o",
        q2.to_str().unwrap(),
        "--exclude",
        "fc,lm_head",
    ]));
    let (x, y) = (tensors(&v), tensors(&q2));
    for (n, bytes) in &x {
        assert!(
            y[n] == *bytes,
            "`{n}` differs between quantize→convert and convert→quantize"
        );
    }
    same_files(&v, &q2, "quark, vllm");
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(v.join("config.json")).unwrap()).unwrap();
    let ex: Vec<&str> = cfg["quantization_config"]["exclude"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(ex.contains(&"fc") && ex.contains(&"lm_head"), "{ex:?}");
}

/// Every file of `a` and `b` byte for byte, but the manifests (which record the command);
/// TensorRT-LLM's YAML names its own directory, so each is compared with that path blanked.
fn same_files(a: &Path, b: &Path, what: &str) {
    let names = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n != "kquant-manifest.json")
            .collect();
        v.sort();
        v
    };
    let read = |d: &Path, n: &str| -> Vec<u8> {
        let bytes = std::fs::read(d.join(n)).unwrap();
        if n != "extra-llm-api-config.yml" {
            return bytes;
        }
        let own = std::fs::canonicalize(d).unwrap();
        String::from_utf8(bytes)
            .unwrap()
            .replace(own.to_str().unwrap(), "DIR")
            .into_bytes()
    };
    assert_eq!(names(a), names(b), "{what}: files");
    for n in names(a) {
        let (x, y) = (read(a, &n), read(b, &n));
        assert!(
            x == y,
            "{what}: `{n}` differs between quantize→convert and convert→quantize:\n{}\n---\n{}",
            String::from_utf8_lossy(&x[..x.len().min(2000)]),
            String::from_utf8_lossy(&y[..y.len().min(2000)])
        );
    }
}

/// ModelOpt drafts (`hf_quant_config.json` beside `config.json`): converting after quantizing
/// and quantizing after converting write the same bytes, every file.
#[test]
fn modelopt_quantize_and_convert_commute_byte_for_byte() {
    let t = tempfile::tempdir().unwrap();
    let p = |n: &str| t.path().join(n);
    let quantize = |src: &str, out: &Path, exclude: &str| {
        ok(kquant(&[
            "quantize",
            src,
            "--format",
            "modelopt",
            "--scheme",
            "fp8-pc",
            "--exclude",
            exclude,
            "-o",
            out.to_str().unwrap(),
        ]));
    };
    // engine, source, --exclude before converting, the same modules after converting.
    for (kind, src, to, ex, ex_converted) in [
        (
            "eagle3",
            "fixtures/tiny/eagle3-specforge",
            "trtllm",
            "fc,lm_head",
            "fc,lm_head",
        ),
        (
            "eagle3",
            "fixtures/tiny/eagle3-specforge",
            "vllm",
            "fc,lm_head,midlayer.mlp.down_proj,midlayer.self_attn.q_proj,midlayer.self_attn.k_proj,midlayer.self_attn.v_proj",
            "fc,lm_head,layers.0.mlp.down_proj,layers.0.self_attn.q_proj,layers.0.self_attn.k_proj,layers.0.self_attn.v_proj",
        ),
        (
            "dflash",
            "fixtures/tiny/dflash-zlab",
            "torchspec",
            "fc",
            "context_proj",
        ),
        (
            "dflash",
            "fixtures/tiny/dflash-zlab",
            "vllm",
            "fc,layers.1.mlp.down_proj",
            "fc,layers.1.mlp.down_proj",
        ),
    ] {
        let what = format!("{src} --to {to}");
        let (q, qc, c, cq) = (
            p(&format!("q-{kind}-{to}")),
            p(&format!("qc-{kind}-{to}")),
            p(&format!("c-{kind}-{to}")),
            p(&format!("cq-{kind}-{to}")),
        );
        quantize(src, &q, ex);
        ok(convert(kind, q.to_str().unwrap(), &qc, to, &["--target-checkpoint", TARGET]));
        ok(convert(kind, src, &c, to, &["--target-checkpoint", TARGET]));
        quantize(c.to_str().unwrap(), &cq, ex_converted);
        assert!(qc.join("hf_quant_config.json").is_file(), "{what}");
        same_files(&qc, &cq, &what);
    }
}

/// A draft converted for TensorRT-LLM and then quantized keeps an `extra-llm-api-config.yml`
/// that points at the quantized copy, when TensorRT-LLM loads the result; when it does not, the
/// source's YAML (which names the source) is left out with a warning saying why.
#[test]
fn quantizing_a_trtllm_draft_keeps_its_launch_config_pointing_at_itself() {
    let t = tempfile::tempdir().unwrap();
    let c = t.path().join("c");
    ok(convert(
        "eagle3",
        "fixtures/tiny/eagle3-specforge",
        &c,
        "trtllm",
        &["--target", TARGET],
    ));
    let src_yaml = std::fs::read_to_string(c.join("extra-llm-api-config.yml")).unwrap();
    let q = t.path().join("q");
    let o = kquant(&[
        "quantize",
        c.to_str().unwrap(),
        "--format",
        "modelopt",
        "--scheme",
        "fp8-pc",
        "-o",
        q.to_str().unwrap(),
    ]);
    ok(o);
    let y = std::fs::read_to_string(q.join("extra-llm-api-config.yml")).unwrap();
    let (cd, qd) = (
        std::fs::canonicalize(&c).unwrap(),
        std::fs::canonicalize(&q).unwrap(),
    );
    assert!(
        y.contains(&format!("speculative_model_dir: {}", qd.display())),
        "{y}"
    );
    assert!(!y.contains(cd.to_str().unwrap()), "{y}");
    assert_eq!(
        y,
        src_yaml.replace(cd.to_str().unwrap(), qd.to_str().unwrap()),
        "the same config, the quantized copy's path"
    );
    // Quark int4-pc: no engine loads it, TensorRT-LLM included: no YAML, a warning.
    let n = t.path().join("n");
    let o = kquant(&[
        "quantize",
        c.to_str().unwrap(),
        "--scheme",
        "int4-pc",
        "-o",
        n.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    ok(o);
    assert!(!n.join("extra-llm-api-config.yml").exists());
    assert!(
        err.contains("warning: extra-llm-api-config.yml of the source is not carried over: TensorRT-LLM does not load --format quark --scheme int4-pc"),
        "{err}"
    );
}

#[test]
fn wrong_family_and_engine_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let o = convert(
        "dflash",
        "fixtures/tiny/eagle3-specforge",
        &t.path().join("x"),
        "zlab",
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a DFlash drafter"));
    let o = convert(
        "eagle3",
        "fixtures/tiny/eagle3-specforge",
        &t.path().join("x"),
        "zlab",
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    let o = convert(
        "eagle3",
        "fixtures/tiny/target-kimi-k2",
        &t.path().join("x"),
        "vllm",
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(!t.path().join("x").exists());
}

#[test]
fn dry_run_writes_nothing_and_lists_drops() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("x");
    let o = ok(convert(
        "eagle3",
        "fixtures/tiny/eagle3-torchspec",
        &out,
        "sglang",
        &["--dry-run", "--json"],
    ));
    assert!(!out.exists());
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    let dropped: Vec<&str> = j["dropped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert!(dropped.contains(&"embed_tokens.weight"), "{dropped:?}");
    assert_eq!(
        j["config"]["architectures"],
        serde_json::json!(["LlamaForCausalLMEagle3"])
    );
}

#[test]
fn eagle31_post_norm_feedback_is_carried_as_behaviour_not_as_a_key() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let fx = root().join("fixtures/tiny/eagle3-modelopt");
    for f in ["model.safetensors", "config.json"] {
        std::fs::copy(fx.join(f), src.join(f)).unwrap();
    }
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    cfg["norm_output"] = serde_json::json!(true);
    std::fs::write(src.join("config.json"), serde_json::to_vec(&cfg).unwrap()).unwrap();
    let trt = t.path().join("trt");
    ok(convert(
        "eagle3",
        src.to_str().unwrap(),
        &trt,
        "trtllm",
        &[],
    ));
    let c: Value =
        serde_json::from_slice(&std::fs::read(trt.join("config.json")).unwrap()).unwrap();
    assert_eq!(c["norm_output"], true);
    let sg = t.path().join("sg");
    let o = ok(convert("eagle3", src.to_str().unwrap(), &sg, "sglang", &[]));
    assert!(String::from_utf8_lossy(&o.stderr).contains("post-norm hidden state"));
    // A SpecForge draft that says norm_output true (logits from norm(h), the standard) does not
    // become an EAGLE-3.1 draft in vLLM.
    let sf = t.path().join("sf");
    std::fs::create_dir_all(&sf).unwrap();
    let fx = root().join("fixtures/tiny/eagle3-specforge");
    for f in ["model.safetensors", "config.json"] {
        std::fs::copy(fx.join(f), sf.join(f)).unwrap();
    }
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(sf.join("config.json")).unwrap()).unwrap();
    cfg["norm_output"] = serde_json::json!(true);
    std::fs::write(sf.join("config.json"), serde_json::to_vec(&cfg).unwrap()).unwrap();
    let v = t.path().join("v");
    ok(convert("eagle3", sf.to_str().unwrap(), &v, "vllm", &[]));
    let c: Value = serde_json::from_slice(&std::fs::read(v.join("config.json")).unwrap()).unwrap();
    assert!(c.get("norm_output").is_none(), "{c}");
}

/// `kquant ARGS…` run from `dir`.
fn kq_in(dir: &Path, args: &[&str]) -> Output {
    kquant_cmd().current_dir(dir).args(args).output().unwrap()
}

/// The launch line `convert` printed on stderr.
fn printed_launch(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    let mut lines = err.lines().skip_while(|l| *l != "launch with:");
    assert!(lines.next().is_some(), "no launch line: {err}");
    lines.next().unwrap().trim().to_string()
}

/// The value after `flag ` in a launch line.
fn flag_value<'a>(line: &'a str, flag: &str) -> &'a str {
    let at = line
        .find(&format!("{flag} "))
        .unwrap_or_else(|| panic!("{flag} in {line}"));
    line[at + flag.len() + 1..].split(' ').next().unwrap()
}

/// vLLM's `--speculative-config '…'`, parsed.
fn vllm_config(line: &str) -> Value {
    let json = line.split('\'').nth(1).unwrap_or_else(|| panic!("{line}"));
    serde_json::from_str(json).unwrap()
}

/// The `key: value` of TensorRT-LLM's YAML (flat keys under `speculative_config`).
fn yaml_value(yaml: &str, key: &str) -> String {
    yaml.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{key}: ")))
        .unwrap_or_else(|| panic!("{key} in {yaml}"))
        .to_string()
}

/// DFlash launch lines follow the draft's own block size B: SGLang runs a block of B
/// (`--speculative-num-draft-tokens B`), vLLM drafts `num_speculative_tokens` B − 1, TensorRT-LLM
/// `max_draft_len` B − 1; `--steps` sets the tokens proposed per step, at most B − 1.
#[test]
fn dflash_launch_lines_follow_the_block_size() {
    let t = tempfile::tempdir().unwrap();
    // A copy of the z-lab fixture with another block size: top-level, or only in dflash_config
    // (which SGLang reads first).
    let copy = |name: &str, edit: &dyn Fn(&mut Value)| -> String {
        let d = t.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        let fx = root().join("fixtures/tiny/dflash-zlab");
        std::fs::copy(fx.join("model.safetensors"), d.join("model.safetensors")).unwrap();
        let mut cfg: Value =
            serde_json::from_slice(&std::fs::read(fx.join("config.json")).unwrap()).unwrap();
        edit(&mut cfg);
        std::fs::write(d.join("config.json"), serde_json::to_vec(&cfg).unwrap()).unwrap();
        d.to_str().unwrap().to_string()
    };
    let b8 = copy("block8", &|c| c["block_size"] = serde_json::json!(8));
    let b6 = copy("nested6", &|c| {
        c.as_object_mut().unwrap().remove("block_size");
        c["dflash_config"]["block_size"] = serde_json::json!(6);
    });
    let sources = [
        ("fixtures/tiny/dflash-zlab".to_string(), Some(16)),
        // TorchSpec's config has no block size: convert writes z-lab's default 16 (warning).
        ("fixtures/tiny/dflash-torchspec".to_string(), None),
        (b8, Some(8)),
        (b6, Some(6)),
    ];
    let mut n = 0;
    for (src, src_block) in &sources {
        assert_eq!(
            inspect(Path::new(src))["dims"]["block_size"],
            serde_json::json!(src_block),
            "{src}: kquant inspect reads the block size"
        );
        for steps in [None, Some(3)] {
            for engine in ["sglang", "vllm", "trtllm"] {
                n += 1;
                let out = t.path().join(format!("out{n}"));
                let mut extra = vec!["--json"];
                let s;
                if let Some(k) = steps {
                    s = k.to_string();
                    extra.extend(["--steps", &s]);
                }
                let o = ok(convert("dflash", src, &out, engine, &extra));
                let what = format!("{src} --to {engine} --steps {steps:?}");
                // The block size of the written draft, by kquant inspect.
                let block = inspect(&out)["dims"]["block_size"].as_u64().unwrap();
                assert_eq!(block, src_block.unwrap_or(16), "{what}");
                let proposed = steps.unwrap_or(block as usize - 1);
                let j: Value = serde_json::from_slice(&o.stdout).unwrap();
                let line = printed_launch(&o);
                assert_eq!(
                    j["launch"],
                    line.as_str(),
                    "{what}: --json launch = printed"
                );
                let dir = out.canonicalize().unwrap();
                let dir = dir.to_str().unwrap();
                match engine {
                    "sglang" => {
                        assert!(line.contains("--speculative-algorithm DFLASH"), "{line}");
                        assert_eq!(
                            flag_value(&line, "--speculative-num-draft-tokens"),
                            (proposed + 1).to_string(),
                            "{what}: {line}"
                        );
                        assert_eq!(
                            flag_value(&line, "--speculative-draft-model-path"),
                            dir,
                            "{what}"
                        );
                    }
                    "vllm" => {
                        let c = vllm_config(&line);
                        // What `verify --endpoint` reads, and Kimi's own model code.
                        assert!(
                            line.ends_with("--per-request-spec-decode-metrics summary")
                                && line.contains(" --trust-remote-code "),
                            "{what}: {line}"
                        );
                        assert_eq!(c["method"], "dflash", "{what}");
                        assert_eq!(c["num_speculative_tokens"], proposed, "{what}: {line}");
                        assert_eq!(c["model"], dir, "{what}");
                    }
                    _ => {
                        let yaml =
                            std::fs::read_to_string(out.join("extra-llm-api-config.yml")).unwrap();
                        assert_eq!(yaml_value(&yaml, "decoding_type"), "DFlash", "{yaml}");
                        assert_eq!(
                            yaml_value(&yaml, "max_draft_len"),
                            proposed.to_string(),
                            "{what}: {yaml}"
                        );
                        assert_eq!(yaml_value(&yaml, "speculative_model_dir"), dir);
                        assert_eq!(
                            flag_value(&line, "--extra_llm_api_options"),
                            format!("{dir}/extra-llm-api-config.yml")
                        );
                        // TensorRT-LLM's DFlash loader reads the z-lab layout.
                        let j = inspect(&out);
                        assert_eq!(j["dialect"], "zlab", "{what}");
                        let trt = j["engines"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .find(|e| e["engine"] == "trtllm")
                            .unwrap()
                            .clone();
                        assert_eq!(trt["loads"], "yes", "{what}: {trt}");
                    }
                }
            }
        }
    }
    // More tokens than the block holds: refused before anything is written.
    let out = t.path().join("refused");
    for (src, steps) in [
        ("fixtures/tiny/dflash-zlab", "16"),
        (sources[2].0.as_str(), "8"),
    ] {
        let o = convert("dflash", src, &out, "vllm", &["--steps", steps]);
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.starts_with("error: ")
                && err.contains("block_size")
                && err.contains("hint: ")
                && err.contains(&format!("{}", steps.parse::<u32>().unwrap() - 1)),
            "{err}"
        );
        assert!(!out.exists());
    }
}

/// A DFlash source without a block size gets z-lab's 16 and a warning naming the config.json
/// key to edit (no flag sets it); doing what it says changes the launch line and silences it.
/// A block size of 1 is refused with a hint naming the key the value was read from.
#[test]
fn the_missing_block_size_warning_names_the_config_key_to_edit() {
    let t = tempfile::tempdir().unwrap();
    let fx = root().join("fixtures/tiny/dflash-torchspec");
    let o = ok(convert(
        "dflash",
        fx.to_str().unwrap(),
        &t.path().join("a"),
        "vllm",
        &[],
    ));
    let e = String::from_utf8_lossy(&o.stderr);
    let warning = e
        .lines()
        .find(|l| l.starts_with("warning:") && l.contains("block_size"))
        .unwrap_or_else(|| panic!("no block_size warning: {e}"));
    let cfg_path = fx.join("config.json");
    assert!(
        warning.contains("`dflash_config.block_size`")
            && warning.contains("`\"block_size\": B`")
            && warning.contains(cfg_path.to_str().unwrap()),
        "{warning}"
    );
    assert!(
        !warning.contains("--"),
        "no flag sets the block size: {warning}"
    );
    // Do what the warning says.
    let edit = |name: &str, f: &dyn Fn(&mut Value)| {
        let d = t.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(fx.join("model.safetensors"), d.join("model.safetensors")).unwrap();
        let mut cfg: Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
        f(&mut cfg);
        std::fs::write(d.join("config.json"), serde_json::to_vec(&cfg).unwrap()).unwrap();
        d
    };
    let fixed = edit("fixed", &|c| c["block_size"] = serde_json::json!(8));
    let o = ok(convert(
        "dflash",
        fixed.to_str().unwrap(),
        &t.path().join("b"),
        "vllm",
        &[],
    ));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!e.contains("block_size"), "{e}");
    assert_eq!(
        vllm_config(&printed_launch(&o))["num_speculative_tokens"],
        7
    );
    // Too small, in dflash_config: the hint names that key and file.
    let one = edit("one", &|c| {
        c["dflash_config"] = serde_json::json!({"block_size": 1});
    });
    let o = convert(
        "dflash",
        one.to_str().unwrap(),
        &t.path().join("c"),
        "vllm",
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("hint: set `dflash_config.block_size` in ")
            && e.contains(one.join("config.json").to_str().unwrap()),
        "{e}"
    );
}

/// A `--from` that contradicts the source's layer names, and `--aux-layers` without a
/// convention, are refused with a hint naming the values that fit (not `kquant --help`).
#[test]
fn refused_from_and_aux_layers_name_the_values_that_fit() {
    let t = tempfile::tempdir().unwrap();
    let hint = |o: &Output| -> String {
        assert_eq!(o.status.code(), Some(2));
        let e = String::from_utf8_lossy(&o.stderr).into_owned();
        e.lines()
            .find_map(|l| l.strip_prefix("hint: "))
            .unwrap_or_else(|| panic!("{e}"))
            .to_string()
    };
    let out = t.path().join("o");
    for (src, from, fits, not) in [
        (
            "fixtures/tiny/eagle3-specforge",
            "vllm",
            &["sglang", "trtllm", "specforge", "torchspec", "eagle"][..],
            &["vllm", "zlab"][..],
        ),
        (
            "fixtures/tiny/eagle3-vllm",
            "sglang",
            &["vllm", "trtllm", "torchspec"][..],
            &["sglang", "specforge", "eagle", "zlab"][..],
        ),
    ] {
        let h = hint(&convert("eagle3", src, &out, "sglang", &["--from", from]));
        let listed: Vec<&str> = h
            .split("--from ")
            .nth(1)
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .split(" | ")
            .collect();
        assert_eq!(listed, fits, "{h}");
        for n in not {
            assert!(!listed.contains(n), "{h}");
        }
        // Each value the hint names is accepted.
        for f in fits {
            ok(convert(
                "eagle3",
                src,
                &out,
                "sglang",
                &["--from", f, "--force"],
            ));
        }
    }
    let h = hint(&convert(
        "eagle3",
        "fixtures/tiny/eagle3-vllm",
        &out,
        "sglang",
        &["--aux-layers", "1,2,3"],
    ));
    assert!(
        h.contains("--aux-convention output-of-layer")
            && h.contains("--aux-convention input-of-layer"),
        "{h}"
    );
}

/// A family's refused `--to` says which values it takes.
#[test]
fn a_refused_engine_names_the_ones_the_family_takes() {
    let t = tempfile::tempdir().unwrap();
    for (kind, src, to, takes) in [
        (
            "dflash",
            "fixtures/tiny/dflash-zlab",
            "eagle",
            "sglang, vllm, trtllm, specforge, torchspec, zlab",
        ),
        (
            "eagle3",
            "fixtures/tiny/eagle3-specforge",
            "zlab",
            "sglang, vllm, trtllm, specforge, torchspec, eagle",
        ),
    ] {
        let o = convert(kind, src, &t.path().join("x"), to, &[]);
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!("--to {to} does not take"))
                && err.contains(&format!("hint: `kquant convert {kind}` takes --to {takes}")),
            "{err}"
        );
        assert!(!err.contains("kquant --help"), "{err}");
    }
}

/// Run from another directory with a relative `-o` through a symbolic link: the YAML and the
/// launch lines name the output by its absolute, canonical final path, which exists.
#[test]
fn launch_lines_and_yaml_hold_the_absolute_output_path() {
    let t = tempfile::tempdir().unwrap();
    let cwd = t.path().join("work");
    std::fs::create_dir_all(cwd.join("real")).unwrap();
    std::os::unix::fs::symlink("real", cwd.join("conv")).unwrap();
    let real = cwd.join("real").canonicalize().unwrap();
    for (kind, fx, to) in [
        ("eagle3", "eagle3-specforge", "trtllm"),
        ("eagle3", "eagle3-specforge", "sglang"),
        ("eagle3", "eagle3-specforge", "vllm"),
        ("dflash", "dflash-zlab", "trtllm"),
        ("dflash", "dflash-zlab", "sglang"),
        ("dflash", "dflash-zlab", "vllm"),
    ] {
        let src = root().join("fixtures/tiny").join(fx);
        let rel = format!("conv/q-{kind}-{to}");
        let o = ok(kq_in(
            &cwd,
            &[
                "convert",
                kind,
                src.to_str().unwrap(),
                "-o",
                &rel,
                "--to",
                to,
                "--json",
            ],
        ));
        let want = real.join(format!("q-{kind}-{to}"));
        assert!(want.join("config.json").is_file(), "{}", want.display());
        let want = want.to_str().unwrap();
        let line = printed_launch(&o);
        let j: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(j["launch"], line.as_str());
        assert!(!line.contains("kquant-partial"), "{line}");
        let named = match to {
            "sglang" => flag_value(&line, "--speculative-draft-model-path").to_string(),
            "vllm" => vllm_config(&line)["model"].as_str().unwrap().to_string(),
            _ => {
                let opts = flag_value(&line, "--extra_llm_api_options");
                assert_eq!(opts, format!("{want}/extra-llm-api-config.yml"));
                let yaml = std::fs::read_to_string(opts).unwrap();
                assert!(!yaml.contains("kquant-partial"), "{yaml}");
                assert!(
                    yaml.contains(&format!("--extra_llm_api_options {opts}")),
                    "{yaml}"
                );
                yaml_value(&yaml, "speculative_model_dir")
            }
        };
        assert_eq!(named, want, "{kind} --to {to}: {line}");
        assert!(Path::new(&named).is_absolute() && Path::new(&named).is_dir());
    }
}

/// SGLang gives a draft the target's context and refuses one whose own is shorter
/// (`ModelConfig._derive_context_length`; the engine tier's `sglang_context.py` runs SGLang's
/// code on these lines). With the target known, `--to sglang` caps the server at the draft's
/// context and says why; without it, a warning names the check; other engines are untouched.
#[test]
fn sglang_launch_lines_cap_the_context_at_the_drafts() {
    let t = tempfile::tempdir().unwrap();
    let fx = root().join("fixtures/kimi-k2.5-tiny");
    let target = fx.join("target");
    for kind in ["eagle3", "dflash"] {
        let src = fx.join(kind);
        let src = src.to_str().unwrap();
        let with = ok(convert(
            kind,
            src,
            &t.path().join(format!("{kind}-sg")),
            "sglang",
            &["--target-checkpoint", target.to_str().unwrap(), "--json"],
        ));
        let line = printed_launch(&with);
        assert_eq!(
            flag_value(&line, "--context-length"),
            "4096",
            "{kind}: {line}"
        );
        let j: Value = serde_json::from_slice(&with.stdout).unwrap();
        assert_eq!(j["context_length"], 4096, "{kind}");
        let e = String::from_utf8_lossy(&with.stderr);
        assert!(
            e.contains("warning: SGLang refuses a draft whose context (4096) is below the target's (262144)")
                && e.contains("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"),
            "{kind}: {e}"
        );
        let without = ok(convert(
            kind,
            src,
            &t.path().join(format!("{kind}-sg-nt")),
            "sglang",
            &[],
        ));
        let line = printed_launch(&without);
        assert!(!line.contains("--context-length"), "{kind}: {line}");
        let e = String::from_utf8_lossy(&without.stderr);
        assert!(
            e.contains("pass --target-checkpoint") && e.contains("--context-length 4096"),
            "{kind}: {e}"
        );
        let vllm = ok(convert(
            kind,
            src,
            &t.path().join(format!("{kind}-vllm")),
            "vllm",
            &["--target-checkpoint", target.to_str().unwrap()],
        ));
        let e = String::from_utf8_lossy(&vllm.stderr);
        assert!(!e.contains("SGLang"), "{kind}: {e}");
        assert!(!printed_launch(&vllm).contains("--context-length"));
    }
}

/// `convert dflash` names the draft's target, from its shape or from `--target-checkpoint`,
/// and says which engines cannot serve it beside that target: on Kimi-Linear SGLang and
/// TensorRT-LLM do not, vLLM only from the build with SupportsEagle3 on the target class
/// (docs/verify.md). The files are written all the same; on the Kimi-K2 target nothing is
/// said.
#[test]
fn dflash_convert_says_which_engines_serve_it_beside_its_target() {
    let t = tempfile::tempdir().unwrap();
    let kl = root().join("fixtures/kimi-linear-tiny");
    let k2 = root().join("fixtures/kimi-k2.5-tiny");
    for (engine, serves) in [("sglang", "no"), ("trtllm", "no"), ("vllm", "from-build")] {
        // From the draft's shape alone: the tiny Kimi-Linear and Kimi-K2 targets are both 4
        // layers of 256; the taps tell them apart.
        let out = t.path().join(format!("kl-{engine}"));
        let o = ok(convert(
            "dflash",
            kl.join("dflash").to_str().unwrap(),
            &out,
            engine,
            &["--json"],
        ));
        let j: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(
            j["target"]["architecture"], "KimiLinearForCausalLM",
            "{engine}"
        );
        let from = j["target"]["known_from"].as_str().unwrap();
        assert!(
            from.contains("kimi-linear-tiny") && from.contains("hs[2, 3]"),
            "{engine}: {from}"
        );
        assert_eq!(j["target"]["serving"]["serves"], serves, "{engine}");
        assert_eq!(j["target"]["serving"]["engine"], engine);
        let e = String::from_utf8_lossy(&o.stderr);
        let name = match engine {
            "sglang" => "SGLang does not serve",
            "trtllm" => "TensorRT-LLM does not serve",
            _ => "vLLM serves a dflash draft beside a KimiLinearForCausalLM target only from a recent build",
        };
        assert!(e.contains(&format!("warning: {name}")), "{engine}: {e}");
        if engine == "vllm" {
            assert!(e.contains("vllm-project/vllm#52171"), "{e}");
        }
        // Written regardless: the layout is the engine's.
        assert!(out.join("model.safetensors").is_file(), "{engine}");

        // Named by the target checkpoint instead.
        let o = ok(convert(
            "dflash",
            kl.join("dflash").to_str().unwrap(),
            &t.path().join(format!("kl-{engine}-tc")),
            engine,
            &[
                "--json",
                "--target-checkpoint",
                kl.join("target").to_str().unwrap(),
            ],
        ));
        let j: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(j["target"]["known_from"], "--target-checkpoint");
        assert_eq!(j["target"]["serving"]["serves"], serves, "{engine}");

        // The Kimi-K2 drafter: its target named, nothing in the way.
        let o = ok(convert(
            "dflash",
            k2.join("dflash").to_str().unwrap(),
            &t.path().join(format!("k2-{engine}")),
            engine,
            &["--json"],
        ));
        let j: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(j["target"]["architecture"], "DeepseekV3ForCausalLM");
        assert!(j["target"]["known_from"]
            .as_str()
            .unwrap()
            .contains("kimi-k2.5-tiny"));
        assert!(j["target"]["serving"].is_null(), "{engine}: {j}");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(
            !e.contains("does not serve") && !e.contains("only from a recent build"),
            "{engine}: {e}"
        );
    }
    // A trainer layout is no engine: the target is named, no verdict.
    let o = ok(convert(
        "dflash",
        kl.join("dflash").to_str().unwrap(),
        &t.path().join("kl-zlab"),
        "zlab",
        &["--json"],
    ));
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["target"]["architecture"], "KimiLinearForCausalLM");
    assert!(j["target"]["serving"].is_null());
}

/// The card's chain (`quantize --scheme int4-pc --exclude fc,lm_head`: Quark int4-pc, which no
/// engine loads) then `convert --to ENGINE`: refused as `inspect` refuses it, naming what the
/// engine does load; with `--force` written, with a warning (in the JSON too) and no launch
/// line. A scheme the engine loads converts as before, launch line and all.
#[test]
fn convert_refuses_a_quantized_draft_the_engine_does_not_load() {
    let t = tempfile::tempdir().unwrap();
    let q = t.path().join("q");
    ok(kquant(&[
        "quantize",
        "fixtures/tiny/eagle3-specforge",
        "-o",
        q.to_str().unwrap(),
        "--scheme",
        "int4-pc",
        "--exclude",
        "fc,lm_head",
    ]));
    let engines = inspect(&q)["engines"].clone();
    for (to, name, loads) in [
        ("trtllm", "TensorRT-LLM", "--format modelopt"),
        ("vllm", "vLLM", "--format compressed-tensors"),
        ("sglang", "SGLang", "--format compressed-tensors"),
    ] {
        let claim = engines
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["engine"] == to)
            .unwrap();
        assert_eq!(claim["loads"], "no", "inspect on {to}");
        let out = t.path().join(format!("c-{to}"));
        let o = convert("eagle3", q.to_str().unwrap(), &out, to, &[]);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!(o.status.code(), Some(2), "--to {to}: {err}");
        assert!(
            err.starts_with(&format!("error: {name} does not load this draft")),
            "--to {to}: {err}"
        );
        assert!(err.contains(claim["why"].as_str().unwrap()), "{err}");
        let hint = err.lines().find(|l| l.starts_with("hint:")).unwrap_or("");
        assert!(
            hint.contains(loads) && hint.contains("--force"),
            "--to {to}: {err}"
        );
        assert!(!out.exists(), "--to {to}: nothing written");
        // --force: written, warned on stderr and in the JSON, no launch line.
        let o = convert(
            "eagle3",
            q.to_str().unwrap(),
            &out,
            to,
            &["--force", "--json"],
        );
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(o.status.success(), "--to {to} --force: {err}");
        let j: Value = serde_json::from_slice(&o.stdout).unwrap();
        let warned = j["warnings"].as_array().unwrap().iter().any(|w| {
            w.as_str()
                .unwrap()
                .starts_with(&format!("{name} does not load this draft"))
        });
        assert!(warned, "--to {to}: {j}");
        assert!(j["launch"].is_null(), "--to {to}: {j}");
        assert!(
            err.contains(&format!("warning: {name} does not load this draft")),
            "{err}"
        );
        assert!(!err.contains("launch with:"), "--to {to}: {err}");
    }
    // compressed-tensors int4-pc: vLLM loads it, a launch line as before.
    let ct = t.path().join("ct");
    ok(kquant(&[
        "quantize",
        "fixtures/tiny/eagle3-specforge",
        "-o",
        ct.to_str().unwrap(),
        "--format",
        "compressed-tensors",
        "--scheme",
        "int4-pc",
        "--exclude",
        "fc,lm_head",
    ]));
    let o = ok(convert(
        "eagle3",
        ct.to_str().unwrap(),
        &t.path().join("ct-v"),
        "vllm",
        &[],
    ));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("launch with:\n  vllm serve"), "{err}");
    assert!(!err.contains("warning:"), "{err}");
}
