//! `config.json` as a checked JSON object with typed accessors (nested `text_config`,
//! `eagle_config`, `dflash_config` and speculators `transformer_layer_config` included).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Largest layer id (in absolute value) a config's aux/target layer-id list may hold.
pub const MAX_LAYER_ID: u64 = 1 << 20;

/// A parsed `config.json`.
#[derive(Debug, Clone)]
pub struct Config {
    pub path: PathBuf,
    pub root: Map<String, Value>,
}

impl Config {
    /// Read and parse; it must be a JSON object in a regular file of at most
    /// [`MAX_CONFIG`](crate::io::text::MAX_CONFIG) bytes.
    pub fn read(path: &Path) -> Result<Config> {
        let bytes = crate::io::text::read_regular(path, crate::io::text::MAX_CONFIG, "config")?;
        let cerr = |msg: String| Error::Config {
            path: path.into(),
            msg,
        };
        let v: Value =
            serde_json::from_slice(&bytes).map_err(|e| cerr(format!("not valid JSON: {e}")))?;
        match v {
            Value::Object(root) => Ok(Config {
                path: path.into(),
                root,
            }),
            _ => Err(cerr("must be a JSON object".into())),
        }
    }

    /// Build from a value (tests, generators).
    pub fn from_value(path: &Path, v: Value) -> Option<Config> {
        match v {
            Value::Object(root) => Some(Config {
                path: path.into(),
                root,
            }),
            _ => None,
        }
    }

    /// The object holding the model dimensions: `text_config` for multimodal wrappers,
    /// `transformer_layer_config` for vLLM speculators configs, else the root.
    pub fn text(&self) -> &Map<String, Value> {
        for k in ["text_config", "transformer_layer_config"] {
            if let Some(Value::Object(m)) = self.root.get(k) {
                return m;
            }
        }
        &self.root
    }

    /// A key from the root, else from the dimension object.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.root.get(key).or_else(|| self.text().get(key))
    }

    /// A key under a nested object (`eagle_config`, `dflash_config`, …).
    pub fn nested(&self, obj: &str, key: &str) -> Option<&Value> {
        self.root.get(obj).and_then(|o| o.get(key))
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    /// A non-negative integer key; a present key of the wrong type is an error.
    pub fn uint(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| Error::Config {
                path: self.path.clone(),
                msg: format!("`{key}` must be a non-negative integer, found {v}"),
            }),
        }
    }

    pub fn bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(Value::as_bool)
    }

    /// `architectures` (root, then text config).
    pub fn architectures(&self) -> Vec<String> {
        let arch = |m: &Map<String, Value>| {
            m.get("architectures").and_then(Value::as_array).map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect::<Vec<_>>()
            })
        };
        arch(&self.root)
            .or_else(|| arch(self.text()))
            .unwrap_or_default()
    }

    pub fn model_type(&self) -> Option<&str> {
        self.root.get("model_type").and_then(Value::as_str)
    }

    /// A list of layer ids at `obj.key` (or root `key` when `obj` is `None`), each within
    /// ±[`MAX_LAYER_ID`].
    pub fn int_list(&self, obj: Option<&str>, key: &str) -> Result<Option<Vec<i64>>> {
        let v = match obj {
            Some(o) => self.nested(o, key),
            None => self.root.get(key),
        };
        let Some(v) = v.filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        let where_ = obj
            .map(|o| format!("{o}.{key}"))
            .unwrap_or_else(|| key.to_string());
        let ids = v
            .as_array()
            .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
            .ok_or_else(|| Error::Config {
                path: self.path.clone(),
                msg: format!("`{where_}` must be a list of integers, found {v}"),
            })?;
        // Layer ids: bounded so that converting between conventions (± 1) cannot overflow.
        if let Some(k) = ids.iter().find(|k| k.unsigned_abs() > MAX_LAYER_ID) {
            return Err(Error::Config {
                path: self.path.clone(),
                msg: format!(
                    "`{where_}` holds {k}, which is not a layer id (|id| <= {MAX_LAYER_ID})"
                ),
            });
        }
        Ok(Some(ids))
    }
}
