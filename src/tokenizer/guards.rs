//! The guards on a `tokenizer.json` the `tokenizers` library would run wrongly: a
//! pre-tokenizer regex that gives up on a text (the library would stop splitting and give other
//! token ids, silently), and normalizers that can multiply a text's length without bound.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};

/// GPT-2's pattern, which a `ByteLevel` pre-tokenizer with `use_regex` splits by (tokenizers'
/// `pre_tokenizers/byte_level.rs`).
const BYTE_LEVEL_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// The regexes a `tokenizer.json`'s pre-tokenizer splits by (`Split` with a `Regex` pattern,
/// `ByteLevel` with `use_regex`), in order, through `Sequence`s.
///
/// The `tokenizers` library runs them with fancy-regex and, when one exceeds fancy-regex's
/// backtrack limit on a text, stops splitting there without an error (its `SysRegex` matches
/// iterator ends on the first `Err`): the rest of the text becomes one piece and the token ids
/// change silently. `TargetTokenizer::encode` runs the same regexes first and fails instead.
pub(super) fn split_regexes(pre: Option<&Value>) -> Vec<(String, fancy_regex::Regex)> {
    fn walk(v: &Value, out: &mut Vec<(String, fancy_regex::Regex)>) {
        match v.get("type").and_then(Value::as_str) {
            Some("Sequence") => {
                for p in v
                    .get("pretokenizers")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    walk(p, out);
                }
            }
            Some("Split") => {
                if let Some(p) = v.pointer("/pattern/Regex").and_then(Value::as_str) {
                    if let Ok(r) = fancy_regex::Regex::new(p) {
                        out.push((p.to_string(), r));
                    }
                }
            }
            Some("ByteLevel") if v.get("use_regex").and_then(Value::as_bool).unwrap_or(true) => {
                if let Ok(r) = fancy_regex::Regex::new(BYTE_LEVEL_PATTERN) {
                    out.push((BYTE_LEVEL_PATTERN.to_string(), r));
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Some(v) = pre {
        walk(v, &mut out);
    }
    out
}

/// Split `text` by each regex in turn, as the pre-tokenizer does, and fail where one of them
/// gives up (fancy-regex's backtrack limit) instead of splitting.
pub(super) fn check_splits(
    splits: &[(String, fancy_regex::Regex)],
    text: &str,
) -> std::result::Result<(), String> {
    let mut pieces: Vec<&str> = vec![text];
    for (pat, re) in splits {
        let mut next = Vec::with_capacity(pieces.len());
        for piece in pieces {
            let mut prev = 0;
            for m in re.find_iter(piece) {
                let m = m.map_err(|e| {
                    format!(
                        "the tokenizer's pre-tokenizer pattern `{}` fails on this text ({e}) at byte {prev} of a {}-byte piece: the `tokenizers` library would silently stop splitting there and give other token ids than the target's own tokenizer",
                        crate::escape::printable(pat),
                        piece.len()
                    )
                })?;
                if m.start() > prev {
                    next.push(&piece[prev..m.start()]);
                }
                next.push(m.as_str());
                prev = m.end();
            }
            if prev < piece.len() {
                next.push(&piece[prev..]);
            }
        }
        pieces = next;
    }
    Ok(())
}

/// The most a tokenizer's normalizers may multiply a text's length by.
pub const MAX_NORMALIZER_GROWTH: f64 = 64.0;

/// Refuse a `tokenizer.json` whose normalizers can multiply a text's length beyond
/// [`MAX_NORMALIZER_GROWTH`] (chained `Replace` normalizers each lengthening what they replace
/// turn one character into 10^12): bounded before the `tokenizers` library ever runs them.
/// Growth of a `Replace` is its content's length over its string pattern's (a regex pattern
/// counts as matching one character); a `Sequence` multiplies its members'.
pub(super) fn normalizer_growth_check(file: &Path, bytes: &[u8]) -> Result<()> {
    fn growth(n: &Value) -> f64 {
        match n.get("type").and_then(Value::as_str) {
            Some("Sequence") => n
                .get("normalizers")
                .and_then(Value::as_array)
                .map_or(1.0, |v| v.iter().map(growth).product()),
            Some("Replace") => {
                let content = n
                    .get("content")
                    .and_then(Value::as_str)
                    .map_or(0, |c| c.chars().count());
                let pattern = n
                    .pointer("/pattern/String")
                    .and_then(Value::as_str)
                    .map_or(1, |p| p.chars().count().max(1));
                (content as f64 / pattern as f64).max(1.0)
            }
            Some("Prepend") => 2.0,
            _ => 1.0,
        }
    }
    let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
        return Ok(()); // the library's own error says what is wrong
    };
    let g = v.get("normalizer").map_or(1.0, growth);
    if g > MAX_NORMALIZER_GROWTH {
        return Err(Error::source(
            file,
            format!("has normalizers that can multiply a text's length by up to {g:.3e} (chained Replace normalizers): tokenizing with it could exhaust memory"),
        )
        .with_hint("use the target's own tokenizer.json; a real one lengthens text by a few times at most"));
    }
    Ok(())
}
