//! `kquant bench read SRC`: measured (never asserted) read speed. In one run it times
//! `cat FILE > /dev/null` of the same files (the baseline), the header-only open + detection
//! that `inspect` does, and a full read of every tensor with f32 conversion; it reports the
//! ratios and the process's peak RSS. `bench quantize` and `bench convert` time the command
//! against `cp` of the same bytes; `bench gemm` (in `bench_gemm`) the INT4 kernels; `bench
//! replay` (in `bench_replay`) the verify replay. The measurements are `crate::bench`'s; this
//! file parses the arguments and renders.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::bench::timed::{self, Timings};
use crate::cli::human_bytes;
use crate::cli::print_json;
use crate::error::Result;

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
    /// Time the verify replay of a draft (load, pass A, token·depths/s, peak RSS) over a trace
    /// or a synthetic one built for the draft, on the CPU or a device (`--device`).
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

fn read(src: &str, as_json: bool) -> Result<ExitCode> {
    let r = crate::bench::read::run(src)?;
    if as_json {
        print_json(&r.to_json());
        return Ok(ExitCode::SUCCESS);
    }
    let (bytes, read_s, cat_s) = (r.bytes, r.read_s, r.cat_s());
    println!(
        "checkpoint      {src} ({}, {} files, {})",
        r.family,
        r.files,
        human_bytes(bytes)
    );
    println!(
        "inspect         {:.1} ms (open + validate headers + detect)",
        r.inspect_s * 1e3
    );
    println!(
        "cat > /dev/null {:.2} s, {:.2} s ({:.2} GB/s best)",
        r.cat[0],
        r.cat[1],
        bytes as f64 / cat_s / 1e9
    );
    println!(
        "read + f32      {:.2} s ({:.2} GB/s), {:.2}× cat",
        read_s,
        bytes as f64 / read_s / 1e9,
        read_s / cat_s
    );
    if let Some(r) = r.peak_rss {
        println!("peak RSS        {}", human_bytes(r));
    }
    Ok(ExitCode::SUCCESS)
}

fn run_timed(
    verb: &str,
    src: &Path,
    scratch: &Path,
    baseline: Option<&str>,
    as_json: bool,
    repeat: u32,
    args: &[String],
) -> Result<ExitCode> {
    let t = timed::run(&timed::Request {
        verb,
        src,
        scratch,
        baseline,
        repeat,
        args,
    })?;
    if as_json {
        print_json(&t.to_json());
    } else {
        print_timings(&t);
    }
    Ok(ExitCode::SUCCESS)
}

/// The timings, each the median with the rounds in brackets.
fn print_timings(t: &Timings) {
    let (verb, repeat) = (&t.verb, t.repeat);
    let (cp_s, cps_s, kq_s) = (t.cp_s(), t.cp_sync_s(), t.kquant_s());
    println!(
        "input             {} ({})",
        t.src.display(),
        human_bytes(t.bytes)
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
        runs(&t.cp),
        human_bytes(t.cp_rss)
    );
    println!("cp -r && sync     {cps_s:.2} s [{}]", runs(&t.cp_sync));
    println!("kquant {verb:<10} [{}]", runs(&t.kquant));
    println!(
        "kquant {verb:<10} {kq_s:.2} s, peak RSS {} ({:.2}× cp, {:.2}× cp+sync)",
        human_bytes(t.kquant_rss),
        kq_s / cp_s,
        kq_s / cps_s
    );
    if let Some((b, r)) = t.baseline() {
        println!(
            "baseline          {b:.2} s, peak RSS {} (kquant {:.1}× faster)",
            human_bytes(r),
            b / kq_s
        );
    }
}
