//! The record type of a prompt set: one [`LivePrompt`] per record of the file, with the
//! [`Body`] sent to the server.

use serde_json::{json, Value};

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

/// One user message.
pub(super) fn user(content: &str) -> Body {
    Body::Messages(vec![json!({"role": "user", "content": content})])
}
