//! `kquant bench read SRC`: measured (never asserted) read speed. In one run it times
//! `cat FILE > /dev/null` of the same files (the baseline), the header-only open + detection
//! that `inspect` does, and a full read of every tensor with f32 conversion; it reports the
//! ratios and the process's peak RSS. `bench quantize` and `bench convert` time the command
//! against `cp` of the same bytes; `bench gemm` (in `bench_gemm`) the INT4 kernels; `bench
//! replay` (in `bench_replay`) the verify replay.

use std::path::PathBuf;
use std::process::{Command as Proc, ExitCode, Stdio};
use std::time::Instant;

use rayon::prelude::*;
use serde_json::json;

use crate::checkpoint::Checkpoint;
use crate::cli::human_bytes;
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
    /// Time `kquant quantize SRC` (as a child process) against `cp -r SRC` and `cp -r SRC && sync`
    /// of the same bytes, in one run; wall time and peak RSS of each.
    Quantize {
        /// Checkpoint directory.
        src: PathBuf,
        /// Scratch directory for the outputs (removed after each step).
        #[arg(long, default_value = "/tmp/kquant-bench-out")]
        scratch: PathBuf,
        /// A further baseline to time in every round, run with `sh -c` (e.g. Quark's file2file
        /// script); `{src}` and `{out}` are replaced.
        #[arg(long)]
        baseline: Option<String>,
        /// Print the figures as JSON on stdout.
        #[arg(long)]
        json: bool,
        /// Rounds of `cp`, `cp && sync`, kquant and the baseline, interleaved; each figure is
        /// the median.
        #[arg(long, default_value_t = 3, value_parser = crate::cli::flags::repeat)]
        repeat: u32,
        /// Arguments passed to `kquant quantize` (after `--`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Time `kquant convert KIND SRC --to ENGINE` against `cp -r SRC` (and `&& sync`) of the same
    /// bytes, in one run; wall time and peak RSS of each.
    Convert {
        /// Checkpoint directory.
        src: PathBuf,
        /// Scratch directory for the outputs (removed after each step).
        #[arg(long, default_value = "/tmp/kquant-bench-out")]
        scratch: PathBuf,
        /// Print the figures as JSON on stdout.
        #[arg(long)]
        json: bool,
        /// Rounds of `cp`, `cp && sync` and kquant, interleaved; each figure is the median.
        #[arg(long, default_value_t = 3, value_parser = crate::cli::flags::repeat)]
        repeat: u32,
        /// Arguments passed to `kquant convert KIND SRC -o OUT` after `--`, e.g. `-- eagle3 --to vllm`
        /// (the first one is the kind).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Time the INT4 GEMM kernels on a device against a device copy and a bf16 BLAS GEMM of the
    /// same shapes (docs/kernels.md).
    Gemm(super::bench_gemm::Args),
    /// Time the verify replay of a draft on the CPU (load, pass A, token·depths/s, peak RSS)
    /// over a trace or a synthetic one built for the draft.
    Replay(super::bench_replay::Args),
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
        What::Gemm(g) => super::bench_gemm::run(g),
        What::Replay(r) => super::bench_replay::run(r),
        What::Read { src, json } => read(&src, json),
        What::Quantize {
            src,
            scratch,
            baseline,
            json,
            repeat,
            args,
        } => run_timed(
            "quantize",
            &src,
            &scratch,
            baseline.as_deref(),
            json,
            repeat,
            &args,
        ),
        What::Convert {
            src,
            scratch,
            json,
            repeat,
            args,
        } => run_timed("convert", &src, &scratch, None, json, repeat, &args),
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
    let pb = crate::progress::bytes(bytes, "read");
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

/// Run `sh -c cmd`, returning (wall seconds, peak RSS bytes of that child).
fn timed(cmd: &str) -> Result<(f64, u64)> {
    let t = Instant::now();
    let mut child = Proc::new("sh")
        .arg("-c")
        .arg(cmd)
        .spawn()
        .map_err(|e| Error::io("run", std::path::Path::new("sh"), e))?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: plain FFI with valid out-pointers; the rusage is zero-initialised.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let wall = t.elapsed().as_secs_f64();
    if r != pid {
        let _ = child.wait();
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        return Err(Error::Usage(format!("`{cmd}` failed")));
    }
    Ok((wall, ru.ru_maxrss as u64 * 1024))
}

/// `verb` is `quantize` (`kquant quantize SRC -o OUT ARGS`) or `convert`
/// (`kquant convert ARGS[0] SRC -o OUT ARGS[1..]`).
/// The median of some timings (the mean of the middle two for an even count).
fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn run_timed(
    verb: &str,
    src: &std::path::Path,
    scratch: &std::path::Path,
    baseline: Option<&str>,
    as_json: bool,
    repeat: u32,
    args: &[String],
) -> Result<ExitCode> {
    let bytes: u64 = std::fs::read_dir(src)
        .map_err(|e| Error::io("list", src, e))?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    std::fs::create_dir_all(scratch).map_err(|e| Error::io("create", scratch, e))?;
    // Every step writes and deletes `out` in a directory of this run's own, so nothing that was
    // in SCRATCH before is ever deleted (removed at the end, also on error).
    let work = tempfile::Builder::new()
        .prefix(".kquant-bench-")
        .tempdir_in(scratch)
        .map_err(|e| Error::io("create a directory in", scratch, e))?;
    let out = work.path().join("out");
    let clean = || {
        let _ = std::fs::remove_dir_all(&out);
        let _ = Proc::new("sync").status();
    };
    let q = |p: &std::path::Path| format!("'{}'", p.display().to_string().replace('\'', "'\\''"));
    let me = std::env::current_exe()
        .map_err(|e| Error::io("locate", std::path::Path::new("kquant"), e))?;
    let extra: Vec<String> = args
        .iter()
        .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
        .collect();
    let cmd = match (verb, extra.split_first()) {
        ("convert", Some((kind, rest))) => format!(
            "{} convert {kind} {} -o {} {} 2>/dev/null",
            q(&me),
            q(src),
            q(&out),
            rest.join(" ")
        ),
        ("convert", None) => {
            let names = |v: Vec<Option<clap::builder::PossibleValue>>| {
                v.into_iter()
                    .flatten()
                    .map(|p| p.get_name().to_string())
                    .collect::<Vec<_>>()
                    .join(" | ")
            };
            use clap::ValueEnum;
            return Err(Error::Flags {
                msg: "bench convert needs the kind and --to after `--`".into(),
                hint: format!(
                    "give the kind ({}) and --to ENGINE ({}) after `--`, e.g. `-- eagle3 --to vllm`",
                    names(crate::cli::convert::Kind::value_variants().iter().map(|k| k.to_possible_value()).collect()),
                    names(crate::convert::Engine::value_variants().iter().map(|e| e.to_possible_value()).collect()),
                ),
            });
        }
        _ => format!(
            "{} {verb} {} -o {} {} 2>/dev/null",
            q(&me),
            q(src),
            q(&out),
            extra.join(" ")
        ),
    };
    // Interleaved rounds, so that a slow moment of the machine (writeback of an earlier
    // step, another VM) hits every command alike; each figure is the median.
    let (mut cp, mut cps, mut kq) = (Vec::new(), Vec::new(), Vec::new());
    let (mut cp_rss, mut kq_rss) = (0u64, 0u64);
    let base_cmd = baseline.map(|c| c.replace("{src}", &q(src)).replace("{out}", &q(&out)));
    let (mut base_runs, mut base_rss) = (Vec::new(), 0u64);
    clean();
    for _ in 0..repeat {
        let (t, r) = timed(&format!("cp -r {} {}", q(src), q(&out)))?;
        cp.push(t);
        cp_rss = cp_rss.max(r);
        clean();
        cps.push(timed(&format!("cp -r {} {} && sync", q(src), q(&out)))?.0);
        clean();
        let (t, r) = timed(&cmd)?;
        kq.push(t);
        kq_rss = kq_rss.max(r);
        clean();
        if let Some(b) = &base_cmd {
            let (t, r) = timed(b)?;
            base_runs.push(t);
            base_rss = base_rss.max(r);
            clean();
        }
    }
    let (cp_s, cps_s, kq_s) = (median(&cp), median(&cps), median(&kq));
    let base = (!base_runs.is_empty()).then(|| (median(&base_runs), base_rss));
    let doc = json!({
        "schema": format!("kquant.bench.{verb}/1"),
        "src": src, "bytes": bytes, "args": args,
        "repeat": repeat, "cp_runs_s": cp, "cp_sync_runs_s": cps, "kquant_runs_s": kq,
        "baseline_runs_s": base_cmd.as_ref().map(|_| &base_runs),
        "cp_s": cp_s, "cp_rss_bytes": cp_rss, "cp_sync_s": cps_s,
        "kquant_s": kq_s, "kquant_rss_bytes": kq_rss,
        "kquant_vs_cp": kq_s / cp_s, "kquant_vs_cp_sync": kq_s / cps_s,
        "baseline_s": base.map(|b| b.0), "baseline_rss_bytes": base.map(|b| b.1),
        "baseline_vs_kquant": base.map(|b| b.0 / kq_s),
        "threads": rayon::current_num_threads(),
    });
    if as_json {
        println!("{}", serde_json::to_string_pretty(&doc).expect("JSON"));
    } else {
        println!(
            "input             {} ({})",
            src.display(),
            human_bytes(bytes)
        );
        let runs = |v: &[f64]| {
            v.iter()
                .map(|t| format!("{t:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!("rounds            {repeat} (each figure the median; runs in brackets)");
        println!(
            "cp -r             {cp_s:.2} s [{}], peak RSS {}",
            runs(&cp),
            human_bytes(cp_rss)
        );
        println!("cp -r && sync     {cps_s:.2} s [{}]", runs(&cps));
        println!("kquant {verb:<10} [{}]", runs(&kq));
        println!(
            "kquant {verb:<10} {kq_s:.2} s, peak RSS {} ({:.2}× cp, {:.2}× cp+sync)",
            human_bytes(kq_rss),
            kq_s / cp_s,
            kq_s / cps_s
        );
        if let Some((b, r)) = base {
            println!(
                "baseline          {b:.2} s, peak RSS {} (kquant {:.1}× faster)",
                human_bytes(r),
                b / kq_s
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
