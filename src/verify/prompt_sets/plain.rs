//! A user's own prompt file: `prompt` or `text` (raw text to continue) or chat `messages`,
//! with optional `id`, `category` and `dataset`.

use super::fields::{dataset, Bad, Fit, Record};
use super::format::TOKEN_KEYS;
use super::prompt::{Body, LivePrompt};

/// A plain record (`name` the format's, the dataset when the record names none).
pub(super) fn plain(r: &Record, line: usize, name: String) -> Fit<LivePrompt> {
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
    Ok(LivePrompt {
        id: r.id(&["id"], line)?,
        category: r.opt_str("category")?.unwrap_or_default().into(),
        dataset: dataset(r, &name)?,
        body,
    })
}
