//! The Kimi-K3 target's text model (`KimiK3ForConditionalGeneration`'s `language_model`) on CPU
//! in f32, as vLLM 0.33.0's `vllm/models/kimi_k3/nvidia/model.py` computes it (SGLang 0.5.23's
//! `srt/models/kimi_k3.py` read as a second source). It reuses the Kimi-Linear blocks (KDA with
//! K3's bounded decay and full-rank output gate, `runtime::kimi_linear`; NoPE MLA, here with
//! q-LoRA and the sigmoid output gate, `runtime::deepseek::attention`) and adds what K3 changes
//! around them:
//!
//! * Block Attention Residuals ([`attn_res`]): instead of one residual stream, every sublayer
//!   reads a mixture of the completed block sums (block 0 the embedding) and the current
//!   block's partial sum, then its own norm; a block-write layer (`layer % block == 0`) stores
//!   the partial sum as a block and restarts it at its attention output (`_pre_attn_norm`,
//!   `_post_attn_norm`); the output is the mixture under `output_attn_res_*`, then the norm.
//! * SiTU in every MLP (`deepseek::weights::Act`) and the LatentMoE ([`moe`]).
//!
//! The two tap streams ([`TapStream`]): after layer `l`, `partial` is the block's partial sum
//! including layer `l`'s MLP output (vLLM's `_capture_aux_hidden_stream` by default) and
//! `mixture` is the mixture the next consumer (layer `l + 1`'s attention side, or the output)
//! computes from it, before that consumer's norm (SGLang's `_dspark_capture_stream`, vLLM with
//! `VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=1`). [`KimiK3::forward_taps`] returns both;
//! [`ChunkedLm::forward`]'s HF-convention `hidden_states` carry the `partial` stream
//! (`hs[0]` the embedding, `hs[i]` after layer `i − 1`, `hs[L]` after the final norm).
//!
//! The attention residuals are per row, so the state carried between chunks is Kimi-Linear's
//! ([`LayerState`]: a KV cache per MLA layer, the conv and recurrent state per KDA layer), and
//! prefill then single-token steps compute what one chunk does. Reference path `OpImpl::Reference`
//! beside the fast one, as in the other targets.

pub mod attn_res;
pub mod config;
mod moe;
pub(crate) mod weights;

pub use config::K3Config;

use super::lm::{self, Chunk, ChunkedLm};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::ops::rms_norm;
use crate::runtime::deepseek::{moe as ds_moe, Forward, OpImpl, RouterOut, TokenMixer};
use crate::runtime::kimi_linear::LayerState;
use crate::target::stream::TapStream;
use weights::{Ffn, Weights};

/// A loaded Kimi-K3 target.
pub struct KimiK3 {
    pub cfg: K3Config,
    pub hidden: usize,
    pub vocab: usize,
    pub num_layers: usize,
    w: Weights,
}

/// Both tap streams after every layer, `[L]` of `[T, H]` each.
#[derive(Debug, Clone, Default)]
pub struct Taps {
    pub partial: Vec<Vec<f32>>,
    pub mixture: Vec<Vec<f32>>,
}

impl Taps {
    /// One stream's rows per layer; none for [`TapStream::Residual`] (K3 has no single
    /// residual stream).
    pub fn stream(&self, s: TapStream) -> Option<&[Vec<f32>]> {
        match s {
            TapStream::Partial => Some(&self.partial),
            TapStream::Mixture => Some(&self.mixture),
            TapStream::Residual => None,
        }
    }
}

/// A full forward with both tap streams.
#[derive(Debug, Clone)]
pub struct K3Forward {
    pub forward: Forward,
    pub taps: Taps,
}

/// Is this config.json a Kimi-K3 model?
pub fn is_kimi_k3(cfg: &crate::checkpoint::Config) -> bool {
    cfg.model_type() == Some("kimi_k3")
        || cfg
            .architectures()
            .iter()
            .any(|a| a == "KimiK3ForConditionalGeneration")
}

impl KimiK3 {
    /// Load a KimiK3ForConditionalGeneration checkpoint's text model; every tensor's shape is
    /// checked against config.json.
    pub fn load(ck: &Checkpoint) -> Result<KimiK3> {
        let cfg_file = lm::target_config(ck)?;
        if !is_kimi_k3(cfg_file) {
            return Err(Error::source(
                &ck.weights.dir,
                format!(
                    "is {:?} (model_type {:?}); this runtime runs KimiK3ForConditionalGeneration",
                    cfg_file.architectures(),
                    cfg_file.model_type()
                ),
            ));
        }
        let cfg = K3Config::read(cfg_file)?;
        let w = weights::load(ck, &cfg)?;
        let ds = cfg.ds();
        Ok(KimiK3 {
            hidden: ds.hidden,
            vocab: ds.vocab,
            num_layers: ds.layers,
            cfg,
            w,
        })
    }

    /// Causal forward over `tokens` with both tap streams.
    pub fn forward_taps(&self, e: OpImpl, tokens: &[u32]) -> Result<K3Forward> {
        self.check_tokens(tokens)?;
        let mut st = self.empty_state();
        let (c, taps) = self.run(e, tokens, &mut st, true);
        Ok(K3Forward {
            forward: Forward {
                logits: self.logits(e, &c.normed, tokens.len()),
                hidden_states: c.hidden_states,
                router: c.router,
            },
            taps,
        })
    }

    /// The mixture the consumer after layer `l` computes from `cur` (layer `l + 1`'s attention
    /// side, or the output), over the blocks it reads.
    fn consumer_mix(&self, l: usize, blocks: &[Vec<f32>], cur: &[f32], n: usize) -> Vec<f32> {
        let (c, h) = (&self.cfg, self.hidden);
        let (w, nb) = match self.w.layers.get(l + 1) {
            Some(next) => (&next.attn_res, (l + 1).div_ceil(c.block)),
            None => (&self.w.out_res, c.blocks()),
        };
        attn_res::mix(&blocks[..nb], cur, w, n, h, c.ds().eps)
    }

    /// One chunk through every layer; `record` keeps the hidden states, both tap streams and
    /// the router choices.
    fn run(&self, e: OpImpl, tokens: &[u32], st: &mut [LayerState], record: bool) -> (Chunk, Taps) {
        let (c, h, n) = (&self.cfg, self.hidden, tokens.len());
        let eps = c.ds().eps;
        let emb = lm::embed_rows(&self.w.embed, h, tokens);
        let mut hs = if record {
            vec![emb.clone()]
        } else {
            Vec::new()
        };
        let (mut taps, mut router) = (Taps::default(), Vec::new());
        let mut blocks = vec![emb.clone()];
        let mut partial = emb;
        let last = self.w.layers.len() - 1;
        let mut out = Vec::new();
        for (l, (layer, s)) in self.w.layers.iter().zip(st.iter_mut()).enumerate() {
            let write = l % c.block == 0;
            if write {
                match blocks.get_mut(l / c.block) {
                    Some(b) => *b = partial.clone(),
                    None => blocks.push(partial.clone()),
                }
            }
            let nb = l.div_ceil(c.block);
            let a = attn_res::mix(&blocks[..nb], &partial, &layer.attn_res, n, h, eps);
            let a = rms_norm(&a, h, &layer.input_norm, eps);
            let a = layer.mix.forward(e, &c.kl, &a, n, s);
            match write {
                true => partial = a,
                false => add(&mut partial, &a),
            }
            let nb = nb + usize::from(write);
            let f = attn_res::mix(&blocks[..nb], &partial, &layer.mlp_res, n, h, eps);
            let f = rms_norm(&f, h, &layer.post_norm, eps);
            let f = match &layer.ffn {
                Ffn::Dense(m) => ds_moe::mlp(e, m, &f, n, h),
                Ffn::Moe(m) => {
                    let (y, r) = moe::forward(e, c, m, &f, n);
                    if record {
                        router.push(RouterOut {
                            layer: l,
                            topk_idx: r.idx,
                            topk_weight: r.weight,
                        });
                    }
                    y
                }
            };
            add(&mut partial, &f);
            if record || l == last {
                let m = self.consumer_mix(l, &blocks, &partial, n);
                if record {
                    taps.partial.push(partial.clone());
                    taps.mixture.push(m.clone());
                    if l < last {
                        hs.push(partial.clone());
                    }
                }
                if l == last {
                    out = m;
                }
            }
        }
        let normed = rms_norm(&out, h, &self.w.norm, eps);
        if record {
            hs.push(normed.clone());
        }
        let chunk = Chunk {
            normed,
            hidden_states: hs,
            router,
        };
        (chunk, taps)
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

/// The K3 forward: the attention-residual stack over Kimi-Linear's per-layer state.
impl ChunkedLm for KimiK3 {
    /// Each layer's mixer state (Kimi-Linear's: KDA conv + recurrent state, or MLA KV cache).
    type State = Vec<LayerState>;

    fn empty_state(&self) -> Vec<LayerState> {
        let kl = &self.cfg.kl;
        self.w
            .layers
            .iter()
            .map(|l| l.mix.empty_state(kl))
            .collect()
    }
    fn chunk(&self, e: OpImpl, tokens: &[u32], st: &mut Vec<LayerState>, record: bool) -> Chunk {
        self.run(e, tokens, st, record).0
    }
    fn lm_head(&self) -> &[f32] {
        &self.w.lm_head
    }
    fn vocab(&self) -> usize {
        self.vocab
    }
    fn hidden(&self) -> usize {
        self.hidden
    }
}

/// Incremental decoding of the K3 target (`lm::Session`).
pub type Session<'m> = lm::Session<'m, KimiK3>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::deepseek::DECODE_REL_TOL;
    use crate::runtime::lm::checks;

    const TARGET: &str = "fixtures/kimi-k3-tiny/target-random";

    fn tiny() -> KimiK3 {
        let ck = Checkpoint::open(&format!("{}/{TARGET}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        KimiK3::load(&ck).unwrap()
    }

    #[test]
    fn fast_path_matches_the_reference_and_decode_the_forward() {
        let m = tiny();
        checks::fast_path_matches_the_reference(&m, m.num_layers, 5, "layers 1..=5 are MoE");
        let x = checks::tokens(9, m.vocab);
        let (f, r) = (
            m.forward_taps(OpImpl::Fast, &x).unwrap(),
            m.forward_taps(OpImpl::Reference, &x).unwrap(),
        );
        for s in [TapStream::Partial, TapStream::Mixture] {
            let (a, b) = (f.taps.stream(s).unwrap(), r.taps.stream(s).unwrap());
            assert_eq!(a.len(), 6);
            for (a, b) in a.iter().zip(b) {
                assert!(checks::rel(b, a) <= crate::runtime::FAST_REL_TOL);
            }
        }
        assert!(f.taps.stream(TapStream::Residual).is_none());
        // Incremental decoding (the attention residuals are per row; the KDA and MLA state is
        // carried) computes what the full forward does.
        let (prompt, gen, _) = checks::incremental_decode_matches(&m, DECODE_REL_TOL);
        checks::a_stop_token_ends_greedy(&m, &prompt, &gen);
    }

    #[test]
    fn a_wrong_shape_names_the_tensor_and_other_models_are_refused() {
        let (_d, ck) = checks::edited_fixture(
            TARGET,
            "\"routed_expert_hidden_size\": 32",
            "\"routed_expert_hidden_size\": 16",
        );
        let e = KimiK3::load(&ck).err().unwrap().to_string();
        // The first routed expert of the first MoE layer, its shape and the one expected.
        let expert = "language_model.layers.1.block_sparse_moe.experts.0.w1.weight";
        for want in [expert, "[32, 32]", "[32, 16]"] {
            assert!(e.contains(want), "{want} in {e}");
        }
        let kl = format!(
            "{}/fixtures/kimi-linear-tiny/target",
            env!("CARGO_MANIFEST_DIR")
        );
        let e = KimiK3::load(&Checkpoint::open(&kl).unwrap()).err().unwrap();
        assert!(
            e.to_string().contains("KimiK3ForConditionalGeneration"),
            "{e}"
        );
    }
}
