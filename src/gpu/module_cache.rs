//! The compiled kernel module, kept on disk: NVRTC / hipRTC compile [`super::source::module`]
//! once per (backend, architecture, compiler version, source and options), and every later
//! process that opens a device of that architecture loads the stored result instead of
//! compiling again.
//!
//! Where: `KQUANT_KERNEL_CACHE` (a directory; `off` turns the cache off), else
//! `$XDG_CACHE_HOME/kquant/kernels`, else `$HOME/.cache/kquant/kernels`. One file an entry,
//! `<backend>-<arch>-<digest>.bin`: a header naming the whole key and the payload's SHA-256,
//! then the payload (PTX text for CUDA, a code object for HIP). An entry whose header or hash
//! does not match, or that is larger than [`MAX_ENTRY_BYTES`], is compiled again and replaced;
//! entries are written to a temporary name (a new file: never through a link) and renamed, so
//! a killed process never leaves a partial one under the final name. A cache that cannot be
//! read or written costs a compile, never the device: the reason is reported in [`Origin`].
//!
//! Who may write it: the user alone. The hash in an entry tells a damaged entry from a whole
//! one, not a planted one, so an entry or a directory owned by another user, or writable by
//! group or others, is never loaded (the module is compiled instead); a new directory is made
//! `0700`, an entry `0600`.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::Result;

/// The first line of every entry.
const MAGIC: &str = "kquant-kernel-module/1";

/// The largest entry read back (the module's PTX is a few MB).
pub const MAX_ENTRY_BYTES: u64 = 256 << 20;

/// The cache directory, or `None` when `KQUANT_KERNEL_CACHE=off` or no home is known.
pub fn dir() -> Option<PathBuf> {
    dir_from(
        std::env::var_os("KQUANT_KERNEL_CACHE"),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
    )
}

fn dir_from(
    explicit: Option<std::ffi::OsString>,
    xdg: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    let nonempty = |v: Option<std::ffi::OsString>| v.filter(|s| !s.is_empty());
    match nonempty(explicit) {
        Some(v) if v == "off" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => nonempty(xdg)
            .map(|x| PathBuf::from(x).join("kquant/kernels"))
            .or_else(|| nonempty(home).map(|h| PathBuf::from(h).join(".cache/kquant/kernels"))),
    }
}

/// What a compiled module depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    /// `cuda` or `hip`.
    pub backend: &'static str,
    /// The compile target (`sm_90`, `gfx942`).
    pub arch: String,
    /// The compiler's own version (NVRTC's, hipRTC's).
    pub compiler: String,
    /// SHA-256 (hex) of the module source and the compile options.
    pub digest: String,
}

impl Key {
    pub fn new(
        backend: &'static str,
        arch: &str,
        compiler: &str,
        source: &str,
        options: &[String],
    ) -> Key {
        let mut h = Sha256::new();
        h.update(source.as_bytes());
        for o in options {
            h.update([0u8]);
            h.update(o.as_bytes());
        }
        Key {
            backend,
            arch: arch.to_string(),
            compiler: compiler.to_string(),
            digest: hex(&h.finalize()),
        }
    }

    /// The entry's file name: the backend and arch readable, the rest hashed (a compiler
    /// version is free text).
    pub fn file_name(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.header_key().as_bytes());
        let arch: String = self
            .arch
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .take(32)
            .collect();
        format!("{}-{arch}-{}.bin", self.backend, &hex(&h.finalize())[..32])
    }

    /// The key as the header's second line (one line whatever the compiler says).
    fn header_key(&self) -> String {
        format!(
            "{} {} {} {}",
            self.backend,
            self.arch,
            self.compiler.replace(['\n', '\r'], " "),
            self.digest
        )
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Where a module came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Read from this entry.
    Cached(PathBuf),
    /// Compiled in this process and stored at this entry.
    Stored(PathBuf),
    /// Compiled in this process, not stored: the cache is off, or why it could not be used.
    Uncached(String),
}

impl Origin {
    /// For a device's description: `kernels from the cache`, `kernels compiled (cached for next
    /// time)`, `kernels compiled (not cached: …)`.
    pub fn describe(&self) -> String {
        match self {
            Origin::Cached(p) => format!("kernels from the cache ({})", p.display()),
            Origin::Stored(p) => format!("kernels compiled, cached at {}", p.display()),
            Origin::Uncached(why) => format!("kernels compiled, not cached: {why}"),
        }
    }
}

/// The stored module for `key` in `dir`, or `compile()`'s, stored for next time.
pub fn load_or_compile(
    dir: Option<&Path>,
    key: &Key,
    compile: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<(Vec<u8>, Origin)> {
    let Some(dir) = dir else {
        return Ok((
            compile()?,
            Origin::Uncached("KQUANT_KERNEL_CACHE=off".into()),
        ));
    };
    let path = dir.join(key.file_name());
    if let Some(payload) = read_entry(&path, key) {
        return Ok((payload, Origin::Cached(path)));
    }
    let payload = compile()?;
    let origin = match write_entry(dir, &path, key, &payload) {
        Ok(()) => Origin::Stored(path),
        Err(e) => Origin::Uncached(format!("{}: {e}", dir.display())),
    };
    Ok((payload, origin))
}

/// Whether a cache file or directory may be trusted: owned by this user (or root) and
/// writable by nobody else. The SHA-256 in an entry tells a damaged entry from a whole one, not
/// a planted one (anyone who can write the directory can write a matching hash): so an entry,
/// or a directory, that another user could have written is not read (#38, the adversary's
/// extras; docs/kernels.md).
#[cfg(unix)]
fn trusted(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    (meta.uid() == me || meta.uid() == 0) && meta.mode() & 0o022 == 0
}

#[cfg(not(unix))]
fn trusted(_: &std::fs::Metadata) -> bool {
    true
}

/// The payload of the entry at `path` when it is whole, for `key`, and trusted; `None`
/// otherwise. The file is opened once (no symbolic link followed), checked through that handle
/// and read up to the bound, so a file swapped or grown between the check and the read is
/// never read past [`MAX_ENTRY_BYTES`].
fn read_entry(path: &Path, key: &Key) -> Option<Vec<u8>> {
    use std::io::Read;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let dir_ok = path
        .parent()
        .and_then(|d| std::fs::metadata(d).ok())
        .is_some_and(|m| trusted(&m));
    if !dir_ok {
        return None;
    }
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    o.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    let f = o.open(path).ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() || meta.len() > MAX_ENTRY_BYTES || !trusted(&meta) {
        return None;
    }
    let mut bytes = Vec::new();
    f.take(MAX_ENTRY_BYTES + 1).read_to_end(&mut bytes).ok()?;
    if bytes.len() as u64 > MAX_ENTRY_BYTES {
        return None;
    }
    let mut lines = bytes.splitn(4, |&b| b == b'\n');
    let (magic, k, sum, payload) = (lines.next()?, lines.next()?, lines.next()?, lines.next()?);
    if magic != MAGIC.as_bytes() || k != key.header_key().as_bytes() {
        return None;
    }
    (sum == hex(&Sha256::digest(payload)).as_bytes()).then(|| payload.to_vec())
}

fn write_entry(dir: &Path, path: &Path, key: &Key, payload: &[u8]) -> std::io::Result<()> {
    {
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        b.create(dir)?;
    }
    let tmp = dir.join(format!(".{}.tmp.{}", key.file_name(), std::process::id()));
    // A new file only (`create_new`: never through a link planted under the temporary name);
    // a leftover of this pid (or a planted link) is removed once, then created anew.
    let create = || {
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
        o.open(&tmp)
    };
    let write = || -> std::io::Result<()> {
        let mut f = match create() {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                std::fs::remove_file(&tmp)?;
                create()?
            }
            r => r?,
        };
        writeln!(f, "{MAGIC}")?;
        writeln!(f, "{}", key.header_key())?;
        writeln!(f, "{}", hex(&Sha256::digest(payload)))?;
        f.write_all(payload)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    let r = write();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn key(source: &str) -> Key {
        Key::new(
            "cuda",
            "sm_90",
            "NVRTC 12.8",
            source,
            &["-std=c++17".into()],
        )
    }

    #[test]
    fn a_second_open_loads_what_the_first_compiled() {
        let t = tempfile::tempdir().unwrap();
        let compiles = Cell::new(0);
        let compile = || {
            compiles.set(compiles.get() + 1);
            Ok(b"PTX body\n\nwith lines".to_vec())
        };
        let (a, o) = load_or_compile(Some(t.path()), &key("src"), compile).unwrap();
        assert!(matches!(o, Origin::Stored(_)), "{o:?}");
        let (b, o) = load_or_compile(Some(t.path()), &key("src"), compile).unwrap();
        assert!(matches!(o, Origin::Cached(_)), "{o:?}");
        assert_eq!(
            (a.as_slice(), b.as_slice()),
            (&b"PTX body\n\nwith lines"[..], &a[..])
        );
        assert_eq!(compiles.get(), 1, "compiled once");
        // Nothing but the entry is left in the directory (no temporary file).
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 1);
    }

    #[test]
    fn another_source_arch_compiler_or_option_is_another_entry() {
        let base = key("src");
        let others = [
            key("src changed"),
            Key::new(
                "cuda",
                "sm_100",
                "NVRTC 12.8",
                "src",
                &["-std=c++17".into()],
            ),
            Key::new("cuda", "sm_90", "NVRTC 13.0", "src", &["-std=c++17".into()]),
            Key::new("cuda", "sm_90", "NVRTC 12.8", "src", &["-std=c++20".into()]),
            Key::new("hip", "sm_90", "NVRTC 12.8", "src", &["-std=c++17".into()]),
        ];
        for o in &others {
            assert_ne!(o.file_name(), base.file_name(), "{o:?}");
        }
        let t = tempfile::tempdir().unwrap();
        load_or_compile(Some(t.path()), &base, || Ok(b"a".to_vec())).unwrap();
        for o in &others {
            let (p, origin) = load_or_compile(Some(t.path()), o, || Ok(b"b".to_vec())).unwrap();
            assert_eq!(p, b"b");
            assert!(matches!(origin, Origin::Stored(_)));
        }
    }

    #[test]
    fn a_damaged_entry_is_compiled_again_and_replaced() {
        let t = tempfile::tempdir().unwrap();
        let k = key("src");
        load_or_compile(Some(t.path()), &k, || Ok(b"good payload".to_vec())).unwrap();
        let path = t.path().join(k.file_name());
        let whole = std::fs::read(&path).unwrap();
        let damaged: Vec<Vec<u8>> = vec![
            whole[..whole.len() - 3].to_vec(), // truncated payload
            [&whole[..], b"x"].concat(),       // appended
            whole
                .iter()
                .map(|&b| if b == b'g' { b'G' } else { b })
                .collect(), // payload flipped
            b"kquant-kernel-module/0\n".to_vec(), // another format
            Vec::new(),                        // empty
        ];
        for d in damaged {
            std::fs::write(&path, &d).unwrap();
            let (p, o) =
                load_or_compile(Some(t.path()), &k, || Ok(b"good payload".to_vec())).unwrap();
            assert_eq!(p, b"good payload");
            assert!(matches!(o, Origin::Stored(_)), "{o:?}");
            assert_eq!(
                std::fs::read(&path).unwrap(),
                whole,
                "replaced by a whole entry"
            );
        }
        // An entry of another key under this name (a hash collision, or a renamed file).
        let other = key("other");
        std::fs::copy(&path, t.path().join(other.file_name())).unwrap();
        let (p, _) = load_or_compile(Some(t.path()), &other, || Ok(b"other".to_vec())).unwrap();
        assert_eq!(p, b"other");
    }

    /// The adversary's extras: a link planted under the temporary name is not followed (its
    /// target is untouched), and an entry another user could have written (here: writable by
    /// group and others) is compiled again instead of loaded.
    #[cfg(unix)]
    #[test]
    fn planted_links_and_foreign_writable_entries_are_not_trusted() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let k = key("src");
        let victim = t.path().join("victim");
        std::fs::write(&victim, b"user data").unwrap();
        let tmp = t
            .path()
            .join(format!(".{}.tmp.{}", k.file_name(), std::process::id()));
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        let (_, o) = load_or_compile(Some(t.path()), &k, || Ok(b"ptx".to_vec())).unwrap();
        assert!(matches!(o, Origin::Stored(_)), "{o:?}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"user data");
        let path = t.path().join(k.file_name());
        // A planted entry with a matching hash, writable by others: not loaded.
        let mut planted = std::fs::read(&path).unwrap();
        let at = planted.len() - 3;
        planted.truncate(at);
        planted.extend_from_slice(b"bad");
        let mut lines: Vec<&[u8]> = planted.splitn(4, |&b| b == b'\n').collect();
        let sum = hex(&Sha256::digest(lines[3]));
        lines[2] = sum.as_bytes();
        std::fs::write(&path, lines.join(&b'\n')).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let (p, o) = load_or_compile(Some(t.path()), &k, || Ok(b"ptx".to_vec())).unwrap();
        assert_eq!(p, b"ptx");
        assert!(matches!(o, Origin::Stored(_)), "{o:?}");
        // A directory writable by others: nothing in it is loaded.
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let (_, o) = load_or_compile(Some(t.path()), &k, || Ok(b"ptx".to_vec())).unwrap();
        assert!(!matches!(o, Origin::Cached(_)), "{o:?}");
    }

    #[test]
    fn a_cache_that_cannot_be_written_costs_a_compile_not_the_device() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("not-a-dir");
        std::fs::write(&file, b"").unwrap();
        let (p, o) = load_or_compile(Some(&file), &key("src"), || Ok(b"m".to_vec())).unwrap();
        assert_eq!(p, b"m");
        assert!(
            matches!(&o, Origin::Uncached(w) if w.contains("not-a-dir")),
            "{o:?}"
        );
        let (_, o) = load_or_compile(None, &key("src"), || Ok(b"m".to_vec())).unwrap();
        assert_eq!(o, Origin::Uncached("KQUANT_KERNEL_CACHE=off".into()));
        // A compile error is the caller's error, cache or not.
        let e = load_or_compile(Some(t.path()), &key("bad"), || {
            Err(crate::gpu::GpuError::Backend {
                backend: "cuda",
                msg: "nvrtc: error".into(),
            })
        });
        assert!(e.is_err());
        assert_eq!(
            std::fs::read_dir(t.path()).unwrap().count(),
            1,
            "nothing stored"
        );
    }

    #[test]
    fn the_directory_follows_the_environment() {
        let s = |v: &str| Some(std::ffi::OsString::from(v));
        assert_eq!(
            dir_from(s("/c"), s("/x"), s("/h")),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(dir_from(s("off"), s("/x"), s("/h")), None);
        assert_eq!(
            dir_from(None, s("/x"), s("/h")),
            Some(PathBuf::from("/x/kquant/kernels"))
        );
        assert_eq!(
            dir_from(s(""), s(""), s("/h")),
            Some(PathBuf::from("/h/.cache/kquant/kernels"))
        );
        assert_eq!(dir_from(None, None, None), None);
    }
}
