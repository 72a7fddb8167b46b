//! sha256 as kquant writes it everywhere (manifests, trace headers, prompt-set ids): lower-case
//! hex, and a file's digest streamed from disk.

use std::fs::File;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A file's length and sha256 (lower-case hex), streamed.
pub fn file_sha256(path: &Path) -> Result<(u64, String)> {
    let mut f = File::open(path).map_err(|e| Error::io("open", path, e))?;
    let mut h = Sha256::new();
    let bytes = std::io::copy(&mut f, &mut h).map_err(|e| Error::io("read", path, e))?;
    Ok((bytes, hex(&h.finalize())))
}
