//! The prompt sets users already have, read for a live verify against a serving engine
//! (vLLM, SGLang, TensorRT-LLM): each record of a JSON Lines file becomes one [`LivePrompt`],
//! with an id, a category (what the accept length is reported per) and the [`Body`] sent to the
//! server. The format is named (`--prompt-format`) or detected from the first record's keys
//! ([`SetFormat::Auto`]); every record of the file must then fit it.
//!
//! Where each format comes from, and what of a record is sent:
//! - **`mt-bench`**: lm-sys/FastChat `fastchat/llm_judge/data/mt_bench/question.jsonl`
//!   (`question_id`, `category`, two `turns`, optional `reference`). The first turn, as one chat
//!   user message: what vLLM's `MTBenchDataset` sends (`turns[0]` under the chat template).
//! - **`spec-bench`**: hemingkx/Spec-Bench `data/spec_bench/question.jsonl` (the same shape; the
//!   MT-Bench categories plus translation, summarization, qa, math_reasoning and rag). The first
//!   turn, as vLLM's `SpecBench` sends it.
//! - **`speed-bench`**: the Hugging Face data set nvidia/SPEED-Bench (its `qualitative` and
//!   `throughput_*` configs: `question_id`, `category`, `sub_category`, `turns`, `source`,
//!   `src_id`, `difficulty`, `multiturn`), materialised as jsonl; or records of chat `messages`
//!   with a `category`. The messages, or the first turn as a user message.
//! - **`gsm8k`**: openai/grade-school-math `grade_school_math/data/test.jsonl` (the Hugging Face
//!   data set openai/gsm8k: `question`, `answer` ending `#### N`). The question as one user
//!   message, zero-shot.
//! - **`math500`**: HuggingFaceH4/MATH-500 `test.jsonl` (`problem`, `solution`, `answer`,
//!   `subject`, `level`, `unique_id`). The problem as one user message; the category is the
//!   subject.
//! - **`humaneval`**: openai/human-eval `data/HumanEval.jsonl.gz`, gunzipped (`task_id`, `prompt`,
//!   `canonical_solution`, `test`, `entry_point`). The prompt as raw text to continue: it is code,
//!   sent without a chat template.
//! - **`plain`**: a user's own jsonl: `prompt` or `text` (raw text to continue) or `messages`
//!   (chat), with optional `id`, `category`, `dataset`.
//! - **`tokens`**: token ids, as `kquant trace prompts` writes them (`tokens`, or `prompt_ids` /
//!   `input_ids`; optional `id`, `category`, `dataset`), sent as they are. The same rules as the
//!   capture reader (`trace::capture::read_prompts`).
//!
//! Chat messages are sent as `{"role", "content"}` objects with string values (other keys of a
//! record's messages are dropped); the server applies the target's chat template.
//!
//! Raw text goes through [`apply_text_mode`] (`--text-mode`, as `scripts/vllm_capture.py`'s):
//! `auto` sends the text of a chat benchmark's record (its `dataset` names MT-Bench,
//! Spec-Bench, SPEED-Bench, GSM8K or MATH-500, as the bundled `mt_bench.jsonl` does) as one user
//! message, other text as it is; `chat` sends every text as a user message (the script's
//! default); `raw` every text as it is.
//!
//! The files: `prompt` (the record type, [`LivePrompt`] and its [`Body`]), `format` (the
//! formats, [`SetFormat`], and their detection), `fields` (a record's fields, read with the
//! checks every format shares), `benchmarks` (the MT-Bench, Spec-Bench, SPEED-Bench, GSM8K,
//! MATH-500 and HumanEval readers), `plain` (plain text or chat), `tokens` (token ids), `read`
//! (a file read, each record by its format's reader), `text_mode` (how raw text is sent).

mod benchmarks;
mod fields;
pub mod format;
mod plain;
pub mod prompt;
pub mod read;
pub mod text_mode;
mod tokens;

pub use format::SetFormat;
pub use prompt::{Body, LivePrompt};
pub use read::{per_category, read};
pub use text_mode::{apply_text_mode, is_chat_dataset, TextMode};
