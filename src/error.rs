//! Typed errors for everything kquant reads, writes and is told, each naming what it is about
//! (the file and tensor for data, the flag for a command line, the URL for a serving engine,
//! the device for a GPU) with the `hint:` a user sees. The binary renders them as `error: …`
//! and exits 2.

use std::path::{Path, PathBuf};

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What is wrong with a safetensors header, independent of which file it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The file cannot even hold the 8-byte header length.
    #[error("file is {0} bytes, shorter than the 8-byte header length prefix (truncated file?)")]
    TooSmall(u64),
    /// The declared header length exceeds the cap.
    #[error("declared header length {len} exceeds the {cap}-byte limit")]
    TooLarge { len: u64, cap: u64 },
    /// The declared header runs past the end of the file.
    #[error("declared header length {len} runs past the end of the {file_len}-byte file (truncated file or header)")]
    PastEof { len: u64, file_len: u64 },
    /// Header bytes are not UTF-8 JSON.
    #[error("header is not valid JSON: {0}")]
    Json(String),
    /// Header JSON is not an object of tensor entries.
    #[error("header JSON must be an object mapping tensor names to entries")]
    NotObject,
    /// `__metadata__` is not a string-to-string object.
    #[error("`__metadata__` must be an object of string values")]
    BadMetadata,
    /// The same tensor name appears twice in the header.
    #[error("tensor `{0}` appears twice in the header")]
    DuplicateTensor(String),
    /// One tensor entry is malformed.
    #[error("tensor `{name}`: {kind}")]
    Tensor { name: String, kind: TensorError },
    /// Bytes in the data section belong to no tensor.
    #[error("data section has unused bytes {start}..{end} (gap or trailing bytes after the last tensor)")]
    Gap { start: u64, end: u64 },
}

/// What is wrong with one tensor entry of a safetensors header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorError {
    /// The entry is not an object with `dtype`, `shape`, `data_offsets`.
    #[error("entry must be an object with `dtype`, `shape` and `data_offsets`: {0}")]
    BadEntry(String),
    /// The dtype string is not one kquant knows.
    #[error("unknown dtype `{0}`")]
    UnknownDtype(String),
    /// A dimension is negative, fractional or too big.
    #[error("shape {0} has a dimension that is not a non-negative integer")]
    BadShape(String),
    /// Multiplying the dimensions overflows.
    #[error("shape {0} overflows when its elements are counted")]
    ShapeOverflow(String),
    /// Offsets are not two ordered non-negative integers.
    #[error("data_offsets {0} must be two non-negative integers [begin, end] with begin <= end")]
    BadOffsets(String),
    /// Byte length disagrees with dtype × shape.
    #[error("{dtype} × shape {shape} needs {expected} bytes but data_offsets span {actual}")]
    SizeMismatch {
        dtype: String,
        shape: String,
        expected: u64,
        actual: u64,
    },
    /// End offset lies past the data section.
    #[error("data_offsets end {end} is past the end of the {data_len}-byte data section")]
    OutOfBounds { end: u64, data_len: u64 },
    /// Two tensors share bytes.
    #[error("bytes {start}..{end} overlap tensor `{other}`")]
    Overlap { start: u64, end: u64, other: String },
}

/// What is wrong with `model.safetensors.index.json`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    #[error("not valid JSON: {0}")]
    Json(String),
    #[error("must be a JSON object with a `weight_map` object of tensor name -> shard file name")]
    Shape,
    #[error("tensor `{0}` is listed twice in `weight_map`")]
    DuplicateEntry(String),
    #[error("tensor `{tensor}` maps to `{shard}`, which is not a plain file name inside the checkpoint directory")]
    UnsafeShardName { tensor: String, shard: String },
    #[error("shard `{shard}` is listed for tensor `{tensor}` but does not exist")]
    MissingShard { shard: String, tensor: String },
    #[error("tensor `{tensor}` is listed for shard `{shard}` but that shard does not contain it")]
    MissingTensor { tensor: String, shard: String },
    #[error("tensor `{tensor}` is stored in two shards, `{first}` and `{second}`")]
    TensorInTwoShards {
        tensor: String,
        first: String,
        second: String,
    },
    #[error("shard `{shard}` holds tensor `{tensor}`, which `weight_map` does not list")]
    Unlisted { tensor: String, shard: String },
    #[error("`weight_map` is empty")]
    Empty,
}

/// Every error kquant reports. The ones about a file name it (`Io`, `Header`, `Index`,
/// `Config`, `Source`, `Tensor`, `Output`, …); the ones about flags, the hub or a device name the
/// flag, model id or device instead (`Usage`, `Flags`, `Hub`, `Device`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {action} `{}`", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{}`: invalid safetensors file: {kind}", path.display())]
    Header { path: PathBuf, kind: HeaderError },
    #[error("`{}`: invalid index: {kind}", path.display())]
    Index { path: PathBuf, kind: IndexError },
    #[error("`{}`: {msg}", path.display())]
    Config { path: PathBuf, msg: String },
    #[error("`{}`: {msg}", path.display())]
    Source {
        path: PathBuf,
        msg: String,
        hint: Option<String>,
    },
    #[error("hub model `{id}`: {msg}")]
    Hub {
        id: String,
        msg: String,
        hint: Option<String>,
    },
    #[error("`{}`: tensor `{tensor}`: {msg}", path.display())]
    Tensor {
        path: PathBuf,
        tensor: String,
        msg: String,
        /// What to do instead; without one, the generic hint of a tensor that disagrees with
        /// its config or format.
        hint: Option<String>,
    },
    #[error("`{}`: {msg}", path.display())]
    Detect { path: PathBuf, msg: String },
    #[error("`{}`: {msg}", path.display())]
    Output {
        path: PathBuf,
        msg: String,
        hint: Option<String>,
    },
    #[error("`{}`: {msg}", path.display())]
    Manifest { path: PathBuf, msg: String },
    #[error("{0}")]
    Usage(String),
    /// A flag combination that cannot work, with what to do instead.
    #[error("{msg}")]
    Flags { msg: String, hint: String },
    /// A GPU device or kernel failed (or this build has no such device).
    #[error("{msg}")]
    Device { msg: String, hint: Option<String> },
    /// A serving engine's endpoint (`verify --endpoint`) could not be used: unreachable, an
    /// HTTP error, a response without the fields kquant reads.
    #[error("`{url}`: {msg}")]
    Endpoint {
        url: String,
        msg: String,
        hint: Option<String>,
    },
}

impl Error {
    /// Wrap an I/O error with the action and path it happened on.
    pub fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }

    /// An input kquant cannot use ([`Error::Source`]): the file or directory and what is wrong
    /// with it, without a hint ([`Error::with_hint`] adds one).
    pub fn source(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Source {
            path: path.into(),
            msg: msg.into(),
            hint: None,
        }
    }

    /// The same error with a `hint:` line. Only the variants that carry a hint (`Source`,
    /// `Hub`, `Output`, `Device`, `Flags`, `Endpoint`, `Tensor`) take one; on the others it is
    /// a programming error (a debug assertion) and the error is returned unchanged.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        match &mut self {
            Error::Source { hint: h, .. }
            | Error::Hub { hint: h, .. }
            | Error::Output { hint: h, .. }
            | Error::Device { hint: h, .. }
            | Error::Endpoint { hint: h, .. }
            | Error::Tensor { hint: h, .. } => *h = Some(hint.into()),
            Error::Flags { hint: h, .. } => *h = hint.into(),
            other => debug_assert!(false, "with_hint on an error without a hint: {other}"),
        }
        self
    }

    /// A `hint:` line for the user, where one helps.
    pub fn hint(&self) -> Option<String> {
        match self {
            Error::Io { source, .. } => match source.kind() {
                std::io::ErrorKind::NotFound => Some("check the path; a hub id looks like `org/name[@revision]`".into()),
                std::io::ErrorKind::PermissionDenied => Some("check the file permissions".into()),
                std::io::ErrorKind::UnexpectedEof => Some("the file ended early: it is truncated, or it shrank while kquant read it; copy or download it again and re-run".into()),
                _ if source.raw_os_error() == Some(28) => Some("the disk is full: free space or write elsewhere with -o".into()),
                _ if source.raw_os_error() == Some(30) => Some("the filesystem is read-only: write elsewhere with -o".into()),
                _ => None,
            },
            Error::Header { kind, .. } => Some(match kind {
                HeaderError::TooSmall(_) | HeaderError::PastEof { .. } => "the file looks truncated: download or copy it again".into(),
                _ => "the file is not a valid safetensors checkpoint; re-export it with the `safetensors` library".into(),
            }),
            Error::Index { kind, .. } => Some(match kind {
                IndexError::MissingShard { .. } => "download the missing shard, or fix `weight_map`".into(),
                IndexError::UnsafeShardName { .. } => "shard names must be plain file names such as `model-00001-of-00002.safetensors`".into(),
                _ => "regenerate `model.safetensors.index.json` so that every tensor is listed once, in the shard that holds it".into(),
            }),
            Error::Config { .. } => Some("`config.json` must be a JSON object as written by transformers".into()),
            Error::Source { hint, .. } | Error::Hub { hint, .. } | Error::Output { hint, .. } | Error::Device { hint, .. } | Error::Endpoint { hint, .. } => hint.clone(),
            Error::Tensor { hint, .. } => Some(hint.clone().unwrap_or_else(|| "the tensor does not fit what config.json and the file say of it (its shape, dtype or values): `kquant inspect` shows both; re-export the checkpoint with the tool that wrote it".into())),
            Error::Detect { .. } => Some("fix the config or tensor names so that they agree; see docs/inspect.md".into()),
            Error::Manifest { .. } => Some("the output was changed after kquant wrote it; re-run the command that made it".into()),
            Error::Usage(_) => Some("see `kquant --help`".into()),
            Error::Flags { hint, .. } => Some(hint.clone()),
        }
    }
}
