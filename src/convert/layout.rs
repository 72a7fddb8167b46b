//! The engines (and trainers) a draft can be converted for, and what each expects on disk:
//! layer prefix, aux-id convention and keys, which optional tensors it reads, and its launch
//! line. The layouts are described in docs/formats.md; whether each serving engine loads the
//! result is `crate::engines`.

use serde::Serialize;

/// Where the converted draft is going.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum DraftLayout {
    /// SGLang (`midlayer.*`, its native names; its llama_eagle3 loader also reads `layers.0.*`).
    Sglang,
    /// vLLM (`layers.0.*`; aux ids read raw at top level = input of layer k).
    Vllm,
    /// TensorRT-LLM: EAGLE-3 in the ModelOpt export layout (`layers.0.*`), DFlash in z-lab's;
    /// both with extra-llm-api-config.yml.
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
    /// vLLM speculators format (`speculators_model_type`, `transformer_layer_config`): DSpark
    /// only, loaded by vLLM.
    Speculators,
}

impl DraftLayout {
    pub fn id(self) -> &'static str {
        match self {
            DraftLayout::Sglang => "sglang",
            DraftLayout::Vllm => "vllm",
            DraftLayout::Trtllm => "trtllm",
            DraftLayout::Specforge => "specforge",
            DraftLayout::Torchspec => "torchspec",
            DraftLayout::Eagle => "eagle",
            DraftLayout::Zlab => "zlab",
            DraftLayout::Speculators => "speculators",
        }
    }

    /// The serving engine this layout is for (none for trainers and reference layouts).
    pub fn serving(self) -> Option<crate::engines::Engine> {
        match self {
            DraftLayout::Sglang => Some(crate::engines::Engine::Sglang),
            DraftLayout::Vllm | DraftLayout::Speculators => Some(crate::engines::Engine::Vllm),
            DraftLayout::Trtllm => Some(crate::engines::Engine::Trtllm),
            _ => None,
        }
    }

    /// Layer prefix of the single EAGLE-3 decoder layer.
    pub fn eagle3_prefix(self) -> &'static str {
        match self {
            DraftLayout::Vllm | DraftLayout::Trtllm => "layers.0.",
            _ => "midlayer.",
        }
    }

    /// Engines valid for `convert eagle3` and `convert dflash`.
    pub fn for_eagle3(self) -> bool {
        !matches!(self, DraftLayout::Zlab | DraftLayout::Speculators)
    }
    pub fn for_dflash(self) -> bool {
        matches!(
            self,
            DraftLayout::Zlab
                | DraftLayout::Sglang
                | DraftLayout::Vllm
                | DraftLayout::Trtllm
                | DraftLayout::Specforge
                | DraftLayout::Torchspec
        )
    }

    /// The `--to` values for a family, comma-separated (for messages).
    pub fn ids_for(dflash: bool) -> String {
        <DraftLayout as clap::ValueEnum>::value_variants()
            .iter()
            .filter(|e| {
                if dflash {
                    e.for_dflash()
                } else {
                    e.for_eagle3()
                }
            })
            .map(|e| e.id())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// `s` as one shell word: unchanged when it holds only characters no shell treats specially,
/// else in single quotes.
pub fn sh_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+,:=@%~".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The command that serves the draft in directory `draft` with a target on `engine`. `steps`
/// is, for EAGLE-3, the draft depths per round; for DFlash, the tokens proposed per step
/// (at most the draft's `block_size` − 1; SGLang counts the block: `steps` + 1).
/// `context_length` caps an SGLang server at the draft's context (`crate::convert::Plan`).
pub fn launch_line(
    engine: DraftLayout,
    dflash: bool,
    draft: &str,
    steps: usize,
    context_length: Option<u64>,
) -> Option<String> {
    let d = sh_quote(draft);
    Some(match (engine, dflash) {
        (DraftLayout::Sglang, false) => sglang_server(
            &format!(
                "EAGLE3 --speculative-draft-model-path {d} --speculative-num-steps {steps} --speculative-eagle-topk 1 --speculative-num-draft-tokens {}",
                steps + 1
            ),
            context_length,
        ),
        (DraftLayout::Sglang, true) => sglang_dflash(&d, steps, context_length),
        (DraftLayout::Vllm, false) => vllm_serve("eagle3", draft, steps),
        (DraftLayout::Vllm, true) => vllm_serve("dflash", draft, steps),
        (DraftLayout::Trtllm, _) => format!(
            "trtllm-serve {TARGET} --backend pytorch --extra_llm_api_options {}",
            sh_quote(&format!("{draft}/{TRTLLM_YAML}"))
        ),
        _ => return None,
    })
}

/// The target's place in a launch line.
const TARGET: &str = "<path-to-target>";

/// `vllm serve` with a speculative config. `--trust-remote-code`: Kimi-K2.x ships its own
/// model code. The per-request acceptance (vLLM >= 0.29) is what `kquant verify --endpoint`
/// reads.
fn vllm_serve(method: &str, draft: &str, steps: usize) -> String {
    let cfg =
        serde_json::json!({"method": method, "model": draft, "num_speculative_tokens": steps});
    format!(
        "vllm serve {TARGET} --trust-remote-code --speculative-config {} --per-request-spec-decode-metrics summary",
        sh_quote_always(&cfg.to_string())
    )
}

/// SGLang's server with `--speculative-algorithm ALGO_AND_FLAGS`.
fn sglang_server(algorithm_and_flags: &str, context_length: Option<u64>) -> String {
    let ctx = context_length.map_or(String::new(), |n| format!(" --context-length {n}"));
    format!(
        "python -m sglang.launch_server --model-path {TARGET} --speculative-algorithm {algorithm_and_flags} --trust-remote-code{ctx}"
    )
}

/// SGLang's DFLASH worker (DFlash and DFlash2): it runs a block of `steps` + 1
/// (`--speculative-num-draft-tokens` is the block size; speculative_hook.py `_handle_dflash`).
fn sglang_dflash(d: &str, steps: usize, context_length: Option<u64>) -> String {
    sglang_server(
        &format!(
            "DFLASH --speculative-draft-model-path {d} --speculative-num-draft-tokens {}",
            steps + 1
        ),
        context_length,
    )
}

/// The command that serves a DSpark or DFlash2 draft written in `layout` with its block size,
/// in directory `draft`:
/// vLLM's `dspark` method (the 0.33 `SpeculativeConfig` takes `num_speculative_tokens` =
/// proposals per step; DFlash2 runs under `dflash`), SGLang's `DSPARK` (gamma = the block size
/// unless `--speculative-dspark-block-size` says otherwise; `--speculative-num-draft-tokens`
/// must be gamma + 1: speculative_hook.py `_handle_dspark`) or `DFLASH`. None for a trainer
/// layout (SpecForge).
pub fn block_launch_line(
    engine: DraftLayout,
    (layout, block_size): (crate::checkpoint::block::Layout, u64),
    draft: &str,
    steps: usize,
    context_length: Option<u64>,
) -> Option<String> {
    use crate::checkpoint::block::Layout;
    let d = sh_quote(draft);
    let dflash2 = matches!(layout, Layout::Dflash2 | Layout::Dflash2Mla);
    Some(match engine {
        DraftLayout::Vllm | DraftLayout::Speculators => {
            vllm_serve(if dflash2 { "dflash" } else { "dspark" }, draft, steps)
        }
        DraftLayout::Sglang if dflash2 => sglang_dflash(&d, steps, context_length),
        DraftLayout::Sglang => {
            let gamma = if steps as u64 == block_size {
                String::new()
            } else {
                format!(" --speculative-dspark-block-size {steps}")
            };
            sglang_server(
                &format!(
                    "DSPARK --speculative-draft-model-path {d}{gamma} --speculative-num-draft-tokens {}",
                    steps + 1
                ),
                context_length,
            )
        }
        _ => return None,
    })
}

/// `s` in single quotes (a JSON argument).
fn sh_quote_always(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The TensorRT-LLM options file `convert --to trtllm` writes into the draft's directory.
pub const TRTLLM_YAML: &str = "extra-llm-api-config.yml";
