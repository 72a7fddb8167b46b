//! `kquant bench read SRC`: measured (never asserted) read speed. In one run it times
//! `cat FILE > /dev/null` of the same files (the baseline), the header-only open + detection
//! that `inspect` does, and a full read of every tensor with f32 conversion; it reports the
//! ratios and the process's peak RSS.

use std::path::PathBuf;
use std::process::{Command as Proc, ExitCode, Stdio};
use std::time::Instant;

use rayon::prelude::*;
use serde_json::json;

use crate::checkpoint::Checkpoint;
use crate::cli::{human_bytes, progress};
use crate::error::{Error, Result};
use crate::io::dtype;

/// Arguments of `kquant bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Debug, clap::Subcommand)]
pub enum What {
    /// Time inspect and a full f32 read of SRC against `cat` of the same bytes.
    Read {
        /// Checkpoint directory, `.safetensors` file or hub id.
        src: String,
        /// Print the figures as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(a: Args) -> Result<ExitCode> {
    match a.what {
        What::Read { src, json } => read(&src, json),
    }
}

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

/// Peak resident set size of this process (VmHWM), bytes.
pub fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|kb| kb * 1024)
}

fn read(src: &str, as_json: bool) -> Result<ExitCode> {
    let t = Instant::now();
    let ck = Checkpoint::open(src)?;
    let det = ck.detect()?;
    let inspect_s = t.elapsed().as_secs_f64();
    let files: Vec<PathBuf> = ck.weights.files().iter().map(|p| p.to_path_buf()).collect();
    let bytes: u64 = ck.weights.shards.iter().map(|s| s.file_len()).sum();

    let cat1 = cat(&files)?;
    let pb = progress(bytes, "read");
    let t = Instant::now();
    let mut checksum = 0f64;
    for shard in &ck.weights.shards {
        shard.advise_sequential();
        for info in shard.tensors() {
            let v = shard.view(info);
            // Convert in blocks of 64 MiB, split across threads; drop each block's pages once
            // it is consumed so peak RSS stays near one block per thread.
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
    let read_s = t.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let cat2 = cat(&files)?;
    let cat_s = cat1.min(cat2);
    let rss = peak_rss();
    let doc = json!({
        "schema": "kquant.bench.read/1",
        "src": src,
        "family": det.family.id(),
        "files": files.len(),
        "bytes": bytes,
        "inspect_s": inspect_s,
        "read_f32_s": read_s,
        "cat_s": [cat1, cat2],
        "read_vs_cat": read_s / cat_s,
        "read_gb_per_s": bytes as f64 / read_s / 1e9,
        "cat_gb_per_s": bytes as f64 / cat_s / 1e9,
        "peak_rss_bytes": rss,
        "threads": rayon::current_num_threads(),
        "checksum": checksum,
    });
    if as_json {
        println!("{}", serde_json::to_string_pretty(&doc).expect("JSON"));
    } else {
        println!(
            "checkpoint      {src} ({}, {} files, {})",
            det.family.id(),
            files.len(),
            human_bytes(bytes)
        );
        println!(
            "inspect         {:.1} ms (open + validate headers + detect)",
            inspect_s * 1e3
        );
        println!(
            "cat > /dev/null {:.2} s, {:.2} s ({:.2} GB/s best)",
            cat1,
            cat2,
            bytes as f64 / cat_s / 1e9
        );
        println!(
            "read + f32      {:.2} s ({:.2} GB/s), {:.2}× cat",
            read_s,
            bytes as f64 / read_s / 1e9,
            read_s / cat_s
        );
        if let Some(r) = rss {
            println!("peak RSS        {}", human_bytes(r));
        }
    }
    Ok(ExitCode::SUCCESS)
}
