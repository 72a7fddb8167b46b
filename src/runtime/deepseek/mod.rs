//! The Kimi-K2 / DeepSeek-V3 target (`DeepseekV3ForCausalLM`) forward on CPU in f32, exactly as
//! transformers 5.23's `modeling_deepseek_v3.py` computes it: MLA attention with YaRN RoPE
//! (`attention`), dense MLP for layers < `first_k_dense_replace` and grouped-top-k sigmoid MoE
//! with shared experts after (`moe`). Weights are read in any dtype or quantized layout
//! `quant::decode` knows and upcast to f32 (`weights`).
//!
//! One chunk routine ([`ChunkedLm::chunk`]) runs `n` new positions against a per-layer KV cache:
//! the full forward is one chunk over an empty cache, greedy decoding ([`Session`], `lm`) a
//! prompt chunk then one token at a time. Every op is row-independent, so both give the same numbers. A plain reference path
//! (`ops::linear_ref`, serial) sits beside the fast one (`ops::linear`, rayon over heads and
//! experts), compared in the tests under [`super::FAST_REL_TOL`].

pub(crate) mod attention;
pub mod config;
pub(crate) mod moe;
pub(crate) mod weights;

pub use config::DsConfig;
pub use moe::Routed;

pub use super::lm::{Forward, OpImpl, RouterOut};

use super::lm::{self, Chunk, ChunkedLm};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::ops::rms_norm;
use attention::KvCache;
use weights::{Attn, Ffn, Layer, Weights};

/// Incremental decode vs the full forward, same measure (every op is row-independent, so the
/// two are expected to agree exactly; measured 0).
pub const DECODE_REL_TOL: f32 = 1e-5;

/// A loaded target: its config (`C`, DeepSeek's [`DsConfig`] or one around it), its sizes and
/// its weights, each layer's token mixer an `M` (MLA here; KDA or MLA in
/// [`super::kimi_linear`]). Both targets run the one decoder stack ([`ChunkedLm`] below).
pub struct Decoder<C, M> {
    pub cfg: C,
    pub hidden: usize,
    pub vocab: usize,
    pub num_layers: usize,
    w: Weights<Layer<M>>,
}

/// A loaded Kimi-K2 / DeepSeek-V3 target.
pub type DeepseekV3 = Decoder<DsConfig, Attn>;

/// A decoder layer's token mixer under config `C`: the state it carries from one chunk to the
/// next, and its forward over `n` new (normed) rows.
pub trait TokenMixer<C> {
    type State;
    /// The state before the first position.
    fn empty_state(&self, cfg: &C) -> Self::State;
    fn forward(&self, e: OpImpl, cfg: &C, x: &[f32], n: usize, st: &mut Self::State) -> Vec<f32>;
}

/// MLA, its state one KV cache.
impl TokenMixer<DsConfig> for Attn {
    type State = KvCache;
    fn empty_state(&self, _: &DsConfig) -> KvCache {
        KvCache::default()
    }
    fn forward(
        &self,
        e: OpImpl,
        cfg: &DsConfig,
        x: &[f32],
        n: usize,
        kv: &mut KvCache,
    ) -> Vec<f32> {
        attention::forward(e, cfg, self, x, n, kv)
    }
}

impl AsRef<DsConfig> for DsConfig {
    fn as_ref(&self) -> &DsConfig {
        self
    }
}

impl<C: AsRef<DsConfig>, M> Decoder<C, M> {
    /// The loaded target over `cfg` and its weights.
    pub(crate) fn new(cfg: C, w: Weights<Layer<M>>) -> Decoder<C, M> {
        let ds = cfg.as_ref();
        Decoder {
            hidden: ds.hidden,
            vocab: ds.vocab,
            num_layers: ds.layers,
            cfg,
            w,
        }
    }
}

/// The feed-forward block of layer `l` over `n` rows of `cfg.hidden`: the dense MLP, or the
/// MoE with its router's choice pushed to `router` when one is given (both targets' layers).
pub(crate) fn ffn_block(
    e: OpImpl,
    cfg: &DsConfig,
    ffn: &Ffn,
    x: &[f32],
    n: usize,
    l: usize,
    router: Option<&mut Vec<RouterOut>>,
) -> Vec<f32> {
    match ffn {
        Ffn::Dense(m) => moe::mlp(e, m, x, n, cfg.hidden),
        Ffn::Moe(m) => {
            let (y, r) = moe::forward(e, cfg, m, x, n);
            if let Some(out) = router {
                out.push(RouterOut {
                    layer: l,
                    topk_idx: r.idx,
                    topk_weight: r.weight,
                });
            }
            y
        }
    }
}

impl DeepseekV3 {
    /// Load a DeepseekV3ForCausalLM (or Kimi-K2.5 wrapper) checkpoint; every tensor's shape is
    /// checked against config.json.
    pub fn load(ck: &Checkpoint) -> Result<DeepseekV3> {
        let cfg_file = lm::target_config(ck)?;
        let mt = cfg_file.text().get("model_type").and_then(|v| v.as_str());
        let arch = cfg_file.architectures();
        let known = matches!(mt, Some("deepseek_v3" | "kimi_k2"))
            || arch.iter().any(|a| a == "DeepseekV3ForCausalLM");
        if !known {
            return Err(Error::Source {
                path: ck.weights.dir.clone(),
                msg: format!(
                    "is {arch:?} (model_type {mt:?}); the target runtime runs DeepseekV3ForCausalLM (Kimi-K2)"
                ),
                hint: None,
            });
        }
        let cfg = DsConfig::read(cfg_file)?;
        let w = weights::load(ck, &cfg)?;
        Ok(Decoder::new(cfg, w))
    }
}

/// Each target's forward, written once: the embedding rows; per layer `x += mix(norm(x))` (the
/// layer's [`TokenMixer`] on its state) then `x += ffn(norm(x))`; the final norm.
impl<C: AsRef<DsConfig>, M: TokenMixer<C>> ChunkedLm for Decoder<C, M> {
    /// Each layer's mixer state (MLA: a KV cache).
    type State = Vec<M::State>;

    fn vocab(&self) -> usize {
        self.vocab
    }
    fn hidden(&self) -> usize {
        self.hidden
    }
    fn lm_head(&self) -> &[f32] {
        &self.w.lm_head
    }
    fn empty_state(&self) -> Vec<M::State> {
        let layers = self.w.layers.iter();
        layers.map(|l| l.mix.empty_state(&self.cfg)).collect()
    }

    fn chunk(&self, e: OpImpl, tokens: &[u32], states: &mut Vec<M::State>, record: bool) -> Chunk {
        let cfg = self.cfg.as_ref();
        let (h, n) = (cfg.hidden, tokens.len());
        let mut x = lm::embed_rows(&self.w.embed, h, tokens);
        let (mut hs, mut router) = (Vec::new(), Vec::new());
        for (l, (layer, st)) in self.w.layers.iter().zip(states.iter_mut()).enumerate() {
            if record {
                hs.push(x.clone());
            }
            let a = rms_norm(&x, h, &layer.input_norm, cfg.eps);
            let a = layer.mix.forward(e, &self.cfg, &a, n, st);
            x.iter_mut().zip(&a).for_each(|(r, v)| *r += v);
            let f = rms_norm(&x, h, &layer.post_norm, cfg.eps);
            let f = ffn_block(e, cfg, &layer.ffn, &f, n, l, record.then_some(&mut router));
            x.iter_mut().zip(&f).for_each(|(r, v)| *r += v);
        }
        let normed = rms_norm(&x, h, &self.w.norm, cfg.eps);
        if record {
            hs.push(normed.clone());
        }
        Chunk {
            normed,
            hidden_states: hs,
            router,
        }
    }
}

/// Incremental decoding of the Kimi-K2 target (`lm::Session`).
pub type Session<'m> = lm::Session<'m, DeepseekV3>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::lm::checks;

    fn tiny() -> DeepseekV3 {
        let root = env!("CARGO_MANIFEST_DIR");
        let ck = Checkpoint::open(&format!("{root}/fixtures/tiny/target-kimi-k2")).unwrap();
        DeepseekV3::load(&ck).unwrap()
    }

    #[test]
    fn fast_path_matches_the_reference() {
        let m = tiny();
        checks::fast_path_matches_the_reference(&m, m.num_layers, 2, "layers 1 and 2 are MoE");
    }

    #[test]
    fn incremental_decode_matches_the_full_forward() {
        let m = tiny();
        let (prompt, gen, _) = checks::incremental_decode_matches(&m, DECODE_REL_TOL);
        checks::a_stop_token_ends_greedy(&m, &prompt, &gen);
    }

    #[test]
    fn a_wrong_shape_names_the_tensor() {
        let (_d, ck) = checks::edited_fixture(
            "fixtures/tiny/target-kimi-k2",
            "\"kv_lora_rank\": 16",
            "\"kv_lora_rank\": 12",
        );
        let e = DeepseekV3::load(&ck).err().unwrap().to_string();
        assert!(
            e.contains("model.layers.0.self_attn.kv_a_proj_with_mqa.weight")
                && e.contains("[24, 64]")
                && e.contains("[20, 64]"),
            "{e}"
        );
    }

    #[test]
    fn loads_the_multimodal_wrapper() {
        let root = env!("CARGO_MANIFEST_DIR");
        let ck = Checkpoint::open(&format!("{root}/fixtures/tiny/target-kimi-k2.5")).unwrap();
        let m = DeepseekV3::load(&ck).unwrap();
        assert_eq!((m.num_layers, m.hidden, m.vocab), (2, 64, 256));
        let f = m.forward(&[1, 2, 3]).unwrap();
        assert!(f.logits.iter().all(|v| v.is_finite()));
        assert!(m.forward(&[256]).is_err(), "token outside the vocab");
    }
}
