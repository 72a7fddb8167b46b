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

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::error::{Error, Result};

/// What is sent for one prompt.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// Token ids, sent as they are (completions `prompt: [ids]`, SGLang `input_ids`).
    Tokens(Vec<u32>),
    /// Raw text continued as it is (completions endpoint, no chat template).
    Text(String),
    /// Chat messages ({"role", "content"} objects): the server applies the target's chat template.
    Messages(Vec<Value>),
}

/// One prompt of a prompt set.
#[derive(Debug, Clone, PartialEq)]
pub struct LivePrompt {
    /// The record's own id (question_id, task_id, unique_id, id) as a string, else the line
    /// number (1-based) as a string; unique within the file (a duplicate is an error).
    pub id: String,
    /// What the accept length is reported per (the record's category; see [`SetFormat`]).
    pub category: String,
    /// The format name, or the record's `dataset` for plain/tokens.
    pub dataset: String,
    /// What is sent.
    pub body: Body,
}

/// How raw text is sent (`verify --text-mode`; `scripts/vllm_capture.py --text-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TextMode {
    /// A chat benchmark's text as a user message through the chat template, other text as is.
    Auto,
    /// Every text as a user message through the chat template.
    Chat,
    /// Every text as it is (completions, no chat template).
    Raw,
}

/// Whether `dataset` names a benchmark whose prompts are chat turns (MT-Bench, Spec-Bench,
/// SPEED-Bench, GSM8K, MATH-500; not HumanEval, whose prompts are code to continue).
pub fn is_chat_dataset(dataset: &str) -> bool {
    let k: String = dataset
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    matches!(
        k.as_str(),
        "mtbench" | "specbench" | "speedbench" | "gsm8k" | "math500"
    )
}

/// Send each prompt's raw text the way `mode` says: as one user message (the server applies
/// the target's chat template, as the capture script does) or as it is. Token ids and chat
/// messages are left as they are. Returns how many prompts went to chat.
pub fn apply_text_mode(prompts: &mut [LivePrompt], mode: TextMode) -> usize {
    let mut n = 0;
    for p in prompts {
        let chat = match mode {
            TextMode::Raw => false,
            TextMode::Chat => true,
            TextMode::Auto => is_chat_dataset(&p.dataset),
        };
        if let (true, Body::Text(t)) = (chat, &p.body) {
            p.body = user(t);
            n += 1;
        }
    }
    n
}

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
    fn shape(self) -> &'static str {
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
const FORMATS: &str = "the prompt formats are mt-bench and spec-bench ({question_id, category, turns}), speed-bench ({category, turns} or {category, messages}), gsm8k ({question, answer}), math500 ({problem, solution, answer, subject}), humaneval ({task_id, prompt, entry_point}), plain ({prompt} or {text} or {messages}) and tokens ({tokens}); name one with --prompt-format";

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
const TOKEN_KEYS: [&str; 3] = ["tokens", "prompt_ids", "input_ids"];
/// The hint of a line that is not a JSON object.
const JSONL_HINT: &str = "a prompt file is JSON Lines: one JSON object per line, UTF-8; a JSON array or a parquet/arrow file must be converted to jsonl first";

/// Read `path` as `format` (Auto: detected). Returns the format used and the prompts in file order.
pub fn read(path: &Path, format: SetFormat) -> Result<(SetFormat, Vec<LivePrompt>)> {
    let file = crate::io::text::open_regular(path, crate::io::text::MAX_PROMPTS, "prompt file")?;
    let mut reader = std::io::BufReader::new(file);
    let mut used = format;
    let mut detected_at = 0usize;
    let mut out: Vec<LivePrompt> = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut buf = Vec::new();
    let mut line = 0usize;
    loop {
        buf.clear();
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| Error::io("read", path, e))?;
        if n == 0 {
            break;
        }
        line += 1;
        let at = at(path, line);
        let bytes = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
        let bytes = match line {
            1 => bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes),
            _ => bytes,
        };
        let text = std::str::from_utf8(bytes)
            .map_err(|e| Error::source(&at, format!("is not UTF-8 ({e})")).with_hint(JSONL_HINT))?;
        if text.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(text)
            .map_err(|e| Error::source(&at, format!("is not JSON: {e}")).with_hint(JSONL_HINT))?;
        let Value::Object(rec) = v else {
            return Err(
                Error::source(&at, format!("is not a JSON object (it is {})", kind(&v)))
                    .with_hint(JSONL_HINT),
            );
        };
        if used == SetFormat::Auto {
            used = detect(&rec).ok_or_else(|| {
                let mut keys: Vec<String> = rec.keys().take(8).map(|k| format!("`{k}`")).collect();
                if rec.len() > keys.len() {
                    keys.push("…".into());
                }
                let keys = if keys.is_empty() {
                    "it has no keys".to_string()
                } else {
                    format!("its keys: {}", keys.join(", "))
                };
                Error::source(&at, format!("fits none of the prompt formats ({keys})"))
                    .with_hint(FORMATS)
            })?;
            detected_at = line;
        }
        let p = parse(used, &Record(&rec), line).map_err(|bad| {
            let how = match format {
                SetFormat::Auto => format!(
                    "line {detected_at} looks like {}, so every record is read as one; name the format with --prompt-format if it is another",
                    used.name()
                ),
                _ => format!("--prompt-format {} was given", used.name()),
            };
            let hint = match bad.hint {
                Some(h) => h,
                None => format!("{}; {how}", used.shape()),
            };
            Error::source(&at, bad.msg).with_hint(hint)
        })?;
        if let Some(first) = seen.insert(p.id.clone(), line) {
            return Err(Error::source(
                &at,
                format!("id `{}` appears twice (first on line {first})", p.id),
            )
            .with_hint("each prompt needs its own id (a record without one is numbered by its line); renumber or remove the duplicate"));
        }
        out.push(p);
    }
    if out.is_empty() {
        return Err(
            Error::source(path, "has no prompts: nothing to measure").with_hint(match format {
                SetFormat::Auto => FORMATS.to_string(),
                f => format!("{}, one per line", f.shape()),
            }),
        );
    }
    if format == SetFormat::Auto && used == SetFormat::MtBench && is_spec_bench(&out) {
        used = SetFormat::SpecBench;
        for p in &mut out {
            p.dataset = used.name().into();
        }
    }
    Ok((used, out))
}

/// Indices of the first `limit` prompts of each category, in file order (all when None).
pub fn per_category(prompts: &[LivePrompt], limit: Option<usize>) -> Vec<usize> {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    prompts
        .iter()
        .enumerate()
        .filter(|(_, p)| {
            let n = counts.entry(p.category.as_str()).or_default();
            *n += 1;
            limit.is_none_or(|l| *n <= l)
        })
        .map(|(i, _)| i)
        .collect()
}

/// `FILE:LINE`, the path of an error about one record.
fn at(path: &Path, line: usize) -> PathBuf {
    PathBuf::from(format!("{}:{}", path.display(), line))
}

/// What kind of JSON value `v` is, for messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The format a record's keys say it is (the detection order of [`SetFormat::Auto`]); `None` when
/// it fits none. MT-Bench and Spec-Bench records have the same keys: the file's categories tell
/// them apart afterwards ([`is_spec_bench`]).
fn detect(rec: &Map<String, Value>) -> Option<SetFormat> {
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
fn is_spec_bench(prompts: &[LivePrompt]) -> bool {
    prompts
        .iter()
        .all(|p| SPEC_BENCH_CATEGORIES.contains(&p.category.as_str()))
        && prompts
            .iter()
            .any(|p| SPEC_BENCH_ONLY.contains(&p.category.as_str()))
}

/// Why a record does not fit its format; `hint` replaces the format's own.
struct Bad {
    msg: String,
    hint: Option<String>,
}

impl From<String> for Bad {
    fn from(msg: String) -> Self {
        Bad { msg, hint: None }
    }
}

type Fit<T> = std::result::Result<T, Bad>;

/// One record's fields, read with the checks every format shares.
struct Record<'a>(&'a Map<String, Value>);

impl Record<'_> {
    /// The value of `k`; a JSON `null` counts as absent.
    fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }

    fn has(&self, k: &str) -> bool {
        self.get(k).is_some()
    }

    /// `k` as a string when present.
    fn opt_str(&self, k: &str) -> Fit<Option<&str>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(format!("`{k}` is not a string (it is {})", kind(v)).into()),
        }
    }

    /// `k`, a string that must be there (it may be empty).
    fn req_str(&self, k: &str) -> Fit<&str> {
        self.opt_str(k)?
            .ok_or_else(|| format!("has no `{k}`").into())
    }

    /// `k`, a string that must be there and not be blank (what is sent, or what is reported per).
    fn req_text(&self, k: &str) -> Fit<&str> {
        let s = self.req_str(k)?;
        if s.trim().is_empty() {
            return Err(format!("`{k}` is empty").into());
        }
        Ok(s)
    }

    /// The id under the first of `keys` present (an integer or a non-empty string), else the
    /// line number.
    fn id(&self, keys: &[&str], line: usize) -> Fit<String> {
        let Some((k, v)) = keys.iter().find_map(|k| self.get(k).map(|v| (k, v))) else {
            return Ok(line.to_string());
        };
        match v {
            Value::Number(n) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
            Value::String(s) if !s.trim().is_empty() => Ok(s.clone()),
            Value::String(_) => Err(format!("`{k}` is empty").into()),
            v => Err(format!("`{k}` is not an integer or a string (it is {})", kind(v)).into()),
        }
    }

    /// The first of `turns`, which must be a non-empty list of strings.
    fn first_turn(&self) -> Fit<String> {
        let turns = match self.get("turns") {
            None => return Err("has no `turns`".to_string().into()),
            Some(Value::Array(a)) => a,
            Some(v) => {
                return Err(format!("`turns` is not a list of strings (it is {})", kind(v)).into())
            }
        };
        if let Some(k) = turns.iter().position(|t| !t.is_string()) {
            return Err(format!("turn {k} is not a string (it is {})", kind(&turns[k])).into());
        }
        match turns.first().and_then(Value::as_str) {
            None => Err("`turns` is empty".to_string().into()),
            Some(t) if t.trim().is_empty() => Err("the first turn is empty".to_string().into()),
            Some(t) => Ok(t.to_string()),
        }
    }

    /// `messages`: a non-empty list of objects with string `role` (non-empty) and `content`,
    /// kept as `{"role", "content"}`.
    fn messages(&self) -> Fit<Vec<Value>> {
        let list = match self.get("messages") {
            None => Err("has no `messages`".to_string()),
            Some(Value::Array(a)) if a.is_empty() => Err("`messages` is empty".to_string()),
            Some(Value::Array(a)) => Ok(a),
            Some(v) => Err(format!(
                "`messages` is not a list of messages (it is {})",
                kind(v)
            )),
        };
        list.and_then(|list| {
            list.iter()
                .enumerate()
                .map(|(k, m)| message(k, m))
                .collect()
        })
        .map_err(|msg| Bad {
            msg,
            hint: Some(MESSAGES_HINT.into()),
        })
    }
}

/// The hint of a record whose chat messages are malformed.
const MESSAGES_HINT: &str = r#"chat messages are a non-empty list of {"role": "user", "content": "…"} objects with string values"#;

/// Message `k` of a record's `messages`, kept as `{"role", "content"}`.
fn message(k: usize, m: &Value) -> std::result::Result<Value, String> {
    let Value::Object(o) = m else {
        return Err(format!(
            "message {k} is not a JSON object (it is {})",
            kind(m)
        ));
    };
    let role = match o.get("role") {
        Some(Value::String(r)) if !r.trim().is_empty() => r,
        Some(Value::String(_)) => return Err(format!("message {k}: `role` is empty")),
        None | Some(Value::Null) => return Err(format!("message {k} has no `role`")),
        Some(v) => {
            return Err(format!(
                "message {k}: `role` is not a string (it is {})",
                kind(v)
            ))
        }
    };
    let content = match o.get("content") {
        Some(Value::String(c)) => c,
        None | Some(Value::Null) => return Err(format!("message {k} has no `content`")),
        Some(v) => {
            return Err(format!(
                "message {k}: `content` is not a string (it is {})",
                kind(v)
            ))
        }
    };
    Ok(json!({"role": role, "content": content}))
}

/// One user message.
fn user(content: &str) -> Body {
    Body::Messages(vec![json!({"role": "user", "content": content})])
}

/// One record read as `format` (not `Auto`).
fn parse(format: SetFormat, r: &Record, line: usize) -> Fit<LivePrompt> {
    let name = format.name().to_string();
    Ok(match format {
        SetFormat::Auto => unreachable!("read resolves Auto before parsing"),
        SetFormat::MtBench | SetFormat::SpecBench => {
            if !r.has("question_id") {
                return Err("has no `question_id`".to_string().into());
            }
            LivePrompt {
                id: r.id(&["question_id"], line)?,
                category: r.req_text("category")?.into(),
                dataset: name,
                body: user(&r.first_turn()?),
            }
        }
        SetFormat::SpeedBench => {
            let body = match (r.has("messages"), r.has("turns")) {
                (true, true) => {
                    return Err("has both `messages` and `turns`; give one"
                        .to_string()
                        .into())
                }
                (true, false) => Body::Messages(r.messages()?),
                (false, true) => user(&r.first_turn()?),
                (false, false) => return Err("has no `messages` (or `turns`)".to_string().into()),
            };
            LivePrompt {
                id: r.id(&["question_id", "id"], line)?,
                category: r.req_text("category")?.into(),
                dataset: name,
                body,
            }
        }
        SetFormat::Gsm8k => {
            let question = r.req_text("question")?;
            r.req_str("answer")?;
            LivePrompt {
                id: r.id(&["id"], line)?,
                category: name.clone(),
                dataset: name,
                body: user(question),
            }
        }
        SetFormat::Math500 => {
            let problem = r.req_text("problem")?;
            r.opt_str("solution")?;
            let category = match r.opt_str("subject")? {
                Some(s) if !s.trim().is_empty() => s.to_string(),
                _ => name.clone(),
            };
            LivePrompt {
                id: r.id(&["unique_id", "id"], line)?,
                category,
                dataset: name,
                body: user(problem),
            }
        }
        SetFormat::Humaneval => {
            let task = r.req_text("task_id")?.to_string();
            let prompt = r.req_text("prompt")?;
            r.req_text("entry_point")?;
            LivePrompt {
                id: task,
                category: name.clone(),
                dataset: name,
                body: Body::Text(prompt.into()),
            }
        }
        SetFormat::Plain => {
            let given: Vec<&str> = ["prompt", "text", "messages"]
                .into_iter()
                .filter(|k| r.has(k))
                .collect();
            let body = match given.as_slice() {
                [] if TOKEN_KEYS.iter().any(|k| r.has(k)) => {
                    return Err(Bad {
                        msg: "has token ids but no `prompt`, `text` or `messages`".into(),
                        hint: Some("send token ids with --prompt-format tokens".into()),
                    })
                }
                [] => return Err("has no `prompt`, `text` or `messages`".to_string().into()),
                ["messages"] => Body::Messages(r.messages()?),
                [k] => Body::Text(r.req_text(k)?.into()),
                _ => {
                    let keys: Vec<String> = given.iter().map(|k| format!("`{k}`")).collect();
                    return Err(format!("has {}; give one", keys.join(" and ")).into());
                }
            };
            LivePrompt {
                id: r.id(&["id"], line)?,
                category: r.opt_str("category")?.unwrap_or_default().into(),
                dataset: dataset(r, &name)?,
                body,
            }
        }
        SetFormat::Tokens => {
            let Some((k, ids)) = TOKEN_KEYS.iter().find_map(|k| r.get(k).map(|v| (k, v))) else {
                if ["prompt", "text", "messages"].iter().any(|k| r.has(k)) {
                    return Err(Bad {
                        msg: "has text but no token ids".into(),
                        hint: Some("tokenize the prompts first: `kquant trace prompts --tokenizer TARGET --prompts FILE -o TOKENIZED`; or send the text as it is with --prompt-format plain".into()),
                    });
                }
                return Err("has no `tokens` / `prompt_ids` / `input_ids` array"
                    .to_string()
                    .into());
            };
            let Value::Array(ids) = ids else {
                return Err(
                    format!("`{k}` is not a list of token ids (it is {})", kind(ids)).into(),
                );
            };
            let tokens = ids
                .iter()
                .enumerate()
                .map(|(j, t)| {
                    t.as_u64()
                        .filter(|&x| x <= u32::MAX as u64)
                        .map(|x| x as u32)
                        .ok_or_else(|| {
                            format!("`{k}`[{j}] = {t} is not a token id: token ids are non-negative integers up to {}", u32::MAX)
                        })
                })
                .collect::<std::result::Result<Vec<u32>, String>>()?;
            if tokens.is_empty() {
                return Err(format!("`{k}` is empty: the prompt has no tokens").into());
            }
            LivePrompt {
                id: r.id(&["id"], line)?,
                category: r.opt_str("category")?.unwrap_or_default().into(),
                dataset: dataset(r, &name)?,
                body: Body::Tokens(tokens),
            }
        }
    })
}

/// A plain or tokens record's `dataset`, else the format's name.
fn dataset(r: &Record, name: &str) -> Fit<String> {
    Ok(match r.opt_str("dataset")? {
        Some(d) if !d.trim().is_empty() => d.into(),
        _ => name.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A prompt file in a temp dir with these lines.
    fn file(lines: &[&str]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prompts.jsonl");
        let mut f = std::fs::File::create(&path).unwrap();
        for l in lines {
            writeln!(f, "{l}").unwrap();
        }
        (dir, path)
    }

    fn read_lines(lines: &[&str], format: SetFormat) -> Result<(SetFormat, Vec<LivePrompt>)> {
        let (_dir, path) = file(lines);
        read(&path, format)
    }

    fn user_msg(s: &str) -> Body {
        Body::Messages(vec![json!({"role": "user", "content": s})])
    }

    /// The error for `lines` read as `format`: it names `FILE:LINE` (or the file when `line` is
    /// 0), says `msg` and carries a hint containing `hint`.
    #[track_caller]
    fn fails(lines: &[&str], format: SetFormat, line: usize, msg: &str, hint: &str) {
        let (_dir, path) = file(lines);
        let e = read(&path, format).expect_err("the file should be refused");
        let Error::Source {
            path: p,
            msg: m,
            hint: h,
        } = &e
        else {
            panic!("not a Source error: {e:?}")
        };
        let want = match line {
            0 => path.clone(),
            l => at(&path, l),
        };
        assert_eq!(p, &want, "{e}");
        assert!(
            e.to_string().contains(&format!("`{}`", want.display())),
            "{e}"
        );
        assert!(m.contains(msg), "message {m:?} lacks {msg:?}");
        let h = h.as_deref().expect("a hint");
        assert!(h.contains(hint), "hint {h:?} lacks {hint:?}");
    }

    const MT1: &str = r#"{"question_id": 81, "category": "writing", "turns": ["Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences and must-see attractions.", "Rewrite your previous response. Start every sentence with the letter A."]}"#;
    const MT2: &str = r#"{"question_id": 101, "category": "reasoning", "turns": ["Imagine you are participating in a race with a group of people. If you have just overtaken the second person, what's your current position? Where is the person you just overtook?", "If the \"second person\" is changed to \"last person\" in the above question, what would the answer be?"], "reference": ["You are in second place.", "Uncertain."]}"#;
    const MT3: &str = r#"{"question_id": 121, "category": "coding", "turns": ["Develop a Python program that reads all the text files under a directory and returns top-5 words with the most number of occurrences.", "Can you parallelize it?"], "reference": ["Can be simple solutions like using Counter", ""]}"#;
    const SPEC_TR: &str = r#"{"question_id": 161, "category": "translation", "turns": ["Translate German to English: Die Katze sitzt auf der Matte."]}"#;
    const SPEC_RAG: &str = r#"{"question_id": 401, "category": "rag", "turns": ["Based on the following passages, answer: who wrote Hamlet?\nPassage 1: ..."]}"#;
    const GSM1: &str = r#"{"question": "Janet’s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg. How much in dollars does she make every day at the farmers' market?", "answer": "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day at the farmer’s market.\n#### 18"}"#;
    const GSM2: &str = r#"{"question": "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?", "answer": "It takes 2/2=<<2/2=1>>1 bolt of white fiber\nSo the total amount of fabric is 2+1=<<2+1=3>>3 bolts of fabric\n#### 3"}"#;
    const MATH1: &str = r#"{"problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.  Enter your answer in the form $(r,\\theta),$ where $r > 0$ and $0 \\le \\theta < 2 \\pi.$", "solution": "We have that $r = \\sqrt{0^2 + 3^2} = 3.$ ...", "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "subject": "Precalculus", "level": 2, "unique_id": "test/precalculus/807.json"}"#;
    const MATH2: &str = r#"{"problem": "What is the smallest positive perfect cube that can be written as the sum of three consecutive integers?", "solution": "The sum of three consecutive integers ... $\\boxed{27}$.", "answer": "27", "subject": "Number Theory", "level": 3, "unique_id": "test/number_theory/515.json"}"#;
    const HE0: &str = r#"{"task_id": "HumanEval/0", "prompt": "from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n    \"\"\" Check if in given list of numbers, are any two numbers closer to each other than\n    given threshold.\n    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)\n    False\n    \"\"\"\n", "canonical_solution": "    for idx, elem in enumerate(numbers):\n        ...\n    return False\n", "test": "\n\nMETADATA = {\n    'author': 'jt',\n    'dataset': 'test'\n}\n\n\ndef check(candidate):\n    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True\n", "entry_point": "has_close_elements"}"#;
    const HE1: &str = r#"{"task_id": "HumanEval/1", "prompt": "from typing import List\n\n\ndef separate_paren_groups(paren_string: str) -> List[str]:\n    \"\"\" Input to this function is a string containing multiple groups of nested parentheses.\n    \"\"\"\n", "canonical_solution": "    result = []\n    ...\n", "test": "\n\ndef check(candidate):\n    pass\n", "entry_point": "separate_paren_groups"}"#;

    /// A record that fits `format`.
    fn good(format: SetFormat) -> &'static str {
        match format {
            SetFormat::MtBench | SetFormat::SpecBench => MT1,
            SetFormat::SpeedBench => r#"{"category": "qa", "turns": ["Why?"]}"#,
            SetFormat::Gsm8k => GSM1,
            SetFormat::Math500 => MATH1,
            SetFormat::Humaneval => HE0,
            SetFormat::Plain => r#"{"prompt": "ok"}"#,
            SetFormat::Tokens => r#"{"tokens": [1]}"#,
            SetFormat::Auto => unreachable!(),
        }
    }

    #[test]
    fn names_match_clap_and_serde() {
        use clap::ValueEnum;
        for f in SetFormat::value_variants() {
            let clap_name = f.to_possible_value().unwrap().get_name().to_string();
            assert_eq!(clap_name, f.name());
            assert_eq!(serde_json::to_value(f).unwrap(), json!(f.name()));
        }
    }

    #[test]
    fn mt_bench_first_turn_as_a_user_message() {
        let (f, p) = read_lines(&[MT1, MT2, MT3], SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::MtBench);
        assert_eq!(p.len(), 3);
        assert_eq!(p[0].id, "81");
        assert_eq!(p[0].category, "writing");
        assert_eq!(p[0].dataset, "mt-bench");
        assert_eq!(p[0].body, user_msg("Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences and must-see attractions."));
        assert_eq!(
            p.iter().map(|p| p.category.as_str()).collect::<Vec<_>>(),
            ["writing", "reasoning", "coding"]
        );
    }

    #[test]
    fn spec_bench_detected_by_its_own_categories() {
        let (f, p) = read_lines(&[MT1, SPEC_TR, SPEC_RAG], SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::SpecBench);
        assert!(p.iter().all(|p| p.dataset == "spec-bench"));
        assert_eq!(p[1].category, "translation");
        assert_eq!(
            p[1].body,
            user_msg("Translate German to English: Die Katze sitzt auf der Matte.")
        );
        // A category outside Spec-Bench's set: MT-Bench-shaped, read as mt-bench.
        let other = r#"{"question_id": 7, "category": "poetry", "turns": ["Write a haiku."]}"#;
        let (f, _) = read_lines(&[SPEC_TR, other], SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::MtBench);
        // Only MT-Bench's categories: named spec-bench, labelled so.
        let (f, p) = read_lines(&[MT1, MT2], SetFormat::SpecBench).unwrap();
        assert_eq!(f, SetFormat::SpecBench);
        assert_eq!(p[0].dataset, "spec-bench");
    }

    #[test]
    fn speed_bench_turns_and_messages() {
        // SPEED-Bench's own layout (question_id a string, with sub_category, multiturn, …).
        let q1 = r#"{"question_id": "coding_0001", "category": "coding", "sub_category": "python", "turns": ["Write a function that merges two sorted lists."], "source": "x", "src_id": "12", "difficulty": "medium", "multiturn": false}"#;
        let q2 = r#"{"question_id": "math_0003", "category": "math", "sub_category": "algebra", "turns": ["Solve x^2 = 4.", "Now x^3 = 8."], "source": "y", "src_id": "4", "difficulty": "easy", "multiturn": true}"#;
        let (f, p) = read_lines(&[q1, q2], SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::SpeedBench);
        assert_eq!(p[0].id, "coding_0001");
        assert_eq!(p[1].category, "math");
        assert_eq!(p[1].body, user_msg("Solve x^2 = 4."));
        assert_eq!(p[1].dataset, "speed-bench");
        // Messages with a category, no question_id.
        let m1 = r#"{"category": "rag", "messages": [{"role": "system", "content": "Answer from the passages."}, {"role": "user", "content": "Passage: …\nQuestion: who?", "name": "u"}]}"#;
        let m2 = r#"{"category": "multilingual", "messages": [{"role": "user", "content": "Traduis: bonjour"}]}"#;
        let (f, p) = read_lines(&[m1, m2], SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::SpeedBench);
        assert_eq!((p[0].id.as_str(), p[1].id.as_str()), ("1", "2"));
        assert_eq!(
            p[0].body,
            Body::Messages(vec![
                json!({"role": "system", "content": "Answer from the passages."}),
                json!({"role": "user", "content": "Passage: …\nQuestion: who?"}),
            ])
        );
        // turns + category without question_id.
        let t = r#"{"category": "qa", "turns": ["Why is the sky blue?"]}"#;
        let (f, p) = read_lines(&[t], SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::SpeedBench);
        assert_eq!(p[0].body, user_msg("Why is the sky blue?"));
    }

    #[test]
    fn gsm8k_question_zero_shot() {
        let (f, p) = read_lines(&[GSM1, "", GSM2], SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::Gsm8k);
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].id.as_str(), p[1].id.as_str()), ("1", "3"));
        assert!(p
            .iter()
            .all(|p| p.category == "gsm8k" && p.dataset == "gsm8k"));
        assert_eq!(p[1].body, user_msg("A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?"));
    }

    #[test]
    fn math500_problem_and_subject() {
        let no_subject = r#"{"problem": "Compute $1+1$.", "answer": "2"}"#;
        let (f, p) = read_lines(&[MATH1, MATH2, no_subject], SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::Math500);
        assert_eq!(p[0].id, "test/precalculus/807.json");
        assert_eq!(p[0].category, "Precalculus");
        assert_eq!(p[1].category, "Number Theory");
        assert_eq!((p[2].id.as_str(), p[2].category.as_str()), ("3", "math500"));
        assert_eq!(p[1].body, user_msg("What is the smallest positive perfect cube that can be written as the sum of three consecutive integers?"));
    }

    #[test]
    fn humaneval_prompt_as_raw_text() {
        let (f, p) = read_lines(&[HE0, HE1], SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::Humaneval);
        assert_eq!(p[0].id, "HumanEval/0");
        assert_eq!(p[1].id, "HumanEval/1");
        assert_eq!(p[0].category, "humaneval");
        let Body::Text(t) = &p[0].body else {
            panic!("{:?}", p[0].body)
        };
        assert!(t.starts_with("from typing import List\n\n\ndef has_close_elements("));
        assert!(t.ends_with("    \"\"\"\n"));
    }

    #[test]
    fn plain_text_and_messages() {
        let (f, p) = read_lines(
            &[
                r#"{"id": "a", "prompt": "Once upon a time", "category": "story", "dataset": "mine"}"#,
                r#"{"text": "def main():"}"#,
                r#"{"messages": [{"role": "user", "content": "Hi"}], "id": 7}"#,
            ],
            SetFormat::Auto,
        )
        .unwrap();
        assert_eq!(f, SetFormat::Plain);
        assert_eq!(p[0].id, "a");
        assert_eq!(p[0].body, Body::Text("Once upon a time".into()));
        assert_eq!(
            (p[0].category.as_str(), p[0].dataset.as_str()),
            ("story", "mine")
        );
        assert_eq!(
            (
                p[1].id.as_str(),
                p[1].category.as_str(),
                p[1].dataset.as_str()
            ),
            ("2", "", "plain")
        );
        assert_eq!(p[1].body, Body::Text("def main():".into()));
        assert_eq!(p[2].id, "7");
        assert_eq!(p[2].body, user_msg("Hi"));
    }

    #[test]
    fn tokens_records() {
        let (f, p) = read_lines(
            &[
                r#"{"id": 0, "category": "code", "dataset": "heldout", "turn": 0, "text": "x = 1", "tokens": [87, 284, 220, 16]}"#,
                r#"{"id": 1, "prompt_ids": [1, 4294967295]}"#,
                r#"{"input_ids": [5]}"#,
            ],
            SetFormat::Auto,
        )
        .unwrap();
        assert_eq!(f, SetFormat::Tokens);
        assert_eq!(p[0].body, Body::Tokens(vec![87, 284, 220, 16]));
        assert_eq!(
            (
                p[0].id.as_str(),
                p[0].category.as_str(),
                p[0].dataset.as_str()
            ),
            ("0", "code", "heldout")
        );
        assert_eq!(p[1].body, Body::Tokens(vec![1, u32::MAX]));
        assert_eq!(
            (p[1].category.as_str(), p[1].dataset.as_str()),
            ("", "tokens")
        );
        assert_eq!(
            (p[2].id.as_str(), p[2].body.clone()),
            ("3", Body::Tokens(vec![5]))
        );
    }

    #[test]
    fn the_repo_heldout_prompts_read_as_tokens() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/kimi-k2.5-tiny/prompts/heldout.jsonl");
        let (f, p) = read(&path, SetFormat::Auto).unwrap();
        assert_eq!(f, SetFormat::Tokens);
        assert_eq!(p.len(), 60);
        assert!(p.iter().all(|p| !p.category.is_empty()));
        assert!(p
            .iter()
            .all(|p| matches!(&p.body, Body::Tokens(t) if !t.is_empty())));
        // The same rules as the capture reader: the same token ids, in the same order.
        let captured = crate::trace::capture::read_prompts(&path).unwrap();
        assert_eq!(captured.len(), p.len());
        for (c, l) in captured.iter().zip(&p) {
            assert_eq!(Body::Tokens(c.tokens.clone()), l.body);
            assert_eq!(c.category, l.category);
            assert_eq!(c.id.to_string(), l.id);
        }
        // Named explicitly, the same; as plain, its `text`.
        let (f, q) = read(&path, SetFormat::Tokens).unwrap();
        assert_eq!((f, q), (SetFormat::Tokens, p));
        let (f, q) = read(&path, SetFormat::Plain).unwrap();
        assert_eq!(f, SetFormat::Plain);
        assert!(matches!(&q[0].body, Body::Text(t) if !t.is_empty()));
    }

    #[test]
    fn an_explicit_format_overrides_detection() {
        // MT-Bench records read as speed-bench.
        let (f, p) = read_lines(&[MT1, MT2], SetFormat::SpeedBench).unwrap();
        assert_eq!(f, SetFormat::SpeedBench);
        assert_eq!(
            (p[0].id.as_str(), p[0].dataset.as_str()),
            ("81", "speed-bench")
        );
        // A Spec-Bench file named mt-bench stays mt-bench.
        let (f, p) = read_lines(&[SPEC_TR, SPEC_RAG], SetFormat::MtBench).unwrap();
        assert_eq!(f, SetFormat::MtBench);
        assert_eq!(p[0].dataset, "mt-bench");
        // A HumanEval file read as plain: its prompt as text, numbered by line.
        let (f, p) = read_lines(&[HE0], SetFormat::Plain).unwrap();
        assert_eq!(f, SetFormat::Plain);
        assert_eq!(p[0].id, "1");
        assert!(matches!(&p[0].body, Body::Text(t) if t.starts_with("from typing")));
        // A bare `problem` (no solution/answer) is math500 only when named.
        let bare = r#"{"problem": "Compute 2+2."}"#;
        fails(
            &[bare],
            SetFormat::Auto,
            1,
            "fits none of the prompt formats",
            "--prompt-format",
        );
        let (f, p) = read_lines(&[bare], SetFormat::Math500).unwrap();
        assert_eq!((f, p[0].category.as_str()), (SetFormat::Math500, "math500"));
        // A record that does not fit the named format is refused.
        fails(
            &[GSM1],
            SetFormat::MtBench,
            1,
            "has no `question_id`",
            "--prompt-format mt-bench was given",
        );
    }

    #[test]
    fn every_record_must_fit_the_detected_format() {
        fails(
            &[MT1, GSM1],
            SetFormat::Auto,
            2,
            "has no `question_id`",
            "line 1 looks like mt-bench",
        );
        fails(
            &[GSM1, "", MATH1],
            SetFormat::Auto,
            3,
            "has no `question`",
            "a gsm8k record is",
        );
        fails(
            &[HE0, r#"{"task_id": "HumanEval/1", "prompt": "def f():"}"#],
            SetFormat::Auto,
            2,
            "has no `entry_point`",
            "humaneval",
        );
    }

    #[test]
    fn lines_that_are_not_json_objects() {
        let (dir, _) = file(&[]);
        let path = dir.path().join("bin.jsonl");
        std::fs::write(&path, [MT1.as_bytes(), b"\n\xff\xfe{}\n"].concat()).unwrap();
        let e = read(&path, SetFormat::Auto).unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("`{}:2`: is not UTF-8", path.display())),
            "{e}"
        );
        assert!(e.hint().unwrap().contains("JSON Lines"));
        fails(
            &[MT1, "{\"question_id\": 82,"],
            SetFormat::Auto,
            2,
            "is not JSON",
            "JSON Lines",
        );
        fails(
            &["[1, 2]"],
            SetFormat::Auto,
            1,
            "is not a JSON object (it is a list)",
            "JSON Lines",
        );
        fails(
            &[GSM1, "\"text\""],
            SetFormat::Auto,
            2,
            "is not a JSON object (it is a string)",
            "JSON Lines",
        );
        // A UTF-8 byte-order mark and CRLF line ends are read.
        std::fs::write(&path, format!("\u{feff}{GSM1}\r\n{GSM2}\r\n")).unwrap();
        assert_eq!(read(&path, SetFormat::Auto).unwrap().1.len(), 2);
    }

    #[test]
    fn empty_files_have_nothing_to_measure() {
        fails(
            &[],
            SetFormat::Auto,
            0,
            "nothing to measure",
            "--prompt-format",
        );
        fails(
            &["", "  ", "\t"],
            SetFormat::Tokens,
            0,
            "nothing to measure",
            "a tokens record is",
        );
    }

    #[test]
    fn a_file_that_fits_no_format() {
        fails(
            &[r#"{"instruction": "Summarize.", "input": "…", "output": "…"}"#],
            SetFormat::Auto,
            1,
            "fits none of the prompt formats (its keys: `instruction`, `input`, `output`)",
            "name one with --prompt-format",
        );
        fails(
            &["{}"],
            SetFormat::Auto,
            1,
            "it has no keys",
            "mt-bench and spec-bench",
        );
        // null counts as absent.
        fails(
            &[r#"{"prompt": null}"#],
            SetFormat::Auto,
            1,
            "fits none",
            "plain",
        );
    }

    #[test]
    fn missing_empty_and_wrong_typed_fields() {
        let mt = |s: &str| format!(r#"{{"question_id": 81, {s}}}"#);
        let cases: Vec<(String, SetFormat, &str)> = vec![
            (
                mt(r#""turns": ["a"]"#),
                SetFormat::MtBench,
                "has no `category`",
            ),
            (
                mt(r#""category": "", "turns": ["a"]"#),
                SetFormat::MtBench,
                "`category` is empty",
            ),
            (
                mt(r#""category": 3, "turns": ["a"]"#),
                SetFormat::MtBench,
                "`category` is not a string (it is a number)",
            ),
            (
                mt(r#""category": "math", "turns": "a""#),
                SetFormat::MtBench,
                "`turns` is not a list of strings (it is a string)",
            ),
            (
                mt(r#""category": "math", "turns": []"#),
                SetFormat::MtBench,
                "`turns` is empty",
            ),
            (
                mt(r#""category": "math", "turns": ["", "b"]"#),
                SetFormat::MtBench,
                "the first turn is empty",
            ),
            (
                mt(r#""category": "math", "turns": ["a", 2]"#),
                SetFormat::MtBench,
                "turn 1 is not a string (it is a number)",
            ),
            (
                mt(r#""category": "math""#),
                SetFormat::MtBench,
                "has no `turns`",
            ),
            (
                r#"{"question_id": 1.5, "category": "math", "turns": ["a"]}"#.into(),
                SetFormat::MtBench,
                "`question_id` is not an integer or a string (it is a number)",
            ),
            (
                r#"{"question_id": "", "category": "math", "turns": ["a"]}"#.into(),
                SetFormat::MtBench,
                "`question_id` is empty",
            ),
            (
                r#"{"question_id": [1], "category": "math", "turns": ["a"]}"#.into(),
                SetFormat::MtBench,
                "(it is a list)",
            ),
            (
                r#"{"question": "", "answer": "It is 1. #### 1"}"#.into(),
                SetFormat::Gsm8k,
                "`question` is empty",
            ),
            (
                r#"{"question": "q?", "answer": 1}"#.into(),
                SetFormat::Gsm8k,
                "`answer` is not a string",
            ),
            (
                r#"{"question": "q?"}"#.into(),
                SetFormat::Gsm8k,
                "has no `answer`",
            ),
            (
                r#"{"problem": "p", "subject": 4}"#.into(),
                SetFormat::Math500,
                "`subject` is not a string",
            ),
            (
                r#"{"problem": "p", "solution": ["s"]}"#.into(),
                SetFormat::Math500,
                "`solution` is not a string",
            ),
            (
                r#"{"problem": "p", "unique_id": {}}"#.into(),
                SetFormat::Math500,
                "`unique_id` is not an integer or a string (it is an object)",
            ),
            (
                r#"{"task_id": "HumanEval/0", "prompt": " \n", "entry_point": "f"}"#.into(),
                SetFormat::Humaneval,
                "`prompt` is empty",
            ),
            (
                r#"{"prompt": "def f():", "entry_point": "f"}"#.into(),
                SetFormat::Humaneval,
                "has no `task_id`",
            ),
            (
                r#"{"prompt": ""}"#.into(),
                SetFormat::Plain,
                "`prompt` is empty",
            ),
            (
                r#"{"text": 5}"#.into(),
                SetFormat::Plain,
                "`text` is not a string (it is a number)",
            ),
            (
                r#"{"prompt": "a", "text": "b"}"#.into(),
                SetFormat::Plain,
                "has `prompt` and `text`; give one",
            ),
            (
                r#"{"prompt": "a", "category": 1}"#.into(),
                SetFormat::Plain,
                "`category` is not a string",
            ),
            (
                r#"{"prompt": "a", "dataset": false}"#.into(),
                SetFormat::Plain,
                "`dataset` is not a string (it is a boolean)",
            ),
            (
                r#"{"category": "qa"}"#.into(),
                SetFormat::SpeedBench,
                "has no `messages` (or `turns`)",
            ),
            (
                r#"{"category": "qa", "turns": ["a"], "messages": []}"#.into(),
                SetFormat::SpeedBench,
                "has both `messages` and `turns`",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "a"}]}"#.into(),
                SetFormat::SpeedBench,
                "has no `category`",
            ),
        ];
        for (rec, format, msg) in &cases {
            fails(&[good(*format), rec], *format, 2, msg, format.name());
        }
    }

    #[test]
    fn bad_messages() {
        let cases = [
            (r#"{"messages": []}"#, "`messages` is empty"),
            (
                r#"{"messages": {"role": "user"}}"#,
                "`messages` is not a list of messages (it is an object)",
            ),
            (
                r#"{"messages": ["hi"]}"#,
                "message 0 is not a JSON object (it is a string)",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "a"}, {"content": "b"}]}"#,
                "message 1 has no `role`",
            ),
            (
                r#"{"messages": [{"role": "", "content": "b"}]}"#,
                "message 0: `role` is empty",
            ),
            (
                r#"{"messages": [{"role": 1, "content": "b"}]}"#,
                "message 0: `role` is not a string (it is a number)",
            ),
            (
                r#"{"messages": [{"role": "user"}]}"#,
                "message 0 has no `content`",
            ),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}"#,
                "message 0: `content` is not a string (it is a list)",
            ),
        ];
        for (rec, msg) in cases {
            fails(
                &[r#"{"prompt": "ok"}"#, rec],
                SetFormat::Auto,
                2,
                msg,
                "chat messages are",
            );
            let with_category = rec.replacen('{', r#"{"category": "qa", "#, 1);
            fails(
                &[&with_category],
                SetFormat::SpeedBench,
                1,
                msg,
                "chat messages are",
            );
        }
    }

    #[test]
    fn bad_token_ids() {
        let cases = [
            (
                r#"{"tokens": [1, -2]}"#,
                "`tokens`[1] = -2 is not a token id",
            ),
            (
                r#"{"tokens": [4294967296]}"#,
                "`tokens`[0] = 4294967296 is not a token id",
            ),
            (
                r#"{"prompt_ids": [1.0]}"#,
                "`prompt_ids`[0] = 1.0 is not a token id",
            ),
            (
                r#"{"input_ids": ["7"]}"#,
                "`input_ids`[0] = \"7\" is not a token id",
            ),
            (r#"{"tokens": []}"#, "`tokens` is empty"),
            (
                r#"{"tokens": "1 2 3"}"#,
                "`tokens` is not a list of token ids (it is a string)",
            ),
            (
                r#"{"tokens": [1], "id": true}"#,
                "`id` is not an integer or a string",
            ),
            (
                r#"{"tokens": [1], "category": 2}"#,
                "`category` is not a string",
            ),
        ];
        for (rec, msg) in cases {
            fails(
                &[r#"{"tokens": [1]}"#, rec],
                SetFormat::Auto,
                2,
                msg,
                "a tokens record is",
            );
        }
        // Text where ids are expected: tokenize first (or send it as plain).
        fails(
            &[r#"{"tokens": [1]}"#, r#"{"text": "hello"}"#],
            SetFormat::Auto,
            2,
            "has text but no token ids",
            "kquant trace prompts",
        );
        fails(
            &[r#"{"id": 3}"#],
            SetFormat::Tokens,
            1,
            "has no `tokens` / `prompt_ids` / `input_ids` array",
            "a tokens record is",
        );
        // Ids where text is expected: name tokens.
        fails(
            &[r#"{"tokens": [1]}"#],
            SetFormat::Plain,
            1,
            "has token ids but no",
            "--prompt-format tokens",
        );
    }

    #[test]
    fn duplicate_ids() {
        fails(
            &[MT1, MT2, MT1],
            SetFormat::Auto,
            3,
            "id `81` appears twice (first on line 1)",
            "its own id",
        );
        fails(
            &[HE0, HE0],
            SetFormat::Auto,
            2,
            "id `HumanEval/0` appears twice",
            "its own id",
        );
        // An explicit id equal to another record's line number.
        fails(
            &[r#"{"prompt": "a"}"#, r#"{"prompt": "b", "id": "1"}"#],
            SetFormat::Auto,
            2,
            "id `1` appears twice (first on line 1)",
            "numbered by its line",
        );
        // 81 and "81" are the same id.
        fails(
            &[
                MT1,
                r#"{"question_id": "81", "category": "math", "turns": ["a"]}"#,
            ],
            SetFormat::Auto,
            2,
            "appears twice",
            "its own id",
        );
    }

    #[test]
    fn the_first_n_of_each_category() {
        let p = |category: &str| LivePrompt {
            id: String::new(),
            category: category.into(),
            dataset: "plain".into(),
            body: Body::Text("x".into()),
        };
        let prompts = ["a", "b", "a", "c", "a", "b", ""].map(p);
        assert_eq!(per_category(&prompts, None), [0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(per_category(&prompts, Some(1)), [0, 1, 3, 6]);
        assert_eq!(per_category(&prompts, Some(2)), [0, 1, 2, 3, 5, 6]);
        assert_eq!(per_category(&prompts, Some(0)), Vec::<usize>::new());
        assert_eq!(per_category(&[], Some(3)), Vec::<usize>::new());
    }
}
