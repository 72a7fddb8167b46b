//! The CPU Kimi-K2 target forward (`runtime::deepseek`) against transformers 5.23 on the trained
//! tiny target: fixtures/kimi-k2.5-tiny/reference/parity-target.safetensors (written by
//! fixtures/gen/verify/make_parity.py: 32 tokens of trace sample 0; logits, every HF hidden
//! state, the router's top-k per MoE layer, all from a float32 forward of the bf16 weights).

use crate::common;

use common::{load, rel_to, root, tensor_f32s, tensor_i32s};
use kquant::checkpoint::Checkpoint;
use kquant::runtime::deepseek::DeepseekV3;
use kquant::runtime::lm::ChunkedLm;

const TARGET: &str = "fixtures/kimi-k2.5-tiny/target";
const PARITY: &str = "fixtures/kimi-k2.5-tiny/reference/parity-target.safetensors";

/// Bound on max |ours − torch| / max |torch| per tensor (each hidden state, the logits).
/// Measured ≈ 1e-6 on the committed fixture (docs/verify.md, "Target runtime and trace capture").
const PARITY_REL_TOL: f32 = 1e-4;
/// Bound on |ours − torch| of each router weight (values ≈ 0.5–2.8; measured ≈ 2e-6).
const ROUTER_WEIGHT_ABS_TOL: f32 = 1e-4;

#[test]
fn target_forward_matches_transformers() {
    let parity = root().join(PARITY);
    assert!(
        parity.is_file(),
        "{} is missing: the trained kimi-k2.5-tiny fixtures are part of the repository",
        parity.display()
    );
    // A parity file older than the target's weights was made from other weights: say so in
    // every failure rather than report it as a runtime bug.
    let mtime = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let stale = match (mtime(&parity), mtime(&root().join(TARGET).join("model.safetensors"))) {
        (Some(a), Some(b)) if a < b => " (the parity file is OLDER than the target weights: rerun fixtures/gen/verify/make_parity.py)",
        _ => "",
    };
    let r = load(&parity);
    let ck = Checkpoint::open(root().join(TARGET).to_str().unwrap()).unwrap();
    let m = DeepseekV3::load(&ck).unwrap();
    let tokens: Vec<u32> = tensor_i32s(&r, "tokens")
        .iter()
        .map(|&t| t as u32)
        .collect();
    let t = tokens.len();
    let f = m.forward(&tokens).unwrap();

    let (shape, logits) = tensor_f32s(&r, "logits");
    assert_eq!(shape, vec![t as u64, m.vocab as u64]);
    let d = rel_to(&f.logits, &logits);
    eprintln!("logits: max rel error {d:.3e}");
    assert!(
        d <= PARITY_REL_TOL,
        "logits: {d:.3e} > {PARITY_REL_TOL}{stale}"
    );
    let d = rel_to(&m.forward_ref(&tokens).unwrap().logits, &logits);
    eprintln!("logits (reference path): max rel error {d:.3e}");
    assert!(
        d <= PARITY_REL_TOL,
        "reference-path logits: {d:.3e} > {PARITY_REL_TOL}{stale}"
    );
    for i in 0..t {
        let (a, b) = (
            &f.logits[i * m.vocab..(i + 1) * m.vocab],
            &logits[i * m.vocab..(i + 1) * m.vocab],
        );
        assert_eq!(
            kquant::ops::argmax(a),
            kquant::ops::argmax(b),
            "argmax at {i}{stale}"
        );
    }

    let (shape, hs) = tensor_f32s(&r, "hidden_states");
    let n = t * m.hidden;
    assert_eq!(
        shape,
        vec![m.num_layers as u64 + 1, t as u64, m.hidden as u64]
    );
    assert_eq!(f.hidden_states.len(), m.num_layers + 1);
    for (i, ours) in f.hidden_states.iter().enumerate() {
        let d = rel_to(ours, &hs[i * n..(i + 1) * n]);
        eprintln!("hidden_states[{i}]: max rel error {d:.3e}");
        assert!(
            d <= PARITY_REL_TOL,
            "hidden_states[{i}]: {d:.3e} > {PARITY_REL_TOL}"
        );
    }

    let moe_layers: Vec<usize> = r
        .keys()
        .filter_map(|k| {
            k.strip_prefix("router.")?
                .strip_suffix(".topk_idx")?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(
        moe_layers,
        f.router.iter().map(|x| x.layer).collect::<Vec<_>>(),
        "MoE layers"
    );
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
