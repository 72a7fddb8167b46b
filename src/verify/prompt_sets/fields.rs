//! One record's fields, read with the checks every format shares (present, a string, not
//! blank; ids; turns; chat messages), and why a record does not fit.

use serde_json::{json, Map, Value};

/// What kind of JSON value `v` is, for messages.
pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Why a record does not fit its format; `hint` replaces the format's own.
pub(super) struct Bad {
    pub(super) msg: String,
    pub(super) hint: Option<String>,
}

impl From<String> for Bad {
    fn from(msg: String) -> Self {
        Bad { msg, hint: None }
    }
}

pub(super) type Fit<T> = std::result::Result<T, Bad>;

/// One record's fields, read with the checks every format shares.
pub(super) struct Record<'a>(pub(super) &'a Map<String, Value>);

impl Record<'_> {
    /// The value of `k`; a JSON `null` counts as absent.
    pub(super) fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }

    pub(super) fn has(&self, k: &str) -> bool {
        self.get(k).is_some()
    }

    /// `k` as a string when present.
    pub(super) fn opt_str(&self, k: &str) -> Fit<Option<&str>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(format!("`{k}` is not a string (it is {})", kind(v)).into()),
        }
    }

    /// `k`, a string that must be there (it may be empty).
    pub(super) fn req_str(&self, k: &str) -> Fit<&str> {
        self.opt_str(k)?
            .ok_or_else(|| format!("has no `{k}`").into())
    }

    /// `k`, a string that must be there and not be blank (what is sent, or what is reported per).
    pub(super) fn req_text(&self, k: &str) -> Fit<&str> {
        let s = self.req_str(k)?;
        if s.trim().is_empty() {
            return Err(format!("`{k}` is empty").into());
        }
        Ok(s)
    }

    /// The id under the first of `keys` present (an integer or a non-empty string), else the
    /// line number.
    pub(super) fn id(&self, keys: &[&str], line: usize) -> Fit<String> {
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
    pub(super) fn first_turn(&self) -> Fit<String> {
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
    pub(super) fn messages(&self) -> Fit<Vec<Value>> {
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

/// A plain or tokens record's `dataset`, else the format's name.
pub(super) fn dataset(r: &Record, name: &str) -> Fit<String> {
    Ok(match r.opt_str("dataset")? {
        Some(d) if !d.trim().is_empty() => d.into(),
        _ => name.into(),
    })
}
