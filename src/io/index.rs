//! `model.safetensors.index.json`: parsing, and the safety rules for shard names.

use serde_json::Value;

use super::header::ordered_entries;
use crate::error::IndexError;

/// The conventional file name of the index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// A parsed index: tensor → shard file name, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Index {
    pub weight_map: Vec<(String, String)>,
    pub total_size: Option<u64>,
}

impl Index {
    /// Distinct shard names in first-seen order.
    pub fn shards(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for (_, s) in &self.weight_map {
            if !out.contains(&s.as_str()) {
                out.push(s);
            }
        }
        out
    }
}

/// A shard name must be a plain file name: no separators, no `..`, not absolute, not empty.
pub fn is_plain_file_name(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && !s.contains(['/', '\\', '\0', ':'])
        && !s.starts_with('~')
}

/// Parse and check an index (pure over bytes; the fuzz target drives it).
pub fn parse(json: &[u8]) -> Result<Index, IndexError> {
    let top = ordered_entries(json).map_err(|e| match serde_json::from_slice::<Value>(json) {
        Ok(_) => IndexError::Shape,
        Err(_) => IndexError::Json(e.to_string()),
    })?;
    let mut weight_map = None;
    let mut total_size = None;
    for (k, v) in top {
        match k.as_str() {
            "weight_map" => {
                let Value::Object(_) = &v else {
                    return Err(IndexError::Shape);
                };
                weight_map =
                    Some(ordered_entries(v.to_string().as_bytes()).map_err(|_| IndexError::Shape)?);
            }
            "metadata" => {
                if let Some(ts) = v.get("total_size") {
                    total_size = ts
                        .as_u64()
                        .or_else(|| ts.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64));
                }
            }
            _ => {}
        }
    }
    let entries = weight_map.ok_or(IndexError::Shape)?;
    if entries.is_empty() {
        return Err(IndexError::Empty);
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(entries.len());
    for (tensor, shard) in entries {
        let Value::String(shard) = shard else {
            return Err(IndexError::Shape);
        };
        if !seen.insert(tensor.clone()) {
            return Err(IndexError::DuplicateEntry(tensor));
        }
        if !is_plain_file_name(&shard) {
            return Err(IndexError::UnsafeShardName { tensor, shard });
        }
        out.push((tensor, shard));
    }
    Ok(Index {
        weight_map: out,
        total_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names() {
        assert!(is_plain_file_name("model-00001-of-00002.safetensors"));
        for bad in [
            "",
            ".",
            "..",
            "../x.safetensors",
            "/etc/passwd",
            "a/b",
            "a\\b",
            "C:x",
            "~x",
        ] {
            assert!(!is_plain_file_name(bad), "{bad}");
        }
    }

    #[test]
    fn parse_cases() {
        let ok = br#"{"metadata":{"total_size":12},"weight_map":{"a":"s1","b":"s2","c":"s1"}}"#;
        let i = parse(ok).unwrap();
        assert_eq!(i.shards(), vec!["s1", "s2"]);
        assert_eq!(i.total_size, Some(12));
        assert!(matches!(parse(b"{"), Err(IndexError::Json(_))));
        assert!(matches!(parse(b"[]"), Err(IndexError::Shape)));
        assert!(matches!(
            parse(br#"{"weight_map":[]}"#),
            Err(IndexError::Shape)
        ));
        assert!(matches!(
            parse(br#"{"weight_map":{}}"#),
            Err(IndexError::Empty)
        ));
        assert!(matches!(
            parse(br#"{"weight_map":{"a":1}}"#),
            Err(IndexError::Shape)
        ));
        assert!(matches!(
            parse(br#"{"weight_map":{"a":"s","a":"t"}}"#),
            Err(IndexError::DuplicateEntry(_))
        ));
        assert!(matches!(
            parse(br#"{"weight_map":{"a":"../s"}}"#),
            Err(IndexError::UnsafeShardName { .. })
        ));
    }
}
