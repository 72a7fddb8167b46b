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
    // The gate, the overall regression threshold and two categories, all passing.
    assert!(
        x.contains("tests=\"4\" failures=\"0\"")
            && x.contains("name=\"gate\"")
            && x.contains("name=\"category code\"")
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
    // No baseline: the gate and --min-accept testcases fail, with the draft's AL in the message.
    let x = std::fs::read_to_string(&junit).unwrap();
    assert!(x.contains("failures=\"2\""), "{x}");
    assert!(
        x.contains("name=\"overall: accept length at least 3.99\"")
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
    let o = std::process::Command::new("script")
        .current_dir(root())
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
            out.contains("near-ties (logits within 0.03 of the runner-up) can move: draft AL [")
                && out.contains("; Δ ["),
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
