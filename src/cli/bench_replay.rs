//! `kquant bench replay DRAFT`: measured (never asserted) speed of the verify replay
//! (`bench::replay` runs it), on the CPU or with the linears on a `--device`: the load time, the
//! pass-A time, token·depths per second (generated positions × depths / pass-A seconds), the
//! products' share of the FMA peak, with a device pass A split into the CPU products, the device
//! layers and the rest, and the process's peak RSS, after the load and at the end.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::bench::replay::{self, Replay, Request, Step, Synthetic};
use crate::cli::human_bytes;
use crate::cli::print_json;
use crate::error::Result;
use crate::replay::AfterMiss;

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
    /// Keep the synthetic trace in DIR instead of a temporary directory.
    #[arg(long, value_name = "DIR", conflicts_with = "trace")]
    pub write_trace: Option<PathBuf>,
    /// Replace an existing `--write-trace` DIR (only a trace kquant wrote).
    #[arg(long, requires = "write_trace")]
    pub force: bool,
    /// The tap stream the synthetic trace is recorded as, for a draft of an attention-residual
    /// target (Kimi-K3): the stream the draft was trained on (default: `partial`, what a
    /// capture taps by default), so that `verify` replays it there.
    #[arg(long, value_enum, conflicts_with = "trace")]
    pub stream: Option<crate::target::stream::TapStream>,
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
    /// Where the draft's linears run, as `verify --device` takes it: `cpu` (the f32 runtime),
    /// `cuda[:N]`, `hip[:N]`, or `cpu-emu` (the kernels' CPU replay); the report then splits pass
    /// A into the CPU products, the device layers and the rest.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// How much of each draft step the device runs: `whole` (where the draft allows it: an
    /// EAGLE-3 or DFlash draft whose every linear is on the device; only token ids cross) or
    /// `per-linear` (the linears only; the rest on the CPU, activations copied both ways).
    #[arg(long, value_enum, default_value_t = Step::Whole)]
    pub step: Step,
    /// Print the figures as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let r = replay::run(&Request {
        draft: a.draft.clone(),
        trace: a.trace.clone(),
        synthetic: Synthetic {
            len: a.synthetic_trace,
            prompt_len: a.prompt_len,
            write_trace: a.write_trace.clone(),
            force: a.force,
            stream: a.stream,
        },
        samples: a.samples,
        steps: a.steps.steps,
        target_checkpoint: a.target_checkpoint.clone(),
        after_miss: a.after_miss,
        device: a.device.clone(),
        step: a.step,
    })?;
    if a.json {
        print_json(&r.to_json());
    } else {
        print_human(&r);
    }
    Ok(ExitCode::SUCCESS)
}

/// The figures, one line each.
fn print_human(r: &Replay) {
    let mib = |b: Option<u64>| b.map_or("?".into(), human_bytes);
    let (load_s, trace_s, taps_s, pass_a_s) = (r.load_s, r.trace_s, r.taps_s, r.pass_a_s);
    let (positions, depths, td_per_s) = (r.positions, r.depths(), r.token_depths_per_s());
    println!(
        "draft           {} ({}, {})",
        r.draft,
        r.family,
        human_bytes(r.draft_bytes)
    );
    println!(
        "load            {load_s:.2} s, RSS {} after (peak {})",
        mib(r.rss_after_load),
        mib(r.peak_after_load)
    );
    match &r.synthetic {
        Some(_) => println!(
            "trace           synthetic, {} × {} tokens ({} generated positions), built in {trace_s:.2} s",
            r.samples,
            r.first_len,
            positions
        ),
        None => println!(
            "trace           {} ({} samples, {positions} generated positions)",
            r.trace.display(),
            r.samples
        ),
    }
    println!("taps → f32      {taps_s:.2} s");
    println!(
        "pass A          {pass_a_s:.2} s, {depths} depths{}: {td_per_s:.1} token·depths/s ({:.2} positions/s)",
        if r.after_miss_skipped { ", after a miss skipped" } else { "" },
        r.positions_per_s()
    );
    print_flops(r);
    if let Some(dev) = &r.device {
        let dev = crate::escape::printable(dev);
        match &r.device_step {
            Some(Ok(())) => println!(
                "pass A phases   the whole step on {dev} {:.2} s ({} passes; taps up once a sample, token ids back) · CPU products {:.2} s · the rest {:.2} s (taps, host work)",
                r.device_s,
                r.device_calls,
                r.gemm_s,
                r.rest_s()
            ),
            other => println!(
                "pass A phases   CPU products {:.2} s · device layers {:.2} s ({} calls on {dev}) · the rest {:.2} s (attention, norms, gathers, host work){}",
                r.gemm_s,
                r.device_s,
                r.device_calls,
                r.rest_s(),
                match other {
                    Some(Err(why)) => format!("; per linear: {}", crate::escape::printable(why)),
                    _ => String::new(),
                }
            ),
        }
    }
    println!(
        "pass B          {:.1} ms (AL {:.3})",
        r.pass_b_s * 1e3,
        r.accept_length
    );
    println!("peak RSS        {}", mib(r.peak));
}

/// The FMA peak and the share of it the products reach.
fn print_flops(r: &Replay) {
    let fma = &r.fma;
    let (gemm_per_s, pass_a_flops_per_s) = (r.gemm_per_s(), r.pass_a_flops_per_s());
    println!(
        "f32 FMA peak    {:.1} GFLOP/s ({}, {} threads, measured in this run)",
        fma.flops / 1e9,
        fma.isa,
        fma.threads
    );
    println!(
        "GEMM            {:.1} GFLOP in pass A (CPU linears), {:.2} s inside the products: {:.1} GFLOP/s = {:.0} % of the peak",
        r.gemm_flops as f64 / 1e9,
        r.gemm_s,
        gemm_per_s / 1e9,
        100.0 * gemm_per_s / fma.flops,
    );
    println!(
        "                over all of pass A: {:.1} GFLOP/s = {:.0} % of the peak",
        pass_a_flops_per_s / 1e9,
        100.0 * pass_a_flops_per_s / fma.flops,
    );
}
