//! Quantized claims: which engine loads a (format, scheme) result, independent of the draft's
//! layout (a layout the engine refuses is refused quantized too; see [`super::support`]). One
//! row per claim; `kquant schemes`, `kquant inspect` and the quantize warning all read it.
//!
//! To change a claim, edit its row: `yes`/`no`/`depends`, the release it was checked with
//! ([`VLLM`], [`SGLANG`], or [`SOURCE`] for a reading of the engine's source or of kquant's
//! earlier notes, not yet run), and the engine's own reason (for a `no`, its error, quoted).
//! The measured rows come from EAGLE-3 Llama drafts quantized with `--exclude fc,lm_head`.

use super::claim::{depends, no, yes, Claim, Engine, Loads, SGLANG, SOURCE, VLLM};
use crate::quant::registry::Format;

/// One row.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub format: Format,
    pub scheme: &'static str,
    pub claim: Claim,
}

const fn q(format: Format, scheme: &'static str, claim: Claim) -> Row {
    Row {
        format,
        scheme,
        claim,
    }
}

use Engine::{Sglang, Trtllm, Vllm};
use Format::{CompressedTensors as Ct, Modelopt, Quark};

const MARLIN: &str = "kernel set-up (Marlin workspace) not run on CPU";
const SM90: &str = "GPU capability check answered as SM 9.0";
const SGLANG_NO_QUARK_INT4: &str = "build: `NotImplementedError: No quark compatible scheme was found` (SGLang has no Quark W4A16 INT4 scheme)";
const TRTLLM_MODELOPT_ONLY: &str = "TensorRT-LLM reads ModelOpt quantization (`hf_quant_config.json`, quant_method `modelopt`), not this format";
const CT_WNA16_VLLM: &str = "CompressedTensorsWNA16 (W4A16): Marlin/Machete on CUDA, Triton W4A16 on ROCm; post-load processing included";
const CT_WNA16_SGLANG: &str = "CompressedTensorsWNA16 (W4A16, Marlin)";
const QUARK_W4A16_VLLM: &str = "QuarkW4A16Int4 (CUDA and ROCm)";

/// The table.
#[rustfmt::skip]
pub static QUANTIZED: &[Row] = &[
    // INT4 weight-only, per output channel.
    q(Quark, "int4-pc", no(Vllm, VLLM, "build: `ValueError: Quark W4A16 weight.group_size must be a positive int, got None` (vLLM's QuarkW4A16Int4 needs per-group scales)")),
    q(Quark, "int4-pc", no(Sglang, SGLANG, SGLANG_NO_QUARK_INT4)),
    q(Quark, "int4-pc", no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Ct, "int4-pc", yes(Vllm, VLLM, CT_WNA16_VLLM)),
    q(Ct, "int4-pc", yes(Sglang, SGLANG, CT_WNA16_SGLANG).unproven_on_cpu(MARLIN)),
    q(Ct, "int4-pc", no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),

    // INT4 weight-only, per group.
    q(Quark, "int4-g32", yes(Vllm, VLLM, QUARK_W4A16_VLLM)),
    q(Quark, "int4-g32", no(Sglang, SGLANG, SGLANG_NO_QUARK_INT4)),
    q(Quark, "int4-g32", no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Ct, "int4-g32", yes(Vllm, VLLM, CT_WNA16_VLLM)),
    q(Ct, "int4-g32", yes(Sglang, SGLANG, CT_WNA16_SGLANG).unproven_on_cpu(MARLIN)),
    q(Ct, "int4-g32", no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Quark, "int4-g64", yes(Vllm, SOURCE, QUARK_W4A16_VLLM)),
    q(Quark, "int4-g64", no(Sglang, SOURCE, SGLANG_NO_QUARK_INT4)),
    q(Quark, "int4-g64", no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Ct, "int4-g64", yes(Vllm, SOURCE, CT_WNA16_VLLM)),
    q(Ct, "int4-g64", yes(Sglang, SOURCE, CT_WNA16_SGLANG)),
    q(Ct, "int4-g64", no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Quark, "int4-g128", yes(Vllm, SOURCE, QUARK_W4A16_VLLM)),
    q(Quark, "int4-g128", no(Sglang, SOURCE, SGLANG_NO_QUARK_INT4)),
    q(Quark, "int4-g128", no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Ct, "int4-g128", yes(Vllm, SOURCE, CT_WNA16_VLLM)),
    q(Ct, "int4-g128", yes(Sglang, SOURCE, CT_WNA16_SGLANG)),
    q(Ct, "int4-g128", no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Modelopt, "int4-g128", no(Vllm, SOURCE, "its ModelOpt loader has no `W4A16_AWQ` (ModelOpt FP8 and NVFP4 variants only)")),
    q(Modelopt, "int4-g128", no(Sglang, SOURCE, "`ValueError: ModelOpt only supports static FP8 quantization in SGLang` (ModelOptFp8Config; W4A16_AWQ is neither FP8 nor NVFP4)")),
    q(Modelopt, "int4-g128", yes(Trtllm, SOURCE, "W4A16_AWQ_LinearMethod (Hopper and Blackwell)")),

    // FP8 per output channel, dynamic per-token activations.
    q(Quark, "fp8-pc", yes(Vllm, SOURCE, "QuarkW8A8Fp8 (CUDA and ROCm)")),
    q(Quark, "fp8-pc", yes(Sglang, SOURCE, "QuarkW8A8Fp8 (CUDA and ROCm)")),
    q(Quark, "fp8-pc", no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Ct, "fp8-pc", yes(Vllm, VLLM, "CompressedTensorsW8A8Fp8 (CUDA and ROCm); post-load processing included")),
    q(Ct, "fp8-pc", yes(Sglang, SGLANG, "CompressedTensorsW8A8Fp8 (CUDA and ROCm); post-load processing included").unproven_on_cpu(SM90)),
    q(Ct, "fp8-pc", no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Modelopt, "fp8-pc", yes(Vllm, SOURCE, "ModelOpt FP8_PER_CHANNEL_PER_TOKEN (CUDA)")),
    q(Modelopt, "fp8-pc", no(Sglang, SOURCE, "ModelOptFp8LinearMethod takes any FP8 quant_algo as static per-tensor FP8 (one weight_scale and input_scale per shard): the per-channel weight_scale does not fit")),
    q(Modelopt, "fp8-pc", yes(Trtllm, SOURCE, "FP8RowwiseLinearMethod")),

    // Quark two-stage W4A8 (int4_fp8).
    q(Quark, "w4a8-fp8", no(Vllm, SOURCE, "build: `No quark compatible scheme` for dense layers (vLLM reads int4_fp8 for MoE experts only: QuarkW4A8Fp8MoEMethod, ROCm AITER)")),
    q(Quark, "w4a8-fp8", no(Sglang, SOURCE, "build: `NotImplementedError: No quark compatible scheme was found` (SGLang has no Quark int4_fp8 scheme)")),
    q(Quark, "w4a8-fp8", no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),

    // compressed-tensors W4A8 (int8 activations).
    q(Ct, "w4a8-int8", depends(Vllm, SOURCE, "CompressedTensorsW4A8Int has CPU (Arm) kernels only: vLLM's CPU backend loads it, CUDA and ROCm do not")),
    q(Ct, "w4a8-int8", no(Sglang, SOURCE, "no dense compressed-tensors W4A8 INT scheme (SGLang's W4A8 INT8 is for MoE experts only)")),
    q(Ct, "w4a8-int8", no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),

    // Quark UINT4 (asymmetric) per group.
    q(Quark, "uint4-g32", yes(Vllm, SOURCE, "QuarkW4A16Int4 with zero points (CUDA and ROCm)")),
    q(Quark, "uint4-g32", no(Sglang, SOURCE, SGLANG_NO_QUARK_INT4)),
    q(Quark, "uint4-g32", no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Quark, "uint4-g64", yes(Vllm, SOURCE, "QuarkW4A16Int4 with zero points (CUDA and ROCm)")),
    q(Quark, "uint4-g64", no(Sglang, SOURCE, SGLANG_NO_QUARK_INT4)),
    q(Quark, "uint4-g64", no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Quark, "uint4-g128", yes(Vllm, SOURCE, "QuarkW4A16Int4 with zero points (CUDA and ROCm)")),
    q(Quark, "uint4-g128", no(Sglang, SOURCE, SGLANG_NO_QUARK_INT4)),
    q(Quark, "uint4-g128", no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),

    // NVFP4 weight-only.
    q(Ct, "nvfp4-a16", yes(Vllm, SOURCE, "CompressedTensorsW4A16Fp4: native FP4 GEMM on sm100+ (Blackwell), FP4 Marlin on Ampere/Hopper (sm80+); NVIDIA only")),
    q(Ct, "nvfp4-a16", yes(Sglang, SOURCE, "CompressedTensorsW4A16Fp4 (python/sglang/srt/layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a16_nvfp4.py; which release added it is UNVERIFIED); NVIDIA only")),
    q(Ct, "nvfp4-a16", no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Modelopt, "nvfp4-a16", yes(Vllm, SOURCE, "ModelOpt W4A16_NVFP4: native FP4 GEMM on sm100+ (Blackwell), FP4 Marlin on Ampere/Hopper (sm80+); NVIDIA only")),
    q(Modelopt, "nvfp4-a16", no(Sglang, SOURCE, "no SGLang method for ModelOpt W4A16_NVFP4 (modelopt_fp4 is W4A4 and expects input scales; UNVERIFIED reading)")),
    q(Modelopt, "nvfp4-a16", no(Trtllm, SOURCE, "no TensorRT-LLM linear method for W4A16_NVFP4 known to kquant (NVFP4LinearMethod is W4A4; UNVERIFIED reading)")),

    // NVFP4 weights and activations (W4A4).
    q(Ct, "nvfp4", yes(Vllm, SOURCE, "CompressedTensorsW4A4Fp4: native W4A4 on sm100+ (CUTLASS/FlashInfer), FP4 Marlin weight-only on Ampere/Hopper (input scale unused); NVIDIA only")),
    q(Ct, "nvfp4", yes(Sglang, SOURCE, "CompressedTensorsW4A4Fp4 (sm100+; Marlin fallback on older GPUs); NVIDIA only")),
    q(Ct, "nvfp4", no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Modelopt, "nvfp4", yes(Vllm, SOURCE, "ModelOpt NVFP4: native W4A4 on sm100+ (CUTLASS/FlashInfer), FP4 Marlin weight-only on Ampere/Hopper (input scale unused); NVIDIA only")),
    q(Modelopt, "nvfp4", yes(Sglang, SOURCE, "ModelOptFp4Config (modelopt_fp4), sm100+")),
    q(Modelopt, "nvfp4", yes(Trtllm, SOURCE, "NVFP4LinearMethod (Blackwell)")),
    q(Quark, "nvfp4", yes(Vllm, SOURCE, "QuarkNVFP4 (kquant does not write this carrier yet)")),
];

/// The claims for a (format, scheme) result, in table order.
pub fn claims(format: Format, scheme: &str) -> impl Iterator<Item = &'static Claim> + '_ {
    QUANTIZED
        .iter()
        .filter(move |r| r.format == format && r.scheme == scheme)
        .map(|r| &r.claim)
}

/// `engine`'s claim for a (format, scheme) result.
pub fn claim(format: Format, scheme: &str, engine: Engine) -> Option<&'static Claim> {
    claims(format, scheme).find(|c| c.engine == engine)
}

/// The warning `kquant quantize` prints when no engine in the table loads the result, with the
/// target's advice (what to use instead) after it; `None` when some engine loads it.
pub fn unloadable_warning(format: Format, scheme: &str, advice: Option<&str>) -> Option<String> {
    let all: Vec<&Claim> = claims(format, scheme).collect();
    if all.is_empty() || all.iter().any(|c| c.loads == Loads::Yes) {
        return None;
    }
    let head = if all.iter().all(|c| c.loads == Loads::No) {
        "no serving engine loads"
    } else {
        "no serving engine loads on every platform"
    };
    let mut s = format!("{head} --format {} --scheme {scheme}:", format.name());
    for c in &all {
        let who = if c.checked_with.starts_with(c.engine.name()) {
            c.checked_with.to_string()
        } else {
            format!("{} ({})", c.engine.name(), c.checked_with)
        };
        s.push_str(&format!("\n  {who}: {}: {}", c.loads.id(), c.why));
    }
    if let Some(a) = advice {
        s.push_str("\n  ");
        s.push_str(a);
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::registry::SCHEMES;

    /// Every carrier kquant writes has a vLLM and an SGLang claim (no gaps), every row names a
    /// carrier of the registry, and no engine is claimed twice for one carrier.
    #[test]
    fn every_implemented_carrier_has_claims() {
        for s in SCHEMES {
            for c in s.carriers.iter().filter(|c| c.implemented) {
                for e in [Engine::Vllm, Engine::Sglang] {
                    assert!(
                        claim(c.format, s.id, e).is_some(),
                        "no {} claim for --format {} --scheme {}",
                        e.id(),
                        c.format.name(),
                        s.id
                    );
                }
            }
        }
        for r in QUANTIZED {
            let known = SCHEMES
                .iter()
                .find(|s| s.id == r.scheme)
                .is_some_and(|s| s.carriers.iter().any(|c| c.format == r.format));
            assert!(
                known,
                "{} {} is not in the registry",
                r.format.name(),
                r.scheme
            );
            let n = claims(r.format, r.scheme)
                .filter(|c| c.engine == r.claim.engine)
                .count();
            assert_eq!(
                n,
                1,
                "{} {} {}",
                r.format.name(),
                r.scheme,
                r.claim.engine.id()
            );
        }
    }

    /// The engine-loader tier's measurements.
    #[test]
    fn measured() {
        let l = |f, s, e| claim(f, s, e).unwrap().loads;
        assert_eq!(l(Quark, "int4-pc", Vllm), Loads::No);
        assert_eq!(l(Quark, "int4-pc", Sglang), Loads::No);
        assert_eq!(l(Quark, "int4-g32", Vllm), Loads::Yes);
        assert_eq!(l(Quark, "int4-g32", Sglang), Loads::No);
        for s in ["int4-pc", "int4-g32", "fp8-pc"] {
            for e in [Vllm, Sglang] {
                assert_eq!(l(Ct, s, e), Loads::Yes, "{s} {e:?}");
            }
        }
        assert!(claim(Ct, "int4-g32", Sglang)
            .unwrap()
            .unproven_on_cpu
            .is_some());
    }

    /// The presets' `loads` words agree with the table: every engine the table says loads the
    /// preset's (format, scheme) is named, and a preset no engine loads says so.
    #[test]
    fn presets_name_the_engines_that_load_them() {
        for (name, _) in crate::quant::preset::BUILTIN {
            let p = crate::quant::preset::load(name).unwrap();
            let yes: Vec<Engine> = claims(p.format, &p.scheme)
                .filter(|c| c.loads == Loads::Yes)
                .map(|c| c.engine)
                .collect();
            for e in &yes {
                assert!(
                    p.loads.contains(e.name()),
                    "{name}: {:?} does not name {}",
                    p.loads,
                    e.name()
                );
            }
            if yes.is_empty() {
                assert!(p.loads.starts_with("no "), "{name}: {:?}", p.loads);
            }
        }
    }

    #[test]
    fn warning_only_when_nothing_loads() {
        let w = unloadable_warning(Quark, "int4-pc", Some("use X")).unwrap();
        assert!(
            w.starts_with("no serving engine loads --format quark --scheme int4-pc:"),
            "{w}"
        );
        assert!(w.contains("group_size must be a positive int"), "{w}");
        assert!(w.ends_with("use X"), "{w}");
        assert!(unloadable_warning(Quark, "int4-g32", None).is_none());
        assert!(unloadable_warning(Ct, "w4a8-int8", None).is_some());
    }
}
