//! A draft and the target it serves beside: which target a draft was made for (matched on its
//! shape against the target profiles' shapes), and whether each serving engine runs the draft's
//! family on that target's architecture.
//!
//! A draft's own layout says nothing about the target class the engine must build: a DFlash
//! drafter for Kimi-Linear is laid out like one for Kimi-K2.5, and an engine loads both, but
//! serving it needs the engine's *target* model class to capture the taps. [`on_target`] holds
//! what the engines' sources say about that, one row per (family, architecture, engine);
//! `convert` warns from it and `quantize`'s next gate names the profile [`candidates`] picks.
//! The profiles themselves (`crate::verify::profile`) hand their shapes down as
//! [`TargetShape`], so this module needs nothing above it.

use serde::Serialize;

use super::Engine;
use crate::checkpoint::{Checkpoint, Detection, Family};

/// A target, as a draft can be matched against it (from a profile).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetShape {
    /// The profile's name.
    pub name: String,
    /// `architectures[0]` of the target's config, when known.
    pub architecture: Option<String>,
    pub num_layers: Option<usize>,
    pub hidden_size: Option<usize>,
    /// The default taps (HF `hidden_states` indices) the profile gives each draft family.
    pub taps: Vec<(Family, Vec<usize>)>,
    /// kquant runs this target itself (a live profile).
    pub live: bool,
}

impl TargetShape {
    fn taps_for(&self, f: &Family) -> Option<&Vec<usize>> {
        self.taps.iter().find(|(g, _)| g == f).map(|(_, t)| t)
    }
}

/// What a draft's files say about its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftShape {
    pub family: Family,
    /// The target's hidden size: an EAGLE-3 draft's `target_hidden_size`, else the draft's
    /// own `hidden_size` (a DFlash drafter and a Kimi EAGLE-3 draft take the target's width).
    pub hidden: Option<u64>,
    /// A DFlash drafter's `num_target_layers`.
    pub num_target_layers: Option<u64>,
    /// The draft's taps as HF `hidden_states` indices, when their convention is known.
    pub taps: Option<Vec<usize>>,
}

impl DraftShape {
    /// Read from a draft's config and detection.
    pub fn of(ck: &Checkpoint, det: &Detection) -> DraftShape {
        let uint = |k: &str| ck.config.as_ref().and_then(|c| c.uint(k).ok().flatten());
        DraftShape {
            family: det.family.clone(),
            hidden: uint("target_hidden_size").or_else(|| uint("hidden_size")),
            num_target_layers: uint("num_target_layers"),
            taps: det
                .aux_layers
                .as_ref()
                .and_then(|a| a.hidden_states.as_ref())
                .map(|v| v.iter().filter_map(|&x| usize::try_from(x).ok()).collect()),
        }
    }
}

/// The targets a draft may be for: those of its target's hidden size (and layer count, where
/// the draft names one); among them the ones whose default taps for the draft's family are the
/// draft's, else those with any taps for the family, else all of that size. Empty when the
/// draft's hidden size is unknown or no target has it.
pub fn candidates<'a>(targets: &'a [TargetShape], d: &DraftShape) -> Vec<&'a TargetShape> {
    let sized: Vec<&TargetShape> = targets
        .iter()
        .filter(|t| {
            d.hidden
                .is_some_and(|h| t.hidden_size.is_some_and(|s| s as u64 == h))
                && match (d.num_target_layers, t.num_layers) {
                    (Some(n), Some(l)) => n == l as u64,
                    _ => true,
                }
        })
        .collect();
    let same_taps: Vec<_> = sized
        .iter()
        .copied()
        .filter(|t| d.taps.is_some() && t.taps_for(&d.family) == d.taps.as_ref())
        .collect();
    if !same_taps.is_empty() {
        return same_taps;
    }
    let known_taps: Vec<_> = sized
        .iter()
        .copied()
        .filter(|t| t.taps_for(&d.family).is_some())
        .collect();
    if !known_taps.is_empty() {
        known_taps
    } else {
        sized
    }
}

/// A draft's target, named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NamedTarget {
    /// `architectures[0]` of the target.
    pub architecture: String,
    /// How it is known: `--target-checkpoint`, or the profile(s) the draft's shape matches.
    pub known_from: String,
}

/// The draft's target: the architecture of `target` (a target checkpoint given by the user),
/// else that of the [`candidates`] among `known` when they all agree on one. `None` when
/// neither says.
pub fn identify(
    ck: &Checkpoint,
    det: &Detection,
    target: Option<&Checkpoint>,
    known: &[TargetShape],
) -> Option<NamedTarget> {
    if let Some(t) = target {
        let arch = t
            .config
            .as_ref()
            .and_then(|c| c.root.get("architectures"))
            .and_then(|a| a.as_array()?.first()?.as_str().map(String::from));
        return arch.map(|architecture| NamedTarget {
            architecture,
            known_from: "--target-checkpoint".into(),
        });
    }
    let shape = DraftShape::of(ck, det);
    let c = candidates(known, &shape);
    let arch = c.first()?.architecture.clone()?;
    if c.iter()
        .any(|t| t.architecture.as_deref() != Some(arch.as_str()))
    {
        return None;
    }
    let names: Vec<&str> = c.iter().map(|t| t.name.as_str()).collect();
    Some(NamedTarget {
        architecture: arch,
        known_from: format!(
            "the draft's shape (target hidden size {}{}{}) matches target profile {}",
            shape.hidden.map_or("?".into(), |h| h.to_string()),
            shape
                .num_target_layers
                .map_or(String::new(), |n| format!(", {n} target layers")),
            shape
                .taps
                .as_ref()
                .map_or(String::new(), |t| format!(", taps hs{t:?}")),
            names.join(", ")
        ),
    })
}

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
pub fn of_draft(ck: &Checkpoint, det: &Detection, known: &[TargetShape]) -> Option<DraftTarget> {
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

    fn shape(
        name: &str,
        arch: &str,
        layers: usize,
        hidden: usize,
        dflash: &[usize],
    ) -> TargetShape {
        TargetShape {
            name: name.into(),
            architecture: Some(arch.into()),
            num_layers: Some(layers),
            hidden_size: Some(hidden),
            taps: vec![(Family::Dflash, dflash.to_vec())],
            live: false,
        }
    }

    fn dflash(hidden: u64, layers: Option<u64>, taps: Option<&[usize]>) -> DraftShape {
        DraftShape {
            family: Family::Dflash,
            hidden: Some(hidden),
            num_target_layers: layers,
            taps: taps.map(<[usize]>::to_vec),
        }
    }

    #[test]
    fn a_draft_is_matched_on_hidden_size_layers_and_taps() {
        let t = [
            shape("k2-tiny", "DeepseekV3ForCausalLM", 4, 256, &[1, 3]),
            shape("kl-tiny", KIMI_LINEAR, 4, 256, &[2, 3]),
            shape("kl", KIMI_LINEAR, 27, 2304, &[4, 8, 16, 20, 24]),
            shape("k2", "DeepseekV3ForCausalLM", 61, 7168, &[2, 30, 58]),
        ];
        let names = |d: &DraftShape| {
            candidates(&t, d)
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
        };
        // Two targets of one width, told apart by the taps.
        assert_eq!(names(&dflash(256, Some(4), Some(&[2, 3]))), ["kl-tiny"]);
        assert_eq!(names(&dflash(256, Some(4), Some(&[1, 3]))), ["k2-tiny"]);
        // Taps nobody defaults to: every target of that shape.
        assert_eq!(
            names(&dflash(256, Some(4), Some(&[1, 2]))),
            ["k2-tiny", "kl-tiny"]
        );
        // Custom taps on the real target: its width and layer count still find it.
        assert_eq!(names(&dflash(2304, Some(27), Some(&[1, 2]))), ["kl"]);
        assert_eq!(names(&dflash(2304, None, None)), ["kl"]);
        // A layer count the target does not have, or an unknown width: none.
        assert!(names(&dflash(2304, Some(61), None)).is_empty());
        assert!(names(&dflash(999, None, None)).is_empty());
        let unknown = DraftShape {
            hidden: None,
            ..dflash(0, None, None)
        };
        assert!(names(&unknown).is_empty());
    }

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
