//! `tokenizer`: a target's own tokenizer, loaded, and its chat template.
//!
//! Two tokenizer sources:
//! - **`tokenizer.json`** (Hugging Face `tokenizers`), loaded by the `tokenizers` crate. Plain
//!   text is encoded with the tokenizer's special tokens (its post-processor, e.g. a BOS), as
//!   transformers' `tokenizer(text)` and vLLM's completions endpoint do. `guards` refuses what
//!   the library would run wrongly (a pre-tokenizer regex that gives up, normalizers that grow a
//!   text without bound).
//! - **a tiktoken ranks file** (`tiktoken.model`), what the Kimi-K2.x repositories ship instead
//!   of a `tokenizer.json`: `tiktoken` turns it into the equivalent byte-level BPE with Kimi's
//!   pattern and special tokens, and cuts long texts where Kimi's tokenizer cuts them.
//!
//! `config` reads `tokenizer_config.json` beside it; `chat_template` renders the target's chat
//! template as transformers does (minijinja, bounded in work and memory).
//!
//! It knows nothing of traces: `crate::trace::prompts` (`kquant trace prompts`) uses it.

pub mod chat_template;
mod config;
mod guards;
pub mod tiktoken;

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;

pub use chat_template::ChatTemplate;
use guards::{check_splits, normalizer_growth_check, split_regexes};
use tiktoken::{kimi_pieces, tiktoken_tokenizer};

use crate::error::{Error, Result};

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
    /// The pre-tokenizer's regexes, in the order they split (`guards::split_regexes`).
    splits: Vec<(String, fancy_regex::Regex)>,
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
        let sha256 = crate::io::hash::hex(&Sha256::digest(&bytes));
        let config = config::read(file.parent().unwrap_or(Path::new(".")))?;
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
        ChatTemplate::find(
            self.file.parent().unwrap_or(Path::new(".")),
            self.config.as_ref(),
        )
    }
}
