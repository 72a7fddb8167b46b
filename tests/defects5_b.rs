//! Defects round 5 (b): the Kimi-K3 target's config and weights as `trace capture` loads them,
//! and the tap streams (docs/verify.md, "Tap streams"): a trace whose recorded stream its target
//! cannot have, a trace whose target contradicts itself, stream flags a target cannot have,
//! `--baseline-stream` for prompt lookup, taps beyond the target's depth, and K3 configs whose
//! values of the wrong type, or whose switched-off parts the weights still hold, were read as
//! something else. Each test failed before its fix.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::{self, kquant, root};

const K3_TRACE: &str = "fixtures/kimi-k3-tiny/trace";
const K3_MIX_TRACE: &str = "fixtures/kimi-k3-tiny/trace-mixture";
const K3_TARGET: &str = "fixtures/kimi-k3-tiny/target";
const K3_DSPARK: &str = "fixtures/kimi-k3-tiny/dspark";
const K25_TRACE: &str = "fixtures/kimi-k2.5-tiny/trace";
const K25_TARGET: &str = "fixtures/kimi-k2.5-tiny/target";
const K25_EAGLE3: &str = "fixtures/kimi-k2.5-tiny/eagle3";

/// A copy of the trace `src` under `dir/name` with its manifest edited by `edit`.
fn edited(dir: &Path, name: &str, src: &str, edit: impl Fn(&mut Value)) -> PathBuf {
    let out = dir.join(name);
    std::fs::create_dir(&out).unwrap();
    for e in std::fs::read_dir(root().join(src)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), out.join(e.file_name())).unwrap();
    }
    let mut m = common::read_json(&out.join("manifest.json"));
    edit(&mut m);
    std::fs::write(out.join("manifest.json"), m.to_string()).unwrap();
    out
}

/// `kquant args…`: the exit code and stderr.
fn run(args: &[&str]) -> (Option<i32>, String) {
    let o = kquant(args);
    (o.status.code(), common::stderr(&o))
}

/// `verify` of `draft` on `trace` (one sample a category) with `extra`.
fn verify(draft: &str, trace: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let t = trace.to_str().unwrap();
    let mut args = vec![
        "verify",
        "--draft",
        draft,
        "--trace",
        t,
        "--per-category",
        "1",
    ];
    args.extend(extra);
    run(&args)
}

fn refused(got: (Option<i32>, String), wants: &[&str]) {
    let (code, err) = got;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("error:") && err.contains("hint:"), "{err}");
    for w in wants {
        assert!(err.contains(w), "{w} in {err}");
    }
}

/// A trace that records a stream its target cannot have was replayed: a K2.5 trace edited to
/// `mixture` passed with `--target-checkpoint` (a note only) and with `--target …
/// --allow-stream-mismatch`; a K3 trace edited to `residual` passed with the K3 checkpoint,
/// its draft's stream "residual: the target has no attention residuals". Now each is refused,
/// naming what says what the target is.
#[test]
fn a_recorded_stream_the_target_cannot_have_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let k25 = edited(d.path(), "k25", K25_TRACE, |m| {
        m["tap_stream"] = "mixture".into()
    });
    let k3 = edited(d.path(), "k3", K3_TRACE, |m| {
        m["tap_stream"] = "residual".into()
    });
    let mix = "records tap_stream `mixture`, a stream of a target with attention residuals";
    let res = "records tap_stream `residual`, a stream of a target without attention residuals, but its target has them";
    let allow = "--allow-stream-mismatch";
    for (draft, trace, ck, profile, want) in [
        (K25_EAGLE3, &k25, K25_TARGET, "kimi-k2.5-tiny", mix),
        (K3_DSPARK, &k3, K3_TARGET, "kimi-k3-tiny", res),
    ] {
        let named = format!("target checkpoint `{ck}`");
        refused(
            verify(draft, trace, &["--target-checkpoint", ck]),
            &[want, &named],
        );
        let named = format!("profile `{profile}` (--target)");
        refused(
            verify(draft, trace, &["--target", profile, allow]),
            &[want, &named],
        );
    }
    // The fixtures as they are still verify.
    let (code, err) = verify(
        K3_DSPARK,
        &root().join(K3_TRACE),
        &["--target", "kimi-k3-tiny"],
    );
    assert_eq!(code, Some(0), "{err}");
}

/// A trace whose manifest names a K3 architecture, verified against a profile without
/// attention residuals (or merged), was read by whichever said less; a K3 trace without the
/// key and of a shape no profile has was implied `residual` even beside a K3 checkpoint.
#[test]
fn a_target_that_contradicts_itself_is_refused_and_a_k3_checkpoint_makes_the_stream_unknown() {
    let d = tempfile::tempdir().unwrap();
    let arch = |m: &mut Value| {
        m["target"]["architecture"] = "KimiK3ForConditionalGeneration".into();
    };
    let k25 = edited(d.path(), "k25", K25_TRACE, arch);
    refused(
        verify(K25_EAGLE3, &k25, &["--target", "kimi-k2.5-tiny"]),
        &[
            "the trace's target has attention residuals according to the manifest's target.architecture `KimiK3ForConditionalGeneration`",
            "none according to profile `kimi-k2.5-tiny` (--target)",
        ],
    );
    // Two captures of one target, both edited to `residual` with the K3 architecture: the merge
    // recorded `residual` for them.
    let both = |m: &mut Value| {
        arch(m);
        m["tap_stream"] = "residual".into();
    };
    let (a, b) = (
        edited(d.path(), "a", K3_TRACE, both),
        edited(d.path(), "b", K3_MIX_TRACE, both),
    );
    let out = d.path().join("merged");
    let (a, b, o) = (
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        out.to_str().unwrap(),
    );
    refused(
        run(&["trace", "merge", a, b, "-o", o]),
        &["records tap_stream `residual`", "target.architecture"],
    );
    assert!(!out.exists());
    // No key, no name or shape a profile has: the K3 checkpoint says the stream is unknown.
    let unnamed = edited(d.path(), "unnamed", K3_TRACE, |m| {
        m.as_object_mut().unwrap().remove("tap_stream");
        m["target"]["name"] = "my-k3".into();
        m["num_layers"] = 9.into();
    });
    let o = kquant(&[
        "verify",
        "--draft",
        K3_DSPARK,
        "--trace",
        unnamed.to_str().unwrap(),
        "--target-checkpoint",
        K3_TARGET,
        "--per-category",
        "1",
        "--json",
        "-",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        r["tap_stream"]["trace_known"], "unknown",
        "{}",
        r["tap_stream"]
    );
    assert!(r["tap_stream"]["notes"][0]
        .as_str()
        .unwrap()
        .contains("cannot be checked"));
}

/// `--draft-stream` naming a stream the target does not have was taken as a mismatch (its hint
/// suggested capturing that stream, which capture refuses) and, with `--allow-stream-mismatch`,
/// replayed and passed; `--baseline-stream` beside the prompt-lookup baseline was ignored.
#[test]
fn stream_flags_the_target_cannot_have_are_refused() {
    let (k3, k25) = (root().join(K3_TRACE), root().join(K25_TRACE));
    let cases = [
        (
            K3_DSPARK,
            &k3,
            "kimi-k3-tiny",
            "--draft-stream",
            "residual",
            "--allow-stream-mismatch",
            "--draft-stream residual: target `kimi-k3-tiny` has attention residuals",
        ),
        (
            K25_EAGLE3,
            &k25,
            "kimi-k2.5-tiny",
            "--draft-stream",
            "partial",
            "--allow-stream-mismatch",
            "--draft-stream partial: target `kimi-k2.5-tiny` has no attention residuals",
        ),
        (
            K25_EAGLE3,
            &k25,
            "kimi-k2.5-tiny",
            "--baseline-stream",
            "residual",
            "--baseline=prompt-lookup",
            "--baseline-stream residual with --baseline prompt-lookup",
        ),
    ];
    for (draft, trace, profile, flag, stream, other, want) in cases {
        refused(
            verify(draft, trace, &["--target", profile, flag, stream, other]),
            &[want],
        );
    }
}

/// A manifest whose taps lie beyond its own `num_layers` was read (and verified).
#[test]
fn taps_beyond_the_targets_depth_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let t = edited(d.path(), "deep", K3_TRACE, |m| m["num_layers"] = 6.into());
    refused(
        verify(K3_DSPARK, &t, &["--target-checkpoint", K3_TARGET]),
        &["tap 7 is beyond the target's depth: num_layers is 6"],
    );
}

/// K3 configs the runtime read as another model: a flag that is not a boolean read as false, a
/// negative `rms_norm_eps` (NaN logits, blamed on the weights), and a switched-off MLA output
/// gate or latent norm whose tensors the checkpoint holds (silently left out).
#[test]
fn k3_configs_of_the_wrong_type_or_that_the_weights_contradict_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let src = root().join("fixtures/kimi-k3-tiny/target-random");
    let prompts = d.path().join("p.jsonl");
    std::fs::write(
        &prompts,
        "{\"id\": 0, \"category\": \"c\", \"tokens\": [3, 8, 13, 18]}\n",
    )
    .unwrap();
    let cases: [(&str, Value, &str); 6] = [
        ("latent_moe_use_norm", "yes".into(), "`latent_moe_use_norm` is \"yes\": true or false"),
        ("mla_use_output_gate", 1.into(), "`mla_use_output_gate` is 1: true or false"),
        ("rms_norm_eps", (-1.0).into(), "`rms_norm_eps` is -1.0: a number ≥ 0"),
        (
            "mla_use_output_gate",
            false.into(),
            "has tensor `language_model.layers.2.self_attn.g_proj.weight`, but config.json's `mla_use_output_gate` is false",
        ),
        // A wrong shape named no remedy (K3's hint names the config that came with the weights).
        (
            "hidden_size",
            128.into(),
            "tensor `language_model.model.embed_tokens.weight`: shape [2048, 64], expected [2048, 128]",
        ),
        (
            "latent_moe_use_norm",
            false.into(),
            "block_sparse_moe.routed_expert_norm.weight`, but config.json's `latent_moe_use_norm` is false",
        ),
    ];
    for (i, (key, value, want)) in cases.into_iter().enumerate() {
        let ck = d.path().join(format!("t{i}"));
        std::fs::create_dir(&ck).unwrap();
        std::fs::copy(src.join("model.safetensors"), ck.join("model.safetensors")).unwrap();
        let mut cfg = common::read_json(&src.join("config.json"));
        cfg["text_config"][key] = value;
        std::fs::write(ck.join("config.json"), cfg.to_string()).unwrap();
        let out = d.path().join(format!("o{i}"));
        refused(
            run(&[
                "trace",
                "capture",
                "--target-checkpoint",
                ck.to_str().unwrap(),
                "--prompts",
                prompts.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
                "--gen-len",
                "2",
            ]),
            &[want],
        );
        assert!(!out.exists(), "{key}");
    }
}

/// `inspect` of a K3 checkpoint whose config has no `attn_res_block_size` listed the engines'
/// `partial`/`mixture` taps, though vLLM builds such a model without attention residuals and
/// taps its one residual stream (`use_attn_res = attn_res_block_size is not None`).
#[test]
fn inspect_lists_k3_tap_streams_only_for_a_config_with_attention_residuals() {
    let d = tempfile::tempdir().unwrap();
    let src = root().join("fixtures/kimi-k3-tiny/target-random");
    assert!(common::inspect_json(&src).get("drafting").is_some());
    let ck = d.path().join("no-attn-res");
    std::fs::create_dir(&ck).unwrap();
    std::fs::copy(src.join("model.safetensors"), ck.join("model.safetensors")).unwrap();
    let mut cfg = common::read_json(&src.join("config.json"));
    cfg["text_config"]["attn_res_block_size"] = Value::Null;
    std::fs::write(ck.join("config.json"), cfg.to_string()).unwrap();
    let doc = common::inspect_json(&ck);
    assert_eq!(doc["target_kind"], "kimi-k3", "{doc}");
    assert!(doc.get("drafting").is_none(), "{}", doc["drafting"]);
}

/// A live verify on the K3 profile with `--draft-stream residual` (the capture's stream taken
/// from it) was refused as `--stream residual`, a flag the user did not give.
#[test]
fn a_live_capture_refusal_names_the_flag_given() {
    let (code, err) = run(&[
        "verify",
        "--target",
        "kimi-k3-tiny",
        "--draft",
        K3_DSPARK,
        "--draft-stream",
        "residual",
        "--per-category",
        "1",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(
            "error: --draft-stream residual: target `kimi-k3-tiny` has attention residuals"
        ),
        "{err}"
    );
}

/// `bench replay` of a K3 draft whose target shape no built-in profile has: with the K3
/// `--target-checkpoint` given, `--stream mixture` was refused ("no attention residuals") and the
/// synthetic trace recorded `residual`; the checkpoint now says what the target has.
#[test]
fn a_synthetic_trace_takes_the_target_checkpoints_attention_residuals() {
    let d = tempfile::tempdir().unwrap();
    let draft = d.path().join("dspark-9");
    std::fs::create_dir(&draft).unwrap();
    let src = root().join(K3_DSPARK);
    std::fs::copy(
        src.join("model.safetensors"),
        draft.join("model.safetensors"),
    )
    .unwrap();
    let mut cfg = common::read_json(&src.join("config.json"));
    cfg["target_num_hidden_layers"] = 9.into();
    std::fs::write(draft.join("config.json"), cfg.to_string()).unwrap();
    for (stream, want) in [(None, "partial"), (Some("mixture"), "mixture")] {
        let out = d.path().join(want);
        let mut args = vec![
            "bench",
            "replay",
            draft.to_str().unwrap(),
            "--target-checkpoint",
            K3_TARGET,
            "--synthetic-trace",
            "32",
            "--write-trace",
            out.to_str().unwrap(),
        ];
        args.extend(stream.map(|s| ["--stream", s]).iter().flatten());
        let (code, err) = run(&args);
        assert_eq!(code, Some(0), "{err}");
        let m = common::read_json(&out.join("manifest.json"));
        assert_eq!(m["tap_stream"], want);
    }
}

/// `capture.json` beside a connector's files and a trace's `manifest.json` were read with no
/// bound: a FIFO (no writer) hung the import or the verify for ever, a link to /dev/zero read
/// until memory ran out. Both are regular files of a bounded size now, or an error at once.
#[cfg(unix)]
#[test]
fn a_capture_json_or_a_manifest_that_is_no_regular_file_is_refused_at_once() {
    let d = tempfile::tempdir().unwrap();
    let (conn, trace) = (d.path().join("conn"), d.path().join("trace"));
    for (dir, name) in [(&conn, "capture.json"), (&trace, "manifest.json")] {
        std::fs::create_dir(dir).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(dir.join(name))
            .status()
            .unwrap();
        assert!(made.success());
    }
    let out = d.path().join("out");
    let (c, t, o) = (
        conn.to_str().unwrap(),
        trace.to_str().unwrap(),
        out.to_str().unwrap(),
    );
    let import = [
        "trace",
        "import",
        "--format",
        "vllm-hidden-states",
        c,
        "-o",
        o,
        "--num-layers",
        "4",
        "--layer-ids",
        "1,2",
    ];
    let verify = ["verify", "--draft", K25_EAGLE3, "--trace", t];
    for (args, what) in [
        (&import[..], "a capture.json"),
        (&verify[..], "a trace manifest"),
    ] {
        let mut child = common::kquant_cmd()
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let start = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed().as_secs() > 60 {
                child.kill().unwrap();
                panic!("{what}: still reading a FIFO after 60 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let o = child.wait_with_output().unwrap();
        let err = common::stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        let want = format!("is not a regular file ({what} is read whole");
        assert!(err.contains(&want) && err.contains("hint:"), "{err}");
    }
    assert!(!out.exists());
}
