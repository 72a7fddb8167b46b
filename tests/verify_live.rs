//! `verify` against the live fixture target (kimi-k2.5-tiny): the engine's speculative loop run
//! directly with the Rust target and each trained draft commits exactly the trace's tokens in
//! exactly the rounds the offline replay counts (and the PyTorch engine simulation counted);
//! `verify --target kimi-k2.5-tiny` captures its own trace; profiles check traces.

use crate::common;

use std::path::PathBuf;

use common::{kquant, read_json, root};
use kquant::checkpoint::Checkpoint;
use kquant::replay::load_drafter;
use kquant::runtime::target::Target;
use kquant::trace::file::Trace;
use kquant::verify::sim::simulate;
use kquant::verify::walk::walk;

fn fix(p: &str) -> PathBuf {
    root().join("fixtures/kimi-k2.5-tiny").join(p)
}

fn kl(p: &str) -> PathBuf {
    root().join("fixtures/kimi-linear-tiny").join(p)
}

/// One per category of the samples engine_sim.py simulated (it ran 0, 1, 20, 21, 40, 41; the
/// loop re-runs the target over the whole sequence every round, so the test keeps three).
const SAMPLES: [u64; 3] = [0, 20, 40];

#[test]
fn engine_loop_with_the_rust_target_equals_the_replay() {
    engine_loop_equals_replay(fix, &["eagle3", "eagle3-mla", "dflash"]);
}

/// The same with the Kimi-Linear target (KDA state carried through the loop's re-runs) and its
/// DFlash drafter.
#[test]
fn kimi_linear_engine_loop_equals_the_replay() {
    engine_loop_equals_replay(kl, &["dflash"]);
}

fn engine_loop_equals_replay(fix: fn(&str) -> PathBuf, drafts: &[&str]) {
    let tck = Checkpoint::open(&fix("target").to_string_lossy()).unwrap();
    let target = Target::load(&tck).unwrap();
    let trace = Trace::open(&fix("trace")).unwrap();
    let py = read_json(&fix("reference/engine-sim.json"));
    for &name in drafts {
        let d = load_drafter(
            &fix(name).to_string_lossy(),
            Some(&tck),
            &kquant::runtime::linears::Exec::F32,
        )
        .unwrap();
        let (mut sim_r, mut sim_c, mut rep_r, mut rep_c) = (0, 0, 0, 0);
        for s in trace
            .manifest
            .samples
            .iter()
            .filter(|s| SAMPLES.contains(&s.id))
        {
            let x = trace.tokens(s).unwrap();
            let p = s.prompt_len;
            // engine_sim.py's steps: 3 for EAGLE-3, the whole block for DFlash.
            let k = d.default_steps();
            let sim = simulate(&target, d.as_ref(), &x[..p], s.gen_len, k).unwrap();
            assert_eq!(sim.tokens, x, "{name} sample {}: tokens", s.id);
            let taps: Vec<Vec<f32>> = d.taps().iter().map(|&t| trace.tap(s, t).unwrap()).collect();
            let w = walk(&d.matches(&x, &taps, p, k));
            assert_eq!(
                (sim.rounds, sim.committed),
                (w.rounds, w.committed),
                "{name} sample {}: engine loop vs replay",
                s.id
            );
            let pys = py[name]["samples"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["id"].as_u64() == Some(s.id))
                .unwrap();
            assert_eq!(
                (sim.rounds, sim.committed),
                (
                    pys["rounds"].as_u64().unwrap(),
                    pys["committed"].as_u64().unwrap()
                ),
                "{name} sample {}: vs engine_sim.py",
                s.id
            );
            let acc: Vec<usize> = pys["accepts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            assert_eq!(sim.accepted, acc, "{name} sample {}: accepts", s.id);
            (sim_r, sim_c) = (sim_r + sim.rounds, sim_c + sim.committed);
            (rep_r, rep_c) = (rep_r + w.rounds, rep_c + w.committed);
        }
        assert!(sim_r > 0 && (sim_r, sim_c) == (rep_r, rep_c));
        eprintln!(
            "{name}: engine loop AL {:.4} = replay AL {:.4} over {} samples",
            sim_c as f64 / sim_r as f64,
            rep_c as f64 / rep_r as f64,
            SAMPLES.len()
        );
    }
}

#[test]
fn verify_with_the_live_profile_needs_no_trace() {
    let d = fix("eagle3");
    let out = kquant(&[
        "verify",
        "--target",
        "kimi-k2.5-tiny",
        "--draft",
        d.to_str().unwrap(),
        "--baseline",
        d.to_str().unwrap(),
        "--limit",
        "1",
        "--json",
        "-",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["trace"], "live capture");
    assert_eq!(r["target"], "kimi-k2.5-tiny");
    assert_eq!(r["delta"].as_f64(), Some(0.0));
    // One sample per category, each captured live from its held-out prompt: the same tokens
    // as the committed trace, so the same accept length as replaying it.
    let cats = r["per_category"].as_object().unwrap();
    assert_eq!(cats.len(), 3, "{r}");
    let from_trace = kquant(&[
        "verify",
        "--target",
        "kimi-k2.5-tiny",
        "--trace",
        fix("trace").to_str().unwrap(),
        "--draft",
        d.to_str().unwrap(),
        "--limit",
        "1",
        "--json",
        "-",
    ]);
    assert_eq!(from_trace.status.code(), Some(0));
    let t: serde_json::Value = serde_json::from_slice(&from_trace.stdout).unwrap();
    assert_eq!(t["draft"]["accept_length"], r["draft"]["accept_length"]);
}

#[test]
fn a_trace_of_another_target_or_no_trace_is_refused() {
    let d = fix("eagle3");
    let wrong = kquant(&[
        "verify",
        "--target",
        "kimi-k2.5",
        "--trace",
        fix("trace").to_str().unwrap(),
        "--draft",
        d.to_str().unwrap(),
    ]);
    assert_eq!(wrong.status.code(), Some(2));
    let e = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        e.contains("was not captured from target `kimi-k2.5`") && e.contains("hidden size 256"),
        "{e}"
    );
    let none = kquant(&[
        "verify",
        "--target",
        "kimi-k2.5",
        "--draft",
        d.to_str().unwrap(),
    ]);
    assert_eq!(none.status.code(), Some(2));
    let ne = String::from_utf8_lossy(&none.stderr);
    assert!(ne.contains("trace import"), "{ne}");
}

/// `verify --target kimi-linear-tiny` runs the KDA target live (a capture of one held-out prompt
/// per category), the same accept length as replaying the committed trace; and it gates
/// quantized drafters, RTN and GPTQ (calibrated on a trace `trace capture` takes from the
/// Kimi-Linear target over calibration prompts).
#[test]
fn kimi_linear_live_verify_gates_quantized_drafters() {
    let d = kl("dflash");
    let t = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let o = kquant(args);
        assert!(
            matches!(o.status.code(), Some(0) | Some(1)),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (
            o.status.code(),
            v,
            String::from_utf8_lossy(&o.stderr).to_string(),
        )
    };
    let verify = |draft: &std::path::Path, trace: Option<&std::path::Path>| {
        let mut a = vec![
            "verify".to_string(),
            "--target".into(),
            "kimi-linear-tiny".into(),
            "--draft".into(),
            draft.display().to_string(),
            "--baseline".into(),
            d.display().to_string(),
            "--limit".into(),
            "1".into(),
            "--json".into(),
            "-".into(),
        ];
        if let Some(tr) = trace {
            a.extend(["--trace".into(), tr.display().to_string()]);
        }
        run(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let (code, live, _) = verify(&d, None);
    assert_eq!(code, Some(0));
    assert_eq!(live["trace"], "live capture");
    assert_eq!(live["target"], "kimi-linear-tiny");
    assert_eq!(live["delta"].as_f64(), Some(0.0));
    assert_eq!(live["per_category"].as_object().unwrap().len(), 3);
    let (_, committed, _) = verify(&d, Some(&kl("trace")));
    assert_eq!(
        committed["draft"]["accept_length"],
        live["draft"]["accept_length"]
    );
    assert!(
        live["draft"]["accept_length"].as_f64().unwrap() > 1.5,
        "{live}"
    );

    let cal = t.path().join("cal");
    let o = kquant(&[
        "trace",
        "capture",
        "--target-checkpoint",
        kl("target").to_str().unwrap(),
        "--prompts",
        root()
            .join("fixtures/kimi-k2.5-tiny/prompts/calibration.jsonl")
            .to_str()
            .unwrap(),
        "--taps",
        "2,3",
        "--limit",
        "6",
        "--gen-len",
        "48",
        "-o",
        cal.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m = read_json(&cal.join("manifest.json"));
    assert_eq!(m["num_layers"], 4);
    assert_eq!(m["greedy_selfcheck"], 0);
    for (name, extra) in [
        ("rtn", vec![]),
        (
            "gptq",
            vec![
                "--method",
                "gptq",
                "--calibrate",
                cal.to_str().unwrap(),
                "--target-checkpoint",
                kl("target").to_str().unwrap(),
            ],
        ),
    ] {
        let q = t.path().join(name);
        let mut a = vec![
            "quantize",
            d.to_str().unwrap(),
            "-o",
            q.to_str().unwrap(),
            "--scheme",
            "int4-pc",
            "--exclude",
            "fc",
        ];
        a.extend(extra);
        let o = kquant(&a);
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let (code, r, _) = verify(&q, None);
        let al = r["draft"]["accept_length"].as_f64().unwrap();
        let base = r["baseline"]["accept_length"].as_f64().unwrap();
        eprintln!("kimi-linear-tiny dflash {name} int4-pc: AL {al:.4} vs {base:.4}, exit {code:?}");
        assert_eq!(r["trace"], "live capture");
        assert_eq!(
            r["baseline"]["accept_length"],
            live["draft"]["accept_length"]
        );
        assert_eq!(code, Some(if r["passed"] == true { 0 } else { 1 }), "{r}");
    }
}

/// Both drafts are opened and the flag combinations checked before the live capture: a
/// mistyped `--draft` or `--baseline`, or `--near-ties` beside a device replay or a
/// prompt-lookup baseline, is exit 2 before a single prompt is captured (issue 38, item 16).
#[test]
fn verify_checks_drafts_and_flags_before_capturing() {
    let d = fix("eagle3");
    let d = d.to_str().unwrap();
    let missing = root().join("fixtures/kimi-k2.5-tiny/no-such-draft");
    let missing = missing.to_str().unwrap();
    for (extra, says) in [
        (vec!["--draft", missing], "no-such-draft"),
        (vec!["--draft", d, "--baseline", missing], "no-such-draft"),
        (
            vec!["--draft", d, "--near-ties", "0.5", "--device", "cpu-emu"],
            "--device cpu-emu",
        ),
        (
            vec![
                "--draft",
                d,
                "--near-ties",
                "0.5",
                "--baseline",
                "prompt-lookup",
            ],
            "prompt-lookup baseline has no logits",
        ),
    ] {
        let mut args = vec!["verify", "--target", "kimi-k2.5-tiny", "--limit", "1"];
        args.extend(&extra);
        let out = kquant(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(
            err.contains(says) && err.contains("hint:"),
            "{extra:?}: {err}"
        );
        assert!(
            !err.contains("capturing"),
            "{extra:?}: the capture ran first: {err}"
        );
    }
}

/// A live verify interrupted (SIGINT) during its capture leaves nothing in `$TMPDIR`: no
/// partial trace, no lock, no empty directory (issue 38, adversary's extras).
#[test]
fn an_interrupted_live_verify_leaves_nothing_in_tmpdir() {
    use std::io::Write;
    use std::os::unix::process::ExitStatusExt;
    let t = tempfile::tempdir().unwrap();
    let tmp = t.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    // Enough prompts that the capture is still running when the signal comes.
    let src = std::fs::read_to_string(fix("prompts/heldout.jsonl")).unwrap();
    let mut f = std::fs::File::create(t.path().join("many.jsonl")).unwrap();
    let mut id = 0;
    for _ in 0..100 {
        for l in src.lines() {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["id"] = serde_json::json!(id);
            id += 1;
            writeln!(f, "{v}").unwrap();
        }
    }
    drop(f);
    let d = fix("eagle3");
    let mut child = common::kquant_cmd()
        .args([
            "verify",
            "--target",
            "kimi-k2.5-tiny",
            "--draft",
            d.to_str().unwrap(),
            "--prompts",
            t.path().join("many.jsonl").to_str().unwrap(),
        ])
        .env("TMPDIR", &tmp)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The capture has begun once its partial output is in $TMPDIR (at any depth).
    fn partial(dir: &std::path::Path) -> bool {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                e.file_name().to_string_lossy().ends_with(".kquant-partial")
                    || (e.file_type().is_ok_and(|t| t.is_dir()) && partial(&e.path()))
            })
    }
    let t0 = std::time::Instant::now();
    while !partial(&tmp) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "verify ended before its capture began"
        );
        assert!(t0.elapsed().as_secs() < 300, "no capture began");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let st = child.wait().unwrap();
    assert_eq!(st.signal(), Some(libc::SIGINT), "{st:?}");
    let left: Vec<String> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "left in $TMPDIR: {left:?}");
}
