//! A tiktoken ranks file (`tiktoken.model`: `base64(token bytes) rank` per line), what the
//! Kimi-K2.x repositories ship with `tokenization_kimi.py` instead of a `tokenizer.json`,
//! turned into the equivalent byte-level BPE (the merges recovered from the ranks, as
//! transformers' `TikTokenConverter` does), split by Kimi's pre-tokenizer pattern
//! ([`KIMI_PAT_STR`]), with the 256 + 2 special tokens `tokenization_kimi.py` appends after the
//! ranks (named by `tokenizer_config.json`'s `added_tokens_decoder`). Like its `encode`, special
//! tokens written in the text are matched (`allowed_special="all"`), no BOS is added, and text
//! is cut where Kimi's tokenizer cuts it (400 000 characters; runs of more than 25 000
//! whitespace or non-whitespace characters: [`kimi_pieces`]).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use tokenizers::Tokenizer;

use crate::error::{Error, Result};

/// Kimi's pre-tokenizer pattern: `TikTokenTokenizer.pat_str` of `tokenization_kimi.py` in the
/// moonshotai Kimi-K2 / K2.5 / Kimi-Linear Hugging Face repositories (the same eight
/// alternatives in each; tiktoken compiles it with `fancy-regex`, as kquant does).
pub const KIMI_PAT_STR: &str = concat!(
    r"[\p{Han}]+",
    "|",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"\p{N}{1,3}",
    "|",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    "|",
    r"\s*[\r\n]+",
    "|",
    r"\s+(?!\S)",
    "|",
    r"\s+",
);

/// Special tokens `tokenization_kimi.py` appends after the ranks: `num_reserved_special_tokens`
/// (256) + 2.
pub const KIMI_SPECIAL_TOKENS: usize = 256 + 2;
/// `TIKTOKEN_MAX_ENCODE_CHARS` of `tokenization_kimi.py`.
const KIMI_MAX_ENCODE_CHARS: usize = 400_000;
/// `MAX_NO_WHITESPACES_CHARS` of `tokenization_kimi.py`.
const KIMI_MAX_RUN_CHARS: usize = 25_000;

/// GPT-2's `bytes_to_unicode`: the printable stand-in of each byte in a byte-level vocabulary.
fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (b'!' as u32..=b'~' as u32).contains(&b)
            || (0xA1..=0xAC).contains(&b)
            || (0xAE..=0xFF).contains(&b);
        out[b as usize] = if printable {
            char::from_u32(b).unwrap()
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap()
        };
    }
    out
}

/// Standard base64 (`load_tiktoken_bpe`'s `base64.b64decode`), padding required where due.
fn b64decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let b = s.as_bytes();
    if b.is_empty() || !b.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(b.len() / 4 * 3);
    for (i, q) in b.chunks(4).enumerate() {
        let last = i == b.len() / 4 - 1;
        let pad = q.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for &c in &q[..4 - pad] {
            n = n << 6 | val(c)?;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

const RANKS_HINT: &str = "give the target's own tiktoken.model (a tiktoken ranks file: every byte, then the merged tokens, ranks 0..n)";

/// Read a tiktoken ranks file: `base64 rank` per line. The ranks must be 0..n, each once, and
/// every single byte must have one (otherwise some text has no encoding).
pub fn read_ranks(path: &Path, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
    let text = std::str::from_utf8(bytes).map_err(|_| {
        Error::source(path, "is not a tiktoken ranks file (not text)")
            .with_hint("a tiktoken ranks file has one `base64(token bytes) rank` pair per line")
    })?;
    let mut by_rank: Vec<Option<Vec<u8>>> = Vec::new();
    let mut seen: HashSet<Vec<u8>> = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |msg: String| {
            Error::source(PathBuf::from(format!("{}:{}", path.display(), i + 1)), msg)
                .with_hint("a tiktoken ranks file has one `base64(token bytes) rank` pair per line")
        };
        let mut it = line.split_whitespace();
        let (Some(tok), Some(rank), None) = (it.next(), it.next(), it.next()) else {
            return Err(bad("is not `base64 rank`".into()));
        };
        let tok = b64decode(tok).ok_or_else(|| bad(format!("`{tok}` is not base64")))?;
        let rank: usize = rank
            .parse()
            .ok()
            .filter(|&r: &usize| r < 1 << 24)
            .ok_or_else(|| bad(format!("rank `{rank}` is not an integer below 2^24")))?;
        if !seen.insert(tok.clone()) {
            return Err(bad("lists a token a second time".into()));
        }
        if by_rank.len() <= rank {
            by_rank.resize(rank + 1, None);
        }
        if by_rank[rank].replace(tok).is_some() {
            return Err(bad(format!("rank {rank} is given twice")));
        }
    }
    let n = by_rank.len();
    let ranks: Vec<Vec<u8>> = by_rank
        .into_iter()
        .enumerate()
        .map(|(r, t)| {
            t.ok_or_else(|| {
                Error::source(path, format!("has no token of rank {r} (ranks must run 0..{n} without gaps: the special tokens follow the last)")).with_hint(RANKS_HINT)
            })
        })
        .collect::<Result<_>>()?;
    if let Some(b) = (0..=255u8).find(|b| !seen.contains(&vec![*b])) {
        return Err(Error::source(
            path,
            format!("has no token for the single byte 0x{b:02x}, so some text cannot be encoded"),
        )
        .with_hint(RANKS_HINT));
    }
    Ok(ranks)
}

/// The byte-level BPE equivalent to tiktoken over `ranks`: vocabulary = ranks, merges = every
/// split of each token into two tokens, ordered by the token's rank (then the parts' ranks), as
/// transformers' `TikTokenConverter.extract_vocab_merges_from_model` recovers them;
/// `ignore_merges` (a piece that is a token is that token, as tiktoken looks it up first).
pub(super) fn tiktoken_tokenizer(
    path: &Path,
    bytes: &[u8],
    config: Option<&Map<String, Value>>,
) -> Result<(Tokenizer, Vec<String>)> {
    let ranks = read_ranks(path, bytes)?;
    let chars = byte_chars();
    let show = |b: &[u8]| -> String { b.iter().map(|&x| chars[x as usize]).collect() };
    let index: HashMap<&[u8], usize> = ranks
        .iter()
        .enumerate()
        .map(|(r, t)| (t.as_slice(), r))
        .collect();
    let mut vocab = Map::new();
    let mut merges: Vec<(usize, usize, usize)> = Vec::new();
    for (r, t) in ranks.iter().enumerate() {
        vocab.insert(show(t), Value::from(r));
        let mut local: Vec<(usize, usize, usize)> = (1..t.len())
            .filter_map(|i| Some((*index.get(&t[..i])?, *index.get(&t[i..])?, r)))
            .collect();
        local.sort();
        merges.extend(local);
    }
    merges.sort_by_key(|m| m.2);
    let merges: Vec<Value> = merges
        .iter()
        .map(|&(a, b, _)| Value::from(vec![show(&ranks[a]), show(&ranks[b])]))
        .collect();
    let n = ranks.len();
    let decoder = config
        .and_then(|c| c.get("added_tokens_decoder"))
        .and_then(Value::as_object);
    let mut specials = Vec::with_capacity(KIMI_SPECIAL_TOKENS);
    let mut added = Vec::with_capacity(KIMI_SPECIAL_TOKENS);
    for id in n..n + KIMI_SPECIAL_TOKENS {
        let content = decoder
            .and_then(|d| d.get(&id.to_string()))
            .and_then(|t| t["content"].as_str())
            .map(String::from)
            .unwrap_or_else(|| format!("<|reserved_token_{id}|>"));
        added.push(serde_json::json!({
            "id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true,
        }));
        specials.push(content);
    }
    let spec = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": KIMI_PAT_STR}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
        ]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": true, "vocab": vocab, "merges": merges,
        },
    });
    let tok: Tokenizer = spec.to_string().parse().map_err(|e| {
        Error::source(path, format!("cannot be turned into a byte-level BPE: {e}"))
            .with_hint(RANKS_HINT)
    })?;
    Ok((tok, specials))
}

/// Python's `str.isspace` (what `tokenization_kimi.py` counts runs with): Unicode White_Space
/// plus the separators U+001C..U+001F.
fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Where `tokenization_kimi.py` cuts a text before tiktoken encodes each piece: after splitting
/// at special tokens (transformers' added-token split comes first), every 400 000 characters,
/// and inside runs of more than 25 000 whitespace or non-whitespace characters. Texts below
/// both limits are one piece.
pub(super) fn kimi_pieces<'t>(text: &'t str, specials: &[String]) -> Vec<&'t str> {
    let long = {
        let (mut n, mut run, mut prev) = (0usize, 0usize, None);
        let mut over = false;
        for c in text.chars() {
            n += 1;
            let s = py_isspace(c);
            run = if prev == Some(s) { run + 1 } else { 1 };
            prev = Some(s);
            if run > KIMI_MAX_RUN_CHARS || n > KIMI_MAX_ENCODE_CHARS {
                over = true;
                break;
            }
        }
        over
    };
    if !long {
        return vec![text];
    }
    // Split at the special tokens (longest match at the leftmost position).
    let mut segments: Vec<(&str, bool)> = Vec::new();
    let (mut start, mut i) = (0usize, 0usize);
    while i < text.len() {
        let hit = specials
            .iter()
            .filter(|s| !s.is_empty() && text[i..].starts_with(s.as_str()))
            .map(String::len)
            .max();
        if let Some(len) = hit {
            if start < i {
                segments.push((&text[start..i], false));
            }
            segments.push((&text[i..i + len], true));
            i += len;
            start = i;
        } else {
            i += text[i..].chars().next().map_or(1, char::len_utf8);
        }
    }
    if start < text.len() {
        segments.push((&text[start..], false));
    }
    let mut out = Vec::new();
    for (seg, special) in segments {
        if special {
            out.push(seg);
            continue;
        }
        // Every 400 000 characters, then each block by runs.
        let mut block_start = 0usize;
        let mut count = 0usize;
        let mut blocks = Vec::new();
        for (at, _) in seg.char_indices() {
            if count == KIMI_MAX_ENCODE_CHARS {
                blocks.push(&seg[block_start..at]);
                block_start = at;
                count = 0;
            }
            count += 1;
        }
        blocks.push(&seg[block_start..]);
        for b in blocks {
            let mut run = 0usize;
            let mut run_space = b.chars().next().is_some_and(py_isspace);
            let mut piece_start = 0usize;
            for (at, c) in b.char_indices() {
                let s = py_isspace(c);
                if s != run_space {
                    run = 1;
                    run_space = s;
                } else {
                    run += 1;
                    if run > KIMI_MAX_RUN_CHARS {
                        out.push(&b[piece_start..at]);
                        piece_start = at;
                        run = 1;
                    }
                }
            }
            out.push(&b[piece_start..]);
        }
    }
    out.retain(|p| !p.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_like_python() {
        assert_eq!(b64decode("IQ==").unwrap(), b"!");
        assert_eq!(b64decode("aGk=").unwrap(), b"hi");
        assert_eq!(b64decode("aGV5").unwrap(), b"hey");
        assert!(b64decode("aGk").is_none());
        assert!(b64decode("a=Gk").is_none());
        assert!(b64decode("").is_none());
    }

    #[test]
    fn byte_chars_are_gpt2s() {
        let c = byte_chars();
        assert_eq!(c[b' ' as usize], 'Ġ');
        assert_eq!(c[b'\n' as usize], 'Ċ');
        assert_eq!(c[b'a' as usize], 'a');
        assert_eq!(c[0], 'Ā');
        assert_eq!(c.iter().collect::<HashSet<_>>().len(), 256);
    }

    #[test]
    fn kimi_pieces_cut_long_runs_only() {
        assert_eq!(kimi_pieces("a b", &[]), vec!["a b"]);
        let long = "x".repeat(KIMI_MAX_RUN_CHARS + 5);
        let p = kimi_pieces(&long, &[]);
        assert_eq!(
            p.iter().map(|s| s.len()).collect::<Vec<_>>(),
            vec![KIMI_MAX_RUN_CHARS, 5]
        );
        // Below both limits: one piece, special tokens and all.
        let s = format!("{}<|s|>{}", "x".repeat(100), "x".repeat(100));
        assert_eq!(kimi_pieces(&s, &["<|s|>".into()]), vec![s.as_str()]);
        // A special token splits a run before it is counted (transformers splits at added
        // tokens first, then tokenization_kimi.py cuts each segment).
        let s = format!("{}<|s|>{}", "x".repeat(20_000), "x".repeat(20_000));
        let p = kimi_pieces(&s, &["<|s|>".into()]);
        assert_eq!(
            p.iter().map(|s| s.len()).collect::<Vec<_>>(),
            vec![20_000, 5, 20_000]
        );
        let s = format!("{}<|s|>{}", "x".repeat(20_000), "y".repeat(30_000));
        let p = kimi_pieces(&s, &["<|s|>".into()]);
        assert_eq!(
            p.iter().map(|s| s.len()).collect::<Vec<_>>(),
            vec![20_000, 5, 25_000, 5_000]
        );
    }
}
