//! What `trace import` is asked and what it reports: the user's [`Request`] resolved against
//! the target profile into [`Options`] (layer count, hidden size, vocabulary), each draft
//! family's coverage by the taps imported ([`coverage`]), and what was imported ([`Imported`]).

use std::path::{Path, PathBuf};

use super::layout::Layout;
use crate::checkpoint::Family;
use crate::error::{Error, Result};
use crate::io::Dtype;
use crate::target::stream::TapStream;
use crate::target::Profile;
use crate::trace::stream;

/// What the user asked `trace import` for: [`Options`] before the flags are checked against
/// the target profile.
#[derive(Debug, Clone)]
pub struct Request {
    /// The connector's `shared_storage_path`.
    pub dir: PathBuf,
    pub out: PathBuf,
    /// The ids given to vLLM, in the order given.
    pub layer_ids: Vec<usize>,
    /// `None`: tell it from the shapes.
    pub layout: Option<Layout>,
    pub prompts: Option<PathBuf>,
    /// `--hidden-size`.
    pub hidden_size: Option<usize>,
    /// `--num-layers`.
    pub num_layers: Option<usize>,
    /// The target profile (`--target`): the shape checked, the taps each family reads.
    pub target: Option<Profile>,
    /// `--stream`: the hidden-state stream the files hold (else `DIR/capture.json`'s
    /// `tap_stream`, which scripts/vllm_capture.py writes).
    pub stream: Option<TapStream>,
    pub force: bool,
    /// Check everything (the values too) and write nothing.
    pub dry_run: bool,
}

/// What to import: the [`Request`] with the target's shape resolved.
#[derive(Debug, Clone)]
pub struct Options {
    /// What was asked.
    pub asked: Request,
    /// Expected hidden size (`--hidden-size` or the profile's), checked against every file.
    pub hidden_size: Option<usize>,
    /// The target's decoder blocks (`--num-layers` or the profile's).
    pub num_layers: usize,
    /// Tokens must be below it when known.
    pub vocab_size: Option<usize>,
    /// The manifest's `target` object (name, HF id, …); the import's own record is added to it.
    pub target: serde_json::Value,
    /// The stream recorded as `tap_stream`: `--stream` or `capture.json`'s, checked against
    /// the target; `residual` on a target without attention residuals; `None` (not recorded,
    /// a warning says so) on one with them where neither says.
    pub stream: Option<TapStream>,
}

/// The file scripts/vllm_capture.py writes beside the connector's files.
pub const CAPTURE_JSON: &str = "capture.json";

/// `DIR/capture.json`'s `tap_stream`, where the file is there and records one.
fn recorded_stream(dir: &Path) -> Result<Option<TapStream>> {
    let p = dir.join(CAPTURE_JSON);
    if !p.exists() {
        return Ok(None);
    }
    // A regular file of a bounded size: a link to /dev/zero or a FIFO is an error, not an
    // endless read.
    let bytes = crate::io::text::read_regular(&p, crate::io::text::MAX_CONFIG, CAPTURE_JSON)?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
        Error::source(&p, format!("is not JSON: {e}"))
            .with_hint("scripts/vllm_capture.py writes it; move a file of another tool away")
    })?;
    let raw = v.get(crate::trace::file::TAP_STREAM);
    crate::trace::file::check_tap_stream(raw).map_err(|m| {
        Error::source(&p, m)
            .with_hint("give the stream the engine tapped with --stream partial|mixture|residual")
    })?;
    Ok(raw
        .and_then(serde_json::Value::as_str)
        .and_then(TapStream::parse))
}

/// The stream to record: `--stream` and `capture.json`'s, which must agree, checked against
/// the target (`partial`/`mixture` only on one with attention residuals).
fn resolve_stream(
    req: &Request,
    num_layers: usize,
    hidden: Option<usize>,
) -> Result<Option<TapStream>> {
    let file = recorded_stream(&req.dir)?;
    if let (Some(a), Some(f)) = (req.stream, file) {
        if a != f {
            return Err(Error::Flags {
                msg: format!(
                    "--stream {} but {} records tap_stream `{}`",
                    a.id(),
                    req.dir.join(CAPTURE_JSON).display(),
                    f.id()
                ),
                hint: "the capture script recorded the stream the engine tapped: leave --stream out, or capture again on the stream you want".into(),
            });
        }
    }
    let attn_res = match &req.target {
        Some(p) => p.attention_residuals.is_some(),
        None => crate::target::profile::builtin_or_empty().iter().any(|p| {
            p.attention_residuals.is_some()
                && p.num_layers.known() == Some(&num_layers)
                && hidden.is_none_or(|h| p.hidden_size.known() == Some(&h))
        }),
    };
    let name = req
        .target
        .as_ref()
        .map_or("the target", |p| p.name.as_str());
    match req.stream.or(file) {
        Some(s) => stream::for_target(Some(s), attn_res, name, "--stream").map(Some),
        None if attn_res => Ok(None),
        None => Ok(Some(TapStream::Residual)),
    }
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
    pub fn resolve(req: Request) -> Result<Options> {
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
        let stream = resolve_stream(&req, num_layers, hidden_size)?;
        Ok(Options {
            stream,
            hidden_size,
            num_layers,
            vocab_size: t.and_then(|p| p.vocab_size.known().copied()),
            target,
            asked: req,
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
