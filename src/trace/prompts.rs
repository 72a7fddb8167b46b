//! `kquant trace prompts`: prompts given as text (or chat messages) turned into the token ids
//! `trace capture` and `trace import --prompts` read, with the target's own tokenizer
//! (`crate::tokenizer`: a `tokenizer.json`, or Kimi's tiktoken ranks file).
//!
//! Plain text is encoded as the tokenizer encodes it (with its special tokens, e.g. a BOS, for a
//! `tokenizer.json`). `--chat-template` renders the target's chat template over each record's
//! messages (or its text as one user message) with `add_generation_prompt=True`, then encodes
//! the result without adding special tokens again, as transformers does.

use std::borrow::Cow;
use std::collections::HashSet;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::io::output::{Claim, Kind};
use crate::tokenizer::{ChatTemplate, TargetTokenizer, TokenizerKind};

/// Schema of each record `trace prompts` writes (and how `--force` knows the file is kquant's).
pub const SCHEMA: &str = "kquant.prompts/1";
/// Schema of `trace prompts --json`.
pub const REPORT_SCHEMA: &str = "kquant.trace-prompts/1";

/// How an existing `trace prompts -o` file is recognised as kquant's (its first record carries
/// [`SCHEMA`]).
pub const FILE_KIND: Kind = Kind::File {
    what: "tokenized prompts file",
    flag: "-o",
    is_ours,
};

fn is_ours(bytes: &[u8]) -> bool {
    let first = bytes
        .split(|&b| b == b'\n')
        .find(|l| !l.iter().all(u8::is_ascii_whitespace));
    first
        .and_then(|l| serde_json::from_slice::<Value>(l).ok())
        .is_some_and(|v| v["schema"].as_str() == Some(SCHEMA))
}

/// What to tokenize.
#[derive(Debug, Clone)]
pub struct Options {
    pub tokenizer: PathBuf,
    pub input: PathBuf,
    pub output: PathBuf,
    pub chat_template: bool,
    pub force: bool,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct Summary {
    pub records: usize,
    pub tokens: usize,
    pub kind: TokenizerKind,
    pub tokenizer_file: PathBuf,
    pub tokenizer_sha256: String,
    /// (source, sha256) of the chat template used.
    pub chat_template: Option<(PathBuf, String)>,
    /// Whether plain text got the tokenizer's special tokens (post-processor).
    pub add_special_tokens: bool,
    pub warnings: Vec<String>,
}

const RECORD_HINT: &str = "one JSON object per line: {\"id\", \"dataset\", \"category\", \"text\"} (or chat `messages` with --chat-template)";

/// The target's chat template and its compiled form, when `--chat-template` asks for it.
type Chat<'a> = Option<(&'a ChatTemplate, &'a minijinja::Template<'a, 'a>)>;

/// Tokenize `o.input` into `o.output` (claimed first; written as a staging file, renamed into
/// place at the end, so a bad record leaves nothing under the output name).
pub fn run(o: &Options) -> Result<Summary> {
    let tk = TargetTokenizer::open(&o.tokenizer)?;
    let mut sources = vec![o.input.clone(), tk.file.clone()];
    if let Some((p, _)) = &tk.config {
        sources.push(p.clone());
    }
    let template = if o.chat_template {
        Some(tk.chat_template()?)
    } else {
        None
    };
    if let Some(t) = &template {
        sources.push(t.source.clone());
    }
    let claim = Claim::new(&o.output, FILE_KIND, o.force, &sources)?;
    let env = ChatTemplate::environment();
    let compiled = match &template {
        Some(t) => Some(env.template_from_str(&t.text).map_err(|e| {
            Error::source(&t.source, format!("the chat template does not compile: {e}")).with_hint("kquant renders chat templates with minijinja (Jinja2 syntax, as transformers configures it)")
        })?),
        None => None,
    };
    let add_special_tokens = template.is_none();
    let chat: Chat = template.as_ref().zip(compiled.as_ref());
    let input =
        crate::io::text::open_regular(&o.input, crate::io::text::MAX_PROMPTS, "prompt file")?;
    let staging = claim.staging().to_path_buf();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&staging)
        .map_err(|e| Error::io("create", &staging, e))?;
    let mut w = std::io::BufWriter::new(f);
    let mut ids_seen: HashSet<String> = HashSet::new();
    let (mut records, mut tokens) = (0usize, 0usize);
    for (i, line) in std::io::BufReader::new(input).lines().enumerate() {
        let at = PathBuf::from(format!("{}:{}", o.input.display(), i + 1));
        let line = line.map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => {
                Error::source(&at, "is not UTF-8").with_hint(RECORD_HINT)
            }
            _ => Error::io("read", &o.input, e),
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let (out, n) = tokenize(&line, &at, &tk, chat, records, &mut ids_seen)?;
        serde_json::to_writer(&mut w, &Value::Object(out))
            .map_err(std::io::Error::from)
            .and_then(|_| w.write_all(b"\n"))
            .map_err(|e| Error::io("write", &staging, e))?;
        records += 1;
        tokens += n;
    }
    if records == 0 {
        return Err(Error::source(&o.input, "holds no records").with_hint(RECORD_HINT));
    }
    let f = w
        .into_inner()
        .map_err(|e| Error::io("write", &staging, e.into_error()))?;
    f.sync_all().map_err(|e| Error::io("fsync", &staging, e))?;
    drop(f);
    let warnings = post_processor_warning(&tk, add_special_tokens);
    drop(compiled);
    claim.commit()?;
    Ok(Summary {
        records,
        tokens,
        kind: tk.kind,
        tokenizer_file: tk.file.clone(),
        tokenizer_sha256: tk.sha256.clone(),
        chat_template: template.map(|t| (t.source, t.sha256)),
        add_special_tokens,
        warnings,
    })
}

/// One record of the prompt file (`at`: `FILE:LINE`; `index`: how many came before it),
/// tokenized: the record `trace prompts` writes, and its token count. Plain text gets the
/// tokenizer's special tokens when no chat template is used.
fn tokenize(
    line: &str,
    at: &Path,
    tk: &TargetTokenizer,
    chat: Chat,
    index: usize,
    ids_seen: &mut HashSet<String>,
) -> Result<(Map<String, Value>, usize)> {
    let bad = |msg: String| Error::source(at, msg).with_hint(RECORD_HINT);
    let v: Value = serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
    let Value::Object(rec) = v else {
        return Err(bad("is not a JSON object".into()));
    };
    let (to_encode, templated) = text_of(&rec, at, chat)?;
    let ids = tk
        .encode(&to_encode, chat.is_none() && !templated)
        .map_err(|e| {
            let backtrack = e.contains("pre-tokenizer pattern");
            let err = bad(format!("cannot be tokenized: {e}"));
            if backtrack {
                err.with_hint("the regex backtracks without bound on this text (fancy-regex stops after 1 000 000 steps): tokenize it with the target's own tokenizer in Python and give `tokens`, or fix the pattern in tokenizer.json")
            } else {
                err
            }
        })?;
    if ids.is_empty() {
        return Err(bad("tokenizes to no tokens".into()));
    }
    let id = match rec.get("id") {
        None | Some(Value::Null) => Value::from(index),
        Some(v @ (Value::String(_) | Value::Number(_))) => v.clone(),
        Some(_) => return Err(bad("`id` is not a string or a number".into())),
    };
    let key = match &id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if !ids_seen.insert(key.clone()) {
        return Err(bad(format!("id `{key}` appears twice")));
    }
    let mut out = Map::new();
    out.insert("schema".into(), SCHEMA.into());
    out.insert("id".into(), id);
    for k in ["dataset", "category"] {
        match rec.get(k) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => {
                out.insert(k.into(), s.clone().into());
            }
            Some(_) => return Err(bad(format!("`{k}` is not a string"))),
        }
    }
    if let Some(t) = rec.get("turn").filter(|t| t.is_u64()) {
        out.insert("turn".into(), t.clone());
    }
    let n = ids.len();
    out.insert("prompt_len".into(), n.into());
    out.insert("tokens".into(), ids.into());
    Ok((out, n))
}

/// What of a record is encoded: its `text` as it is, or (with the chat template) its `messages`,
/// or its `text` as one user message, rendered; and whether the template rendered it.
fn text_of<'r>(rec: &'r Map<String, Value>, at: &Path, chat: Chat) -> Result<(Cow<'r, str>, bool)> {
    let bad = |msg: String| Error::source(at, msg).with_hint(RECORD_HINT);
    let text = match rec.get("text") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => return Err(bad("`text` is not a string".into())),
    };
    let messages = match rec.get("messages") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(a),
        Some(_) => return Err(bad("`messages` is not a list of messages".into())),
    };
    match (text, messages, chat) {
        (Some(_), Some(_), _) => Err(bad("has both `text` and `messages`; give one".into())),
        (None, None, _) => Err(bad(if rec.contains_key("tokens") {
            "has `tokens` but no `text`: it is tokenized already (trace capture and trace import read it as it is)".into()
        } else {
            "has no `text` (or `messages`)".into()
        })),
        (Some(""), None, _) => Err(bad("`text` is empty".into())),
        (None, Some(_), None) => Err(Error::Source {
            path: at.to_path_buf(),
            msg: "has chat `messages`, which need the target's chat template".into(),
            hint: Some("pass --chat-template".into()),
        }),
        (None, Some(m), Some(_)) if m.is_empty() => Err(bad("`messages` is empty".into())),
        (Some(t), None, None) => Ok((Cow::Borrowed(t), false)),
        (t, m, Some((tpl, compiled))) => {
            let owned;
            let msgs: &[Value] = match (t, m) {
                (Some(t), _) => {
                    owned = vec![serde_json::json!({"role": "user", "content": t})];
                    &owned
                }
                (None, Some(m)) => m,
                (None, None) => unreachable!(),
            };
            if let Some(k) = msgs.iter().position(|m| !m.is_object()) {
                return Err(bad(format!("message {k} is not a JSON object")));
            }
            let rendered = tpl.render(compiled, msgs).map_err(|e| Error::Source {
                path: at.to_path_buf(),
                msg: format!("the chat template fails on this record: {e}"),
                hint: Some(if e.contains("ran out of fuel") {
                    format!(
                        "the template `{}` did not finish within {} instructions (real chat templates take about 10^4 a message): it loops far more than a template should",
                        tpl.source.display(),
                        ChatTemplate::TEMPLATE_FUEL
                    )
                } else {
                    format!(
                        "the template is `{}`; check the record's messages (role, content) against what it expects",
                        tpl.source.display()
                    )
                }),
            })?;
            Ok((Cow::Owned(rendered), true))
        }
    }
}

/// The warning that a `tokenizer.json`'s post-processor adds special tokens to plain text.
fn post_processor_warning(tk: &TargetTokenizer, add_special_tokens: bool) -> Vec<String> {
    let mut warnings = Vec::new();
    if tk.kind == TokenizerKind::TokenizerJson && add_special_tokens {
        if let Some(pp) = tk.tok.get_post_processor() {
            let added = tokenizers::tokenizer::PostProcessor::added_tokens(pp, false);
            if added > 0 {
                warnings.push(format!(
                    "the tokenizer's post-processor adds {added} special token(s) to each prompt (e.g. BOS), as transformers' `tokenizer(text)` and vLLM's completions endpoint do"
                ));
            }
        }
    }
    warnings
}
