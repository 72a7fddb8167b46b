//! One output file, streamed through aligned staging blocks and hashed on the way.
//!
//! The writer's bytes (headers, encoded tensors, and tensors copied unchanged from an input
//! file with [`Sink::copy_from`]) are gathered into 2 MiB blocks aligned to 4 KiB. Each full
//! block goes to two threads at once: one feeds it to sha256, the other writes it at its
//! offset. Where the filesystem allows it the file is opened with `O_DIRECT`, so the blocks go
//! from this process's memory to the device without a second copy into the page cache (on the
//! reference 2-core VM buffered writes run at 0.5 GB/s and direct ones at 2 GB/s, see
//! docs/performance.md); the last block is padded to the alignment and the file truncated to
//! its length. Where `O_DIRECT` is refused (tmpfs, some network filesystems, non-Linux) the
//! same blocks are written through the page cache. At most [`BLOCKS`] blocks are in flight, so
//! memory stays at 16 MiB whatever the file size.
//!
//! `KQUANT_NO_DIRECT_IO=1` forces buffered writes (the tests run both paths).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Bytes per staging block (a multiple of [`ALIGN`]).
pub const BLOCK: usize = 2 << 20;
/// Blocks in flight (being filled, hashed or written).
pub const BLOCKS: usize = 8;
/// Alignment of block addresses, file offsets and direct write lengths.
const ALIGN: usize = 4096;

/// An aligned block: `BLOCK` bytes inside an over-allocated vector.
struct Block {
    buf: Vec<u8>,
    start: usize,
}

impl Block {
    fn new() -> Block {
        let buf = vec![0u8; BLOCK + ALIGN];
        let start = (ALIGN - buf.as_ptr() as usize % ALIGN) % ALIGN;
        Block { buf, start }
    }
    fn bytes(&self) -> &[u8] {
        &self.buf[self.start..self.start + BLOCK]
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + BLOCK]
    }
}

/// A block handed to the hash and write threads: `len` valid bytes at file offset `off`.
struct Job {
    block: Block,
    len: usize,
    off: u64,
}

/// An output file being written. See the module docs.
pub struct Sink {
    path: PathBuf,
    file: Arc<File>,
    /// The block being filled and how much of it is.
    cur: Option<Block>,
    fill: usize,
    /// Bytes accepted so far (the file offset of the next byte).
    pos: u64,
    pool: Receiver<Block>,
    to_hash: Option<SyncSender<Arc<Job>>>,
    to_write: Option<SyncSender<Arc<Job>>>,
    hasher: Option<JoinHandle<String>>,
    writer: Option<JoinHandle<()>>,
    failed: Arc<Mutex<Option<std::io::Error>>>,
    direct: bool,
}

/// Give a block back to the pool once both threads are done with it.
fn recycle(job: Arc<Job>, pool: &SyncSender<Block>) {
    if let Some(j) = Arc::into_inner(job) {
        let _ = pool.send(j.block);
    }
}

impl Sink {
    /// Create `path` (which must not exist) for writing, with direct I/O where it is taken
    /// (unless `KQUANT_NO_DIRECT_IO` is set).
    pub fn create(path: &Path) -> Result<Sink> {
        let no_direct =
            std::env::var_os("KQUANT_NO_DIRECT_IO").is_some_and(|v| !v.is_empty() && v != "0");
        Sink::create_with(path, !no_direct)
    }

    /// [`create`](Self::create), trying direct I/O only when `try_direct`.
    pub fn create_with(path: &Path, try_direct: bool) -> Result<Sink> {
        let (file, direct) = open(path, try_direct).map_err(|e| Error::io("create", path, e))?;
        let file = Arc::new(file);
        let (pool_tx, pool) = sync_channel::<Block>(BLOCKS);
        for _ in 0..BLOCKS {
            pool_tx.send(Block::new()).expect("pool has room");
        }
        let (to_hash, hash_rx) = sync_channel::<Arc<Job>>(BLOCKS);
        let (to_write, write_rx) = sync_channel::<Arc<Job>>(BLOCKS);
        let hpool = pool_tx.clone();
        let hasher = std::thread::spawn(move || {
            let mut h = Sha256::new();
            for job in hash_rx {
                h.update(&job.block.bytes()[..job.len]);
                recycle(job, &hpool);
            }
            super::hash::hex(&h.finalize())
        });
        let failed = Arc::new(Mutex::new(None));
        let wfile = Arc::clone(&file);
        let wfailed = Arc::clone(&failed);
        let writer = std::thread::spawn(move || {
            let mut direct = direct;
            for job in write_rx {
                let ok = wfailed.lock().map(|f| f.is_none()).unwrap_or(false);
                if ok {
                    if let Err(e) = write_block(&wfile, &job, &mut direct) {
                        if let Ok(mut f) = wfailed.lock() {
                            *f = Some(e);
                        }
                    }
                }
                recycle(job, &pool_tx);
            }
        });
        Ok(Sink {
            path: path.into(),
            file,
            cur: None,
            fill: 0,
            pos: 0,
            pool,
            to_hash: Some(to_hash),
            to_write: Some(to_write),
            hasher: Some(hasher),
            writer: Some(writer),
            failed,
            direct,
        })
    }

    /// Whether the file was opened for direct I/O.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Append `data`.
    pub fn write(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            let fill = self.fill;
            let block = self.block()?;
            let n = (BLOCK - fill).min(data.len());
            block.bytes_mut()[fill..fill + n].copy_from_slice(&data[..n]);
            data = &data[n..];
            self.advance(n)?;
        }
        Ok(())
    }

    /// Append `len` bytes of `src` from offset `off`, read straight into the staging blocks
    /// (no mapping of the source, so its pages never count in this process's RSS).
    pub fn copy_from(&mut self, src: &File, src_path: &Path, mut off: u64, len: u64) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let mut left = len;
        while left > 0 {
            let fill = self.fill;
            let block = self.block()?;
            let n = ((BLOCK - fill) as u64).min(left) as usize;
            let dst = &mut block.bytes_mut()[fill..fill + n];
            let mut got = 0;
            while got < n {
                match src.read_at(&mut dst[got..], off + got as u64) {
                    Ok(0) => {
                        return Err(Error::Source {
                            path: src_path.into(),
                            msg: format!(
                                "ended at byte {} while {} more were expected: it shrank while kquant read it",
                                off + got as u64,
                                n - got
                            ),
                            hint: Some("do not change a checkpoint while kquant reads it; copy or download it again and re-run".into()),
                        })
                    }
                    Ok(k) => got += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Error::io("read", src_path, e)),
                }
            }
            off += n as u64;
            left -= n as u64;
            self.advance(n)?;
        }
        Ok(())
    }

    /// Write what is left, wait for both threads, cut the padding, fsync. Returns the file's
    /// length and sha256.
    pub fn finish(mut self) -> Result<(u64, String)> {
        if self.fill > 0 {
            self.submit()?;
        }
        let sha = self.join();
        self.check()?;
        let err = |what, e| Error::io(what, &self.path, e);
        self.file
            .set_len(self.pos)
            .map_err(|e| err("truncate", e))?;
        self.file.sync_all().map_err(|e| err("fsync", e))?;
        Ok((self.pos, sha.expect("hasher joined once")))
    }

    /// The block being filled, taking a free one from the pool when needed.
    fn block(&mut self) -> Result<&mut Block> {
        if self.cur.is_none() {
            let b = self.pool.recv().map_err(|_| self.thread_died())?;
            self.cur = Some(b);
            self.fill = 0;
        }
        Ok(self.cur.as_mut().expect("just set"))
    }

    fn advance(&mut self, n: usize) -> Result<()> {
        self.fill += n;
        self.pos += n as u64;
        if self.fill == BLOCK {
            self.submit()?;
        }
        Ok(())
    }

    fn submit(&mut self) -> Result<()> {
        self.check()?;
        let block = self.cur.take().expect("a block is being filled");
        let len = std::mem::take(&mut self.fill);
        let job = Arc::new(Job {
            block,
            len,
            off: self.pos - len as u64,
        });
        let sent = self
            .to_hash
            .as_ref()
            .expect("open")
            .send(Arc::clone(&job))
            .is_ok()
            && self.to_write.as_ref().expect("open").send(job).is_ok();
        if !sent {
            return Err(self.thread_died());
        }
        Ok(())
    }

    /// The first write error, if any.
    fn check(&self) -> Result<()> {
        let f = self.failed.lock().map_err(|_| self.thread_died())?;
        match &*f {
            Some(e) => {
                let e = match e.raw_os_error() {
                    Some(code) => std::io::Error::from_raw_os_error(code),
                    None => std::io::Error::new(e.kind(), e.to_string()),
                };
                Err(Error::io("write", &self.path, e))
            }
            None => Ok(()),
        }
    }

    fn thread_died(&self) -> Error {
        Error::Output {
            path: self.path.clone(),
            msg: "an output thread stopped unexpectedly".into(),
            hint: None,
        }
    }

    /// Close both queues and wait for the threads; the hasher's digest.
    fn join(&mut self) -> Option<String> {
        drop(self.to_hash.take());
        drop(self.to_write.take());
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
        self.hasher.take().and_then(|h| h.join().ok())
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.join();
    }
}

/// Open `path` for writing, with `O_DIRECT` where the platform and filesystem take it.
fn open(path: &Path, try_direct: bool) -> std::io::Result<(File, bool)> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(target_os = "linux")]
    if try_direct {
        use std::os::unix::fs::OpenOptionsExt;
        let mut d = o.clone();
        d.custom_flags(libc::O_DIRECT);
        match d.open(path) {
            Ok(f) => return Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
    }
    o.open(path).map(|f| (f, false))
}

/// Write one block at its offset. A direct write covers whole alignment units (the padding of
/// the last block is cut by [`Sink::finish`]); if the device refuses direct I/O at the first
/// write, the file falls back to buffered writes.
fn write_block(file: &File, job: &Job, direct: &mut bool) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    if *direct {
        let n = job.len.div_ceil(ALIGN) * ALIGN;
        match file.write_all_at(&job.block.bytes()[..n], job.off) {
            Ok(()) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                clear_direct(file)?;
                *direct = false;
            }
            Err(e) => return Err(e),
        }
    }
    file.write_all_at(&job.block.bytes()[..job.len], job.off)
}

/// Turn `O_DIRECT` off on an open file.
fn clear_direct(file: &File) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        let fd = file.as_raw_fd();
        // SAFETY: plain fcntl calls on a descriptor this process owns.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_DIRECT) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| {
                (i as u32)
                    .wrapping_mul(2654435761)
                    .wrapping_add(seed as u32) as u8
                    ^ (i >> 13) as u8
            })
            .collect()
    }

    /// Odd-sized writes and copies across block boundaries give the same file and digest as
    /// writing the bytes with `std::fs::write` and hashing them with `Sha256::digest`.
    #[test]
    fn writes_and_copies_equal_plain_file() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src.bin");
        let srcdata = pattern(3 * BLOCK + 12_345, 7);
        std::fs::write(&src, &srcdata).unwrap();
        let sf = File::open(&src).unwrap();
        for (direct, total_extra) in [false, true]
            .into_iter()
            .flat_map(|d| [0usize, 1, 4095, 4096, 4097].map(|n| (d, n)))
        {
            let out = t.path().join(format!("out-{direct}-{total_extra}"));
            let mut s = Sink::create_with(&out, direct).unwrap();
            assert!(direct || !s.is_direct());
            let mut want = Vec::new();
            let head = pattern(8 + 4093, 1);
            s.write(&head).unwrap();
            want.extend_from_slice(&head);
            s.copy_from(&sf, &src, 5, (BLOCK + 777) as u64).unwrap();
            want.extend_from_slice(&srcdata[5..5 + BLOCK + 777]);
            let mid = pattern(2 * BLOCK + 3, 2);
            s.write(&mid).unwrap();
            want.extend_from_slice(&mid);
            s.copy_from(&sf, &src, 100, total_extra as u64).unwrap();
            want.extend_from_slice(&srcdata[100..100 + total_extra]);
            let (len, sha) = s.finish().unwrap();
            assert_eq!(len, want.len() as u64);
            assert_eq!(std::fs::read(&out).unwrap(), want);
            assert_eq!(sha, crate::io::hash::hex(&Sha256::digest(&want)));
        }
    }

    #[test]
    fn empty_file() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("e");
        let (len, sha) = Sink::create(&out).unwrap().finish().unwrap();
        assert_eq!(len, 0);
        assert_eq!(std::fs::metadata(&out).unwrap().len(), 0);
        assert_eq!(sha, crate::io::hash::hex(&Sha256::digest(b"")));
    }

    #[test]
    fn copy_past_the_end_of_the_source_is_an_error() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src.bin");
        std::fs::write(&src, [1u8; 100]).unwrap();
        let mut s = Sink::create(&t.path().join("o")).unwrap();
        let e = s
            .copy_from(&File::open(&src).unwrap(), &src, 50, 51)
            .unwrap_err()
            .to_string();
        assert!(e.contains("shrank while kquant read it"), "{e}");
    }
}
