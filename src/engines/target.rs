//! Which serving engines cannot run a draft's family beside a target architecture.
//!
//! A draft's own layout says nothing about the target class the engine must build: a DFlash
//! drafter for Kimi-Linear is laid out like one for Kimi-K2.5, and an engine loads both, but
//! serving it needs the engine's *target* model class to capture the taps. [`on_target`] holds
//! what the engines' sources say about that, one row per (family, architecture, engine);
//! `convert` warns from it and `quantize`'s next steps leave such an engine out. Which target a
//! draft was made for (its shape against the target profiles) is `crate::target::shape`.

use serde::Serialize;

use super::Engine;
use crate::checkpoint::{Checkpoint, Detection, Family};
use crate::target::shape::{identify, NamedTarget};
use crate::target::Profile;

/// Whether an engine runs a draft family on a target architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Serves {
    /// It does not: the engine's target class cannot capture the draft's taps.
    No,
    /// Only from a build (or release) that the engine's source names; older ones refuse.
    FromBuild,
}

impl Serves {
    pub fn id(self) -> &'static str {
        match self {
            Serves::No => "no",
            Serves::FromBuild => "from-build",
        }
    }
}

/// One engine's verdict on serving a draft family beside a target architecture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OnTarget {
    pub engine: Engine,
    pub architecture: &'static str,
    pub serves: Serves,
    /// What the engine does, in its own words where it raises.
    pub why: &'static str,
    /// Where it was read: the engine's source files and pull requests.
    pub source: &'static str,
}

const KIMI_LINEAR: &str = "KimiLinearForCausalLM";

const VLLM_KIMI_LINEAR_WHY: &str = "vLLM runs DFlash and EAGLE-3 through the target's aux-hidden-state capture, which needs the target class to declare SupportsEagle3; KimiLinearForCausalLM declares it only from the build that merged vllm-project/vllm#52171 (2026-08-13), and older builds stop with \"Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested\": check `supports_eagle3` on the installed build's KimiLinearForCausalLM";
const VLLM_KIMI_LINEAR_SRC: &str = "vllm/v1/worker/gpu_model_runner.py (the supports_eagle3 check); vllm/model_executor/models/kimi_linear.py (KimiLinearForCausalLM(nn.Module, HasInnerState, SupportsPP, MixtureOfExperts, IsHybrid)); vllm-project/vllm#52171";

/// What the engines' sources say about serving `family` beside a target of `architecture` on
/// `engine`; `None` where kquant knows of nothing in the way (the draft-layout and quantization
/// claims of `crate::engines` still apply).
pub fn on_target(family: &Family, architecture: &str, engine: Engine) -> Option<OnTarget> {
    if architecture != KIMI_LINEAR {
        return None;
    }
    let row = |serves, why, source| {
        Some(OnTarget {
            engine,
            architecture: KIMI_LINEAR,
            serves,
            why,
            source,
        })
    };
    match (family, engine) {
        (Family::Dflash | Family::Eagle3 | Family::Eagle3Mla, Engine::Vllm) => row(
            Serves::FromBuild,
            VLLM_KIMI_LINEAR_WHY,
            VLLM_KIMI_LINEAR_SRC,
        ),
        (Family::Dflash, Engine::Sglang) => row(
            Serves::No,
            "SGLang captures a DFlash drafter's taps through the target's set_dflash_layers_to_capture (or set_dspark_layers_to_capture under DSPARK); its KimiLinearForCausalLM has only the DSpark one, so --speculative-algorithm DFLASH stops with \"implements neither ...\" (sgl-project/sglang#35784, open, adds the alias for Kimi-K3 only)",
            "python/sglang/srt/model_runner_components/attention_backend_setup.py (configure_aux_hidden_state_capture); python/sglang/srt/models/kimi_linear.py; sgl-project/sglang#35784",
        ),
        (Family::Dflash, Engine::Trtllm) => row(
            Serves::No,
            "TensorRT-LLM's KimiLinearForCausalLM admits DFlash but builds Kimi-K3 (latent MoE routed_expert_hidden_size, attn_res_block_size, SiTU, MXFP4/NVFP4 experts required), which Kimi-Linear-48B-A3B's silu, BF16-expert checkpoint is not",
            "tensorrt_llm/_torch/models/modeling_kimi_linear.py",
        ),
        _ => None,
    }
}

/// A draft's target and every engine's verdict on serving the draft beside it (`inspect`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DraftTarget {
    #[serde(flatten)]
    pub target: NamedTarget,
    /// The engines whose sources say something stands in the way; empty when none does.
    pub serving: Vec<OnTarget>,
}

/// [`identify`] the draft's target and collect [`on_target`] for every engine. `None` for a
/// checkpoint that is not a draft, or whose target cannot be named.
pub fn of_draft(ck: &Checkpoint, det: &Detection, known: &[Profile]) -> Option<DraftTarget> {
    if !matches!(
        det.family,
        Family::Eagle3 | Family::Eagle3Mla | Family::Dflash
    ) {
        return None;
    }
    let target = identify(ck, det, None, known)?;
    let serving = Engine::ALL
        .iter()
        .filter_map(|&e| on_target(&det.family, &target.architecture, e))
        .collect();
    Some(DraftTarget { target, serving })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kimi_linear_rows_name_their_sources() {
        for e in Engine::ALL {
            let v = on_target(&Family::Dflash, KIMI_LINEAR, e).expect("a row per engine");
            assert_eq!(v.engine, e);
            assert!(!v.source.is_empty() && !v.why.is_empty());
        }
        assert_eq!(
            on_target(&Family::Dflash, KIMI_LINEAR, Engine::Vllm).map(|v| v.serves),
            Some(Serves::FromBuild)
        );
        assert_eq!(
            on_target(&Family::Dflash, KIMI_LINEAR, Engine::Sglang).map(|v| v.serves),
            Some(Serves::No)
        );
        // Nothing in the way on the DeepSeek-V3 targets.
        for e in Engine::ALL {
            assert!(on_target(&Family::Dflash, "DeepseekV3ForCausalLM", e).is_none());
        }
    }
}
