//! `kquant convert dspark` and `convert dflash2` (src/convert/block.rs) on the trained tiny Kimi
//! fixtures `dspark/` (vLLM `Qwen3DSparkModel` layout) and `dflash2/`: the round trip vLLM →
//! SpecForge/SGLang → speculators → vLLM keeps every tensor's bytes and the config; `inspect`
//! of each output names the layout written with the same taps (as HF `hidden_states` indices),
//! block, anchor layout and Markov rank; `verify` replays each output to the source's accept
//! length; the anchor layout stays explicit; quantized drafts stay quantized; what no engine
//! loads is refused (exit 2). The launch lines, through the engines' own code
//! (tests/engines/launch_2026.py), run when asked for with the engine venvs (ignored tests).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{inspect_json, kquant, kquant_json, load, read_json, root};
use serde_json::{json, Value};

const FIX: &str = "fixtures/kimi-k2.5-tiny";

fn fix(rel: &str) -> PathBuf {
    root().join(FIX).join(rel)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `kquant convert KIND SRC -o OUT --to TO ARGS…`, which must succeed: its standard error.
fn convert(kind: &str, src: &Path, out: &Path, to: &str, args: &[&str]) -> String {
    let mut all = vec!["convert", kind, s(src), "-o", s(out), "--to", to];
    all.extend_from_slice(args);
    let o = kquant(&all);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(0), "{all:?}: {err}");
    err
}

/// `kquant convert …`, which must be refused: exit 2, `error:` and `hint:`, nothing written.
fn refused(kind: &str, src: &Path, to: &str, args: &[&str]) -> String {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let mut all = vec!["convert", kind, s(src), "-o", s(&out), "--to", to];
    all.extend_from_slice(args);
    let o = kquant(&all);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{all:?}: {err}");
    assert!(err.starts_with("error: "), "{all:?}: {err}");
    assert!(err.contains("hint: "), "{all:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!out.exists(), "{all:?} wrote {}", out.display());
    err
}

fn config(dir: &Path) -> Value {
    read_json(&dir.join("config.json"))
}

/// Every tensor of `out` is the source's, byte for byte, under the same name.
fn assert_same_tensors(src: &Path, out: &Path, label: &str) {
    let a = load(&src.join("model.safetensors"));
    let b = load(&out.join("model.safetensors"));
    assert_eq!(a.len(), b.len(), "{label}: tensor count");
    for (name, t) in &a {
        assert_eq!(b.get(name), Some(t), "{label}: {name}");
    }
}

/// What `inspect` says of a converted DSpark/DFlash2 draft: the layout, the taps as HF
/// `hidden_states` indices, the block, the anchor layout and the Markov rank.
fn described(dir: &Path) -> Value {
    let j = inspect_json(dir);
    let b = &j["block_draft"];
    json!({
        "family": j["family"],
        "layout": b["layout"],
        "taps": j["aux_layers"]["hidden_states"],
        "block": b["block_size"],
        "anchor": b["anchor"]["layout"],
        "markov": b["markov"]["rank"],
    })
}

/// The source's description with another layout.
fn as_layout(d: &Value, layout: &str) -> Value {
    let mut d = d.clone();
    d["layout"] = json!(layout);
    d
}

#[test]
fn the_round_trip_keeps_the_bytes_the_config_and_what_inspect_says() {
    let t = tempfile::tempdir().unwrap();
    let src = fix("dspark");
    let (v1, sf, sp, v2) = (
        t.path().join("vllm"),
        t.path().join("specforge"),
        t.path().join("speculators"),
        t.path().join("vllm-again"),
    );
    convert("dspark", &src, &v1, "vllm", &[]);
    convert("dspark", &v1, &sf, "specforge", &[]);
    convert("dspark", &sf, &sp, "speculators", &[]);
    convert("dspark", &sp, &v2, "vllm", &[]);
    let want = described(&src);
    assert_eq!(want["layout"], "qwen3-dspark");
    assert_eq!(want["taps"], json!([1, 3]));
    assert_eq!(want["anchor"], "anchor-first");
    for (dir, layout) in [
        (&v1, "qwen3-dspark"),
        (&sf, "specforge-dspark"),
        (&sp, "speculators-dspark"),
        (&v2, "qwen3-dspark"),
    ] {
        assert_same_tensors(&src, dir, layout);
        assert_eq!(described(dir), as_layout(&want, layout), "{layout}");
    }
    // The same config back, and the source's own keys where vLLM reads them.
    assert_eq!(config(&v2), config(&v1));
    let (a, b) = (config(&src), config(&v1));
    for k in [
        "block_size",
        "mask_token_id",
        "markov_rank",
        "markov_head_type",
        "enable_confidence_head",
        "confidence_head_with_markov",
        "sample_from_anchor",
        "num_target_layers",
        "hidden_size",
        "draft_vocab_size",
    ] {
        assert_eq!(a[k], b[k], "{k}");
    }
    assert_eq!(a["dflash_config"], b["dflash_config"]);
}

/// Each layout's keys where its loaders read them.
#[test]
fn each_layout_keeps_the_keys_where_its_loaders_read_them() {
    let t = tempfile::tempdir().unwrap();
    let (sf, sp) = (t.path().join("sf"), t.path().join("sp"));
    convert("dspark", &fix("dspark"), &sf, "sglang", &[]);
    let c = config(&sf);
    assert_eq!(c["architectures"], json!(["DSparkDraftModel"]));
    assert_eq!(c["model_type"], "qwen3");
    let dc = &c["dflash_config"];
    for k in [
        "block_size",
        "mask_token_id",
        "markov_rank",
        "markov_head_type",
    ] {
        assert_eq!(dc[k], c[k], "{k} in dflash_config and at the root");
        assert!(!c[k].is_null(), "{k}");
    }
    assert_eq!(dc["target_layer_ids"], json!([0, 2]));
    // Target depth in SpecForge's meaning; never `dflash_config.sample_from_anchor` (vLLM's
    // DFlash speculator refuses it).
    assert_eq!(c["num_target_layers"], 4);
    assert!(dc.get("sample_from_anchor").is_none());
    assert_eq!(c["sample_from_anchor"], true);

    convert("dspark", &fix("dspark"), &sp, "speculators", &[]);
    let c = config(&sp);
    assert_eq!(c["speculators_model_type"], "dspark");
    assert_eq!(c["aux_hidden_state_layer_ids"], json!([1, 3]));
    assert_eq!(c["sample_from_anchor"], true, "the anchor layout explicit");
    assert_eq!(
        c["speculators_config"]["proposal_methods"][0]["speculative_tokens"],
        7
    );
    assert_eq!(c["transformer_layer_config"]["hidden_size"], 256);
    assert!(c.get("dflash_config").is_none());
    assert!(c.get("hidden_size").is_none());
}

/// A draft trained on the 1+N layout stays one in every layout, stated, not defaulted.
#[test]
fn the_anchor_layout_stays_the_trained_one() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("dspark-1n");
    std::fs::create_dir(&src).unwrap();
    std::fs::copy(
        fix("dspark/model.safetensors"),
        src.join("model.safetensors"),
    )
    .unwrap();
    let mut c = config(&fix("dspark"));
    c["sample_from_anchor"] = json!(false);
    std::fs::write(src.join("config.json"), c.to_string()).unwrap();
    let mut prev = src.clone();
    for to in ["specforge", "speculators", "vllm"] {
        let out = t.path().join(to);
        let err = convert("dspark", &prev, &out, to, &[]);
        assert_eq!(config(&out)["sample_from_anchor"], false, "{to}");
        assert_eq!(described(&out)["anchor"], "bonus-anchor", "{to}");
        if to != "specforge" {
            assert!(err.contains("\"num_speculative_tokens\":6"), "{to}: {err}");
        }
        prev = out;
    }
}

/// `verify` replays the converted drafts to the source's accept length.
#[test]
fn verify_replays_each_output_as_the_source() {
    let t = tempfile::tempdir().unwrap();
    let trace = t.path().join("trace");
    common::one_sample_per_category(&fix("trace"), &trace);
    let verify = |draft: &Path| {
        let r = kquant_json(&[
            "verify",
            "--draft",
            s(draft),
            "--trace",
            s(&trace),
            "--target-checkpoint",
            s(&fix("target")),
            "--json",
            "-",
        ]);
        (
            r["draft"]["accept_length"].clone(),
            r["draft"]["accept_length_all_positions"].clone(),
        )
    };
    for (kind, tos) in [
        ("dspark", &["specforge", "speculators", "sglang"][..]),
        ("dflash2", &["vllm", "sglang"][..]),
    ] {
        let src = fix(kind);
        let want = verify(&src);
        assert!(want.0.as_f64().unwrap() > 1.0, "{kind}: {want:?}");
        for to in tos {
            let out = t.path().join(format!("{kind}-{to}"));
            convert(kind, &src, &out, to, &[]);
            assert_same_tensors(&src, &out, to);
            assert_eq!(verify(&out), want, "{kind} --to {to}");
        }
    }
}

/// DFlash2 has one layout: vLLM's and SGLang's outputs are the same files; only the launch
/// line differs.
#[test]
fn dflash2_is_one_layout_for_both_engines() {
    let t = tempfile::tempdir().unwrap();
    let (v, g) = (t.path().join("v"), t.path().join("g"));
    let ev = convert("dflash2", &fix("dflash2"), &v, "vllm", &[]);
    let eg = convert("dflash2", &fix("dflash2"), &g, "sglang", &[]);
    assert_eq!(config(&v), config(&g));
    assert_eq!(config(&v), config(&fix("dflash2")));
    assert!(ev.contains("\"method\":\"dflash\""), "{ev}");
    assert!(ev.contains("\"num_speculative_tokens\":7"), "{ev}");
    assert!(
        eg.contains("--speculative-algorithm DFLASH")
            && eg.contains("--speculative-num-draft-tokens 8"),
        "{eg}"
    );
}

/// The launch lines: vLLM's `dspark` method with the block's proposals, SGLang's DSPARK with a
/// window of gamma + 1; `--steps` within the block.
#[test]
fn launch_lines_follow_the_block() {
    let t = tempfile::tempdir().unwrap();
    let out = |n: &str| t.path().join(n);
    let e = convert("dspark", &fix("dspark"), &out("v"), "vllm", &[]);
    assert!(e.contains("\"method\":\"dspark\""), "{e}");
    assert!(e.contains("\"num_speculative_tokens\":7"), "{e}");
    let e = convert("dspark", &fix("dspark"), &out("g"), "sglang", &[]);
    assert!(e.contains("--speculative-algorithm DSPARK"), "{e}");
    assert!(e.contains("--speculative-num-draft-tokens 8"), "{e}");
    assert!(!e.contains("--speculative-dspark-block-size"), "{e}");
    let e = convert(
        "dspark",
        &fix("dspark"),
        &out("g4"),
        "sglang",
        &["--steps", "4"],
    );
    assert!(
        e.contains("--speculative-dspark-block-size 4 --speculative-num-draft-tokens 5"),
        "{e}"
    );
    let e = convert("dspark", &fix("dspark"), &out("sf"), "specforge", &[]);
    assert!(!e.contains("launch with"), "a trainer layout: {e}");
    let err = refused("dspark", &fix("dspark"), "vllm", &["--steps", "8"]);
    assert!(err.contains("at most 7"), "{err}");
}

/// `--dry-run` writes nothing and `--json` prints the plan / the result, naming the layout
/// written, the taps and the launch line.
#[test]
fn dry_run_and_json() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let src = fix("dspark");
    let args = [
        "convert",
        "dspark",
        s(&src),
        "-o",
        s(&out),
        "--to",
        "speculators",
    ];
    let mut dry = args.to_vec();
    dry.extend(["--dry-run", "--json"]);
    let p = kquant_json(&dry);
    assert!(!out.exists());
    assert_eq!(p["schema"], "kquant.convert-plan/1");
    assert_eq!(p["layout"], "speculators-dspark");
    assert_eq!(p["aux_layers"]["hidden_states"], json!([1, 3]));
    assert_eq!(p["aux_layers"]["written"], json!([1, 3]));
    assert_eq!(p["config"]["speculators_model_type"], "dspark");
    assert!(p["launch"]
        .as_str()
        .unwrap()
        .contains("\"method\":\"dspark\""));
    assert!(p["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t["from"]["copy"] == t["name"]));
    let o = kquant(&dry[..dry.len() - 1]);
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).contains("aux layers: hidden_states [1, 3]"));
    assert!(!out.exists());
    let mut j = args.to_vec();
    j.push("--json");
    let r = kquant_json(&j);
    assert_eq!(r["schema"], "kquant.convert/1");
    assert_eq!(r["layout"], "speculators-dspark");
    assert!(out.join("config.json").is_file());
}

/// A quantized draft stays quantized: the packed tensors byte for byte, the quantization
/// config where vLLM reads it (in a speculators config: `transformer_layer_config` too).
#[test]
fn quantized_drafts_stay_quantized() {
    let (_t, q, _) = common::quantize(
        s(&fix("dspark")),
        &["--scheme", "int4-g128", "--format", "compressed-tensors"],
    );
    let t = tempfile::tempdir().unwrap();
    let (sp, v) = (t.path().join("sp"), t.path().join("v"));
    convert("dspark", &q, &sp, "speculators", &[]);
    convert("dspark", &sp, &v, "vllm", &[]);
    let qc = config(&q)["quantization_config"].clone();
    assert!(qc.is_object());
    let c = config(&sp);
    assert_eq!(c["quantization_config"], qc);
    assert_eq!(c["transformer_layer_config"]["quantization_config"], qc);
    assert_eq!(config(&v)["quantization_config"], qc);
    for dir in [&sp, &v] {
        assert_same_tensors(&q, dir, "quantized");
        assert_eq!(inspect_json(dir)["quantization"]["quantized"], true);
    }
}

/// A `K3DSparkModel` config on the fixture's tensors (what detection and convert read: the
/// MLA checks are vLLM's, at load).
fn k3_draft(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(
        fix("dspark/model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    let mut c = config(&fix("dspark"));
    c["architectures"] = json!(["K3DSparkModel"]);
    c["model_type"] = json!("k3_dspark");
    c["q_lora_rank"] = json!(64);
    c["target_layer_ids"] = json!([0, 2]);
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
}

/// Inferact's MLA DSpark goes to vLLM, with `num_target_layers` counting the taps.
#[test]
fn k3_dspark_goes_to_vllm_only() {
    let t = tempfile::tempdir().unwrap();
    let k3 = t.path().join("k3");
    k3_draft(&k3);
    assert_eq!(described(&k3)["layout"], "k3-dspark");
    let out = t.path().join("out");
    let err = convert("dspark", &k3, &out, "vllm", &[]);
    assert!(err.contains("`num_target_layers` 4 written as 2"), "{err}");
    assert!(err.contains("\"method\":\"dspark\""), "{err}");
    let c = config(&out);
    assert_eq!(c["num_target_layers"], 2);
    assert_eq!(c["architectures"], json!(["K3DSparkModel"]));
    assert_eq!(described(&out), described(&k3));
    assert_same_tensors(&k3, &out, "k3");
    let e = refused("dspark", &k3, "sglang", &[]);
    assert!(
        e.contains("SGLang 0.5.23 does not load") && e.contains("--to vllm"),
        "{e}"
    );
    for to in ["specforge", "speculators"] {
        let e = refused("dspark", &k3, to, &[]);
        assert!(e.contains("MLA"), "{to}: {e}");
    }
}

#[test]
fn what_no_engine_loads_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let mla = t.path().join("mla");
    std::fs::create_dir(&mla).unwrap();
    std::fs::copy(
        fix("dflash2/model.safetensors"),
        mla.join("model.safetensors"),
    )
    .unwrap();
    let mut c = config(&fix("dflash2"));
    c["dflash_config"]["attention_mode"] = json!("mla");
    std::fs::write(mla.join("config.json"), c.to_string()).unwrap();
    for to in ["vllm", "sglang"] {
        let e = refused("dflash2", &mla, to, &[]);
        assert!(e.contains("neither vLLM 0.33 nor SGLang 0.5.23"), "{e}");
    }
    let e = refused("dspark", &fix("dspark"), "trtllm", &[]);
    assert!(
        e.contains("takes --to vllm, sglang, specforge, speculators"),
        "{e}"
    );
    let e = refused("dflash2", &fix("dflash2"), "speculators", &[]);
    assert!(e.contains("takes --to vllm, sglang"), "{e}");
    let e = refused("dspark", &fix("dflash2"), "vllm", &[]);
    assert!(
        e.contains("is a DFlash2 draft") && e.contains("convert dflash2"),
        "{e}"
    );
    let e = refused("dspark", &fix("eagle3"), "vllm", &[]);
    assert!(e.contains("not a DSpark draft"), "{e}");
    let e = refused("dflash", &fix("dspark"), "vllm", &[]);
    assert!(
        e.contains("is a DSpark draft") && e.contains("convert dspark"),
        "{e}"
    );
    let e = refused("dspark", &fix("dspark"), "vllm", &["--from", "speculators"]);
    assert!(e.contains("leave --from out"), "{e}");
    let e = refused("eagle3", &fix("dflash2"), "speculators", &[]);
    assert!(e.contains("is a DFlash2 draft"), "{e}");
}

/// tests/engines/launch_2026.py under one engine: every case must pass, and there must be
/// cases (the script prints one JSON line per case).
fn launch_lines_in(engine: &str, python: PathBuf) {
    let work = tempfile::tempdir().unwrap();
    let o = Command::new(python)
        .current_dir(root())
        .args([
            "tests/engines/launch_2026.py",
            "--engine",
            engine,
            "--kquant",
        ])
        .arg(env!("CARGO_BIN_EXE_kquant"))
        .arg("--work")
        .arg(work.path())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let verdicts: Vec<Value> = out
        .lines()
        .filter(|l| l.starts_with("{\"case\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        verdicts.len() >= 3,
        "{engine}: {out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for v in &verdicts {
        assert_eq!(v["ok"], true, "{engine}: {v}");
    }
    assert_eq!(o.status.code(), Some(0), "{engine}: {out}");
}

/// The printed vLLM launch lines through vLLM 0.33's own `vllm serve` parser, `EngineArgs` and
/// `SpeculativeConfig` (`-- --include-ignored` with the vLLM venv; without it this fails).
#[test]
#[ignore = "needs the vLLM 0.33.0 engine venv (KQUANT_VLLM_PYTHON)"]
fn vllm_takes_the_launch_lines() {
    launch_lines_in(
        "vllm",
        common::engine_python("KQUANT_VLLM_PYTHON", "vllm-0.33.0"),
    );
}

/// The printed SGLang launch lines through SGLang 0.5.23's `ServerArgs` resolution (DSPARK's
/// and DFLASH's hooks) and draft-config parsers.
#[test]
#[ignore = "needs the SGLang 0.5.23 engine venv (KQUANT_SGLANG_PYTHON)"]
fn sglang_takes_the_launch_lines() {
    launch_lines_in(
        "sglang",
        common::engine_python("KQUANT_SGLANG_PYTHON", "sglang-0.5.23"),
    );
}
