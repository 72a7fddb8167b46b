//! `tokenizer_config.json` beside a tokenizer: read, and the named special tokens it gives a
//! chat template.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{Error, Result};

pub(super) const CONFIG_HINT: &str =
    "tokenizer_config.json must be the JSON object transformers writes";

/// `tokenizer_config.json` in `dir`, if there is one (a JSON object).
pub(super) fn read(dir: &Path) -> Result<Option<(PathBuf, Map<String, Value>)>> {
    let p = dir.join("tokenizer_config.json");
    if !p.is_file() {
        return Ok(None);
    }
    let bytes = crate::io::text::read_regular(&p, crate::io::text::MAX_CONFIG, "tokenizer config")?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => Ok(Some((p, m))),
        Ok(_) => Err(Error::source(&p, "is not a JSON object").with_hint(CONFIG_HINT)),
        Err(e) => Err(Error::source(&p, format!("is not JSON: {e}")).with_hint(CONFIG_HINT)),
    }
}

/// The named special tokens transformers passes to a chat template (`special_tokens_map`:
/// `bos_token`, `eos_token`, …; a string or an `AddedToken` object in the config).
pub(super) fn special_tokens_map(config: Option<&Map<String, Value>>) -> Vec<(String, String)> {
    const NAMED: [&str; 7] = [
        "bos_token",
        "eos_token",
        "unk_token",
        "sep_token",
        "pad_token",
        "cls_token",
        "mask_token",
    ];
    let Some(c) = config else { return vec![] };
    NAMED
        .iter()
        .filter_map(|k| {
            let v = match c.get(*k)? {
                Value::String(s) => s.clone(),
                Value::Object(o) => o.get("content")?.as_str()?.to_string(),
                _ => return None,
            };
            Some((k.to_string(), v))
        })
        .collect()
}
