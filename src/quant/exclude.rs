//! Which tensors are quantized: the Linear-weight rule and Quark's exclusion patterns
//! (Python `fnmatch` against the full module name, i.e. the tensor name without `.weight`).

use crate::io::{Dtype, TensorInfo};

/// Python `fnmatch.fnmatchcase`: `*`, `?`, `[seq]`, `[!seq]` (ranges `a-z`), everything else literal.
pub fn fnmatch(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    fn go(p: &[char], n: &[char]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some('*') => (0..=n.len()).any(|i| go(&p[1..], &n[i..])),
            Some('?') => !n.is_empty() && go(&p[1..], &n[1..]),
            Some('[') => match (class_end(p), n.first()) {
                (Some(end), Some(&c)) => class_matches(&p[1..end], c) && go(&p[end + 1..], &n[1..]),
                (None, Some(&c)) => c == '[' && go(&p[1..], &n[1..]),
                (_, None) => false,
            },
            Some(&c) => n.first() == Some(&c) && go(&p[1..], &n[1..]),
        }
    }
    fn class_end(p: &[char]) -> Option<usize> {
        let mut i = 1;
        if p.get(i) == Some(&'!') {
            i += 1;
        }
        if p.get(i) == Some(&']') {
            i += 1;
        }
        (i..p.len()).find(|&j| p[j] == ']')
    }
    fn class_matches(body: &[char], c: char) -> bool {
        let (neg, body) = match body.first() {
            Some('!') => (true, &body[1..]),
            _ => (false, body),
        };
        let mut hit = false;
        let mut i = 0;
        while i < body.len() {
            if i + 2 < body.len() && body[i + 1] == '-' {
                hit |= body[i] <= c && c <= body[i + 2];
                i += 3;
            } else {
                hit |= body[i] == c;
                i += 1;
            }
        }
        hit != neg
    }
    go(&p, &n)
}

/// Module name of a tensor (`a.b.weight` → `a.b`).
pub fn module_of(name: &str) -> &str {
    name.rsplit_once('.').map(|(m, _)| m).unwrap_or(name)
}

/// Why a tensor is not a quantization candidate, or `None` when it is a Linear weight.
/// The rule is Quark file-to-file's `_is_linear_weight_tensor`, plus shape and dtype checks.
pub fn not_candidate(t: &TensorInfo) -> Option<&'static str> {
    if !t.name.ends_with(".weight") {
        return Some(if t.name == "d2t" || t.name == "t2d" {
            "vocab map"
        } else {
            "not a weight"
        });
    }
    if t.name.contains("embed") {
        return Some("embedding");
    }
    if module_of(&t.name).ends_with("norm") {
        return Some("norm");
    }
    if t.shape.len() != 2 {
        return Some("not 2-D");
    }
    if !matches!(t.dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
        return Some("not a float tensor");
    }
    None
}

/// Parse `fc,lm_head` into patterns.
pub fn parse_patterns(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect()
}

/// The first pattern matching `module`.
pub fn excluded_by<'a>(patterns: &'a [String], module: &str) -> Option<&'a str> {
    patterns
        .iter()
        .find(|p| fnmatch(p, module))
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnmatch_like_python() {
        assert!(fnmatch("lm_head", "lm_head"));
        assert!(!fnmatch("lm_head", "model.lm_head"));
        assert!(fnmatch("*embed_tokens", "model.embed_tokens"));
        assert!(fnmatch("*.mlp.*", "midlayer.mlp.down_proj"));
        assert!(fnmatch(
            "layers.?.self_attn.q_proj",
            "layers.0.self_attn.q_proj"
        ));
        assert!(fnmatch("*.[gu]*_proj", "midlayer.mlp.gate_proj"));
        assert!(
            fnmatch("*.[!gu]*_proj", "midlayer.mlp.gate_proj"),
            "`*` backtracks as in Python"
        );
        assert!(!fnmatch("[!gu]ate_proj", "gate_proj"));
        assert!(fnmatch("[!gu]ate_proj", "xate_proj"));
        assert!(fnmatch("a[", "a["));
        assert!(!fnmatch("fc", "fc_norm"));
    }
}
