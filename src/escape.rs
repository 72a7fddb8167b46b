//! Showing text read from files (tensor names, config values, shard names, sample categories)
//! on a terminal: control characters and bidirectional-override marks are written as escapes
//! (`\n`, `\x1b`, `\u{202e}`), so a hostile name can neither move the cursor, recolour or
//! clear the screen, nor fake extra output lines or reorder what is shown. Human-readable
//! output goes through [`printable`]; `--json` output stays exact JSON (serde escapes control
//! characters there itself).

use std::borrow::Cow;
use std::fmt::Write;

/// Whether `c` must not reach a terminal as itself.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// `s` with every control character and bidi mark escaped (`\n`, `\r`, `\t`, `\x1b` for the
/// other C0 / DEL / C1 controls, `\u{…}` for the bidi marks); borrowed when there is none.
/// Backslashes are left as they are: this is for reading, `--json` is the exact form.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) && (c as u32) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Serialized JSON shown on a terminal (a dry run's config): the characters serde leaves raw
/// inside strings (DEL, C1 controls, bidi marks) written as `\uXXXX`, which keeps it valid JSON
/// with the same value. A raw newline is the pretty printer's own layout (serde writes one inside
/// a string as `\n`) and stays.
pub fn json_printable(json: &str) -> Cow<'_, str> {
    let escape = |c: char| c != '\n' && needs_escape(c);
    if !json.chars().any(escape) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 8);
    for c in json.chars() {
        if escape(c) {
            // Every such character is in the BMP: one `\uXXXX`.
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_controls_and_bidi_marks_only() {
        assert!(matches!(
            printable("model.layers.0.weight"),
            Cow::Borrowed(_)
        ));
        assert_eq!(printable("a\u{1b}[2Jb\nc"), "a\\x1b[2Jb\\nc");
        assert_eq!(printable("\r\t\u{7f}\u{85}"), "\\r\\t\\x7f\\x85");
        assert_eq!(printable("x\u{202e}y"), "x\\u{202e}y");
        assert_eq!(printable("ünïcode ok \\ too"), "ünïcode ok \\ too");
        let v = serde_json::json!({"k\u{1b}": "a\u{7f}\u{9b}\u{202e}\n"});
        let shown = json_printable(&v.to_string()).into_owned();
        assert!(!shown.chars().any(needs_escape), "{shown}");
        // A pretty-printed document keeps its lines; a newline in a value is serde's `\n`.
        let pretty = serde_json::to_string_pretty(&v).unwrap();
        let shown = json_printable(&pretty);
        assert_eq!(shown.lines().count(), pretty.lines().count(), "{shown}");
        assert!(
            shown.lines().all(|l| !l.chars().any(needs_escape)),
            "{shown}"
        );
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&shown).unwrap(),
            v
        );
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&shown).unwrap(),
            v
        );
        // Nothing that needs escaping survives, whatever the input.
        for c in (0u32..0x3000).filter_map(char::from_u32) {
            let s = printable(&c.to_string()).into_owned();
            assert!(!s.chars().any(needs_escape), "{c:?} -> {s:?}");
        }
    }
}
