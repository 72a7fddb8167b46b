//! `--prompts`: the JSON-lines records that give each connector file its prompt/continuation
//! split, category and ids, paired with the files, and each sample's metadata from them.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::Deserialize;

use super::files::{Checked, ConnFile};
use super::layout::TOKENS;
use crate::error::{Error, Result};
use crate::trace::file::SampleMeta;

/// One line of `--prompts` (other fields are ignored).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PromptRecord {
    /// The vLLM request id (matched against the file name).
    #[serde(default)]
    pub req_id: Option<serde_json::Value>,
    /// Used as the key when `req_id` is absent.
    #[serde(default)]
    pub id: Option<serde_json::Value>,
    /// Prompt tokens P; the rest of the sequence is the continuation.
    #[serde(default)]
    pub prompt_len: Option<usize>,
    /// The prompt's token ids, checked against the file (and giving P when `prompt_len` is absent).
    #[serde(default)]
    pub tokens: Option<Vec<u32>>,
    #[serde(default)]
    pub category: Option<String>,
    #[serde(default)]
    pub dataset: Option<String>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

impl PromptRecord {
    fn key(&self) -> Option<String> {
        let v = self.req_id.as_ref().or(self.id.as_ref())?;
        Some(match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }
}

/// Read `--prompts` (JSON lines; blank lines skipped).
pub fn read_prompts(path: &Path) -> Result<Vec<PromptRecord>> {
    let text =
        crate::io::text::read_regular_text(path, crate::io::text::MAX_PROMPTS, "prompt file")?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        out.push(serde_json::from_str(line).map_err(|e| Error::Source {
            path: path.into(),
            msg: format!("line {}: not a prompt record: {e}", i + 1),
            hint: Some(
                "one JSON object per line with prompt_len (or tokens), and optionally req_id or id, category, dataset, finish_reason".into(),
            ),
        })?);
    }
    Ok(out)
}

/// A record's `id` as a sample id: a whole number, or a string of digits.
fn whole_id(v: Option<&serde_json::Value>) -> Option<u64> {
    match v? {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            s.parse().ok()
        }
        _ => None,
    }
}

/// Pair files with `--prompts` records: by key (`req_id`, else `id`) when every record has one,
/// else in file order.
fn pair_prompts<'a>(
    path: &Path,
    recs: &'a [PromptRecord],
    files: &[ConnFile],
) -> Result<Vec<&'a PromptRecord>> {
    let keyed = recs.iter().filter(|r| r.key().is_some()).count();
    let perr = |msg: String| {
        Error::source(path, msg).with_hint("records are matched by req_id (or id) when every record has one, else line by line in file order")
    };
    if keyed == 0 {
        if recs.len() != files.len() {
            return Err(perr(format!(
                "has {} records but the directory has {} connector files",
                recs.len(),
                files.len()
            )));
        }
        return Ok(recs.iter().collect());
    }
    if keyed != recs.len() {
        return Err(perr(format!(
            "{keyed} of {} records have a req_id or id; give it on every line or on none",
            recs.len()
        )));
    }
    let mut by_key: HashMap<String, &PromptRecord> = HashMap::new();
    for r in recs {
        let k = r.key().unwrap();
        if by_key.insert(k.clone(), r).is_some() {
            return Err(perr(format!("two records have the key `{k}`")));
        }
    }
    let mut used = HashSet::new();
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        let hit = by_key
            .get(&f.req_id)
            .map(|r| (f.req_id.clone(), *r))
            .or_else(|| {
                let k = f.num?.to_string();
                by_key.get(&k).map(|r| (k, *r))
            });
        let Some((k, r)) = hit else {
            return Err(Error::source(
                &f.path,
                format!(
                    "has no record in `{}` (no req_id/id `{}`)",
                    path.display(),
                    f.req_id
                ),
            ));
        };
        if !used.insert(k.clone()) {
            return Err(perr(format!("record `{k}` matches two connector files")));
        }
        out.push(r);
    }
    if used.len() != recs.len() {
        let mut extra: Vec<&String> = by_key.keys().filter(|k| !used.contains(*k)).collect();
        extra.sort();
        return Err(perr(format!(
            "records {extra:?} have no connector file in the directory"
        )));
    }
    Ok(out)
}

/// Sample ids: the request numbers when they identify the files, else the file order.
fn request_ids(files: &[ConnFile]) -> Vec<u64> {
    let nums: Option<Vec<u64>> = files.iter().map(|f| f.num).collect();
    match nums {
        Some(v) if v.iter().collect::<HashSet<_>>().len() == v.len() => v,
        _ => (0..files.len() as u64).collect(),
    }
}

/// Each file's sample metadata, in file order. With `--prompts` (`prompts`), its records paired
/// with the files give the prompt/continuation split, category, dataset and finish reason, and,
/// when all carry distinct whole-number ids (the capture script writes the prompt file's own),
/// the sample ids: the trace then lines up, id for id, with a live run of the same prompt file.
/// Without, every sample has prompt_len 1 and `warnings` says so.
pub(super) fn samples(
    files: &[ConnFile],
    checked: &[Checked],
    prompts: Option<&Path>,
    warnings: &mut Vec<String>,
) -> Result<Vec<SampleMeta>> {
    let ids = request_ids(files);
    let Some(pfile) = prompts else {
        warnings.push(
            "no --prompts: the prompt/continuation split is unknown, so every sample is recorded with prompt_len 1 and `kquant verify` replays the whole sequence (prompt included); that compares two drafts fairly but is not the engine's accept length on the continuation".into(),
        );
        return Ok(checked
            .iter()
            .zip(ids)
            .map(|(c, id)| unsplit(id, c.tokens.len()))
            .collect());
    };
    let recs = read_prompts(pfile)?;
    let paired = pair_prompts(pfile, &recs, files)?;
    let own: Option<Vec<u64>> = paired.iter().map(|r| whole_id(r.id.as_ref())).collect();
    let ids = match own {
        Some(o) if o.iter().collect::<HashSet<_>>().len() == o.len() => o,
        _ => ids,
    };
    files
        .iter()
        .zip(checked)
        .zip(paired)
        .zip(ids)
        .map(|(((f, c), r), id)| split(pfile, f, c, r, id))
        .collect()
}

/// A sample whose split is unknown: the whole sequence after its first token is replayed.
fn unsplit(id: u64, t: usize) -> SampleMeta {
    SampleMeta {
        id,
        category: String::new(),
        dataset: String::new(),
        shard: String::new(),
        prompt_len: 1,
        gen_len: t - 1,
        finish_reason: "unknown".into(),
        turn: 0,
        stop_len: None,
        prompt_id: None,
    }
}

/// A sample split where its record `r` (of prompt file `pfile`) says, the record's prompt tokens
/// checked against the file's.
fn split(pfile: &Path, f: &ConnFile, c: &Checked, r: &PromptRecord, id: u64) -> Result<SampleMeta> {
    let t = c.tokens.len();
    let p = match (r.prompt_len, &r.tokens) {
        (Some(p), Some(tk)) if p != tk.len() => {
            return Err(Error::source(
                pfile,
                format!(
                    "the record for `{}` has prompt_len {p} but {} tokens",
                    f.req_id,
                    tk.len()
                ),
            ))
        }
        (Some(p), _) => p,
        (None, Some(tk)) => tk.len(),
        (None, None) => {
            return Err(Error::source(
                pfile,
                format!(
                    "the record for `{}` has neither prompt_len nor tokens",
                    f.req_id
                ),
            ))
        }
    };
    if p == 0 || p > t {
        return Err(Error::source(
            &f.path,
            format!("has {t} tokens but its --prompts record gives prompt_len {p}"),
        )
        .with_hint("prompt_len must be between 1 and the request's token count"));
    }
    if let Some(tk) = &r.tokens {
        if let Some(k) = (0..p).find(|&k| tk[k] != c.tokens[k]) {
            return Err(Error::Tensor {
                path: f.path.clone(),
                tensor: TOKENS.into(),
                msg: format!("differs from the prompt tokens of its --prompts record at position {k} ({} vs {})", c.tokens[k], tk[k]),
                hint: None,
            });
        }
    }
    Ok(SampleMeta {
        id,
        category: r.category.clone().unwrap_or_default(),
        dataset: r.dataset.clone().unwrap_or_default(),
        shard: String::new(),
        prompt_len: p,
        gen_len: t - p,
        finish_reason: r.finish_reason.clone().unwrap_or_else(|| "unknown".into()),
        turn: 0,
        stop_len: None,
        // A prompt id that is not a whole number (`HumanEval/0`) is kept: what a live run of
        // the same prompt file calls this request.
        prompt_id: match &r.id {
            Some(serde_json::Value::String(s)) if whole_id(r.id.as_ref()).is_none() => {
                Some(s.clone())
            }
            _ => None,
        },
    })
}
