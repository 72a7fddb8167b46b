//! The engines (and trainers) a draft can be converted for, and what each expects on disk:
//! layer prefix, aux-id convention and keys, which optional tensors it reads, and its launch
//! line. The layouts are described in docs/formats.md; whether each serving engine loads the
//! result is `crate::engines`.

use serde::Serialize;

/// Where the converted draft is going.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Engine {
    /// SGLang (`midlayer.*`, its native names; its llama_eagle3 loader also reads `layers.0.*`).
    Sglang,
    /// vLLM (`layers.0.*`; aux ids read raw at top level = input of layer k).
    Vllm,
    /// TensorRT-LLM via the ModelOpt export layout (`layers.0.*` + extra-llm-api-config.yml).
    #[value(alias = "modelopt")]
    Trtllm,
    /// SpecForge training layout (`midlayer.*`, d2t + t2d, no embed_tokens).
    Specforge,
    /// TorchSpec native export (`midlayer.*` / DFlash `context_proj`, own embed_tokens).
    Torchspec,
    /// The EAGLE reference release (`LlamaForCausalLM` + `draft_vocab_size`).
    Eagle,
    /// z-lab DFlash (`DFlashDraftModel`, `dflash_config`).
    Zlab,
}

impl Engine {
    pub fn id(self) -> &'static str {
        match self {
            Engine::Sglang => "sglang",
            Engine::Vllm => "vllm",
            Engine::Trtllm => "trtllm",
            Engine::Specforge => "specforge",
            Engine::Torchspec => "torchspec",
            Engine::Eagle => "eagle",
            Engine::Zlab => "zlab",
        }
    }

    /// The serving engine this layout is for (none for trainers and reference layouts).
    pub fn serving(self) -> Option<crate::engines::Engine> {
        match self {
            Engine::Sglang => Some(crate::engines::Engine::Sglang),
            Engine::Vllm => Some(crate::engines::Engine::Vllm),
            Engine::Trtllm => Some(crate::engines::Engine::Trtllm),
            _ => None,
        }
    }

    /// Layer prefix of the single EAGLE-3 decoder layer.
    pub fn eagle3_prefix(self) -> &'static str {
        match self {
            Engine::Vllm | Engine::Trtllm => "layers.0.",
            _ => "midlayer.",
        }
    }

    /// Engines valid for `convert eagle3` and `convert dflash`.
    pub fn for_eagle3(self) -> bool {
        !matches!(self, Engine::Zlab)
    }
    pub fn for_dflash(self) -> bool {
        matches!(
            self,
            Engine::Zlab | Engine::Sglang | Engine::Vllm | Engine::Specforge | Engine::Torchspec
        )
    }
}

/// The command that serves `draft` with `target` on `engine`.
pub fn launch_line(engine: Engine, dflash: bool, draft: &str, steps: usize) -> Option<String> {
    let target = "<path-to-target>";
    Some(match (engine, dflash) {
        (Engine::Sglang, false) => format!(
            "python -m sglang.launch_server --model-path {target} --speculative-algorithm EAGLE3 --speculative-draft-model-path {draft} \
             --speculative-num-steps {steps} --speculative-eagle-topk 1 --speculative-num-draft-tokens {} --trust-remote-code",
            steps + 1
        ),
        (Engine::Sglang, true) => format!(
            "python -m sglang.launch_server --model-path {target} --speculative-algorithm DFLASH --speculative-draft-model-path {draft} \
             --speculative-num-draft-tokens 16 --trust-remote-code"
        ),
        (Engine::Vllm, false) => format!(
            "vllm serve {target} --speculative-config '{{\"method\":\"eagle3\",\"model\":\"{draft}\",\"num_speculative_tokens\":{steps}}}'"
        ),
        (Engine::Vllm, true) => format!(
            "vllm serve {target} --speculative-config '{{\"method\":\"dflash\",\"model\":\"{draft}\",\"num_speculative_tokens\":15}}'"
        ),
        (Engine::Trtllm, false) => format!("trtllm-serve {target} --backend pytorch --extra_llm_api_options {draft}/extra-llm-api-config.yml"),
        _ => return None,
    })
}
