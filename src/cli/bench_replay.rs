//! `kquant bench replay DRAFT`: measured (never asserted) speed of the verify replay on the CPU.
//! It loads the draft the way `kquant verify` does (`verify::drafters::load_drafter`), runs pass
//! A (the teacher-forced depth matches) and pass B (the walk) over a trace — a captured one, or
//! a deterministic synthetic `kquant-trace/1` built for the draft's taps, hidden size and vocab
//! (`trace::synthetic`) —
//! and reports the load time, the pass-A time, token·depths per second (generated positions ×
//! depths / pass-A seconds) and the process's peak RSS, after the load and at the end.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use serde_json::json;

use crate::checkpoint::Checkpoint;
use crate::cli::human_bytes;
use crate::error::{Error, Result};
use crate::trace::file::Trace;
use crate::trace::synthetic::{self, TraceShape};
use crate::verify::drafters::{load_drafter, sample_matches, AfterMiss};
use crate::verify::walk::{walk_to, Walk};

/// Arguments of `kquant bench replay`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Draft checkpoint (EAGLE-3 Llama or MLA, DFlash).
    pub draft: String,
    /// A `kquant-trace/1` directory to replay.
    #[arg(long, conflicts_with = "synthetic_trace")]
    pub trace: Option<PathBuf>,
    /// Replay a deterministic synthetic trace of LEN tokens per sample instead (the default,
    /// 512): tokens from a fixed LCG over the draft's vocab, small random bf16 taps.
    #[arg(long, value_name = "LEN", value_parser = crate::cli::flags::seq_len)]
    pub synthetic_trace: Option<usize>,
    /// Prompt tokens of each synthetic sample (default LEN / 8); the rest are generated
    /// positions, the ones pass A scores.
    #[arg(long, value_parser = crate::cli::flags::prompt_len)]
    pub prompt_len: Option<usize>,
    /// Keep the synthetic trace in DIR (replaced if present) instead of a temporary directory.
    #[arg(long, value_name = "DIR", conflicts_with = "trace")]
    pub write_trace: Option<PathBuf>,
    /// Samples to replay: the first N of `--trace` (default all), or N synthetic ones
    /// (default 1).
    #[arg(long, value_parser = crate::cli::flags::samples)]
    pub samples: Option<usize>,
    #[command(flatten)]
    pub steps: crate::cli::flags::Steps,
    /// Target checkpoint, for drafts that run with its embedding (and lm_head).
    #[arg(long)]
    pub target_checkpoint: Option<String>,
    /// What pass A computes after a root's first miss (`run`: every depth, as `verify`'s
    /// default; `skip`: an EAGLE-3 chain stops at the first miss). A synthetic trace's random
    /// tokens match almost nothing, so `skip` there times depth 0 alone.
    #[arg(long, value_enum, default_value_t = AfterMiss::Run)]
    pub after_miss: AfterMiss,
    /// Print the figures as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Default length of a synthetic sample.
pub const SYNTHETIC_LEN: usize = 512;
/// A `/proc/self/status` field in bytes (`VmRSS`, `VmHWM`).
fn status_bytes(key: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|kb| kb * 1024)
}

/// Removes a temporary directory when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn run(a: Args) -> Result<ExitCode> {
    let ck = Checkpoint::open(&a.draft)?;
    let family = ck.detect()?.family.id().to_string();
    let draft_bytes: u64 = ck.weights.shards.iter().map(|s| s.file_len()).sum();
    drop(ck);

    let t = Instant::now();
    let target = a
        .target_checkpoint
        .as_deref()
        .map(Checkpoint::open)
        .transpose()?;
    let d = load_drafter(
        &a.draft,
        target.as_ref(),
        &crate::runtime::linears::Exec::F32,
    )?;
    drop(target);
    let load_s = t.elapsed().as_secs_f64();
    let rss_after_load = status_bytes("VmRSS:");
    let peak_after_load = status_bytes("VmHWM:");

    let t = Instant::now();
    let (_tmp, dir, synthetic) = match &a.trace {
        Some(p) => (None, p.clone(), None),
        None => {
            let len = a.synthetic_trace.unwrap_or(SYNTHETIC_LEN);
            let prompt_len = a.prompt_len.unwrap_or((len / 8).max(1));
            let (tmp, dir) = match &a.write_trace {
                Some(p) => (None, p.clone()),
                None => {
                    let p = std::env::temp_dir()
                        .join(format!("kquant-bench-replay-{}", std::process::id()));
                    (Some(TempDir(p.clone())), p)
                }
            };
            let shape = TraceShape {
                taps: d.taps().to_vec(),
                hidden: d.target_hidden(),
                vocab: d.vocab(),
            };
            synthetic::write(&dir, &shape, len, prompt_len, a.samples.unwrap_or(1))?;
            (
                tmp,
                dir,
                Some(json!({"len": len, "prompt_len": prompt_len, "seed": synthetic::SEED})),
            )
        }
    };
    let mut tr = Trace::open(&dir)?;
    if let (Some(n), Some(_)) = (a.samples, &a.trace) {
        tr.manifest.samples.truncate(n);
    }
    if tr.manifest.samples.is_empty() {
        return Err(Error::Usage(format!(
            "trace {} has no samples to replay",
            dir.display()
        )));
    }
    tr.require(
        d.taps(),
        d.target_hidden(),
        Some(d.vocab()),
        &format!("draft `{}`", a.draft),
    )?;
    let trace_s = t.elapsed().as_secs_f64();

    // The replay of `verify::drafters::replay`, timed by part.
    let steps = crate::verify::drafters::steps_for(d.as_ref(), a.steps.steps, &a.draft)?;
    let depths = steps;
    let (mut taps_s, mut pass_a_s, mut pass_b_s) = (0f64, 0f64, 0f64);
    let mut total = Walk::default();
    let mut positions = 0u64;
    let flops_before = crate::ops::gemm::flops_done();
    let gemm_s_before = crate::ops::gemm::seconds_in();
    for s in &tr.manifest.samples {
        let t = Instant::now();
        let x = tr.tokens(s)?;
        let taps: Vec<Vec<f32>> = d
            .taps()
            .iter()
            .map(|&i| tr.tap(s, i))
            .collect::<Result<_>>()?;
        taps_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let (m, skipped) = sample_matches(d.as_ref(), &x, &taps, s.prompt_len, steps, a.after_miss);
        pass_a_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut w = walk_to(&m, s.stop());
        w.after_miss_skipped = skipped;
        total.add(&w);
        pass_b_s += t.elapsed().as_secs_f64();
        positions += s.gen_len as u64;
    }
    let td_per_s = (positions * depths as u64) as f64 / pass_a_s;
    let gemm_flops = crate::ops::gemm::flops_done() - flops_before;
    let gemm_s = crate::ops::gemm::seconds_in() - gemm_s_before;
    // The machine's own f32 FMA peak, measured now, on the replay's threads.
    let fma = crate::ops::peak::measure(rayon::current_num_threads(), 0.6);
    // Over the time spent inside the products (what the kernels reach), and over all of pass A
    // (what the replay reaches, attention and the rest included).
    let gemm_per_s = gemm_flops as f64 / gemm_s.max(1e-9);
    let pass_a_flops_per_s = gemm_flops as f64 / pass_a_s;
    let peak = status_bytes("VmHWM:");
    let doc = json!({
        "schema": "kquant.bench.replay/1",
        "draft": a.draft,
        "family": family,
        "draft_bytes": draft_bytes,
        "trace": if synthetic.is_some() { json!("synthetic") } else { json!(dir) },
        "synthetic": synthetic,
        "samples": tr.manifest.samples.len(),
        "positions": positions,
        "steps": steps,
        "after_miss": a.after_miss,
        "after_miss_skipped": total.after_miss_skipped,
        "depths": depths,
        "load_s": load_s,
        "trace_s": trace_s,
        "taps_read_s": taps_s,
        "pass_a_s": pass_a_s,
        "pass_b_s": pass_b_s,
        "token_depths_per_s": td_per_s,
        "gemm_flops": gemm_flops,
        "gemm_s": gemm_s,
        "gemm_flops_per_s": gemm_per_s,
        "pass_a_gemm_flops_per_s": pass_a_flops_per_s,
        "fma_peak": fma,
        "share_of_fma_peak": gemm_per_s / fma.flops,
        "pass_a_share_of_fma_peak": pass_a_flops_per_s / fma.flops,
        "positions_per_s": positions as f64 / pass_a_s,
        "accept_length": total.al_walk(),
        "rss_after_load_bytes": rss_after_load,
        "peak_rss_after_load_bytes": peak_after_load,
        "peak_rss_bytes": peak,
        "threads": rayon::current_num_threads(),
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&doc).expect("JSON"));
    } else {
        let mib = |b: Option<u64>| b.map_or("?".into(), human_bytes);
        println!(
            "draft           {} ({family}, {})",
            a.draft,
            human_bytes(draft_bytes)
        );
        println!(
            "load            {load_s:.2} s, RSS {} after (peak {})",
            mib(rss_after_load),
            mib(peak_after_load)
        );
        match &synthetic {
            Some(_) => println!(
                "trace           synthetic, {} × {} tokens ({} generated positions), built in {trace_s:.2} s",
                tr.manifest.samples.len(),
                tr.manifest.samples[0].total_len().unwrap_or_default(),
                positions
            ),
            None => println!(
                "trace           {} ({} samples, {positions} generated positions)",
                dir.display(),
                tr.manifest.samples.len()
            ),
        }
        println!("taps → f32      {taps_s:.2} s");
        println!(
            "pass A          {pass_a_s:.2} s, {depths} depths{}: {td_per_s:.1} token·depths/s ({:.2} positions/s)",
            if total.after_miss_skipped { ", after a miss skipped" } else { "" },
            positions as f64 / pass_a_s
        );
        println!(
            "f32 FMA peak    {:.1} GFLOP/s ({}, {} threads, measured in this run)",
            fma.flops / 1e9,
            fma.isa,
            fma.threads
        );
        println!(
            "GEMM            {:.1} GFLOP in pass A (CPU linears), {gemm_s:.2} s inside the products: {:.1} GFLOP/s = {:.0} % of the peak",
            gemm_flops as f64 / 1e9,
            gemm_per_s / 1e9,
            100.0 * gemm_per_s / fma.flops,
        );
        println!(
            "                over all of pass A: {:.1} GFLOP/s = {:.0} % of the peak",
            pass_a_flops_per_s / 1e9,
            100.0 * pass_a_flops_per_s / fma.flops,
        );
        println!(
            "pass B          {:.1} ms (AL {:.3})",
            pass_b_s * 1e3,
            total.al_walk()
        );
        println!("peak RSS        {}", mib(peak));
    }
    Ok(ExitCode::SUCCESS)
}
