//! Standard output and error that outlive their reader.
//!
//! A user who pipes kquant's output into `head -1` (`kquant quantize … 2>&1 | head -1`) closes
//! the pipe while a long run is still printing progress. Left alone, the next write either
//! kills the process with SIGPIPE (exit 141, the partial output and the lock file left behind)
//! or, with SIGPIPE ignored, fails every `println!` with a panic. Neither may happen to a run
//! that writes a checkpoint: status output is for the user, and its loss must not cost the
//! result.
//!
//! [`install`] (called once by the binary, before any thread exists) therefore ignores SIGPIPE
//! and, for each of stdout and stderr that is a pipe or a socket (the only kinds a reader can
//! close), puts a pipe of kquant's own in its place with a relay thread that copies to the
//! original. When the reader goes away the relay keeps draining and drops what it reads, so
//! every write of the process succeeds and the run finishes with its own exit status
//! (0 / 1 / 2). Terminals and files are left as they are.
//!
//! [`Relay::finish`] flushes stdout, closes kquant's ends and waits for the relays to copy the
//! rest: the binary calls it before returning its exit status. Messages written where the
//! process ends at once (`io::interrupt`'s signal handler, `io::budget`) go to
//! [`error_fd`], the original stderr, since no relay would run after them.

use std::io::Write;
use std::sync::atomic::{AtomicI32, Ordering};
use std::thread::JoinHandle;

/// The process's original stderr (2 until [`install`] relays it).
static ERROR_FD: AtomicI32 = AtomicI32::new(2);

/// The file descriptor that reaches the user's stderr directly, for messages written just
/// before the process ends without running destructors.
pub fn error_fd() -> i32 {
    ERROR_FD.load(Ordering::Relaxed)
}

/// Write `bytes` to [`error_fd`] with write(2) (no allocation, no lock: usable in a signal
/// handler or an allocator).
pub fn write_error(bytes: &[u8]) {
    let fd = error_fd();
    let mut off = 0usize;
    while off < bytes.len() {
        // SAFETY: write(2) of a valid buffer.
        let w = unsafe { libc::write(fd, bytes[off..].as_ptr().cast(), bytes.len() - off) };
        if w <= 0 {
            if w < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        off += w as usize;
    }
}

/// The relay threads; [`Relay::finish`] drains them.
#[derive(Debug, Default)]
pub struct Relay {
    relays: Vec<(i32, JoinHandle<()>)>,
}

/// Whether `fd` is a pipe or a socket: a stream whose reader can go away.
fn closable(fd: i32) -> bool {
    // SAFETY: fstat into a zeroed struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return false;
        }
        let kind = st.st_mode & libc::S_IFMT;
        kind == libc::S_IFIFO || kind == libc::S_IFSOCK
    }
}

/// Copy everything from `from` to `to` until every writer of `from` has closed it; after the
/// first failed write (the reader left), keep reading and drop it.
fn relay(from: i32, to: i32) {
    let mut buf = vec![0u8; 64 << 10];
    let mut alive = true;
    loop {
        // SAFETY: read(2) into a buffer of that length.
        let n = unsafe { libc::read(from, buf.as_mut_ptr().cast(), buf.len()) };
        if n == 0 {
            break;
        }
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        let mut off = 0usize;
        while alive && off < n as usize {
            // SAFETY: write(2) of the bytes just read.
            let w = unsafe { libc::write(to, buf[off..].as_ptr().cast(), n as usize - off) };
            if w < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                alive = false;
            } else {
                off += w as usize;
            }
        }
    }
    // SAFETY: both descriptors belong to this relay alone.
    unsafe {
        libc::close(from);
    }
}

/// Ignore SIGPIPE and relay stdout and stderr where they are pipes or sockets (see the module
/// documentation). Call once, before any other thread exists.
pub fn install() -> Relay {
    // SAFETY: signal(2) at start-up; SIG_IGN makes a write to a closed pipe return EPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    // A panic's message goes straight to the user's stderr: the relay may not run after it.
    std::panic::set_hook(Box::new(|info| {
        let name = std::thread::current()
            .name()
            .unwrap_or("<unnamed>")
            .to_string();
        let bt = std::backtrace::Backtrace::capture();
        let mut msg = format!("thread '{name}' panicked at {info}\n");
        if bt.status() == std::backtrace::BacktraceStatus::Captured {
            msg.push_str(&format!("stack backtrace:\n{bt}\n"));
        } else {
            msg.push_str(
                "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n",
            );
        }
        write_error(msg.as_bytes());
    }));
    let mut out = Relay::default();
    for fd in [1, 2] {
        if !closable(fd) {
            continue;
        }
        // SAFETY: plain descriptor calls; on any failure the descriptor is left as it was.
        unsafe {
            let orig = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3);
            if orig < 0 {
                continue;
            }
            let mut p = [0i32; 2];
            if libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                libc::close(orig);
                continue;
            }
            if libc::dup2(p[1], fd) < 0 {
                libc::close(p[0]);
                libc::close(p[1]);
                libc::close(orig);
                continue;
            }
            libc::close(p[1]);
            let read_end = p[0];
            let handle = std::thread::Builder::new()
                .name(format!("kquant-relay-{fd}"))
                .spawn(move || {
                    relay(read_end, orig);
                    libc::close(orig);
                });
            match handle {
                Ok(h) => {
                    if fd == 2 {
                        // A duplicate for the last words of a process that ends at once.
                        let direct = libc::fcntl(orig, libc::F_DUPFD_CLOEXEC, 3);
                        if direct >= 0 {
                            ERROR_FD.store(direct, Ordering::Relaxed);
                        }
                    }
                    out.relays.push((fd, h));
                }
                Err(_) => {
                    // No thread: put the original back.
                    libc::dup2(orig, fd);
                    libc::close(orig);
                    libc::close(read_end);
                }
            }
        }
    }
    out
}

impl Relay {
    /// Flush stdout, close kquant's ends of the relays and wait until they have copied
    /// everything written (or dropped it, the reader gone).
    pub fn finish(self) {
        let _ = std::io::stdout().lock().flush();
        let _ = std::io::stderr().lock().flush();
        for (fd, _) in &self.relays {
            // SAFETY: /dev/null in place of the relayed descriptor: later writes succeed and
            // go nowhere, and the relay sees end of file.
            unsafe {
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if null >= 0 {
                    libc::dup2(null, *fd);
                    libc::close(null);
                } else {
                    libc::close(*fd);
                }
            }
        }
        for (_, h) in self.relays {
            let _ = h.join();
        }
    }
}
