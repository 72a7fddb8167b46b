//! `kquant verify` end to end on a synthetic trace: tokens grown from the tiny EAGLE-3 draft's
//! own depth-0 predictions (so the draft has something to accept), random target taps.
//! A draft against itself gives Δ = 0 exactly; a damaged draft fails with exit 1.

use crate::common;

use std::path::Path;

use common::{kquant, root};
use kquant::checkpoint::Checkpoint;
use kquant::io::writer::{TensorSpec, WriteOptions, Writer};
use kquant::runtime::eagle3::Eagle3;
use kquant::trace::file::{self, Manifest, NewSample, SampleMeta};
use serde_json::Value;

const DRAFT: &str = "fixtures/tiny/eagle3-specforge";
const TARGET: &str = "fixtures/tiny/target-kimi-k2";

fn embed() -> Vec<f32> {
    let t = Checkpoint::open(root().join(TARGET).to_str().unwrap()).unwrap();
    t.weights
        .tensor("model.embed_tokens.weight")
        .unwrap()
        .to_f32()
}

fn rand(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// A trace whose generated tokens are the draft's own depth-0 greedy choices.
fn make_trace(dir: &Path, samples: usize, taps: &[usize]) {
    let ck = Checkpoint::open(root().join(DRAFT).to_str().unwrap()).unwrap();
    let d = Eagle3::load(&ck, &ck.detect().unwrap(), Some(embed())).unwrap();
    let (p, t_len, h) = (8usize, 40usize, 64usize);
    let mut owned = Vec::new();
    for i in 0..samples {
        let tap_vals: Vec<Vec<f32>> = taps
            .iter()
            .map(|&t| rand(t_len * h, (i * 100 + t) as u64))
            .collect();
        let mut x: Vec<u32> = rand(p, i as u64 + 7)
            .iter()
            .map(|v| ((v + 1.0) * 100.0) as u32 % 256)
            .collect();
        while x.len() < t_len {
            let n = x.len();
            let feats: Vec<f32> = (0..n)
                .flat_map(|t| {
                    tap_vals
                        .iter()
                        .take(3)
                        .flat_map(move |tv| tv[t * h..(t + 1) * h].to_vec())
                })
                .collect();
            let next = d.depth0_tokens(&x, &feats)[n - 2];
            x.push(next);
        }
        owned.push((x, tap_vals));
    }
    let metas: Vec<SampleMeta> = (0..samples)
        .map(|i| SampleMeta {
            id: i as u64,
            category: if i % 2 == 0 {
                "code".into()
            } else {
                "prose".into()
            },
            dataset: "synthetic".into(),
            shard: String::new(),
            prompt_len: p,
            gen_len: t_len - p,
            finish_reason: "length".into(),
            turn: 0,
            stop_len: None,
            prompt_id: None,
        })
        .collect();
    let news: Vec<NewSample> = owned
        .iter()
        .zip(&metas)
        .map(|((x, tv), m)| NewSample {
            meta: m.clone(),
            tokens: x,
            taps: taps
                .iter()
                .zip(tv)
                .map(|(&t, v)| (t, v.as_slice()))
                .collect(),
            target_top1: None,
        })
        .collect();
    let manifest = Manifest {
        format: file::FORMAT.into(),
        target: serde_json::json!({"name": "tiny-kimi-k2 (synthetic taps)"}),
        hidden_size: h,
        num_layers: 8,
        vocab_size: Some(256),
        taps: taps.to_vec(),
        tap_convention: file::TAP_CONVENTION.into(),
        taps_pre_norm: true,
        tap_stream: None,
        dtype: "bf16".into(),
        greedy_selfcheck: None,
        samples: metas,
        shards: vec![],
        extra: Default::default(),
    };
    file::write(file::claim(dir, false, &[]).unwrap(), manifest, &news).unwrap();
}

/// The draft with every decoder-layer linear replaced by sign(w)·mean|w| (a 1-bit rounding).
fn damaged(out: &Path) {
    let w = kquant::io::source::open(root().join(DRAFT).to_str().unwrap()).unwrap();
    let specs: Vec<TensorSpec> = w
        .infos()
        .map(|t| TensorSpec::new(t.name.clone(), t.dtype, t.shape.clone()))
        .collect();
    let mut wr = Writer::create(out, specs, WriteOptions::default()).unwrap();
    for name in wr.order().into_iter().map(String::from).collect::<Vec<_>>() {
        let v = w.tensor(&name).unwrap();
        if name.starts_with("midlayer.") && name.ends_with("proj.weight") {
            let f = v.to_f32();
            let m = f.iter().map(|x| x.abs()).sum::<f32>() / f.len() as f32;
            let b: Vec<u8> = f
                .iter()
                .flat_map(|x| half::bf16::from_f32(m * x.signum()).to_le_bytes())
                .collect();
            wr.write(&name, &b).unwrap();
        } else {
            wr.write(&name, v.data).unwrap();
        }
    }
    wr.add_file(
        "config.json",
        &std::fs::read(root().join(DRAFT).join("config.json")).unwrap(),
    )
    .unwrap();
    wr.finish().unwrap();
}

#[test]
fn a_draft_against_itself_is_exactly_zero_and_passes() {
    let t = tempfile::tempdir().unwrap();
    let tr = t.path().join("trace");
    make_trace(&tr, 6, &[2, 4, 5]);
    let junit = t.path().join("j.xml");
    let o = kquant(&[
        "verify",
        "--draft",
        DRAFT,
        "--baseline",
        DRAFT,
        "--trace",
        tr.to_str().unwrap(),
        "--target-checkpoint",
        TARGET,
        "--json",
        "-",
        "--junit",
        junit.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["delta"], 0.0);
    assert_eq!(j["ci95"], serde_json::json!([0.0, 0.0]));
    assert_eq!(j["passed"], true);
    // Against itself every proposal agrees, at every depth and in every category.
    assert_eq!(j["agreement"]["overall"], 1.0);
    assert_eq!(
        j["agreement"]["per_depth"],
        serde_json::json!([1.0, 1.0, 1.0])
    );
    assert!(j["agreement"]["compared"][0].as_u64().unwrap() > 0);
    assert_eq!(j["per_category"]["code"]["agreement"]["overall"], 1.0);
    let al = j["draft"]["accept_length"].as_f64().unwrap();
    assert!(
        al > 1.9,
        "depth 0 always matches on this trace, so AL ≥ 2: {al}"
    );
    assert_eq!(j["draft"]["conditional_acceptance"][0], 1.0);
    for k in ["code", "prose"] {
        assert_eq!(j["per_category"][k]["n"], 3);
    }
    let x = std::fs::read_to_string(junit).unwrap();
    // The gate (the overall regression threshold a line of its output) and two categories, all
    // passing.
    assert!(
        x.contains("tests=\"3\" failures=\"0\"")
            && x.contains("name=\"gate\"")
            && x.contains("name=\"category code\"")
            && x.contains("overall: accept length regression at most 0.03: ok")
            && x.contains("<property name=\"passed\" value=\"true\"/>")
            && x.contains("<property name=\"delta\" value=\"0.0000\"/>"),
        "{x}"
    );
}

#[test]
fn a_damaged_draft_fails_the_gate_with_exit_1() {
    let t = tempfile::tempdir().unwrap();
    let tr = t.path().join("trace");
    make_trace(&tr, 6, &[2, 4, 5]);
    let bad = t.path().join("bad");
    damaged(&bad);
    let o = kquant(&[
        "verify",
        "--draft",
        bad.to_str().unwrap(),
        "--baseline",
        DRAFT,
        "--trace",
        tr.to_str().unwrap(),
        "--target-checkpoint",
        TARGET,
    ]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("FAILED") && out.contains("regressed"), "{out}");
    // Per-depth rates are printed like the accept lengths (3 decimals), not as raw floats.
    let depth = out
        .lines()
        .find_map(|l| l.split("per-depth conditional acceptance [").nth(1))
        .unwrap_or_else(|| panic!("{out}"));
    for x in depth.trim_end_matches(']').split(", ") {
        assert!(
            x == "-" || x.split('.').nth(1).is_some_and(|d| d.len() == 3),
            "{depth}"
        );
    }
    // Exit 1 always comes with a red JUnit report carrying the figures.
    let junit = t.path().join("gate.xml");
    let o = kquant(&[
        "verify",
        "--draft",
        bad.to_str().unwrap(),
        "--baseline",
        DRAFT,
        "--trace",
        tr.to_str().unwrap(),
        "--target-checkpoint",
        TARGET,
        "--junit",
        junit.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let x = std::fs::read_to_string(&junit).unwrap();
    assert!(!x.contains("failures=\"0\""), "{x}");
    assert!(
        x.contains("<testcase classname=\"kquant.verify\" name=\"gate\">\n    <failure message=\"accept length regressed by"),
        "{x}"
    );
    assert!(
        x.contains("<property name=\"passed\" value=\"false\"/>")
            && x.contains("baseline_accept_length")
            && x.contains("draft AL "),
        "{x}"
    );
    assert!(
        out.contains("category") && out.contains("AL baseline") && out.contains("overall"),
        "{out}"
    );
    // min-accept alone also gates.
    let o = kquant(&[
        "verify",
        "--draft",
        DRAFT,
        "--trace",
        tr.to_str().unwrap(),
        "--target-checkpoint",
        TARGET,
        "--min-accept",
        "3.99",
        "--junit",
        junit.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    // No baseline: the gate fails, once for its one reason (#38.23: no second testcase failing
    // for the same reason), with the draft's AL in the message and the threshold's line.
    let x = std::fs::read_to_string(&junit).unwrap();
    assert!(x.contains("tests=\"3\" failures=\"1\""), "{x}");
    assert!(
        x.contains("overall: accept length at least 3.99: failed")
            && x.contains("is below --min-accept 3.99"),
        "{x}"
    );
    // Against the prompt-lookup drafter.
    let o = kquant(&[
        "verify",
        "--draft",
        DRAFT,
        "--baseline",
        "prompt-lookup",
        "--trace",
        tr.to_str().unwrap(),
        "--target-checkpoint",
        TARGET,
        "--json",
        "--max-regression",
        "100",
    ]);
    // `--json` is a switch here as in every other command (`--json FILE` still writes a file).
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["baseline"]["name"], "prompt-lookup");
}

#[test]
fn a_trace_without_the_drafts_taps_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let tr = t.path().join("trace");
    make_trace(&tr, 2, &[2, 4, 5]);
    // Rewrite the manifest to claim other taps: the tensors no longer match → refused.
    let o = kquant(&[
        "verify",
        "--draft",
        "fixtures/tiny/eagle3-vllm",
        "--trace",
        tr.to_str().unwrap(),
        "--target-checkpoint",
        TARGET,
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("aux-layer"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let tr2 = t.path().join("trace2");
    make_trace(&tr2, 2, &[2, 4, 6]);
    let o = kquant(&[
        "verify",
        "--draft",
        DRAFT,
        "--trace",
        tr2.to_str().unwrap(),
        "--target-checkpoint",
        TARGET,
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("missing [5]"), "{e}");
}

/// `--after-miss skip` stops each EAGLE-3 chain at its first miss: on the trained tiny draft
/// and its captured trace (AL ≈ 3, so most roots reach the later depths), the gate's accept
/// length, the all-positions mean, the SGLang convention, the rounds and the conditional
/// per-depth rates equal the full pass's exactly; the unconditional rates and the simulated AL
/// are null (not measured), and the report says so. A block drafter (DFlash) has nothing to
/// skip: its report keeps every figure.
#[test]
fn after_miss_skip_keeps_every_walk_figure_and_drops_only_the_unconditional_ones() {
    let fix = root().join("fixtures/kimi-k2.5-tiny");
    let run = |draft: &str, mode: &str| -> (Value, String) {
        let verify = |extra: &[&str]| {
            let (d, t, c) = (fix.join(draft), fix.join("trace"), fix.join("target"));
            let mut args = vec![
                "verify",
                "--draft",
                d.to_str().unwrap(),
                "--trace",
                t.to_str().unwrap(),
                "--target-checkpoint",
                c.to_str().unwrap(),
                "--after-miss",
                mode,
            ];
            args.extend_from_slice(extra);
            kquant(&args)
        };
        let o = verify(&["--json", "-"]);
        assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
        let table = verify(&["--limit", "1"]);
        (
            serde_json::from_slice(&o.stdout).unwrap(),
            String::from_utf8_lossy(&table.stdout).to_string(),
        )
    };
    let (full, full_table) = run("eagle3", "run");
    let (skip, skip_table) = run("eagle3", "skip");
    assert_eq!(
        (&full["after_miss"], &skip["after_miss"]),
        (&"run".into(), &"skip".into())
    );
    let al = full["draft"]["accept_length"].as_f64().unwrap();
    assert!(al > 2.0, "most roots reach depth 1: AL {al}");
    for k in [
        "accept_length",
        "accept_length_sglang_request",
        "accept_length_all_positions",
        "conditional_acceptance",
        "rounds",
    ] {
        assert_eq!(full["draft"][k], skip["draft"][k], "{k}");
    }
    for (c, v) in full["per_category"].as_object().unwrap() {
        assert_eq!(v["draft"], skip["per_category"][c]["draft"], "{c}");
    }
    for k in ["unconditional_acceptance", "simulated_accept_length"] {
        assert!(
            full["draft"][k].is_array() || full["draft"][k].is_f64(),
            "{k}"
        );
        assert!(skip["draft"][k].is_null(), "{k}: {}", skip["draft"][k]);
    }
    assert!(skip_table.contains("--after-miss skip"), "{skip_table}");
    assert!(!full_table.contains("--after-miss"), "{full_table}");
    let (dflash, _) = run("dflash", "skip");
    assert!(dflash["draft"]["unconditional_acceptance"].is_array());
}

/// `--max-regression -0.1` (an improvement asked for) is a value in `verify` as in
/// `sensitivity`: one flag, defined once. Against itself the draft does not improve: exit 1,
/// never "unexpected argument".
#[test]
fn a_negative_max_regression_is_a_value_everywhere() {
    let fix = "fixtures/kimi-k2.5-tiny";
    let o = kquant(&[
        "verify",
        "--target",
        "kimi-k2.5-tiny",
        "--trace",
        &format!("{fix}/trace"),
        "--limit",
        "1",
        "--draft",
        &format!("{fix}/eagle3"),
        "--baseline",
        &format!("{fix}/eagle3"),
        "--max-regression",
        "-0.1",
        "--json",
        "-",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", common::stderr(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["max_regression"], -0.1);
    let h = kquant(&["sensitivity", "--help"]);
    let v = kquant(&["verify", "--help"]);
    let line = |o: &std::process::Output| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("--max-regression"))
            .take(3)
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(line(&h), line(&v), "one definition, one help text");
}

/// `quantize`'s `next:` gate names the profile of the draft's own target (by its hidden size,
/// then by the taps its profile gives the draft's family): the tiny draft gets `--target
/// kimi-k2.5-tiny` (live, no trace needed), not `kimi-k2.5` nor `kimi-linear-tiny`.
/// Quantize `src` to `out` as int4-pc excluding `exclude`; the `next: kquant verify` line it
/// prints.
fn quantize_next_verify(src: &str, out: &std::path::Path, exclude: &str) -> String {
    let o = kquant(&[
        "quantize",
        src,
        "-o",
        out.to_str().unwrap(),
        "--scheme",
        "int4-pc",
        "--exclude",
        exclude,
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let e = common::stderr(&o);
    e.lines()
        .find(|l| l.starts_with("next: kquant verify"))
        .unwrap_or_else(|| panic!("{e}"))
        .to_string()
}

#[test]
fn quantize_suggests_the_profile_of_the_drafts_target() {
    let t = tempfile::tempdir().unwrap();
    let next = quantize_next_verify(
        "fixtures/kimi-k2.5-tiny/eagle3",
        &t.path().join("q"),
        "fc,lm_head",
    );
    assert!(
        next.contains("--target kimi-k2.5-tiny ") && !next.contains("--trace"),
        "{next}"
    );
    // And the suggested gate runs as printed.
    let mut args: Vec<&str> = next
        .trim_start_matches("next: kquant ")
        .split(" (")
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    args.extend(["--limit", "1", "--max-regression", "1"]);
    let o = kquant(&args);
    assert!(o.status.success(), "{args:?}: {}", common::stderr(&o));
    // Two live profiles have hidden size 256; the Kimi-Linear drafter's taps (hs[2, 3]) name
    // its own.
    let next = quantize_next_verify(
        "fixtures/kimi-linear-tiny/dflash",
        &t.path().join("kl"),
        "fc",
    );
    assert!(
        next.contains("--target kimi-linear-tiny ") && !next.contains("--trace"),
        "{next}"
    );
}

/// A report says when its interval cannot carry the verdict: too few prompts for a bootstrap,
/// or an interval that straddles the threshold (the verdict then rests on the point estimate);
/// in the table, the JSON and the JUnit.
#[test]
fn the_report_says_when_the_interval_cannot_carry_the_verdict() {
    let t = tempfile::tempdir().unwrap();
    let fix = "fixtures/kimi-k2.5-tiny";
    let q = t.path().join("q");
    let o = kquant(&[
        "quantize",
        &format!("{fix}/eagle3"),
        "-o",
        q.to_str().unwrap(),
        "--scheme",
        "int4-pc",
        "--exclude",
        "fc,lm_head",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let junit = t.path().join("v.xml");
    let run = |limit: &str, maxr: &str| {
        let o = kquant(&[
            "verify",
            "--target",
            "kimi-k2.5-tiny",
            "--trace",
            &format!("{fix}/trace"),
            "--limit",
            limit,
            "--draft",
            q.to_str().unwrap(),
            "--baseline",
            &format!("{fix}/eagle3"),
            "--max-regression",
            maxr,
            "--junit",
            junit.to_str().unwrap(),
            "--json",
            "-",
        ]);
        assert!(o.status.code().unwrap() <= 1, "{}", common::stderr(&o));
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        (r, std::fs::read_to_string(&junit).unwrap())
    };
    // 3 prompts: too few.
    let (r, x) = run("1", "1");
    let notes = r["interval_notes"].as_array().unwrap();
    assert!(
        notes.iter().any(|n| n
            .as_str()
            .unwrap()
            .contains("too few prompts for the interval: 3")),
        "{notes:?}"
    );
    assert!(x.contains("name=\"interval_notes\""), "{x}");
    // 60 prompts, the threshold inside the interval: straddles.
    let (r, _) = run("20", "1");
    assert_eq!(
        r["interval_notes"],
        serde_json::json!([]),
        "60 prompts, far threshold"
    );
    let (lo, hi) = (
        r["ci95"][0].as_f64().unwrap(),
        r["ci95"][1].as_f64().unwrap(),
    );
    let mid = format!("{}", -(lo + hi) / 2.0);
    let (r, _) = run("20", &mid);
    let notes = r["interval_notes"].as_array().unwrap();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0]
            .as_str()
            .unwrap()
            .contains("straddles the threshold"),
        "{notes:?}"
    );
}

/// On a terminal, the replay's progress counts positions, not bytes (`script` gives the
/// binary a pseudo-terminal, where indicatif draws).
#[test]
fn replay_progress_counts_positions_on_a_terminal() {
    let bin = env!("CARGO_BIN_EXE_kquant");
    // `script` gives the binary a terminal; progress is drawn only where TERM names one, which
    // a bare environment (`env -i`, a minimal container) does not set (#38.25).
    let o = std::process::Command::new("script")
        .current_dir(root())
        .env("TERM", "xterm")
        .args([
            "-qec",
            &format!(
                "{bin} verify --target kimi-k2.5-tiny --trace fixtures/kimi-k2.5-tiny/trace --limit 2 --draft fixtures/kimi-k2.5-tiny/eagle3"
            ),
            "/dev/null",
        ])
        .output()
        .expect("script (util-linux) runs the binary on a pseudo-terminal");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("/576 positions"), "{out}");
    assert!(!out.contains("KiB") && !out.contains(" B/"), "{out}");
}

/// A report path that holds someone else's file is refused with a hint naming the flag that
/// chose it (`--junit`, `--json`), not `-o`.
#[test]
fn report_refusals_name_their_own_flag() {
    let t = tempfile::tempdir().unwrap();
    let mine = t.path().join("notes.txt");
    std::fs::write(&mine, "mine").unwrap();
    for flag in ["--junit", "--json"] {
        let o = kquant(&[
            "verify",
            "--target",
            "kimi-k2.5-tiny",
            "--trace",
            "fixtures/kimi-k2.5-tiny/trace",
            "--limit",
            "1",
            "--draft",
            "fixtures/kimi-k2.5-tiny/eagle3",
            flag,
            mine.to_str().unwrap(),
        ]);
        let e = common::stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{flag}: {e}");
        assert!(
            e.contains(&format!("choose another {flag}")) && !e.contains("another -o"),
            "{flag}: {e}"
        );
        assert_eq!(std::fs::read_to_string(&mine).unwrap(), "mine");
    }
}

/// #27.27: one meaning, one spelling. `verify --per-category N` replays the first N samples of
/// each category; the old `--limit N` still means that here and says so with a `warning:` (in
/// `trace capture` and `calibrate` it is the first N of the whole set); both at once are
/// refused. `trace prompts` takes `--prompts` like every other command (`--input` kept).
#[test]
fn per_category_is_spelled_per_category_and_prompts_is_spelled_prompts() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "verify",
            "--target",
            "kimi-k2.5-tiny",
            "--trace",
            "fixtures/kimi-k2.5-tiny/trace",
            "--draft",
            "fixtures/kimi-k2.5-tiny/eagle3",
            "--json",
            "-",
        ];
        args.extend_from_slice(extra);
        kquant(&args)
    };
    let new = run(&["--per-category", "2"]);
    assert_eq!(new.status.code(), Some(0), "{}", common::stderr(&new));
    let err = common::stderr(&new);
    assert!(!err.contains("warning: `--limit"), "{err}");
    let j: Value = serde_json::from_slice(&new.stdout).unwrap();
    assert_eq!(j["limit_per_category"], 2);
    assert_eq!(j["samples_replayed"], 6, "2 of each of the 3 categories");
    let old = run(&["--limit", "2"]);
    assert_eq!(old.status.code(), Some(0));
    let err = common::stderr(&old);
    assert!(
        err.contains("warning: `--limit` is deprecated for verify: say --per-category")
            && err.contains("`--limit 2` here means 2 prompts of each category")
            && err.contains("--per-category 2"),
        "{err}"
    );
    let o: Value = serde_json::from_slice(&old.stdout).unwrap();
    assert_eq!(o["draft"]["accept_length"], j["draft"]["accept_length"]);
    let both = run(&["--limit", "2", "--per-category", "2"]);
    assert_eq!(both.status.code(), Some(2));

    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("t.jsonl");
    let o = kquant(&[
        "trace",
        "prompts",
        "--tokenizer",
        "fixtures/kimi-k2.5-tiny/target",
        "--prompts",
        "fixtures/kimi-k2.5-tiny/prompts/heldout.jsonl",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 60);
    // The old spelling still works, with the deprecation warning.
    let o = kquant(&[
        "trace",
        "prompts",
        "--tokenizer",
        "fixtures/kimi-k2.5-tiny/target",
        "--input",
        "fixtures/kimi-k2.5-tiny/prompts/heldout.jsonl",
        "-o",
        out.to_str().unwrap(),
        "--force",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
    assert!(common::stderr(&o)
        .contains("warning: `--input` is deprecated for trace prompts: say --prompts"));
}

/// `--near-ties MARGIN`: each accept length as the range near-ties span, per request the steps a
/// near-tie decides with the steps range holding the replay's own; a margin past every gap turns
/// every accepted proposal into a miss (AL exactly 1). Bad margins, a prompt-lookup baseline and
/// a device argmax (no margins) are refused.
#[test]
fn near_ties_bound_the_replay_and_are_refused_where_unknown() {
    let fx = "fixtures/kimi-k2.5-tiny";
    // `verify` on two prompts of each category, `extra` added; `json`: the report on stdout.
    let verify = |draft: &str, extra: &[&str], json: bool| {
        let mut a = vec![
            "verify",
            "--draft",
            draft,
            "--trace",
            "fixtures/kimi-k2.5-tiny/trace",
            "--target-checkpoint",
            "fixtures/kimi-k2.5-tiny/target",
            "--per-category",
            "2",
        ];
        a.extend_from_slice(extra);
        if json {
            a.extend(["--json", "-"]);
        }
        kquant(&a)
    };
    let run = |draft: &str, extra: &[&str]| verify(draft, extra, true);
    for draft in [format!("{fx}/eagle3"), format!("{fx}/dflash")] {
        let o = run(&draft, &["--baseline", &draft, "--near-ties", "0.03"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let j: Value = serde_json::from_slice(&o.stdout).unwrap();
        let n = &j["near_ties"];
        assert_eq!(n["margin"], 0.03);
        let (lo, hi) = (
            n["draft"]["accept_length"][0].as_f64().unwrap(),
            n["draft"]["accept_length"][1].as_f64().unwrap(),
        );
        let al = j["draft"]["accept_length"].as_f64().unwrap();
        assert!(lo <= al && al <= hi, "{draft}: {lo} <= {al} <= {hi}");
        assert_eq!(
            n["draft"], n["baseline"],
            "{draft}: the same draft both sides"
        );
        let d = n["delta"].as_array().unwrap();
        assert!(d[0].as_f64().unwrap() <= 0.0 && d[1].as_f64().unwrap() >= 0.0);
        let reqs = j["draft"]["requests"].as_array().unwrap();
        let mut with = 0;
        for r in reqs {
            let (s, range) = (r["steps"].as_u64().unwrap(), &r["steps_range"]);
            assert!(
                range[0].as_u64().unwrap() <= s && s <= range[1].as_u64().unwrap(),
                "{r}"
            );
            with += (r["near_tie_steps"].as_u64().unwrap() > 0) as usize;
        }
        assert_eq!(n["draft"]["requests_with_ties"], with);
        // The table says it too.
        let t = verify(
            &draft,
            &["--baseline", &draft, "--near-ties", "0.03"],
            false,
        );
        let out = String::from_utf8_lossy(&t.stdout);
        assert!(
            out.contains(
                "near-ties (logits within 0.03 of the runner-up) can move: draft AL (walk) ["
            ) && out.contains("; Δ ["),
            "{out}"
        );
        // Every gap is below 1e9: down, every accepted proposal misses.
        let o = run(&draft, &["--near-ties", "1e9"]);
        let j: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(j["near_ties"]["draft"]["accept_length"][0], 1.0, "{draft}");
        // Without the flag, nothing about near-ties.
        let o = run(&draft, &[]);
        let j: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(
            j.get("near_ties").is_none() && j["draft"]["requests"][0].get("steps_range").is_none()
        );
    }
    let eagle = format!("{fx}/eagle3");
    for (extra, says) in [
        (
            vec!["--near-ties", "0"],
            "`0` is not a positive logit margin",
        ),
        (
            vec!["--near-ties", "nan"],
            "`nan` is not a positive logit margin",
        ),
        (
            vec!["--near-ties", "0.03", "--baseline", "prompt-lookup"],
            "--near-ties needs logit margins, and a prompt-lookup baseline has no logits",
        ),
        (
            vec!["--near-ties", "0.03", "--device", "cpu-emu"],
            "--near-ties needs the logit margins the CPU replay keeps; --device cpu-emu",
        ),
    ] {
        let o = run(&eagle, &extra);
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {e}");
        assert!(e.contains(says) && e.contains("hint:"), "{extra:?}: {e}");
    }
}

const KL: &str = "fixtures/kimi-linear-tiny";

/// `verify` of the Kimi-Linear DFlash drafter over the first 2 samples of each category of
/// its committed trace, with `extra` flags: (exit code, JSON report, stderr).
fn kl_verify(extra: &[&str]) -> (Option<i32>, Value, String) {
    let mut a = vec!["verify"];
    if !extra.contains(&"--draft") {
        a.extend(["--draft", "fixtures/kimi-linear-tiny/dflash"]);
    }
    a.extend([
        "--target-checkpoint",
        "fixtures/kimi-linear-tiny/target",
        "--json",
        "-",
    ]);
    if !extra.contains(&"--per-category") {
        a.extend(["--per-category", "2"]);
    }
    if !extra.contains(&"--trace") {
        a.extend(["--trace", "fixtures/kimi-linear-tiny/trace"]);
    }
    a.extend(extra);
    let o = kquant(&a);
    let r = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o.status.code(), r, common::stderr(&o))
}

/// #38.14: a DFlash drafter's teacher-forced all-positions AL is compared, not only shown: the
/// baseline's, the paired Δ and its interval, overall and per category, in the JSON, the table
/// and the JUnit.
#[test]
fn all_positions_delta_is_reported_beside_the_walk_with_its_interval() {
    let t = tempfile::tempdir().unwrap();
    let junit = t.path().join("j.xml");
    let (code, r, err) = kl_verify(&[
        "--baseline",
        "prompt-lookup",
        "--junit",
        junit.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let f = |v: &Value| v.as_f64().unwrap_or_else(|| panic!("{r}"));
    let (d, b) = (
        f(&r["draft"]["accept_length_all_positions"]),
        f(&r["baseline"]["accept_length_all_positions"]),
    );
    let delta = f(&r["delta_all_positions"]);
    assert!((delta - (d - b)).abs() < 1e-9, "{delta} vs {d} - {b}");
    assert!(
        delta.abs() > 1e-3,
        "the drafter and prompt lookup differ: {delta}"
    );
    let ci = &r["ci95_all_positions"];
    assert!(f(&ci[0]) <= delta && delta <= f(&ci[1]), "{ci}");
    assert_eq!(r["gated_on"], "accept_length");
    for (c, v) in r["per_category"].as_object().unwrap() {
        let dd = f(&v["draft_all_positions"]) - f(&v["baseline_all_positions"]);
        assert!((f(&v["delta_all_positions"]) - dd).abs() < 1e-9, "{c}: {v}");
        assert!(v["ci95_all_positions"].is_array(), "{c}: {v}");
    }
    let x = std::fs::read_to_string(&junit).unwrap();
    assert!(
        x.contains("<property name=\"delta_all_positions\" value=")
            && x.contains("<property name=\"baseline_accept_length_all_positions\" value=")
            && x.contains("<property name=\"ci95_all_positions_low\" value=")
            && x.contains("draft AL (all-positions, teacher-forced) "),
        "{x}"
    );
    // The table: a teacher-forced block with the baseline, Δ and interval, each line naming
    // its count.
    let o = kquant(&[
        "verify",
        "--draft",
        "fixtures/kimi-linear-tiny/dflash",
        "--target-checkpoint",
        "fixtures/kimi-linear-tiny/target",
        "--per-category",
        "2",
        "--trace",
        "fixtures/kimi-linear-tiny/trace",
        "--baseline",
        "prompt-lookup",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("all-positions AL: teacher-forced")
            && out.contains(&format!("{delta:.3}"))
            && out.contains(&format!("{b:.3}"))
            && out.contains("all-positions ΔAL 95% CI (paired bootstrap over prompts): ["),
        "{out}"
    );
    // #38.23: the label the Kimi-Linear profile says verify prints the card's figure under is
    // one the table prints.
    let t = common::kquant_json(&["targets", "kimi-linear-48b-a3b", "--json"]);
    let note = t.to_string();
    let label = note
        .split("prints it as the `")
        .nth(1)
        .and_then(|x| x.split('`').next())
        .unwrap_or_else(|| panic!("the profile names the label: {note}"));
    assert!(out.contains(label), "`{label}` is not printed:\n{out}");
}

/// #38.14: `--gate-on all-positions` judges the teacher-forced figure: a `--min-accept` between
/// the walked AL and the all-positions one fails the default gate and passes this one; live it
/// is refused.
#[test]
fn gate_on_all_positions_judges_the_teacher_forced_figure() {
    let (code, r, err) = kl_verify(&["--min-accept", "3.3"]);
    let walk = r["draft"]["accept_length"]
        .as_f64()
        .unwrap_or_else(|| panic!("{err}"));
    let allpos = r["draft"]["accept_length_all_positions"].as_f64().unwrap();
    assert!(walk < 3.3 && 3.3 < allpos, "{walk} {allpos}");
    assert_eq!(code, Some(1), "{err}");
    let (code, r, err) = kl_verify(&["--min-accept", "3.3", "--gate-on", "all-positions"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(r["gated_on"], "accept_length_all_positions");
    let (code, r, _) = kl_verify(&[
        "--min-accept",
        &format!("{:.3}", allpos + 0.1),
        "--gate-on",
        "all-positions",
    ]);
    assert_eq!(code, Some(1));
    assert!(
        r["reasons"][0]
            .as_str()
            .unwrap()
            .starts_with("all-positions accept length (teacher-forced)"),
        "{r}"
    );
    let o = kquant(&[
        "verify",
        "--endpoint",
        "http://127.0.0.1:9",
        "--gate-on",
        "all-positions",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = common::stderr(&o);
    assert!(
        e.starts_with("error:") && e.contains("--gate-on all-positions") && e.contains("hint:"),
        "{e}"
    );
}

/// #38.14: `--published` offline holds the card's teacher-forced figure against the
/// all-positions AL, and is refused (exit 2, before any replay) where there is none to hold:
/// never ignored.
#[test]
fn published_offline_holds_a_teacher_forced_card_figure_or_is_refused() {
    let t = tempfile::tempdir().unwrap();
    // The fixture's trace as a Math500 capture, and a profile quoting a teacher-forced Math500
    // figure and an engine's one for the tiny drafter.
    let tr = t.path().join("trace");
    std::fs::create_dir(&tr).unwrap();
    let src = root().join(KL).join("trace");
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tr.join(e.file_name())).unwrap();
    }
    let mut m: Value =
        serde_json::from_slice(&std::fs::read(tr.join("manifest.json")).unwrap()).unwrap();
    for s in m["samples"].as_array_mut().unwrap() {
        s["dataset"] = "math500".into();
    }
    std::fs::write(tr.join("manifest.json"), m.to_string()).unwrap();
    let profile = |figures: Value| {
        let mut p: Value = serde_json::from_slice(
            &std::fs::read(root().join("quant-configs/targets/kimi-linear-tiny.json")).unwrap(),
        )
        .unwrap();
        p["published_accept_lengths"] = figures;
        let f = t.path().join("profile.json");
        std::fs::write(&f, p.to_string()).unwrap();
        f.to_str().unwrap().to_string()
    };
    let fig = |engine: &str, al: &str| {
        serde_json::json!({"draft": "tiny/dflash", "family": "dflash", "benchmark": "MATH-500",
            "n": 60, "accept_length": al, "engine": engine, "draft_length": "block_size=8",
            "source": "a test"})
    };
    let p = profile(serde_json::json!([fig(
        "none: offline teacher-forced; greedy",
        "9.5"
    )]));
    let trs = tr.to_str().unwrap();
    let (code, r, err) = kl_verify(&["--trace", trs, "--target", &p, "--published", "tiny/dflash"]);
    assert_eq!(code, Some(1), "{err}");
    let c = &r["published"][0];
    assert_eq!(c["count"], "accept_length_all_positions", "{r}");
    assert_eq!(c["measured"], r["draft"]["accept_length_all_positions"]);
    assert_eq!(c["passed"], false);
    assert!(
        r["reasons"][0]
            .as_str()
            .unwrap()
            .contains("all-positions accept length (teacher-forced)"),
        "{r}"
    );
    let p = profile(serde_json::json!([fig(
        "none: offline teacher-forced; greedy",
        "1.5"
    )]));
    let (code, r, err) = kl_verify(&["--trace", trs, "--target", &p, "--published", "tiny/dflash"]);
    assert_eq!(
        (code, &r["published"][0]["passed"]),
        (Some(0), &Value::Bool(true)),
        "{err}"
    );
    // An engine's figure only: another count, refused offline.
    let p = profile(serde_json::json!([fig("vLLM 0.32, H100", "1.5")]));
    let (code, _, err) = kl_verify(&["--trace", trs, "--target", &p, "--published", "tiny/dflash"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("quotes no offline teacher-forced accept length") && err.contains("hint:"),
        "{err}"
    );
    // Prompts that are no benchmark: refused.
    let (code, _, err) = kl_verify(&["--target", "kimi-linear-tiny", "--published", "tiny/dflash"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no benchmark"), "{err}");
}

/// #38.24: docs/verify.md states a live-vs-offline ΔAL bound only with the prompt count it was
/// measured on (0.02 held on the tier's 60 prompts; 24 other prompts gave 0.042).
#[test]
fn docs_state_the_bf16_bound_with_its_prompt_count() {
    let doc = std::fs::read_to_string(root().join("docs/verify.md")).unwrap();
    let flat = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut bounds = 0;
    for sentence in flat.split(". ") {
        let states = sentence.contains("ΔAL within 0.02") || sentence.contains("bound: 0.02");
        if states {
            bounds += 1;
            assert!(
                sentence.contains("60 prompts"),
                "a bound stated without its prompt count: {sentence}"
            );
        }
    }
    assert!(bounds > 0, "the tier's bound is stated somewhere");
    assert!(flat.contains("0.02 is these 60 prompts' bound, not a general one"));
    assert!(flat.contains("0.042 apart"));
}

/// #38.23: docs/verify.md's Kimi-Linear fixture figures are the binary's: the DFlash drafter
/// (block 8 and `--steps 3`) and the prompt-lookup baseline at the same depths, walk, per
/// category and all-positions, over the whole held-out trace.
#[test]
fn docs_kimi_linear_fixture_figures_are_the_binarys() {
    let doc = std::fs::read_to_string(root().join("docs/verify.md")).unwrap();
    let section = &doc[doc
        .find("`fixtures/kimi-linear-tiny/` (README there")
        .expect("the Kimi-Linear fixture's paragraph")..];
    let row = |name: &str| -> Vec<String> {
        let l = section
            .lines()
            .find(|l| l.starts_with(&format!("| {name} |")))
            .unwrap_or_else(|| panic!("docs/verify.md has no `{name}` row"));
        l.split('|')
            .map(|c| c.trim().trim_matches('*').to_string())
            .filter(|c| !c.is_empty())
            .collect()
    };
    for (name, steps) in [
        ("DFlash (block 8)", None),
        (
            "DFlash, `--steps 3` (a block of 4 rows, as vLLM runs it)",
            Some("3"),
        ),
    ] {
        let cells = row(name);
        let mut a = vec!["--baseline", "prompt-lookup", "--per-category", "1000"];
        if let Some(k) = steps {
            a.extend(["--steps", k]);
        }
        let (code, r, err) = kl_verify(&a);
        assert_eq!(code, Some(0), "{err}");
        let f = |v: &Value| format!("{:.3}", v.as_f64().unwrap());
        let got = [
            r["steps"].to_string(),
            f(&r["draft"]["accept_length"]),
            f(&r["per_category"]["code"]["draft"]),
            f(&r["per_category"]["prose"]["draft"]),
            f(&r["per_category"]["arith"]["draft"]),
            f(&r["draft"]["accept_length_all_positions"]),
            f(&r["baseline"]["accept_length"]),
        ];
        assert_eq!(
            cells[1..],
            got[..],
            "docs/verify.md `{name}` row vs the binary"
        );
    }
}

/// #38.23: docs/verify.md's DFlash block-size range is the one the replay takes (2..=33).
#[test]
fn docs_dflash_block_sizes_are_the_replays() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("d");
    std::fs::create_dir(&d).unwrap();
    let src = root().join("fixtures/kimi-linear-tiny/dflash");
    std::fs::copy(src.join("model.safetensors"), d.join("model.safetensors")).unwrap();
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    cfg["block_size"] = 34.into();
    std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
    let (code, _, err) = kl_verify(&["--draft", d.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("2..=33"), "{err}");
    let doc = std::fs::read_to_string(root().join("docs/verify.md")).unwrap();
    let flat = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("block sizes 2 to 33"),
        "docs/verify.md states the range the replay takes"
    );
    assert!(!flat.contains("block sizes up to 9"));
}

/// #38.23: a conditional per-depth rate is undefined (null, `-` in the table) where no position
/// had its earlier depths all accepted, not 0.
#[test]
fn an_undefined_conditional_rate_is_none_not_zero() {
    let w = kquant::verify::walk::Walk {
        cond_den: vec![10, 0, 0],
        cond_num: vec![0, 0, 0],
        ..Default::default()
    };
    assert_eq!(w.conditional(), vec![Some(0.0), None, None]);
}

/// #38.23: a negative `--near-ties` is refused by its own check (a message and a hint), not
/// taken for an unknown flag.
#[test]
fn a_negative_near_tie_margin_is_refused_by_name() {
    let (code, _, err) = kl_verify(&["--near-ties", "-1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("not a positive logit margin") && err.contains("hint:"),
        "{err}"
    );
    let o = kquant(&["trace", "capture", "--lookahead", "-1"]);
    let err = common::stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("`-1` is out of range") && err.contains("--lookahead"),
        "{err}"
    );
}

/// #38.23: a calibration that stops before its replay (here: no target embedding for the draft)
/// draws no `calibrate 0/0` bar on a terminal, only the error.
#[test]
fn no_calibration_bar_before_its_replay_starts() {
    let bin = env!("CARGO_BIN_EXE_kquant");
    let t = tempfile::tempdir().unwrap();
    let o = std::process::Command::new("script")
        .current_dir(root())
        .env("TERM", "xterm")
        .args([
            "-qec",
            &format!(
                "{bin} quantize fixtures/kimi-k2.5-tiny/eagle3 -o {} --scheme int4-pc --exclude fc,lm_head --method search --calibrate fixtures/kimi-k2.5-tiny/trace",
                t.path().join("q").display()
            ),
            "/dev/null",
        ])
        .output()
        .expect("script (util-linux) runs the binary on a pseudo-terminal");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("error:") && out.contains("--target-checkpoint"),
        "{out}"
    );
    assert!(!out.contains("0/0"), "a bar before any work: {out}");
}

/// #38.23: a draft of another target (the Kimi-K2.5 fixture's DFlash drafter on the Kimi-Linear
/// trace) is named as one, with that target, not as a trace lacking taps.
#[test]
fn a_draft_of_another_target_is_named_as_one() {
    let (code, _, err) = kl_verify(&["--draft", "fixtures/kimi-k2.5-tiny/dflash"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.starts_with("error:")
            && err.contains("target `kimi-k2.5-tiny`'s dflash taps")
            && err.contains("a draft of that target")
            && err.contains("hint: verify a draft on a trace of its own target"),
        "{err}"
    );
    // A draft of this target still replays.
    let (code, _, err) = kl_verify(&[]);
    assert_eq!(code, Some(0), "{err}");
}

/// #38.23: the target-profile facts docs/verify.md calls unknown are the ones `kquant targets`
/// does not know (Kimi-Linear's layer count and hidden size are cited).
#[test]
fn docs_unknown_profile_facts_are_the_binarys() {
    let doc = std::fs::read_to_string(root().join("docs/verify.md")).unwrap();
    let flat = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    let bullet = flat
        .split("are `\"unknown\"`.** That covers")
        .nth(1)
        .expect("the unknown-facts bullet");
    let covers = &bullet[..bullet.find(['(', '.']).unwrap_or(bullet.len())];
    let t = common::kquant_json(&["targets", "--json"]);
    for (profile, said) in [
        ("kimi-k2.6", "K2.6"),
        ("kimi-linear-48b-a3b", "Kimi-Linear"),
    ] {
        let p = t["targets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == profile)
            .unwrap_or_else(|| panic!("{profile}"));
        for (field, words) in [
            ("num_layers", "layer count"),
            ("hidden_size", "hidden size"),
            ("vocab_size", "vocabulary"),
        ] {
            let known = p[field].is_number();
            let claims = covers.contains(&format!("{said}'s {words}"))
                || (covers.contains(&format!("{said}'s "))
                    && covers
                        .split(&format!("{said}'s "))
                        .nth(1)
                        .is_some_and(|r| r.split(',').next().unwrap_or("").contains(words)));
            assert!(
                !(known && claims),
                "docs/verify.md calls {said}'s {words} unknown; `kquant targets` has {}",
                p[field]
            );
        }
    }
}

/// #38.23: docs/verify.md's proposal-agreement example (the tiny EAGLE-3 `int4-pc`, RTN and the
/// scale search calibrated on the held-out trace, against the BF16 draft on it) is the
/// binary's: the agreements, the ΔAL and the positions compared.
#[test]
fn docs_agreement_figures_are_the_binarys() {
    let t = tempfile::tempdir().unwrap();
    let f = "fixtures/kimi-k2.5-tiny";
    let doc = std::fs::read_to_string(root().join("docs/verify.md")).unwrap();
    let flat = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut said = Vec::new();
    for (name, extra) in [
        ("rtn", vec![]),
        (
            "search",
            vec![
                "--method",
                "search",
                "--calibrate",
                "fixtures/kimi-k2.5-tiny/trace",
                "--target-checkpoint",
                "fixtures/kimi-k2.5-tiny/target",
            ],
        ),
    ] {
        let q = t.path().join(name);
        let mut a = vec![
            "quantize",
            "fixtures/kimi-k2.5-tiny/eagle3",
            "-o",
            q.to_str().unwrap(),
            "--scheme",
            "int4-pc",
            "--exclude",
            "fc,lm_head",
        ];
        a.extend(extra);
        let o = kquant(&a);
        assert!(o.status.success(), "{}", common::stderr(&o));
        let r = common::kquant_json(&[
            "verify",
            "--draft",
            q.to_str().unwrap(),
            "--baseline",
            &format!("{f}/eagle3"),
            "--trace",
            &format!("{f}/trace"),
            "--target-checkpoint",
            &format!("{f}/target"),
            "--max-regression",
            "1000",
            "--json",
            "-",
        ]);
        let compared: u64 = r["agreement"]["compared"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_u64().unwrap())
            .sum();
        assert!(
            flat.contains(&format!(
                "({} {:03} depth positions compared",
                compared / 1000,
                compared % 1000
            )),
            "docs/verify.md: positions compared {compared}"
        );
        said.push((
            format!("{:.3}", r["agreement"]["overall"].as_f64().unwrap()),
            format!("{:.3}", r["delta"].as_f64().unwrap()).replace('-', "−"),
        ));
    }
    let sentence = format!(
        "RTN agrees at {} and the scale search, calibrated on that same trace, at {}, while their ΔAL ({} and {})",
        said[0].0, said[1].0, said[0].1, said[1].1
    );
    assert!(
        flat.contains(&sentence),
        "docs/verify.md should say: {sentence}"
    );
}
