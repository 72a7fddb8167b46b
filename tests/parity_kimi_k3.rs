//! The CPU Kimi-K3 target (`runtime::kimi_k3`) against the plain-PyTorch K3 reference written
//! from vLLM 0.33.0's K3 model code (fixtures/gen/kimi-k3/k3.py) on the random K3-shaped tiny
//! target: fixtures/kimi-k3-tiny/reference/parity-random.safetensors (written by
//! fixtures/gen/kimi-k3/make_random.py: 24 random tokens; the prefill logits and both tap
//! streams after every layer, `partial` and `mixture`; then a 16-token prefill and 8
//! single-token steps, every row's logits and each KDA layer's recurrent and conv state after
//! the last); and on the trained fixture target, fixtures/kimi-k3-tiny/target against
//! reference/parity-target.safetensors (fixtures/gen/kimi-k3/make_parity.py: the same set on the
//! first 24 tokens of trace sample 0). Bounds as the Kimi-Linear parity's.

use crate::common;

use common::{load, rel_to, root, tensor_f32s, tensor_i32s, Tensors};
use kquant::checkpoint::Checkpoint;
use kquant::runtime::deepseek::{OpImpl, DECODE_REL_TOL};
use kquant::runtime::kimi_k3::KimiK3;
use kquant::runtime::kimi_linear::LayerState;
use kquant::runtime::lm::ChunkedLm;
use kquant::target::stream::TapStream;

/// The random stand-in and the trained fixture target, each with its reference results and
/// its KDA layers (0-based).
const RANDOM: Case = Case {
    target: "fixtures/kimi-k3-tiny/target-random",
    parity: "fixtures/kimi-k3-tiny/reference/parity-random.safetensors",
    kda: &[0, 1, 3],
};
const TRAINED: Case = Case {
    target: "fixtures/kimi-k3-tiny/target",
    parity: "fixtures/kimi-k3-tiny/reference/parity-target.safetensors",
    kda: &[0, 1, 2, 4, 5],
};

struct Case {
    target: &'static str,
    parity: &'static str,
    kda: &'static [usize],
}

/// tests/parity_kimi_linear.rs's bound: max |ours − torch| / max |torch| per tensor.
const PARITY_REL_TOL: f32 = 1e-4;

fn setup(c: &Case) -> (Tensors, KimiK3, Vec<u32>) {
    let r = load(&root().join(c.parity));
    let ck = Checkpoint::open(root().join(c.target).to_str().unwrap()).unwrap();
    let m = KimiK3::load(&ck).unwrap();
    let tokens = tensor_i32s(&r, "tokens")
        .iter()
        .map(|&t| t as u32)
        .collect();
    (r, m, tokens)
}

#[test]
fn kimi_k3_forward_and_both_tap_streams_match_the_reference() {
    forward_and_streams_match(&RANDOM);
}

/// The same on the trained target (bf16 weights, A_log, dt_bias and the router bias f32).
#[test]
fn trained_kimi_k3_forward_and_both_tap_streams_match_the_reference() {
    forward_and_streams_match(&TRAINED);
}

fn forward_and_streams_match(c: &Case) {
    let (r, m, tokens) = setup(c);
    let t = tokens.len();
    let (shape, logits) = tensor_f32s(&r, "logits");
    assert_eq!(shape, vec![t as u64, m.vocab as u64]);
    let n = t * m.hidden;
    for e in [OpImpl::Fast, OpImpl::Reference] {
        let f = m.forward_taps(e, &tokens).unwrap();
        let d = rel_to(&f.forward.logits, &logits);
        eprintln!("{e:?} logits: max rel error {d:.3e}");
        assert!(d <= PARITY_REL_TOL, "{e:?} logits: {d:.3e}");
        for (s, key) in [
            (TapStream::Partial, "partial"),
            (TapStream::Mixture, "mixture"),
        ] {
            let (shape, want) = tensor_f32s(&r, key);
            assert_eq!(shape, vec![m.num_layers as u64, t as u64, m.hidden as u64]);
            let ours = f.taps.stream(s).unwrap();
            assert_eq!(ours.len(), m.num_layers);
            for (l, o) in ours.iter().enumerate() {
                let d = rel_to(o, &want[l * n..(l + 1) * n]);
                eprintln!("{e:?} {key} after layer {l}: max rel error {d:.3e}");
                assert!(d <= PARITY_REL_TOL, "{e:?} {key}[{l}]: {d:.3e}");
            }
        }
        // The streams differ: which one a draft reads matters.
        let (p, x) = (&f.taps.partial[2], &f.taps.mixture[2]);
        assert!(rel_to(p, x) > 1e-2);
        // HF-convention hidden states carry the partial stream, then the final norm.
        let hs = &f.forward.hidden_states;
        assert_eq!(hs.len(), m.num_layers + 1);
        assert_eq!(&hs[3], &f.taps.partial[2]);
        assert_eq!(f.forward.router.len(), m.num_layers - 1, "layer 0 is dense");
    }
}

/// The reference's prefill-then-steps against a kquant session fed the same way: each step's
/// logits, and every KDA layer's recurrent and conv state after the last token.
#[test]
fn kimi_k3_decode_carries_the_kda_state_exactly() {
    decode_carries_the_state(&RANDOM);
}

#[test]
fn trained_kimi_k3_decode_carries_the_kda_state_exactly() {
    decode_carries_the_state(&TRAINED);
}

fn decode_carries_the_state(c: &Case) {
    let (r, m, tokens) = setup(c);
    let prefill = tensor_i32s(&r, "decode.prefill")[0] as usize;
    let (_, want) = tensor_f32s(&r, "decode.logits");
    let v = m.vocab;
    let mut s = m.session();
    let mut rows = vec![s.extend(&tokens[..prefill]).unwrap()];
    for &t in &tokens[prefill..tokens.len() - 1] {
        rows.push(s.step(t).unwrap());
    }
    let full = m.forward(&tokens).unwrap().logits;
    for (i, row) in rows.iter().enumerate() {
        let p = prefill - 1 + i;
        let d = rel_to(row, &want[p * v..(p + 1) * v]);
        eprintln!("decode position {p}: logits max rel error {d:.3e}");
        assert!(d <= PARITY_REL_TOL, "decode position {p}: {d:.3e}");
        let d = rel_to(row, &full[p * v..(p + 1) * v]);
        assert!(d <= DECODE_REL_TOL, "decode vs prefill at {p}: {d:.3e}");
    }
    s.step(tokens[tokens.len() - 1]).unwrap();
    let (kda, hd) = (&m.cfg.kl.kda, m.cfg.kl.kda.head_dim as u64);
    let kda_layers: Vec<usize> = (0..m.num_layers)
        .filter(|l| r.contains_key(&format!("state.{l}.recurrent")))
        .collect();
    assert_eq!(
        kda_layers, c.kda,
        "the KDA layers, and only they, carry a state"
    );
    for &l in &kda_layers {
        let LayerState::Kda(k) = &s.state()[l] else {
            panic!("layer {l} is a KDA layer")
        };
        let (shape, want) = tensor_f32s(&r, &format!("state.{l}.recurrent"));
        assert_eq!(shape, vec![kda.heads as u64, hd, hd]);
        let d = rel_to(&k.s, &want);
        eprintln!("layer {l} recurrent state: max rel error {d:.3e}");
        assert!(d <= PARITY_REL_TOL, "layer {l} state: {d:.3e}");
        // The reference's conv state is [3C, K − 1]; ours [K − 1, 3C].
        let (shape, want) = tensor_f32s(&r, &format!("state.{l}.conv"));
        let (ch, k1) = (shape[0] as usize, shape[1] as usize);
        let ours: Vec<f32> = (0..ch)
            .flat_map(|c| (0..k1).map(move |j| (c, j)))
            .map(|(c, j)| k.conv[j * ch + c])
            .collect();
        assert!(
            rel_to(&ours, &want) <= PARITY_REL_TOL,
            "layer {l} conv state"
        );
        // Prefill in one chunk carries the same state, bit for bit.
        let mut one = m.session();
        one.extend(&tokens).unwrap();
        let LayerState::Kda(k1s) = &one.state()[l] else {
            unreachable!()
        };
        assert_eq!((&k1s.s, &k1s.conv), (&k.s, &k.conv), "layer {l}");
    }
}
