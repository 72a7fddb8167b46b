//! `kquant sensitivity` (#16): each module group quantized alone and every group together,
//! measured through the real binary on the trained tiny EAGLE-3 draft; every figure it reports
//! must be what `kquant quantize` (the same recipe, written to disk) followed by `kquant verify`
//! against the original measures, calibrated methods included; `--pick`'s preset must
//! reproduce its measurement and pass the gate through `quantize --config`; and the refusals.

use crate::common;

use std::path::Path;

use common::{kquant, root, stderr};
use serde_json::Value;

const FIX: &str = "fixtures/kimi-k2.5-tiny";

fn fix(p: &str) -> String {
    root().join(FIX).join(p).display().to_string()
}

/// `kquant sensitivity` of the EAGLE-3 draft on the fixture trace, then `extra`.
fn sensitivity(extra: &[&str]) -> std::process::Output {
    let (e, tr, tc) = (fix("eagle3"), fix("trace"), fix("target"));
    let mut a = vec![
        "sensitivity",
        &e,
        "--trace",
        &tr,
        "--target-checkpoint",
        &tc,
    ];
    a.extend(extra);
    kquant(&a)
}

/// [`sensitivity`], exit 0, its JSON.
fn sensitivity_json(extra: &[&str]) -> Value {
    let mut a = extra.to_vec();
    a.push("--json");
    let o = sensitivity(&a);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `quantize eagle3 -o OUT ARGS…` then `verify` OUT against eagle3 over the first `limit`
/// samples per category: the verify JSON.
fn quantize_and_verify(out: &Path, args: &[&str], limit: &str) -> Value {
    let o = out.display().to_string();
    let e = fix("eagle3");
    let mut q = vec!["quantize", &e, "-o", &o];
    q.extend(args);
    let r = kquant(&q);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    let (t, tc) = (fix("trace"), fix("target"));
    let r = kquant(&[
        "verify",
        "--draft",
        &o,
        "--baseline",
        &e,
        "--trace",
        &t,
        "--target-checkpoint",
        &tc,
        "--limit",
        limit,
        "--max-regression",
        "1000",
        "--json",
    ]);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    serde_json::from_slice(&r.stdout).unwrap()
}

fn same(m: &Value, v: &Value, what: &str) {
    assert_eq!(m["delta"], v["delta"], "{what}: ΔAL");
    assert_eq!(m["ci95"], v["ci95"], "{what}: interval");
    assert_eq!(
        m["accept_length"], v["draft"]["accept_length"],
        "{what}: AL"
    );
    assert_eq!(
        m["agreement"], v["agreement"]["overall"],
        "{what}: agreement"
    );
    assert_eq!(
        m["agreement_per_depth"], v["agreement"]["per_depth"],
        "{what}: agreement per depth"
    );
}

#[test]
fn every_figure_is_what_quantize_and_verify_measure_and_the_pick_passes() {
    let t = tempfile::tempdir().unwrap();
    let preset = t.path().join("picked.json");
    let p = preset.display().to_string();
    let doc = sensitivity_json(&[
        "--limit",
        "6",
        "--pick",
        "--max-regression",
        "0.05",
        "--write-preset",
        &p,
    ]);
    assert_eq!(doc["schema"], "kquant.sensitivity/1");
    assert_eq!(doc["samples"], 18);
    let groups = doc["groups"].as_array().unwrap();
    let names: Vec<&str> = groups
        .iter()
        .map(|g| g["group"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["fc", "lm_head", "down", "gate/up", "q/k/v", "o"]);
    assert_eq!(groups[4]["modules"].as_array().unwrap().len(), 3);
    assert_eq!(doc["every_group"]["quantized"], 9);
    for g in groups {
        let m = &g["measured"];
        assert_eq!(m["quantized"], g["modules"].as_array().unwrap().len());
        assert!(m["delta"].as_f64().unwrap().is_finite());
        let [lo, hi] = [0, 1].map(|i| m["ci95"][i].as_f64().unwrap());
        assert!(lo <= m["delta"].as_f64().unwrap() && m["delta"].as_f64().unwrap() <= hi);
        assert_eq!(m["agreement_per_depth"].as_array().unwrap().len(), 3);
    }

    // Every group quantized = quantize with nothing excluded, then verify.
    let v = quantize_and_verify(&t.path().join("all"), &["--exclude", ""], "6");
    same(&doc["every_group"], &v, "every group");
    // One group alone = quantize with the other groups' patterns excluded.
    let others: Vec<String> = groups
        .iter()
        .filter(|g| g["group"] != "q/k/v")
        .flat_map(|g| g["patterns"].as_array().unwrap().clone())
        .map(|p| p.as_str().unwrap().to_string())
        .collect();
    let v = quantize_and_verify(
        &t.path().join("qkv"),
        &["--exclude", &others.join(",")],
        "6",
    );
    same(&groups[4]["measured"], &v, "q/k/v alone");

    // The pick: its preset, through quantize --config, measures what it reported and passes.
    let pick = &doc["pick"];
    let picked = &pick["picked"];
    assert!(picked.is_object(), "a set meeting 0.05 exists: {pick}");
    assert!(picked["delta"].as_f64().unwrap() >= -0.05);
    assert_eq!(picked["passed"], true);
    let written: Value = serde_json::from_slice(&std::fs::read(&preset).unwrap()).unwrap();
    assert_eq!(written, pick["preset"]);
    let v = quantize_and_verify(&t.path().join("picked"), &["--config", &p], "6");
    same(picked, &v, "picked preset");
    // The trials before it all failed, cheapest first.
    let trials = pick["trials"].as_array().unwrap();
    let costs: Vec<u64> = trials
        .iter()
        .map(|x| x["cost_bytes"].as_u64().unwrap())
        .collect();
    assert!(costs.windows(2).all(|w| w[0] <= w[1]), "{costs:?}");
    if doc["every_group"]["passed"] == true {
        assert!(trials.is_empty());
    } else {
        let (last, before) = trials.split_last().unwrap();
        assert_eq!(&last["measured"], picked);
        assert!(before.iter().all(|x| x["measured"]["passed"] == false));
    }
    // A second run replaces the preset it wrote.
    let o = sensitivity(&[
        "--limit",
        "1",
        "--pick",
        "--max-regression",
        "1000",
        "--write-preset",
        &p,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("every group") && table.contains("picked: leave no further group"),
        "{table}"
    );
}

#[test]
fn calibrated_variants_reuse_the_codes_quantize_writes() {
    let t = tempfile::tempdir().unwrap();
    let (tr, tc) = (fix("trace"), fix("target"));
    let o = sensitivity(&[
        "--limit",
        "3",
        "--exclude",
        "fc,lm_head",
        "--method",
        "gptq",
        "--calibrate",
        &tr,
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("warning: --calibrate is the evaluation --trace"),
        "{}",
        stderr(&o)
    );
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["method"], "gptq");
    let names: Vec<&str> = doc["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["group"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["down", "gate/up", "q/k/v", "o"],
        "--exclude fixes fc and lm_head"
    );
    let v = quantize_and_verify(
        &t.path().join("gptq"),
        &[
            "--exclude",
            "fc,lm_head",
            "--method",
            "gptq",
            "--calibrate",
            &tr,
            "--target-checkpoint",
            &tc,
        ],
        "3",
    );
    same(&doc["every_group"], &v, "gptq, every group");
    assert!(doc["pick"].is_null());
}

#[test]
fn refusals_and_a_pick_that_finds_nothing() {
    let tr = fix("trace");
    let run = |extra: &[&str]| {
        let mut a = vec!["--limit", "1"];
        a.extend(extra);
        sensitivity(&a)
    };
    for (extra, want) in [
        (&["--method", "gptq"][..], "need calibration inputs"),
        (
            &["--calibrate", &tr][..],
            "round to nearest uses no calibration",
        ),
        (&["--exclude", "*"][..], "quantizes no module"),
        (&["--write-preset", "x.json"][..], "--pick"),
        (&["--pick", "--max-trials", "0"][..], "max-trials"),
        (&["--max-regression", "nan"][..], "max-regression"),
    ] {
        let o = run(extra);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{extra:?}: {}", stderr(&o));
    }
    // Asking for an improvement of a whole token: no exclusion set can pass; exit 1.
    let o = run(&["--pick", "--max-regression", "-1"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("picked: none"), "{out}");
}

/// A preset picked on GPTQ's codes records the method: `quantize --config` without
/// calibration refuses (its measurement holds only for those codes), and with `--calibrate` it
/// makes them, measuring what the pick reported.
#[test]
fn a_preset_picked_on_calibrated_codes_keeps_its_method() {
    let t = tempfile::tempdir().unwrap();
    let preset = t.path().join("picked.json");
    let p = preset.display().to_string();
    let (tr, tc) = (fix("trace"), fix("target"));
    let doc = sensitivity_json(&[
        "--limit",
        "2",
        "--method",
        "gptq",
        "--calibrate",
        &tr,
        "--pick",
        "--max-regression",
        "1000",
        "--write-preset",
        &p,
    ]);
    let written: Value = serde_json::from_slice(&std::fs::read(&preset).unwrap()).unwrap();
    assert_eq!(written["method"], "gptq", "{written}");
    // The printed `command:` runs as printed (a shell, `kquant` on the PATH, OUT in the working
    // directory): calibrated codes need the target, so it names --target-checkpoint.
    let command = doc["pick"]["command"].as_str().unwrap();
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_kquant"));
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let cwd = tempfile::tempdir().unwrap();
    let r = std::process::Command::new("sh")
        .args(["-c", command])
        .current_dir(cwd.path())
        .env("PATH", path)
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(0), "{command}\n{}", stderr(&r));
    assert!(cwd.path().join("OUT/config.json").is_file(), "{command}");
    let e = fix("eagle3");
    let out = t.path().join("rtn").display().to_string();
    let r = kquant(&["quantize", &e, "-o", &out, "--config", &p]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    assert!(
        stderr(&r).contains("measured with --method gptq") && stderr(&r).contains("hint:"),
        "{}",
        stderr(&r)
    );
    assert!(!Path::new(&out).exists());
    let v = quantize_and_verify(
        &t.path().join("picked"),
        &[
            "--config",
            &p,
            "--calibrate",
            &tr,
            "--target-checkpoint",
            &tc,
        ],
        "2",
    );
    same(&doc["pick"]["picked"], &v, "the picked GPTQ preset");
    // An explicit --method wins over the preset's.
    let r = kquant(&[
        "quantize", &e, "-o", &out, "--config", &p, "--method", "rtn",
    ]);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
}

/// `--write-preset` naming the `--config` preset the run reads is refused before any
/// measurement (it used to replace it at the end), and the file is left as it was.
#[test]
fn the_written_preset_is_never_the_preset_read() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("p.json");
    let text = std::fs::read_to_string(root().join("quant-configs/kimi-k2.5-eagle3-int4-pc.json"))
        .unwrap();
    std::fs::write(&p, &text).unwrap();
    let ps = p.display().to_string();
    let o = sensitivity(&[
        "--config",
        &ps,
        "--pick",
        "--write-preset",
        &ps,
        "--limit",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        // Refused before the run, like every output that is a path the command reads (#38.2).
        stderr(&o).contains("which this command reads") && stderr(&o).contains("hint:"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read_to_string(&p).unwrap(), text);
}

/// `--pick` says when the format it picked in (the default, Quark's) is one no serving engine
/// loads as written, and not when it is one they load.
#[test]
fn a_pick_no_engine_loads_is_said() {
    let args = |fmt: Option<&'static str>| {
        let mut a = vec![
            "--limit",
            "1",
            "--pick",
            "--max-regression",
            "1000",
            "--exclude",
            "fc,lm_head",
        ];
        if let Some(f) = fmt {
            a.extend(["--format", f]);
        }
        a
    };
    let o = sensitivity(&args(None));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no serving engine loads --scheme int4-pc --format quark"),
        "{}",
        stderr(&o)
    );
    let o = sensitivity(&args(Some("compressed-tensors")));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        !stderr(&o).contains("no serving engine loads"),
        "{}",
        stderr(&o)
    );
}

/// The Kimi-Linear DFlash drafter's sensitivity, its trace captured live from the KDA target
/// (`--target kimi-linear-tiny`, no `--trace`): every module group of a DFlash drafter measured
/// and gated like the others.
#[test]
fn kimi_linear_dflash_sensitivity_runs_on_the_live_kda_target() {
    let d = root()
        .join("fixtures/kimi-linear-tiny/dflash")
        .display()
        .to_string();
    let o = kquant(&[
        "sensitivity",
        &d,
        "--target",
        "kimi-linear-tiny",
        "--limit",
        "1",
        "--max-regression",
        "1000",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["schema"], "kquant.sensitivity/1");
    assert_eq!(doc["samples"], 3, "one live prompt per category");
    let groups = doc["groups"].as_array().unwrap();
    let names: Vec<&str> = groups
        .iter()
        .map(|g| g["group"].as_str().unwrap())
        .collect();
    for want in ["fc", "q/k/v", "o", "gate/up", "down"] {
        assert!(names.contains(&want), "{names:?}");
    }
    for g in groups {
        let m = &g["measured"];
        assert!(m["delta"].as_f64().unwrap().is_finite(), "{g}");
        assert_eq!(
            m["agreement_per_depth"].as_array().unwrap().len(),
            7,
            "block 8"
        );
    }
}
