//! Deterministic synthetic checkpoints: tiny fixtures of every family × dialect (committed under
//! `fixtures/tiny/`) and real-shape Kimi drafts for benchmarks (never committed).
//!
//! Weights are pseudo-random BF16 from a per-tensor seed (splitmix64), so the same preset
//! always gives the same bytes.

use serde_json::{json, Value};

use crate::io::writer::{TensorSpec, WriteOptions, WriteSummary, Writer};
use crate::io::Dtype;

/// How a tensor's contents are made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fill {
    /// Uniform in ±scale, BF16.
    Random(f32),
    /// 1 + uniform in ±0.05, BF16 (norm weights).
    Norm,
    /// `d2t` offsets (I64) for a draft vocab taking every `stride`-th target id.
    D2t { stride: u64 },
    /// `t2d` mask (BOOL) matching `D2t`.
    T2d { stride: u64 },
}

/// One tensor of a preset.
#[derive(Debug, Clone)]
pub struct SynthTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub fill: Fill,
}

/// A preset: config plus tensors.
#[derive(Debug, Clone)]
pub struct Preset {
    pub name: &'static str,
    pub about: &'static str,
    pub config: Value,
    pub tensors: Vec<SynthTensor>,
    /// Safetensors `__metadata__`.
    pub metadata: Vec<(&'static str, &'static str)>,
}

/// The tensors of a preset, listed in order by a chain of `weight` / `norm` calls.
struct Tensors(Vec<SynthTensor>);

impl Tensors {
    /// A BF16 weight of `shape`, uniform in ±1/√fan_in.
    fn weight(&mut self, name: impl Into<String>, shape: &[usize]) -> &mut Self {
        let fan_in = *shape.last().unwrap_or(&1) as f32;
        self.0.push(SynthTensor {
            name: name.into(),
            dtype: Dtype::BF16,
            shape: shape.to_vec(),
            fill: Fill::Random(1.0 / fan_in.sqrt()),
        });
        self
    }
    /// A BF16 norm weight of `len` values near 1.
    fn norm(&mut self, name: impl Into<String>, len: usize) -> &mut Self {
        self.0.push(SynthTensor {
            name: name.into(),
            dtype: Dtype::BF16,
            shape: vec![len],
            fill: Fill::Norm,
        });
        self
    }
    /// `d2t` and `t2d` for a draft vocabulary of every `vocab / draft`-th target id.
    fn vocab_map(&mut self, vocab: usize, draft: usize) -> &mut Self {
        let stride = (vocab / draft) as u64;
        self.0.push(SynthTensor {
            name: "d2t".into(),
            dtype: Dtype::I64,
            shape: vec![draft],
            fill: Fill::D2t { stride },
        });
        self.0.push(SynthTensor {
            name: "t2d".into(),
            dtype: Dtype::BOOL,
            shape: vec![vocab],
            fill: Fill::T2d { stride },
        });
        self
    }
}

/// Dimensions of an EAGLE-3 / DFlash draft preset.
#[derive(Clone, Copy)]
struct DraftDims {
    h: usize,
    heads: usize,
    kv: usize,
    hd: usize,
    inter: usize,
    vocab: usize,
    draft_vocab: usize,
}

const TINY: DraftDims = DraftDims {
    h: 64,
    heads: 4,
    kv: 2,
    hd: 16,
    inter: 128,
    vocab: 256,
    draft_vocab: 128,
};
const KIMI: DraftDims = DraftDims {
    h: 7168,
    heads: 64,
    kv: 64,
    hd: 128,
    inter: 12288,
    vocab: 163840,
    draft_vocab: 163840,
};

/// MLA dims: q_lora, kv_lora, nope, rope, v.
#[derive(Clone, Copy)]
struct MlaDims {
    q_lora: usize,
    kv_lora: usize,
    nope: usize,
    rope: usize,
    v: usize,
}

const TINY_MLA: MlaDims = MlaDims {
    q_lora: 32,
    kv_lora: 16,
    nope: 16,
    rope: 8,
    v: 16,
};
const KIMI_MLA: MlaDims = MlaDims {
    q_lora: 1536,
    kv_lora: 512,
    nope: 128,
    rope: 64,
    v: 128,
};

fn llama_layer(b: &mut Tensors, p: &str, d: DraftDims, input: usize) {
    b.weight(
        format!("{p}self_attn.q_proj.weight"),
        &[d.heads * d.hd, input],
    )
    .weight(format!("{p}self_attn.k_proj.weight"), &[d.kv * d.hd, input])
    .weight(format!("{p}self_attn.v_proj.weight"), &[d.kv * d.hd, input])
    .weight(
        format!("{p}self_attn.o_proj.weight"),
        &[d.h, d.heads * d.hd],
    );
    mlp(b, p, d.h, d.inter);
}

fn mlp(b: &mut Tensors, p: &str, h: usize, inter: usize) {
    b.weight(format!("{p}mlp.gate_proj.weight"), &[inter, h])
        .weight(format!("{p}mlp.up_proj.weight"), &[inter, h])
        .weight(format!("{p}mlp.down_proj.weight"), &[h, inter])
        .norm(format!("{p}post_attention_layernorm.weight"), h);
}

fn mla_attn(b: &mut Tensors, p: &str, h: usize, heads: usize, m: MlaDims, input: usize) {
    b.weight(format!("{p}self_attn.q_a_proj.weight"), &[m.q_lora, input])
        .norm(format!("{p}self_attn.q_a_layernorm.weight"), m.q_lora)
        .weight(
            format!("{p}self_attn.q_b_proj.weight"),
            &[heads * (m.nope + m.rope), m.q_lora],
        )
        .weight(
            format!("{p}self_attn.kv_a_proj_with_mqa.weight"),
            &[m.kv_lora + m.rope, input],
        )
        .norm(format!("{p}self_attn.kv_a_layernorm.weight"), m.kv_lora)
        .weight(
            format!("{p}self_attn.kv_b_proj.weight"),
            &[heads * (m.nope + m.v), m.kv_lora],
        )
        .weight(format!("{p}self_attn.o_proj.weight"), &[h, heads * m.v]);
}

fn eagle3_tensors(
    p: &str,
    d: DraftDims,
    mla: Option<MlaDims>,
    embed: bool,
    vocab_map: bool,
) -> Vec<SynthTensor> {
    let mut b = Tensors(Vec::new());
    match mla {
        Some(m) => {
            mla_attn(&mut b, p, d.h, d.heads, m, 2 * d.h);
            mlp(&mut b, p, d.h, d.inter);
        }
        None => llama_layer(&mut b, p, d, 2 * d.h),
    }
    b.norm(format!("{p}hidden_norm.weight"), d.h)
        .norm(format!("{p}input_layernorm.weight"), d.h)
        .weight("fc.weight", &[d.h, 3 * d.h])
        .norm("norm.weight", d.h)
        .weight("lm_head.weight", &[d.draft_vocab, d.h]);
    if embed {
        b.weight("embed_tokens.weight", &[d.vocab, d.h]);
    }
    if vocab_map && d.draft_vocab != d.vocab {
        b.vocab_map(d.vocab, d.draft_vocab);
    }
    b.0
}

fn llama_cfg(d: DraftDims, arch: &str) -> Value {
    json!({
        "architectures": [arch], "model_type": "llama", "hidden_size": d.h, "intermediate_size": d.inter,
        "num_attention_heads": d.heads, "num_key_value_heads": d.kv, "head_dim": d.hd, "num_hidden_layers": 1,
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "rope_theta": 50000.0,
        "vocab_size": d.vocab, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    })
}

fn mla_cfg(d: DraftDims, m: MlaDims, arch: &str) -> Value {
    json!({
        "architectures": [arch], "model_type": "kimi_k2", "hidden_size": d.h, "intermediate_size": d.inter,
        "num_attention_heads": d.heads, "num_key_value_heads": d.heads, "num_hidden_layers": 1,
        "q_lora_rank": m.q_lora, "kv_lora_rank": m.kv_lora, "qk_nope_head_dim": m.nope,
        "qk_rope_head_dim": m.rope, "v_head_dim": m.v, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144, "rope_theta": 50000.0,
        "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
        "vocab_size": d.vocab, "draft_vocab_size": d.draft_vocab, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    })
}

fn merge(mut a: Value, b: Value) -> Value {
    if let (Some(a), Value::Object(b)) = (a.as_object_mut(), b) {
        for (k, v) in b {
            a.insert(k, v);
        }
    }
    a
}

/// A DFlash drafter of `layers` layers tapping `ids` of a `target_layers`-layer target.
fn dflash(
    d: DraftDims,
    layers: usize,
    ids: &[i64],
    target_layers: usize,
    torchspec: bool,
) -> (Value, Vec<SynthTensor>) {
    let mut b = Tensors(Vec::new());
    for i in 0..layers {
        let p = format!("layers.{i}.");
        llama_layer(&mut b, &p, d, d.h);
        b.norm(format!("{p}self_attn.q_norm.weight"), d.hd)
            .norm(format!("{p}self_attn.k_norm.weight"), d.hd)
            .norm(format!("{p}input_layernorm.weight"), d.h);
    }
    let k = ids.len();
    let base = json!({
        "model_type": "qwen3", "hidden_size": d.h, "intermediate_size": d.inter, "num_attention_heads": d.heads,
        "num_key_value_heads": d.kv, "head_dim": d.hd, "num_hidden_layers": layers, "rms_norm_eps": 1e-6,
        "rope_theta": 50000.0, "vocab_size": d.vocab, "attention_bias": false, "num_target_layers": target_layers,
        "torch_dtype": "bfloat16",
    });
    if torchspec {
        b.weight("context_proj.weight", &[d.h, k * d.h])
            .norm("context_norm.weight", d.h)
            .norm("final_norm.weight", d.h)
            .weight("embed_tokens.weight", &[d.vocab, d.h]);
        let cfg = merge(
            base,
            json!({"architectures": ["DFlashDraftModel"], "model_type": "dflash", "target_layer_ids": ids,
                                     "mask_token_id": d.vocab - 1, "target_hidden_size": d.h, "_torchspec_version": "0.3.0"}),
        );
        (cfg, b.0)
    } else {
        b.weight("fc.weight", &[d.h, k * d.h])
            .norm("hidden_norm.weight", d.h)
            .norm("norm.weight", d.h);
        let cfg = merge(
            base,
            json!({"architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
                                     "block_size": 16, "dflash_config": {"mask_token_id": d.vocab - 1, "target_layer_ids": ids},
                                     "layer_types": vec!["full_attention"; layers]}),
        );
        (cfg, b.0)
    }
}

fn kimi_target(prefix: &str, layers: usize, experts: usize) -> Vec<SynthTensor> {
    let (h, heads, m, inter, moe_inter, vocab) = (64, 4, TINY_MLA, 128, 32, 256);
    let mut b = Tensors(Vec::new());
    b.weight(format!("{prefix}model.embed_tokens.weight"), &[vocab, h]);
    for l in 0..layers {
        let p = format!("{prefix}model.layers.{l}.");
        mla_attn(&mut b, &p, h, heads, m, h);
        b.norm(format!("{p}input_layernorm.weight"), h);
        if l == 0 {
            mlp(&mut b, &p, h, inter);
        } else {
            b.norm(format!("{p}post_attention_layernorm.weight"), h)
                .weight(format!("{p}mlp.gate.weight"), &[experts, h]);
            b.0.push(SynthTensor {
                name: format!("{p}mlp.gate.e_score_correction_bias"),
                dtype: Dtype::F32,
                shape: vec![experts],
                fill: Fill::Random(0.01),
            });
            for e in 0..experts {
                let q = format!("{p}mlp.experts.{e}.");
                b.weight(format!("{q}gate_proj.weight"), &[moe_inter, h])
                    .weight(format!("{q}up_proj.weight"), &[moe_inter, h])
                    .weight(format!("{q}down_proj.weight"), &[h, moe_inter]);
            }
            let s = format!("{p}mlp.shared_experts.");
            b.weight(format!("{s}gate_proj.weight"), &[moe_inter, h])
                .weight(format!("{s}up_proj.weight"), &[moe_inter, h])
                .weight(format!("{s}down_proj.weight"), &[h, moe_inter]);
        }
    }
    b.norm(format!("{prefix}model.norm.weight"), h)
        .weight(format!("{prefix}lm_head.weight"), &[vocab, h]);
    b.0
}

fn kimi_target_cfg(layers: usize, experts: usize) -> Value {
    json!({
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_size": 64, "intermediate_size": 128,
        "moe_intermediate_size": 32, "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 4,
        "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "n_routed_experts": experts, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
        "first_k_dense_replace": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "routed_scaling_factor": 2.827,
        "norm_topk_prob": true, "vocab_size": 256, "rms_norm_eps": 1e-6, "rope_theta": 50000.0, "torch_dtype": "bfloat16",
        "tie_word_embeddings": false,
    })
}

/// Names of every preset, for `--help` and tests.
pub const PRESETS: [&str; 21] = [
    "tiny-eagle3-specforge",
    "tiny-eagle3-vllm",
    "tiny-eagle3-modelopt",
    "tiny-eagle3-speculators",
    "tiny-eagle3-eagle",
    "tiny-eagle3-torchspec",
    "tiny-eagle3-mla-torchspec",
    "tiny-eagle3-mla-vllm",
    "tiny-dflash-zlab",
    "tiny-dflash-torchspec",
    "tiny-target-kimi-k2",
    "tiny-target-kimi-k2.5",
    "tiny-target-kimi-linear",
    "kimi-k2.5-eagle3",
    "kimi-k2.5-eagle3-mla",
    "kimi-k2.5-dflash",
    "kimi-linear-dflash",
    "kimi-linear-target-head",
    "kimi-k3-dspark",
    "kimi-k3-dspark-radixark",
    "kimi-k3-target-head",
];

/// Build a preset by name.
pub fn preset(name: &str) -> Option<Preset> {
    tiny_eagle3(name)
        .or_else(|| tiny_dflash_or_target(name))
        .or_else(|| real_shape(name))
        .or_else(|| kimi_k3(name))
}

/// A preset without safetensors metadata.
fn p(name: &'static str, about: &'static str, config: Value, tensors: Vec<SynthTensor>) -> Preset {
    Preset {
        name,
        about,
        config,
        tensors,
        metadata: vec![],
    }
}

/// An `eagle_config` recording the aux-layer ids `ids`.
fn eagle_cfg(ids: &Value) -> Value {
    json!({"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": true})
}

/// The tiny EAGLE-3 presets, one per tool's layout.
fn tiny_eagle3(name: &str) -> Option<Preset> {
    let ids_out = json!([1, 3, 4]); // "output of layer k" defaults for an 8-layer target
    Some(match name {
        "tiny-eagle3-specforge" => p(
            "tiny-eagle3-specforge",
            "EAGLE-3 (Llama attention) as SpecForge/SGLang write it: midlayer.*, pruned draft vocab with d2t/t2d",
            merge(llama_cfg(TINY, "LlamaForCausalLMEagle3"), json!({"draft_vocab_size": TINY.draft_vocab, "eagle_config": eagle_cfg(&ids_out)})),
            eagle3_tensors("midlayer.", TINY, None, false, true),
        ),
        "tiny-eagle3-vllm" => p(
            "tiny-eagle3-vllm",
            "EAGLE-3 in vLLM's native layers.0.* layout, ids at top level and nested (convention not recorded)",
            merge(
                llama_cfg(TINY, "LlamaForCausalLMEagle3"),
                json!({"draft_vocab_size": TINY.draft_vocab, "eagle_aux_hidden_state_layer_ids": [2, 4, 5], "eagle_config": eagle_cfg(&json!([2, 4, 5])), "norm_before_residual": false}),
            ),
            eagle3_tensors("layers.0.", TINY, None, false, true),
        ),
        "tiny-eagle3-modelopt" => p(
            "tiny-eagle3-modelopt",
            "EAGLE-3 as the 2026 ModelOpt exporter writes it: layers.0.*, eagle_config with next_layer_regular, d2t only",
            merge(
                llama_cfg(TINY, "LlamaForCausalLMEagle3"),
                json!({"draft_vocab_size": TINY.draft_vocab, "eagle_config": merge(eagle_cfg(&ids_out), json!({
                    "use_input_layernorm_in_first_layer": true, "use_last_layernorm": true, "use_mtp_layernorm": false,
                    "next_layer_regular": true, "parallel_draft_step": 1, "parallel_draft_heads_num_layers": 1}))}),
            ),
            eagle3_tensors("layers.0.", TINY, None, false, true).into_iter().filter(|t| t.name != "t2d").collect(),
        ),
        "tiny-eagle3-speculators" => p(
            "tiny-eagle3-speculators",
            "EAGLE-3 in the vLLM speculators config form (Eagle3Speculator, transformer_layer_config)",
            json!({"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "draft_vocab_size": TINY.draft_vocab,
                   "target_hidden_size": TINY.h, "norm_before_residual": true, "eagle_aux_hidden_state_layer_ids": [2, 4, 5],
                   "transformer_layer_config": llama_cfg(TINY, "LlamaForCausalLM"),
                   "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": "tiny-target"}}}),
            eagle3_tensors("layers.0.", TINY, None, true, true),
        ),
        "tiny-eagle3-eagle" => p(
            "tiny-eagle3-eagle",
            "EAGLE-3 as the EAGLE reference releases it: LlamaForCausalLM + draft_vocab_size, no aux ids",
            merge(llama_cfg(TINY, "LlamaForCausalLM"), json!({"draft_vocab_size": TINY.draft_vocab})),
            eagle3_tensors("midlayer.", TINY, None, false, true),
        ),
        "tiny-eagle3-torchspec" => Preset {
            metadata: vec![("torchspec_version", "0.3.0")],
            ..p(
                "tiny-eagle3-torchspec",
                "EAGLE-3 (Llama) as TorchSpec's convert_to_hf.py writes it: midlayer.*, own embed_tokens",
                merge(llama_cfg(TINY, "LlamaForCausalLMEagle3"), json!({"draft_vocab_size": TINY.vocab, "eagle_config": eagle_cfg(&ids_out), "_torchspec_version": "0.3.0"})),
                eagle3_tensors("midlayer.", DraftDims { draft_vocab: TINY.vocab, ..TINY }, None, true, true),
            )
        },
        "tiny-eagle3-mla-torchspec" => p(
            "tiny-eagle3-mla-torchspec",
            "EAGLE-3 with Kimi MLA attention, TorchSpec native export (midlayer.*, model_type kimi_k2)",
            merge(mla_cfg(TINY, TINY_MLA, "Eagle3DeepseekV2ForCausalLM"), json!({"eagle_config": eagle_cfg(&ids_out), "_torchspec_version": "0.3.0"})),
            eagle3_tensors("midlayer.", TINY, Some(TINY_MLA), true, true),
        ),
        "tiny-eagle3-mla-vllm" => p(
            "tiny-eagle3-mla-vllm",
            "EAGLE-3 MLA as TorchSpec `--vllm` exports it: layers.0.*, kimi_k2 ids shifted +1 (input of layer)",
            merge(
                mla_cfg(TINY, TINY_MLA, "Eagle3DeepseekV2ForCausalLM"),
                json!({"eagle_aux_hidden_state_layer_ids": [2, 4, 5], "eagle_config": eagle_cfg(&json!([2, 4, 5])), "_torchspec_version": "0.3.0"}),
            ),
            eagle3_tensors("layers.0.", TINY, Some(TINY_MLA), true, true),
        ),
        _ => return None,
    })
}

/// The tiny DFlash drafters and Kimi targets.
fn tiny_dflash_or_target(name: &str) -> Option<Preset> {
    Some(match name {
        "tiny-dflash-zlab" => {
            let (c, t) = dflash(TINY, 2, &[1, 4], 61, false);
            p(
                "tiny-dflash-zlab",
                "DFlash block drafter as z-lab (and SGLang/vLLM/SpecForge) write it",
                c,
                t,
            )
        }
        "tiny-dflash-torchspec" => {
            let (c, t) = dflash(TINY, 2, &[1, 4], 61, true);
            p(
                "tiny-dflash-torchspec",
                "DFlash with TorchSpec's names (context_proj, context_norm, final_norm)",
                c,
                t,
            )
        }
        "tiny-target-kimi-k2" => p(
            "tiny-target-kimi-k2",
            "Kimi-K2 (DeepSeek-V3) target: MLA, 1 dense + 2 MoE layers, 4 routed experts",
            kimi_target_cfg(3, 4),
            kimi_target("", 3, 4),
        ),
        "tiny-target-kimi-k2.5" => p(
            "tiny-target-kimi-k2.5",
            "Kimi-K2.5 multimodal wrapper: text_config + language_model.* tensors",
            json!({"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": kimi_target_cfg(2, 4)}),
            kimi_target("language_model.", 2, 4),
        ),
        "tiny-target-kimi-linear" => p(
            "tiny-target-kimi-linear",
            "Kimi-Linear target (config and the embedding/attention tensors kquant reads)",
            json!({"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "hidden_size": 64, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "num_experts": 4, "torch_dtype": "bfloat16"}),
            {
                let mut b = Tensors(Vec::new());
                b.weight("model.embed_tokens.weight", &[256, 64]);
                for l in 0..2 {
                    llama_layer(
                        &mut b,
                        &format!("model.layers.{l}."),
                        DraftDims { kv: 4, ..TINY },
                        64,
                    );
                    b.norm(format!("model.layers.{l}.input_layernorm.weight"), 64);
                }
                b.norm("model.norm.weight", 64)
                    .weight("lm_head.weight", &[256, 64]);
                b.0
            },
        ),
        _ => return None,
    })
}

/// The real-shape presets (the sizes of Kimi-K2.5's and Kimi-Linear's drafters and head).
fn real_shape(name: &str) -> Option<Preset> {
    Some(match name {
        "kimi-k2.5-eagle3" => p(
            "kimi-k2.5-eagle3",
            "real-shape Kimi-K2.5 EAGLE-3 (Llama attention), own embed_tokens and lm_head",
            merge(llama_cfg(KIMI, "LlamaForCausalLMEagle3"), json!({"eagle_config": eagle_cfg(&json!([1, 29, 57])), "draft_vocab_size": KIMI.vocab})),
            eagle3_tensors("midlayer.", KIMI, None, true, false),
        ),
        "kimi-k2.5-eagle3-mla" => {
            let d = DraftDims { inter: 18432, ..KIMI };
            p(
                "kimi-k2.5-eagle3-mla",
                "real-shape Kimi-K2.5 EAGLE-3 with MLA attention (q_lora 1536, kv_lora 512)",
                merge(mla_cfg(d, KIMI_MLA, "Eagle3DeepseekV2ForCausalLM"), json!({"eagle_config": eagle_cfg(&json!([1, 29, 57]))})),
                eagle3_tensors("midlayer.", d, Some(KIMI_MLA), true, false),
            )
        }
        "kimi-k2.5-dflash" => {
            let d = DraftDims { kv: 8, inter: 18432, ..KIMI };
            let (c, t) = dflash(d, 6, &[1, 12, 23, 34, 45, 56], 61, false);
            p("kimi-k2.5-dflash", "real-shape Kimi-K2.5 DFlash drafter (6 layers, 64 Q / 8 KV heads)", c, t)
        }
        "kimi-linear-dflash" => {
            // The Moonlight556/Kimi-Linear-48B-A3B-DFlash-240k card gives 5 layers, hidden 2304,
            // target_layer_ids [3, 7, 15, 19, 23], block 16, vocab 163840 and the 27-layer target;
            // the attention and MLP widths are not on it: 32 Q / 8 KV heads of 128 and the
            // target's dense intermediate 9216 are assumed.
            let d = DraftDims {
                h: 2304,
                heads: 32,
                kv: 8,
                hd: 128,
                inter: 9216,
                vocab: 163840,
                draft_vocab: 163840,
            };
            let (c, t) = dflash(d, 5, &[3, 7, 15, 19, 23], 27, false);
            p(
                "kimi-linear-dflash",
                "real-shape Kimi-Linear-48B-A3B DFlash drafter (5 layers, hidden 2304, block 16; heads and MLP width assumed)",
                c,
                t,
            )
        }
        "kimi-linear-target-head" => p(
            "kimi-linear-target-head",
            "real-shape Kimi-Linear-48B-A3B target's embed_tokens and lm_head (163840 x 2304) under its config: what a DFlash drafter takes from its target (`--target-checkpoint` of the replay)",
            // The checkpoint's own config.json (quant-configs/targets/cards/
            // moonshotai--Kimi-Linear-48B-A3B-Instruct.md); only the two tensors a DFlash
            // drafter reads are written, not the 48B of layers.
            json!({"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "hidden_size": 2304,
                   "num_hidden_layers": 27, "head_dim": 128,
                   "kv_lora_rank": 512, "q_lora_rank": null, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                   "v_head_dim": 128, "mla_use_nope": true, "num_experts": 256, "num_experts_per_token": 8,
                   "num_shared_experts": 1, "routed_scaling_factor": 2.446, "rms_norm_eps": 1e-5,
                   "vocab_size": 163840, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
                   "linear_attn_config": {"kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
                                          "full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "head_dim": 128, "num_heads": 32,
                                          "short_conv_kernel_size": 4}}),
            {
                let mut b = Tensors(Vec::new());
                b.weight("model.embed_tokens.weight", &[163840, 2304])
                    .weight("lm_head.weight", &[163840, 2304]);
                b.0
            },
        ),
        _ => return None,
    })
}

/// DSpark's heads: the rank-`r` Markov embedding and projection over the full vocabulary, and
/// the confidence head over the hidden state and the Markov feature.
fn dspark_heads(b: &mut Tensors, h: usize, vocab: usize, r: usize) {
    b.weight("markov_head.markov_w1.weight", &[vocab, r])
        .weight("markov_head.markov_w2.weight", &[vocab, r])
        .weight("confidence_head.proj.weight", &[1, h + r]);
    b.0.push(SynthTensor {
        name: "confidence_head.proj.bias".into(),
        dtype: Dtype::BF16,
        shape: vec![1],
        fill: Fill::Random(0.1),
    });
}

/// Kimi-K3's drafts at their published shapes (#40 item 7) and the target's embedding and
/// lm_head they read.
fn kimi_k3(name: &str) -> Option<Preset> {
    const VOCAB: usize = 163840;
    const H: usize = 7168;
    Some(match name {
        "kimi-k3-dspark" => {
            // Inferact/Kimi-K3-DSpark (K3DSparkModel) as third-party pins of revision
            // cf6b8244 give its config and 68-tensor roster: 5 MLA layers (64 heads, q_lora
            // 1536, kv_lora 512), SiLU MLP 14336, taps [2,23,47,71,89], Markov rank 256, a
            // copy of the target's embedding vLLM drops; plus `block_size` 7 (below).
            let m = MlaDims { q_lora: 1536, kv_lora: 512, nope: 128, rope: 64, v: 128 };
            let ids = [2, 23, 47, 71, 89];
            let mut b = Tensors(Vec::new());
            b.weight("context_proj.weight", &[H, ids.len() * H]).norm("context_norm.weight", H);
            for i in 0..5 {
                let p = format!("layers.{i}.");
                b.norm(format!("{p}input_layernorm.weight"), H);
                mla_attn(&mut b, &p, H, 64, m, H);
                mlp(&mut b, &p, H, 14336);
            }
            b.norm("final_norm.weight", H);
            dspark_heads(&mut b, H, VOCAB, 256);
            b.weight("embed_tokens.weight", &[VOCAB, H]);
            let mut pr = p(
                "kimi-k3-dspark",
                "real-shape Kimi-K3 DSpark, Inferact's MLA-native K3DSparkModel (5 MLA layers, hidden 7168, block 7, taps [2,23,47,71,89], Markov rank 256, confidence head)",
                json!({"architectures": ["K3DSparkModel"], "model_type": "k3_dspark", "_torchspec_version": "0.1.0",
                       "torch_dtype": "bfloat16", "hidden_size": H, "intermediate_size": 14336, "num_hidden_layers": 5,
                       "num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
                       "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": false,
                       "mla_use_output_gate": false, "vocab_size": VOCAB, "draft_vocab_size": VOCAB, "rms_norm_eps": 1e-5,
                       "max_position_embeddings": 1048576, "rope_theta": 50000.0,
                       "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 32768,
                                           "rope_theta": 50000.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
                       "num_target_layers": 5, "target_hidden_size": H, "target_num_hidden_layers": 93, "target_layer_ids": ids,
                       "mask_token_id": 163837, "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 163839,
                       "markov_rank": 256, "markov_head_type": "vanilla", "enable_confidence_head": true,
                       "confidence_head_with_markov": true, "tie_word_embeddings": false,
                       // The one key the published config lacks: vLLM takes the block from
                       // `num_speculative_tokens` at launch (7, the validated value); the
                       // replay reads it from the file.
                       "block_size": 7}),
                b.0,
            );
            pr.metadata = vec![("torchspec_version", "0.1.0")];
            pr
        }
        "kimi-k3-dspark-radixark" => {
            // RadixArk/Kimi-K3-DSpark in SpecForge's layout (configs/kimi-k3-dspark.json,
            // sgl-project/SpecForge#748; its 62-tensor roster from third-party pins): 5 Qwen3
            // GQA layers (64 Q / 16 KV heads of 64), taps [7,23,51,67,83], the DSpark keys in
            // `dflash_config` only, `num_target_layers` the target's depth.
            let d = DraftDims { h: H, heads: 64, kv: 16, hd: 64, inter: 14336, vocab: VOCAB, draft_vocab: VOCAB };
            let ids = [7, 23, 51, 67, 83];
            let (c, mut t) = dflash(d, 5, &ids, 93, false);
            let mut b = Tensors(Vec::new());
            dspark_heads(&mut b, H, VOCAB, 256);
            t.extend(b.0);
            let mut c = merge(c, json!({"architectures": ["DSparkDraftModel"], "block_size": 7, "target_hidden_size": H,
                "rope_theta": 10000.0, "max_position_embeddings": 1048576,
                "rope_scaling": {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536},
                "dflash_config": {"attention_mode": "gqa", "markov_rank": 256, "markov_head_type": "vanilla",
                                  "mask_token_id": 163824, "enable_confidence_head": true,
                                  "confidence_head_with_markov": true, "confidence_head_alpha": 1.0,
                                  "projector_type": "dspark", "target_layer_ids": ids}}));
            if let Some(o) = c.as_object_mut() {
                o.remove("auto_map");
            }
            p(
                "kimi-k3-dspark-radixark",
                "real-shape Kimi-K3 DSpark in RadixArk's SpecForge/SGLang layout (5 GQA layers 64/16 heads of 64, hidden 7168, block 7, taps [7,23,51,67,83], Markov rank 256; DSpark keys nested in dflash_config)",
                c,
                t,
            )
        }
        "kimi-k3-target-head" => p(
            "kimi-k3-target-head",
            "real-shape Kimi-K3 target's embed_tokens and lm_head (163840 x 7168) under its text config: what a DSpark or DFlash drafter takes from its target (`--target-checkpoint` of the replay)",
            // The language model's fields of moonshotai/Kimi-K3's config.json (`text_config`);
            // only the two tensors a block drafter reads are written, under the checkpoint's
            // `language_model.` names.
            json!({"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "hidden_size": H,
                   "num_hidden_layers": 93, "vocab_size": VOCAB, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
                   "num_attention_heads": 96, "num_key_value_heads": 96, "q_lora_rank": 1536, "kv_lora_rank": 512,
                   "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": true,
                   "mla_use_output_gate": true, "attn_res_block_size": 12, "hidden_act": "situ", "rms_norm_eps": 1e-5}),
            {
                let mut b = Tensors(Vec::new());
                b.weight("language_model.model.embed_tokens.weight", &[VOCAB, H])
                    .weight("language_model.lm_head.weight", &[VOCAB, H]);
                b.0
            },
        ),
        _ => return None,
    })
}

impl Preset {
    pub fn specs(&self) -> Vec<TensorSpec> {
        self.tensors
            .iter()
            .map(|t| TensorSpec::new(&t.name, t.dtype, t.shape.clone()))
            .collect()
    }
    pub fn total_bytes(&self) -> u64 {
        self.specs().iter().map(TensorSpec::nbytes).sum()
    }

    /// Write the preset to `out` with the streaming writer.
    pub fn write(
        &self,
        out: &std::path::Path,
        mut opts: WriteOptions,
        progress: &indicatif::ProgressBar,
    ) -> crate::Result<WriteSummary> {
        if !self.metadata.is_empty() {
            opts.metadata = Some(
                self.metadata
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
        }
        let mut w = Writer::create(out, self.specs(), opts)?;
        let order: Vec<String> = w.order().into_iter().map(String::from).collect();
        let by_name: std::collections::HashMap<&str, &SynthTensor> =
            self.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
        let mut buf = Vec::new();
        for name in order {
            let t = by_name[name.as_str()];
            let numel: usize = t.shape.iter().product();
            let chunk = 1 << 22;
            let mut start = 0;
            while start < numel {
                let n = chunk.min(numel - start);
                fill(t, start, n, &mut buf);
                w.write_part(&name, &buf)?;
                progress.inc(buf.len() as u64);
                start += n;
            }
            w.end_tensor(&name)?;
        }
        let cfg = serde_json::to_vec_pretty(&self.config).expect("config JSON");
        w.add_file("config.json", &cfg)?;
        w.finish()
    }
}

fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fill `buf` with the bytes of elements `start..start+n` of tensor `t`.
fn fill(t: &SynthTensor, start: usize, n: usize, buf: &mut Vec<u8>) {
    use rayon::prelude::*;
    buf.clear();
    buf.resize(n * t.dtype.size(), 0);
    let seed = seed_of(&t.name);
    let unit = |i: usize| {
        (splitmix(seed ^ (i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d)) >> 40) as f32
            / (1u64 << 24) as f32
            * 2.0
            - 1.0
    };
    let bf = |v: f32| half::bf16::from_f32(v).to_bits().to_le_bytes();
    match t.fill {
        Fill::Random(scale) => buf
            .par_chunks_mut(2)
            .enumerate()
            .for_each(|(i, c)| c.copy_from_slice(&bf(unit(start + i) * scale))),
        Fill::Norm => buf
            .par_chunks_mut(2)
            .enumerate()
            .for_each(|(i, c)| c.copy_from_slice(&bf(1.0 + 0.05 * unit(start + i)))),
        Fill::D2t { stride } => buf.chunks_mut(8).enumerate().for_each(|(i, c)| {
            let i = (start + i) as i64;
            c.copy_from_slice(&(i * stride as i64 - i).to_le_bytes())
        }),
        Fill::T2d { stride } => buf
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = ((start + i) as u64).is_multiple_of(stride) as u8),
    }
}
