//! `kquant-manifest.json`: what made an output (kquant version, command line) and the sha256
//! of every input and output file, so `kquant verify-files` can re-check it later.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::hash::file_sha256;
use crate::error::{Error, Result};

/// File name of the manifest inside every output directory.
pub const MANIFEST_FILE: &str = "kquant-manifest.json";

/// A file's manifest entry: its path as given, length and sha256, streamed.
pub fn hash_file(path: &Path) -> Result<FileEntry> {
    let (bytes, sha256) = file_sha256(path)?;
    Ok(FileEntry {
        file: path.display().to_string(),
        bytes,
        sha256,
    })
}

/// One hashed file. Outputs use the bare file name; inputs the path as given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub file: String,
    pub bytes: u64,
    pub sha256: String,
}

/// One input file: its path as given, its size, and its sha256 when it was hashed (files up
/// to [`HASH_INPUTS_UP_TO`] always; larger ones with `--hash-inputs`, since hashing a
/// multi-GB input costs a core for seconds and nothing downstream needs it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputEntry {
    pub file: String,
    pub bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// Inputs at most this large are always hashed into the manifest.
pub const HASH_INPUTS_UP_TO: u64 = 64 << 20;

/// The manifest document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub kquant_version: String,
    pub command: Vec<String>,
    pub created_unix: u64,
    pub inputs: Vec<InputEntry>,
    pub outputs: Vec<FileEntry>,
}

/// The result of re-hashing an output against its manifest.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Check {
    pub ok: Vec<String>,
    pub mismatched: Vec<String>,
    pub missing: Vec<String>,
    pub unlisted: Vec<String>,
}

impl Check {
    pub fn passed(&self) -> bool {
        self.mismatched.is_empty() && self.missing.is_empty() && self.unlisted.is_empty()
    }
}

impl Manifest {
    pub fn new(command: Vec<String>, inputs: Vec<InputEntry>, outputs: Vec<FileEntry>) -> Self {
        let created_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Manifest {
            format: "kquant-manifest/1".into(),
            kquant_version: env!("CARGO_PKG_VERSION").into(),
            command,
            created_unix,
            inputs,
            outputs,
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("manifest JSON");
        v.push(b'\n');
        v
    }

    /// Read `DIR/kquant-manifest.json`.
    pub fn read(dir: &Path) -> Result<Manifest> {
        let path = dir.join(MANIFEST_FILE);
        let bytes = super::text::read_bounded(&path, super::text::MAX_CONFIG, "kquant manifest")?;
        serde_json::from_slice(&bytes).map_err(|e| Error::Manifest {
            path,
            msg: format!("not a kquant manifest: {e}"),
        })
    }

    /// Re-hash every output file listed and look for files the manifest does not list.
    pub fn check(&self, dir: &Path) -> Result<Check> {
        let mut c = Check::default();
        for o in &self.outputs {
            if !super::index::is_plain_file_name(&o.file) {
                return Err(Error::Manifest {
                    path: dir.join(MANIFEST_FILE),
                    msg: format!("unsafe file name `{}`", o.file),
                });
            }
            let p = dir.join(&o.file);
            if !p.is_file() {
                c.missing.push(o.file.clone());
                continue;
            }
            let h = hash_file(&p)?;
            if h.sha256 == o.sha256 && h.bytes == o.bytes {
                c.ok.push(o.file.clone());
            } else {
                c.mismatched.push(o.file.clone());
            }
        }
        let rd = std::fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))?;
        for e in rd.filter_map(|e| e.ok()) {
            let n = e.file_name().to_string_lossy().into_owned();
            if n != MANIFEST_FILE && !self.outputs.iter().any(|o| o.file == n) {
                c.unlisted.push(n);
            }
        }
        c.unlisted.sort();
        Ok(c)
    }
}
