//! Quantized claims: which engine loads a (format, scheme) result, independent of the draft's
//! layout (a layout the engine refuses is refused quantized too; see [`super::support`]). One
//! row per claim; `kquant schemes`, `kquant inspect` and the quantize warning all read it.
//!
//! To change a claim, edit its row: `yes`/`no`/`depends`, the release it was checked with
//! ([`VLLM`], [`SGLANG`], or [`SOURCE`] for a reading of the engine's source or of kquant's
//! earlier notes, not yet run), and the engine's own reason (for a `no`, its error, quoted).
//! The measured rows come from EAGLE-3 Llama drafts quantized with `--exclude fc,lm_head`.

use super::claim::{no, yes, Claim, Engine, Loads, SGLANG, SOURCE, VLLM};
use crate::checkpoint::Family;
use crate::quant::registry::{Format, Scheme};

/// What vLLM's CPU build did serving the `int4-pc` compressed-tensors EAGLE-3 draft.
const SERVED_INT4_PC: &str = "bf16, CPUWNA16LinearKernel as W4A16 (`VLLM_CPU_INT4_W4A8=0`; vLLM's default runs INT4 as W4A8 on CPUs with AMX); the EAGLE-3 Llama draft against its BF16 original on 60 prompts, vLLM's paired gate and kquant's offline one reach the same decision (docs/verify.md, \"A real engine\")";

/// Which drafts a row is for: every family, or an exception for one family (EAGLE-3 MLA,
/// DFlash) that takes precedence over the row for all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drafts {
    All,
    Mla,
    Dflash,
}

impl Drafts {
    /// The exception rows that apply to `family` (none: only the rows for all).
    pub fn of(family: &Family) -> Drafts {
        match family {
            Family::Eagle3Mla => Drafts::Mla,
            Family::Dflash => Drafts::Dflash,
            _ => Drafts::All,
        }
    }

    /// The drafts in prose, for `kquant schemes`.
    pub fn name(self) -> &'static str {
        match self {
            Drafts::All => "every draft",
            Drafts::Mla => "EAGLE-3 MLA drafts",
            Drafts::Dflash => "DFlash drafts",
        }
    }
}

/// One row.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub format: Format,
    pub scheme: Scheme,
    pub drafts: Drafts,
    pub claim: Claim,
}

const fn row(drafts: Drafts, format: Format, scheme: Scheme, claim: Claim) -> Row {
    Row {
        format,
        scheme,
        drafts,
        claim,
    }
}

/// A row for all drafts.
const fn q(format: Format, scheme: Scheme, claim: Claim) -> Row {
    row(Drafts::All, format, scheme, claim)
}

/// An EAGLE-3 MLA exception to the row for all drafts.
const fn mla(format: Format, scheme: Scheme, claim: Claim) -> Row {
    row(Drafts::Mla, format, scheme, claim)
}

/// A DFlash exception to the row for all drafts.
const fn dflash(format: Format, scheme: Scheme, claim: Claim) -> Row {
    row(Drafts::Dflash, format, scheme, claim)
}

use Engine::{Sglang, Trtllm, Vllm};
use Format::{CompressedTensors as Ct, Modelopt, Quark};
use Scheme::{
    Fp8Pc, Fp8Pt, Int4G128, Int4G32, Int4G64, Int4Pc, Nvfp4, Nvfp4A16, Uint4G128, Uint4G32,
    Uint4G64, W4a8Fp8, W4a8Int8,
};

const MARLIN: &str = "kernel set-up (Marlin workspace) not run on CPU";
const SM90: &str = "GPU capability check answered as SM 9.0";
const VLLM_FP4: &str = "kernel choice stood in (FP4 Marlin, as on SM 8.0–9.0; CPU has no NVFP4 kernel) and its weight repack not run on CPU";
const VLLM_MLA_GEMM: &str = "the INT4 GEMM vLLM's MLA runs after loading (kv_b_proj absorbed into attention) not run on CPU";
const SGLANG_NO_QUARK_INT4: &str = "build: `NotImplementedError: No quark compatible scheme was found` (SGLang has no Quark W4A16 INT4/UINT4 scheme)";
const SGLANG_MLA_FUSED: &str = "load: `AssertionError: param.shape=torch.Size([2]) … loaded_weight.shape=torch.Size([4])` (SGLang's EAGLE-3 MLA loader fuses q_a and kv_a; the per-shard quantization tensors do not fit the fused parameter)";
const SGLANG_MLA_FP4: &str = "load: `AssertionError: param.shape=torch.Size([1]) … loaded_weight.shape=torch.Size([2])` (SGLang's EAGLE-3 MLA loader fuses q_a and kv_a; their two global scales do not fit)";
const SGLANG_MLA_FLOAT: &str = "load: `NotImplementedError: Eagle3 MLA draft post_load_weights only supports float dtypes, got torch.float8_e4m3fn`";
const TRTLLM_MODELOPT_ONLY: &str = "TensorRT-LLM reads ModelOpt quantization (`hf_quant_config.json`, quant_method `modelopt`), not this format";
const TRTLLM_DFLASH_FLOAT: &str = "TensorRT-LLM's DFlash drafter uses `fc` as a plain torch Linear and slices `qkv_proj.weight` to precompute context K/V (tensorrt_llm/_torch/speculative/dflash.py@00679c6): quantized weights are not read (UNVERIFIED reading)";
const CT_WNA16_VLLM: &str = "CompressedTensorsWNA16 (W4A16): Marlin/Machete on CUDA, Triton W4A16 on ROCm; post-load processing included";
const CT_WNA16_SGLANG: &str = "CompressedTensorsWNA16 (W4A16, Marlin)";
const QUARK_W4A16_VLLM: &str = "QuarkW4A16Int4 (CUDA and ROCm)";
const QUARK_U4_VLLM: &str = "QuarkW4A16Int4 with zero points (CUDA and ROCm)";
const VLLM_MODELOPT_NO_AWQ: &str = "build: `ValueError: ModelOpt currently only supports: ['FP8', 'FP8_PER_CHANNEL_PER_TOKEN', 'FP8_PB_WO', 'NVFP4', 'W4A16_NVFP4', 'MXFP8', 'MIXED_PRECISION'] quantizations in vLLM`";
const SGLANG_MODELOPT_FP8_ONLY: &str =
    "build: `ValueError: ModelOptFp8Config only supports regular FP8 quantization, but found";

/// The table. Measured rows (`VLLM`, `SGLANG`) come from the engine-loader tier
/// (docs/engines.md): EAGLE-3 Llama, EAGLE-3 MLA and DFlash drafts, widened ×8, quantized
/// with `--exclude fc,lm_head` (DFlash `--exclude fc`). In sections, in order: a scheme whose
/// rows are the same for each group size but its own has one section per size, made by
/// [`int4_group`] or [`uint4_group`].
static QUANTIZED: &[&[Row]] = &[
    INT4_PC,
    &int4_group(Int4G32),
    &int4_group(Int4G64),
    INT4_G128_ON,
    &uint4_group(Uint4G32),
    &uint4_group(Uint4G64),
    &uint4_group(Uint4G128),
    NVFP4,
    FP8_PT,
];

/// Every row of the table, in order.
pub fn rows() -> impl Iterator<Item = &'static Row> {
    QUANTIZED.iter().flat_map(|section| section.iter())
}

/// INT4 weight-only, per output channel.
#[rustfmt::skip]
static INT4_PC: &[Row] = &[
    q(Quark, Int4Pc, no(Vllm, VLLM, "build: `ValueError: Quark W4A16 weight.group_size must be a positive int, got None` (vLLM's QuarkW4A16Int4 needs per-group scales)")),
    q(Quark, Int4Pc, no(Sglang, SGLANG, SGLANG_NO_QUARK_INT4)),
    q(Quark, Int4Pc, no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Ct, Int4Pc, yes(Vllm, VLLM, CT_WNA16_VLLM).serves_on_cpu(SERVED_INT4_PC)),
    mla(Ct, Int4Pc, yes(Vllm, VLLM, CT_WNA16_VLLM).unproven_on_cpu(VLLM_MLA_GEMM)),
    q(Ct, Int4Pc, yes(Sglang, SGLANG, CT_WNA16_SGLANG).unproven_on_cpu(MARLIN)),
    mla(Ct, Int4Pc, no(Sglang, SGLANG, SGLANG_MLA_FUSED)),
    q(Ct, Int4Pc, no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
];

/// INT4 weight-only, per group: the rows of one group size (32 and 64 alike; 128 adds what was
/// served on CPU).
#[rustfmt::skip]
const fn int4_group(s: Scheme) -> [Row; 9] {
    [
        q(Quark, s, yes(Vllm, VLLM, QUARK_W4A16_VLLM)),
        mla(Quark, s, yes(Vllm, VLLM, QUARK_W4A16_VLLM).unproven_on_cpu(VLLM_MLA_GEMM)),
        q(Quark, s, no(Sglang, SGLANG, SGLANG_NO_QUARK_INT4)),
        q(Quark, s, no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
        q(Ct, s, yes(Vllm, VLLM, CT_WNA16_VLLM)),
        mla(Ct, s, yes(Vllm, VLLM, CT_WNA16_VLLM).unproven_on_cpu(VLLM_MLA_GEMM)),
        q(Ct, s, yes(Sglang, SGLANG, CT_WNA16_SGLANG).unproven_on_cpu(MARLIN)),
        mla(Ct, s, no(Sglang, SGLANG, SGLANG_MLA_FUSED)),
        q(Ct, s, no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    ]
}

/// INT4 weight-only, per group of 128 (what was served on CPU besides [`int4_group`]'s rows),
/// then FP8 and the two W4A8.
#[rustfmt::skip]
static INT4_G128_ON: &[Row] = &[
    q(Quark, Int4G128, yes(Vllm, VLLM, QUARK_W4A16_VLLM).serves_on_cpu("bf16, CPUWNA16LinearKernel as W4A16 (`VLLM_CPU_INT4_W4A8=0`); the EAGLE-3 Llama draft, measured live on 3 prompts. With vLLM's default on a CPU with AMX (W4A8) it stops at start-up: `AssertionError` at `assert self.w_zp_name` in `_process_gptq_weights_w4a8` (vllm/model_executor/kernels/linear/mixed_precision/cpu.py)")),
    mla(Quark, Int4G128, yes(Vllm, VLLM, QUARK_W4A16_VLLM).unproven_on_cpu(VLLM_MLA_GEMM)),
    q(Quark, Int4G128, no(Sglang, SGLANG, SGLANG_NO_QUARK_INT4)),
    q(Quark, Int4G128, no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Ct, Int4G128, yes(Vllm, VLLM, CT_WNA16_VLLM).serves_on_cpu("bf16, CPUWNA16LinearKernel as W4A16 (`VLLM_CPU_INT4_W4A8=0`); the EAGLE-3 Llama draft, measured live on 3 prompts")),
    mla(Ct, Int4G128, yes(Vllm, VLLM, CT_WNA16_VLLM).unproven_on_cpu(VLLM_MLA_GEMM)),
    q(Ct, Int4G128, yes(Sglang, SGLANG, CT_WNA16_SGLANG).unproven_on_cpu(MARLIN)),
    mla(Ct, Int4G128, no(Sglang, SGLANG, SGLANG_MLA_FUSED)),
    q(Ct, Int4G128, no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Modelopt, Int4G128, no(Vllm, VLLM, VLLM_MODELOPT_NO_AWQ).serving_refused_on_cpu("bf16: `ModelOpt currently only supports: ['FP8', 'FP8_PER_CHANNEL_PER_TOKEN', 'FP8_PB_WO', 'NVFP4', 'W4A16_NVFP4', 'MXFP8', 'MIXED_PRECISION'] quantizations in vLLM`")),
    q(Modelopt, Int4G128, no(Sglang, SGLANG, "build: `ValueError: ModelOptFp8Config only supports regular FP8 quantization, but found 'W4A16_AWQ'`")),
    q(Modelopt, Int4G128, yes(Trtllm, SOURCE, "W4A16_AWQ_LinearMethod (Hopper and Blackwell)")),
    dflash(Modelopt, Int4G128, no(Trtllm, SOURCE, TRTLLM_DFLASH_FLOAT)),

    // FP8 per output channel, dynamic per-token activations.
    q(Quark, Fp8Pc, yes(Vllm, VLLM, "QuarkW8A8Fp8 (CUDA and ROCm)")),
    q(Quark, Fp8Pc, yes(Sglang, SGLANG, "QuarkW8A8Fp8 (CUDA and ROCm)").unproven_on_cpu(SM90)),
    mla(Quark, Fp8Pc, no(Sglang, SGLANG, SGLANG_MLA_FLOAT)),
    q(Quark, Fp8Pc, no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Ct, Fp8Pc, yes(Vllm, VLLM, "CompressedTensorsW8A8Fp8 (CUDA and ROCm); post-load processing included").serves_on_cpu("bf16; the EAGLE-3 Llama draft, measured live on 3 prompts")),
    q(Ct, Fp8Pc, yes(Sglang, SGLANG, "CompressedTensorsW8A8Fp8 (CUDA and ROCm); post-load processing included").unproven_on_cpu(SM90)),
    mla(Ct, Fp8Pc, no(Sglang, SGLANG, SGLANG_MLA_FLOAT)),
    q(Ct, Fp8Pc, no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Modelopt, Fp8Pc, yes(Vllm, VLLM, "ModelOpt FP8_PER_CHANNEL_PER_TOKEN (CUDA)")),
    q(Modelopt, Fp8Pc, no(Sglang, SGLANG, SGLANG_MODELOPT_FP8_ONLY)),
    q(Modelopt, Fp8Pc, yes(Trtllm, SOURCE, "FP8RowwiseLinearMethod")),
    dflash(Modelopt, Fp8Pc, no(Trtllm, SOURCE, TRTLLM_DFLASH_FLOAT)),

    // Quark two-stage W4A8 (int4_fp8).
    q(Quark, W4a8Fp8, no(Vllm, VLLM, "build: `NotImplementedError: Multi-entry weight or activation quantization configs are only supported for NVFP4.` (vLLM reads int4_fp8 for MoE experts only)")),
    q(Quark, W4a8Fp8, no(Sglang, SGLANG, "build: `AttributeError: 'list' object has no attribute 'get'` (SGLang's Quark config reader expects one weight entry; int4_fp8 has two)")),
    mla(Quark, W4a8Fp8, no(Sglang, SGLANG, "build: `TypeError: unhashable type: 'dict'` (SGLang's Quark config reader expects one weight entry; int4_fp8 has two)")),
    q(Quark, W4a8Fp8, no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),

    // compressed-tensors W4A8 (int8 activations).
    q(Ct, W4a8Int8, yes(Vllm, VLLM, "vLLM's CPU backend only (CompressedTensorsW4A8Int has CPU kernels; CUDA and ROCm have none)").cpu_only().serves_on_cpu("bf16, Dynamic4bitLinearKernel; the EAGLE-3 Llama draft, measured live on 3 prompts")),
    q(Ct, W4a8Int8, no(Sglang, SGLANG, "build: `NotImplementedError: No compressed-tensors compatible scheme was found.`")),
    q(Ct, W4a8Int8, no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
];

/// Quark UINT4 (asymmetric) per group: the rows of one group size (32, 64 and 128 alike).
#[rustfmt::skip]
const fn uint4_group(s: Scheme) -> [Row; 4] {
    [
        q(Quark, s, yes(Vllm, VLLM, QUARK_U4_VLLM)),
        mla(Quark, s, yes(Vllm, VLLM, QUARK_U4_VLLM).unproven_on_cpu(VLLM_MLA_GEMM)),
        q(Quark, s, no(Sglang, SGLANG, SGLANG_NO_QUARK_INT4)),
        q(Quark, s, no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    ]
}

/// NVFP4, weight-only and W4A4.
#[rustfmt::skip]
static NVFP4: &[Row] = &[

    // NVFP4 weight-only.
    q(Ct, Nvfp4A16, yes(Vllm, VLLM, "CompressedTensorsW4A16Fp4: native FP4 GEMM on sm100+ (Blackwell), FP4 Marlin on Ampere/Hopper (sm80+); NVIDIA only").unproven_on_cpu(VLLM_FP4).serving_refused_on_cpu("bf16: `Forced NVFP4 kernel MarlinNvFp4LinearKernel is not supported: Marlin FP4 not available` (a GPU kernel; not a verdict on GPU serving)")),
    q(Ct, Nvfp4A16, yes(Sglang, SGLANG, "CompressedTensorsW4A16Fp4 (FP4 Marlin below SM100); NVIDIA only").unproven_on_cpu(MARLIN)),
    mla(Ct, Nvfp4A16, no(Sglang, SGLANG, SGLANG_MLA_FP4)),
    q(Ct, Nvfp4A16, no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Modelopt, Nvfp4A16, yes(Vllm, VLLM, "ModelOpt W4A16_NVFP4: native FP4 GEMM on sm100+ (Blackwell), FP4 Marlin on Ampere/Hopper (sm80+); NVIDIA only").unproven_on_cpu(VLLM_FP4)),
    q(Modelopt, Nvfp4A16, yes(Sglang, SGLANG, "ModelOptNvFp4A16LinearMethod (FP4 Marlin below SM100); NVIDIA only").unproven_on_cpu(MARLIN)),
    mla(Modelopt, Nvfp4A16, no(Sglang, SGLANG, "load: `AssertionError` in the fused q_a/kv_a weight loader (SGLang's EAGLE-3 MLA loader fuses q_a and kv_a; their FP4 scales do not fit)")),
    q(Modelopt, Nvfp4A16, no(Trtllm, SOURCE, "no TensorRT-LLM linear method for W4A16_NVFP4 known to kquant (NVFP4LinearMethod is W4A4; UNVERIFIED reading)")),

    // NVFP4 weights and activations (W4A4).
    q(Ct, Nvfp4, yes(Vllm, VLLM, "CompressedTensorsW4A4Fp4: native W4A4 on sm100+ (CUTLASS/FlashInfer), FP4 Marlin weight-only on Ampere/Hopper (input scale unused); NVIDIA only").unproven_on_cpu(VLLM_FP4)),
    q(Ct, Nvfp4, yes(Sglang, SGLANG, "CompressedTensorsW4A4Fp4 (FP4 Marlin below SM100); NVIDIA only").unproven_on_cpu(MARLIN)),
    mla(Ct, Nvfp4, no(Sglang, SGLANG, SGLANG_MLA_FP4)),
    q(Ct, Nvfp4, no(Trtllm, SOURCE, TRTLLM_MODELOPT_ONLY)),
    q(Modelopt, Nvfp4, yes(Vllm, VLLM, "ModelOpt NVFP4: native W4A4 on sm100+ (CUTLASS/FlashInfer), FP4 Marlin weight-only on Ampere/Hopper (input scale unused); NVIDIA only").unproven_on_cpu(VLLM_FP4)),
    q(Modelopt, Nvfp4, no(Sglang, SGLANG, "post-load, SM 9.0: `ValueError: ModelOpt NVFP4 native dense GEMM backends require SM100+. Use --fp4-gemm-backend marlin on SM80-SM90.`").version_note("on SM100+ (Blackwell) SGLang takes its native FP4 GEMM, and below it `--fp4-gemm-backend marlin`: neither run on CPU")),
    mla(Modelopt, Nvfp4, no(Sglang, SGLANG, "load: `AssertionError` in the fused q_a/kv_a weight loader (SGLang's EAGLE-3 MLA loader fuses q_a and kv_a; their FP4 scales do not fit)")),
    q(Modelopt, Nvfp4, yes(Trtllm, SOURCE, "NVFP4LinearMethod (Blackwell)")),
    dflash(Modelopt, Nvfp4, no(Trtllm, SOURCE, TRTLLM_DFLASH_FLOAT)),
    q(Quark, Nvfp4, yes(Vllm, SOURCE, "QuarkNVFP4 (kquant does not write this carrier yet)")),
];

/// The claims for a (format, scheme) result for every draft, in table order.
pub fn claims(format: Format, scheme: Scheme) -> impl Iterator<Item = &'static Claim> {
    rows()
        .filter(move |r| r.format == format && r.scheme == scheme && r.drafts == Drafts::All)
        .map(|r| &r.claim)
}

/// The family exceptions for a (format, scheme) result, in table order.
pub fn exceptions(format: Format, scheme: Scheme) -> impl Iterator<Item = &'static Row> {
    rows().filter(move |r| r.format == format && r.scheme == scheme && r.drafts != Drafts::All)
}

/// `engine`'s claim for a (format, scheme) result, for every draft.
pub fn claim(format: Format, scheme: Scheme, engine: Engine) -> Option<&'static Claim> {
    claims(format, scheme).find(|c| c.engine == engine)
}

/// `engine`'s claim for a (format, scheme) result of a `family` draft: the family's exception
/// where the table has one, else the claim for every draft.
pub fn claim_for(
    format: Format,
    scheme: Scheme,
    engine: Engine,
    family: &Family,
) -> Option<&'static Claim> {
    let drafts = Drafts::of(family);
    exceptions(format, scheme)
        .find(|r| r.drafts == drafts && r.claim.engine == engine)
        .map(|r| &r.claim)
        .or_else(|| claim(format, scheme, engine))
}

/// The warning `kquant quantize` prints when no engine in the table loads the result for a
/// `family` draft (the family's exceptions applied, as `inspect` and `schemes` apply them), with
/// the target's advice (what to use instead) after it; `None` when some engine loads it.
pub fn unloadable_warning(
    format: Format,
    scheme: Scheme,
    family: &Family,
    advice: Option<&str>,
) -> Option<String> {
    let all: Vec<&Claim> = Engine::ALL
        .iter()
        .filter_map(|&e| claim_for(format, scheme, e, family))
        .collect();
    if all.is_empty() || all.iter().any(|c| c.loads == Loads::Yes && !c.cpu_only) {
        return None;
    }
    let head = if all.iter().any(|c| c.loads == Loads::Yes) {
        "no GPU serving engine loads"
    } else if all.iter().all(|c| c.loads == Loads::No) {
        "no serving engine loads"
    } else {
        "no serving engine loads on every platform"
    };
    let drafts = Drafts::of(family);
    let whose = if exceptions(format, scheme).any(|r| r.drafts == drafts) {
        format!(" for {}", drafts.name())
    } else {
        String::new()
    };
    let mut s = format!(
        "{head} --format {} --scheme {scheme}{whose}:",
        format.name()
    );
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

/// Per-tensor FP8's post-load step in vLLM: fused q/k/v and gate/up arrive with one scale per
/// part and are requantized to the largest (`requantize_with_max_scale`,
/// quantization/utils/w8a8_utils.py) by a CUDA op.
const VLLM_FP8_REQUANT: &str = "post-load requantization of fused q/k/v and gate/up to their largest per-tensor scale (`requantize_with_max_scale`: `ops.scaled_fp8_quant`, a CUDA op the CPU build lacks) not run on CPU";
/// The same step in SGLang (`sgl_kernel`'s `sgl_per_tensor_quant_fp8`).
const SGLANG_FP8_REQUANT: &str = "post-load requantization of fused q/k/v and gate/up to their largest per-tensor scale (`requantize_with_max_scale`: sgl_kernel's `sgl_per_tensor_quant_fp8`, not on CPU) not run on CPU";

/// FP8 per tensor with a static per-tensor input scale, in ModelOpt's drafter-quantizer layout
/// (quant_algo `FP8`), as the loader tier measured it (`--fixed-input-amax`, `fc` and
/// `lm_head` excluded).
#[rustfmt::skip]
static FP8_PT: &[Row] = &[
    q(Modelopt, Fp8Pt, yes(Vllm, VLLM, "ModelOpt FP8: ModelOptFp8LinearMethod, static per-tensor weight and input scales (vllm/model_executor/layers/quantization/modelopt.py)").unproven_on_cpu(VLLM_FP8_REQUANT)),
    q(Modelopt, Fp8Pt, yes(Sglang, SGLANG, "ModelOptFp8LinearMethod, static per-tensor weight and input scales (sglang/srt/layers/quantization/modelopt_quant.py)").unproven_on_cpu(SGLANG_FP8_REQUANT)),
    mla(Modelopt, Fp8Pt, no(Sglang, SGLANG, "load: `AssertionError: param.shape=torch.Size([1]) … loaded_weight.shape=torch.Size([2])` (SGLang's EAGLE-3 MLA loader fuses q_a and kv_a; their two per-tensor scales do not fit)")),
    q(Modelopt, Fp8Pt, yes(Trtllm, SOURCE, "FP8QDQLinearMethod (quant_algo FP8)")),
    dflash(Modelopt, Fp8Pt, no(Trtllm, SOURCE, TRTLLM_DFLASH_FLOAT)),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::registry::SCHEMES;

    /// Every carrier kquant writes has a vLLM and an SGLang claim (no gaps), every row names a
    /// carrier of the registry, and no engine is claimed twice for one carrier.
    #[test]
    fn every_implemented_carrier_has_claims() {
        for s in SCHEMES {
            for c in s.carriers.iter().filter(|c| c.implemented()) {
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
        for r in rows() {
            let known = r
                .scheme
                .info()
                .carriers
                .iter()
                .any(|c| c.format == r.format);
            assert!(
                known,
                "{} {} is not in the registry",
                r.format.name(),
                r.scheme
            );
            let n = rows()
                .filter(|o| {
                    o.format == r.format
                        && o.scheme == r.scheme
                        && o.drafts == r.drafts
                        && o.claim.engine == r.claim.engine
                })
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
        assert_eq!(l(Quark, Int4Pc, Vllm), Loads::No);
        assert_eq!(l(Quark, Int4Pc, Sglang), Loads::No);
        assert_eq!(l(Quark, Int4G32, Vllm), Loads::Yes);
        assert_eq!(l(Quark, Int4G32, Sglang), Loads::No);
        for s in [Int4Pc, Int4G32, Fp8Pc] {
            for e in [Vllm, Sglang] {
                assert_eq!(l(Ct, s, e), Loads::Yes, "{s} {e:?}");
            }
        }
        assert!(claim(Ct, Int4G32, Sglang)
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
            let yes: Vec<Engine> = claims(p.format, p.scheme.parse().unwrap())
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
        let any = Family::Eagle3;
        let w = unloadable_warning(Quark, Int4Pc, &any, Some("use X")).unwrap();
        assert!(
            w.starts_with("no serving engine loads --format quark --scheme int4-pc:"),
            "{w}"
        );
        assert!(w.contains("group_size must be a positive int"), "{w}");
        assert!(w.ends_with("use X"), "{w}");
        assert!(unloadable_warning(Quark, Int4G32, &any, None).is_none());
        assert!(unloadable_warning(Quark, W4a8Fp8, &any, None).is_some());
        let w = unloadable_warning(Ct, W4a8Int8, &any, None).unwrap();
        assert!(w.starts_with("no GPU serving engine loads"), "{w}");
        // The family's exceptions count: TensorRT-LLM loads ModelOpt int4-g128 EAGLE-3 drafts
        // but not DFlash ones, so a DFlash draft gets the warning an EAGLE-3 draft does not.
        assert!(unloadable_warning(Modelopt, Int4G128, &any, None).is_none());
        let w = unloadable_warning(Modelopt, Int4G128, &Family::Dflash, None).unwrap();
        assert!(
            w.starts_with(
                "no serving engine loads --format modelopt --scheme int4-g128 for DFlash drafts:"
            ),
            "{w}"
        );
    }
}
