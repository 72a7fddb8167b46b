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

impl HubId {
    /// Parse `org/name[@revision]`; `None` when the text is not shaped like a hub id.
    pub fn parse(s: &str) -> Option<HubId> {
        let (repo, rev) = match s.split_once('@') {
            Some((r, v)) => (r, Some(v)),
            None => (s, None),
        };
        let (org, name) = repo.split_once('/')?;
        let ok = |p: &str| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        };
        if !ok(org) || !ok(name) {
            return None;
        }
        let revision = match rev {
            None => "main".to_string(),
            Some(v)
                if !v.is_empty()
                    && !v.contains("..")
                    && v.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._/-".contains(c)) =>
            {
                v.to_string()
            }
            Some(_) => return None,
        };
        Some(HubId {
            repo: repo.to_string(),
            revision,
        })
    }

    pub fn display(&self) -> String {
        format!("{}@{}", self.repo, self.revision)
    }
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
        let cache_root = cache_dir();
        HubFetcher {
            id,
            cache: Cache::new(cache_root.clone()),
            cache_root,
            offline: offline(),
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
        let folder = self
            .cache_root
            .join(format!("models--{}", self.id.repo.replace('/', "--")));
        let rev = &self.id.revision;
        let commit = std::fs::read_to_string(folder.join("refs").join(rev))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| rev.clone());
        let dir = folder.join("snapshots").join(commit);
        dir.is_dir().then_some(dir)
    }

    /// Path of `file` in the repo, or `None` when the repo does not have it.
    pub fn get(&self, file: &str) -> Result<Option<PathBuf>> {
        if let Some(p) = self.cache.repo(self.repo()).get(file) {
            return Ok(Some(p));
        }
        // A revision given as a commit hash has no `refs/` entry: look in its snapshot directly.
        if let Some(p) = self
            .snapshot_dir()
            .map(|d| d.join(file))
            .filter(|p| p.is_file())
        {
            return Ok(Some(p));
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
            Ok(p) => Ok(Some(p)),
            Err(e) if e.to_string().contains("status code 404") => Ok(None),
            Err(e) => Err(self.err(format!("cannot download `{file}`: {e}"))),
        }
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
        ] {
            assert_eq!(HubId::parse(bad), None, "{bad}");
        }
    }
}
