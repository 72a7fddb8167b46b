//! `model.safetensors.index.json`: parsing, and the safety rules for shard names. Every check
//! is linear in the number of entries (hash sets, no scans of what came before).

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;

use super::header::Entries;
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
    /// Distinct shard names in first-seen order (a set, not a scan of the list so far: an
    /// index may name hundreds of thousands of shards).
    pub fn shards(&self) -> Vec<&str> {
        let mut seen = std::collections::HashSet::new();
        self.weight_map
            .iter()
            .map(|(_, s)| s.as_str())
            .filter(|s| seen.insert(*s))
            .collect()
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
    // `weight_map` is read straight into ordered entries (not through `Value`, which would
    // silently keep only the last of two equal keys) so duplicates can be refused.
    let top = serde_json::from_slice::<Top>(json).map_err(|e| {
        match serde_json::from_slice::<Value>(json) {
            Ok(_) => IndexError::Shape,
            Err(_) => IndexError::Json(e.to_string()),
        }
    })?;
    let weight_map = top.weight_map;
    let total_size = top
        .metadata
        .as_ref()
        .and_then(|m| m.get("total_size"))
        .and_then(|ts| {
            ts.as_u64()
                .or_else(|| ts.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
        });
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

/// The top level of an index: `weight_map` as ordered entries, `metadata`, the rest ignored.
struct Top {
    weight_map: Option<Vec<(String, Value)>>,
    metadata: Option<Value>,
}

impl<'de> Deserialize<'de> for Top {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Top;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Top, A::Error> {
                let mut top = Top {
                    weight_map: None,
                    metadata: None,
                };
                while let Some(k) = m.next_key::<String>()? {
                    match k.as_str() {
                        "weight_map" if top.weight_map.is_some() => {
                            return Err(de::Error::custom("`weight_map` appears twice"))
                        }
                        "weight_map" => top.weight_map = Some(m.next_value::<Entries>()?.0),
                        "metadata" => top.metadata = Some(m.next_value()?),
                        _ => {
                            m.next_value::<de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(top)
            }
        }
        d.deserialize_map(V)
    }
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
