//! The Kimi-Linear target (`KimiLinearForCausalLM`, moonshotai/Kimi-Linear-48B-A3B) forward on
//! CPU in f32, as transformers 5.23's `modeling_kimi_linear.py` computes it: Kimi Delta
//! Attention in the layers `linear_attn_config.kda_layers` names (`kda`), DeepSeek MLA without
//! RoPE in the others, a dense SwiGLU MLP below `first_k_dense_replace` and the sigmoid MoE with
//! a shared expert above (both from `runtime::deepseek`). Weights are read in any dtype or
//! quantized layout `quant::decode` knows, under the checkpoint's own names (`weights`).
//!
//! One chunk routine runs `n` new positions against per-layer state (a KV cache for MLA, the
//! conv and recurrent state for KDA): the full forward is one chunk from empty state, greedy
//! decoding ([`Session`]) a prompt chunk then one token at a time; the recurrence is run token
//! by token in both, so the two agree exactly. A plain reference path (`ops::linear_ref`,
//! serial) sits beside the fast one (rayon over heads and experts), compared under
//! [`super::FAST_REL_TOL`].

pub mod config;
mod kda;
pub(crate) mod weights;

pub use config::{Kda, KlConfig, Mixer};
pub use kda::KdaState;

use super::lm;
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::runtime::deepseek::attention::{self, KvCache};
use crate::runtime::deepseek::{Decoder, DsConfig, OpImpl, TokenMixer};
use weights::Mix;

/// A loaded Kimi-Linear target.
pub type KimiLinear = Decoder<KlConfig, Mix>;

/// One layer's carried state.
#[derive(Debug, Clone)]
pub enum LayerState {
    Kda(KdaState),
    Mla(KvCache),
}

/// Is this config.json a Kimi-Linear model?
pub fn is_kimi_linear(cfg: &crate::checkpoint::Config) -> bool {
    cfg.text().get("model_type").and_then(|v| v.as_str()) == Some("kimi_linear")
        || cfg
            .architectures()
            .iter()
            .any(|a| a == "KimiLinearForCausalLM")
}

impl KimiLinear {
    /// Load a KimiLinearForCausalLM checkpoint; every tensor's shape is checked against
    /// config.json.
    pub fn load(ck: &Checkpoint) -> Result<KimiLinear> {
        let cfg_file = lm::target_config(ck)?;
        if !is_kimi_linear(cfg_file) {
            return Err(Error::source(
                &ck.weights.dir,
                format!(
                    "is {:?} (model_type {:?}); this runtime runs KimiLinearForCausalLM",
                    cfg_file.architectures(),
                    cfg_file.text().get("model_type")
                ),
            ));
        }
        let cfg = KlConfig::read(cfg_file)?;
        let w = weights::load(ck, &cfg)?;
        Ok(Decoder::new(cfg, w))
    }
}

impl AsRef<DsConfig> for KlConfig {
    fn as_ref(&self) -> &DsConfig {
        &self.ds
    }
}

/// KDA or MLA, per layer: the state the layer's mixer carries ([`LayerState`]).
impl TokenMixer<KlConfig> for Mix {
    type State = LayerState;
    fn empty_state(&self, cfg: &KlConfig) -> LayerState {
        match self {
            Mix::Kda(_) => LayerState::Kda(KdaState::new(cfg)),
            Mix::Mla(_) => LayerState::Mla(KvCache::default()),
        }
    }
    fn forward(
        &self,
        e: OpImpl,
        cfg: &KlConfig,
        x: &[f32],
        n: usize,
        st: &mut LayerState,
    ) -> Vec<f32> {
        match (self, st) {
            (Mix::Kda(w), LayerState::Kda(s)) => kda::forward(e, cfg, w, x, n, s),
            (Mix::Mla(w), LayerState::Mla(kv)) => attention::forward(e, &cfg.ds, w, x, n, kv),
            _ => unreachable!("state built from the same mixer list"),
        }
    }
}

/// Incremental decoding of the Kimi-Linear target (`lm::Session`); its
/// [`state`](lm::Session::state) is every layer's carried state.
pub type Session<'m> = lm::Session<'m, KimiLinear>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::deepseek::DECODE_REL_TOL;
    use crate::runtime::lm::{checks, ChunkedLm};

    const TARGET: &str = "fixtures/kimi-linear-tiny/target";

    fn tiny() -> KimiLinear {
        let ck = Checkpoint::open(&format!("{}/{TARGET}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        KimiLinear::load(&ck).unwrap()
    }

    fn kda_states(s: &Session) -> Vec<(Vec<f32>, Vec<f32>)> {
        s.state()
            .iter()
            .filter_map(|l| match l {
                LayerState::Kda(k) => Some((k.conv.clone(), k.s.clone())),
                LayerState::Mla(_) => None,
            })
            .collect()
    }

    #[test]
    fn the_fixture_is_the_hybrid_it_claims() {
        let m = tiny();
        assert_eq!(
            m.cfg.mixers,
            vec![Mixer::Kda, Mixer::Kda, Mixer::Mla, Mixer::Kda],
            "1-based kda_layers [1, 2, 4], full_attn_layers [3]"
        );
        assert!(m.cfg.ds.nope_only);
    }

    #[test]
    fn fast_path_matches_the_reference() {
        let m = tiny();
        checks::fast_path_matches_the_reference(&m, m.num_layers, 3, "layers 1, 2, 3 are MoE");
    }

    #[test]
    fn incremental_decode_carries_the_state_exactly() {
        let m = tiny();
        let (prompt, gen, all) = checks::incremental_decode_matches(&m, DECODE_REL_TOL);
        // The recurrent and conv states after a prompt fed at once, in two chunks, and one
        // token at a time are the same numbers: the recurrence runs token by token in each.
        let mut one = m.session();
        one.extend(&all).unwrap();
        let mut two = m.session();
        two.extend(&all[..7]).unwrap();
        two.extend(&all[7..]).unwrap();
        let mut each = m.session();
        for &t in &all {
            each.step(t).unwrap();
        }
        let (a, b, c) = (kda_states(&one), kda_states(&two), kda_states(&each));
        assert_eq!(a.len(), 3);
        assert!(a.iter().all(|(_, s)| s.iter().any(|x| *x != 0.0)));
        assert_eq!(a, b, "prefill in two chunks");
        assert_eq!(a, c, "one token at a time");
        checks::a_stop_token_ends_greedy(&m, &prompt, &gen);
    }

    #[test]
    fn a_wrong_shape_names_the_tensor() {
        let (_d, ck) = checks::edited_fixture(TARGET, "\"head_dim\": 64", "\"head_dim\": 32");
        let e = KimiLinear::load(&ck).err().unwrap().to_string();
        assert!(
            e.contains("model.layers.0.self_attn.q_conv1d.weight")
                && e.contains("[256, 1, 4]")
                && e.contains("[128, 1, 4]"),
            "{e}"
        );
        // Not a Kimi-Linear checkpoint: named, not run as one.
        let k2 = format!(
            "{}/fixtures/tiny/target-kimi-k2",
            env!("CARGO_MANIFEST_DIR")
        );
        let e = KimiLinear::load(&Checkpoint::open(&k2).unwrap())
            .err()
            .unwrap();
        assert!(e.to_string().contains("KimiLinearForCausalLM"), "{e}");
    }
}
