//! Which serving engine loads a checkpoint as it is on disk, and why (or why not). Facts from
//! `shared/reference/draft-formats.md` §0, §2, §3, §5 and §8.

use serde::Serialize;

use super::detect::{Dialect, Dims, Family};
use super::quant_state::QuantState;
use super::Config;

/// One engine's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EngineSupport {
    pub engine: &'static str,
    /// `yes`, `no`, or `depends` (on the engine version).
    pub loads: &'static str,
    pub why: String,
}

fn e(engine: &'static str, loads: &'static str, why: impl Into<String>) -> EngineSupport {
    EngineSupport {
        engine,
        loads,
        why: why.into(),
    }
}

/// Engines for a detected checkpoint (empty for targets and unknown models).
pub fn support(
    family: &Family,
    dialect: Option<Dialect>,
    config: Option<&Config>,
    dims: &Dims,
    q: &QuantState,
) -> Vec<EngineSupport> {
    let mut v = match (family, dialect) {
        (Family::Eagle3, Some(Dialect::Eagle)) => vec![
            e("sglang", "no", "architectures `LlamaForCausalLM` must be rewritten to `LlamaForCausalLMEagle3` (kquant convert eagle3 --to sglang)"),
            e("vllm", "no", "architectures `LlamaForCausalLM` is not an EAGLE-3 class in vLLM (kquant convert eagle3 --to vllm)"),
            e("trtllm", "depends", "one-model mode ignores architectures; aux ids must be passed as eagle3_layers_to_capture"),
        ],
        (Family::Eagle3, Some(Dialect::Vllm)) => vec![
            e("sglang", "no", "SGLang's llama_eagle3 loader silently skips `layers.0.*` tensors (kquant convert eagle3 --to sglang)"),
            e("vllm", "yes", "native `layers.0.*` names"),
            e("trtllm", "yes", "renames `layers.0.` to `midlayer.` at load"),
        ],
        (Family::Eagle3, Some(_)) => vec![
            e("sglang", "yes", "native `midlayer.*` names"),
            e("vllm", "yes", "renames `midlayer.` to `layers.0.` at load"),
            e("trtllm", "yes", "native `midlayer.*` names"),
        ],
        (Family::Eagle3Mla, Some(_)) => {
            let mt = config.and_then(|c| c.model_type()).unwrap_or("");
            let kimi = mt == "kimi_k2";
            vec![
                if kimi {
                    e("sglang", "depends", "loads both prefixes, but SGLang ≤ 0.5.11 rejects model_type `kimi_k2` (sglang #25673)")
                } else {
                    e("sglang", "yes", "deepseek_eagle3 loader accepts `midlayer.` and `layers.0.`")
                },
                if kimi {
                    e("vllm", "depends", "model_type `kimi_k2` is detected as MLA only with vLLM PR #45764; `deepseek_v3` is safe")
                } else {
                    e("vllm", "yes", "Eagle3DeepseekV2ForCausalLM, either prefix")
                },
                e("trtllm", "yes", "MLA chosen by kv_lora_rank; either prefix"),
            ]
        }
        (Family::Dflash, Some(Dialect::Torchspec)) => vec![
            e("sglang", "no", "TorchSpec names (`context_proj`, `context_norm`, `final_norm`) are not read (kquant convert dflash --to sglang)"),
            e("vllm", "no", "TorchSpec names are not read (kquant convert dflash --to vllm)"),
            e("trtllm", "no", "no DFlash loader"),
        ],
        (Family::Dflash, Some(_)) => vec![
            e("sglang", "yes", "DFlashDraftModel"),
            e("vllm", "yes", "DFlashDraftModel -> DFlashQwen3ForCausalLM"),
            e("trtllm", "no", "no DFlash loader"),
        ],
        _ => Vec::new(),
    };
    if matches!(family, Family::Eagle3 | Family::Eagle3Mla) && !dims.has_lm_head {
        for s in v.iter_mut().filter(|s| s.loads == "yes") {
            if s.engine == "vllm" {
                s.loads = "depends";
                s.why
                    .push_str("; no lm_head: only recent vLLM shares the target's");
            }
        }
    }
    if q.quantized {
        for s in v.iter_mut().filter(|s| s.loads == "yes") {
            s.loads = "depends";
            s.why.push_str(&format!(
                "; quantized ({}): whether this engine has a kernel for the scheme depends on it (see `kquant schemes`)",
                q.method.as_deref().unwrap_or("no quantization_config")
            ));
        }
    }
    v
}
