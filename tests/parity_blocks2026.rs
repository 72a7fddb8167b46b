//! The 2026 block drafters in the DFlash runtime (src/runtime/dflash/: `variant.rs`, `heads.rs`,
//! `conv.rs`) against the PyTorch reference of fixtures/gen/verify/drafts2026.py on the trained
//! tiny Kimi fixtures `dspark/` (vLLM `Qwen3DSparkModel` layout: Markov head, confidence head) and
//! `dflash2/` (`DFlash2DraftModel`: grouped convolutions, candidate selector): the predicting rows
//! and their target-lm_head logits of reference/parity-{dspark,dflash2}.safetensors
//! (make_reference2026.py), the greedy proposals (the Markov walk, its top-k variant, the
//! selector walk) and DSpark's confidences, and `kquant verify` over trace samples against
//! reference/replay-{dspark,dflash2}.json (the same walk).

use crate::common;

use std::path::PathBuf;

use common::{floats, kquant_json, load, read_json, rel_to as rel_err, root, tensor_i32s, Tensors};
use kquant::checkpoint::Checkpoint;
use kquant::runtime::dflash::heads::Head;
use kquant::runtime::dflash::variant::Kind;
use kquant::runtime::dflash::{DFlash, TargetHead};
use kquant::runtime::{Drafter, FAST_REL_TOL};
use kquant::trace::file::Trace;

const FIX: &str = "fixtures/kimi-k2.5-tiny";

/// Bound on `max |ours − PyTorch| / max |PyTorch|` for the rows and logits: both sides compute
/// in f32 from the same bf16 weights and taps; only the summation order differs.
const PARITY_REL_TOL: f32 = 1e-3;

/// Bound on `|ours − PyTorch|` for a confidence (a probability).
const CONF_TOL: f32 = 1e-4;

fn fix(rel: &str) -> PathBuf {
    root().join(FIX).join(rel)
}

/// The trained Kimi-K3 fixture: its K3 DSpark drafter (`dspark/`, vLLM's `K3DSparkModel`),
/// reference/parity-dspark.safetensors by fixtures/gen/kimi-k3/make_parity.py.
const K3: &str = "fixtures/kimi-k3-tiny";

fn draft_in(fx: &str, name: &str) -> DFlash {
    let fix = |rel: &str| root().join(fx).join(rel);
    let ck = Checkpoint::open(fix(name).to_str().unwrap()).unwrap();
    let det = ck.detect().unwrap();
    let t = Checkpoint::open(fix("target").to_str().unwrap()).unwrap();
    DFlash::load(&ck, &det, TargetHead::read(&t).unwrap()).unwrap()
}

fn f32s(t: &Tensors, name: &str) -> Vec<f32> {
    let (dt, _, b) = &t[name];
    floats(dt, b)
}

fn i32s(t: &Tensors, name: &str) -> Vec<u32> {
    tensor_i32s(t, name).into_iter().map(|v| v as u32).collect()
}

/// reference/parity-NAME.safetensors, checked to hold the first tokens of trace sample 0 and
/// their taps as the draft reads them.
fn parity(d: &DFlash, name: &str) -> (Tensors, Vec<u32>, Vec<f32>, Vec<usize>) {
    parity_in(FIX, d, name)
}

fn parity_in(fx: &str, d: &DFlash, name: &str) -> (Tensors, Vec<u32>, Vec<f32>, Vec<usize>) {
    let fix = |rel: &str| root().join(fx).join(rel);
    let p = load(&fix(&format!("reference/parity-{name}.safetensors")));
    let tr = Trace::open(&fix("trace")).unwrap();
    let s = &tr.manifest.samples[0];
    let x = tr.tokens(s).unwrap();
    let taps: Vec<Vec<f32>> = d.taps.iter().map(|&t| tr.tap(s, t).unwrap()).collect();
    let n = i32s(&p, "tokens").len();
    let stale = format!("parity-{name}.safetensors is not from this trace: regenerate it (fixtures/gen/verify/make_reference2026.py)");
    assert_eq!(i32s(&p, "tokens"), x[..n], "{stale}");
    let feats = d.features(&taps, n);
    assert!(f32s(&p, "taps") == feats, "{stale}");
    let roots = i32s(&p, "roots").iter().map(|&r| r as usize).collect();
    (p, x[..n].to_vec(), feats, roots)
}

/// The rows, logits and proposals of one drafter against the reference: `steps` proposals a
/// root (the draft's whole block).
fn check_parity(name: &str) -> (DFlash, Tensors) {
    check_parity_in(FIX, name)
}

fn check_parity_in(fx: &str, name: &str) -> (DFlash, Tensors) {
    let d = draft_in(fx, name);
    let (p, x, feats, roots) = parity_in(fx, &d, name);
    let n = x.len();
    let ctx = d.context(&feats, n);
    let steps = d.default_steps();
    let b = d.rows(steps);
    let rows = d.slots_ref(&d.context_ref(&feats, n), &x, &roots, b);
    let e_rows = rel_err(&rows, &f32s(&p, "hidden"));
    let e_logits = rel_err(&d.blocks(&ctx, &x, &roots, b), &f32s(&p, "logits"));
    eprintln!("{name} parity: rows rel err {e_rows:.3e}, logits {e_logits:.3e} (bound {PARITY_REL_TOL:e})");
    assert!(e_rows <= PARITY_REL_TOL && e_logits <= PARITY_REL_TOL);
    let got: Vec<u32> = d.block_tokens(&ctx, &x, &roots, b).concat();
    let want = i32s(&p, "pred");
    let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
    eprintln!(
        "{name}: {differ} of {} proposals differ from PyTorch's",
        want.len()
    );
    assert_eq!(got, want, "{name}: the greedy proposals");
    (d, p)
}

/// The confidence head along the Markov walk against the reference's `conf`.
fn check_confidences(d: &DFlash, p: &Tensors, name: &str) {
    check_confidences_in(FIX, d, p, name)
}

fn check_confidences_in(fx: &str, d: &DFlash, p: &Tensors, name: &str) {
    let (_, x, feats, roots) = parity_in(fx, d, name);
    let n = x.len();
    let ctx = d.context(&feats, n);
    let b = d.rows(d.default_steps());
    let Head::Markov(m) = &d.head else {
        panic!("a DSpark draft has a Markov head")
    };
    let drafts = d.block_tokens(&ctx, &x, &roots, b);
    let anchors: Vec<u32> = roots.iter().map(|&r| x[r]).collect();
    let hid = d.slots_ref(&d.context_ref(&feats, n), &x, &roots, b);
    let conf = m
        .confidences(&hid, d.h, &anchors, &drafts)
        .expect("the fixture has a confidence head")
        .concat();
    let want = f32s(p, "conf");
    let worst = conf
        .iter()
        .zip(&want)
        .fold(0f32, |w, (a, b)| w.max((a - b).abs()));
    eprintln!("{name} confidences: max |diff| {worst:.3e} (bound {CONF_TOL:e})");
    assert!(worst <= CONF_TOL);
}

#[test]
fn dspark_rows_logits_markov_walk_and_confidences_match_pytorch() {
    let (d, p) = check_parity("dspark");
    assert!(
        d.anchor_first,
        "vLLM's Qwen3DSparkModel: sample_from_anchor by default"
    );
    check_confidences(&d, &p, "dspark");
    let (_, x, feats, roots) = parity(&d, "dspark");
    let n = x.len();
    let b = d.rows(d.default_steps());
    // `dspark_draft_topk` 4 (vLLM's `_sample_sequential_topk`): the same draft, the key added.
    let t = tempfile::tempdir().unwrap();
    std::fs::copy(
        fix("dspark/model.safetensors"),
        t.path().join("model.safetensors"),
    )
    .unwrap();
    let mut cfg = read_json(&fix("dspark/config.json"));
    cfg["dspark_draft_topk"] = 4.into();
    std::fs::write(t.path().join("config.json"), cfg.to_string()).unwrap();
    let ck = Checkpoint::open(t.path().to_str().unwrap()).unwrap();
    let tgt = Checkpoint::open(fix("target").to_str().unwrap()).unwrap();
    let d4 = DFlash::load(&ck, &ck.detect().unwrap(), TargetHead::read(&tgt).unwrap()).unwrap();
    let got: Vec<u32> = d4
        .block_tokens(&d4.context(&feats, n), &x, &roots, b)
        .concat();
    assert_eq!(got, i32s(&p, "pred_top4"), "top-4 Markov walk");
}

/// Inferact's MLA DSpark (`k3-dspark`, vLLM `K3DSparkModel`; the random draft of
/// fixtures/gen/verify/make_k3dspark.py): the MLA block attention with YaRN RoPE, the Markov walk
/// and the confidence head against drafts2026.py's `K3DSpark`.
#[test]
fn k3_dspark_rows_logits_markov_walk_and_confidences_match_pytorch() {
    let (d, p) = check_parity("k3-dspark");
    assert!(d.anchor_first, "K3DSparkConfig refuses dspark_bonus_anchor");
    assert_eq!((d.kind, d.default_steps()), (Kind::Dspark, 7));
    check_confidences(&d, &p, "k3-dspark");
    // The fast path against the reference path (FAST_REL_TOL), over the whole block and the
    // shorter ones an engine runs for fewer tokens.
    let (_, x, feats, roots) = parity(&d, "k3-dspark");
    let n = x.len();
    let (fast, slow) = (d.context(&feats, n), d.context_ref(&feats, n));
    for l in 0..fast.k.len() {
        assert!(rel_err(&fast.k[l], &slow.k[l]) <= FAST_REL_TOL);
        assert!(rel_err(&fast.v[l], &slow.v[l]) <= FAST_REL_TOL);
    }
    for b in [7, 4, 1] {
        let e = rel_err(
            &d.blocks(&fast, &x, &roots, b),
            &d.blocks_ref(&slow, &x, &roots, b),
        );
        assert!(e <= FAST_REL_TOL, "k3-dspark block {b}: {e}");
    }
}

/// The trained K3 DSpark drafter of the Kimi-K3 fixture (taps on the `partial` stream of the K3
/// target): rows, logits, the Markov walk and the confidences against the reference.
#[test]
fn trained_k3_dspark_of_the_k3_fixture_matches_pytorch() {
    let (d, p) = check_parity_in(K3, "dspark");
    assert_eq!((d.kind, d.default_steps()), (Kind::Dspark, 7));
    check_confidences_in(K3, &d, &p, "dspark");
}

/// A copy of the k3-dspark fixture with `patch` merged into its config.json, loaded.
fn k3_patched(patch: serde_json::Value) -> String {
    let t = tempfile::tempdir().unwrap();
    std::fs::copy(
        fix("k3-dspark/model.safetensors"),
        t.path().join("model.safetensors"),
    )
    .unwrap();
    let mut cfg = read_json(&fix("k3-dspark/config.json"));
    for (k, v) in patch.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    std::fs::write(t.path().join("config.json"), cfg.to_string()).unwrap();
    let ck = Checkpoint::open(t.path().to_str().unwrap()).unwrap();
    let tgt = Checkpoint::open(fix("target").to_str().unwrap()).unwrap();
    match DFlash::load(&ck, &ck.detect().unwrap(), TargetHead::read(&tgt).unwrap()) {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn k3_dspark_configs_vllm_refuses_are_refused_by_name() {
    let e = k3_patched(serde_json::json!({"mla_use_output_gate": true}));
    assert!(
        e.contains("`mla_use_output_gate` is true") && e.contains("K3DSparkConfig"),
        "{e}"
    );
    let e = k3_patched(serde_json::json!({"block_size": null}));
    assert!(
        e.contains("names no `block_size`") && e.contains("num_speculative_tokens"),
        "{e}"
    );
    let e = k3_patched(serde_json::json!({"q_lora_rank": null}));
    assert!(e.contains("`q_lora_rank` is null"), "{e}");
    let llama = serde_json::json!({"rope_parameters": {"rope_type": "yarn", "factor": 8.0,
        "original_max_position_embeddings": 4096, "attention_factor": 1.0}});
    let e = k3_patched(llama);
    assert!(e.contains("deepseek_llama_scaling"), "{e}");
    // The default rope (K3DSparkConfig's default) loads.
    let plain =
        serde_json::json!({"rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}});
    assert_eq!(k3_patched(plain), "");
}

#[test]
fn dflash2_rows_logits_and_selector_walk_match_pytorch() {
    let (d, _) = check_parity("dflash2");
    assert!(!d.anchor_first);
    assert_eq!(d.kind, Kind::Dflash2);
}

/// `kquant verify` on the first sample of each category with the fixture's drafter and target,
/// as JSON: the walk and all-positions accept lengths equal the reference's counts.
fn verify_matches_reference(name: &str) {
    let py = read_json(&fix(&format!("reference/replay-{name}.json")));
    let dir = tempfile::tempdir().unwrap();
    let keep = common::one_sample_per_category(&fix("trace"), dir.path());
    let rep = kquant_json(&[
        "verify",
        "--draft",
        &format!("{FIX}/{name}"),
        "--trace",
        dir.path().to_str().unwrap(),
        "--target-checkpoint",
        &format!("{FIX}/target"),
        "--json",
        "-",
    ]);
    assert_eq!(rep["steps"], py["depths"]);
    let (mut rounds, mut committed, mut positions, mut leading) = (0u64, 0u64, 0u64, 0u64);
    for s in &keep {
        let w = &py["samples"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == s["id"])
            .expect("reference sample")["walk"];
        rounds += w["rounds"].as_u64().unwrap();
        committed += w["committed"].as_u64().unwrap();
        positions += w["positions"].as_u64().unwrap();
        leading += w["leading_sum"].as_u64().unwrap();
    }
    let ours = &rep["draft"];
    assert_eq!(ours["rounds"].as_u64(), Some(rounds), "{name}: rounds");
    let al = committed as f64 / rounds as f64;
    let got = ours["accept_length"].as_f64().unwrap();
    eprintln!("{name}: walk AL kquant {got}, PyTorch {al}");
    assert!((got - al).abs() <= 1e-9, "{name}: AL {got} vs {al}");
    let allpos = 1.0 + leading as f64 / positions as f64;
    let got = ours["accept_length_all_positions"].as_f64().unwrap();
    assert!(
        (got - allpos).abs() <= 1e-9,
        "{name}: all-positions {got} vs {allpos}"
    );
}

#[test]
fn verify_replays_dspark_as_the_reference_does() {
    verify_matches_reference("dspark");
}

#[test]
fn verify_replays_k3_dspark_as_the_reference_does() {
    verify_matches_reference("k3-dspark");
}

#[test]
fn verify_replays_dflash2_as_the_reference_does() {
    verify_matches_reference("dflash2");
}
