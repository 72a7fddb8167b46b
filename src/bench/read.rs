//! `kquant bench read SRC`: the header-only open + detection that `inspect` does, and a full
//! read of every tensor with f32 conversion, against `cat FILE > /dev/null` of the same files
//! (before and after the read, the better of the two the baseline); the process's peak RSS.

use std::path::PathBuf;
use std::process::{Command as Proc, Stdio};
use std::time::Instant;

use rayon::prelude::*;
use serde_json::{json, Value};

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::io::dtype;

/// The figures of a read.
#[derive(Debug, Clone)]
pub struct Reading {
    pub src: String,
    pub family: &'static str,
    pub files: usize,
    pub bytes: u64,
    /// Open + validate headers + detect, seconds.
    pub inspect_s: f64,
    /// The full read with f32 conversion, seconds.
    pub read_s: f64,
    /// `cat` of the files before and after the read, seconds.
    pub cat: [f64; 2],
    pub peak_rss: Option<u64>,
    /// The sum of every value read (so that the conversion cannot be optimized away).
    pub checksum: f64,
}

impl Reading {
    /// The better `cat`.
    pub fn cat_s(&self) -> f64 {
        self.cat[0].min(self.cat[1])
    }

    /// The `--json` document (`kquant.bench.read/1`).
    pub fn to_json(&self) -> Value {
        let (read_s, cat_s) = (self.read_s, self.cat_s());
        json!({
            "schema": "kquant.bench.read/1",
            "src": self.src,
            "family": self.family,
            "files": self.files,
            "bytes": self.bytes,
            "inspect_s": self.inspect_s,
            "read_f32_s": read_s,
            "cat_s": self.cat,
            "read_vs_cat": read_s / cat_s,
            "read_gb_per_s": self.bytes as f64 / read_s / 1e9,
            "cat_gb_per_s": self.bytes as f64 / cat_s / 1e9,
            "peak_rss_bytes": self.peak_rss,
            "threads": rayon::current_num_threads(),
            "checksum": self.checksum,
        })
    }
}

/// Run `cat FILE > /dev/null` over `files`, returning the wall seconds.
fn cat(files: &[PathBuf]) -> Result<f64> {
    let t = Instant::now();
    for f in files {
        let st = Proc::new("cat")
            .arg(f)
            .stdout(Stdio::null())
            .status()
            .map_err(|e| Error::io("run `cat` on", f, e))?;
        if !st.success() {
            return Err(Error::Usage(format!("`cat {}` failed", f.display())));
        }
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Every tensor of `ck` converted to f32 (in blocks of 64 MiB split across threads, each
/// block's pages dropped once consumed, so peak RSS stays near one block per thread); the sum
/// of the values.
fn read_all(ck: &Checkpoint, pb: &indicatif::ProgressBar) -> f64 {
    let mut checksum = 0f64;
    for shard in &ck.weights.shards {
        shard.advise_sequential();
        for info in shard.tensors() {
            let v = shard.view(info);
            let block = 64 << 20;
            let step = (1 << 20) * info.dtype.size();
            for (b, blk) in v.data.chunks(block).enumerate() {
                checksum += blk
                    .par_chunks(step)
                    .map(|c| {
                        let mut buf = Vec::with_capacity(c.len() / info.dtype.size());
                        dtype::to_f32(info.dtype, c, &mut buf);
                        buf.iter().sum::<f32>() as f64
                    })
                    .sum::<f64>();
                let from = (b * block) as u64;
                shard.release_range(info, from, from + blk.len() as u64);
            }
            pb.inc(info.nbytes());
        }
    }
    checksum
}

/// Time the open, `cat`, the read (with a progress bar), `cat` again.
pub fn run(src: &str) -> Result<Reading> {
    let t = Instant::now();
    let ck = Checkpoint::open(src)?;
    let det = ck.detect()?;
    let inspect_s = t.elapsed().as_secs_f64();
    let files: Vec<PathBuf> = ck.weights.files().iter().map(|p| p.to_path_buf()).collect();
    let bytes: u64 = ck.weights.shards.iter().map(|s| s.file_len()).sum();
    let cat1 = cat(&files)?;
    let pb = crate::progress::bytes(bytes, "read");
    let t = Instant::now();
    let checksum = read_all(&ck, &pb);
    let read_s = t.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let cat2 = cat(&files)?;
    Ok(Reading {
        src: src.to_string(),
        family: det.family.id(),
        files: files.len(),
        bytes,
        inspect_s,
        read_s,
        cat: [cat1, cat2],
        peak_rss: crate::io::process::peak_rss(),
        checksum,
    })
}
