//! The paths this process reads, so that no output of it can be one of them, hold one, or sit
//! inside one (docs/io.md, "Writing: the guarantees").
//!
//! Two ways in, so that a new flag or a new reader is covered without being listed anywhere:
//! - the binary notes every value of every command-line argument that names an existing file or
//!   directory, except the arguments that name outputs ([`OUTPUT_ARGS`]) — before the command
//!   runs, so even a path the command opens after it claimed its output is covered;
//! - the readers note what they open: checkpoint directories and shards (`io::source`,
//!   `io::shard`, hub snapshots included), bounded text files (`io::text`), traces.
//!
//! [`crate::io::output::Claim`] holds its output against every path noted here (and the sources
//! its caller names) when it is made and again before it commits;
//! [`crate::io::output::check_output_args`] does it for every output a command line names before
//! the command runs.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The argument ids (clap's, the field names) whose values are outputs, not reads.
pub const OUTPUT_ARGS: &[&str] = &[
    "output",
    "out",
    "json",
    "junit",
    "write_trace",
    "write_preset",
];

static READS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Note that this process reads `p` (a file or a directory). Paths that do not exist are
/// ignored (nothing can be lost there).
pub fn note(p: &Path) {
    if std::fs::symlink_metadata(p).is_err() {
        return;
    }
    let mut r = READS.lock().unwrap_or_else(|e| e.into_inner());
    if !r.iter().any(|q| q == p) {
        r.push(p.to_path_buf());
    }
}

/// Every path noted so far.
pub fn noted() -> Vec<PathBuf> {
    READS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Note the values of a parsed command line's arguments (and its subcommands') that name an
/// existing path, except those of [`OUTPUT_ARGS`].
pub fn note_args(m: &clap::ArgMatches) {
    for id in m.ids() {
        if OUTPUT_ARGS.contains(&id.as_str()) {
            continue;
        }
        // Values that came from the command line or the environment, not clap's defaults.
        if matches!(
            m.value_source(id.as_str()),
            Some(clap::parser::ValueSource::DefaultValue) | None
        ) {
            continue;
        }
        let Ok(Some(raw)) = m.try_get_raw(id.as_str()) else {
            continue;
        };
        for v in raw {
            note(Path::new(v));
        }
    }
    if let Some((_, sub)) = m.subcommand() {
        note_args(sub);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_existing_paths_once() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("x");
        std::fs::write(&f, b"1").unwrap();
        note(&f);
        note(&f);
        note(&d.path().join("missing"));
        let n = noted();
        assert_eq!(n.iter().filter(|p| **p == f).count(), 1);
        assert!(!n.iter().any(|p| p.ends_with("missing")));
    }
}
