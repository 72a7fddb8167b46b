//! Where a checkpoint comes from (directory, single `.safetensors` file, or hub id) and how its
//! weights are opened: single file or index + shards, every name checked before it is joined.
//! A path that cannot be opened is reported by its cause (symlink loop, dangling symlink,
//! permission, a file used as a directory); only a path that does not exist at all is tried as
//! a hub id, and a hub id with a bad revision is refused rather than read as a path.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::header::TensorInfo;
use super::hub::{HubFetcher, HubId};
use super::index::{self, INDEX_FILE};
use super::shard::{Shard, TensorView};
use crate::error::{Error, IndexError, Result};

/// The single-file weights name.
pub const SINGLE_FILE: &str = "model.safetensors";

/// How the user named the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Dir(PathBuf),
    File(PathBuf),
    Hub { id: HubId, snapshot: PathBuf },
}

impl Origin {
    pub fn describe(&self) -> String {
        match self {
            Origin::Dir(p) | Origin::File(p) => p.display().to_string(),
            Origin::Hub { id, .. } => format!("hub:{}", id.display()),
        }
    }
}

/// Opened weights: the shards and a name → (shard, entry) routing table.
pub struct Weights {
    pub origin: Origin,
    /// Directory holding config.json and the weights.
    pub dir: PathBuf,
    pub config_path: Option<PathBuf>,
    pub index_path: Option<PathBuf>,
    pub shards: Vec<Shard>,
    routes: BTreeMap<String, (usize, usize)>,
}

impl Weights {
    /// Tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.routes.keys().map(String::as_str)
    }
    pub fn len(&self) -> usize {
        self.routes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.routes
            .get(name)
            .map(|&(s, i)| &self.shards[s].tensors()[i])
    }
    /// Which shard holds `name`.
    pub fn shard_of(&self, name: &str) -> Option<&Shard> {
        self.routes.get(name).map(|&(s, _)| &self.shards[s])
    }
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let &(s, i) = self.routes.get(name)?;
        let shard = &self.shards[s];
        Some(shard.view(&shard.tensors()[i]))
    }
    /// All tensors, sorted by name.
    pub fn infos(&self) -> impl Iterator<Item = &TensorInfo> {
        self.routes
            .values()
            .map(|&(s, i)| &self.shards[s].tensors()[i])
    }
    /// Every weight file (shards) and the index, for hashing.
    pub fn files(&self) -> Vec<&Path> {
        let mut v: Vec<&Path> = self.shards.iter().map(|s| s.path()).collect();
        if let Some(i) = &self.index_path {
            v.push(i);
        }
        v
    }
}

/// Open a checkpoint directory (any path, UTF-8 or not): `config.json` and the index's shards,
/// else `model.safetensors`.
pub fn open_dir(path: &Path) -> Result<Weights> {
    super::reads::note(path);
    let config = path.join("config.json");
    match std::fs::metadata(&config) {
        Ok(m) if !m.is_file() => {
            return Err(Error::Source {
                path: config,
                msg: "is not a regular file (a device, FIFO or directory is not a config)".into(),
                hint: Some("give the checkpoint's `config.json` as a regular file".into()),
            })
        }
        // A link to a file (a hub cache snapshot's are links to its blobs) is the file.
        Ok(_) => {}
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(path_error(&config, e)),
        Err(_) => {
            if let Some(err) = dangling_symlink(&config) {
                return Err(err);
            }
        }
    }
    if !config.is_file() {
        return Err(Error::Source {
            path: path.into(),
            msg: "no `config.json` in this checkpoint directory".into(),
            hint: Some("a checkpoint directory needs the `config.json` it was trained with; to look at the tensors alone, pass the `.safetensors` file".into()),
        });
    }
    let fetch = |name: &str| {
        let p = path.join(name);
        match std::fs::metadata(&p) {
            Ok(m) => Ok(m.is_file().then_some(p)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                dangling_symlink(&p).map_or(Ok(None), Err)
            }
            Err(e) => Err(path_error(&p, e)),
        }
    };
    open_with(
        Origin::Dir(path.into()),
        path,
        Some(config),
        &fetch,
        Some(path),
    )
}

/// Resolve `spec` (a path or a hub id) and open its weights.
///
/// A directory must hold `config.json`; a single `.safetensors` file picks up a sibling
/// `config.json` when there is one.
pub fn open(spec: &str) -> Result<Weights> {
    let path = Path::new(spec);
    if path.is_dir() {
        return open_dir(path);
    }
    if path.is_file() {
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let config = dir.join("config.json");
        return single_file(
            Origin::File(path.into()),
            dir,
            config.is_file().then_some(config),
            path,
        );
    }
    match std::fs::metadata(path) {
        Ok(_) => {
            return Err(Error::Source {
                path: path.into(),
                msg: "is neither a directory nor a regular file".into(),
                hint: None,
            })
        }
        // Only a path that is not there at all may be a hub id.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(err) = dangling_symlink(path) {
                return Err(err);
            }
        }
        Err(e) => return Err(path_error(path, e)),
    }
    let hub_id = match HubId::parse_checked(spec) {
        Ok(id) => id.filter(|_| !spec.starts_with('.')),
        Err(why) => {
            return Err(Error::Hub {
                id: crate::escape::printable(spec).into_owned(),
                msg: format!("{why} (and no file or directory of that name exists)"),
                hint: Some(
                    "a revision is a branch, tag or commit of the hub repo (`main`, `v1.0`, `refs/pr/1`, a commit hash); to open a local directory, pass its path alone".into(),
                ),
            })
        }
    };
    if let Some(id) = hub_id {
        let hub = HubFetcher::new(id.clone());
        let config = hub.get("config.json")?.ok_or_else(|| {
            let where_ = if super::hub::offline() {
                ""
            } else {
                " nor on the hub"
            };
            hub.err(format!(
                "`config.json` is not in the cache at `{}`{where_}",
                hub.cache_root().display()
            ))
        })?;
        let snapshot = config.parent().map(Path::to_path_buf).unwrap_or_default();
        super::reads::note(&snapshot);
        let fetch = |name: &str| hub.get(name);
        return open_with(
            Origin::Hub {
                id,
                snapshot: snapshot.clone(),
            },
            &snapshot,
            Some(config),
            &fetch,
            None,
        );
    }
    Err(Error::io(
        "open",
        path,
        std::io::Error::from(std::io::ErrorKind::NotFound),
    ))
}

/// Why `path` cannot be opened, in words that fit the cause: a symlink loop, a permission, a
/// file where a directory was needed; anything else as the I/O error itself.
pub fn path_error(path: &Path, e: std::io::Error) -> Error {
    let (msg, hint) = match (e.raw_os_error(), e.kind()) {
        (Some(libc::ELOOP), _) => (
            "is a symlink loop (too many levels of symbolic links)",
            "a symlink on this path points (maybe through others) back to itself: fix or remove it, or pass the real path",
        ),
        (_, std::io::ErrorKind::PermissionDenied) => (
            "cannot be read: permission denied",
            "check the permissions of the path and of every directory above it (`ls -ld`)",
        ),
        (Some(libc::ENOTDIR), _) => (
            "is not a directory path: one of its leading components is a file, not a directory",
            "check the path: only its last component may be a file",
        ),
        (Some(libc::ENAMETOOLONG), _) => (
            "is too long a path (or has too long a component)",
            "check the path",
        ),
        _ => return Error::io("open", path, e),
    };
    Error::Source {
        path: path.into(),
        msg: msg.into(),
        hint: Some(hint.into()),
    }
}

/// A symlink at `path` whose target does not exist (`metadata` said "not found").
fn dangling_symlink(path: &Path) -> Option<Error> {
    let target = std::fs::read_link(path).ok()?;
    Some(Error::Source {
        path: path.into(),
        msg: format!(
            "is a symlink to `{}`, which does not exist",
            crate::escape::printable(&target.display().to_string())
        ),
        hint: Some("fix the symlink, or download or copy the file it points to".into()),
    })
}

/// Weights in one safetensors file, `file`: every tensor routed to it.
fn single_file(
    origin: Origin,
    dir: &Path,
    config_path: Option<PathBuf>,
    file: &Path,
) -> Result<Weights> {
    // SAFETY: inputs are never written by kquant; see `Shard::open`.
    let shard = unsafe { Shard::open(file)? };
    let routes = shard
        .tensors()
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.clone(), (0, i)))
        .collect();
    Ok(Weights {
        origin,
        dir: dir.into(),
        config_path,
        index_path: None,
        shards: vec![shard],
        routes,
    })
}

type Fetch<'a> = dyn Fn(&str) -> Result<Option<PathBuf>> + 'a;

fn open_with(
    origin: Origin,
    dir: &Path,
    config: Option<PathBuf>,
    fetch: &Fetch,
    listable: Option<&Path>,
) -> Result<Weights> {
    if let Some(index_path) = fetch(INDEX_FILE)? {
        return open_sharded(origin, dir, config, index_path, fetch);
    }
    if let Some(single) = fetch(SINGLE_FILE)? {
        return single_file(origin, dir, config, &single);
    }
    let found: Vec<String> = listable
        .and_then(|d| std::fs::read_dir(d).ok())
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".safetensors"))
                .collect()
        })
        .unwrap_or_default();
    let hint = if found.is_empty() {
        "expected `model.safetensors`, or `model.safetensors.index.json` with its shards"
            .to_string()
    } else {
        format!(
            "found {} but no `{INDEX_FILE}`: pass a single file directly, or add the index",
            found
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    Err(Error::Source {
        path: dir.into(),
        msg: format!("no `{SINGLE_FILE}` or `{INDEX_FILE}` here"),
        hint: Some(hint),
    })
}

fn open_sharded(
    origin: Origin,
    dir: &Path,
    config: Option<PathBuf>,
    index_path: PathBuf,
    fetch: &Fetch,
) -> Result<Weights> {
    let ierr = |kind| Error::Index {
        path: index_path.clone(),
        kind,
    };
    let bytes =
        super::text::read_regular(&index_path, super::text::MAX_CONFIG, "safetensors index")?;
    let idx = index::parse(&bytes).map_err(ierr)?;
    let shard_names = idx.shards();
    let mut shards = Vec::with_capacity(shard_names.len());
    for name in &shard_names {
        let Some(p) = fetch(name)? else {
            let tensor = idx
                .weight_map
                .iter()
                .find(|(_, s)| s == name)
                .map(|(t, _)| t.clone())
                .unwrap_or_default();
            return Err(ierr(IndexError::MissingShard {
                shard: name.to_string(),
                tensor,
            }));
        };
        // SAFETY: inputs are never written by kquant; see `Shard::open`.
        shards.push(unsafe { Shard::open(&p)? });
    }
    let pos: BTreeMap<&str, usize> = shard_names
        .iter()
        .enumerate()
        .map(|(i, n)| (*n, i))
        .collect();
    let listed: BTreeMap<&str, &str> = idx
        .weight_map
        .iter()
        .map(|(t, s)| (t.as_str(), s.as_str()))
        .collect();
    // Every tensor a shard holds: listed for that shard, and in no other shard.
    let mut holder: BTreeMap<&str, usize> = BTreeMap::new();
    for (si, shard) in shards.iter().enumerate() {
        for t in shard.tensors() {
            if let Some(&first) = holder.get(t.name.as_str()) {
                return Err(ierr(IndexError::TensorInTwoShards {
                    tensor: t.name.clone(),
                    first: shard_names[first].into(),
                    second: shard_names[si].into(),
                }));
            }
            holder.insert(&t.name, si);
            match listed.get(t.name.as_str()) {
                None => {
                    return Err(ierr(IndexError::Unlisted {
                        tensor: t.name.clone(),
                        shard: shard_names[si].into(),
                    }))
                }
                Some(s) if pos[s] != si => {
                    return Err(ierr(IndexError::TensorInTwoShards {
                        tensor: t.name.clone(),
                        first: s.to_string(),
                        second: shard_names[si].into(),
                    }))
                }
                Some(_) => {}
            }
        }
    }
    let mut routes = BTreeMap::new();
    for (t, s) in &idx.weight_map {
        let si = pos[s.as_str()];
        let Some(i) = shards[si].index_of(t) else {
            return Err(ierr(IndexError::MissingTensor {
                tensor: t.clone(),
                shard: s.clone(),
            }));
        };
        routes.insert(t.clone(), (si, i));
    }
    Ok(Weights {
        origin,
        dir: dir.into(),
        config_path: config,
        index_path: Some(index_path),
        shards,
        routes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each cause gets its own message and hint (permission denied cannot be produced for real
    /// in tests that run as root, so the mapping is checked on the error values).
    #[test]
    fn path_errors_name_their_cause() {
        let p = Path::new("some/path");
        let cases = [
            (
                std::io::Error::from_raw_os_error(libc::ELOOP),
                "symlink loop",
            ),
            (
                std::io::Error::from(std::io::ErrorKind::PermissionDenied),
                "permission denied",
            ),
            (
                std::io::Error::from_raw_os_error(libc::EACCES),
                "permission denied",
            ),
            (
                std::io::Error::from_raw_os_error(libc::ENOTDIR),
                "not a directory",
            ),
            (
                std::io::Error::from_raw_os_error(libc::ENAMETOOLONG),
                "too long",
            ),
        ];
        for (e, want) in cases {
            let err = path_error(p, e);
            let msg = err.to_string();
            assert!(msg.contains(want) && msg.contains("some/path"), "{msg}");
            assert!(err.hint().is_some(), "{msg}");
        }
        // Anything else stays the I/O error, with its cause.
        let err = path_error(p, std::io::Error::from_raw_os_error(libc::EIO));
        assert!(matches!(err, Error::Io { .. }), "{err}");
    }

    #[test]
    fn loops_and_dangling_links_are_not_hub_ids() {
        let t = tempfile::tempdir().unwrap();
        let l = t.path().join("loop");
        std::os::unix::fs::symlink(&l, &l).unwrap();
        let e = open(l.to_str().unwrap()).err().unwrap().to_string();
        assert!(e.contains("symlink loop"), "{e}");
        let d = t.path().join("dangling");
        std::os::unix::fs::symlink(t.path().join("gone"), &d).unwrap();
        let e = open(d.to_str().unwrap()).err().unwrap().to_string();
        assert!(e.contains("which does not exist"), "{e}");
    }

    /// A checkpoint directory whose `config.json` is a link to a file (every hub cache
    /// snapshot's is) opens; one whose link dangles or whose `config.json` is a FIFO is
    /// refused, each saying which.
    #[test]
    fn a_linked_config_is_the_file_it_links_to() {
        let fix = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/kimi-k2.5-tiny/eagle3");
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("ck");
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::symlink(fix.join("model.safetensors"), d.join("model.safetensors"))
            .unwrap();
        std::fs::copy(fix.join("config.json"), t.path().join("blob")).unwrap();
        std::os::unix::fs::symlink(t.path().join("blob"), d.join("config.json")).unwrap();
        open_dir(&d).expect("a linked config.json opens");
        std::fs::remove_file(t.path().join("blob")).unwrap();
        let e = open_dir(&d).err().unwrap().to_string();
        assert!(e.contains("which does not exist"), "{e}");
        std::fs::remove_file(d.join("config.json")).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(d.join("config.json"))
            .status()
            .unwrap();
        assert!(made.success());
        let e = open_dir(&d).err().unwrap().to_string();
        assert!(e.contains("is not a regular file"), "{e}");
    }
}
