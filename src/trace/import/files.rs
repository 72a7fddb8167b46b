//! Pass 1 of an import: the connector files of a directory in request order, each one's header,
//! token ids and `hidden_states` shape checked without reading a value, the hidden size held
//! across them, and the layout they show; and each reopened for pass 2.

use std::path::{Path, PathBuf};

use super::layout::{Layout, HIDDEN, TOKENS};
use crate::error::{Error, Result};
use crate::io::{Dtype, Shard, TensorView};

/// One connector file.
pub(super) struct ConnFile {
    pub(super) path: PathBuf,
    /// The file stem: vLLM's request id.
    pub(super) req_id: String,
    /// Its leading decimal number (`7` for `7` or `7-1a2b`), if any.
    pub(super) num: Option<u64>,
}

/// The connector files of `dir`, in request order: by the request ids' leading numbers when
/// every id has one, else by name.
pub(super) fn list(dir: &Path) -> Result<Vec<ConnFile>> {
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
pub(super) struct Checked {
    pub(super) tokens: Vec<u32>,
    pub(super) dtype: Dtype,
    pub(super) shape: [usize; 3],
    /// Layouts its shape fits.
    pub(super) fits: Vec<Layout>,
}

/// Pass 1: every file's header, token ids and shape checked ([`check_file`]), its hidden size
/// held to `hidden` (`--hidden-size` or the target profile) or, without, to the first file's.
/// The checked files and the hidden size.
pub(super) fn check_all(
    files: &[ConnFile],
    n: usize,
    hidden: Option<usize>,
    vocab: Option<usize>,
) -> Result<(Vec<Checked>, usize)> {
    let mut checked = Vec::with_capacity(files.len());
    let mut h_seen: Option<(usize, String)> =
        hidden.map(|h| (h, "--hidden-size (or the target profile)".to_string()));
    for f in files {
        let c = check_file(f, n, vocab)?;
        match &h_seen {
            Some((h, from)) if *h != c.shape[2] => {
                return Err(Error::Tensor {
                    path: f.path.clone(),
                    tensor: HIDDEN.into(),
                    msg: format!("has hidden size {}, but {from} gives {h}", c.shape[2]),
                    hint: None,
                })
            }
            Some(_) => {}
            None => h_seen = Some((c.shape[2], format!("`{}`", f.path.display()))),
        }
        checked.push(c);
    }
    Ok((checked, h_seen.expect("at least one file").0))
}

/// One file's header checked for `n` taps (the file is closed again: pass 2 reopens it).
fn check_file(f: &ConnFile, n: usize, vocab: Option<usize>) -> Result<Checked> {
    let p = &f.path;
    // SAFETY: the connector files are read-only inputs; see `Shard::open`.
    let shard = unsafe { Shard::open(p)? };
    let tok = named(&shard, p, TOKENS)?;
    let hs = named(&shard, p, HIDDEN)?;
    let tokens = token_ids(p, &tok, vocab)?;
    let (dtype, shape, fits) = hidden_states(p, &hs, n, tokens.len())?;
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

/// Tensor `name` of a connector file, which must hold it.
fn named<'a>(shard: &'a Shard, p: &Path, name: &str) -> Result<TensorView<'a>> {
    shard.tensor(name).ok_or_else(|| {
        let names = shard
            .tensors()
            .iter()
            .map(|t| format!("`{}`", t.name))
            .collect::<Vec<_>>()
            .join(", ");
        Error::source(p, format!("has no `{name}` tensor (it holds {names})"))
            .with_hint("is this a file vLLM's ExampleHiddenStatesConnector wrote?")
    })
}

fn terr(p: &Path, tensor: &str, msg: String) -> Error {
    Error::Tensor {
        path: p.into(),
        tensor: tensor.into(),
        msg,
        hint: None,
    }
}

/// Little-endian integers of `N` bytes each, widened.
fn ints<const N: usize>(data: &[u8], value: fn([u8; N]) -> i128) -> Vec<i128> {
    data.chunks_exact(N)
        .map(|c| value(c.try_into().expect("N bytes")))
        .collect()
}

/// The request's token ids: `[T]`, T > 0, an integer type, each within the target's
/// vocabulary (or a token id at all, without one).
fn token_ids(p: &Path, tok: &TensorView, vocab: Option<usize>) -> Result<Vec<u32>> {
    if tok.shape().len() != 1 {
        return Err(terr(
            p,
            TOKENS,
            format!(
                "is rank {} {:?}, expected [T]",
                tok.shape().len(),
                tok.shape()
            ),
        ));
    }
    if tok.shape()[0] == 0 {
        return Err(terr(
            p,
            TOKENS,
            "is empty (a request given as prompt embeddings has no token ids)".into(),
        ));
    }
    let raw: Vec<i128> = match tok.dtype() {
        Dtype::I64 => ints(tok.data, |b| i64::from_le_bytes(b).into()),
        Dtype::U64 => ints(tok.data, |b| u64::from_le_bytes(b).into()),
        Dtype::I32 => ints(tok.data, |b| i32::from_le_bytes(b).into()),
        Dtype::U32 => ints(tok.data, |b| u32::from_le_bytes(b).into()),
        d => {
            return Err(terr(
                p,
                TOKENS,
                format!("is {d}, expected an integer type (vLLM writes I64)"),
            ))
        }
    };
    let limit = vocab.map_or(i32::MAX as i128 + 1, |v| v as i128);
    if let Some((i, &v)) = raw.iter().enumerate().find(|(_, &v)| v < 0 || v >= limit) {
        return Err(terr(
            p,
            TOKENS,
            match vocab {
                Some(v_) => {
                    format!("position {i} holds token {v}, outside the target's vocabulary of {v_}")
                }
                None => format!("position {i} holds token {v}, not a token id"),
            },
        ));
    }
    Ok(raw.into_iter().map(|v| v as u32).collect())
}

/// The stacked taps of a request of `t` tokens: a float dtype, rank 3, a hidden size, and the
/// layouts whose shape for `n` taps it fits (at least one).
fn hidden_states(
    p: &Path,
    hs: &TensorView,
    n: usize,
    t: usize,
) -> Result<(Dtype, [usize; 3], Vec<Layout>)> {
    let dtype = hs.dtype();
    if !matches!(dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
        return Err(terr(
            p,
            HIDDEN,
            format!("is {dtype}, expected BF16, F16 or F32 (the target's dtype)"),
        ));
    }
    let shape: [usize; 3] = hs.shape().try_into().map_err(|_| {
        terr(p, HIDDEN, format!(
            "is rank {} {:?}, expected rank 3: [n_taps, T, H] (taps-first) or [T, n_taps, H] (tokens-first)",
            hs.shape().len(),
            hs.shape()
        ))
    })?;
    if shape[2] == 0 {
        return Err(Error::Source {
            path: p.into(),
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
            path: p.into(),
            msg: format!(
                "`{HIDDEN}` is {shape:?} but `{TOKENS}` has T = {t} and --layer-ids gives {n} taps: expected [{n}, {t}, H] (taps-first) or [{t}, {n}, H] (tokens-first)"
            ),
            hint: Some("--layer-ids must list exactly the ids vLLM was given (eagle_aux_hidden_state_layer_ids)".into()),
        });
    }
    Ok((dtype, shape, fits))
}

/// The layout of every file: the forced one (checked against each), or the one the shapes
/// show. A file whose shape fits both (T = n_taps) takes the layout its siblings show.
pub(super) fn resolve_layout(
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

/// Reopen a file of pass 1 for its values; it must still have the shape and dtype pass 1 saw.
pub(super) fn reopen(f: &ConnFile, c: &Checked) -> Result<Shard> {
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
