//! Text inputs a user names (prompt files, tokenizers, chat templates, their configs): opened
//! only when they are regular files no larger than a stated bound, as checkpoints are, so that
//! `/dev/zero`, a FIFO with no writer or a runaway file is an `error:` at once, never an
//! endless read or a hang.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};

/// Prompt files (`--prompts`, `trace prompts --prompts`, `trace import --prompts`).
pub const MAX_PROMPTS: u64 = 4 << 30;
/// `tokenizer.json` / `tiktoken.model`.
pub const MAX_TOKENIZER: u64 = 1 << 30;
/// `tokenizer_config.json`, a chat template file.
pub const MAX_CONFIG: u64 = 64 << 20;

/// Open `path` for reading if it is a regular file (links followed) of at most `max` bytes;
/// `what` names it in the error.
pub fn open_regular(path: &Path, max: u64, what: &str) -> Result<File> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io("read", path, e))?;
    if !meta.is_file() {
        return Err(Error::Source {
            path: path.into(),
            msg: format!("is not a regular file (a {what} is read whole; a device, FIFO or directory is not one)"),
            hint: Some(format!("give the {what} as a regular file")),
        });
    }
    if meta.len() > max {
        return Err(too_big(path, max, what));
    }
    // O_NONBLOCK is not needed: a regular file never blocks an open.
    File::open(path).map_err(|e| Error::io("read", path, e))
}

/// The whole of `path` ([`open_regular`]); a file that grows past `max` while read is refused
/// too.
pub fn read_regular(path: &Path, max: u64, what: &str) -> Result<Vec<u8>> {
    let f = open_regular(path, max, what)?;
    let mut bytes = Vec::new();
    f.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io("read", path, e))?;
    if bytes.len() as u64 > max {
        return Err(too_big(path, max, what));
    }
    Ok(bytes)
}

/// [`read_regular`] as UTF-8 text.
pub fn read_regular_text(path: &Path, max: u64, what: &str) -> Result<String> {
    String::from_utf8(read_regular(path, max, what)?).map_err(|e| Error::Source {
        path: path.into(),
        msg: format!("is not UTF-8 text: {e}"),
        hint: Some(format!("a {what} is UTF-8 text")),
    })
}

fn too_big(path: &Path, max: u64, what: &str) -> Error {
    Error::Source {
        path: path.into(),
        msg: format!("is larger than the {} MiB a {what} may be", max >> 20),
        hint: Some(format!(
            "split the {what}, or check that this is the file meant"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_fifos_directories_and_big_files_are_refused() {
        let d = tempfile::tempdir().unwrap();
        for p in ["/dev/zero", "/dev/null", d.path().to_str().unwrap()] {
            let e = read_regular(Path::new(p), 1 << 20, "prompt file").unwrap_err();
            assert!(e.to_string().contains("not a regular file"), "{p}: {e}");
            assert!(e.hint().is_some());
        }
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Refused at once, never blocked waiting for a writer.
        let e = open_regular(&fifo, 1 << 20, "prompt file").unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let big = d.path().join("big");
        std::fs::write(&big, vec![b'a'; 3 << 20]).unwrap();
        let e = read_regular(&big, 2 << 20, "template").unwrap_err();
        assert!(e.to_string().contains("larger than the 2 MiB"), "{e}");
        assert_eq!(
            read_regular(&big, 3 << 20, "template").unwrap().len(),
            3 << 20
        );
    }
}
