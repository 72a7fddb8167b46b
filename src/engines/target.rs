//! Which serving engines cannot run a draft's family beside a target architecture.
//!
//! A draft's own layout says nothing about the target class the engine must build: a DFlash
//! drafter for Kimi-Linear is laid out like one for Kimi-K2.5, and an engine loads both, but
//! serving it needs the engine's *target* model class to capture the taps. [`on_target`] holds
//! what the engines' sources say about that, one row per (family, architecture, engine);
//! `convert` warns from it and `quantize`'s next steps leave such an engine out. Which target a
//! draft was made for (its shape against the target profiles) is `crate::target::shape`.
//!
//! On a target with Block Attention Residuals (Kimi-K3) the engines also differ in the hidden
//! state they hand a draft (`crate::target::stream`): [`drafting`] says, per engine, which draft
//! families it runs beside the target and which stream it taps; `inspect` prints it for the
//! target and for a draft made for it.

use serde::Serialize;

use super::claim::Loads;
use super::Engine;
use crate::checkpoint::{Checkpoint, Detection, Family};
use crate::target::fact::Fact;
use crate::target::profile::published_match;
use crate::target::shape::{candidates, identify, DraftShape, NamedTarget};
use crate::target::stream::TapStream;
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

const VLLM_KIMI_LINEAR_WHY: &str = "vLLM runs DFlash, DSpark, DFlash2 and EAGLE-3 drafts through the target's aux-hidden-state capture, which needs the target class to declare SupportsEagle3; KimiLinearForCausalLM declares it only from the build that merged vllm-project/vllm#52171 (2026-08-13), and older builds stop with \"Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested\": check `supports_eagle3` on the installed build's KimiLinearForCausalLM";
const VLLM_KIMI_LINEAR_SRC: &str = "vllm/v1/worker/gpu_model_runner.py (the supports_eagle3 check); vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py (`requires_aux_hidden_states`: eagle3, dflash, dspark; `set_eagle3_aux_hidden_state_layers` raises \"Model does not support EAGLE3 interface\"); vllm/model_executor/models/kimi_linear.py (KimiLinearForCausalLM(nn.Module, HasInnerState, SupportsPP, MixtureOfExperts, IsHybrid)); vllm-project/vllm#52171";

const KIMI_K3: &str = "KimiK3ForConditionalGeneration";

/// How an engine drafts beside a target with attention residuals: the draft families it runs
/// there and the hidden-state stream it hands them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Drafting {
    pub engine: Engine,
    /// The engine and the version its source was read at.
    pub release: &'static str,
    pub architecture: &'static str,
    /// The draft families it captures taps for beside the target.
    pub families: &'static [Family],
    /// Its own method names for them, and what it does not run.
    pub methods: &'static str,
    /// The stream it taps by default.
    pub stream: TapStream,
    /// How to make it tap the other stream, where it can, and where that does not apply.
    pub switch: Option<&'static str>,
    /// Where it was read.
    pub source: &'static str,
}

const K3_DRAFTING: [Drafting; 3] = [
    Drafting {
        engine: Engine::Vllm,
        release: "vLLM 0.33.0",
        architecture: KIMI_K3,
        families: &[
            Family::Eagle3,
            Family::Eagle3Mla,
            Family::Dflash,
            Family::Dspark,
            Family::Dflash2,
        ],
        methods: "`eagle3`, `dflash` (DFlash and DFlash2 drafts), `dspark` (K3DSparkModel and the GQA layouts), and `mtp` (KimiK3MTPModel): every one through the target's aux-hidden-state capture (KimiK3ForConditionalGeneration declares SupportsEagle3)",
        stream: TapStream::Partial,
        switch: Some("VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=1 taps the mixture, in the CUDA implementation (vllm/models/kimi_k3/nvidia/); the ROCm one (vllm/models/kimi_k3/amd/linear.py `_maybe_add_hidden_state`) always taps the block's prefix sum and does not read the switch"),
        source: "vllm/models/kimi_k3/__init__.py (nvidia/ or amd/ by platform); nvidia/model.py `_set_aux_hidden_state_layers`, `_capture_aux_hidden_stream`; amd/linear.py; vllm/envs.py; vllm/config/speculative.py (kimi_k3 -> kimi_k3_mtp)",
    },
    Drafting {
        engine: Engine::Sglang,
        release: "SGLang 0.5.23",
        architecture: KIMI_K3,
        families: &[Family::Dflash, Family::Dspark, Family::Dflash2],
        methods: "`DSPARK` (the GQA layouts; no K3DSparkModel class) and `DFLASH` (DFlash and DFlash2), both through `set_dspark_layers_to_capture` with the ids unshifted; no `EAGLE3`: the K3 classes have no `set_eagle3_layers_to_capture`",
        stream: TapStream::Mixture,
        switch: None,
        source: "python/sglang/srt/models/kimi_k3.py (`set_dflash_layers_to_capture`, `set_dspark_layers_to_capture`, `_dspark_capture_stream`); python/sglang/srt/model_executor/model_runner_components/attention_backend_setup.py (`configure_aux_hidden_state_capture`)",
    },
    Drafting {
        engine: Engine::Trtllm,
        release: "TensorRT-LLM (main, NVIDIA/TensorRT-LLM@cf328e85)",
        architecture: KIMI_K3,
        families: &[Family::Dflash, Family::Dspark],
        methods: "DSpark and DFlash as one-engine drafters (SpecDecOneEngineForCausalLM); the model's docstring lists MTP and EAGLE as not supported",
        stream: TapStream::Mixture,
        switch: None,
        source: "tensorrt_llm/_torch/models/modeling_kimi_linear.py (KimiLinearForCausalLM builds Kimi-K3; `KimiLinearDecoderLayer.forward`: the capture reads the attention-residual mixture the next layer's attention sees)",
    },
];

/// Each engine's drafting beside a target of `architecture`: empty for a target without
/// attention residuals (every engine taps its one residual stream).
pub fn drafting(architecture: &str) -> &'static [Drafting] {
    if architecture == KIMI_K3 {
        &K3_DRAFTING
    } else {
        &[]
    }
}

/// [`drafting`] beside a target checkpoint (its config's architecture); empty for a draft, and
/// for a config without `attn_res_block_size` (the engines then tap its one residual stream:
/// `target::stream::config_has_attention_residuals`).
pub fn of_target(ck: &Checkpoint, det: &Detection) -> &'static [Drafting] {
    match (&det.family, &ck.config) {
        (Family::Target, Some(c)) if crate::target::stream::config_has_attention_residuals(c) => {
            c.architectures().first().map_or(&[], |a| drafting(a))
        }
        _ => &[],
    }
}

/// What the engines' sources say about serving `family` beside a target of `architecture` on
/// `engine`; `None` where kquant knows of nothing in the way (the draft-layout and quantization
/// claims of `crate::engines` still apply).
pub fn on_target(family: &Family, architecture: &str, engine: Engine) -> Option<OnTarget> {
    if architecture == KIMI_K3 {
        return on_k3(family, engine);
    }
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
        // Every draft family runs through the same capture (DSpark and DFlash2 on the V2
        // runner's `requires_aux_hidden_states`).
        (_, Engine::Vllm) => row(
            Serves::FromBuild,
            VLLM_KIMI_LINEAR_WHY,
            VLLM_KIMI_LINEAR_SRC,
        ),
        // DFlash2 runs under SGLang's DFLASH too.
        (Family::Dflash | Family::Dflash2, Engine::Sglang) => row(
            Serves::No,
            "SGLang captures a DFlash drafter's taps through the target's set_dflash_layers_to_capture (or set_dspark_layers_to_capture under DSPARK); its KimiLinearForCausalLM has only the DSpark one, so --speculative-algorithm DFLASH stops with \"implements neither ...\" (sgl-project/sglang#35784, open, adds the alias for Kimi-K3 only)",
            "python/sglang/srt/model_runner_components/attention_backend_setup.py (configure_aux_hidden_state_capture); python/sglang/srt/models/kimi_linear.py; sgl-project/sglang#35784",
        ),
        (Family::Eagle3 | Family::Eagle3Mla, Engine::Sglang) => row(
            Serves::No,
            "SGLang captures an EAGLE-3 drafter's taps through the target's set_eagle3_layers_to_capture; its KimiLinearForCausalLM has only set_dspark_layers_to_capture, so --speculative-algorithm EAGLE3 stops with \"does not implement set_eagle3_layers_to_capture\"",
            "python/sglang/srt/model_executor/model_runner_components/attention_backend_setup.py (configure_aux_hidden_state_capture); python/sglang/srt/models/kimi_linear.py",
        ),
        (Family::Dflash, Engine::Trtllm) => row(
            Serves::No,
            "TensorRT-LLM's KimiLinearForCausalLM admits DFlash but builds Kimi-K3 (latent MoE routed_expert_hidden_size, attn_res_block_size, SiTU, MXFP4/NVFP4 experts required), which Kimi-Linear-48B-A3B's silu, BF16-expert checkpoint is not",
            "tensorrt_llm/_torch/models/modeling_kimi_linear.py",
        ),
        (_, Engine::Trtllm) => row(
            Serves::No,
            "TensorRT-LLM's KimiLinearForCausalLM builds Kimi-K3 (latent MoE routed_expert_hidden_size, attn_res_block_size, SiTU, MXFP4/NVFP4 experts required), which Kimi-Linear-48B-A3B's silu, BF16-expert checkpoint is not, and its docstring lists EAGLE as not supported",
            "tensorrt_llm/_torch/models/modeling_kimi_linear.py",
        ),
        // DSpark on SGLang: `set_dspark_layers_to_capture` is there.
        _ => None,
    }
}

/// The EAGLE-3 refusals beside Kimi-K3 (the engines' [`drafting`] rows list what they run).
fn on_k3(family: &Family, engine: Engine) -> Option<OnTarget> {
    if !matches!(family, Family::Eagle3 | Family::Eagle3Mla) || engine == Engine::Vllm {
        return None;
    }
    let d = drafting(KIMI_K3).iter().find(|d| d.engine == engine)?;
    Some(OnTarget {
        engine,
        architecture: KIMI_K3,
        serves: Serves::No,
        why: d.methods,
        source: d.source,
    })
}

/// A draft's target and every engine's verdict on serving the draft beside it (`inspect`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DraftTarget {
    #[serde(flatten)]
    pub target: NamedTarget,
    /// The engines whose sources say something stands in the way; empty when none does.
    pub serving: Vec<OnTarget>,
    /// On a target with attention residuals: the stream each engine that runs the draft's
    /// family there, and does not refuse its layout, hands it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub streams: Vec<Drafting>,
    /// The stream the draft was trained on, where the matching profiles' `published_drafts`
    /// name it (the same family, layout and taps) and agree; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trained_on: Option<TrainedOn>,
}

/// Where a draft's training stream is known from: a published draft of a target profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TrainedOn {
    pub stream: TapStream,
    /// The published draft (`owner/name@revision`) and its profile.
    pub draft: String,
    pub profile: String,
}

/// The training stream of the draft, from the `published_drafts` of the profiles its shape
/// matches: `None` when none names it, or two name different streams.
fn trained_on(ck: &Checkpoint, det: &Detection, known: &[Profile]) -> Option<TrainedOn> {
    let shape = DraftShape::of(ck, det);
    let mut found = candidates(known, &shape).into_iter().flat_map(|p| {
        published_match(p, det)
            .into_iter()
            .map(move |d| (p.name.clone(), d))
    });
    let (profile, first) = found.next()?;
    let Fact::Known(stream) = first.stream else {
        return None;
    };
    found
        .all(|(_, d)| d.stream == Fact::Known(stream))
        .then(|| TrainedOn {
            stream,
            draft: first.draft.clone(),
            profile,
        })
}

/// [`identify`] the draft's target and collect [`on_target`] for every engine. `None` for a
/// checkpoint that is not a draft, or whose target cannot be named.
pub fn of_draft(ck: &Checkpoint, det: &Detection, known: &[Profile]) -> Option<DraftTarget> {
    if !Family::DRAFTS.contains(&det.family) {
        return None;
    }
    let target = identify(ck, det, None, known)?;
    let serving = Engine::ALL
        .iter()
        .filter_map(|&e| on_target(&det.family, &target.architecture, e))
        .collect();
    // An engine that runs the family there but refuses the draft's layout (SGLang has no
    // K3DSparkModel) hands it nothing: its `engines` row says no, so no stream line.
    let layout = det.block_draft.as_ref().map(|b| b.layout);
    let streams: Vec<Drafting> = drafting(&target.architecture)
        .iter()
        .filter(|d| d.families.contains(&det.family))
        .filter(|d| layout.is_none_or(|l| super::block::claim(l, d.engine).loads != Loads::No))
        .cloned()
        .collect();
    let trained_on = if streams.is_empty() {
        None
    } else {
        trained_on(ck, det, known)
    };
    Some(DraftTarget {
        target,
        serving,
        streams,
        trained_on,
    })
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

    /// Every draft family beside Kimi-Linear, as the engines' sources say: vLLM's one capture
    /// for all (from a build), SGLang's DSpark capture only, TensorRT-LLM's class builds K3.
    #[test]
    fn kimi_linear_rows_cover_every_draft_family() {
        let serves = |f, e| on_target(&f, KIMI_LINEAR, e).map(|v| v.serves);
        for f in Family::DRAFTS {
            assert_eq!(
                serves(f.clone(), Engine::Vllm),
                Some(Serves::FromBuild),
                "{f:?}"
            );
            assert_eq!(serves(f.clone(), Engine::Trtllm), Some(Serves::No), "{f:?}");
            let sglang = serves(f.clone(), Engine::Sglang);
            if f == Family::Dspark {
                assert_eq!(sglang, None);
            } else {
                assert_eq!(sglang, Some(Serves::No), "{f:?}");
            }
        }
    }

    #[test]
    fn k3_rows_agree_with_the_profile_and_refuse_eagle3_where_the_engine_has_no_capture() {
        let rows = drafting(KIMI_K3);
        assert_eq!(rows.len(), Engine::ALL.len());
        assert!(drafting(KIMI_LINEAR).is_empty() && drafting("DeepseekV3ForCausalLM").is_empty());
        // The streams here are the profile's (quant-configs/targets/kimi-k3.json), engine by
        // engine, so the two cannot drift apart.
        let p = crate::target::profile::load("kimi-k3").unwrap();
        let ar = p
            .attention_residuals
            .as_ref()
            .expect("K3 has attention residuals");
        for e in &ar.engines {
            let row = rows
                .iter()
                .find(|d| e.engine == d.release)
                .unwrap_or_else(|| panic!("no drafting row for {}", e.engine));
            assert_eq!(row.stream, e.default, "{}", e.engine);
            assert_eq!(row.switch.is_some(), e.switch.is_some(), "{}", e.engine);
        }
        for e in Engine::ALL {
            for f in Family::DRAFTS {
                let listed = rows
                    .iter()
                    .any(|d| d.engine == e && d.families.contains(&f));
                let refused = on_target(&f, KIMI_K3, e).is_some_and(|v| v.serves == Serves::No);
                // EAGLE-3 beside K3: vLLM runs it; SGLang and TensorRT-LLM refuse it.
                if matches!(f, Family::Eagle3 | Family::Eagle3Mla) {
                    assert_eq!(refused, e != Engine::Vllm, "{f:?} on {e:?}");
                }
                assert!(
                    !(listed && refused),
                    "{f:?} on {e:?} both listed and refused"
                );
            }
        }
    }
}
