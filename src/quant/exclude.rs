//! Which tensors are quantized: the Linear-weight rule and Quark's exclusion patterns
//! (Python `fnmatch` against the full module name, i.e. the tensor name without `.weight`).
//!
//! Patterns come from the command line (`--exclude`) and from preset files, so the matcher is
//! built for hostile input: a pattern is compiled once into single-character tokens (a class's
//! closing `]` found through a precomputed table, not by rescanning), and matched by the
//! iterative two-pointer algorithm that backtracks only to the most recent `*`. That is
//! O(len(pattern) · len(name)) in the worst case, with no recursion, so neither many `*` nor a
//! very long pattern can blow up time or the stack. kquant itself never matches `re:` patterns:
//! it only writes them for engines (see `quark::engine_pattern`); an `--exclude re:…` is an
//! fnmatch pattern like any other.

use crate::io::{Dtype, TensorInfo};

/// One pattern token; every token but `Star` matches exactly one character.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Star,
    Any,
    Lit(char),
    /// `[seq]` / `[!seq]`: (negated, (lo, hi) ranges; a single character is `(c, c)`).
    Class(bool, Vec<(char, char)>),
}

/// Tokenize a pattern with `fnmatch.translate`'s rules: `[` opens a class closed by the first
/// `]` after an optional `!` and an optional leading `]`; without one it is a literal `[`.
/// Runs of `*` collapse into one.
fn compile(pattern: &str) -> Vec<Tok> {
    let p: Vec<char> = pattern.chars().collect();
    // next_close[i]: the first index >= i holding `]` (p.len() when none): O(1) class ends.
    let mut next_close = vec![p.len(); p.len() + 1];
    for i in (0..p.len()).rev() {
        next_close[i] = if p[i] == ']' { i } else { next_close[i + 1] };
    }
    let mut toks = Vec::new();
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            '*' => {
                if toks.last() != Some(&Tok::Star) {
                    toks.push(Tok::Star);
                }
                i += 1;
            }
            '?' => {
                toks.push(Tok::Any);
                i += 1;
            }
            '[' => {
                let mut j = i + 1;
                if p.get(j) == Some(&'!') {
                    j += 1;
                }
                if p.get(j) == Some(&']') {
                    j += 1;
                }
                let end = next_close[j.min(p.len())];
                if end >= p.len() {
                    toks.push(Tok::Lit('['));
                    i += 1;
                    continue;
                }
                let body = &p[i + 1..end];
                let (neg, body) = match body.first() {
                    Some('!') => (true, &body[1..]),
                    _ => (false, body),
                };
                let mut items = Vec::new();
                let mut k = 0;
                while k < body.len() {
                    if k + 2 < body.len() && body[k + 1] == '-' {
                        items.push((body[k], body[k + 2]));
                        k += 3;
                    } else {
                        items.push((body[k], body[k]));
                        k += 1;
                    }
                }
                toks.push(Tok::Class(neg, items));
                i = end + 1;
            }
            c => {
                toks.push(Tok::Lit(c));
                i += 1;
            }
        }
    }
    toks
}

impl Tok {
    /// Whether this one-character token matches `c` (`Star` never is asked).
    fn matches(&self, c: char) -> bool {
        match self {
            Tok::Star => true,
            Tok::Any => true,
            Tok::Lit(l) => *l == c,
            Tok::Class(neg, items) => items.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *neg,
        }
    }
}

/// Python `fnmatch.fnmatchcase`: `*`, `?`, `[seq]`, `[!seq]` (ranges `a-z`), everything else literal.
pub fn fnmatch(pattern: &str, name: &str) -> bool {
    let p = compile(pattern);
    let n: Vec<char> = name.chars().collect();
    // Every non-star token eats one character: a pattern needing more than the name has fails.
    if p.iter().filter(|t| **t != Tok::Star).count() > n.len() {
        return false;
    }
    let (mut pi, mut ni) = (0, 0);
    // The most recent `*`: the token after it, and the name position it is anchored at.
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some(Tok::Star) => {
                pi += 1;
                star = Some((pi, ni));
            }
            Some(t) if t.matches(n[ni]) => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                // Let the last `*` eat one more character and retry what follows it. Earlier
                // stars never need to move: the segment after the last one can match anywhere
                // later just as well.
                Some((sp, sn)) => {
                    pi = sp;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|t| *t == Tok::Star)
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

/// A tensor a draft family's engines load only unquantized, with why: matched (fnmatch) against
/// the full tensor name. `always` entries hold whatever `--exclude` says (the engine builds no
/// quantized module there); the others are default exclusions, like `lm_head`, that an explicit
/// `--exclude` (or a preset's) replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kept {
    pub pattern: &'static str,
    pub why: &'static str,
    pub always: bool,
}

const fn kept(pattern: &'static str, why: &'static str, always: bool) -> Kept {
    Kept {
        pattern,
        why,
        always,
    }
}

/// DSpark's heads as vLLM 0.33 builds them (`qwen3_dspark.py`).
pub const DSPARK_KEPT: &[Kept] = &[
    kept(
        "markov_head.markov_w1.weight",
        "Markov embedding: vLLM builds a plain `nn.Embedding`, never quantized",
        true,
    ),
    kept(
        "confidence_head.proj.*",
        "confidence head: vLLM builds an fp32 `ReplicatedLinear` without the quant config",
        true,
    ),
    kept(
        "markov_head.markov_w2.weight",
        "Markov projection, by default like lm_head: vLLM's `dspark_draft_topk` reads it unquantized unless ModelOpt nvfp4-a16",
        false,
    ),
];

/// DFlash2's convolutions and selector as vLLM 0.33 builds them (`qwen3_dflash2.py`); the
/// convolutions' `kernel_projection` is a `ReplicatedLinear` built with the quant config, so
/// it is quantized like the decoder linears.
pub const DFLASH2_KEPT: &[Kept] = &[
    kept(
        "candidate_selector.hidden_projection.weight",
        "selector projection: vLLM builds a `ReplicatedLinear` without the quant config",
        true,
    ),
    kept(
        "candidate_selector.*_codebook",
        "selector codebook: an `nn.Parameter`, not a linear",
        true,
    ),
    kept(
        "layers.*_conv.base_kernel",
        "convolution base kernel: an `nn.Parameter`, not a linear",
        true,
    ),
];

/// The first of `kept` matching tensor `name`.
pub fn kept_for<'a>(kept: &'a [Kept], name: &str) -> Option<&'a Kept> {
    kept.iter().find(|k| fnmatch(k.pattern, name))
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

    /// The recursive matcher kquant used before (exponential in the number of `*`): the
    /// reference the iterative one must agree with.
    fn reference(pattern: &str, name: &str) -> bool {
        let p: Vec<char> = pattern.chars().collect();
        let n: Vec<char> = name.chars().collect();
        fn go(p: &[char], n: &[char]) -> bool {
            match p.first() {
                None => n.is_empty(),
                Some('*') => (0..=n.len()).any(|i| go(&p[1..], &n[i..])),
                Some('?') => !n.is_empty() && go(&p[1..], &n[1..]),
                Some('[') => match (class_end(p), n.first()) {
                    (Some(end), Some(&c)) => {
                        class_matches(&p[1..end], c) && go(&p[end + 1..], &n[1..])
                    }
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

    use crate::test_rng::Rng;

    #[test]
    fn agrees_with_the_recursive_reference_on_random_patterns() {
        // Small alphabets so that matches, classes, ranges and unclosed `[` all happen often.
        let pat: Vec<char> = "ab.*?[]!-".chars().collect();
        let name: Vec<char> = "ab.[]!-".chars().collect();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut hits, mut total) = (0, 0);
        for _ in 0..200_000 {
            let p = rng.string(&pat, 9);
            let n = rng.string(&name, 8);
            let want = reference(&p, &n);
            assert_eq!(fnmatch(&p, &n), want, "pattern {p:?} name {n:?}");
            hits += want as usize;
            total += 1;
        }
        // Not a vacuous comparison: both outcomes are common.
        assert!(
            hits > total / 50 && hits < total - total / 50,
            "{hits}/{total}"
        );
    }

    #[test]
    fn many_stars_and_long_patterns_stay_fast() {
        let t = std::time::Instant::now();
        // 40 stars: the recursive matcher takes longer than the universe's age here.
        let p = format!("{}b", "a*".repeat(40));
        assert!(!fnmatch(&p, &"a".repeat(200)));
        assert!(fnmatch(&p, &format!("{}b", "a".repeat(200))));
        // A megabyte of classes without a `]` (each `[` once rescanned to the end) and of stars.
        let long = "[".repeat(1 << 20);
        assert!(!fnmatch(&long, "model.layers.0.mlp"));
        assert!(fnmatch(&long, &"[".repeat(1 << 20)));
        assert!(fnmatch(&"*".repeat(1 << 20), "model.layers.0.mlp"));
        let stars = format!("{}x", "*a".repeat(1 << 19));
        assert!(!fnmatch(&stars, &"a".repeat(1000)));
        assert!(t.elapsed().as_secs() < 5, "{:?}", t.elapsed());
    }
}
