//! A prompt file's format (`--prompt-format`): the names, the shape of one record of each (for
//! hints), and the detection from the first record's keys.

use serde_json::{Map, Value};

use super::prompt::LivePrompt;

/// A prompt file's format (`--prompt-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SetFormat {
    /// Detected from the first record's keys.
    Auto,
    /// FastChat's MT-Bench `question.jsonl`: the first turn as a chat message.
    MtBench,
    /// Spec-Bench's `question.jsonl`: the first turn as a chat message.
    SpecBench,
    /// NVIDIA SPEED-Bench, as jsonl: chat messages, or the first turn.
    SpeedBench,
    /// GSM8K `test.jsonl`: the question as a chat message.
    Gsm8k,
    /// MATH-500 `test.jsonl`: the problem as a chat message.
    Math500,
    /// HumanEval: the prompt as raw text to continue.
    Humaneval,
    /// `prompt` / `text` (raw text) or `messages` (chat).
    Plain,
    /// Token ids (`kquant trace prompts` output).
    Tokens,
}

impl SetFormat {
    /// The format's name, as `--prompt-format` takes it and [`LivePrompt::dataset`] labels it.
    pub fn name(self) -> &'static str {
        match self {
            SetFormat::Auto => "auto",
            SetFormat::MtBench => "mt-bench",
            SetFormat::SpecBench => "spec-bench",
            SetFormat::SpeedBench => "speed-bench",
            SetFormat::Gsm8k => "gsm8k",
            SetFormat::Math500 => "math500",
            SetFormat::Humaneval => "humaneval",
            SetFormat::Plain => "plain",
            SetFormat::Tokens => "tokens",
        }
    }

    /// What one record of the format looks like (for hints).
    pub(super) fn shape(self) -> &'static str {
        match self {
            SetFormat::Auto => FORMATS,
            SetFormat::MtBench => {
                r#"an mt-bench record (FastChat question.jsonl) is {"question_id": 81, "category": "writing", "turns": ["…", "…"]}"#
            }
            SetFormat::SpecBench => {
                r#"a spec-bench record (Spec-Bench question.jsonl) is {"question_id": 81, "category": "translation", "turns": ["…"]}"#
            }
            SetFormat::SpeedBench => {
                r#"a speed-bench record is {"question_id": "…", "category": "coding", "turns": ["…"]} or {"category": "coding", "messages": [{"role": "user", "content": "…"}]}"#
            }
            SetFormat::Gsm8k => r#"a gsm8k record is {"question": "…", "answer": "… #### 18"}"#,
            SetFormat::Math500 => {
                r#"a math500 record is {"problem": "…", "solution": "…", "answer": "…", "subject": "Algebra", "level": 2, "unique_id": "test/algebra/1.json"}"#
            }
            SetFormat::Humaneval => {
                r#"a humaneval record is {"task_id": "HumanEval/0", "prompt": "def …", "entry_point": "…", "canonical_solution": "…", "test": "…"}"#
            }
            SetFormat::Plain => {
                r#"a plain record is {"id": 1, "category": "…", "prompt": "text to continue"} ("text" is read as "prompt"), or {"messages": [{"role": "user", "content": "…"}]}"#
            }
            SetFormat::Tokens => {
                r#"a tokens record is {"id": 0, "category": "…", "tokens": [token ids]} ("prompt_ids" or "input_ids" also read), as `kquant trace prompts` writes"#
            }
        }
    }
}

/// Every format, for the hint of a file that fits none.
pub(super) const FORMATS: &str = "the prompt formats are mt-bench and spec-bench ({question_id, category, turns}), speed-bench ({category, turns} or {category, messages}), gsm8k ({question, answer}), math500 ({problem, solution, answer, subject}), humaneval ({task_id, prompt, entry_point}), plain ({prompt} or {text} or {messages}) and tokens ({tokens}); name one with --prompt-format";

/// Spec-Bench's categories: MT-Bench's eight and its own five.
const SPEC_BENCH_CATEGORIES: [&str; 13] = [
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
    "translation",
    "summarization",
    "qa",
    "math_reasoning",
    "rag",
];
/// The categories only Spec-Bench has (one of them tells a Spec-Bench file from MT-Bench).
const SPEC_BENCH_ONLY: [&str; 5] = [
    "translation",
    "summarization",
    "qa",
    "math_reasoning",
    "rag",
];
/// Keys of SPEED-Bench records that MT-Bench and Spec-Bench records do not carry.
const SPEED_BENCH_KEYS: [&str; 4] = ["sub_category", "multiturn", "src_id", "difficulty"];
/// Where a tokens record keeps its ids, in the order they are looked for.
pub(super) const TOKEN_KEYS: [&str; 3] = ["tokens", "prompt_ids", "input_ids"];

/// The format a record's keys say it is (the detection order of [`SetFormat::Auto`]); `None` when
/// it fits none. MT-Bench and Spec-Bench records have the same keys: the file's categories tell
/// them apart afterwards ([`is_spec_bench`]).
pub(super) fn detect(rec: &Map<String, Value>) -> Option<SetFormat> {
    let has = |k: &str| rec.get(k).is_some_and(|v| !v.is_null());
    Some(if TOKEN_KEYS.iter().any(|k| has(k)) {
        SetFormat::Tokens
    } else if has("turns") && has("question_id") {
        if SPEED_BENCH_KEYS.iter().any(|k| has(k)) {
            SetFormat::SpeedBench
        } else {
            SetFormat::MtBench
        }
    } else if (has("messages") || has("turns")) && has("category") {
        SetFormat::SpeedBench
    } else if has("question") && has("answer") {
        SetFormat::Gsm8k
    } else if has("problem") && (has("solution") || has("answer")) {
        SetFormat::Math500
    } else if has("task_id") && has("prompt") && has("entry_point") {
        SetFormat::Humaneval
    } else if has("prompt") || has("text") || has("messages") {
        SetFormat::Plain
    } else {
        return None;
    })
}

/// Whether prompts read as MT-Bench are Spec-Bench's: every category one of Spec-Bench's, one
/// of them only Spec-Bench's.
pub(super) fn is_spec_bench(prompts: &[LivePrompt]) -> bool {
    prompts
        .iter()
        .all(|p| SPEC_BENCH_CATEGORIES.contains(&p.category.as_str()))
        && prompts
            .iter()
            .any(|p| SPEC_BENCH_ONLY.contains(&p.category.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_match_clap_and_serde() {
        use clap::ValueEnum;
        for f in SetFormat::value_variants() {
            let clap_name = f.to_possible_value().unwrap().get_name().to_string();
            assert_eq!(clap_name, f.name());
            assert_eq!(serde_json::to_value(f).unwrap(), json!(f.name()));
        }
    }
}
