//! What kquant does when a signal ends it: the partial outputs of its claims are removed and,
//! when a memory-mapped input shrank under it (SIGBUS), the file is named in an `error:` line.
//!
//! [`install`] (called once by the binary) sets one handler for SIGINT, SIGTERM, SIGHUP and
//! SIGBUS. It only uses async-signal-safe calls: it reads two fixed tables of atomics that the
//! rest of kquant fills — the staging paths of live output claims ([`register_output`]) and the
//! address ranges of mapped files ([`register_map`]) — unlinks the staging files (a staging
//! directory is flat: its files are unlinked with `getdents64` + `unlinkat`, then the directory
//! is removed) and the claims' lock files, and then:
//! - SIGBUS inside a registered map: prints `error: \`FILE\`: …` and a `hint:`, exits 2;
//! - SIGBUS elsewhere: puts back the handler that was there before (Rust's own) and returns, so
//!   the fault is handled as it would have been without kquant's;
//! - SIGINT / SIGTERM / SIGHUP: restores the default action and raises the signal again, so the
//!   exit status still says which signal ended the process.
//!
//! SIGKILL cannot be caught; what it leaves is found and cleaned by the next claim of the same
//! output (`io::output`).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

/// One live output: the staging path (a flat directory or a file) and its lock file.
struct OutputEntry {
    staging: CString,
    is_dir: bool,
    lock: CString,
}

/// One mapped input file.
struct MapEntry {
    start: usize,
    len: usize,
    path: CString,
}

const OUTPUT_SLOTS: usize = 64;
const MAP_SLOTS: usize = 4096;

static OUTPUTS: [AtomicPtr<OutputEntry>; OUTPUT_SLOTS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; OUTPUT_SLOTS];
static MAPS: [AtomicPtr<MapEntry>; MAP_SLOTS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAP_SLOTS];
/// Entries taken out of the tables are never freed (a handler may be reading one); they are a
/// few hundred bytes each, and this counts them for the tests.
static RETIRED: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);
static HANDLING: AtomicBool = AtomicBool::new(false);
/// The SIGBUS action that was installed before ours (Rust's stack-overflow guard or default).
static mut PREVIOUS_SIGBUS: std::mem::MaybeUninit<libc::sigaction> =
    std::mem::MaybeUninit::uninit();

fn cstring(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap_or_else(|_| c"?".to_owned())
}

fn put<T>(table: &'static [AtomicPtr<T>], entry: T) -> Option<usize> {
    let p = Box::into_raw(Box::new(entry));
    for (i, slot) in table.iter().enumerate() {
        if slot
            .compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return Some(i);
        }
    }
    // Table full: the entry is simply not covered (the next claim cleans what a signal leaves).
    // SAFETY: `p` came from Box::into_raw above and was never shared.
    drop(unsafe { Box::from_raw(p) });
    None
}

fn take<T>(table: &'static [AtomicPtr<T>], slot: Option<usize>) {
    if let Some(i) = slot {
        let p = table[i].swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !p.is_null() {
            RETIRED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A live output's registration; dropping it takes the output off the table.
#[derive(Debug)]
pub struct OutputRegistration(Option<usize>);

impl Drop for OutputRegistration {
    fn drop(&mut self) {
        take(&OUTPUTS, self.0);
    }
}

/// Register a claim's staging path and lock file, removed if a signal ends the process.
pub fn register_output(staging: &Path, is_dir: bool, lock: &Path) -> OutputRegistration {
    OutputRegistration(put(
        &OUTPUTS,
        OutputEntry {
            staging: cstring(staging),
            is_dir,
            lock: cstring(lock),
        },
    ))
}

/// A mapped file's registration; dropping it takes the range off the table.
#[derive(Debug)]
pub struct MapRegistration(Option<usize>);

impl Drop for MapRegistration {
    fn drop(&mut self) {
        take(&MAPS, self.0);
    }
}

/// Register the address range of a mapped input file (named if a read in it faults).
pub fn register_map(start: *const u8, len: usize, path: &Path) -> MapRegistration {
    MapRegistration(put(
        &MAPS,
        MapEntry {
            start: start as usize,
            len,
            path: cstring(path),
        },
    ))
}

/// Install the handler (idempotent).
pub fn install() {
    if INSTALLED.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: plain sigaction calls with a zeroed, filled-in struct; the handler only uses
    // async-signal-safe calls.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut sa.sa_mask);
        let prev = &raw mut PREVIOUS_SIGBUS;
        libc::sigaction(libc::SIGBUS, &sa, (*prev).as_mut_ptr());
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

fn write_err(bytes: &[u8]) {
    // The user's stderr itself, not the relay (io::stdio): the process ends right after.
    super::stdio::write_error(bytes);
}

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: only atomics, raw syscalls and reads of leaked, immutable entries.
    unsafe {
        if sig == libc::SIGBUS {
            let addr = (*info).si_addr() as usize;
            let hit = MAPS.iter().find_map(|s| {
                let p = s.load(Ordering::Acquire);
                (!p.is_null() && addr >= (*p).start && addr < (*p).start + (*p).len)
                    .then(|| &(*p).path)
            });
            let Some(path) = hit else {
                // Not a mapped input: let the previous handler see the fault again.
                let prev = &raw const PREVIOUS_SIGBUS;
                libc::sigaction(libc::SIGBUS, (*prev).as_ptr(), std::ptr::null_mut());
                return;
            };
            if HANDLING.swap(true, Ordering::AcqRel) {
                // Another thread's handler is cleaning up (several reader threads fault on the
                // same cut file at once): it ends the process when it is done, so this thread
                // waits rather than cut that cleanup short. (A fault cannot nest in the cleanup
                // of this thread: it reads no map. A user's second signal ends everything at
                // once: `second_signal`.)
                loop {
                    libc::pause();
                }
            }
            write_err(b"error: `");
            write_err(path.as_bytes());
            write_err(
                b"`: the file shrank or was replaced while kquant was reading it \
                  (a read of its memory map ran past its new end)\n\nhint: do not change a \
                  checkpoint while kquant reads it; copy or download it again and re-run\n",
            );
            remove_outputs();
            libc::_exit(2);
        }
        if HANDLING.swap(true, Ordering::AcqRel) {
            second_signal(sig);
            return;
        }
        #[cfg(test)]
        tests::stall_if_asked();
        if remove_outputs() {
            write_err(b"kquant: interrupted; the partial output was removed\n");
        }
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// A signal that arrives while an earlier one's cleanup runs (Ctrl-C, then a CI cancel): the
/// process ends at once, by this signal, instead of waiting for a cleanup that may be what is
/// stuck. Only the lock files are removed (one `unlink` each); a staging path the cleanup had
/// not reached yet stays under its `.NAME.kquant-partial` name, which the next claim of the
/// same output recognises and removes (`io::output`), and never under the final name.
///
/// # Safety
/// Async-signal-safe; called from the handler only.
unsafe fn second_signal(sig: libc::c_int) {
    remove_locks();
    write_err(
        b"kquant: a second signal during cleanup; stopped at once (the next run of the same \
          output removes what is left)\n",
    );
    // Delivered when the handler returns (the signal is blocked while it runs): the exit status
    // says which signal ended the process.
    libc::signal(sig, libc::SIG_DFL);
    libc::raise(sig);
}

/// Unlink every registered claim's lock file (not its staging path).
unsafe fn remove_locks() {
    for s in &OUTPUTS {
        let p = s.load(Ordering::Acquire);
        if !p.is_null() {
            libc::unlink((*p).lock.as_ptr());
        }
    }
}

/// Remove every registered partial output and lock file, then `_exit(code)`: for a fatal
/// condition found where nothing may be allocated (`io::budget`).
///
/// # Safety
/// Async-signal-safe; must not race a handler already running (it would remove the same files).
pub unsafe fn exit_removing_outputs(code: i32) -> ! {
    remove_outputs();
    libc::_exit(code)
}

/// Remove every registered staging path and lock file. True when there was one.
unsafe fn remove_outputs() -> bool {
    let mut any = false;
    for s in &OUTPUTS {
        let p = s.load(Ordering::Acquire);
        if p.is_null() {
            continue;
        }
        any = true;
        let e = &*p;
        if e.is_dir {
            // Twice: a writer thread may add a file between the listing and the rmdir.
            for _ in 0..2 {
                remove_flat_dir(&e.staging);
            }
        } else {
            libc::unlink(e.staging.as_ptr());
        }
        libc::unlink(e.lock.as_ptr());
    }
    any
}

/// Unlink the entries of a directory that holds only files, then the directory.
#[cfg(target_os = "linux")]
unsafe fn remove_flat_dir(dir: &CString) {
    let fd = libc::open(
        dir.as_ptr(),
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
    );
    if fd < 0 {
        return;
    }
    let mut buf = [0u8; 4096];
    loop {
        let n = libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len());
        if n <= 0 {
            break;
        }
        let mut off = 0usize;
        while off < n as usize {
            // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
            let rec = buf.as_ptr().add(off);
            let reclen = u16::from_ne_bytes([*rec.add(16), *rec.add(17)]) as usize;
            let name = rec.add(19) as *const libc::c_char;
            let dot = *name == b'.' as libc::c_char
                && (*name.add(1) == 0
                    || (*name.add(1) == b'.' as libc::c_char && *name.add(2) == 0));
            if !dot {
                libc::unlinkat(fd, name, 0);
            }
            off += reclen.max(1);
        }
    }
    libc::close(fd);
    libc::rmdir(dir.as_ptr());
}

#[cfg(not(target_os = "linux"))]
unsafe fn remove_flat_dir(dir: &CString) {
    // No getdents64: leave the directory to the next claim of the same output.
    libc::rmdir(dir.as_ptr());
}

/// Entries taken off the tables so far (never freed; see [`RETIRED`]).
pub fn retired() -> usize {
    RETIRED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_fill_and_free_slots() {
        let d = tempfile::tempdir().unwrap();
        let before = retired();
        let regs: Vec<_> = (0..10)
            .map(|i| register_output(&d.path().join(format!("s{i}")), true, &d.path().join("l")))
            .collect();
        assert!(regs.iter().all(|r| r.0.is_some()));
        drop(regs);
        assert!(retired() >= before + 10);
        let buf = [0u8; 16];
        let m = register_map(buf.as_ptr(), buf.len(), Path::new("x"));
        assert!(m.0.is_some());
    }

    /// Set in the child process of `a_read_past_a_shrunk_map_names_the_file_and_exits_2`.
    const SIGBUS_CHILD: &str = "KQUANT_TEST_SIGBUS_CHILD";

    /// The child's half of the SIGBUS test (does nothing unless the parent started it): map the
    /// file, cut it to nothing, read the map. The handler must end the process.
    #[test]
    #[ignore = "the child process of a_read_past_a_shrunk_map_names_the_file_and_exits_2"]
    fn sigbus_child() {
        let Some(path) = std::env::var_os(SIGBUS_CHILD) else {
            return;
        };
        install();
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: the test cuts the file under its own map on purpose.
        let map = unsafe { memmap2::Mmap::map(&f).unwrap() };
        let _reg = register_map(map.as_ptr(), map.len(), Path::new(&path));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        let x = unsafe { std::ptr::read_volatile(map.as_ptr().add(8192)) };
        panic!("read {x} past the end of a shrunk map without a SIGBUS");
    }

    /// A mapped input cut under a read: named in an `error:` line with a hint, exit 2, no
    /// timing involved (the child cuts the file itself before it reads).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_read_past_a_shrunk_map_names_the_file_and_exits_2() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("model.safetensors");
        std::fs::write(&f, vec![7u8; 64 << 10]).unwrap();
        let o = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "io::interrupt::tests::sigbus_child",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(SIGBUS_CHILD, &f)
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{e}");
        assert!(
            e.contains(&format!("error: `{}`", f.display()))
                && e.contains("shrank or was replaced")
                && e.contains("hint:"),
            "{e}"
        );
    }

    /// Set by `second_signal_child`: the first signal's cleanup stops before it removes
    /// anything, and says so on stderr, so that the parent can send the second signal while a
    /// cleanup is (deterministically) in progress.
    static STALL: AtomicBool = AtomicBool::new(false);
    const STALLING: &[u8] = b"test: cleanup stalled\n";

    pub(super) fn stall_if_asked() {
        if STALL.load(Ordering::Acquire) {
            write_err(STALLING);
            loop {
                // SAFETY: pause is async-signal-safe.
                unsafe { libc::pause() };
            }
        }
    }

    const SECOND_SIGNAL_CHILD: &str = "KQUANT_TEST_SECOND_SIGNAL_CHILD";

    /// The child's half of `a_second_signal_during_cleanup_ends_the_process_at_once`: register
    /// an output with a partial file in its staging directory, then take SIGINT with a cleanup
    /// that stalls.
    #[test]
    #[ignore = "the child process of a_second_signal_during_cleanup_ends_the_process_at_once"]
    fn second_signal_child() {
        let Some(out) = std::env::var_os(SECOND_SIGNAL_CHILD) else {
            return;
        };
        install();
        // What a claim of `OUT` makes (io::output; named here, not used, so that this module
        // does not depend on the one that depends on it): its staging directory, holding a
        // partial file, and its lock file.
        let out = Path::new(&out);
        let side = |suffix: &str| {
            out.with_file_name(format!(
                ".{}{suffix}",
                out.file_name().unwrap().to_str().unwrap()
            ))
        };
        let (staging, lock) = (side(".kquant-partial"), side(".kquant-lock"));
        std::fs::create_dir(&staging).unwrap();
        std::fs::write(staging.join("model.safetensors"), b"partial").unwrap();
        std::fs::write(&lock, b"pid").unwrap();
        let _reg = register_output(&staging, true, &lock);
        STALL.store(true, Ordering::Release);
        unsafe { libc::raise(libc::SIGINT) };
        unreachable!("SIGINT returned");
    }

    /// #38.1: SIGINT, then SIGTERM while the first one's cleanup runs: the process ends at
    /// once by SIGTERM (before, the nested handler waited in `pause()` for ever), leaves no
    /// lock file, and a partial only under its staging name.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_second_signal_during_cleanup_ends_the_process_at_once() {
        use std::io::Read;
        use std::os::unix::process::ExitStatusExt;
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("draft-int4");
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "io::interrupt::tests::second_signal_child",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(SECOND_SIGNAL_CHILD, &out)
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Wait (by reading, not by time) until the first cleanup is under way.
        let mut err = child.stderr.take().unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 256];
        while !seen.windows(STALLING.len()).any(|w| w == STALLING) {
            let n = err.read(&mut buf).unwrap();
            assert!(n > 0, "{}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
        }
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        // A hang is the defect: a bound far above any cleanup, checked without sleeping on it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("the second signal did not end the process");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let _ = err.read_to_end(&mut seen);
        let e = String::from_utf8_lossy(&seen);
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{e}");
        assert!(e.contains("second signal"), "{e}");
        let names: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        // No lock; the partial only under its staging name (which the next claim of the
        // output removes: `io::output`'s repair, tested with the claims), never under `OUT`.
        assert!(
            !names.iter().any(|n| n.ends_with(".kquant-lock")),
            "{names:?}"
        );
        assert!(!out.exists());
        assert!(
            names.iter().all(|n| n == ".draft-int4.kquant-partial"),
            "{names:?}"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn flat_directory_is_removed_with_raw_calls() {
        let d = tempfile::tempdir().unwrap();
        let s = d.path().join("stage");
        std::fs::create_dir(&s).unwrap();
        for i in 0..300 {
            // Enough entries to need several getdents64 calls.
            std::fs::write(s.join(format!("file-with-a-longish-name-{i:04}")), b"x").unwrap();
        }
        unsafe { remove_flat_dir(&cstring(&s)) };
        assert!(!s.exists());
    }
}
