//! Defects round 5 (c): the synthetic-acceptance rates, the degenerate-output check, scheme
//! `fp8-pt`, and the engines' claims about drafts beside their targets. Each test failed before
//! its fix.

use crate::common;

use std::path::Path;

use common::{kquant, read_json, root};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const FIX: &str = "fixtures/kimi-k2.5-tiny";

/// A copy of the trace at `src` in `out` with every sample cut to `gen` generated tokens (its
/// tokens, taps and target top-1 rows), the shard's SHA-256 written back to the manifest.
fn shortened(src: &Path, out: &Path, gen: u64) {
    let mut man = read_json(&src.join("manifest.json"));
    assert_eq!(man["shards"].as_array().unwrap().len(), 1, "one shard");
    let file = man["shards"][0]["file"].as_str().unwrap().to_string();
    let mut t = common::load(&src.join(&file));
    for s in man["samples"].as_array_mut().unwrap() {
        let rows = s["prompt_len"].as_u64().unwrap() + gen;
        let prefix = format!("s{}.", s["id"]);
        for (name, (_, shape, data)) in t.iter_mut() {
            if name.starts_with(&prefix) {
                let row = data.len() / shape[0] as usize;
                data.truncate(row * rows as usize);
                shape[0] = rows;
            }
        }
        s["gen_len"] = gen.into();
    }
    let (mut header, mut bytes) = (serde_json::Map::new(), Vec::new());
    for (name, (dtype, shape, data)) in &t {
        let start = bytes.len();
        bytes.extend_from_slice(data);
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [start, bytes.len()]}),
        );
    }
    std::fs::create_dir_all(out).unwrap();
    let shard = out.join(&file);
    common::write_safetensors(&shard, &serde_json::to_vec(&header).unwrap(), bytes);
    let sha = format!("{:x}", Sha256::digest(std::fs::read(&shard).unwrap()));
    man["shards"][0]["sha256"] = sha.into();
    std::fs::write(out.join("manifest.json"), man.to_string()).unwrap();
}

/// `verify` of the tiny EAGLE-3 on `trace` with `extra`.
fn verify(trace: &Path, extra: &[&str]) -> std::process::Output {
    let (d, c) = (format!("{FIX}/eagle3"), format!("{FIX}/target"));
    let t = trace.to_str().unwrap();
    let base = [
        "verify",
        "--draft",
        &d,
        "--trace",
        t,
        "--target-checkpoint",
        &c,
    ];
    kquant(&[&base[..], extra].concat())
}

/// Samples of 3 generated tokens compare depth 2 nowhere: no "depth 2 accepted 0" (it was
/// raised, and `--fail-on-degenerate` refused the run with exit 2); depths 0 and 1 are judged
/// as before, out of the positions that compared them.
#[test]
fn a_depth_short_samples_never_reach_is_not_degenerate() {
    let t = tempfile::tempdir().unwrap();
    let trace = t.path().join("short");
    shortened(&root().join(FIX).join("trace"), &trace, 3);
    let o = verify(&trace, &["--fail-on-degenerate", "--json", "-"]);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let d = &r["degenerate"];
    assert_eq!(d["flagged"], false, "{d}");
    assert_eq!(d["findings"], json!([]), "{d}");
}

/// SGLang 0.5.23 refuses a `K3DSparkModel` draft (its `engines` row: no), so the `target` row
/// names no stream SGLang hands it; every engine the row names loads the draft's layout.
#[test]
fn a_k3_dspark_drafts_target_row_names_no_engine_that_refuses_it() {
    let d = root().join("fixtures/kimi-k3-tiny/dspark");
    let j = common::inspect_json(&d);
    let refused: Vec<&str> = j["engines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["verdict"] == "no")
        .map(|e| e["engine"].as_str().unwrap())
        .collect();
    assert!(refused.contains(&"sglang"), "{}", j["engines"]);
    let streams: Vec<&str> = j["draft_target"]["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["engine"].as_str().unwrap())
        .collect();
    assert_eq!(streams, ["vllm", "trtllm"], "{}", j["draft_target"]);
    assert!(streams.iter().all(|e| !refused.contains(e)));
    let o = kquant(&["inspect", d.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("            vllm   hands it the partial stream"),
        "{text}"
    );
    assert!(!text.contains("sglang hands it"), "{text}");
}

/// `fp8-pt` with an `--input-amax` file that lacks a quantized module: the hint names fp8-pt's
/// own way out (`--fixed-input-amax`), not NVFP4's weight-only scheme.
#[test]
fn fp8_pt_missing_amax_hint_names_the_fixed_amax() {
    let t = tempfile::tempdir().unwrap();
    let amax = t.path().join("amax.json");
    std::fs::write(&amax, r#"{"fc": 3.5}"#).unwrap();
    let out = t.path().join("out");
    let src = root().join(FIX).join("eagle3");
    let o = fp8_pt(&src, &out, &amax);
    assert_eq!(o.status.code(), Some(2));
    let e = common::stderr(&o);
    assert!(
        e.contains("error: ") && e.contains("has no input amax for 7 quantized module(s)"),
        "{e}"
    );
    assert!(
        e.contains("hint: ") && e.contains("--fixed-input-amax"),
        "{e}"
    );
    assert!(!e.contains("nvfp4-a16"), "{e}");
    assert!(!out.exists());
}

/// The synthetic rates count a round as the engine does: a request's final round before its
/// cut at the stop. Where the trace holds tokens past every stop (`stop_len`), every round is
/// judged and 1 + Σ rates is the engine's accept length (they were the committed drafts, the
/// gated accept length, which the cut lowers).
#[test]
fn synthetic_rates_count_the_final_round_as_the_engine_does() {
    let t = tempfile::tempdir().unwrap();
    let trace = t.path().join("lookahead");
    let src = root().join(FIX).join("trace");
    std::fs::create_dir_all(&trace).unwrap();
    let mut man = read_json(&src.join("manifest.json"));
    for s in man["samples"].as_array_mut().unwrap() {
        let total = s["prompt_len"].as_u64().unwrap() + s["gen_len"].as_u64().unwrap();
        s["stop_len"] = (total - 10).into();
    }
    std::fs::write(trace.join("manifest.json"), man.to_string()).unwrap();
    let shard = man["shards"][0]["file"].as_str().unwrap();
    std::fs::copy(src.join(shard), trace.join(shard)).unwrap();
    let o = verify(&trace, &["--json", "-"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let engine = r["draft"]["accept_length_engine"].as_f64().unwrap();
    let gated = r["draft"]["accept_length"].as_f64().unwrap();
    let syn = &r["synthetic_acceptance"]["overall"];
    let al = syn["accept_length"].as_f64().unwrap();
    let sum: f64 = syn["rates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .sum();
    assert!((al - (1.0 + sum)).abs() < 1e-9, "{syn}");
    assert!((al - engine).abs() <= 3.0 * 5e-5, "{al} vs engine {engine}");
    assert!(
        engine - gated > 1e-3,
        "the cut lowers the gated {gated} below {engine}"
    );
}

/// Samples that end within their verify rounds never judge the later drafts: the rates are
/// not measured (they were all 0, a draft that accepts nothing, handed to vLLM).
#[test]
fn synthetic_rates_of_samples_shorter_than_a_round_are_not_measured() {
    let t = tempfile::tempdir().unwrap();
    let trace = t.path().join("short");
    shortened(&root().join(FIX).join("trace"), &trace, 2);
    let o = verify(&trace, &["--json", "-"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let syn = &r["synthetic_acceptance"];
    assert!(syn["overall"].is_null(), "{syn}");
    assert!(
        syn["per_category"]
            .as_object()
            .unwrap()
            .values()
            .all(Value::is_null),
        "{syn}"
    );
    let o = verify(&trace, &["--synthetic-rates"]);
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("synthetic acceptance, overall: not measured (no per-step histogram, or no verify round judged every draft position"),
        "{table}"
    );
    assert!(
        !table.contains("\"synthetic_acceptance_rates\":[0.0"),
        "{table}"
    );
}

/// Beside a Kimi-Linear target every draft family meets what the engines' sources say, not
/// only DFlash: SGLang's KimiLinearForCausalLM has no EAGLE-3 capture (`convert` said nothing),
/// and vLLM runs EAGLE-3 through the same capture DFlash needs (from a build).
#[test]
fn an_eagle3_draft_beside_kimi_linear_is_warned_for_sglang_and_vllm() {
    let t = tempfile::tempdir().unwrap();
    let src = root().join(FIX).join("eagle3");
    let target = root().join("fixtures/kimi-linear-tiny/target");
    for (to, says) in [
        (
            "sglang",
            "warning: SGLang does not serve a eagle3 draft beside a KimiLinearForCausalLM target",
        ),
        ("vllm", "KimiLinearForCausalLM"),
    ] {
        let out = t.path().join(to);
        let o = kquant(&[
            "convert",
            "eagle3",
            src.to_str().unwrap(),
            "--to",
            to,
            "-o",
            out.to_str().unwrap(),
            "--target-checkpoint",
            target.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", common::stderr(&o));
        let e = common::stderr(&o);
        assert!(e.contains(says), "{to}: {e}");
    }
}

/// `--json FILE --junit FILE` on one file: refused before the run (it wrote the JSON, then
/// refused the JUnit as "not an output kquant wrote", exit 2 after the whole replay).
#[test]
fn json_and_junit_on_one_file_are_refused_before_the_run() {
    let t = tempfile::tempdir().unwrap();
    let one = t.path().join("report");
    let dotted = t.path().join(".").join("report");
    let o = verify(
        &root().join(FIX).join("trace"),
        &[
            "--json",
            one.to_str().unwrap(),
            "--junit",
            dotted.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    let e = common::stderr(&o);
    assert!(
        e.contains("error: --json and --junit name the same file"),
        "{e}"
    );
    assert!(e.contains("hint: "), "{e}");
    assert!(!one.exists(), "nothing written");
    assert!(o.stdout.is_empty(), "refused before the run");
}

/// SGLang forces `speculative_num_steps` to 1 for its block drafters and drafts
/// `speculative_num_draft_tokens` − 1 a step (`_handle_dflash`, `_handle_dspark`): K is that.
/// With K taken as 1, every request that accepted more than one draft a step was failed as
/// contradictory (and the synthetic rates had one position, the near-K+1 check a bound of 1.9).
#[test]
fn a_live_sglang_dflash_server_drafts_block_size_minus_one_a_step() {
    use crate::common::engines_http::{serve, Request, Response};
    use crate::live_endpoint::{live, max_tokens, models, prompts};
    let server = serve(|r: &Request| match (r.method.as_str(), r.path.as_str()) {
        ("GET", "/v1/models") => models("sglang"),
        ("GET", "/server_info") => Response::json(&json!({"version": "0.5.23",
            "model_path": "kimi-k2.5-tiny", "speculative_algorithm": "DFLASH",
            "speculative_draft_model_path": "dflash", "speculative_num_steps": 1,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 8,
            "speculative_adaptive": false})),
        ("POST", "/generate") => {
            // 40 tokens: the prefill's, 7 steps of 4 drafts + bonus, one of 3 + bonus.
            assert_eq!(max_tokens(&r.json()), 40);
            let ids: Vec<u32> = (1000..1040).collect();
            Response::json(&json!({"text": "x", "output_ids": ids, "meta_info": {
                "id": "1", "finish_reason": {"type": "length", "length": 40},
                "prompt_tokens": 20, "completion_tokens": 40, "cached_tokens": 0,
                "spec_verify_ct": 8, "spec_num_correct_drafts": 31,
                "spec_num_proposed_drafts": 56, "spec_accept_length": 5.0,
                "spec_correct_drafts_histogram": [0, 0, 0, 1, 7, 0, 0, 0]}}))
        }
        _ => Response::status(404, r#"{"detail":"Not Found"}"#),
    });
    let t = tempfile::tempdir().unwrap();
    let p = prompts(t.path(), 2);
    let (code, r, err) = live(&server.url, &p, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["draft"]["rounds"], json!(48), "{r}");
    let syn = &r["synthetic_acceptance"];
    assert_eq!(syn["num_speculative_tokens"], 7, "{syn}");
    assert_eq!(
        syn["overall"]["vllm_speculative_config"]["num_speculative_tokens"],
        7
    );
    assert_eq!(
        syn["overall"]["rates"],
        json!([1.0, 1.0, 1.0, 0.875, 0.0, 0.0, 0.0])
    );
    assert_eq!(
        r["degenerate"]["findings"],
        json!([]),
        "{}",
        r["degenerate"]
    );
}

/// Files a verb reads whole beside a checkpoint or from a flag (`--input-amax`, a checkpoint's
/// `config.json`) are read only as bounded regular files: a FIFO with no writer or a link to
/// `/dev/zero` is refused at once (exit 2), never an endless read or a hang.
#[test]
fn an_input_amax_or_config_that_is_no_regular_file_is_refused_at_once() {
    let t = tempfile::tempdir().unwrap();
    let src = root().join(FIX).join("eagle3");
    let fifo = t.path().join("amax.json");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let zero = t.path().join("zero.json");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    for f in [&fifo, &zero] {
        let out = t.path().join("out");
        let o = fp8_pt(&src, &out, f);
        let e = common::stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{e}");
        assert!(
            e.contains("is not a regular file") && e.contains("hint: "),
            "{e}"
        );
        assert!(!out.exists());
    }
    // A checkpoint's config.json that is a FIFO: not "no config.json", and no hang.
    let ck = t.path().join("ck");
    std::fs::create_dir(&ck).unwrap();
    std::fs::copy(src.join("model.safetensors"), ck.join("model.safetensors")).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(ck.join("config.json"))
        .status()
        .unwrap();
    assert!(made.success());
    let o = kquant(&["inspect", ck.to_str().unwrap()]);
    let e = common::stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("config.json`: is not a regular file"), "{e}");
}

/// `kquant quantize SRC -o OUT --scheme fp8-pt --format modelopt --input-amax AMAX`.
fn fp8_pt(
    src: &std::path::Path,
    out: &std::path::Path,
    amax: &std::path::Path,
) -> std::process::Output {
    let s = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let (src, out, amax) = (s(src), s(out), s(amax));
    kquant(&[
        "quantize",
        &src,
        "-o",
        &out,
        "--scheme",
        "fp8-pt",
        "--format",
        "modelopt",
        "--input-amax",
        &amax,
    ])
}
