//! Both EAGLE-3 runtimes (Llama-style and MLA) against the Python reference that trained the
//! fixtures (fixtures/gen/verify/common.py `Eagle3Base.forward_ttt`, written by make_parity.py
//! and replay_ref.py into fixtures/kimi-k2.5-tiny/reference/):
//!
//! * the teacher-forced forward (fc, per-depth logits and layer outputs, predictions) on the
//!   first 64 tokens of trace sample 0, under named bounds;
//! * the engine-style chain (`Drafter::propose`) against the teacher-forced pass it must equal;
//! * `kquant verify` over the whole trace: exit 0, and its accept length equal to the Python
//!   replay's, with every per-pair depth-match bitmask compared.
//!
//! The reference files are read at run time; regenerate them with make_parity.py /
//! replay_ref.py whenever a draft or the trace changes.

use crate::common;

use std::path::{Path, PathBuf};

use common::{floats, kquant, load, read_json, root};
use kquant::checkpoint::{Checkpoint, Family};
use kquant::runtime::eagle3::Eagle3;
use kquant::runtime::Drafter;
use kquant::trace::file::Trace;
use kquant::verify::walk::{walk, Matches, Walk};
use serde_json::Value;

const FIX: &str = "fixtures/kimi-k2.5-tiny";
const DEPTHS: usize = 3;

/// Largest |rust − python| over a tensor, relative to the tensor's largest |python| value, for
/// fc, logits and hidden states. Both sides compute in f32 from the same bf16 weights; only the
/// summation order differs (measured ~1e-6, see the test output).
const PARITY_REL_TOL: f32 = 1e-3;

/// Predictions may differ from the reference only where the reference's top-2 logit margin is
/// within the error the bound above allows (2 · PARITY_REL_TOL · max|logits|): a near tie.
/// At most this many such flips per draft (of ~190 compared rows).
const MAX_NEAR_TIE_FLIPS: usize = 2;

/// Accept length of `kquant verify` against the Python replay's. Identical depth-match
/// bitmasks give identical walks, so the only slack is f64 formatting.
const AL_ABS_TOL: f64 = 1e-9;

/// Per-pair depth-match bits (over the whole trace, ~4800 roots × 3 depths) allowed to differ
/// from the Python replay: each must be a near tie in f32 (see MAX_NEAR_TIE_FLIPS).
const MAX_REPLAY_BIT_DIFFS: usize = 3;

fn fix(rel: &str) -> PathBuf {
    root().join(FIX).join(rel)
}

fn target_embed() -> Vec<f32> {
    let t = Checkpoint::open(fix("target").to_str().unwrap()).unwrap();
    t.weights
        .tensor("model.embed_tokens.weight")
        .expect("target embedding")
        .to_f32()
}

fn draft(name: &str) -> Eagle3 {
    let ck = Checkpoint::open(fix(name).to_str().unwrap()).unwrap();
    let det = ck.detect().unwrap();
    Eagle3::load(&ck, &det, Some(target_embed())).unwrap()
}

/// One parity file: f32 tensors (bf16 widened) and i32 tensors, by name.
struct Reference {
    t: common::Tensors,
}

impl Reference {
    fn open(p: &Path) -> Reference {
        assert!(
            p.exists(),
            "{} missing (fixtures/gen/verify/make_parity.py)",
            p.display()
        );
        Reference { t: load(p) }
    }
    fn f32(&self, name: &str) -> (Vec<f32>, Vec<u64>) {
        let (dt, shape, b) = &self.t[name];
        (floats(dt, b), shape.clone())
    }
    fn i32(&self, name: &str) -> Vec<i32> {
        let (dt, _, b) = &self.t[name];
        assert_eq!(dt, "I32", "{name}");
        b.chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
}

/// max |a − b| over max |b|, over the first `rows` rows of width `w`.
fn rel_err(a: &[f32], b: &[f32], rows: usize, w: usize) -> f32 {
    let (a, b) = (&a[..rows * w], &b[..rows * w]);
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

/// Top-1 minus top-2 of a logits row.
fn margin(row: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in row {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    a - b
}

/// `[T, 3·Ht]` features split back into the per-tap `[T, Ht]` rows the `Drafter` API takes.
fn split_taps(feats: &[f32], rows: usize, ht: usize) -> Vec<Vec<f32>> {
    (0..3)
        .map(|j| {
            (0..rows)
                .flat_map(|t| &feats[t * 3 * ht + j * ht..t * 3 * ht + (j + 1) * ht])
                .copied()
                .collect()
        })
        .collect()
}

fn teacher_forced_parity(name: &str, family: Family) {
    let d = draft(name);
    assert_eq!(d.family, family, "{name}");
    let r = Reference::open(&fix(&format!("reference/parity-{name}.safetensors")));
    let x: Vec<u32> = r.i32("tokens").iter().map(|&v| v as u32).collect();
    let (feats, fshape) = r.f32("taps");
    let t_len = x.len();
    assert_eq!(fshape, vec![t_len as u64, 3 * d.ht as u64]);

    let (fc_ref, _) = r.f32("fc");
    let fc = d.fc(&feats, t_len);
    let e = rel_err(&fc, &fc_ref, t_len, d.h);
    eprintln!("{name}: fc rel err {e:.3e}");
    assert!(e <= PARITY_REL_TOL, "{name}: fc rel err {e}");

    let outs = d.teacher_forced(&x, &feats, DEPTHS);
    assert_eq!(outs.len(), DEPTHS);
    let mut flips = 0;
    for (k, out) in outs.iter().enumerate() {
        // Rows t ≤ T-2-k are real; later rows are the reference's padding.
        let rows = t_len - 1 - k;
        let (lg_ref, lshape) = r.f32(&format!("logits.{k}"));
        assert_eq!(lshape, vec![t_len as u64, d.draft_vocab as u64]);
        let (hid_ref, _) = r.f32(&format!("hidden.{k}"));
        let pred_ref = r.i32(&format!("pred.{k}"));
        let vd = d.draft_vocab;
        let el = rel_err(&out.logits, &lg_ref, rows, vd);
        let eh = rel_err(&out.hidden, &hid_ref, rows, d.h);
        let tie =
            2.0 * PARITY_REL_TOL * lg_ref[..rows * vd].iter().fold(0f32, |m, v| m.max(v.abs()));
        let mut depth_flips = 0;
        for t in 0..rows {
            if out.pred[t] != pred_ref[t] as u32 {
                let m = margin(&lg_ref[t * vd..(t + 1) * vd]);
                assert!(
                    m <= tie,
                    "{name} depth {k} row {t}: prediction {} vs reference {} with top-2 margin {m} > {tie}",
                    out.pred[t],
                    pred_ref[t]
                );
                depth_flips += 1;
            }
        }
        eprintln!(
            "{name}: depth {k}: logits rel err {el:.3e}, hidden rel err {eh:.3e}, \
             {depth_flips} near-tie prediction flips of {rows} rows"
        );
        assert!(
            el <= PARITY_REL_TOL,
            "{name} depth {k}: logits rel err {el}"
        );
        assert!(
            eh <= PARITY_REL_TOL,
            "{name} depth {k}: hidden rel err {eh}"
        );
        flips += depth_flips;
    }
    assert!(
        flips <= MAX_NEAR_TIE_FLIPS,
        "{name}: {flips} near-tie flips"
    );
}

#[test]
fn eagle3_llama_teacher_forced_matches_python() {
    teacher_forced_parity("eagle3", Family::Eagle3);
}

#[test]
fn eagle3_mla_teacher_forced_matches_python() {
    teacher_forced_parity("eagle3-mla", Family::Eagle3Mla);
}

/// The engine chain from root x[m-1] (pair m-2), each depth fed the previous proposal, equals
/// the teacher-forced pass over x[..m] extended with those proposals; and where the real
/// continuation equals the proposals, the teacher-forced predictions over the real sequence.
/// On trace sample 0 up to 32 generated tokens (the prompt alone has few agreeing roots).
fn propose_is_the_teacher_forced_chain(name: &str) {
    let d = draft(name);
    let ht = d.ht;
    let trace = Trace::open(&fix("trace")).unwrap();
    let s = &trace.manifest.samples[0];
    let all = trace.tokens(s).unwrap();
    let t_len = all.len().min(s.prompt_len + 32);
    let x = &all[..t_len];
    let taps: Vec<Vec<f32>> = d.taps().iter().map(|&t| trace.tap(s, t).unwrap()).collect();
    let feats: Vec<f32> = (0..t_len)
        .flat_map(|t| taps.iter().flat_map(move |tap| &tap[t * ht..(t + 1) * ht]))
        .copied()
        .collect();
    let full = d.teacher_forced(x, &feats, DEPTHS);
    // Roots whose real continuation is the teacher-forced chain, and a spread of others
    // (every root would take minutes in a debug build).
    let agreeing: Vec<usize> = (2..=t_len - DEPTHS)
        .filter(|&m| (0..DEPTHS).all(|k| full[k].pred[m - 2] == x[m + k]))
        .collect();
    assert!(
        !agreeing.is_empty(),
        "{name}: no root whose continuation is the draft's chain"
    );
    let mut ms: Vec<usize> = (2..=t_len - DEPTHS)
        .step_by(24)
        .chain(agreeing.iter().rev().step_by(4).copied())
        .collect();
    ms.sort();
    ms.dedup();
    for &m in &ms {
        // Only rows < m-1 may be read: pass exactly those (the trait ignores later ones).
        let taps = split_taps(&feats, m - 1, d.ht);
        let p = d.propose(&x[..m], &taps, DEPTHS);
        assert_eq!(p.len(), DEPTHS, "{name}: depths(steps)");
        // Teacher-forced over x[..m] + chain (only root m-1 onwards: prompt_len m-1): every
        // depth must reproduce its proposal.
        let mut ext = x[..m].to_vec();
        ext.extend(&p);
        let tf = d.depth_matches(&ext, &feats, m - 1, DEPTHS);
        assert_eq!(
            tf.c[m - 2],
            (1 << DEPTHS) - 1,
            "{name}: root {m}: chain {p:?}"
        );
        assert_eq!(
            agreeing.contains(&m),
            x[m..m + DEPTHS] == p[..],
            "{name}: root {m}: chain {p:?}, continuation {:?}",
            &x[m..m + DEPTHS]
        );
    }
    eprintln!(
        "{name}: {} chains checked; {} roots of {} have the real continuation equal to the chain",
        ms.len(),
        agreeing.len(),
        t_len - 1 - DEPTHS
    );
}

#[test]
fn eagle3_llama_propose_is_the_teacher_forced_chain() {
    propose_is_the_teacher_forced_chain("eagle3");
}

#[test]
fn eagle3_mla_propose_is_the_teacher_forced_chain() {
    propose_is_the_teacher_forced_chain("eagle3-mla");
}

/// `kquant verify` over the trace against replay_ref.py: the CLI's accept length, and the
/// per-pair bitmasks of the same replay through the library. `embed_from_target`: the draft
/// carries no embed_tokens (SpecForge layout), so verify is given the target checkpoint.
fn replay_matches_python(name: &str, embed_from_target: bool) {
    let reference = read_json(&fix(&format!("reference/replay-{name}.json")));
    assert_eq!(reference["depths"], DEPTHS);
    let (draft_dir, trace_dir, target_dir) = (
        format!("{FIX}/{name}"),
        format!("{FIX}/trace"),
        format!("{FIX}/target"),
    );
    let mut args = vec!["verify", "--draft", &draft_dir, "--trace", &trace_dir];
    if embed_from_target {
        args.extend(["--target-checkpoint", &target_dir]);
    }
    args.extend(["--json", "-"]);
    let out = kquant(&args);
    assert!(
        out.status.success(),
        "{name}: exit {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let rep: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rep["steps"], DEPTHS, "verify's default --steps");
    let al_cli = rep["draft"]["accept_length"].as_f64().unwrap();
    let al_ref = reference["aggregate"]["all"]["al_walk"].as_f64().unwrap();

    // kquant's walk of the Python bitmasks is the Python walk (cheap: no forward).
    let samples = reference["samples"].as_array().unwrap();
    let trace = Trace::open(&fix("trace")).unwrap();
    assert_eq!(samples.len(), trace.manifest.samples.len());
    let ref_c = |s: &kquant::trace::file::SampleMeta, rs: &Value| -> Matches {
        assert_eq!(rs["id"].as_u64(), Some(s.id));
        assert_eq!(
            rs["first_root_pair"].as_u64(),
            Some(s.prompt_len as u64 - 1)
        );
        let total = rs["total_len"].as_u64().unwrap() as usize;
        let mut c = vec![0u32; s.prompt_len - 1];
        c.extend(
            rs["c"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32),
        );
        assert_eq!(c.len(), total - 1, "sample {}", s.id);
        Matches {
            depths: DEPTHS,
            prompt_len: s.prompt_len,
            total_len: total,
            c,
            ..Matches::default()
        }
    };
    let mut theirs = Walk::default();
    for (s, rs) in trace.manifest.samples.iter().zip(samples) {
        theirs.add(&walk(&ref_c(s, rs)));
    }
    assert!(
        (theirs.al_walk() - al_ref).abs() <= AL_ABS_TOL,
        "{name}: kquant's walk of the Python bitmasks {} vs the Python walk {al_ref}",
        theirs.al_walk()
    );
    let diff = (al_cli - al_ref).abs();
    eprintln!("{name}: verify accept length {al_cli}, python replay {al_ref}, |diff| {diff:.3e}");
    if diff <= AL_ABS_TOL {
        return;
    }
    // Different: the same replay through the library, bitmask by bitmask, to tell near-tie
    // flips from a real divergence (a debug-build full pass; only taken on this path).
    let d = draft(name);
    let mut ours = Walk::default();
    let (mut bits, mut diffs) = (0usize, Vec::new());
    for (s, rs) in trace.manifest.samples.iter().zip(samples) {
        let x = trace.tokens(s).unwrap();
        let taps: Vec<Vec<f32>> = d.taps().iter().map(|&t| trace.tap(s, t).unwrap()).collect();
        let m = d.matches(&x, &taps, s.prompt_len, DEPTHS);
        let mr = ref_c(s, rs);
        assert_eq!(m.c.len(), mr.c.len(), "sample {}", s.id);
        for t in s.prompt_len - 1..m.c.len() {
            bits += DEPTHS;
            if m.c[t] != mr.c[t] {
                diffs.push((s.id, t, m.c[t], mr.c[t]));
            }
        }
        ours.add(&walk(&m));
    }
    let nbits: usize = diffs
        .iter()
        .map(|d| (d.2 ^ d.3).count_ones() as usize)
        .sum();
    eprintln!(
        "{name}: {nbits} of {bits} depth-match bits differ (sample, pair, ours, python): {diffs:?}"
    );
    assert!(
        (al_cli - ours.al_walk()).abs() <= AL_ABS_TOL,
        "{name}: the CLI's accept length is not the library's walk"
    );
    assert!(
        nbits <= MAX_REPLAY_BIT_DIFFS,
        "{name}: {nbits} depth-match bits differ; accept length {al_cli} vs {al_ref}"
    );
}

#[test]
fn eagle3_llama_verify_replay_matches_python() {
    replay_matches_python("eagle3", true);
}

#[test]
fn eagle3_mla_verify_replay_matches_python() {
    replay_matches_python("eagle3-mla", false);
}
