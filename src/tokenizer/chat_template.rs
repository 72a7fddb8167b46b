//! A chat template rendered as transformers renders it: `apply_chat_template(messages,
//! add_generation_prompt=True, tokenize=False)` configures Jinja2 with trim/lstrip blocks, loop
//! controls, its `tojson`, `raise_exception`, `strftime_now` and the named special tokens as
//! variables; minijinja is configured the same, and bounded (instructions, memory, `tojson`
//! indent) since a template is code from the target's repository.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::config::{special_tokens_map, CONFIG_HINT};
use crate::error::{Error, Result};

/// A chat template, ready to render.
pub struct ChatTemplate {
    /// `chat_template.jinja` or `tokenizer_config.json`.
    pub source: PathBuf,
    pub text: String,
    pub sha256: String,
    /// `bos_token`, `eos_token`, … as transformers passes them.
    special: Vec<(String, String)>,
}

impl ChatTemplate {
    fn new(source: PathBuf, text: String, special: Vec<(String, String)>) -> ChatTemplate {
        ChatTemplate {
            source,
            sha256: crate::io::hash::hex(&Sha256::digest(text.as_bytes())),
            text,
            special,
        }
    }

    /// The chat template transformers would use for the tokenizer in `dir` (`config`: its
    /// `tokenizer_config.json`, when there is one): `chat_template.jinja` in `dir`, else the
    /// config's `chat_template` (a string, or a list of named templates of which `default` is
    /// taken).
    pub fn find(
        dir: &Path,
        config: Option<&(PathBuf, Map<String, Value>)>,
    ) -> Result<ChatTemplate> {
        let jinja = dir.join("chat_template.jinja");
        let special = special_tokens_map(config.map(|(_, c)| c));
        if jinja.is_file() {
            let text = crate::io::text::read_regular_text(
                &jinja,
                crate::io::text::MAX_CONFIG,
                "chat template",
            )?;
            return Ok(ChatTemplate::new(jinja, text, special));
        }
        let no = |msg: String| {
            Error::source(dir, msg).with_hint("--chat-template needs the target's chat template (chat_template.jinja, or `chat_template` in tokenizer_config.json); without it, give plain `text` records and leave --chat-template off")
        };
        let Some((cpath, c)) = config else {
            return Err(no(
                "has no tokenizer_config.json and no chat_template.jinja".into(),
            ));
        };
        let text = match c.get("chat_template") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str())
                .map(String::from)
                .ok_or_else(|| {
                    Error::source(
                        cpath,
                        "`chat_template` is a list of named templates without a `default`",
                    )
                    .with_hint(CONFIG_HINT)
                })?,
            _ => {
                return Err(no(format!(
                    "has no chat template (no chat_template.jinja, no `chat_template` in `{}`)",
                    cpath.display()
                )))
            }
        };
        Ok(ChatTemplate::new(cpath.clone(), text, special))
    }

    /// Instructions one rendering may take: real chat templates take about 10⁴ per message.
    pub const TEMPLATE_FUEL: u64 = 50_000_000;

    /// Bytes one rendering may hold at once (`io::budget`): real ones hold a few hundred KiB.
    pub const TEMPLATE_BYTES: usize = 256 << 20;

    /// The widest `tojson(indent=…)` a template may ask for.
    pub const MAX_TOJSON_INDENT: usize = 64;

    /// A minijinja environment set up as transformers sets up Jinja2 for chat templates.
    pub fn environment() -> minijinja::Environment<'static> {
        let mut env = minijinja::Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .expect("default delimiters"),
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // A template is code from the target's repository: bounded in work, so a hostile or
        // careless one (two nested `range(100000)` loops) is an error, not hours of rendering.
        env.set_fuel(Some(Self::TEMPLATE_FUEL));
        env.add_filter("tojson", tojson);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    format!("the chat template raised: {msg}"),
                ))
            },
        );
        env.add_function("strftime_now", strftime_now);
        env
    }

    /// Render `messages` (a JSON array of message objects) with `add_generation_prompt=True`,
    /// as `apply_chat_template(messages, add_generation_prompt=True, tokenize=False)` does:
    /// keys whose value is null are dropped, reasoning fields aliased, `tools` and `documents`
    /// none, the named special tokens defined.
    pub fn render(
        &self,
        tmpl: &minijinja::Template<'_, '_>,
        messages: &[Value],
    ) -> std::result::Result<String, String> {
        let msgs: Vec<Value> = messages.iter().map(plain_message).collect();
        let mut ctx: Map<String, Value> = self
            .special
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        ctx.insert("messages".into(), Value::from(msgs));
        ctx.insert("tools".into(), Value::Null);
        ctx.insert("documents".into(), Value::Null);
        ctx.insert("add_generation_prompt".into(), Value::Bool(true));
        let ctx: minijinja::Value =
            serde_json::from_value(Value::Object(ctx)).map_err(|e| e.to_string())?;
        let rendered = crate::io::budget::within(
            Self::TEMPLATE_BYTES,
            &format!(
                "`{}`: the chat template needs more than {} MiB of memory to render one prompt",
                self.source.display(),
                Self::TEMPLATE_BYTES >> 20
            ),
            "real chat templates build a few kilobytes a message; this one grows strings or \
             lists without bound (doubling them in a loop): fix the template, or leave out \
             --chat-template to encode the prompts' text as it is",
            || tmpl.render(ctx),
        );
        rendered.map_err(|e| {
            let mut s = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(c) = src {
                s.push_str(&format!(": {c}"));
                src = c.source();
            }
            s
        })
    }
}

/// A message as transformers hands it to the template: keys whose value is null dropped, and
/// `reasoning_content` / `thinking` filled from whichever reasoning field is given.
fn plain_message(m: &Value) -> Value {
    let Value::Object(o) = m else {
        return m.clone();
    };
    let o: Map<String, Value> = o
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let reasoning = ["reasoning_content", "thinking", "reasoning"]
        .iter()
        .find_map(|k| o.get(*k).cloned());
    match reasoning {
        None => Value::Object(o),
        Some(r) => {
            let mut out = Map::new();
            out.insert("thinking".into(), r.clone());
            for (k, v) in o {
                out.insert(k, v);
            }
            out.insert("reasoning_content".into(), r);
            Value::Object(out)
        }
    }
}

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`.
fn tojson(
    v: minijinja::Value,
    kwargs: minijinja::value::Kwargs,
) -> std::result::Result<minijinja::Value, minijinja::Error> {
    let indent: Option<minijinja::Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<minijinja::Value> = kwargs.get("separators")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(i) if i.is_none() => None,
        Some(i) => Some(match i.as_str() {
            Some(s) if s.len() <= ChatTemplate::MAX_TOJSON_INDENT => s.to_string(),
            Some(_) => {
                return Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    format!(
                        "tojson: an indent longer than {} characters",
                        ChatTemplate::MAX_TOJSON_INDENT
                    ),
                ))
            }
            None => {
                let n = usize::try_from(i.clone()).map_err(|_| {
                    minijinja::Error::new(
                        minijinja::ErrorKind::InvalidOperation,
                        "tojson: indent must be an integer or a string",
                    )
                })?;
                if n > ChatTemplate::MAX_TOJSON_INDENT {
                    return Err(minijinja::Error::new(
                        minijinja::ErrorKind::InvalidOperation,
                        format!(
                            "tojson: indent {n} is wider than {}",
                            ChatTemplate::MAX_TOJSON_INDENT
                        ),
                    ));
                }
                " ".repeat(n)
            }
        }),
    };
    let (item, key) = match separators {
        Some(s) if !s.is_none() => {
            let parts: Vec<String> = s
                .try_iter()?
                .map(|p| p.as_str().map(String::from))
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    minijinja::Error::new(
                        minijinja::ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    )
                })?;
            match <[String; 2]>::try_from(parts) {
                Ok([a, b]) => (a, b),
                Err(_) => {
                    return Err(minijinja::Error::new(
                        minijinja::ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ))
                }
            }
        }
        _ => (
            if indent.is_some() {
                ",".into()
            } else {
                ", ".into()
            },
            ": ".into(),
        ),
    };
    let j: Value = serde_json::to_value(&v).map_err(|e| {
        minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string())
    })?;
    let mut out = String::new();
    py_dumps(
        &j,
        indent.as_deref(),
        &item,
        &key,
        sort_keys.unwrap_or(false),
        0,
        &mut out,
    );
    Ok(minijinja::Value::from(out))
}

/// Python's `json.dumps` layout (ensure_ascii=False).
fn py_dumps(
    v: &Value,
    indent: Option<&str>,
    item: &str,
    key: &str,
    sort: bool,
    depth: usize,
    out: &mut String,
) {
    let nl = |out: &mut String, d: usize| {
        if let Some(ind) = indent {
            out.push('\n');
            for _ in 0..d {
                out.push_str(ind);
            }
        }
    };
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
                // Python's float repr: shortest round-trip, always with a '.' or exponent.
                let s = format!("{f:?}");
                out.push_str(&s);
            } else {
                out.push_str(&n.to_string());
            }
        }
        Value::String(s) => py_str(s, out),
        Value::Array(a) => {
            if a.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(item);
                }
                nl(out, depth + 1);
                py_dumps(x, indent, item, key, sort, depth + 1, out);
            }
            nl(out, depth);
            out.push(']');
        }
        Value::Object(o) => {
            if o.is_empty() {
                out.push_str("{}");
                return;
            }
            let mut entries: Vec<(&String, &Value)> = o.iter().collect();
            if sort {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, x)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item);
                }
                nl(out, depth + 1);
                py_str(k, out);
                out.push_str(key);
                py_dumps(x, indent, item, key, sort, depth + 1, out);
            }
            nl(out, depth);
            out.push('}');
        }
    }
}

/// A JSON string as Python's `json.dumps(ensure_ascii=False)` writes it.
fn py_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// transformers' `strftime_now(format)`: the local time, formatted by the C library.
fn strftime_now(format: String) -> std::result::Result<String, minijinja::Error> {
    let fmt = std::ffi::CString::new(format).map_err(|_| {
        minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            "strftime_now: NUL in the format",
        )
    })?;
    // SAFETY: `time`, `localtime_r` and `strftime` get valid pointers to local buffers; the
    // output buffer's size is passed.
    unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        let mut buf = vec![0u8; 512];
        let n = libc::strftime(buf.as_mut_ptr().cast(), buf.len(), fmt.as_ptr(), &tm);
        buf.truncate(n);
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_json_dumps_layout() {
        let v = serde_json::json!({"b": [1, 2.5, "é\n"], "a": {}, "c": null});
        let mut s = String::new();
        py_dumps(&v, None, ", ", ": ", false, 0, &mut s);
        assert_eq!(s, r#"{"b": [1, 2.5, "é\n"], "a": {}, "c": null}"#);
        let mut s = String::new();
        py_dumps(&v, Some("  "), ",", ": ", true, 0, &mut s);
        assert_eq!(
            s,
            "{\n  \"a\": {},\n  \"b\": [\n    1,\n    2.5,\n    \"é\\n\"\n  ],\n  \"c\": null\n}"
        );
    }
}
