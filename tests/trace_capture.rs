//! `kquant trace capture` through the binary, against the committed trace of the tiny Kimi
//! target (fixtures/kimi-k2.5-tiny/trace, written by fixtures/gen/verify/make_trace.py with
//! transformers): the same tokens exactly, the same `target_top1`, taps within one bf16 ulp.
//!
//! A debug build captures a sample in ~10 CPU-seconds, so the test takes the first
//! `KQ_CAPTURE_LIMIT` prompts (default 2); `KQ_CAPTURE_LIMIT=60` checks all of them.

use crate::common;

use std::path::Path;
use std::process::Output;

use common::{kquant, read_json, root};
use kquant::checkpoint::Checkpoint;
use kquant::runtime::target::Target;
use kquant::trace::file::Trace;

const TARGET: &str = "fixtures/kimi-k2.5-tiny/target";
const PROMPTS: &str = "fixtures/kimi-k2.5-tiny/prompts/heldout.jsonl";
const TRACE: &str = "fixtures/kimi-k2.5-tiny/trace";

/// A trained fixture whose committed trace a capture must reproduce.
struct Fixture {
    target: &'static str,
    prompts: &'static str,
    trace: &'static str,
    /// `--taps` when the committed trace holds other than the default (every `hs[1..L]`).
    taps: Option<&'static str>,
}

const KIMI_K2: Fixture = Fixture {
    target: TARGET,
    prompts: PROMPTS,
    trace: TRACE,
    taps: None,
};

/// The Kimi-Linear fixture (fixtures/gen/kimi-linear/run_all.sh): its trace holds the DFlash
/// drafter's taps only, captured with forward hooks by transformers' chunked KDA.
const KIMI_LINEAR: Fixture = Fixture {
    target: "fixtures/kimi-linear-tiny/target",
    prompts: "fixtures/kimi-linear-tiny/prompts/heldout.jsonl",
    trace: "fixtures/kimi-linear-tiny/trace",
    taps: Some("2,3"),
};

/// Bound on max |ours − committed| / max |committed| per tap tensor: one bf16 ulp at the
/// tensor's largest magnitude (2⁻⁷). Both sides round nearly equal f32 values (≈1e-6 apart) to
/// bf16, so a few elements land one ulp apart; measured 4.6e-3 over all 60 samples (0.053% of
/// values differ).
const TAP_REL_TOL: f32 = 1.0 / 128.0;

fn limit() -> usize {
    std::env::var("KQ_CAPTURE_LIMIT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

/// `kquant trace capture TARGET_FLAG TARGET --prompts PROMPTS -o OUT EXTRA…` (`target_flag`
/// `--target-checkpoint`, or the old spelling `--target`, or none).
fn capture_with(target_flag: Option<&str>, out: &Path, extra: &[&str]) -> Output {
    capture_fixture(&KIMI_K2, target_flag, out, extra)
}

fn capture_fixture(fx: &Fixture, target_flag: Option<&str>, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["trace", "capture"];
    args.extend(target_flag.map(|f| [f, fx.target]).into_iter().flatten());
    args.extend(["--prompts", fx.prompts, "-o", out.to_str().unwrap()]);
    args.extend(fx.taps.map(|t| ["--taps", t]).into_iter().flatten());
    args.extend_from_slice(extra);
    kquant(&args)
}

/// `kquant trace capture --target-checkpoint TARGET --prompts PROMPTS -o OUT EXTRA…`.
fn capture_to(out: &Path, extra: &[&str]) -> Output {
    capture_with(Some("--target-checkpoint"), out, extra)
}

/// Where two token sequences first differ, and the target's logit margin there (our argmax's
/// logit minus the committed token's), to tell a near-tie from a real disagreement.
fn divergence(fx: &Fixture, ours: &[u32], theirs: &[u32]) -> String {
    let Some(t) = (0..ours.len().min(theirs.len())).find(|&i| ours[i] != theirs[i]) else {
        return format!("lengths {} vs {}", ours.len(), theirs.len());
    };
    let ck = Checkpoint::open(root().join(fx.target).to_str().unwrap()).unwrap();
    let m = Target::load(&ck).unwrap();
    let f = m.forward(&theirs[..t]).unwrap();
    let v = m.vocab();
    let row = &f.logits[(t - 1) * v..t * v];
    format!(
        "first difference at position {t}: ours {} vs committed {}, logit margin {:.3e}",
        ours[t],
        theirs[t],
        row[ours[t] as usize] - row[theirs[t] as usize]
    )
}

#[test]
fn capture_reproduces_the_committed_trace() {
    reproduces(&KIMI_K2);
}

/// The Kimi-Linear target's capture (`runtime::kimi_linear`, KDA token by token) against the
/// trace transformers wrote (chunked KDA prefill, cached recurrent decode, taps by hooks).
#[test]
fn kimi_linear_capture_reproduces_its_committed_trace() {
    reproduces(&KIMI_LINEAR);
}

fn reproduces(fx: &Fixture) {
    let committed_dir = root().join(fx.trace);
    assert!(
        committed_dir.join("manifest.json").is_file(),
        "{} is missing: the trained fixtures are part of the repository",
        committed_dir.display()
    );
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("trace");
    let t0 = std::time::Instant::now();
    let lim = limit().to_string();
    let o = capture_fixture(
        fx,
        Some("--target-checkpoint"),
        &out,
        &["--dataset", "kquant-heldout", "--limit", &lim],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    eprintln!(
        "captured {} samples in {:.1} s: {}",
        limit(),
        t0.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&o.stdout).trim()
    );
    let (ours, theirs) = (
        Trace::open(&out).unwrap(),
        Trace::open(&committed_dir).unwrap(),
    );
    let (om, tm) = (&ours.manifest, &theirs.manifest);
    assert_eq!(om.samples.len(), limit().min(tm.samples.len()));
    assert_eq!(
        (
            om.taps.clone(),
            om.hidden_size,
            om.num_layers,
            om.vocab_size
        ),
        (
            tm.taps.clone(),
            tm.hidden_size,
            tm.num_layers,
            tm.vocab_size
        ),
        "default taps and dimensions"
    );
    assert_eq!(om.greedy_selfcheck, Some(0));
    for k in ["tokenizer_sha256", "sampling", "thinking", "system_prompt"] {
        assert_eq!(om.extra.get(k), tm.extra.get(k), "manifest `{k}`");
    }
    assert_eq!(om.target["revision"], tm.target["revision"]);
    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    let raw = |dir: &Path| read_json(&dir.join("manifest.json"));
    let (ro, rt) = (raw(&out), raw(&committed_dir));
    // kquant records the tap stream (#41), which the committed trace (make_trace.py's, from
    // before) leaves out: the one residual stream of a target without attention residuals.
    assert_eq!(ro["tap_stream"], "residual");
    let without_stream = |v: &serde_json::Value| {
        let mut k = keys(v);
        k.retain(|k| k != "tap_stream");
        k
    };
    assert_eq!(without_stream(&ro), without_stream(&rt), "manifest fields");
    // make_trace.py's target fields, less `torch_version` (kquant runs no torch), and the
    // config's digest kquant adds (#38.9: `trace merge` compares it).
    let mut want = keys(&rt["target"]);
    want.retain(|k| k != "torch_version");
    want.push("config_sha256".into());
    // And the architecture the runtime ran (#41: it tells an attention-residual target).
    if !want.contains(&"architecture".to_string()) {
        want.push("architecture".into());
    }
    want.sort();
    assert!(ro["target"]["config_sha256"]
        .as_str()
        .is_some_and(|h| h.starts_with("sha256:")));
    assert_eq!(keys(&ro["target"]), want, "manifest target fields");
    assert_eq!(
        keys(&ro["samples"][0]),
        keys(&rt["samples"][0]),
        "sample fields"
    );

    let mut worst = 0f32;
    let mut differing = (0usize, 0usize);
    for s in &om.samples {
        let c = tm.samples.iter().find(|c| c.id == s.id).unwrap();
        assert_eq!(
            (
                s.shard.as_str(),
                s.prompt_len,
                s.gen_len,
                &s.finish_reason,
                &s.category,
                &s.dataset,
                s.turn
            ),
            (
                c.shard.as_str(),
                c.prompt_len,
                c.gen_len,
                &c.finish_reason,
                &c.category,
                &c.dataset,
                c.turn
            ),
            "sample {} metadata",
            s.id
        );
        let (x, y) = (ours.tokens(s).unwrap(), theirs.tokens(c).unwrap());
        assert!(
            x == y,
            "sample {}: tokens differ: {}",
            s.id,
            divergence(fx, &x, &y)
        );
        assert_eq!(
            ours.target_top1(s).unwrap(),
            theirs.target_top1(c).unwrap(),
            "sample {} target_top1",
            s.id
        );
        for &tap in &om.taps {
            let (a, b) = (ours.tap(s, tap).unwrap(), theirs.tap(c, tap).unwrap());
            let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = a
                .iter()
                .zip(&b)
                .fold(0f32, |m, (p, q)| m.max((p - q).abs()))
                / scale;
            differing.0 += a.iter().zip(&b).filter(|(p, q)| p != q).count();
            differing.1 += a.len();
            worst = worst.max(d);
            assert!(
                d <= TAP_REL_TOL,
                "sample {} tap {tap}: {d:.3e} > {TAP_REL_TOL}",
                s.id
            );
        }
    }
    eprintln!(
        "taps: max rel error {worst:.3e}, {} of {} values differ",
        differing.0, differing.1
    );
}

#[test]
fn capture_refuses_post_norm_taps_and_an_existing_output() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("trace");
    let o = capture_to(&out, &["--taps", "1,4"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("final norm") && e.contains("hint:"), "{e}");
    std::fs::create_dir(&out).unwrap();
    let o = capture_to(&out, &["--limit", "1", "--gen-len", "2"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("--force"), "{e}");
}

/// `--target`, the spelling before `--target-checkpoint`, still captures, with a warning that
/// names the new spelling; neither spelling is refused with clap's missing-argument error.
#[test]
fn the_deprecated_target_spelling_still_captures_and_warns() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("trace");
    let o = capture_with(Some("--target"), &out, &["--limit", "1", "--gen-len", "2"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains("warning: `--target` is deprecated for trace capture: say --target-checkpoint (accepted until the next release)"),
        "{e}"
    );
    assert_eq!(Trace::open(&out).unwrap().manifest.samples.len(), 1);
    let o = capture_with(None, &d.path().join("none"), &[]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("--target-checkpoint <TARGET_CHECKPOINT>"), "{e}");
}

/// `--json` prints one `kquant.trace-capture/1` document on stdout (the human summary and the
/// `next:` lines go to stderr): what was written, and the commands that use it.
#[test]
fn json_describes_the_capture_and_what_comes_next() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("trace");
    let o = capture_to(&out, &["--limit", "1", "--gen-len", "3", "--json"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{e}");
    let doc: serde_json::Value =
        serde_json::from_slice(&o.stdout).expect("stdout is one JSON document");
    assert_eq!(doc["schema"], "kquant.trace-capture/1");
    assert_eq!(doc["output"], out.to_str().unwrap());
    assert_eq!(doc["target"], TARGET);
    assert_eq!(doc["dataset"], "heldout");
    assert_eq!(doc["samples"], 1);
    assert_eq!(doc["gen_len"], 3);
    assert_eq!(doc["greedy_selfcheck"], 0);
    assert_eq!(doc["warnings"], serde_json::json!([]));
    let m = &Trace::open(&out).unwrap().manifest;
    assert_eq!(doc["taps"], serde_json::json!(m.taps));
    let tokens: usize = m.samples.iter().map(|s| s.prompt_len + s.gen_len).sum();
    assert_eq!(doc["tokens"], tokens);
    let next: Vec<&str> = doc["next"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    let trace_flag = format!("--trace {} ", out.display());
    assert!(
        next[0].starts_with("kquant verify ")
            && next[0].contains(&trace_flag)
            && next[0].contains(&format!("--target-checkpoint {TARGET} ")),
        "{next:?}"
    );
    assert!(next[1].starts_with("kquant calibrate "), "{next:?}");
    assert!(
        next[2].starts_with("kquant quantize DRAFT -o OUT --method gptq ")
            && next[2].contains(&format!("--calibrate {} ", out.display())),
        "{next:?}"
    );
    for n in &next {
        assert!(e.contains(&format!("next: {n}")), "{e}");
    }
    assert!(e.contains("1 samples"), "the summary moves to stderr: {e}");
}

/// `--lookahead K`: each sample keeps K greedy tokens past its stop (EOS or `--gen-len`) and
/// records the stop as `stop_len`; the tokens up to it are exactly the capture without
/// lookahead, so `verify`'s committed figures are too, and `accept_length_engine` (vLLM's
/// count of the final step before its cut) is given where without lookahead it is `null`.
/// `--tap-dtype f32` stores the taps as the runtime computed them: the bf16 capture's taps are
/// those values rounded.
#[test]
fn lookahead_keeps_tokens_past_the_stop_and_f32_taps_are_exact() {
    let d = tempfile::tempdir().unwrap();
    let (plain, ahead, wide) = (
        d.path().join("plain"),
        d.path().join("ahead"),
        d.path().join("wide"),
    );
    let base = ["--limit", "3", "--gen-len", "24", "--stop-at-eos"];
    for (out, extra) in [
        (&plain, &[][..]),
        (&ahead, &["--lookahead", "3"][..]),
        (&wide, &["--lookahead", "3", "--tap-dtype", "f32"][..]),
    ] {
        let o = capture_to(out, &[&base[..], extra].concat());
        assert!(o.status.success(), "{}", common::stderr(&o));
    }
    let (p, a, w) = (
        Trace::open(&plain).unwrap(),
        Trace::open(&ahead).unwrap(),
        Trace::open(&wide).unwrap(),
    );
    assert_eq!(a.manifest.extra["sampling"]["lookahead"], 3);
    assert!(p.manifest.extra["sampling"].get("lookahead").is_none());
    assert_eq!(
        (p.manifest.dtype.as_str(), w.manifest.dtype.as_str()),
        ("bf16", "f32")
    );
    for ((sp, sa), sw) in p
        .manifest
        .samples
        .iter()
        .zip(&a.manifest.samples)
        .zip(&w.manifest.samples)
    {
        let (xp, xa) = (p.tokens(sp).unwrap(), a.tokens(sa).unwrap());
        assert_eq!(sp.stop_len, None);
        assert_eq!(sa.stop_len, Some(xp.len()), "sample {}", sa.id);
        assert_eq!(xa.len(), xp.len() + 3);
        assert_eq!(&xa[..xp.len()], &xp[..], "sample {}", sa.id);
        assert_eq!(sa.finish_reason, sp.finish_reason);
        assert_eq!(w.tokens(sw).unwrap(), xa);
        for &tap in &a.manifest.taps {
            let (tb, tf) = (a.tap(sa, tap).unwrap(), w.tap(sw, tap).unwrap());
            let rounded: Vec<f32> = tf
                .iter()
                .map(|&x| half::bf16::from_f32(x).to_f32())
                .collect();
            assert_eq!(tb, rounded, "sample {} tap {tap}", sa.id);
            assert!(
                tf.iter().zip(&rounded).any(|(x, r)| x != r),
                "f32 taps are not bf16"
            );
        }
    }
    let verify = |t: &Path| -> serde_json::Value {
        let o = kquant(&[
            "verify",
            "--target",
            "kimi-k2.5-tiny",
            "--trace",
            t.to_str().unwrap(),
            "--draft",
            "fixtures/kimi-k2.5-tiny/eagle3",
            "--json",
            "-",
        ]);
        assert!(o.status.success(), "{}", common::stderr(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let (vp, va) = (verify(&plain), verify(&ahead));
    for k in [
        "accept_length",
        "rounds",
        "accept_length_all_positions",
        "conditional_acceptance",
    ] {
        assert_eq!(vp["draft"][k], va["draft"][k], "{k}");
    }
    let (eng, al) = (
        va["draft"]["accept_length_engine"].as_f64().unwrap(),
        va["draft"]["accept_length"].as_f64().unwrap(),
    );
    assert!(eng >= al, "{eng} < {al}");
    let reqs = va["draft"]["requests"].as_array().unwrap();
    assert_eq!(reqs.len(), 3);
    for r in reqs {
        let (c, acc) = (
            r["committed"].as_u64().unwrap(),
            r["accepted"].as_u64().unwrap(),
        );
        assert!(acc >= c && acc - c <= 3, "{r}");
        assert_eq!(
            r["steps"].as_u64().unwrap() + c + 1,
            r["tokens"].as_u64().unwrap(),
            "{r}"
        );
    }
    assert_eq!(va["gated_on"], "accept_length");
    assert!(va["conventions"]["accept_length_engine"].is_string());
}

/// `--limit N` on a category-sorted prompt file (the held-out set: 20 code, then prose, then
/// arith) keeps only the first category: a warning names the categories dropped and
/// `--per-category`; `--per-category 1` keeps one prompt of each, without a warning.
#[test]
fn limit_names_the_categories_it_drops_and_per_category_keeps_them() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("limited");
    let o = capture_to(&out, &["--limit", "2", "--gen-len", "2", "--json"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{e}");
    let w = e
        .lines()
        .find(|l| l.starts_with("warning: --limit 2"))
        .unwrap_or_else(|| panic!("no --limit warning:\n{e}"));
    assert!(
        w.contains("`prose`") && w.contains("`arith`") && w.contains("--per-category"),
        "{w}"
    );
    assert!(
        !w.contains("`code`, ") && !w.contains("dropped: `code`"),
        "{w}"
    );
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["samples"], 2, "{doc}");
    let out = d.path().join("per-category");
    let o = capture_to(&out, &["--per-category", "1", "--gen-len", "2", "--json"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(!e.contains("warning: --limit"), "{e}");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["samples"], 3, "{doc}");
    let t = kquant::trace::file::Trace::open(&out).unwrap();
    let cats: Vec<&str> = t
        .manifest
        .samples
        .iter()
        .map(|s| s.category.as_str())
        .collect();
    assert_eq!(cats, ["code", "prose", "arith"]);
}

/// #38.18: a prompt file whose ids are not whole numbers (`HumanEval/0`) keeps them: the trace's
/// samples record each as `prompt_id` beside the sample number, and the offline report's
/// requests carry it, so `verify-join` lines them up with a live run of the same file.
#[test]
fn string_prompt_ids_are_kept_through_capture_and_verify() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("named.jsonl");
    std::fs::write(
        &p,
        "{\"id\": \"HumanEval/0\", \"category\": \"code\", \"tokens\": [5, 6, 7, 8]}\n\
         {\"id\": \"test-1\", \"category\": \"code\", \"tokens\": [9, 10, 11]}\n\
         {\"id\": \"7\", \"category\": \"code\", \"tokens\": [12, 13]}\n",
    )
    .unwrap();
    let out = t.path().join("trace");
    let o = kquant(&[
        "trace",
        "capture",
        "--target-checkpoint",
        TARGET,
        "--prompts",
        p.to_str().unwrap(),
        "--gen-len",
        "4",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let m = read_json(&out.join("manifest.json"));
    let s = m["samples"].as_array().unwrap();
    assert_eq!(
        s.iter().map(|x| x["prompt_id"].clone()).collect::<Vec<_>>(),
        [
            serde_json::json!("HumanEval/0"),
            serde_json::json!("test-1"),
            serde_json::Value::Null
        ]
    );
    assert_eq!(s[2]["id"], 7, "a whole-number id stays the sample's");
    let o = kquant(&[
        "verify",
        "--target",
        "kimi-k2.5-tiny",
        "--trace",
        out.to_str().unwrap(),
        "--draft",
        "fixtures/kimi-k2.5-tiny/eagle3",
        "--json",
        "-",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["draft"]["requests"][0]["prompt_id"], "HumanEval/0");
}
