//! Output claims: the one place where kquant decides that it may write an output, where the
//! output is built, and how it is put under its final name. Checkpoints, traces and report
//! files all go through it (docs/io.md, "Writing: the guarantees").
//!
//! A claim of `DIR/NAME`:
//! 1. checks the name and its parent (`error:` naming the path, exit 2), and that the output
//!    would not be, or hold, any source of the command;
//! 2. takes `DIR/.NAME.kquant-lock` with `flock` (released by the kernel when the process dies):
//!    a second kquant writing the same output is refused at once, before either writes;
//! 3. under the lock, cleans what a killed run left for this output (the partial output
//!    `.NAME.kquant-partial`, or `.NAME.kquant-old` of an interrupted replacement, which is put
//!    back when `NAME` is missing), and reports the leftovers of other outputs in `DIR`;
//! 4. refuses an existing `NAME` without `--force`, and with it anything kquant did not write
//!    (a checkpoint without its `kquant-manifest.json`, or with files the manifest does not
//!    list; a file that is not a kquant report; a symbolic link);
//! 5. gives the caller the staging path `.NAME.kquant-partial` to build the output in.
//!
//! [`Claim::commit`] renames the staging path to `NAME` without replacing anything
//! (`renameat2(RENAME_NOREPLACE)`), or, with `--force`, swaps it with the old output in one
//! step (`RENAME_EXCHANGE`) and then deletes the old one, so `NAME` is never missing. Where the
//! filesystem has no `renameat2`, the old output is first renamed to `.NAME.kquant-old`, and a
//! run killed between the two renames is repaired by the next claim. Dropping an uncommitted
//! claim removes the staging path; a signal removes it too (`io::interrupt`).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::interrupt;
use super::manifest::MANIFEST_FILE;
use crate::error::{Error, Result};

/// Suffix of the lock file of `NAME`.
pub const LOCK_SUFFIX: &str = ".kquant-lock";
/// Suffix of the staging path of `NAME`.
pub const PARTIAL_SUFFIX: &str = ".kquant-partial";
/// Suffix of the old output during a replacement without `renameat2`.
pub const OLD_SUFFIX: &str = ".kquant-old";
/// Longest file name (bytes) on the filesystems kquant writes to.
const NAME_MAX: usize = 255;

/// What kind of output is claimed, and so how an existing one is recognised as kquant's.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// A directory whose `kquant-manifest.json` lists every other file in it.
    Checkpoint,
    /// A kquant-trace/1 directory: `manifest.json` and the shards it lists.
    Trace,
    /// One file; `is_ours` recognises the bytes of a file kquant wrote (a report's schema).
    File {
        what: &'static str,
        is_ours: fn(&[u8]) -> bool,
        /// The flag that names it (`-o`, `--junit`, `--json`, `--write-preset`), for hints.
        flag: &'static str,
    },
}

impl Kind {
    fn is_dir(self) -> bool {
        !matches!(self, Kind::File { .. })
    }
    /// The flag that names an output of this kind.
    fn flag(self) -> &'static str {
        match self {
            Kind::File { flag, .. } => flag,
            _ => "-o",
        }
    }
}

/// An output this process may write (see the module docs).
#[derive(Debug)]
pub struct Claim {
    out: PathBuf,
    kind: Kind,
    force: bool,
    lock: Option<File>,
    lock_path: PathBuf,
    staging: PathBuf,
    old: PathBuf,
    registration: Option<interrupt::OutputRegistration>,
    committed: bool,
}

/// What [`Claim::commit`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// An existing output was replaced.
    pub replaced: bool,
}

fn out_err(out: &Path, msg: impl Into<String>, hint: Option<String>) -> Error {
    Error::Output {
        path: out.into(),
        msg: msg.into(),
        hint,
    }
}

/// `.NAME` + `suffix`, shortened (a prefix of NAME, `~`, a hash of NAME) when it would pass
/// the filesystem's name limit.
pub fn side_name(name: &OsStr, suffix: &str) -> OsString {
    let b = name.as_bytes();
    if 1 + b.len() + suffix.len() <= NAME_MAX {
        let mut v = Vec::with_capacity(1 + b.len() + suffix.len());
        v.push(b'.');
        v.extend_from_slice(b);
        v.extend_from_slice(suffix.as_bytes());
        return OsString::from_vec(v);
    }
    let h = Sha256::digest(b);
    let tag: String = h[..6].iter().map(|x| format!("{x:02x}")).collect();
    let keep = NAME_MAX - 1 - 1 - tag.len() - suffix.len();
    let mut v = vec![b'.'];
    v.extend_from_slice(&b[..keep]);
    v.push(b'~');
    v.extend_from_slice(tag.as_bytes());
    v.extend_from_slice(suffix.as_bytes());
    OsString::from_vec(v)
}

impl Claim {
    /// Claim `out` (see the module docs). `sources` are the files (or directories) the command
    /// reads; the output may not be one of them or hold one.
    pub fn new(out: &Path, kind: Kind, force: bool, sources: &[PathBuf]) -> Result<Claim> {
        // `DIR/.` and `DIR/..` have a file name to `Path` but name no new entry.
        let raw = out.as_os_str().as_bytes();
        let dots = raw
            .split(|&c| c == b'/')
            .rfind(|c| !c.is_empty())
            .is_some_and(|c| c == b"." || c == b"..");
        let name = match out.file_name() {
            Some(n) if !dots => n.to_os_string(),
            _ => {
                return Err(out_err(
                    out,
                    "is not a usable output name",
                    Some(format!(
                        "name the output itself, e.g. `{} out/draft-int4`",
                        kind.flag()
                    )),
                ))
            }
        };
        if name.len() > NAME_MAX {
            return Err(out_err(
                out,
                format!(
                    "the name is {} bytes long; at most {NAME_MAX} fit in a directory",
                    name.len()
                ),
                Some(format!("choose a shorter {}", kind.flag())),
            ));
        }
        let parent = out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        match std::fs::metadata(&parent) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(out_err(
                    out,
                    format!("`{}` is not a directory", parent.display()),
                    Some(format!(
                        "the part of {} before the last `/` must be a directory",
                        kind.flag()
                    )),
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(out_err(
                    out,
                    format!("the parent directory `{}` does not exist", parent.display()),
                    Some(format!(
                        "create it first (`mkdir -p`), or choose another {}",
                        kind.flag()
                    )),
                ))
            }
            Err(e) => return Err(Error::io("open the parent directory of", out, e)),
        }
        check_overlap(out, &parent, &name, sources)?;
        let side = |suffix| parent.join(side_name(&name, suffix));
        let mut c = Claim {
            out: out.into(),
            kind,
            force,
            lock: None,
            lock_path: side(LOCK_SUFFIX),
            staging: side(PARTIAL_SUFFIX),
            old: side(OLD_SUFFIX),
            registration: None,
            committed: false,
        };
        c.lock = Some(c.take_lock(&name)?);
        // From here a signal removes the staging path and the lock file (only a signal in the
        // microseconds between creating the lock file and this line can leave the lock file,
        // which is harmless: the next claim takes it over).
        c.registration = Some(interrupt::register_output(
            &c.staging,
            kind.is_dir(),
            &c.lock_path,
        ));
        fault("locked");
        c.repair()?;
        c.check_existing()?;
        if kind.is_dir() {
            std::fs::create_dir(&c.staging).map_err(|e| Error::io("create", &c.staging, e))?;
        }
        report_leftovers(&parent, &c.staging, &c.lock_path);
        Ok(c)
    }

    /// Where to build the output: a new directory, or the path of the file to create.
    pub fn staging(&self) -> &Path {
        &self.staging
    }

    /// The final output path.
    pub fn out(&self) -> &Path {
        &self.out
    }

    /// Take the lock file, or say who holds it.
    fn take_lock(&self, name: &OsStr) -> Result<File> {
        for _ in 0..16 {
            // Never through a symbolic link (a planted or dangling one would make kquant create
            // or write a file elsewhere): a link under the lock's name is refused.
            let mut f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&self.lock_path)
                .map_err(|e| {
                    if e.raw_os_error() == Some(libc::ELOOP) {
                        out_err(
                            &self.out,
                            format!(
                                "its lock file `{}` is a symbolic link, which kquant never makes",
                                self.lock_path.display()
                            ),
                            Some("remove the link (it is not kquant's), then run again".into()),
                        )
                    } else {
                        Error::io("create the lock file", &self.lock_path, e)
                    }
                })?;
            // Another claim's leftover report probes locks for a few microseconds: a lock
            // that is busy is asked again a few times before it counts as held.
            let held = !(0..5).any(|k| {
                if k > 0 {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                flock_exclusive(&f)
            });
            if held {
                let mut who = String::new();
                let _ = f.read_to_string(&mut who);
                let pid = who.lines().next().unwrap_or("?").trim().to_string();
                return Err(out_err(
                    &self.out,
                    format!("another kquant run (pid {pid}) is writing this output"),
                    Some(format!(
                        "wait for it to finish, or choose another {}",
                        self.kind.flag()
                    )),
                ));
            }
            // The holder before us may have removed the file after we opened it: only a lock on
            // the file that is still at the path counts.
            let here = std::fs::symlink_metadata(&self.lock_path);
            let ours = f
                .metadata()
                .map_err(|e| Error::io("stat", &self.lock_path, e))?;
            match here {
                Ok(m) if m.ino() == ours.ino() && m.dev() == ours.dev() => {
                    let mut note = format!("{}\n", std::process::id()).into_bytes();
                    note.extend_from_slice(name.as_bytes());
                    note.push(b'\n');
                    let written = if fault_set("lock-enospc") {
                        Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
                    } else {
                        f.set_len(0)
                            .and_then(|_| f.rewind())
                            .and_then(|_| f.write_all(&note))
                    };
                    if let Err(e) = written {
                        // Held by this process and at the path: ours to remove, so a full
                        // disk leaves no empty lock file behind.
                        let _ = std::fs::remove_file(&self.lock_path);
                        return Err(Error::io("write the lock file", &self.lock_path, e));
                    }
                    return Ok(f);
                }
                _ => continue,
            }
        }
        Err(out_err(
            &self.out,
            "could not take the output's lock file: it keeps being replaced",
            Some(format!(
                "another program is racing on this directory; choose another {}",
                self.kind.flag()
            )),
        ))
    }

    /// Under the lock: clean or repair what a killed run left for this output.
    fn repair(&self) -> Result<()> {
        if exists(&self.old) {
            if !exists(&self.out) {
                std::fs::rename(&self.old, &self.out)
                    .map_err(|e| Error::io("restore", &self.out, e))?;
                eprintln!(
                    "warning: `{}` was restored: an earlier --force replacement was killed \
                     after the old output was moved aside",
                    self.out.display()
                );
            } else {
                let size = tree_size(&self.old);
                remove_any(&self.old).map_err(|e| Error::io("remove", &self.old, e))?;
                eprintln!(
                    "warning: removed `{}` ({}), the old output of a --force replacement that \
                     was killed before it was deleted",
                    self.old.display(),
                    size_text(size)
                );
            }
        }
        if exists(&self.staging) {
            let size = tree_size(&self.staging);
            remove_any(&self.staging).map_err(|e| Error::io("remove", &self.staging, e))?;
            eprintln!(
                "warning: removed `{}` ({}), the partial output of an interrupted kquant run",
                self.staging.display(),
                size_text(size)
            );
        }
        Ok(())
    }

    /// Refuse an existing output without `--force`, and anything kquant did not write.
    fn check_existing(&self) -> Result<()> {
        if !exists(&self.out) {
            return Ok(());
        }
        if !self.force {
            return Err(out_err(
                &self.out,
                "already exists",
                Some(format!("pass --force to replace it (kquant replaces only outputs it wrote), or choose another {}", self.kind.flag())),
            ));
        }
        if let Err(why) = is_kquants(&self.out, self.kind) {
            return Err(out_err(
                &self.out,
                format!("exists and is not an output kquant wrote ({why}); refusing to replace it"),
                Some(format!(
                    "move it away yourself, or choose another {}",
                    self.kind.flag()
                )),
            ));
        }
        Ok(())
    }

    /// Put the staging output under the final name (see the module docs). The caller has
    /// written and fsynced every file in it.
    pub fn commit(mut self) -> Result<Committed> {
        // Held again against what the command read since the claim was made.
        if let (Some(parent), Some(name)) = (self.out.parent(), self.out.file_name()) {
            let parent = Some(parent)
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            check_overlap(&self.out, parent, name, &[])?;
        }
        if self.kind.is_dir() {
            sync_path(&self.staging)?;
        }
        fault("staged");
        let replaced = if !exists(&self.out) {
            match rename_noreplace(&self.staging, &self.out) {
                Ok(()) => false,
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    return Err(self.appeared());
                }
                Err(e) => return Err(Error::io("rename into place", &self.out, e)),
            }
        } else {
            if !self.force {
                return Err(self.appeared());
            }
            // Checked again: it may have changed while this run worked.
            self.check_existing()?;
            self.replace()?;
            true
        };
        self.committed = true;
        let parent = self.out.parent().filter(|p| !p.as_os_str().is_empty());
        sync_path(parent.unwrap_or(Path::new(".")))?;
        Ok(Committed { replaced })
    }

    fn appeared(&self) -> Error {
        out_err(
            &self.out,
            "appeared while kquant was writing it (not by kquant: kquant runs take a lock); \
             it was left as it is",
            Some(format!(
                "pass --force to replace it, or choose another {}",
                self.kind.flag()
            )),
        )
    }

    /// Delete the replaced output's old copy, now at `at`; warn when that fails (the next run
    /// writing the output deletes it).
    fn remove_old_copy(&self, at: &Path) {
        if let Err(e) = remove_old(at) {
            eprintln!(
                "warning: `{}` was replaced, but its old copy, now at `{}`, could not \
                 be deleted: {e}; the next kquant run writing it deletes it",
                self.out.display(),
                at.display()
            );
        }
    }

    /// Swap the staging output with the existing one, then delete the old one.
    fn replace(&mut self) -> Result<()> {
        match rename_exchange(&self.staging, &self.out) {
            Ok(()) => {
                fault("exchanged");
                self.remove_old_copy(&self.staging);
                Ok(())
            }
            Err(e) if exchange_unsupported(&e) => {
                std::fs::rename(&self.out, &self.old)
                    .map_err(|e| Error::io("move aside", &self.out, e))?;
                fault("moved-aside");
                std::fs::rename(&self.staging, &self.out)
                    .map_err(|e| Error::io("rename into place", &self.out, e))?;
                self.remove_old_copy(&self.old);
                Ok(())
            }
            Err(e) => Err(Error::io("replace", &self.out, e)),
        }
    }
}

/// Write a one-file output (`kind` is a [`Kind::File`]) through a claim: the bytes go to the
/// staging file, are fsynced, and the file is renamed into place.
pub fn write_file(
    out: &Path,
    kind: Kind,
    force: bool,
    sources: &[PathBuf],
    bytes: &[u8],
) -> Result<Committed> {
    let c = Claim::new(out, kind, force, sources)?;
    let p = c.staging().to_path_buf();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&p)
        .map_err(|e| Error::io("create", &p, e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::io("write", &p, e))?;
    drop(f);
    c.commit()
}

/// A JSON document whose `schema` starts with `prefix` (how kquant's JSON reports are known).
pub fn is_json_with_schema(bytes: &[u8], prefix: &str) -> bool {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| v["schema"].as_str().map(|s| s.starts_with(prefix)))
        .unwrap_or(false)
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.lock.is_none() {
            // Never claimed: the staging path and the lock are another run's.
            return;
        }
        if !self.committed {
            let _ = remove_any(&self.staging);
        }
        {
            // Unlinked while still held: a run that opened the old file sees that it is no
            // longer at the path and retries (see `take_lock`).
            let _ = std::fs::remove_file(&self.lock_path);
        }
        self.registration = None;
        self.lock = None;
    }
}

/// [`check_overlap`] of an output path named on the command line, before the command runs (so
/// that a refusal costs no capture or replay first); [`Claim::new`] checks again.
pub fn check_not_a_read(out: &Path) -> Result<()> {
    let (Some(name), parent) = (out.file_name(), out.parent()) else {
        return Ok(());
    };
    let parent = parent
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    check_overlap(out, parent, name, &[])
}

/// Hold every output a parsed command line names (the values of [`super::reads::OUTPUT_ARGS`]) against the
/// reads [`super::reads::note_args`] noted: an output that is, holds or sits inside one is refused before the
/// command does any work.
pub fn check_output_args(m: &clap::ArgMatches) -> Result<()> {
    for id in m.ids() {
        if !super::reads::OUTPUT_ARGS.contains(&id.as_str()) {
            continue;
        }
        // Only path values (`verify --json FILE`; `--json` alone is a switch elsewhere).
        let Ok(Some(vals)) = m.try_get_many::<std::path::PathBuf>(id.as_str()) else {
            continue;
        };
        for v in vals {
            if v.as_os_str() != "-" {
                check_not_a_read(v)?;
            }
        }
    }
    match m.subcommand() {
        Some((_, sub)) => check_output_args(sub),
        None => Ok(()),
    }
}

/// The output may not be a path the command reads, hold one, or sit inside one (so `--force`
/// can never delete or change a source): `sources` and every path `io::reads` noted, compared
/// after resolving symbolic links.
fn check_overlap(out: &Path, parent: &Path, name: &OsStr, sources: &[PathBuf]) -> Result<()> {
    let Ok(cparent) = std::fs::canonicalize(parent) else {
        return Ok(());
    };
    let cout = cparent.join(name);
    // Where `out` is a link, the place it leads to counts too.
    let linked = std::fs::canonicalize(out).ok().filter(|c| *c != cout);
    let noted = super::reads::noted();
    for s in sources.iter().chain(&noted) {
        let Ok(cs) = std::fs::canonicalize(s) else {
            continue;
        };
        for o in std::iter::once(&cout).chain(linked.as_ref()) {
            let how = if cs == *o {
                "the source"
            } else if cs.starts_with(o) {
                "a directory holding the source"
            } else if o.starts_with(&cs) {
                "inside the source"
            } else {
                continue;
            };
            return Err(out_err(
                out,
                format!("is {how} `{}`, which this command reads", s.display()),
                Some(
                    "write the output somewhere else: kquant never writes over, around or into its inputs"
                        .into(),
                ),
            ));
        }
    }
    Ok(())
}

/// Whether `p` is an output kquant wrote, and if not, why.
pub fn is_kquants(p: &Path, kind: Kind) -> std::result::Result<(), String> {
    let m = std::fs::symlink_metadata(p).map_err(|e| e.to_string())?;
    if m.file_type().is_symlink() {
        return Err("it is a symbolic link".into());
    }
    match kind {
        Kind::File { what, is_ours, .. } => {
            if !m.is_file() {
                return Err("it is not a regular file".into());
            }
            if m.len() > 64 << 20 {
                return Err(format!("it is larger than any {what} kquant writes"));
            }
            let bytes = std::fs::read(p).map_err(|e| e.to_string())?;
            if is_ours(&bytes) {
                Ok(())
            } else {
                Err(format!("it is not a {what} written by kquant"))
            }
        }
        Kind::Checkpoint | Kind::Trace => {
            if !m.is_dir() {
                return Err("it is not a directory".into());
            }
            let (mfile, listed) = match kind {
                Kind::Checkpoint => (MANIFEST_FILE, checkpoint_files(p)?),
                _ => ("manifest.json", trace_files(p)?),
            };
            let mut foreign = Vec::new();
            for e in std::fs::read_dir(p).map_err(|e| e.to_string())? {
                let e = e.map_err(|e| e.to_string())?;
                let n = e.file_name();
                let plain = e.file_type().map(|t| t.is_file()).unwrap_or(false);
                if n != mfile && !(plain && n.to_str().is_some_and(|n| listed.contains(n))) {
                    foreign.push(n.to_string_lossy().into_owned());
                }
            }
            if foreign.is_empty() {
                Ok(())
            } else {
                foreign.sort();
                let more = foreign.len().saturating_sub(5);
                foreign.truncate(5);
                Err(format!(
                    "it holds {} that its {mfile} does not list{}",
                    foreign
                        .iter()
                        .map(|f| format!("`{f}`"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    if more > 0 {
                        format!(" and {more} more")
                    } else {
                        String::new()
                    }
                ))
            }
        }
    }
}

fn checkpoint_files(p: &Path) -> std::result::Result<std::collections::HashSet<String>, String> {
    let m = super::manifest::Manifest::read(p)
        .map_err(|_| format!("it has no readable {MANIFEST_FILE}"))?;
    Ok(m.outputs.into_iter().map(|f| f.file).collect())
}

fn trace_files(p: &Path) -> std::result::Result<std::collections::HashSet<String>, String> {
    let bytes = std::fs::read(p.join("manifest.json"))
        .map_err(|_| "it has no manifest.json".to_string())?;
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|_| "its manifest.json is not JSON".to_string())?;
    if !v["format"]
        .as_str()
        .is_some_and(|f| f.starts_with("kquant-trace/"))
    {
        return Err("its manifest.json is not a kquant trace manifest".into());
    }
    Ok(v["shards"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s["file"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default())
}

/// Warn about what killed runs left beside other outputs in `dir` (a stale partial output, an
/// old output of an interrupted replacement, or a temporary directory of kquant < 0.2).
fn report_leftovers(dir: &Path, own_staging: &Path, own_lock: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let n = e.file_name();
        let b = n.as_bytes();
        let path = e.path();
        // kquant < 0.2 staged traces in `NAME.kquant-trace-tmp` (no leading dot).
        let old_trace = b.ends_with(b".kquant-trace-tmp");
        if path == own_staging || path == own_lock || !(b.starts_with(b".") || old_trace) {
            continue;
        }
        let (ours, lock) = if let Some(stem) = b.strip_suffix(PARTIAL_SUFFIX.as_bytes()) {
            (true, Some(stem))
        } else if let Some(stem) = b.strip_suffix(OLD_SUFFIX.as_bytes()) {
            (true, Some(stem))
        } else {
            (
                old_trace || n.to_string_lossy().contains(".kquant-tmp-"),
                None,
            )
        };
        if !ours {
            continue;
        }
        // A live run holds the lock of its output: its staging path is no leftover.
        if let Some(stem) = lock {
            let mut l = stem.to_vec();
            l.extend_from_slice(LOCK_SUFFIX.as_bytes());
            let lp = dir.join(OsStr::from_bytes(&l));
            if let Ok(f) = File::open(&lp) {
                if !flock_exclusive(&f) {
                    continue;
                }
            }
        }
        eprintln!(
            "warning: `{}` ({}) was left by a kquant run that was killed; re-running the \
             command that writes it cleans it up, or delete it",
            path.display(),
            size_text(tree_size(&path))
        );
    }
}

/// `12.3 MB`.
fn size_text(n: u64) -> String {
    format!("{:.1} MB", n as f64 / 1e6)
}

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

fn remove_any(p: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Bytes under `p` (files of a flat directory, or the file).
fn tree_size(p: &Path) -> u64 {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::read_dir(p)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0),
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

fn sync_path(p: &Path) -> Result<()> {
    File::open(p)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("fsync", p, e))
}

/// Non-blocking exclusive `flock`: false when another open file description holds it.
fn flock_exclusive(f: &File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on an open descriptor.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// Delete the old output after a replacement (`KQUANT_FAULT=keep-old` makes it fail, for the
/// test that a replacement whose old copy cannot be deleted still succeeds).
fn remove_old(p: &Path) -> std::io::Result<()> {
    if fault_set("keep-old") {
        return Err(std::io::Error::other("KQUANT_FAULT=keep-old"));
    }
    remove_any(p)
}

fn fault_set(point: &str) -> bool {
    std::env::var_os("KQUANT_FAULT").is_some_and(|v| v == point)
}

/// `KQUANT_FAULT=POINT` kills the process (SIGKILL) at that point of a claim: the kill tests
/// use it to stop a run exactly between two steps. Points: `locked`, `staged`, `exchanged`,
/// `moved-aside`. (`lock-enospc`, read where the lock file is written, makes that write fail
/// as a full disk would.)
fn fault(point: &str) {
    if fault_set(point) {
        // SAFETY: raising a signal at the calling thread.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
}

fn no_rename2() -> bool {
    // Forces the fallback of filesystems without renameat2 (tests of its repair).
    std::env::var_os("KQUANT_NO_RENAMEAT2").is_some()
}

#[cfg(target_os = "linux")]
fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> std::io::Result<()> {
    use std::ffi::CString;
    if no_rename2() {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    let a = CString::new(from.as_os_str().as_bytes())?;
    let b = CString::new(to.as_os_str().as_bytes())?;
    // SAFETY: two NUL-terminated paths relative to the current directory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn renameat2(_: &Path, _: &Path, _: u32) -> std::io::Result<()> {
    Err(std::io::Error::from_raw_os_error(libc::EINVAL))
}

fn exchange_unsupported(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP)
    )
}

/// Rename without replacing: EEXIST when `to` exists. Falls back to a checked rename where the
/// filesystem has no `RENAME_NOREPLACE` (the lock keeps other kquant runs out of the window).
fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    const NOREPLACE: libc::c_uint = 1;
    #[cfg(not(target_os = "linux"))]
    const NOREPLACE: u32 = 1;
    match renameat2(from, to, NOREPLACE) {
        Err(e) if exchange_unsupported(&e) => {
            if exists(to) {
                return Err(std::io::Error::from_raw_os_error(libc::EEXIST));
            }
            std::fs::rename(from, to)
        }
        r => r,
    }
}

fn rename_exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    const EXCHANGE: libc::c_uint = 2;
    #[cfg(not(target_os = "linux"))]
    const EXCHANGE: u32 = 2;
    renameat2(a, b, EXCHANGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_name_no_new_entry_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let sub = d.path().join("x");
        std::fs::create_dir(&sub).unwrap();
        for p in [".", "..", "/", "x/.", "x/..", "x/./", "x/../"] {
            let e = Claim::new(&d.path().join(p), Kind::Checkpoint, true, &[]).unwrap_err();
            assert!(
                e.to_string().contains("not a usable output name"),
                "{p}: {e}"
            );
        }
        assert!(Claim::new(&d.path().join("x/"), Kind::Checkpoint, false, &[]).is_err());
        let c = Claim::new(&d.path().join("y/"), Kind::Checkpoint, false, &[]).unwrap();
        c.commit().unwrap();
        assert!(d.path().join("y").is_dir());
    }

    #[test]
    fn side_names_fit_the_name_limit() {
        let short = side_name(OsStr::new("out"), PARTIAL_SUFFIX);
        assert_eq!(short, ".out.kquant-partial");
        let long = "x".repeat(250);
        let s = side_name(OsStr::new(&long), PARTIAL_SUFFIX);
        assert_eq!(s.len(), NAME_MAX);
        assert!(s.as_bytes().ends_with(PARTIAL_SUFFIX.as_bytes()));
        // Two long names that share a prefix get different side names.
        let other = format!("{}y", "x".repeat(249));
        assert_ne!(s, side_name(OsStr::new(&other), PARTIAL_SUFFIX));
        assert_eq!(side_name(OsStr::new(&long), LOCK_SUFFIX).len(), NAME_MAX);
    }

    fn report(b: &[u8]) -> bool {
        b.starts_with(b"ours")
    }
    const REPORT: Kind = Kind::File {
        what: "report",
        is_ours: report,
        flag: "--json",
    };

    #[test]
    fn a_second_claim_of_the_same_output_is_refused_until_the_first_ends() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("r.json");
        let a = Claim::new(&out, REPORT, true, &[]).unwrap();
        let e = Claim::new(&out, REPORT, true, &[]).unwrap_err().to_string();
        assert!(e.contains("another kquant run"), "{e}");
        std::fs::write(a.staging(), b"ours 1").unwrap();
        a.commit().unwrap();
        assert!(!d.path().join(".r.json.kquant-lock").exists());
        let b = Claim::new(&out, REPORT, true, &[]).unwrap();
        std::fs::write(b.staging(), b"ours 2").unwrap();
        assert_eq!(b.commit().unwrap(), Committed { replaced: true });
        assert_eq!(std::fs::read(&out).unwrap(), b"ours 2");
        // Not ours: refused, left alone.
        std::fs::write(&out, b"theirs").unwrap();
        let e = Claim::new(&out, REPORT, true, &[]).unwrap_err().to_string();
        assert!(e.contains("not a report written by kquant"), "{e}");
        assert_eq!(std::fs::read(&out).unwrap(), b"theirs");
        let names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, vec![OsString::from("r.json")]);
    }

    #[test]
    fn the_fallback_replacement_is_repaired_by_the_next_claim() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("r");
        std::fs::write(&out, b"ours old").unwrap();
        // A run killed between its two renames leaves `.r.kquant-old` and no `r`.
        std::fs::rename(&out, d.path().join(".r.kquant-old")).unwrap();
        let c = Claim::new(&out, REPORT, true, &[]).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"ours old", "restored");
        drop(c);
        assert_eq!(std::fs::read(&out).unwrap(), b"ours old");
    }
}
