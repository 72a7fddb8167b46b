//! Layout claims: which engine loads an unquantized draft, by family × dialect × config
//! (`model_type`). One row per claim; for each engine the first row that matches wins, so the
//! specific rows come before the general ones.
//!
//! To change a claim, edit its row: `yes`/`no`/`depends`, the release it was checked with
//! ([`VLLM`], [`SGLANG`], or [`SOURCE`] for a reading of the engine's source), and the engine's
//! own reason (for a `no`, its error message, quoted).

use super::claim::{depends, no, yes, Claim, Engine, SGLANG, SOURCE, VLLM};
use crate::checkpoint::{Dialect, Family};

/// What a row asks of `config.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cfg {
    /// Any config.
    Any,
    /// `model_type` is this.
    ModelType(&'static str),
    /// No `model_type` key.
    NoModelType,
    /// A speculators config (`speculators_model_type`).
    Speculators,
}

/// What kquant knows of a draft's config.
#[derive(Debug, Clone, Copy, Default)]
pub struct ConfigFacts<'a> {
    pub model_type: Option<&'a str>,
    pub speculators: bool,
}

impl Cfg {
    fn matches(self, c: ConfigFacts) -> bool {
        match self {
            Cfg::Any => true,
            Cfg::ModelType(m) => c.model_type == Some(m),
            Cfg::NoModelType => c.model_type.is_none(),
            Cfg::Speculators => c.speculators,
        }
    }
}

/// One row: where it applies, and the claim.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub families: &'static [Family],
    pub dialects: &'static [Dialect],
    pub config: Cfg,
    pub claim: Claim,
}

const fn row(
    families: &'static [Family],
    dialects: &'static [Dialect],
    config: Cfg,
    claim: Claim,
) -> Row {
    Row {
        families,
        dialects,
        config,
        claim,
    }
}

use Dialect::{Eagle, Specforge, Torchspec, Vllm as VllmDialect, Zlab};
use Engine::{Sglang, Trtllm, Vllm};

const DRAFTS: &[Family] = &[Family::Eagle3, Family::Eagle3Mla, Family::Dflash];
const EAGLE3: &[Family] = &[Family::Eagle3];
const MLA: &[Family] = &[Family::Eagle3Mla];
const DFLASH: &[Family] = &[Family::Dflash];
/// Every draft dialect.
const ANY: &[Dialect] = &[Specforge, VllmDialect, Eagle, Torchspec, Zlab];
/// EAGLE-3 layouts with the EAGLE-3 architectures (`midlayer.*`: SpecForge, TorchSpec;
/// `layers.0.*`: vLLM, ModelOpt, speculators).
const EAGLE3_NATIVE: &[Dialect] = &[Specforge, VllmDialect, Torchspec];

const MLA_KV_SETUP: &str = "attention set-up for model_type `kimi_k2` (vLLM's `is_deepseek_mla` decides whether the draft gets an MLA KV cache) not run on CPU";

/// The table.
#[rustfmt::skip]
pub static LAYOUT: &[Row] = &[
    // No model_type: SGLang (transformers' AutoConfig) stops at config.
    row(DRAFTS, ANY, Cfg::NoModelType, no(Sglang, SGLANG, "config: \"Unrecognized model in <dir>. Should have a `model_type` key in its config.json\" (kquant convert eagle3 --to sglang writes one)")),

    // EAGLE-3, Llama-style attention.
    row(EAGLE3, ANY, Cfg::Speculators, yes(Vllm, VLLM, "speculators config (`speculators_model_type`), read by vLLM's SpeculatorsConfig; `layers.0.*` names")),
    row(EAGLE3, &[Eagle], Cfg::Any, yes(Vllm, VLLM, "with `method: eagle3`, vLLM's EAGLEConfig (vllm/transformers_utils/configs/eagle.py) rewrites architectures `LlamaForCausalLM` to `Eagle3LlamaForCausalLM`; `midlayer.` is renamed to `layers.0.` at load")),
    row(EAGLE3, &[Eagle], Cfg::Any, no(Sglang, SGLANG, "load: `AssertionError: self.org_vocab_size=<vocab_size> … loaded_weight.shape[output_dim]=<draft_vocab_size>`: SGLang builds architectures `LlamaForCausalLM` as the target class, whose lm_head has the full vocabulary (kquant convert eagle3 --to sglang)")),
    row(EAGLE3, &[Eagle], Cfg::Any, depends(Trtllm, SOURCE, "one-model mode ignores architectures; aux ids must be passed as eagle3_layers_to_capture")),
    row(EAGLE3, EAGLE3_NATIVE, Cfg::Any, yes(Vllm, VLLM, "Eagle3LlamaForCausalLM reads `layers.0.*` and renames `midlayer.` to `layers.0.` at load").serves_on_cpu("float32 and bf16, `method: eagle3`, 3 tokens a step, in the `kquant convert --to vllm` layout; at float32 every request's verify steps and accepted drafts equal kquant's replay (docs/verify.md, \"A real engine\")")),
    row(EAGLE3, EAGLE3_NATIVE, Cfg::Any, yes(Sglang, SGLANG, "llama_eagle3's load_weights maps `midlayer.` to `layers.0.` and reads both names (python/sglang/srt/models/llama_eagle3.py)")),
    row(EAGLE3, EAGLE3_NATIVE, Cfg::Any, yes(Trtllm, SOURCE, "reads `midlayer.*`; renames `layers.0.` to `midlayer.` at load")),

    // EAGLE-3 with DeepSeek MLA attention (Kimi drafts): the model_type decides.
    row(MLA, ANY, Cfg::ModelType("deepseek_v3"), no(Vllm, VLLM, "config: `Model architectures ['Eagle3DeepSeekMTPModel'] are not supported`: SpeculativeConfig.hf_config_override (vllm/config/speculative.py) takes a draft with model_type `deepseek_v3` for DeepSeek MTP (kquant convert eagle3 --to vllm writes model_type `kimi_k2`)")),
    row(MLA, ANY, Cfg::ModelType("kimi_k2"), yes(Vllm, VLLM, "Eagle3DeepseekV2ForCausalLM, `midlayer.` or `layers.0.`").unproven_on_cpu(MLA_KV_SETUP).version_note("vLLM PR #45764 adds `kimi_k2` to the EAGLE branch of `is_deepseek_mla`").serving_refused_on_cpu("the tiny MLA draft: float32: `expect weight to be bfloat16, float16, int8, fp8_e4m3 or uint8` (AMX_MLA `process_weights_after_loading`); bf16: `Head dimension 48 is not supported by MLA` at the first request (CPU MLA backend only)")),
    row(MLA, ANY, Cfg::Any, depends(Vllm, SOURCE, "model_type is neither `kimi_k2` (loads) nor `deepseek_v3` (read as DeepSeek MTP): not checked")),
    row(MLA, ANY, Cfg::ModelType("kimi_k2"), yes(Sglang, SGLANG, "deepseek_eagle3 loader, `midlayer.` or `layers.0.`").version_note("SGLang ≤ 0.5.11 rejects model_type `kimi_k2` (sglang #25673)")),
    row(MLA, ANY, Cfg::ModelType("deepseek_v3"), yes(Sglang, SGLANG, "deepseek_eagle3 loader, `midlayer.` or `layers.0.`")),
    row(MLA, ANY, Cfg::Any, depends(Sglang, SOURCE, "model_type is neither `kimi_k2` nor `deepseek_v3` (both load): not checked")),
    row(MLA, ANY, Cfg::Any, yes(Trtllm, SOURCE, "MLA chosen by kv_lora_rank; `midlayer.` or `layers.0.`")),

    // DFlash.
    row(DFLASH, ANY, Cfg::ModelType("dflash"), no(Vllm, VLLM, "config: \"The checkpoint you are trying to load has model type `dflash` but Transformers does not recognize this architecture\" (kquant convert dflash --to vllm)")),
    row(DFLASH, ANY, Cfg::ModelType("dflash"), no(Sglang, SGLANG, "config: \"The checkpoint you are trying to load has model type `dflash` but Transformers does not recognize this architecture\" (kquant convert dflash --to sglang)")),
    row(DFLASH, &[Torchspec], Cfg::Any, no(Vllm, SOURCE, "TorchSpec names (`context_proj`, `context_norm`, `final_norm`) are not read (kquant convert dflash --to vllm)")),
    row(DFLASH, &[Torchspec], Cfg::Any, no(Sglang, SOURCE, "TorchSpec names (`context_proj`, `context_norm`, `final_norm`) are not read (kquant convert dflash --to sglang)")),
    row(DFLASH, &[Zlab], Cfg::Any, yes(Vllm, VLLM, "DFlashDraftModel -> DFlashQwen3ForCausalLM (`method: dflash`)").serves_on_cpu("float32, `method: dflash`, 7 and 3 tokens a step (`verify --steps`); every request equals kquant's replay once the CPU build's context K-norm is applied per layer (its rms_norm kernel gives every layer layer 0's `k_norm`: about 1 % lower accept length; docs/verify.md, \"A real engine\")")),
    row(DFLASH, &[Zlab], Cfg::Any, yes(Sglang, SGLANG, "DFlashDraftModel (`--speculative-algorithm DFLASH`)")),
    row(DFLASH, &[Zlab], Cfg::Any, yes(Trtllm, SOURCE, "DFlash one-model drafter (`decoding_type: DFlash`; tensorrt_llm/_torch/models/modeling_dflash.py@7c7504c): reads `dflash_config` (`target_layer_ids`, `mask_token_id`), `fc`, `hidden_norm`, `layers.N.*`, `norm`; embedding and lm_head from the target").version_note("TensorRT-LLM has DFlash since NVIDIA/TensorRT-LLM#12794 (April 2026); earlier releases have no DFlash loader")),
    row(DFLASH, ANY, Cfg::Any, no(Trtllm, SOURCE, "TensorRT-LLM's DFlash loader (modeling_dflash.py@7c7504c) reads z-lab names (`fc`, `hidden_norm`, `norm`); TorchSpec's `context_proj`, `context_norm`, `final_norm` are not mapped (kquant convert dflash --to trtllm)")),
];

/// An EAGLE-3 draft without `lm_head`: what replaces a `yes` of this engine (none: unchanged).
pub fn without_lm_head(engine: Engine) -> Option<Claim> {
    match engine {
        Engine::Vllm => Some(yes(
            Engine::Vllm,
            SOURCE,
            "no lm_head in the draft: vLLM uses the target's (`has_own_lm_head` false)",
        )),
        _ => None,
    }
}

/// The claim for `engine` on a draft of `family` in `dialect` (none for targets, unknown
/// models, or a draft whose dialect could not be told).
pub fn claim(
    family: &Family,
    dialect: Option<Dialect>,
    config: ConfigFacts,
    engine: Engine,
) -> Option<&'static Claim> {
    let d = dialect?;
    LAYOUT
        .iter()
        .find(|r| {
            r.claim.engine == engine
                && r.families.contains(family)
                && r.dialects.contains(&d)
                && r.config.matches(config)
        })
        .map(|r| &r.claim)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::claim::Loads;

    fn loads(f: Family, d: Dialect, mt: Option<&str>, e: Engine) -> Loads {
        let c = ConfigFacts {
            model_type: mt,
            speculators: false,
        };
        claim(&f, Some(d), c, e).unwrap().loads
    }

    /// Every draft family × dialect it can be detected in has a claim for every engine.
    #[test]
    fn no_gaps() {
        for (f, ds) in [
            (
                Family::Eagle3,
                &[Specforge, VllmDialect, Eagle, Torchspec][..],
            ),
            (Family::Eagle3Mla, &[Specforge, VllmDialect, Torchspec][..]),
            (Family::Dflash, &[Torchspec, Zlab][..]),
        ] {
            for d in ds {
                for mt in [
                    None,
                    Some("llama"),
                    Some("kimi_k2"),
                    Some("deepseek_v3"),
                    Some("dflash"),
                ] {
                    for e in Engine::ALL {
                        let c = ConfigFacts {
                            model_type: mt,
                            speculators: mt.is_none(),
                        };
                        assert!(
                            claim(&f, Some(*d), c, e).is_some(),
                            "{f:?} {d:?} {mt:?} {e:?}"
                        );
                    }
                }
            }
        }
        assert!(claim(
            &Family::Target,
            Some(Dialect::Hf),
            ConfigFacts::default(),
            Engine::Vllm
        )
        .is_none());
    }

    /// The engine-loader tier's measurements (vLLM 0.33.0, SGLang 0.5.23).
    #[test]
    fn measured() {
        use Loads::{No, Yes};
        let e3 = Family::Eagle3;
        assert_eq!(loads(e3.clone(), VllmDialect, Some("llama"), Sglang), Yes);
        assert_eq!(loads(e3.clone(), Specforge, Some("llama"), Sglang), Yes);
        assert_eq!(loads(e3.clone(), Eagle, Some("llama"), Vllm), Yes);
        assert_eq!(loads(e3.clone(), Eagle, Some("llama"), Sglang), No);
        assert_eq!(loads(e3.clone(), VllmDialect, None, Sglang), No);
        let mla = Family::Eagle3Mla;
        assert_eq!(loads(mla.clone(), Torchspec, Some("deepseek_v3"), Vllm), No);
        assert_eq!(
            loads(mla.clone(), Torchspec, Some("deepseek_v3"), Sglang),
            Yes
        );
        assert_eq!(loads(mla.clone(), VllmDialect, Some("kimi_k2"), Vllm), Yes);
        assert_eq!(loads(mla, VllmDialect, Some("kimi_k2"), Sglang), Yes);
        assert_eq!(loads(Family::Dflash, Torchspec, Some("dflash"), Vllm), No);
        assert_eq!(loads(Family::Dflash, Zlab, Some("qwen3"), Sglang), Yes);
        let spec = ConfigFacts {
            model_type: None,
            speculators: true,
        };
        assert_eq!(
            claim(&Family::Eagle3, Some(VllmDialect), spec, Vllm)
                .unwrap()
                .loads,
            Yes
        );
    }
}
