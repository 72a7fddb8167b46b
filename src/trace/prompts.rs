//! `kquant trace prompts`: prompts given as text (or chat messages) turned into the token ids
//! `trace capture` and `trace import --prompts` read, with the target's own tokenizer.
//!
//! Two tokenizer sources:
//! - **`tokenizer.json`** (Hugging Face `tokenizers`), loaded by the `tokenizers` crate. Plain
//!   text is encoded with the tokenizer's special tokens (its post-processor, e.g. a BOS), as
//!   transformers' `tokenizer(text)` and vLLM's completions endpoint do.
//! - **a tiktoken ranks file** (`tiktoken.model`: `base64(token bytes) rank` per line), what the
//!   Kimi-K2.x repositories ship with `tokenization_kimi.py` instead of a `tokenizer.json`. It is
//!   turned into the equivalent byte-level BPE (the merges recovered from the ranks, as
//!   transformers' `TikTokenConverter` does), split by Kimi's pre-tokenizer pattern
//!   ([`KIMI_PAT_STR`]), with the 256 + 2 special tokens `tokenization_kimi.py` appends after the
//!   ranks (named by `tokenizer_config.json`'s `added_tokens_decoder`). Like its `encode`, special
//!   tokens written in the text are matched (`allowed_special="all"`), no BOS is added, and text
//!   is cut where Kimi's tokenizer cuts it (400 000 characters; runs of more than 25 000
//!   whitespace or non-whitespace characters).
//!
//! `--chat-template` renders the template (`chat_template.jinja` beside the tokenizer, else
//! `tokenizer_config.json`'s `chat_template`) with minijinja configured as transformers'
//! `apply_chat_template(messages, add_generation_prompt=True, tokenize=False)` configures Jinja2
//! (trim/lstrip blocks, loop controls, its `tojson`, `raise_exception`, `strftime_now`, the
//! named special tokens as variables), then encodes the result without adding special tokens
//! again, as transformers does.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;

use crate::error::{Error, Result};
use crate::io::output::{Claim, Kind};

/// Schema of each record `trace prompts` writes (and how `--force` knows the file is kquant's).
pub const SCHEMA: &str = "kquant.prompts/1";
/// Schema of `trace prompts --json`.
pub const REPORT_SCHEMA: &str = "kquant.trace-prompts/1";

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

/// How an existing `trace prompts -o` file is recognised as kquant's (its first record carries
/// [`SCHEMA`]).
pub const FILE_KIND: Kind = Kind::File {
    what: "tokenized prompts file",
    flag: "-o",
    is_ours,
};

fn is_ours(bytes: &[u8]) -> bool {
    let first = bytes
        .split(|&b| b == b'\n')
        .find(|l| !l.iter().all(u8::is_ascii_whitespace));
    first
        .and_then(|l| serde_json::from_slice::<Value>(l).ok())
        .is_some_and(|v| v["schema"].as_str() == Some(SCHEMA))
}

/// Where the tokenizer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerKind {
    /// A Hugging Face `tokenizer.json`.
    TokenizerJson,
    /// A tiktoken ranks file with Kimi's pattern and special tokens.
    Tiktoken,
}

impl TokenizerKind {
    pub fn name(self) -> &'static str {
        match self {
            TokenizerKind::TokenizerJson => "tokenizer.json",
            TokenizerKind::Tiktoken => "tiktoken",
        }
    }
}

/// A target's tokenizer, loaded.
pub struct TargetTokenizer {
    pub tok: Tokenizer,
    pub kind: TokenizerKind,
    /// `tokenizer.json` or the ranks file.
    pub file: PathBuf,
    /// sha256 of [`file`](Self::file) (what `trace capture` records as `tokenizer_sha256`).
    pub sha256: String,
    /// `tokenizer_config.json` beside it, when there is one.
    pub config: Option<(PathBuf, Map<String, Value>)>,
    /// Special tokens (tiktoken only: where Kimi's long-text cutting must not cut).
    specials: Vec<String>,
    /// The pre-tokenizer's regexes, in the order they split ([`split_regexes`]).
    splits: Vec<(String, fancy_regex::Regex)>,
}

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
/// change silently. [`TargetTokenizer::encode`] runs the same regexes first and fails instead.
fn split_regexes(pre: Option<&Value>) -> Vec<(String, fancy_regex::Regex)> {
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
fn check_splits(
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

fn sha256_hex(bytes: &[u8]) -> String {
    crate::io::hash::hex(&Sha256::digest(bytes))
}

const TOKENIZER_HINT: &str = "give the target checkpoint directory (holding tokenizer.json, or tiktoken.model for Kimi-K2.x), or the tokenizer file itself";

impl TargetTokenizer {
    /// Open `--tokenizer`: a directory holding `tokenizer.json` (preferred) or `tiktoken.model`,
    /// or one of those files (a `.json` file is read as `tokenizer.json`, anything else as a
    /// tiktoken ranks file).
    pub fn open(path: &Path) -> Result<TargetTokenizer> {
        let meta = std::fs::metadata(path).map_err(|e| Error::Source {
            path: path.into(),
            msg: format!("cannot read the tokenizer: {e}"),
            hint: Some(TOKENIZER_HINT.into()),
        })?;
        let (file, kind) = if meta.is_dir() {
            let j = path.join("tokenizer.json");
            let t = path.join("tiktoken.model");
            if j.is_file() {
                (j, TokenizerKind::TokenizerJson)
            } else if t.is_file() {
                (t, TokenizerKind::Tiktoken)
            } else {
                return Err(Error::source(
                    path,
                    "holds neither `tokenizer.json` nor `tiktoken.model`",
                )
                .with_hint(TOKENIZER_HINT));
            }
        } else if path.extension().is_some_and(|e| e == "json") {
            (path.to_path_buf(), TokenizerKind::TokenizerJson)
        } else {
            (path.to_path_buf(), TokenizerKind::Tiktoken)
        };
        let bytes =
            crate::io::text::read_regular(&file, crate::io::text::MAX_TOKENIZER, "tokenizer")?;
        let sha256 = sha256_hex(&bytes);
        let config = read_config(file.parent().unwrap_or(Path::new(".")))?;
        let (tok, specials) = match kind {
            TokenizerKind::TokenizerJson => (
                {
                    normalizer_growth_check(&file, &bytes)?;
                    Tokenizer::from_bytes(&bytes)
                }
                .map_err(|e| {
                    Error::source(&file, format!("is not a tokenizer.json the `tokenizers` library reads: {e}")).with_hint("save it with transformers' `save_pretrained` or tokenizers' `Tokenizer.save`")
                })?,
                vec![],
            ),
            TokenizerKind::Tiktoken => {
                tiktoken_tokenizer(&file, &bytes, config.as_ref().map(|(_, c)| c))?
            }
        };
        let splits = split_regexes(
            serde_json::to_value(tok.get_pre_tokenizer())
                .ok()
                .as_ref()
                .filter(|v| !v.is_null()),
        );
        Ok(TargetTokenizer {
            tok,
            kind,
            file,
            sha256,
            config,
            specials,
            splits,
        })
    }

    /// Token ids of `text`. `add_special_tokens`: the tokenizer's post-processor (BOS …) for a
    /// `tokenizer.json`; a tiktoken tokenizer adds none either way, as Kimi's does.
    pub fn encode(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> std::result::Result<Vec<u32>, String> {
        match self.kind {
            TokenizerKind::TokenizerJson => {
                let normalized = match self.tok.get_normalizer() {
                    None => None,
                    Some(n) => {
                        let mut ns = tokenizers::NormalizedString::from(text);
                        tokenizers::Normalizer::normalize(n, &mut ns).map_err(|e| e.to_string())?;
                        Some(ns.get().to_string())
                    }
                };
                check_splits(&self.splits, normalized.as_deref().unwrap_or(text))?;
                Ok(self
                    .tok
                    .encode(text, add_special_tokens)
                    .map_err(|e| e.to_string())?
                    .get_ids()
                    .to_vec())
            }
            TokenizerKind::Tiktoken => {
                let mut ids = Vec::new();
                for piece in kimi_pieces(text, &self.specials) {
                    check_splits(&self.splits, piece)?;
                    ids.extend_from_slice(
                        self.tok
                            .encode(piece, false)
                            .map_err(|e| e.to_string())?
                            .get_ids(),
                    );
                }
                Ok(ids)
            }
        }
    }

    /// The chat template transformers would use: `chat_template.jinja` beside the tokenizer,
    /// else `tokenizer_config.json`'s `chat_template` (a string, or a list of named templates
    /// of which `default` is taken).
    pub fn chat_template(&self) -> Result<ChatTemplate> {
        let dir = self.file.parent().unwrap_or(Path::new("."));
        let jinja = dir.join("chat_template.jinja");
        let special = special_tokens_map(self.config.as_ref().map(|(_, c)| c));
        if jinja.is_file() {
            let text = crate::io::text::read_regular_text(
                &jinja,
                crate::io::text::MAX_CONFIG,
                "chat template",
            )?;
            return Ok(ChatTemplate::new(jinja, text, special));
        }
        let no = |msg: String| {
            Error::source(dir, msg).with_hint("--chat-template needs the target's chat template (chat_template.jinja, or `chat_template` in tokenizer_config.json); without it, give plain `text` records and leave --chat-template off")
        };
        let Some((cpath, c)) = &self.config else {
            return Err(no(
                "has no tokenizer_config.json and no chat_template.jinja".into(),
            ));
        };
        let text = match c.get("chat_template") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str())
                .map(String::from)
                .ok_or_else(|| {
                    Error::source(
                        cpath,
                        "`chat_template` is a list of named templates without a `default`",
                    )
                    .with_hint(CONFIG_HINT)
                })?,
            _ => {
                return Err(no(format!(
                    "has no chat template (no chat_template.jinja, no `chat_template` in `{}`)",
                    cpath.display()
                )))
            }
        };
        Ok(ChatTemplate::new(cpath.clone(), text, special))
    }
}

const CONFIG_HINT: &str = "tokenizer_config.json must be the JSON object transformers writes";

/// `tokenizer_config.json` in `dir`, if there is one (a JSON object).
fn read_config(dir: &Path) -> Result<Option<(PathBuf, Map<String, Value>)>> {
    let p = dir.join("tokenizer_config.json");
    if !p.is_file() {
        return Ok(None);
    }
    let bytes = crate::io::text::read_regular(&p, crate::io::text::MAX_CONFIG, "tokenizer config")?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => Ok(Some((p, m))),
        Ok(_) => Err(Error::source(&p, "is not a JSON object").with_hint(CONFIG_HINT)),
        Err(e) => Err(Error::source(&p, format!("is not JSON: {e}")).with_hint(CONFIG_HINT)),
    }
}

/// The named special tokens transformers passes to a chat template (`special_tokens_map`:
/// `bos_token`, `eos_token`, …; a string or an `AddedToken` object in the config).
fn special_tokens_map(config: Option<&Map<String, Value>>) -> Vec<(String, String)> {
    const NAMED: [&str; 7] = [
        "bos_token",
        "eos_token",
        "unk_token",
        "sep_token",
        "pad_token",
        "cls_token",
        "mask_token",
    ];
    let Some(c) = config else { return vec![] };
    NAMED
        .iter()
        .filter_map(|k| {
            let v = match c.get(*k)? {
                Value::String(s) => s.clone(),
                Value::Object(o) => o.get("content")?.as_str()?.to_string(),
                _ => return None,
            };
            Some((k.to_string(), v))
        })
        .collect()
}

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
fn tiktoken_tokenizer(
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
fn kimi_pieces<'t>(text: &'t str, specials: &[String]) -> Vec<&'t str> {
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

/// A chat template, ready to render.
pub struct ChatTemplate {
    /// `chat_template.jinja` or `tokenizer_config.json`.
    pub source: PathBuf,
    pub text: String,
    pub sha256: String,
    /// `bos_token`, `eos_token`, … as transformers passes them.
    special: Vec<(String, String)>,
}

/// The most a tokenizer's normalizers may multiply a text's length by.
pub const MAX_NORMALIZER_GROWTH: f64 = 64.0;

/// Refuse a `tokenizer.json` whose normalizers can multiply a text's length beyond
/// [`MAX_NORMALIZER_GROWTH`] (chained `Replace` normalizers each lengthening what they replace
/// turn one character into 10^12): bounded before the `tokenizers` library ever runs them.
/// Growth of a `Replace` is its content's length over its string pattern's (a regex pattern
/// counts as matching one character); a `Sequence` multiplies its members'.
fn normalizer_growth_check(file: &Path, bytes: &[u8]) -> Result<()> {
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

impl ChatTemplate {
    fn new(source: PathBuf, text: String, special: Vec<(String, String)>) -> ChatTemplate {
        ChatTemplate {
            source,
            sha256: sha256_hex(text.as_bytes()),
            text,
            special,
        }
    }

    /// Instructions one rendering may take: real chat templates take about 10⁴ per message.
    pub const TEMPLATE_FUEL: u64 = 50_000_000;

    /// Bytes one rendering may hold at once (`io::budget`): real ones hold a few hundred KiB.
    pub const TEMPLATE_BYTES: usize = 256 << 20;

    /// The widest `tojson(indent=…)` a template may ask for.
    pub const MAX_TOJSON_INDENT: usize = 64;

    /// A minijinja environment set up as transformers sets up Jinja2 for chat templates.
    pub fn environment() -> minijinja::Environment<'static> {
        let mut env = minijinja::Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .expect("default delimiters"),
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // A template is code from the target's repository: bounded in work, so a hostile or
        // careless one (two nested `range(100000)` loops) is an error, not hours of rendering.
        env.set_fuel(Some(Self::TEMPLATE_FUEL));
        env.add_filter("tojson", tojson);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    format!("the chat template raised: {msg}"),
                ))
            },
        );
        env.add_function("strftime_now", strftime_now);
        env
    }

    /// Render `messages` (a JSON array of message objects) with `add_generation_prompt=True`,
    /// as `apply_chat_template(messages, add_generation_prompt=True, tokenize=False)` does:
    /// keys whose value is null are dropped, reasoning fields aliased, `tools` and `documents`
    /// none, the named special tokens defined.
    pub fn render(
        &self,
        tmpl: &minijinja::Template<'_, '_>,
        messages: &[Value],
    ) -> std::result::Result<String, String> {
        let msgs: Vec<Value> = messages.iter().map(plain_message).collect();
        let mut ctx: Map<String, Value> = self
            .special
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        ctx.insert("messages".into(), Value::from(msgs));
        ctx.insert("tools".into(), Value::Null);
        ctx.insert("documents".into(), Value::Null);
        ctx.insert("add_generation_prompt".into(), Value::Bool(true));
        let ctx: minijinja::Value =
            serde_json::from_value(Value::Object(ctx)).map_err(|e| e.to_string())?;
        let rendered = crate::io::budget::within(
            Self::TEMPLATE_BYTES,
            &format!(
                "`{}`: the chat template needs more than {} MiB of memory to render one prompt",
                self.source.display(),
                Self::TEMPLATE_BYTES >> 20
            ),
            "real chat templates build a few kilobytes a message; this one grows strings or \
             lists without bound (doubling them in a loop): fix the template, or leave out \
             --chat-template to encode the prompts' text as it is",
            || tmpl.render(ctx),
        );
        rendered.map_err(|e| {
            let mut s = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(c) = src {
                s.push_str(&format!(": {c}"));
                src = c.source();
            }
            s
        })
    }
}

/// A message as transformers hands it to the template: keys whose value is null dropped, and
/// `reasoning_content` / `thinking` filled from whichever reasoning field is given.
fn plain_message(m: &Value) -> Value {
    let Value::Object(o) = m else {
        return m.clone();
    };
    let o: Map<String, Value> = o
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let reasoning = ["reasoning_content", "thinking", "reasoning"]
        .iter()
        .find_map(|k| o.get(*k).cloned());
    match reasoning {
        None => Value::Object(o),
        Some(r) => {
            let mut out = Map::new();
            out.insert("thinking".into(), r.clone());
            for (k, v) in o {
                out.insert(k, v);
            }
            out.insert("reasoning_content".into(), r);
            Value::Object(out)
        }
    }
}

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`.
fn tojson(
    v: minijinja::Value,
    kwargs: minijinja::value::Kwargs,
) -> std::result::Result<minijinja::Value, minijinja::Error> {
    let indent: Option<minijinja::Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<minijinja::Value> = kwargs.get("separators")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(i) if i.is_none() => None,
        Some(i) => Some(match i.as_str() {
            Some(s) if s.len() <= ChatTemplate::MAX_TOJSON_INDENT => s.to_string(),
            Some(_) => {
                return Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    format!(
                        "tojson: an indent longer than {} characters",
                        ChatTemplate::MAX_TOJSON_INDENT
                    ),
                ))
            }
            None => {
                let n = usize::try_from(i.clone()).map_err(|_| {
                    minijinja::Error::new(
                        minijinja::ErrorKind::InvalidOperation,
                        "tojson: indent must be an integer or a string",
                    )
                })?;
                if n > ChatTemplate::MAX_TOJSON_INDENT {
                    return Err(minijinja::Error::new(
                        minijinja::ErrorKind::InvalidOperation,
                        format!(
                            "tojson: indent {n} is wider than {}",
                            ChatTemplate::MAX_TOJSON_INDENT
                        ),
                    ));
                }
                " ".repeat(n)
            }
        }),
    };
    let (item, key) = match separators {
        Some(s) if !s.is_none() => {
            let parts: Vec<String> = s
                .try_iter()?
                .map(|p| p.as_str().map(String::from))
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    minijinja::Error::new(
                        minijinja::ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    )
                })?;
            match <[String; 2]>::try_from(parts) {
                Ok([a, b]) => (a, b),
                Err(_) => {
                    return Err(minijinja::Error::new(
                        minijinja::ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ))
                }
            }
        }
        _ => (
            if indent.is_some() {
                ",".into()
            } else {
                ", ".into()
            },
            ": ".into(),
        ),
    };
    let j: Value = serde_json::to_value(&v).map_err(|e| {
        minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string())
    })?;
    let mut out = String::new();
    py_dumps(
        &j,
        indent.as_deref(),
        &item,
        &key,
        sort_keys.unwrap_or(false),
        0,
        &mut out,
    );
    Ok(minijinja::Value::from(out))
}

/// Python's `json.dumps` layout (ensure_ascii=False).
fn py_dumps(
    v: &Value,
    indent: Option<&str>,
    item: &str,
    key: &str,
    sort: bool,
    depth: usize,
    out: &mut String,
) {
    let nl = |out: &mut String, d: usize| {
        if let Some(ind) = indent {
            out.push('\n');
            for _ in 0..d {
                out.push_str(ind);
            }
        }
    };
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
                // Python's float repr: shortest round-trip, always with a '.' or exponent.
                let s = format!("{f:?}");
                out.push_str(&s);
            } else {
                out.push_str(&n.to_string());
            }
        }
        Value::String(s) => py_str(s, out),
        Value::Array(a) => {
            if a.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(item);
                }
                nl(out, depth + 1);
                py_dumps(x, indent, item, key, sort, depth + 1, out);
            }
            nl(out, depth);
            out.push(']');
        }
        Value::Object(o) => {
            if o.is_empty() {
                out.push_str("{}");
                return;
            }
            let mut entries: Vec<(&String, &Value)> = o.iter().collect();
            if sort {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, x)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item);
                }
                nl(out, depth + 1);
                py_str(k, out);
                out.push_str(key);
                py_dumps(x, indent, item, key, sort, depth + 1, out);
            }
            nl(out, depth);
            out.push('}');
        }
    }
}

/// A JSON string as Python's `json.dumps(ensure_ascii=False)` writes it.
fn py_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// transformers' `strftime_now(format)`: the local time, formatted by the C library.
fn strftime_now(format: String) -> std::result::Result<String, minijinja::Error> {
    let fmt = std::ffi::CString::new(format).map_err(|_| {
        minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            "strftime_now: NUL in the format",
        )
    })?;
    // SAFETY: `time`, `localtime_r` and `strftime` get valid pointers to local buffers; the
    // output buffer's size is passed.
    unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        let mut buf = vec![0u8; 512];
        let n = libc::strftime(buf.as_mut_ptr().cast(), buf.len(), fmt.as_ptr(), &tm);
        buf.truncate(n);
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
}

/// What to tokenize.
#[derive(Debug, Clone)]
pub struct Options {
    pub tokenizer: PathBuf,
    pub input: PathBuf,
    pub output: PathBuf,
    pub chat_template: bool,
    pub force: bool,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct Summary {
    pub records: usize,
    pub tokens: usize,
    pub kind: TokenizerKind,
    pub tokenizer_file: PathBuf,
    pub tokenizer_sha256: String,
    /// (source, sha256) of the chat template used.
    pub chat_template: Option<(PathBuf, String)>,
    /// Whether plain text got the tokenizer's special tokens (post-processor).
    pub add_special_tokens: bool,
    pub warnings: Vec<String>,
}

const RECORD_HINT: &str = "one JSON object per line: {\"id\", \"dataset\", \"category\", \"text\"} (or chat `messages` with --chat-template)";

/// Tokenize `o.input` into `o.output` (claimed first; written as a staging file, renamed into
/// place at the end, so a bad record leaves nothing under the output name).
pub fn run(o: &Options) -> Result<Summary> {
    let tk = TargetTokenizer::open(&o.tokenizer)?;
    let mut sources = vec![o.input.clone(), tk.file.clone()];
    if let Some((p, _)) = &tk.config {
        sources.push(p.clone());
    }
    let template = if o.chat_template {
        Some(tk.chat_template()?)
    } else {
        None
    };
    if let Some(t) = &template {
        sources.push(t.source.clone());
    }
    let claim = Claim::new(&o.output, FILE_KIND, o.force, &sources)?;
    let env = ChatTemplate::environment();
    let compiled = match &template {
        Some(t) => Some(env.template_from_str(&t.text).map_err(|e| {
            Error::source(&t.source, format!("the chat template does not compile: {e}")).with_hint("kquant renders chat templates with minijinja (Jinja2 syntax, as transformers configures it)")
        })?),
        None => None,
    };
    let add_special_tokens = template.is_none();
    let input =
        crate::io::text::open_regular(&o.input, crate::io::text::MAX_PROMPTS, "prompt file")?;
    let staging = claim.staging().to_path_buf();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&staging)
        .map_err(|e| Error::io("create", &staging, e))?;
    let mut w = std::io::BufWriter::new(f);
    let mut ids_seen: HashSet<String> = HashSet::new();
    let (mut records, mut tokens) = (0usize, 0usize);
    let mut warnings = Vec::new();
    for (i, line) in std::io::BufReader::new(input).lines().enumerate() {
        let at = PathBuf::from(format!("{}:{}", o.input.display(), i + 1));
        let bad = |msg: String| Error::source(&at, msg).with_hint(RECORD_HINT);
        let line = line.map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => bad("is not UTF-8".into()),
            _ => Error::io("read", &o.input, e),
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&line).map_err(|e| bad(format!("not JSON: {e}")))?;
        let Value::Object(rec) = v else {
            return Err(bad("is not a JSON object".into()));
        };
        let text = match rec.get("text") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.as_str()),
            Some(_) => return Err(bad("`text` is not a string".into())),
        };
        let messages = match rec.get("messages") {
            None | Some(Value::Null) => None,
            Some(Value::Array(a)) => Some(a),
            Some(_) => return Err(bad("`messages` is not a list of messages".into())),
        };
        let rendered: String;
        let (to_encode, chat) = match (text, messages, &template) {
            (Some(_), Some(_), _) => {
                return Err(bad("has both `text` and `messages`; give one".into()))
            }
            (None, None, _) => {
                return Err(bad(if rec.contains_key("tokens") {
                    "has `tokens` but no `text`: it is tokenized already (trace capture and trace import read it as it is)".into()
                } else {
                    "has no `text` (or `messages`)".into()
                }))
            }
            (Some(""), None, _) => return Err(bad("`text` is empty".into())),
            (None, Some(_), None) => {
                return Err(Error::Source {
                    path: at.clone(),
                    msg: "has chat `messages`, which need the target's chat template".into(),
                    hint: Some("pass --chat-template".into()),
                })
            }
            (None, Some(m), Some(_)) if m.is_empty() => {
                return Err(bad("`messages` is empty".into()))
            }
            (Some(t), None, None) => (t, false),
            (t, m, Some(tpl)) => {
                let owned;
                let msgs: &[Value] = match (t, m) {
                    (Some(t), _) => {
                        owned = vec![serde_json::json!({"role": "user", "content": t})];
                        &owned
                    }
                    (None, Some(m)) => m,
                    (None, None) => unreachable!(),
                };
                if let Some(k) = msgs.iter().position(|m| !m.is_object()) {
                    return Err(bad(format!("message {k} is not a JSON object")));
                }
                rendered = tpl
                    .render(compiled.as_ref().expect("compiled with the template"), msgs)
                    .map_err(|e| {
                        Error::Source {
                            path: at.clone(),
                            msg: format!("the chat template fails on this record: {e}"),
                            hint: Some(if e.contains("ran out of fuel") {
                                format!(
                                    "the template `{}` did not finish within {} instructions (real chat templates take about 10^4 a message): it loops far more than a template should",
                                    tpl.source.display(),
                                    ChatTemplate::TEMPLATE_FUEL
                                )
                            } else {
                                format!(
                                    "the template is `{}`; check the record's messages (role, content) against what it expects",
                                    tpl.source.display()
                                )
                            }),
                        }
                    })?;
                (rendered.as_str(), true)
            }
        };
        let ids = tk
            .encode(to_encode, add_special_tokens && !chat)
            .map_err(|e| {
                let backtrack = e.contains("pre-tokenizer pattern");
                let err = bad(format!("cannot be tokenized: {e}"));
                if backtrack {
                    err.with_hint("the regex backtracks without bound on this text (fancy-regex stops after 1 000 000 steps): tokenize it with the target's own tokenizer in Python and give `tokens`, or fix the pattern in tokenizer.json")
                } else {
                    err
                }
            })?;
        if ids.is_empty() {
            return Err(bad("tokenizes to no tokens".into()));
        }
        let id = match rec.get("id") {
            None | Some(Value::Null) => Value::from(records),
            Some(v @ (Value::String(_) | Value::Number(_))) => v.clone(),
            Some(_) => return Err(bad("`id` is not a string or a number".into())),
        };
        let key = match &id {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        if !ids_seen.insert(key.clone()) {
            return Err(bad(format!("id `{key}` appears twice")));
        }
        let mut out = Map::new();
        out.insert("schema".into(), SCHEMA.into());
        out.insert("id".into(), id);
        for k in ["dataset", "category"] {
            match rec.get(k) {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) => {
                    out.insert(k.into(), s.clone().into());
                }
                Some(_) => return Err(bad(format!("`{k}` is not a string"))),
            }
        }
        if let Some(t) = rec.get("turn").filter(|t| t.is_u64()) {
            out.insert("turn".into(), t.clone());
        }
        out.insert("prompt_len".into(), ids.len().into());
        out.insert("tokens".into(), ids.clone().into());
        serde_json::to_writer(&mut w, &Value::Object(out))
            .map_err(std::io::Error::from)
            .and_then(|_| w.write_all(b"\n"))
            .map_err(|e| Error::io("write", &staging, e))?;
        records += 1;
        tokens += ids.len();
    }
    if records == 0 {
        return Err(Error::source(&o.input, "holds no records").with_hint(RECORD_HINT));
    }
    let f = w
        .into_inner()
        .map_err(|e| Error::io("write", &staging, e.into_error()))?;
    f.sync_all().map_err(|e| Error::io("fsync", &staging, e))?;
    drop(f);
    if tk.kind == TokenizerKind::TokenizerJson && add_special_tokens {
        if let Some(pp) = tk.tok.get_post_processor() {
            let added = tokenizers::tokenizer::PostProcessor::added_tokens(pp, false);
            if added > 0 {
                warnings.push(format!(
                    "the tokenizer's post-processor adds {added} special token(s) to each prompt (e.g. BOS), as transformers' `tokenizer(text)` and vLLM's completions endpoint do"
                ));
            }
        }
    }
    drop(compiled);
    claim.commit()?;
    Ok(Summary {
        records,
        tokens,
        kind: tk.kind,
        tokenizer_file: tk.file.clone(),
        tokenizer_sha256: tk.sha256.clone(),
        chat_template: template.map(|t| (t.source, t.sha256)),
        add_special_tokens,
        warnings,
    })
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

    #[test]
    fn python_json_dumps_layout() {
        let v = serde_json::json!({"b": [1, 2.5, "é\n"], "a": {}, "c": null});
        let mut s = String::new();
        py_dumps(&v, None, ", ", ": ", false, 0, &mut s);
        assert_eq!(s, r#"{"b": [1, 2.5, "é\n"], "a": {}, "c": null}"#);
        let mut s = String::new();
        py_dumps(&v, Some("  "), ",", ": ", true, 0, &mut s);
        assert_eq!(
            s,
            "{\n  \"a\": {},\n  \"b\": [\n    1,\n    2.5,\n    \"é\\n\"\n  ],\n  \"c\": null\n}"
        );
    }
}
