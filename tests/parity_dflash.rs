//! The DFlash runtime (src/runtime/dflash/mod.rs) against the PyTorch reference of
//! fixtures/gen/verify/common.py on the trained tiny Kimi fixtures: the projected context and
//! the block logits of reference/parity-dflash.safetensors (make_parity.py), the fast path
//! against the plain one, `propose` against `matches`, the taps detection gives against the
//! Python's DFLASH_TAPS, and `kquant verify` over trace samples against
//! reference/replay-dflash.json and reference/prompt-lookup.json (replay_ref.py, the same walk).

use crate::common;

use std::path::PathBuf;

use common::{floats, kquant, kquant_json, load, read_json, root, Tensors};
use kquant::checkpoint::{AuxConvention, Checkpoint};
use kquant::runtime::dflash::{DFlash, TargetHead};
use kquant::runtime::Drafter;
use kquant::runtime::FAST_REL_TOL;
use kquant::trace::file::Trace;
use serde_json::Value;

const FIX: &str = "fixtures/kimi-k2.5-tiny";

/// Bound on `max |ours − PyTorch| / max |PyTorch|` for the projected context and the block
/// logits. Both sides compute in f32 from the same bf16 weights and bf16 taps; only the
/// summation order differs (measured ≈1e-6).
const PARITY_REL_TOL: f32 = 1e-3;

/// A differing prediction is a near-tie when the reference logits of the two tokens are
/// within this fraction of the row's largest |logit|.
const TIE_REL: f32 = 1e-3;

fn fix(rel: &str) -> PathBuf {
    root().join(FIX).join(rel)
}

fn draft() -> DFlash {
    let ck = Checkpoint::open(fix("dflash").to_str().unwrap()).unwrap();
    let det = ck.detect().unwrap();
    let t = Checkpoint::open(fix("target").to_str().unwrap()).unwrap();
    DFlash::load(&ck, &det, TargetHead::read(&t).unwrap()).unwrap()
}

fn f32s(t: &Tensors, name: &str) -> Vec<f32> {
    let (dt, _, b) = &t[name];
    floats(dt, b)
}

fn i32s(t: &Tensors, name: &str) -> Vec<u32> {
    let (dt, _, b) = &t[name];
    assert_eq!(dt, "I32", "{name}");
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect()
}

/// `max |a − b| / max |b|`.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// Sample `i` of the trace: tokens, prompt length and the draft's taps.
fn sample(d: &DFlash, i: usize) -> (Vec<u32>, usize, Vec<Vec<f32>>) {
    let tr = Trace::open(&fix("trace")).unwrap();
    let s = &tr.manifest.samples[i];
    let taps = d.taps.iter().map(|&t| tr.tap(s, t).unwrap()).collect();
    (tr.tokens(s).unwrap(), s.prompt_len, taps)
}

/// reference/parity-dflash.safetensors, checked to hold the first tokens of trace sample 0 and
/// their taps cat(hs[taps]) as the draft reads them (else it is stale: regenerate it).
fn parity(d: &DFlash) -> Tensors {
    let p = load(&fix("reference/parity-dflash.safetensors"));
    let (x, _, taps) = sample(d, 0);
    let n = i32s(&p, "tokens").len();
    let stale = "parity-dflash.safetensors is not from this trace: regenerate it (fixtures/gen/verify/make_parity.py)";
    assert_eq!(i32s(&p, "tokens"), x[..n], "{stale}");
    assert!(f32s(&p, "taps") == d.features(&taps, n), "{stale}");
    p
}

#[test]
fn detection_maps_target_layer_ids_to_the_taps_the_reference_uses() {
    let ck = Checkpoint::open(fix("dflash").to_str().unwrap()).unwrap();
    let aux = ck.detect().unwrap().aux_layers.unwrap();
    // z-lab target_layer_ids are outputs of layer k = HF hidden_states[k + 1].
    assert_eq!(aux.key, "dflash_config.target_layer_ids");
    assert_eq!(aux.convention, Some(AuxConvention::OutputOfLayer));
    let hs: Vec<i64> = aux.ids.iter().map(|k| k + 1).collect();
    assert_eq!(aux.hidden_states.as_ref(), Some(&hs));
    // The Python's DFLASH_TAPS, as replay_ref.py records them.
    let rep = read_json(&fix("reference/replay-dflash.json"));
    let py: Vec<i64> = rep["taps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(hs, py);
    assert_eq!(rep["tap_convention"], "hf_output_hidden_states");
    // And the parity taps are those trace taps, concatenated in that order (`parity`).
    let d = draft();
    assert_eq!(d.taps, hs.iter().map(|&i| i as usize).collect::<Vec<_>>());
    parity(&d);
}

#[test]
fn context_and_block_logits_match_pytorch() {
    let d = draft();
    let p = parity(&d);
    let x = i32s(&p, "tokens");
    let n = x.len();
    let feats = f32s(&p, "taps");
    let e_ctx = rel_err(&d.project(&feats, n), &f32s(&p, "ctx"));
    let ctx = d.context(&feats, n);
    let roots: Vec<usize> = i32s(&p, "roots").iter().map(|&r| r as usize).collect();
    let want = f32s(&p, "logits");
    let got = d.blocks(&ctx, &x, &roots, d.block_size);
    let e_logits = rel_err(&got, &want);
    eprintln!("dflash parity: ctx rel err {e_ctx:.3e}, logits rel err {e_logits:.3e} (bound {PARITY_REL_TOL:e})");
    assert!(e_ctx <= PARITY_REL_TOL, "ctx rel err {e_ctx}");
    assert!(e_logits <= PARITY_REL_TOL, "logits rel err {e_logits}");
    // Predictions: equal except where the reference itself has a near-tie.
    let pred = i32s(&p, "pred");
    let v = d.vocab;
    let mut differ = 0;
    for (i, (row, wrow)) in got.chunks(v).zip(want.chunks(v)).enumerate() {
        let ours = argmax(row);
        if ours as u32 != pred[i] {
            differ += 1;
            let scale = wrow.iter().fold(0f32, |m, v| m.max(v.abs()));
            let gap = (wrow[pred[i] as usize] - wrow[ours]).abs();
            assert!(
                gap <= TIE_REL * scale,
                "row {i}: {ours} vs {} is no near-tie (gap {gap})",
                pred[i]
            );
        }
    }
    eprintln!(
        "dflash parity: {differ} of {} predictions differ (near-ties)",
        pred.len()
    );
    assert!(differ <= 1, "{differ} predictions differ");
}

#[test]
fn fast_path_matches_the_reference_path() {
    let d = draft();
    let (x, _, taps) = sample(&d, 1);
    let n = x.len() - 1;
    let feats = d.features(&taps, n);
    let (fast, slow) = (d.context(&feats, n), d.context_ref(&feats, n));
    let mut worst = 0f32;
    for l in 0..fast.k.len() {
        worst = worst
            .max(rel_err(&fast.k[l], &slow.k[l]))
            .max(rel_err(&fast.v[l], &slow.v[l]));
    }
    // Root 0 sees no context; the others some, up to the last row.
    let roots = [0, 1, 17, n / 2, n - 1];
    let e = rel_err(
        &d.blocks(&fast, &x, &roots, d.block_size),
        &d.blocks_ref(&slow, &x, &roots, d.block_size),
    );
    eprintln!(
        "dflash fast vs reference: context {worst:.3e}, logits {e:.3e} (bound {FAST_REL_TOL:e})"
    );
    assert!(worst <= FAST_REL_TOL && e <= FAST_REL_TOL);
}

#[test]
fn propose_is_the_block_pass_matches_scores() {
    let d = draft();
    let k = d.default_steps();
    assert_eq!(k, d.block_size - 1);
    let (x, p, taps) = sample(&d, 2);
    // The first 24 generated tokens (roots are independent; this keeps the debug build quick).
    let x = &x[..p + 24];
    let m = d.matches(x, &taps, p, k);
    assert_eq!(
        (m.depths, m.total_len, m.c.len()),
        (d.block_size - 1, x.len(), x.len() - 1)
    );
    let mut matched = 0;
    for r in [p, p + 1, p + 9, x.len() - 4, x.len() - 2] {
        // Rows from r on must not matter: overwrite them.
        let cut: Vec<Vec<f32>> = taps
            .iter()
            .map(|t| {
                let mut t = t.clone();
                t[r * d.ht..].iter_mut().for_each(|v| *v = 1e3);
                t
            })
            .collect();
        let prop = d.propose(&x[..=r], &cut, k);
        assert_eq!(prop.len(), d.block_size - 1);
        for (k, &tok) in prop.iter().enumerate() {
            let hit = x.get(r + 1 + k) == Some(&tok);
            assert_eq!(m.c[r - 1] >> k & 1 == 1, hit, "root {r} slot {}", k + 1);
            matched += hit as usize;
        }
    }
    assert!(matched > 0, "the trained draft matches something");
    // Pairs before the first root stay empty.
    assert!(m.c[..p - 1].iter().all(|&c| c == 0));
}

/// A quantized draft (kquant's own output) loads through `quant::decode` and runs exactly as its
/// dequantized f32 weights: the same logits bit for bit.
#[test]
fn a_quantized_draft_runs_as_its_dequantized_weights() {
    let t = tempfile::tempdir().unwrap();
    let (q, dq) = (t.path().join("q"), t.path().join("dq"));
    let (qs, dqs) = (q.to_str().unwrap(), dq.to_str().unwrap());
    let src = format!("{FIX}/dflash");
    let out = kquant(&[
        "quantize",
        &src,
        "-o",
        qs,
        "--scheme",
        "int4-g32",
        "--format",
        "compressed-tensors",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = kquant(&["dequantize", qs, "-o", dqs, "--dtype", "f32"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tgt = Checkpoint::open(fix("target").to_str().unwrap()).unwrap();
    let load_at = |p: &str| {
        let ck = Checkpoint::open(p).unwrap();
        DFlash::load(&ck, &ck.detect().unwrap(), TargetHead::read(&tgt).unwrap()).unwrap()
    };
    let (dq_draft, q_draft, orig) = (load_at(dqs), load_at(qs), draft());
    let (x, _, taps) = sample(&orig, 0);
    let n = 40;
    let feats = orig.features(&taps, n);
    let roots = [5, 20, 40];
    let run = |d: &DFlash| d.blocks(&d.context(&feats, n), &x, &roots, d.block_size);
    let got = run(&q_draft);
    assert_eq!(got, run(&dq_draft));
    assert_ne!(got, run(&orig), "int4 changed the weights");
}

/// `kquant verify` on `trace` with the fixture's DFlash draft and target against the
/// prompt-lookup baseline, as JSON (exit 0).
fn verify_json(trace: &str) -> Value {
    kquant_json(&[
        "verify",
        "--draft",
        &format!("{FIX}/dflash"),
        "--trace",
        trace,
        "--target-checkpoint",
        &format!("{FIX}/target"),
        "--baseline",
        "prompt-lookup",
        "--json",
        "-",
    ])
}

/// Sums of the reference's per-sample walks: (rounds, committed, positions, leading_sum).
fn ref_counts(walks: &[&Value]) -> [u64; 4] {
    let mut c = [0u64; 4];
    for w in walks {
        for (i, k) in ["rounds", "committed", "positions", "leading_sum"]
            .iter()
            .enumerate()
        {
            c[i] += w[k].as_u64().unwrap();
        }
    }
    c
}

/// Our report's draft numbers equal the reference counts: same rounds, and walk / all-positions
/// accept lengths equal to 1e-9 (the same integer counts, divided; 1e-9 only absorbs printing).
fn assert_same(ours: &Value, c: [u64; 4], what: &str) {
    let [rounds, committed, positions, leading] = c;
    assert_eq!(ours["rounds"].as_u64(), Some(rounds), "{what}: rounds");
    let al = committed as f64 / rounds as f64;
    let allpos = 1.0 + leading as f64 / positions as f64;
    let got = ours["accept_length"].as_f64().unwrap();
    eprintln!("{what}: walk AL kquant {got}, PyTorch {al}");
    assert!((got - al).abs() <= 1e-9, "{what}: AL {got} vs {al}");
    let got = ours["accept_length_all_positions"].as_f64().unwrap();
    assert!(
        (got - allpos).abs() <= 1e-9,
        "{what}: all-positions AL {got} vs {allpos}"
    );
}

/// Our per-depth unconditional rates equal the reference's counts: depth k's matches out of
/// the positions that compared depth k (`at_depth`), summed over `walks`.
fn assert_same_unconditional(ours: &Value, walks: &[&Value], what: &str) {
    let sum = |k: &str, d: usize| -> u64 { walks.iter().map(|w| w[k][d].as_u64().unwrap()).sum() };
    let got = ours["unconditional_acceptance"].as_array().unwrap();
    assert_eq!(
        got.len(),
        walks[0]["uncond"].as_array().unwrap().len(),
        "{what}"
    );
    for (d, g) in got.iter().enumerate() {
        let want = sum("uncond", d) as f64 / sum("at_depth", d) as f64;
        let g = g.as_f64().unwrap();
        assert!((g - want).abs() <= 1e-9, "{what}: depth {d}: {g} vs {want}");
    }
}

/// The first sample of each category, in a trace of their own (same shard): the replay over it
/// must count exactly what replay_ref.py counted for those samples.
#[test]
fn verify_replays_trace_samples_as_the_reference_does() {
    let py = read_json(&fix("reference/replay-dflash.json"));
    let dir = tempfile::tempdir().unwrap();
    let keep = common::one_sample_per_category(&fix("trace"), dir.path());
    assert!(keep.len() >= 2, "the fixture trace has several categories");
    let rep = verify_json(dir.path().to_str().unwrap());
    assert_eq!(rep["steps"], py["depths"]);
    assert_eq!(rep["samples"].as_u64(), Some(keep.len() as u64));
    let walk_of = |id: &Value| {
        let s = py["samples"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| &s["id"] == id)
            .expect("reference sample");
        &s["walk"]
    };
    let walks: Vec<&Value> = keep.iter().map(|s| walk_of(&s["id"])).collect();
    assert_same(
        &rep["draft"],
        ref_counts(&walks),
        "first sample of each category",
    );
    // The prompt-lookup baseline proposes as many tokens as the draft (B − 1 = 7); kquant's
    // n-gram rule takes the most recent occurrence (prompt-lookup.json `latest-k7`).
    let pl = read_json(&fix("reference/prompt-lookup.json"));
    let pl_walks: Vec<&Value> = keep
        .iter()
        .map(|s| {
            let p = pl["latest-k7"]["samples"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["id"] == s["id"])
                .expect("prompt-lookup sample");
            &p["walk"]
        })
        .collect();
    assert_same(
        &rep["baseline"],
        ref_counts(&pl_walks),
        "prompt lookup, 7 tokens",
    );
    assert_same_unconditional(&rep["draft"], &walks, "dflash, a sample per category");
    for (s, w) in keep.iter().zip(&walks) {
        let cat = s["category"].as_str().unwrap();
        let c = ref_counts(&[w]);
        let got = rep["per_category"][cat]["draft"].as_f64().unwrap();
        assert!((got - c[1] as f64 / c[0] as f64).abs() <= 1e-9, "{cat}");
    }
}

/// The whole trace against the reference aggregate. About a minute in a debug build on 2 cores,
/// so the plain `cargo test` leaves it out; .ci/run runs it (`-- --include-ignored`).
#[test]
#[ignore = "about a minute in a debug build; .ci/run runs it (--include-ignored)"]
fn verify_replays_the_whole_trace_as_the_reference_does() {
    let py = read_json(&fix("reference/replay-dflash.json"));
    let rep = verify_json(&format!("{FIX}/trace"));
    let agg = &py["aggregate"]["all"];
    let counts = |a: &Value| {
        ["rounds", "committed", "positions", "leading_sum"].map(|k| a[k].as_u64().unwrap())
    };
    assert_same(&rep["draft"], counts(agg), "whole trace");
    assert_same_unconditional(&rep["draft"], &[agg], "whole trace");
    let sim = rep["draft"]["simulated_accept_length"].as_f64().unwrap();
    let want = agg["simulated"].as_f64().unwrap();
    assert!((sim - want).abs() <= 1e-9, "simulated AL {sim} vs {want}");
    let pl = read_json(&fix("reference/prompt-lookup.json"));
    let pl = &pl["latest-k7"]["aggregate"]["all"];
    assert_same(
        &rep["baseline"],
        counts(pl),
        "prompt lookup, 7 tokens, whole trace",
    );
    for (cat, v) in rep["per_category"].as_object().unwrap() {
        let want = py["aggregate"][cat]["al_walk"].as_f64().unwrap();
        assert!((v["draft"].as_f64().unwrap() - want).abs() <= 1e-9, "{cat}");
    }
}

#[test]
fn verify_refuses_a_dflash_draft_without_the_target() {
    let out = kquant(&[
        "verify",
        "--draft",
        &format!("{FIX}/dflash"),
        "--trace",
        &format!("{FIX}/trace"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error:") && err.contains("lm_head"), "{err}");
    assert!(
        err.contains("hint:") && err.contains("--target-checkpoint"),
        "{err}"
    );
}

/// `--steps K` replays a DFlash draft as the engines run it for K tokens a step: a block of
/// K + 1 rows (vLLM's `1 + num_speculative_tokens`), so fewer depths and other logits, not the
/// whole block cut short; the report says K. More than block_size − 1 is refused by name.
#[test]
fn steps_set_the_block_a_dflash_replay_runs() {
    let d = draft();
    let (x, p, taps) = sample(&d, 2);
    let x = &x[..p + 24];
    let k = 3;
    let m = d.matches(x, &taps, p, k);
    assert_eq!(m.depths, k);
    // Each root's proposals are the K-slot block's argmax, not the whole block's first K.
    let ctx = d.context(&d.features(&taps, x.len() - 2), x.len() - 2);
    let roots: Vec<usize> = (p..x.len() - 2).collect();
    let short = d.block_tokens(&ctx, x, &roots, k + 1);
    let whole = d.block_tokens(&ctx, x, &roots, d.block_size);
    for (i, &r) in roots.iter().enumerate() {
        assert_eq!(m.proposals[(r - 1) * k..r * k], short[i][..], "root {r}");
    }
    assert!(
        short.iter().zip(&whole).any(|(s, w)| s[..] != w[..k]),
        "a shorter block changes some proposal on this sample"
    );
    let trace = format!("{FIX}/trace");
    let run = |steps: &str| {
        kquant(&[
            "verify",
            "--draft",
            &format!("{FIX}/dflash"),
            "--trace",
            &trace,
            "--target-checkpoint",
            &format!("{FIX}/target"),
            "--per-category",
            "1",
            "--steps",
            steps,
            "--json",
            "-",
        ])
    };
    let o = run("3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rep: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(rep["steps"], 3);
    let o = run(&d.block_size.to_string());
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains(&format!(
            "error: --steps {}: draft `{FIX}/dflash` proposes at most {} tokens a step",
            d.block_size,
            d.block_size - 1
        )) && e.contains("hint: pass --steps 1..="),
        "{e}"
    );
}
