//! The CPU Kimi-Linear target (`runtime::kimi_linear`) against transformers 5.23's
//! `KimiLinearForCausalLM` on the trained tiny target:
//! fixtures/kimi-linear-tiny/reference/parity-target.safetensors (written by
//! fixtures/gen/verify/make_parity.py with KQ_FIXTURE=kimi-linear-tiny: 32 tokens of trace
//! sample 0; logits, every HF hidden state and the router's top-k from one float32 forward of
//! the bf16 weights, where transformers runs KDA in its chunked form; then its cached decode, a
//! 24-token prefill and 8 single-token steps through the recurrent form, with the logits of each
//! step and every KDA layer's recurrent state after the last).

use crate::common;

use common::{load, rel_to, root, tensor_f32s, tensor_i32s, Tensors};
use kquant::checkpoint::Checkpoint;
use kquant::runtime::kimi_linear::{KimiLinear, LayerState};
use kquant::runtime::lm::ChunkedLm;

const TARGET: &str = "fixtures/kimi-linear-tiny/target";
const PARITY: &str = "fixtures/kimi-linear-tiny/reference/parity-target.safetensors";

/// The Kimi-K2 runtime's bound (tests/parity_target.rs): max |ours − torch| / max |torch| per
/// tensor (each hidden state, the logits, the decode logits, each recurrent state).
const PARITY_REL_TOL: f32 = 1e-4;
/// Bound on |ours − torch| of each router weight, as for Kimi-K2.
const ROUTER_WEIGHT_ABS_TOL: f32 = 1e-4;

fn setup() -> (Tensors, KimiLinear, Vec<u32>, &'static str) {
    let parity = root().join(PARITY);
    assert!(
        parity.is_file(),
        "{} is missing: the trained kimi-linear-tiny fixtures are part of the repository",
        parity.display()
    );
    let mtime = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let stale = match (mtime(&parity), mtime(&root().join(TARGET).join("model.safetensors"))) {
        (Some(a), Some(b)) if a < b => " (the parity file is OLDER than the target weights: rerun fixtures/gen/kimi-linear/run_all.sh's make_parity step)",
        _ => "",
    };
    let r = load(&parity);
    let ck = Checkpoint::open(root().join(TARGET).to_str().unwrap()).unwrap();
    let m = KimiLinear::load(&ck).unwrap();
    let tokens: Vec<u32> = tensor_i32s(&r, "tokens")
        .iter()
        .map(|&t| t as u32)
        .collect();
    (r, m, tokens, stale)
}

#[test]
fn kimi_linear_forward_matches_transformers() {
    let (r, m, tokens, stale) = setup();
    let t = tokens.len();
    let f = m.forward(&tokens).unwrap();
    let (shape, logits) = tensor_f32s(&r, "logits");
    assert_eq!(shape, vec![t as u64, m.vocab as u64]);
    for (what, ours) in [
        ("logits", &f.logits),
        (
            "reference-path logits",
            &m.forward_ref(&tokens).unwrap().logits,
        ),
    ] {
        let d = rel_to(ours, &logits);
        eprintln!("{what}: max rel error {d:.3e}");
        assert!(
            d <= PARITY_REL_TOL,
            "{what}: {d:.3e} > {PARITY_REL_TOL}{stale}"
        );
    }
    for i in 0..t {
        let v = m.vocab;
        assert_eq!(
            kquant::ops::argmax(&f.logits[i * v..(i + 1) * v]),
            kquant::ops::argmax(&logits[i * v..(i + 1) * v]),
            "argmax at {i}{stale}"
        );
    }
    let (shape, hs) = tensor_f32s(&r, "hidden_states");
    let n = t * m.hidden;
    assert_eq!(
        shape,
        vec![m.num_layers as u64 + 1, t as u64, m.hidden as u64]
    );
    for (i, ours) in f.hidden_states.iter().enumerate() {
        let d = rel_to(ours, &hs[i * n..(i + 1) * n]);
        eprintln!("hidden_states[{i}]: max rel error {d:.3e}");
        assert!(d <= PARITY_REL_TOL, "hidden_states[{i}]: {d:.3e}{stale}");
    }
    let moe: Vec<usize> = r
        .keys()
        .filter_map(|k| {
            k.strip_prefix("router.")?
                .strip_suffix(".topk_idx")?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(moe, f.router.iter().map(|x| x.layer).collect::<Vec<_>>());
    assert_eq!(moe, vec![1, 2, 3], "layer 0 is dense");
    for ro in &f.router {
        let l = ro.layer;
        let idx: Vec<u32> = tensor_i32s(&r, &format!("router.{l}.topk_idx"))
            .iter()
            .map(|&x| x as u32)
            .collect();
        assert_eq!(ro.topk_idx, idx, "router.{l}.topk_idx{stale}");
        let (_, w) = tensor_f32s(&r, &format!("router.{l}.topk_weight"));
        let d = ro
            .topk_weight
            .iter()
            .zip(&w)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!("router.{l}.topk_weight: max abs error {d:.3e}");
        assert!(
            d <= ROUTER_WEIGHT_ABS_TOL,
            "router.{l}.topk_weight: {d:.3e}"
        );
    }
}

/// transformers' cached decode (chunked prefill, then its recurrent single-token path) against
/// a kquant session fed the same tokens the same way: each step's logits and, after the last
/// token, every KDA layer's recurrent state.
#[test]
fn kimi_linear_decode_carries_the_state_transformers_carries() {
    let (r, m, tokens, stale) = setup();
    let prefill = tensor_i32s(&r, "decode.prefill")[0] as usize;
    let (shape, want) = tensor_f32s(&r, "decode.logits");
    let steps = tokens.len() - prefill + 1;
    assert_eq!(shape, vec![steps as u64, m.vocab as u64]);
    let mut s = m.session();
    let mut rows = vec![s.extend(&tokens[..prefill]).unwrap()];
    for &t in &tokens[prefill..] {
        rows.push(s.step(t).unwrap());
    }
    for (i, row) in rows.iter().enumerate() {
        let d = rel_to(row, &want[i * m.vocab..(i + 1) * m.vocab]);
        eprintln!("decode step {i}: logits max rel error {d:.3e}");
        assert!(d <= PARITY_REL_TOL, "decode step {i}: {d:.3e}{stale}");
    }
    let mut checked = 0;
    for (l, st) in s.state().iter().enumerate() {
        let LayerState::Kda(k) = st else {
            assert!(!r.contains_key(&format!("state.{l}.recurrent")));
            continue;
        };
        let (shape, want) = tensor_f32s(&r, &format!("state.{l}.recurrent"));
        let (h, dk) = (m.cfg.kda.heads as u64, m.cfg.kda.head_dim as u64);
        assert_eq!(shape, vec![h, dk, dk], "[heads, key dim, value dim]");
        let d = rel_to(&k.s, &want);
        eprintln!("layer {l} recurrent state: max rel error {d:.3e}");
        assert!(d <= PARITY_REL_TOL, "layer {l} state: {d:.3e}{stale}");
        checked += 1;
    }
    assert_eq!(checked, 3, "KDA layers 0, 1, 3");
}
