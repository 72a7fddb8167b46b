//! Hub ids (`org/name[@revision]`) resolved through the standard Hugging Face cache with the
//! `hf-hub` crate. With `HF_HUB_OFFLINE=1` only the cache is consulted.

use std::path::{Path, PathBuf};

use hf_hub::{Cache, Repo, RepoType};

use crate::error::{Error, Result};

/// A parsed hub id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubId {
    pub repo: String,
    pub revision: String,
}

/// The longest revision accepted (git refs and commit hashes are far shorter).
pub const MAX_REVISION_LEN: usize = 255;

impl HubId {
    /// Parse `org/name[@revision]`; `None` when the text is not shaped like a hub id, or its
    /// revision is refused (see [`HubId::parse_checked`]).
    pub fn parse(s: &str) -> Option<HubId> {
        Self::parse_checked(s).ok().flatten()
    }

    /// Parse `org/name[@revision]`: `Ok(None)` when the text is not shaped like a hub id,
    /// `Err(why)` when it is (`org/name@…`) but the revision is not a branch, tag or commit
    /// name. A revision may hold `/` (`refs/pr/1`), but is never absolute, never has an empty,
    /// `.` or `..` component, and holds only ASCII letters, digits and `._-/`, so that it
    /// stays inside the cache when joined under `refs/` or `snapshots/`.
    pub fn parse_checked(s: &str) -> Result<Option<HubId>, String> {
        let (repo, rev) = match s.split_once('@') {
            Some((r, v)) => (r, Some(v)),
            None => (s, None),
        };
        let Some((org, name)) = repo.split_once('/') else {
            return Ok(None);
        };
        let ok = |p: &str| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        };
        if !ok(org) || !ok(name) {
            return Ok(None);
        }
        let revision = match rev {
            None => "main".to_string(),
            Some(v) => {
                check_revision(v)?;
                v.to_string()
            }
        };
        Ok(Some(HubId {
            repo: repo.to_string(),
            revision,
        }))
    }

    pub fn display(&self) -> String {
        format!("{}@{}", self.repo, self.revision)
    }

    /// This repo's folder in the cache at `root` (`models--org--name`).
    pub fn folder(&self, root: &Path) -> PathBuf {
        root.join(format!("models--{}", self.repo.replace('/', "--")))
    }
}

/// Why `v` is not a revision (branch, tag, `refs/pr/N` or commit hash) kquant accepts.
fn check_revision(v: &str) -> Result<(), String> {
    let shown = crate::escape::printable(v);
    if v.is_empty() {
        return Err("the revision after `@` is empty".into());
    }
    if v.len() > MAX_REVISION_LEN {
        return Err(format!(
            "the revision is {} bytes long (at most {MAX_REVISION_LEN})",
            v.len()
        ));
    }
    if let Some(c) = v
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "._/-".contains(*c)))
    {
        return Err(format!(
            "revision `{shown}` holds `{}`; a revision holds only ASCII letters, digits and `._-/`",
            crate::escape::printable(&c.to_string())
        ));
    }
    if v.starts_with('/') {
        return Err(format!("revision `{shown}` is an absolute path"));
    }
    if v.contains("..") {
        return Err(format!("revision `{shown}` holds `..`"));
    }
    if v.split('/').any(|c| c.is_empty() || c == ".") {
        return Err(format!(
            "revision `{shown}` has an empty or `.` path component"
        ));
    }
    Ok(())
}

/// Whether `p`, read lexically (no file system), is `root` or below it: it starts with `root`
/// and nothing after `root` is `..`, `.` or a new root.
pub fn lexically_inside(root: &Path, p: &Path) -> bool {
    use std::path::Component;
    p.strip_prefix(root)
        .is_ok_and(|rest| rest.components().all(|c| matches!(c, Component::Normal(_))))
}

/// The cache directory: `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`.
pub fn cache_dir() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("HF_HUB_CACHE")
        .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/huggingface/hub")))
        .unwrap_or_else(|| PathBuf::from(".cache/huggingface/hub"))
}

/// Whether `HF_HUB_OFFLINE` asks for cache-only resolution.
pub fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .map(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
        .unwrap_or(false)
}

/// Fetches files of one hub repo, from the cache or (online) the hub.
pub struct HubFetcher {
    pub id: HubId,
    cache: Cache,
    cache_root: PathBuf,
    offline: bool,
}

impl HubFetcher {
    pub fn new(id: HubId) -> HubFetcher {
        Self::with_cache(id, cache_dir(), offline())
    }

    /// A fetcher on the cache at `cache_root` (`offline`: never download).
    pub fn with_cache(id: HubId, cache_root: PathBuf, offline: bool) -> HubFetcher {
        HubFetcher {
            id,
            cache: Cache::new(cache_root.clone()),
            cache_root,
            offline,
        }
    }

    fn repo(&self) -> Repo {
        Repo::with_revision(
            self.id.repo.clone(),
            RepoType::Model,
            self.id.revision.clone(),
        )
    }

    /// The snapshot directory of this revision in the cache, if present.
    pub fn snapshot_dir(&self) -> Option<PathBuf> {
        let folder = self.id.folder(&self.cache_root);
        let rev = &self.id.revision;
        let commit = std::fs::read_to_string(folder.join("refs").join(rev))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| rev.clone());
        let dir = folder.join("snapshots").join(commit);
        dir.is_dir().then_some(dir)
    }

    /// Path of `file` in the repo, or `None` when the repo does not have it. A path found in
    /// the cache (or downloaded into it) must lie in one of this repo's snapshot directories,
    /// after every symlink is resolved: a `refs/` file or a snapshot that points elsewhere is
    /// refused, not followed.
    pub fn get(&self, file: &str) -> Result<Option<PathBuf>> {
        if !super::index::is_plain_file_name(file) {
            return Err(self.err(format!(
                "`{}` is not a plain file name",
                crate::escape::printable(file)
            )));
        }
        if let Some(p) = self.cache.repo(self.repo()).get(file) {
            return self.inside_cache(p).map(Some);
        }
        // A revision given as a commit hash has no `refs/` entry: look in its snapshot directly.
        if let Some(p) = self
            .snapshot_dir()
            .map(|d| d.join(file))
            .filter(|p| p.is_file())
        {
            return self.inside_cache(p).map(Some);
        }
        if self.offline {
            return Ok(None);
        }
        let api = hf_hub::api::sync::ApiBuilder::from_cache(self.cache.clone())
            .with_token(std::env::var("HF_TOKEN").ok())
            .with_progress(true)
            .build()
            .map_err(|e| self.err(format!("cannot start the hub client: {e}")))?;
        match api.repo(self.repo()).get(file) {
            Ok(p) => self.inside_cache(p).map(Some),
            Err(e) if e.to_string().contains("status code 404") => Ok(None),
            Err(e) => Err(self.err(format!("cannot download `{file}`: {e}"))),
        }
    }

    /// `p` if its directory, symlinks resolved, is a snapshot directory of this repo in the
    /// cache (`<cache>/models--org--name/snapshots/<commit>`, also resolved).
    fn inside_cache(&self, p: PathBuf) -> Result<PathBuf> {
        let snapshots = self.id.folder(&self.cache_root).join("snapshots");
        let outside = |shown: &Path| {
            Error::Hub {
                id: self.id.display(),
                msg: format!(
                    "`{}` resolves to `{}`, outside the snapshots of the cache at `{}`",
                    p.display(),
                    shown.display(),
                    self.cache_root.display()
                ),
                hint: Some(format!(
                    "a `refs/` file or snapshot directory under `{}` points out of the cache: delete it and download the model again",
                    snapshots.display()
                )),
            }
        };
        let dir = p.parent().unwrap_or(Path::new(""));
        let (Ok(real_dir), Ok(real_snapshots)) = (dir.canonicalize(), snapshots.canonicalize())
        else {
            return Err(outside(dir));
        };
        if real_dir.parent() != Some(real_snapshots.as_path()) {
            return Err(outside(&real_dir));
        }
        Ok(p)
    }

    pub fn err(&self, msg: String) -> Error {
        Error::Hub {
            id: self.id.display(),
            msg,
            hint: Some(if self.offline {
                format!(
                    "HF_HUB_OFFLINE is set, so only the cache at `{}` is used: download the model there first, or unset HF_HUB_OFFLINE",
                    self.cache_root.display()
                )
            } else {
                "check the id and revision, network access and HF_TOKEN; or set HF_HUB_OFFLINE=1 to use the cache only".into()
            }),
        }
    }

    pub fn cache_root(&self) -> &Path {
        &self.cache_root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_ids() {
        assert_eq!(
            HubId::parse("moonshotai/Kimi-K2.5"),
            Some(HubId {
                repo: "moonshotai/Kimi-K2.5".into(),
                revision: "main".into()
            })
        );
        assert_eq!(HubId::parse("a/b@v1.0").unwrap().revision, "v1.0");
        assert_eq!(HubId::parse("a/b@refs/pr/1").unwrap().revision, "refs/pr/1");
        for bad in [
            "a",
            "a/b/c",
            "../b",
            "a/..",
            "/abs",
            "a/b@",
            "a/b@x y",
            "a/b@../../x",
            "a/b@/some/dir",
            "a/b@refs//x",
            "a/b@refs/./x",
            "a/b@x/",
            "a/b@x\\y",
            "a/b@x\0y",
        ] {
            assert_eq!(HubId::parse(bad), None, "{bad}");
        }
        // Shaped like a hub id but with a bad revision: refused with the reason.
        let e = HubId::parse_checked("org/name@/some/dir").unwrap_err();
        assert!(e.contains("absolute"), "{e}");
        assert!(HubId::parse_checked("org/name@a..b")
            .unwrap_err()
            .contains(".."));
        assert!(HubId::parse_checked(&format!("o/n@{}", "a".repeat(256))).is_err());
        assert!(HubId::parse_checked(&format!("o/n@{}", "a".repeat(255))).is_ok());
        // Not shaped like a hub id at all: a path, left to the caller.
        assert_eq!(HubId::parse_checked("/abs@x"), Ok(None));
        assert_eq!(HubId::parse_checked("model.safetensors"), Ok(None));
    }

    use crate::test_rng::Rng;

    /// Random ids built from the pieces that matter (separators, dots, `@`, absolute starts,
    /// odd bytes): parsing never panics, and every accepted id's `refs/` and `snapshots/`
    /// paths stay inside the cache, read lexically.
    #[test]
    fn random_ids_never_escape_the_cache() {
        let pieces = [
            "a", "b", "org", "name", "/", "/", "@", "@", ".", "..", "-", "_", "refs", "pr", "1",
            "\\", "\0", " ", "~", ":", "é", "/tmp", "main", "%2e",
        ];
        let root = Path::new("/cache/hub");
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let mut accepted = 0;
        for _ in 0..100_000 {
            let n = 1 + rng.next() % 10;
            let mut s: String = (0..n).map(|_| *rng.pick(&pieces)).collect();
            if rng.next().is_multiple_of(2) {
                s = format!("org/name@{s}");
            }
            if let Some(id) = HubId::parse(&s) {
                accepted += 1;
                let folder = id.folder(root);
                assert!(lexically_inside(root, &folder), "{s:?}");
                for sub in ["refs", "snapshots"] {
                    let p = folder.join(sub).join(&id.revision);
                    assert!(lexically_inside(&folder.join(sub), &p), "{s:?} -> {p:?}");
                }
            }
        }
        assert!(accepted > 1_000, "{accepted}");
    }

    /// A cache whose `refs/` file or revision points out of it: what is found there is refused,
    /// whatever the revision; a proper snapshot is found.
    #[test]
    fn paths_found_outside_the_snapshots_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("hub");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("config.json"), "{}").unwrap();
        let folder = root.join("models--org--name");
        let snap = folder.join("snapshots").join("abc123");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::write(snap.join("config.json"), "{}").unwrap();
        std::fs::create_dir_all(folder.join("refs")).unwrap();
        std::fs::write(folder.join("refs/main"), "abc123\n").unwrap();
        std::fs::write(folder.join("refs/evil"), "../../../outside").unwrap();
        // A snapshot directory that is a symlink out of the cache.
        std::os::unix::fs::symlink(&outside, folder.join("snapshots/linked")).unwrap();
        let get = |rev: &str| {
            let id = HubId::parse(&format!("org/name@{rev}")).unwrap();
            HubFetcher::with_cache(id, root.clone(), true).get("config.json")
        };
        assert_eq!(get("main").unwrap(), Some(snap.join("config.json")));
        assert_eq!(get("abc123").unwrap(), Some(snap.join("config.json")));
        for rev in ["evil", "linked"] {
            let e = get(rev).unwrap_err().to_string();
            assert!(e.contains("outside the snapshots"), "{rev}: {e}");
        }
        assert_eq!(get("nothere").unwrap(), None);
        let id = HubId::parse("org/name").unwrap();
        assert!(HubFetcher::with_cache(id, root.clone(), true)
            .get("../config.json")
            .is_err());
    }
}
