//! `kquant trace import --format vllm-hidden-states`: turn what vLLM's `extract_hidden_states`
//! speculator and `ExampleHiddenStatesConnector` write (one `{req_id}.safetensors` per request,
//! holding `hidden_states` and `token_ids`) into a `kquant-trace/1`.
//!
//! The facts this rests on are in docs/verify.md, "Importing vLLM hidden states":
//! - the tap ids are the ones given to vLLM (`eagle_aux_hidden_state_layer_ids`); vLLM's id k is
//!   captured before block k, i.e. HF `hidden_states[k]`, and id L (= `num_hidden_layers`) is
//!   the last block's output before the final norm, which is what a trace's `hs[L]` means;
//! - vLLM appends the taps as its layer loop passes them, so slot j of the stack holds the j-th
//!   smallest id, whatever order the ids were given in;
//! - older vLLM stacks them `[n_taps, T, H]` ("taps-first"), current vLLM writes
//!   `[T, n_taps, H]` ("tokens-first"); the layout is told from the shapes.
//!
//! The import streams: a first pass checks every file's header, shapes, dtypes and token ids
//! (no values read), then the values are converted request by request, in the trace's write
//! order, and checked finite as they are written through [`TraceWriter`] (one request's file
//! mapped at a time, one piece of one tap in memory). The trace is built in the claim's staging
//! directory and renamed into place at the end, so a bad value leaves no output.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::checkpoint::Family;
use crate::error::{Error, Result};
use crate::io::{Dtype, Shard};
use crate::target::Profile;
use crate::trace::file::{self, Entry, Manifest, SampleMeta, SampleSpec, TraceWriter};

/// The tensor holding the stacked taps.
pub const HIDDEN: &str = "hidden_states";
/// The tensor holding the request's token ids.
pub const TOKENS: &str = "token_ids";

/// How the taps are stacked in `hidden_states`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `[n_taps, T, H]`: vLLM's first connector (`torch.stack(…, dim=0)`).
    TapsFirst,
    /// `[T, n_taps, H]`: current vLLM (the KV-cache rows, one "head" per tap).
    TokensFirst,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::TapsFirst => "taps-first",
            Layout::TokensFirst => "tokens-first",
        }
    }

    fn shape(self, n: usize, t: usize, h: usize) -> [usize; 3] {
        match self {
            Layout::TapsFirst => [n, t, h],
            Layout::TokensFirst => [t, n, h],
        }
    }

    /// Offset of row (slot `j`, position `t`) in a stack of `n` taps over `len` tokens.
    fn row(self, j: usize, t: usize, n: usize, len: usize) -> usize {
        match self {
            Layout::TapsFirst => j * len + t,
            Layout::TokensFirst => t * n + j,
        }
    }
}

/// The HF `hidden_states` index vLLM's tap id `id` captures on an `num_layers`-block target:
/// `hs[id]` (id k is taken before block k; id L after the last block, before the final norm).
/// `None` past `hs[L]`.
pub fn vllm_id_to_hs(id: usize, num_layers: usize) -> Option<usize> {
    (id <= num_layers).then_some(id)
}

/// The tap each slot of vLLM's stack holds, as HF indices: the ids sorted ascending (vLLM
/// appends taps as its layer loop passes them). Refuses repeated ids and ids past `hs[L]`.
pub fn tap_slots(ids: &[usize], num_layers: usize) -> Result<Vec<usize>> {
    if ids.is_empty() {
        return Err(Error::Usage("--layer-ids is empty".into()));
    }
    let mut seen = HashSet::new();
    let mut hs = Vec::with_capacity(ids.len());
    for &id in ids {
        if !seen.insert(id) {
            return Err(Error::Usage(format!(
                "--layer-ids lists {id} twice; vLLM captures a layer once, so the files would hold fewer taps than ids"
            )));
        }
        hs.push(vllm_id_to_hs(id, num_layers).ok_or_else(|| {
            Error::Usage(format!(
                "--layer-ids {id} is past the last hidden state of a {num_layers}-layer target (vLLM id {num_layers} is the last block's output)"
            ))
        })?);
    }
    hs.sort_unstable();
    Ok(hs)
}

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

/// What to import.
#[derive(Debug, Clone)]
pub struct Options {
    /// The connector's `shared_storage_path`.
    pub dir: PathBuf,
    pub out: PathBuf,
    /// The ids given to vLLM, in the order given.
    pub layer_ids: Vec<usize>,
    /// `None`: tell it from the shapes.
    pub layout: Option<Layout>,
    pub prompts: Option<PathBuf>,
    /// Expected hidden size, checked against every file.
    pub hidden_size: Option<usize>,
    pub num_layers: usize,
    /// Tokens must be below it when known.
    pub vocab_size: Option<usize>,
    /// The manifest's `target` object (name, HF id, …); the import's own record is added to it.
    pub target: serde_json::Value,
    pub force: bool,
    /// Check everything (the values too) and write nothing.
    pub dry_run: bool,
}

/// What the user asked `trace import` for: [`Options`] before the flags are checked against
/// the target profile.
#[derive(Debug, Clone)]
pub struct Request {
    pub dir: PathBuf,
    pub out: PathBuf,
    pub layer_ids: Vec<usize>,
    pub layout: Option<Layout>,
    pub prompts: Option<PathBuf>,
    pub hidden_size: Option<usize>,
    pub num_layers: Option<usize>,
    /// The target profile (`--target`): the shape checked, the taps each family reads.
    pub target: Option<Profile>,
    pub force: bool,
    pub dry_run: bool,
}

/// A flag's value and the profile's, which must agree when both are given.
fn agree(
    what: &str,
    flag: Option<usize>,
    prof: Option<usize>,
    name: &str,
) -> Result<Option<usize>> {
    match (flag, prof) {
        (Some(a), Some(b)) if a != b => Err(Error::Usage(format!(
            "--{what} {a} disagrees with target profile `{name}` ({b})"
        ))),
        (a, b) => Ok(a.or(b)),
    }
}

impl Options {
    /// The options for `req`: `--num-layers` and `--hidden-size` checked against the profile
    /// (the layer count is required from one of them), the vocabulary and the manifest's
    /// `target` record from the profile.
    pub fn resolve(req: &Request) -> Result<Options> {
        let t = req.target.as_ref();
        let pname = t.map_or("", |p| p.name.as_str());
        let num_layers = agree(
            "num-layers",
            req.num_layers,
            t.and_then(|p| p.num_layers.known().copied()),
            pname,
        )?
        .ok_or_else(|| {
            Error::Usage(
                "the target's layer count is needed to read vLLM's tap ids: pass --target PROFILE (see `kquant targets`) or --num-layers L".into(),
            )
        })?;
        let hidden_size = agree(
            "hidden-size",
            req.hidden_size,
            t.and_then(|p| p.hidden_size.known().copied()),
            pname,
        )?;
        let target = match t {
            Some(p) => serde_json::json!({"name": p.name, "hf_id": p.hf_id, "engine": "vllm"}),
            None => serde_json::json!({"engine": "vllm"}),
        };
        Ok(Options {
            dir: req.dir.clone(),
            out: req.out.clone(),
            layer_ids: req.layer_ids.clone(),
            layout: req.layout,
            prompts: req.prompts.clone(),
            hidden_size,
            num_layers,
            vocab_size: t.and_then(|p| p.vocab_size.known().copied()),
            target,
            force: req.force,
            dry_run: req.dry_run,
        })
    }
}

/// Whether an imported trace holds the taps a draft family of the target reads.
#[derive(Debug, Clone)]
pub struct Coverage {
    pub family: Family,
    pub taps: Vec<usize>,
    /// Those of `taps` the trace lacks.
    pub missing: Vec<usize>,
    /// The `--layer-ids` that capture the family's taps.
    pub vllm_ids: Vec<usize>,
}

/// Each draft family of the target against the taps imported (none without a profile).
pub fn coverage(target: Option<&Profile>, taps: &[usize]) -> Vec<Coverage> {
    target
        .iter()
        .flat_map(|t| t.taps.known())
        .map(|(family, f)| Coverage {
            family,
            taps: f.hs.clone(),
            missing: f.hs.iter().copied().filter(|h| !taps.contains(h)).collect(),
            vllm_ids: f.vllm_ids(),
        })
        .collect()
}

/// What was imported.
#[derive(Debug, Clone)]
pub struct Imported {
    pub samples: usize,
    pub tokens: usize,
    /// HF indices, ascending.
    pub taps: Vec<usize>,
    pub layout: Layout,
    pub hidden_size: usize,
    /// Source dtypes seen.
    pub dtypes: Vec<Dtype>,
    /// Things the user should know (printed as `warning:` by the CLI).
    pub warnings: Vec<String>,
    /// Tensor bytes of the trace (written, or that would be written).
    pub bytes: u64,
    /// The largest request's `hidden_states` bytes.
    pub largest_request: u64,
    /// The largest conversion buffer held at once (bytes): one piece of one tap, whatever the
    /// trace's size.
    pub peak_buffer: usize,
    /// Whether the trace was written (false for a dry run).
    pub written: bool,
}

impl Imported {
    /// What to run next: verify on the trace written to `out`, or the same command without
    /// `--dry-run`.
    pub fn next_step(&self, out: &Path) -> String {
        if self.written {
            format!(
                "kquant verify --draft DRAFT --baseline BASELINE --trace {}",
                out.display()
            )
        } else {
            "the same command without --dry-run".to_string()
        }
    }
}

/// One connector file.
struct ConnFile {
    path: PathBuf,
    /// The file stem: vLLM's request id.
    req_id: String,
    /// Its leading decimal number (`7` for `7` or `7-1a2b`), if any.
    num: Option<u64>,
}

/// The connector files of `dir`, in request order: by the request ids' leading numbers when
/// every id has one, else by name.
fn list(dir: &Path) -> Result<Vec<ConnFile>> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io("read directory", dir, e))?;
    let mut files = Vec::new();
    for e in rd {
        let e = e.map_err(|e| Error::io("read directory", dir, e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        if name.ends_with(".safetensors.zst") {
            return Err(Error::source(
                &path,
                "is zstd-compressed (OnlineHiddenStatesConnector with use_compression)",
            )
            .with_hint("decompress the files first (`zstd -d --rm DIR/*.zst`)"));
        }
        let Some(stem) = name.strip_suffix(".safetensors") else {
            continue; // `.lock` companions and anything else
        };
        if !path.is_file() {
            continue;
        }
        let lead = stem.split('-').next().unwrap_or("");
        let num = (!lead.is_empty() && lead.bytes().all(|b| b.is_ascii_digit()))
            .then(|| lead.parse().ok())
            .flatten();
        files.push(ConnFile {
            path,
            req_id: stem.to_string(),
            num,
        });
    }
    if files.is_empty() {
        return Err(Error::source(dir, "holds no `*.safetensors` files").with_hint("give the directory the connector wrote to (kv_connector_extra_config.shared_storage_path)"));
    }
    if files.iter().all(|f| f.num.is_some()) {
        files.sort_by(|a, b| (a.num, &a.req_id).cmp(&(b.num, &b.req_id)));
    } else {
        files.sort_by(|a, b| a.req_id.cmp(&b.req_id));
    }
    Ok(files)
}

/// Header-level facts of one file, checked (the file is closed again: pass 2 reopens it).
struct Checked {
    tokens: Vec<u32>,
    dtype: Dtype,
    shape: [usize; 3],
    /// Layouts its shape fits.
    fits: Vec<Layout>,
}

fn check_file(f: &ConnFile, n: usize, vocab: Option<usize>) -> Result<Checked> {
    let p = &f.path;
    // SAFETY: the connector files are read-only inputs; see `Shard::open`.
    let shard = unsafe { Shard::open(p)? };
    let names = || {
        shard
            .tensors()
            .iter()
            .map(|t| format!("`{}`", t.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let hint = "is this a file vLLM's ExampleHiddenStatesConnector wrote?";
    let tok = shard.tensor(TOKENS).ok_or_else(|| {
        Error::source(
            p,
            format!("has no `{TOKENS}` tensor (it holds {})", names()),
        )
        .with_hint(hint)
    })?;
    let hs = shard.tensor(HIDDEN).ok_or_else(|| {
        Error::source(
            p,
            format!("has no `{HIDDEN}` tensor (it holds {})", names()),
        )
        .with_hint(hint)
    })?;
    let terr = |tensor: &str, msg: String| Error::Tensor {
        path: p.clone(),
        tensor: tensor.into(),
        msg,
    };
    if tok.shape().len() != 1 {
        return Err(terr(
            TOKENS,
            format!(
                "is rank {} {:?}, expected [T]",
                tok.shape().len(),
                tok.shape()
            ),
        ));
    }
    let t = tok.shape()[0];
    if t == 0 {
        return Err(terr(
            TOKENS,
            "is empty (a request given as prompt embeddings has no token ids)".into(),
        ));
    }
    let raw: Vec<i128> = match tok.dtype() {
        Dtype::I64 => tok
            .data
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as i128)
            .collect(),
        Dtype::U64 => tok
            .data
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as i128)
            .collect(),
        Dtype::I32 => tok
            .data
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i128)
            .collect(),
        Dtype::U32 => tok
            .data
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as i128)
            .collect(),
        d => {
            return Err(terr(
                TOKENS,
                format!("is {d}, expected an integer type (vLLM writes I64)"),
            ))
        }
    };
    let limit = vocab.map_or(i32::MAX as i128 + 1, |v| v as i128);
    if let Some((i, &v)) = raw.iter().enumerate().find(|(_, &v)| v < 0 || v >= limit) {
        return Err(terr(
            TOKENS,
            match vocab {
                Some(v_) => {
                    format!("position {i} holds token {v}, outside the target's vocabulary of {v_}")
                }
                None => format!("position {i} holds token {v}, not a token id"),
            },
        ));
    }
    let tokens = raw.into_iter().map(|v| v as u32).collect();
    let dtype = hs.dtype();
    if !matches!(dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
        return Err(terr(
            HIDDEN,
            format!("is {dtype}, expected BF16, F16 or F32 (the target's dtype)"),
        ));
    }
    let shape: [usize; 3] = hs.shape().try_into().map_err(|_| {
        terr(HIDDEN, format!(
            "is rank {} {:?}, expected rank 3: [n_taps, T, H] (taps-first) or [T, n_taps, H] (tokens-first)",
            hs.shape().len(),
            hs.shape()
        ))
    })?;
    if shape[2] == 0 {
        return Err(Error::Source {
            path: p.clone(),
            msg: format!("`{HIDDEN}` is {shape:?}: hidden size 0 holds no hidden state"),
            hint: Some("the file is not a hidden-states capture; import the directory vLLM's connector wrote (kv_connector_extra_config.shared_storage_path)".into()),
        });
    }
    let fits: Vec<Layout> = [Layout::TapsFirst, Layout::TokensFirst]
        .into_iter()
        .filter(|l| l.shape(n, t, shape[2])[..2] == shape[..2])
        .collect();
    if fits.is_empty() {
        return Err(Error::Source {
            path: p.clone(),
            msg: format!(
                "`{HIDDEN}` is {shape:?} but `{TOKENS}` has T = {t} and --layer-ids gives {n} taps: expected [{n}, {t}, H] (taps-first) or [{t}, {n}, H] (tokens-first)"
            ),
            hint: Some("--layer-ids must list exactly the ids vLLM was given (eagle_aux_hidden_state_layer_ids)".into()),
        });
    }
    if let Some(info) = shard.info(TOKENS) {
        shard.release(info);
    }
    Ok(Checked {
        tokens,
        dtype,
        shape,
        fits,
    })
}

/// The layout of every file: the forced one (checked against each), or the one the shapes
/// show. A file whose shape fits both (T = n_taps) takes the layout its siblings show.
fn resolve_layout(
    files: &[ConnFile],
    checked: &[Checked],
    forced: Option<Layout>,
    n: usize,
) -> Result<(Layout, Vec<String>)> {
    if let Some(l) = forced {
        for (f, c) in files.iter().zip(checked) {
            if !c.fits.contains(&l) {
                return Err(Error::source(
                    &f.path,
                    format!(
                        "`{HIDDEN}` is {:?}, not the --layout {} shape {:?}",
                        c.shape,
                        l.name(),
                        l.shape(n, c.tokens.len(), c.shape[2])
                    ),
                )
                .with_hint("leave --layout at auto to tell it from the shapes"));
            }
        }
        return Ok((l, vec![]));
    }
    let mut shown: Option<(Layout, &Path)> = None;
    for (f, c) in files.iter().zip(checked) {
        if let [l] = c.fits[..] {
            match shown {
                None => shown = Some((l, &f.path)),
                Some((s, other)) if s != l => {
                    return Err(Error::source(
                        &f.path,
                        format!(
                        "`{HIDDEN}` {:?} is {}, but `{}` is {}: the directory mixes vLLM versions",
                        c.shape,
                        l.name(),
                        other.display(),
                        s.name()
                    ),
                    )
                    .with_hint("import the files of each vLLM version separately"))
                }
                _ => {}
            }
        }
    }
    let Some((layout, _)) = shown else {
        let (f, c) = (&files[0], &checked[0]);
        return Err(Error::source(&f.path, format!(
                "`{HIDDEN}` is {:?}: with T = n_taps = {n} the layout cannot be told from the shape, and no other file shows it",
                c.shape
            )).with_hint("pass --layout taps-first ([n_taps, T, H], vLLM's first connector) or --layout tokens-first ([T, n_taps, H], current vLLM); see docs/verify.md"));
    };
    let square: Vec<String> = files
        .iter()
        .zip(checked)
        .filter(|(_, c)| c.fits.len() == 2)
        .map(|(f, _)| f.req_id.clone())
        .collect();
    let mut notes = vec![];
    if !square.is_empty() {
        notes.push(format!(
            "requests {} have T = n_taps = {n}, so their shape fits both layouts; they are read {} like the other files",
            square.join(", "),
            layout.name()
        ));
    }
    Ok((layout, notes))
}

/// Pair files with `--prompts` records: by key (`req_id`, else `id`) when every record has one,
/// else in file order.
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

/// Import the connector files of `o.dir` into a trace at `o.out`.
pub fn import(o: &Options) -> Result<Imported> {
    let slots = tap_slots(&o.layer_ids, o.num_layers)?;
    let n = slots.len();
    // Claimed before the long work (a second run or an existing output is refused at once);
    // a dry run only checks what the claim would refuse, and writes nothing.
    let claim = if o.dry_run {
        preflight(&o.out, o.force, &o.dir)?;
        None
    } else {
        Some(file::claim(&o.out, o.force, std::slice::from_ref(&o.dir))?)
    };
    let files = list(&o.dir)?;
    let mut warnings = Vec::new();
    if o.layer_ids.windows(2).any(|w| w[0] > w[1]) {
        warnings.push(format!(
            "--layer-ids {:?} are not ascending; vLLM stacks taps in layer order, so slot j is read as the j-th smallest id",
            o.layer_ids
        ));
    }

    // Pass 1: headers, token ids and shapes of every file.
    let mut checked = Vec::with_capacity(files.len());
    let mut h_seen: Option<(usize, String)> = o
        .hidden_size
        .map(|h| (h, "--hidden-size (or the target profile)".to_string()));
    for f in &files {
        let c = check_file(f, n, o.vocab_size)?;
        match &h_seen {
            Some((h, from)) if *h != c.shape[2] => {
                return Err(Error::Tensor {
                    path: f.path.clone(),
                    tensor: HIDDEN.into(),
                    msg: format!("has hidden size {}, but {from} gives {h}", c.shape[2]),
                })
            }
            Some(_) => {}
            None => h_seen = Some((c.shape[2], format!("`{}`", f.path.display()))),
        }
        checked.push(c);
    }
    let hidden = h_seen.expect("at least one file").0;
    let (layout, notes) = resolve_layout(&files, &checked, o.layout, n)?;
    warnings.extend(notes);

    // Sample ids: the request numbers when they identify the files, else the file order.
    let nums: Option<Vec<u64>> = files.iter().map(|f| f.num).collect();
    let ids: Vec<u64> = match nums {
        Some(v) if v.iter().collect::<HashSet<_>>().len() == v.len() => v,
        _ => (0..files.len() as u64).collect(),
    };

    let recs = match &o.prompts {
        Some(p) => Some((p.clone(), read_prompts(p)?)),
        None => None,
    };
    let paired = match &recs {
        Some((p, r)) => Some(pair_prompts(p, r, &files)?),
        None => {
            warnings.push(
                "no --prompts: the prompt/continuation split is unknown, so every sample is recorded with prompt_len 1 and `kquant verify` replays the whole sequence (prompt included); that compares two drafts fairly but is not the engine's accept length on the continuation".into(),
            );
            None
        }
    };

    // With --prompts whose records all carry distinct whole-number ids (the capture script
    // writes the prompt file's own), those are the sample ids: the trace then lines up, id
    // for id, with a live run of the same prompt file.
    let ids: Vec<u64> = match &paired {
        Some(v) => {
            let own: Option<Vec<u64>> = v.iter().map(|r| whole_id(r.id.as_ref())).collect();
            match own {
                Some(o) if o.iter().collect::<HashSet<_>>().len() == o.len() => o,
                _ => ids,
            }
        }
        None => ids,
    };

    let mut metas = Vec::with_capacity(files.len());
    for (i, (f, c)) in files.iter().zip(&checked).enumerate() {
        let t = c.tokens.len();
        let meta = match paired.as_ref().map(|v| v[i]) {
            None => SampleMeta {
                id: ids[i],
                category: String::new(),
                dataset: String::new(),
                shard: String::new(),
                prompt_len: 1,
                gen_len: t - 1,
                finish_reason: "unknown".into(),
                turn: 0,
                stop_len: None,
                prompt_id: None,
            },
            Some(r) => {
                let pfile = &recs.as_ref().unwrap().0;
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
                        });
                    }
                }
                SampleMeta {
                    id: ids[i],
                    category: r.category.clone().unwrap_or_default(),
                    dataset: r.dataset.clone().unwrap_or_default(),
                    shard: String::new(),
                    prompt_len: p,
                    gen_len: t - p,
                    finish_reason: r.finish_reason.clone().unwrap_or_else(|| "unknown".into()),
                    turn: 0,
                    stop_len: None,
                    // A prompt id that is not a whole number (`HumanEval/0`) is kept: what a
                    // live run of the same prompt file calls this request.
                    prompt_id: match &r.id {
                        Some(serde_json::Value::String(s)) if whole_id(r.id.as_ref()).is_none() => {
                            Some(s.clone())
                        }
                        _ => None,
                    },
                }
            }
        };
        metas.push(meta);
    }

    let mut dtypes: Vec<Dtype> = checked.iter().map(|c| c.dtype).collect();
    dtypes.sort();
    dtypes.dedup();
    if dtypes.iter().any(|d| *d != Dtype::BF16) {
        warnings.push(format!(
            "hidden_states are {}; the trace stores BF16 (rounded to nearest even)",
            dtypes
                .iter()
                .map(|d| d.name())
                .collect::<Vec<_>>()
                .join("/")
        ));
    }
    let mut target = match &o.target {
        serde_json::Value::Object(m) => m.clone(),
        _ => serde_json::Map::new(),
    };
    target.insert(
        "import".into(),
        serde_json::json!({
            "from": "vllm-hidden-states",
            "dir": o.dir.display().to_string(),
            "engine": "vllm",
            "layer_ids": o.layer_ids,
            "layer_id_convention": "vllm: id k = hidden_states[k]; id num_layers = last block output before the final norm",
            "layout": layout.name(),
            "source_dtypes": dtypes.iter().map(|d| d.name()).collect::<Vec<_>>(),
            "prompt_split": if o.prompts.is_some() { "from --prompts" } else { "unknown (prompt_len 1)" },
            "req_ids": files.iter().map(|f| f.req_id.clone()).collect::<Vec<_>>(),
        }),
    );
    let manifest = Manifest {
        format: file::FORMAT.into(),
        target: serde_json::Value::Object(target),
        hidden_size: hidden,
        num_layers: o.num_layers,
        vocab_size: o.vocab_size,
        taps: slots.clone(),
        tap_convention: file::TAP_CONVENTION.into(),
        taps_pre_norm: true,
        dtype: "bf16".into(),
        greedy_selfcheck: None,
        samples: vec![],
        shards: vec![],
        extra: Default::default(),
    };
    let specs: Vec<SampleSpec> = metas
        .iter()
        .zip(&checked)
        .map(|(m, c)| SampleSpec {
            meta: m.clone(),
            len: c.tokens.len(),
            taps: slots.clone(),
            top1: false,
        })
        .collect();
    let order = file::write_order(&specs, hidden);
    let bytes: u64 = checked
        .iter()
        .map(|c| c.tokens.len() as u64 * (4 + 2 * (n * hidden) as u64))
        .sum();
    let largest_request = checked
        .iter()
        .map(|c| (c.tokens.len() * n * hidden * c.dtype.size()) as u64)
        .max()
        .unwrap_or(0);

    // Pass 2: the values, request by request in the trace's write order, each checked finite
    // as it is converted; at most one request's file is mapped at a time.
    let mut tw = match claim {
        Some(c) => Some(TraceWriter::new(c, manifest, specs.clone())?),
        None => None,
    };
    let mut open: Option<(usize, Shard)> = None;
    let mut buf: Vec<u8> = Vec::new();
    let mut row: Vec<f32> = Vec::new();
    let mut peak_buffer = 0usize;
    for e in order {
        match e {
            Entry::Tokens(i) | Entry::Top1(i) => {
                if let Some(tw) = tw.as_mut() {
                    tw.write_ids(e, &checked[i].tokens)?;
                }
            }
            Entry::Tap(i, tap) => {
                if open.as_ref().map(|(k, _)| *k) != Some(i) {
                    drop(open.take()); // unmaps the previous request first
                    open = Some((i, reopen(&files[i], &checked[i])?));
                }
                let shard = &open.as_ref().expect("opened").1;
                let j = slots.iter().position(|&s| s == tap).expect("declared tap");
                let c = &checked[i];
                let view = shard.tensor(HIDDEN).expect("checked by reopen");
                let (t, size) = (c.tokens.len(), c.dtype.size());
                let rows_per_part = (PART_BYTES / (2 * hidden)).max(1);
                buf.reserve_exact((rows_per_part * 2 * hidden).saturating_sub(buf.len()));
                let mut pos = 0;
                while pos < t {
                    let end = (pos + rows_per_part).min(t);
                    buf.clear();
                    for p in pos..end {
                        let r = layout.row(j, p, n, t) * hidden;
                        let src = &view.data[r * size..(r + hidden) * size];
                        let bad = |k: usize, v: f32| {
                            Error::Tensor {
                            path: files[i].path.clone(),
                            tensor: HIDDEN.into(),
                            msg: format!(
                                "holds {v} at tap slot {j} (hs[{tap}]), token position {p}, channel {k}"
                            ),
                        }
                        };
                        if c.dtype == Dtype::BF16 {
                            if let Some(k) = src
                                .chunks_exact(2)
                                .position(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7F80 == 0x7F80)
                            {
                                let b = u16::from_le_bytes([src[2 * k], src[2 * k + 1]]);
                                return Err(bad(k, half::bf16::from_bits(b).to_f32()));
                            }
                            buf.extend_from_slice(src);
                        } else {
                            row.resize(hidden, 0.0);
                            crate::io::dtype::to_f32_into(c.dtype, src, &mut row);
                            if let Some(k) = row.iter().position(|x| !x.is_finite()) {
                                return Err(bad(k, row[k]));
                            }
                            buf.extend(
                                row.iter()
                                    .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()),
                            );
                        }
                    }
                    peak_buffer = peak_buffer.max(buf.capacity() + row.capacity() * 4);
                    if let Some(tw) = tw.as_mut() {
                        tw.write_part(e, &buf)?;
                    }
                    pos = end;
                }
                if let Some(tw) = tw.as_mut() {
                    tw.end(e)?;
                }
            }
        }
    }
    drop(open);
    let written = tw.is_some();
    if let Some(tw) = tw {
        tw.finish()?;
    }
    Ok(Imported {
        samples: files.len(),
        tokens: checked.iter().map(|c| c.tokens.len()).sum(),
        taps: slots,
        layout,
        hidden_size: hidden,
        dtypes,
        warnings,
        bytes,
        largest_request,
        peak_buffer,
        written,
    })
}

/// Largest piece of a tap converted at once (bytes of BF16 rows).
const PART_BYTES: usize = 4 << 20;

/// Reopen a file of pass 1 for its values; it must still have the shape and dtype pass 1 saw.
fn reopen(f: &ConnFile, c: &Checked) -> Result<Shard> {
    // SAFETY: the connector files are read-only inputs; see `Shard::open`.
    let shard = unsafe { Shard::open(&f.path)? };
    match shard.tensor(HIDDEN) {
        Some(v) if v.dtype() == c.dtype && v.shape() == c.shape => {}
        _ => {
            return Err(
                Error::source(&f.path, "changed while it was being imported")
                    .with_hint("import a directory no process is still writing to"),
            )
        }
    }
    shard.advise_sequential();
    Ok(shard)
}

/// What the output claim would refuse, checked without claiming (for `--dry-run`): an
/// existing output without `--force`, or one kquant did not write; an output that is, or
/// holds, the source directory.
fn preflight(out: &Path, force: bool, dir: &Path) -> Result<()> {
    let oerr = |msg: String, hint: &str| Error::Output {
        path: out.into(),
        msg,
        hint: Some(hint.into()),
    };
    if let (Ok(o), Ok(d)) = (std::fs::canonicalize(out), std::fs::canonicalize(dir)) {
        if d.starts_with(&o) {
            return Err(oerr(
                format!(
                    "is or holds the source `{}`, which this command reads",
                    dir.display()
                ),
                "write the output somewhere else: kquant never writes over its inputs",
            ));
        }
    }
    if std::fs::symlink_metadata(out).is_ok() {
        if !force {
            return Err(oerr(
                "already exists".into(),
                "pass --force to replace it (kquant replaces only outputs it wrote), or choose another -o",
            ));
        }
        crate::io::output::is_kquants(out, crate::io::output::Kind::Trace).map_err(|why| {
            oerr(
                format!("exists and is not an output kquant wrote ({why}); refusing to replace it"),
                "move it away yourself, or choose another -o",
            )
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_map_to_hf_indices_in_layer_order() {
        assert_eq!(tap_slots(&[58, 2, 30], 61).unwrap(), vec![2, 30, 58]);
        assert_eq!(
            tap_slots(&[2, 30, 61], 61).unwrap(),
            vec![2, 30, 61],
            "id L = last block output"
        );
        assert!(tap_slots(&[2, 62], 61)
            .unwrap_err()
            .to_string()
            .contains("past the last hidden state"));
        assert!(tap_slots(&[2, 2, 3], 61)
            .unwrap_err()
            .to_string()
            .contains("twice"));
        assert!(tap_slots(&[], 61).is_err());
    }

    #[test]
    fn rows_are_found_in_both_layouts() {
        // n = 2 taps, T = 3: slot 1 at position 2.
        assert_eq!(Layout::TapsFirst.row(1, 2, 2, 3), 5);
        assert_eq!(Layout::TokensFirst.row(1, 2, 2, 3), 5);
        assert_eq!(Layout::TapsFirst.row(1, 0, 2, 3), 3);
        assert_eq!(Layout::TokensFirst.row(1, 0, 2, 3), 1);
        assert_eq!(Layout::TapsFirst.shape(2, 3, 8), [2, 3, 8]);
        assert_eq!(Layout::TokensFirst.shape(2, 3, 8), [3, 2, 8]);
    }
}
