//! Files read whole (prompt files, tokenizers, chat templates, checkpoint configs and indexes,
//! amax files, manifests): opened
//! only when they are regular files no larger than a stated bound, as checkpoints are, so that
//! `/dev/zero`, a FIFO with no writer or a runaway file is an `error:` at once, never an
//! endless read or a hang.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

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
    super::reads::note(path);
    open_bounded(path, max, what)
}

/// [`open_regular`] without noting `path` as an input of the command: for a file kquant reads
/// to judge its own output (a manifest), which must not make that output a source.
fn open_bounded(path: &Path, max: u64, what: &str) -> Result<File> {
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
    super::reads::note(path);
    read_bounded(path, max, what)
}

/// [`read_regular`] without noting `path` as an input ([`open_bounded`]).
pub fn read_bounded(path: &Path, max: u64, what: &str) -> Result<Vec<u8>> {
    let f = open_bounded(path, max, what)?;
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

/// A JSON document named by a built-in name (`builtin`: name and text, compiled in; shown as
/// `builtin_path(name)`) or by the path of a file (a regular file of at most [`MAX_CONFIG`]):
/// quantize presets and target profiles. Neither: `not_found(the built-in names, joined)`.
pub fn builtin_or_file(
    spec: &str,
    builtin: &[(&str, &'static str)],
    builtin_path: impl Fn(&str) -> PathBuf,
    what: &str,
    not_found: impl FnOnce(String) -> Error,
) -> Result<(PathBuf, std::borrow::Cow<'static, str>)> {
    if let Some((name, text)) = builtin.iter().find(|(n, _)| *n == spec) {
        return Ok((builtin_path(name), std::borrow::Cow::Borrowed(text)));
    }
    let p = Path::new(spec);
    if p.exists() {
        let text = read_regular_text(p, MAX_CONFIG, what)?;
        return Ok((p.to_path_buf(), std::borrow::Cow::Owned(text)));
    }
    Err(not_found(
        builtin
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", "),
    ))
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

    /// A built-in by name, else a file by path, else the caller's error with the names.
    #[test]
    fn builtin_or_file_takes_a_name_then_a_path() {
        let builtin: &[(&str, &str)] = &[("a", "{\"x\": 1}"), ("b", "{}")];
        let path = |n: &str| PathBuf::from(format!("dir/{n}.json"));
        let nf = |names: String| Error::Usage(format!("none; have {names}"));
        let (p, t) = builtin_or_file("a", builtin, path, "preset", nf).unwrap();
        assert_eq!((p, t.as_ref()), (PathBuf::from("dir/a.json"), "{\"x\": 1}"));
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("mine.json");
        std::fs::write(&f, "{\"y\": 2}").unwrap();
        let (p, t) = builtin_or_file(f.to_str().unwrap(), builtin, path, "preset", nf).unwrap();
        assert_eq!((p, t.as_ref()), (f.clone(), "{\"y\": 2}"));
        let e = builtin_or_file("c", builtin, path, "preset", nf).unwrap_err();
        assert!(e.to_string().contains("none; have a, b"), "{e}");
        let e = builtin_or_file("/dev/zero", builtin, path, "preset", nf).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

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
