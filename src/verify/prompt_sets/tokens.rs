//! Token ids, as `kquant trace prompts` writes them (`tokens`, or `prompt_ids` / `input_ids`;
//! optional `id`, `category`, `dataset`), sent as they are.

use serde_json::Value;

use super::fields::{dataset, kind, Bad, Fit, Record};
use super::format::TOKEN_KEYS;
use super::prompt::{Body, LivePrompt};

/// A tokens record (`name` the format's, the dataset when the record names none).
pub(super) fn tokens(r: &Record, line: usize, name: String) -> Fit<LivePrompt> {
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
        return Err(format!("`{k}` is not a list of token ids (it is {})", kind(ids)).into());
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
    Ok(LivePrompt {
        id: r.id(&["id"], line)?,
        category: r.opt_str("category")?.unwrap_or_default().into(),
        dataset: dataset(r, &name)?,
        body: Body::Tokens(tokens),
    })
}
