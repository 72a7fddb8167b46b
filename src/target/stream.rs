//! Which hidden state a tap holds. On a target with Block Attention Residuals (Kimi-K3,
//! `attn_res_block_size`) "the hidden state after layer t" has two meanings, and the engines
//! disagree on which one they hand a drafter; on every other target there is one residual
//! stream. A profile says which stream each engine taps by default (`AttentionResiduals`) and
//! which stream each published draft was trained on (`profile::PublishedDraft`).
//!
//! Facts, from the engines' sources: vLLM 0.33.0 `vllm/models/kimi_k3/nvidia/model.py` captures
//! `prefix_sum + pending_mlp_out` (the current block's partial sum) unless
//! `VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=1` (`vllm/envs.py`), which captures the attention-residual
//! mixture the next layer reads; SGLang 0.5.23 `srt/models/kimi_k3.py` captures that mixture
//! (`_dspark_capture_stream`) for DSpark and DFlash drafts.

use serde::{Deserialize, Serialize};

/// The hidden-state stream a tap reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum TapStream {
    /// The ordinary residual stream (`hidden + residual` after the layer) of a target without
    /// attention residuals: every engine taps it alike.
    Residual,
    /// Attention residuals: the current block's partial sum after the layer (the sublayer
    /// outputs since the block began; no embedding, no earlier blocks). vLLM's default.
    Partial,
    /// Attention residuals: the softmax mixture of the completed block sums and the partial sum
    /// that the next layer's attention reads, before its input norm. SGLang's, and vLLM's with
    /// `VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=1`.
    Mixture,
}

impl TapStream {
    pub fn id(self) -> &'static str {
        match self {
            TapStream::Residual => "residual",
            TapStream::Partial => "partial",
            TapStream::Mixture => "mixture",
        }
    }

    /// A stream by its name (`residual`, `partial`, `mixture`: the manifest's `tap_stream`).
    pub fn parse(s: &str) -> Option<TapStream> {
        [TapStream::Residual, TapStream::Partial, TapStream::Mixture]
            .into_iter()
            .find(|t| t.id() == s)
    }

    /// One line for users: what the stream is.
    pub fn about(self) -> &'static str {
        match self {
            TapStream::Residual => "the residual stream after the layer (a target without attention residuals)",
            TapStream::Partial => "the current attention-residual block's partial sum after the layer (vLLM's default)",
            TapStream::Mixture => "the attention-residual mixture the next layer reads, before its norm (SGLang; vLLM with VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=1)",
        }
    }
}

/// Whether a model's config.json has Block Attention Residuals: `attn_res_block_size` set in
/// its text config. The engines read that key, not the architecture: vLLM 0.33.0
/// `vllm/models/kimi_k3/nvidia/model.py` (`use_attn_res = attn_res_block_size is not None`)
/// taps the one residual stream of a K3 without it.
pub fn config_has_attention_residuals(cfg: &crate::checkpoint::Config) -> bool {
    cfg.text()
        .get("attn_res_block_size")
        .is_some_and(|v| !v.is_null())
}

/// One engine's tap stream on an attention-residual target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineStream {
    /// The engine and version (`vLLM 0.33.0`).
    pub engine: String,
    /// What it taps by default.
    pub default: TapStream,
    /// How to make it tap the other stream, if it can (`VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch: Option<String>,
    /// Where this is read.
    pub source: String,
}

/// A target's Block Attention Residuals, as far as taps are concerned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionResiduals {
    /// Layers per block (`attn_res_block_size`).
    pub block_size: usize,
    /// Each engine's stream.
    pub engines: Vec<EngineStream>,
    /// Where the block size and the mixing rule come from.
    pub source: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_ids_are_their_json_names() {
        for s in [TapStream::Residual, TapStream::Partial, TapStream::Mixture] {
            let j = serde_json::to_string(&s).unwrap();
            assert_eq!(j, format!("\"{}\"", s.id()));
            assert_eq!(serde_json::from_str::<TapStream>(&j).unwrap(), s);
        }
    }
}
