//! The two tap streams of an attention-residual target (#41 item 3; docs/verify.md, "Tap
//! streams"): `trace capture --stream` on the random Kimi-K3 target gives the CPU runtime's own
//! `partial` and `mixture` rows (which differ) and records which in the manifest
//! (`tap_stream`); an unknown value is refused, an absent one is read as before; `trace merge`
//! refuses two streams; `verify` refuses a draft trained on the other stream (or measures it
//! with `--allow-stream-mismatch`), and says when a stream is not known.
//!
//! The draft: the tiny vLLM-layout EAGLE-3 (hidden 64, taps hs[2], hs[4], hs[5]) with its
//! target vocabulary widened to the K3 target's 2048 (`t2d` padded with `false`), built in the
//! test; it runs with the K3 target's embedding.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use crate::common::{self, kquant, root};
use kquant::checkpoint::Checkpoint;
use kquant::runtime::deepseek::OpImpl;
use kquant::runtime::kimi_k3::KimiK3;
use kquant::target::stream::TapStream;
use kquant::trace::file::Trace;

const K3: &str = "fixtures/kimi-k3-tiny/target-random";
const K2: &str = "fixtures/tiny/target-kimi-k2";
const K25_TRACE: &str = "fixtures/kimi-k2.5-tiny/trace";

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        common::stderr(o),
    )
}

/// Prompts of token ids below 256 (three, or `n` from `first`).
fn prompts(dir: &Path, name: &str, first: u32) -> PathBuf {
    let p = dir.join(name);
    let body: String = (0..3)
        .map(|i| {
            let t: Vec<u32> = (0..5).map(|k| (first + 17 * i + 5 * k) % 250 + 3).collect();
            format!("{{\"id\": {i}, \"category\": \"c{i}\", \"tokens\": {t:?}}}\n")
        })
        .collect();
    std::fs::write(&p, body).unwrap();
    p
}

/// `trace capture` on the K3 target, f32 taps (exact), with `extra` flags; exit code required.
fn capture(prompts: &Path, out: &Path, extra: &[&str], code: i32) -> (String, String) {
    let mut args = vec![
        "trace",
        "capture",
        "--target-checkpoint",
        K3,
        "--prompts",
        prompts.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--gen-len",
        "4",
        "--tap-dtype",
        "f32",
    ];
    args.extend(extra);
    let o = kquant(&args);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(code), "{extra:?}\n{}\n{}", t.0, t.1);
    t
}

fn manifest(trace: &Path) -> Value {
    common::read_json(&trace.join("manifest.json"))
}

/// The EAGLE-3 draft for the K3 target (see the module doc).
fn k3_draft(dir: &Path) -> PathBuf {
    let src = root().join("fixtures/tiny/eagle3-vllm");
    let out = dir.join("eagle3-k3");
    std::fs::create_dir(&out).unwrap();
    let mut cfg = common::read_json(&src.join("config.json"));
    cfg["vocab_size"] = 2048.into();
    // vLLM's reading of its ids (id k is hs[k]), said as kquant's own outputs say it.
    cfg["kquant"] = serde_json::json!({"aux_layer_convention": "input-of-layer"});
    std::fs::write(out.join("config.json"), cfg.to_string()).unwrap();
    let mut t = common::load(&src.join("model.safetensors"));
    let t2d = t.get_mut("t2d").unwrap();
    t2d.1 = vec![2048];
    t2d.2.resize(2048, 0);
    let (mut header, mut data) = (serde_json::Map::new(), Vec::new());
    for (name, (dtype, shape, bytes)) in &t {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let header = serde_json::to_vec(&Value::Object(header)).unwrap();
    common::write_safetensors(&out.join("model.safetensors"), &header, data);
    out
}

/// `verify` of `draft` on `trace` with the K3 target's embedding, `--json -`; exit code required.
fn verify(draft: &Path, trace: &Path, extra: &[&str], code: i32) -> (String, String) {
    let mut args = vec![
        "verify",
        "--draft",
        draft.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
        "--target-checkpoint",
        K3,
    ];
    args.extend(extra);
    let o = kquant(&args);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(code), "{extra:?}\n{}\n{}", t.0, t.1);
    t
}

/// Each stream's capture holds the runtime's own rows of that stream (f32, exactly), the two
/// differ, the default is `partial` (said so), and the manifest and `--json` record it.
#[test]
fn capture_taps_the_k3_runtimes_own_streams_and_records_which() {
    let d = tempfile::tempdir().unwrap();
    let p = prompts(d.path(), "p.jsonl", 0);
    let (part, mix, dflt) = (
        d.path().join("part"),
        d.path().join("mix"),
        d.path().join("dflt"),
    );
    let (out, _) = capture(&p, &part, &["--stream", "partial"], 0);
    assert!(out.contains("(partial stream)"), "{out}");
    let (out, _) = capture(&p, &mix, &["--stream", "mixture", "--json"], 0);
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["tap_stream"], "mixture");
    let (out, _) = capture(&p, &dflt, &[], 0);
    assert!(out.contains("(partial stream: vLLM's default;"), "{out}");
    for (t, want) in [(&part, "partial"), (&mix, "mixture"), (&dflt, "partial")] {
        assert_eq!(manifest(t)["tap_stream"], want);
        assert_eq!(
            manifest(t)["target"]["architecture"],
            "KimiK3ForConditionalGeneration"
        );
    }
    let m = KimiK3::load(&Checkpoint::open(&root().join(K3).to_string_lossy()).unwrap()).unwrap();
    let (a, b) = (Trace::open(&part).unwrap(), Trace::open(&mix).unwrap());
    assert_eq!(a.manifest.tap_stream, Some(TapStream::Partial));
    assert_eq!(a.manifest.taps, vec![1, 2, 3, 4, 5]);
    let mut differ = 0;
    for (sa, sb) in a.manifest.samples.iter().zip(&b.manifest.samples) {
        let x = a.tokens(sa).unwrap();
        assert_eq!(
            x,
            b.tokens(sb).unwrap(),
            "one continuation, whichever stream is tapped"
        );
        let f = m.forward_taps(OpImpl::Fast, &x).unwrap();
        for &i in &a.manifest.taps {
            let (ra, rb) = (a.tap(sa, i).unwrap(), b.tap(sb, i).unwrap());
            assert_eq!(ra, f.taps.partial[i - 1], "partial hs[{i}]");
            assert_eq!(rb, f.taps.mixture[i - 1], "mixture hs[{i}]");
            differ += usize::from(ra != rb);
        }
        let c = Trace::open(&dflt).unwrap();
        assert_eq!(c.tap(sa, 3).unwrap(), a.tap(sa, 3).unwrap());
    }
    // Every tap but those where the mixture reads one source (none here: hs[1..] all mix).
    assert!(
        differ >= 3 * 4,
        "{differ} of 15 taps differ between the streams"
    );
}

/// `--stream` on a target without attention residuals, and `residual` on K3, are refused before
/// any work; a trace of an old kquant (no `tap_stream`) reads as it did and verifies as it did,
/// its stream implied `residual`; an unknown value is an error with a hint.
#[test]
fn streams_a_target_lacks_are_refused_and_old_or_bad_manifests_are_read_as_said() {
    let d = tempfile::tempdir().unwrap();
    let p = prompts(d.path(), "p.jsonl", 0);
    for (target, stream, want) in [
        (K2, "mixture", "has no attention residuals"),
        (K2, "partial", "has no attention residuals"),
        (K3, "residual", "has attention residuals"),
    ] {
        let out = d.path().join(format!("x-{stream}"));
        let o = kquant(&[
            "trace",
            "capture",
            "--target-checkpoint",
            target,
            "--prompts",
            p.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--stream",
            stream,
        ]);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(want) && err.contains("hint:"), "{err}");
        assert!(!out.exists());
    }
    // The bundled trace predates the key: opened unchanged, stream not recorded.
    let old = Trace::open(&root().join(K25_TRACE)).unwrap();
    assert_eq!(old.manifest.tap_stream, None);
    assert!(manifest(&root().join(K25_TRACE))
        .get("tap_stream")
        .is_none());
    // An unknown value, named.
    let bad = d.path().join("bad");
    copy_dir(&root().join(K25_TRACE), &bad);
    let mut m = manifest(&bad);
    m["tap_stream"] = "prefix".into();
    std::fs::write(bad.join("manifest.json"), m.to_string()).unwrap();
    let o = kquant(&[
        "verify",
        "--draft",
        "fixtures/kimi-k2.5-tiny/eagle3",
        "--trace",
        bad.to_str().unwrap(),
        "--target-checkpoint",
        "fixtures/kimi-k2.5-tiny/target",
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("tap_stream \"prefix\" is not a tap stream kquant knows"),
        "{err}"
    );
    assert!(err.contains("hint:"), "{err}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Two streams are not merged; one stream is, and the merge records it (an old trace's implied
/// `residual` too).
#[test]
fn merge_refuses_two_streams_and_records_one() {
    let d = tempfile::tempdir().unwrap();
    let (p, q) = (
        prompts(d.path(), "p.jsonl", 0),
        prompts(d.path(), "q.jsonl", 100),
    );
    let (a, b, c) = (d.path().join("a"), d.path().join("b"), d.path().join("c"));
    capture(&p, &a, &["--stream", "partial"], 0);
    capture(&q, &b, &["--stream", "mixture"], 0);
    capture(&q, &c, &["--stream", "partial"], 0);
    let out = d.path().join("m");
    let merge = |x: &Path, y: &Path| {
        kquant(&[
            "trace",
            "merge",
            x.to_str().unwrap(),
            y.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ])
    };
    let o = merge(&a, &b);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    for want in [
        "`mixture` (recorded)",
        "`partial` (recorded)",
        "hint:",
        "--stream",
    ] {
        assert!(err.contains(want), "{want} in {err}");
    }
    assert!(!out.exists());
    let o = merge(&a, &c);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    let (out_text, _) = text(&o);
    assert!(out_text.contains("(partial tap stream)"), "{out_text}");
    assert_eq!(manifest(&out)["tap_stream"], "partial");
}

/// A draft whose training stream is known and differs from the trace's is refused, naming
/// both and how to capture the right one; `--allow-stream-mismatch` measures it with a note;
/// the same stream passes silently; a stream not known on either side is a `note:` and a JSON
/// field.
#[test]
fn verify_refuses_a_draft_of_the_other_stream_and_notes_what_is_not_known() {
    let d = tempfile::tempdir().unwrap();
    let draft = k3_draft(d.path());
    let p = prompts(d.path(), "p.jsonl", 0);
    let part = d.path().join("part");
    capture(&p, &part, &["--stream", "partial"], 0);

    let (_, err) = verify(&draft, &part, &["--draft-stream", "mixture"], 2);
    for want in [
        "trained on the `mixture` tap stream (--draft-stream)",
        "holds the `partial` stream",
        "--stream mixture",
        "--allow-stream-mismatch",
    ] {
        assert!(err.contains(want), "{want} in {err}");
    }
    let (out, _) = verify(
        &draft,
        &part,
        &[
            "--draft-stream",
            "mixture",
            "--allow-stream-mismatch",
            "--json",
            "-",
        ],
        0,
    );
    let r: Value = serde_json::from_str(&out).unwrap();
    let ts = &r["tap_stream"];
    assert_eq!(
        (ts["trace"].as_str(), ts["trace_known"].as_str()),
        (Some("partial"), Some("recorded"))
    );
    assert_eq!(ts["draft"]["stream"], "mixture");
    assert_eq!(ts["mismatch_allowed"], true);
    assert!(
        ts["notes"][0].as_str().unwrap().contains("never saw"),
        "{ts}"
    );

    // The same stream: nothing to say.
    let (out, _) = verify(&draft, &part, &["--draft-stream", "partial"], 0);
    assert!(
        out.contains(
            "tap stream: trace `partial` (recorded); draft trained on `partial` (--draft-stream)"
        ),
        "{out}"
    );
    assert!(!out.contains("note: `"), "{out}");
    // The draft's stream not known: a note, and `null` in the JSON.
    let (out, _) = verify(&draft, &part, &[], 0);
    assert!(out.contains("draft trained on an unknown stream"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("note: `") && l.contains("training stream is not known")),
        "{out}"
    );
    let (out, _) = verify(&draft, &part, &["--json", "-"], 0);
    let r: Value = serde_json::from_str(&out).unwrap();
    assert!(
        r["tap_stream"]["draft"]["stream"].is_null(),
        "{}",
        r["tap_stream"]
    );
    // The trace's stream not known (a trace of K3 without the key): a note, whatever the draft's.
    let mut m = manifest(&part);
    m.as_object_mut().unwrap().remove("tap_stream");
    std::fs::write(part.join("manifest.json"), m.to_string()).unwrap();
    let (out, _) = verify(
        &draft,
        &part,
        &["--draft-stream", "mixture", "--json", "-"],
        0,
    );
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["tap_stream"]["trace_known"], "unknown");
    assert!(r["tap_stream"]["trace"].is_null());
    let notes = r["tap_stream"]["notes"].to_string();
    assert!(notes.contains("cannot be checked"), "{notes}");
}

/// The published-draft route: a profile whose `published_drafts` lists this draft (family and
/// taps) with its stream makes the stream known without a flag (and a mismatch refused).
#[test]
fn a_profiles_published_draft_gives_the_training_stream() {
    let d = tempfile::tempdir().unwrap();
    let draft = k3_draft(d.path());
    let p = prompts(d.path(), "p.jsonl", 0);
    let mix = d.path().join("mix");
    capture(&p, &mix, &["--stream", "mixture"], 0);
    let published = serde_json::json!([{
        "draft": "test/k3-random-eagle3", "family": "eagle3", "layout": "EAGLE-3 (vLLM names)",
        "config_ids": "eagle_aux_hidden_state_layer_ids [2,4,5]", "hs": [2, 4, 5],
        "stream": "partial", "status": "made in this test", "source": "tests/trace_stream.rs"
    }]);
    let pf = k3_like_profile(d.path(), "k3-random", (6, 64, 2048), published);
    let (_, err) = verify(&draft, &mix, &["--target", pf.to_str().unwrap()], 2);
    assert!(
        err.contains("published draft test/k3-random-eagle3 (profile `k3-random`)")
            && err.contains("--stream partial"),
        "{err}"
    );
    // The flag overrides the profile.
    let (out, _) = verify(
        &draft,
        &mix,
        &[
            "--target",
            pf.to_str().unwrap(),
            "--draft-stream",
            "mixture",
        ],
        0,
    );
    assert!(
        out.contains("draft trained on `mixture` (--draft-stream)"),
        "{out}"
    );
}

/// A live verify on an attention-residual profile's target captures the stream asked
/// (`--stream`), else the draft's (`--draft-stream`), else vLLM's default `partial`; and
/// `--stream` on a live target without attention residuals is refused.
#[test]
fn a_live_verify_on_k3_taps_the_stream_asked_or_the_drafts() {
    let d = tempfile::tempdir().unwrap();
    let draft = k3_draft(d.path());
    let p = prompts(d.path(), "p.jsonl", 0);
    let pf = k3_like_profile(d.path(), "k3-live", (6, 64, 2048), serde_json::json!([]));
    let mut prof = common::read_json(&pf);
    // Live paths are the repository's; `--prompts` gives this test's own.
    prof["live"] = serde_json::json!({"target": K3, "prompts": "fixtures/kimi-k2.5-tiny/prompts/heldout.jsonl", "trace": "none"});
    std::fs::write(&pf, prof.to_string()).unwrap();
    let live = |extra: &[&str]| -> Value {
        let mut a = vec![
            "verify",
            "--target",
            pf.to_str().unwrap(),
            "--draft",
            draft.to_str().unwrap(),
            "--prompts",
            p.to_str().unwrap(),
            "--json",
            "-",
        ];
        a.extend(extra);
        let o = kquant(&a);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{extra:?}\n{err}");
        assert!(
            err.contains("capturing 3 prompts with the live `k3-live` target"),
            "{err}"
        );
        serde_json::from_str::<Value>(&out).unwrap()["tap_stream"].clone()
    };
    let ts = live(&[]);
    assert_eq!(
        (ts["trace"].as_str(), ts["trace_known"].as_str()),
        (Some("partial"), Some("recorded"))
    );
    assert_eq!(
        live(&[
            "--stream",
            "mixture",
            "--allow-stream-mismatch",
            "--draft-stream",
            "partial"
        ])["trace"],
        "mixture"
    );
    let ts = live(&["--draft-stream", "mixture"]);
    assert_eq!(
        (ts["trace"].as_str(), ts["notes"].as_array().map(Vec::len)),
        (Some("mixture"), Some(0))
    );
    let o = kquant(&[
        "verify",
        "--target",
        "kimi-k2.5-tiny",
        "--draft",
        "fixtures/kimi-k2.5-tiny/eagle3",
        "--stream",
        "mixture",
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("has no attention residuals"), "{err}");
}

/// A profile file like `kimi-k3`'s (attention residuals, block 4) for a small target of
/// `(layers, hidden, vocab)`, named `name`, with `published` as its published drafts.
pub fn k3_like_profile(
    dir: &Path,
    name: &str,
    shape: (usize, usize, usize),
    published: Value,
) -> PathBuf {
    let mut prof = common::read_json(&root().join("quant-configs/targets/kimi-k3.json"));
    prof["name"] = name.into();
    prof["num_layers"] = shape.0.into();
    prof["hidden_size"] = shape.1.into();
    prof["vocab_size"] = shape.2.into();
    prof.as_object_mut().unwrap().remove("layers");
    prof["taps"] = serde_json::json!({"eagle3": "unknown", "eagle3-mla": "unknown", "dflash": "unknown", "dspark": "unknown", "dflash2": "unknown"});
    prof["published_accept_lengths"] = serde_json::json!([]);
    prof["attention_residuals"]["block_size"] = 4.into();
    prof["published_drafts"] = published;
    let pf = dir.join(format!("{name}.json"));
    std::fs::write(&pf, prof.to_string()).unwrap();
    pf
}
