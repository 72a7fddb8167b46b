//! `kquant bench replay DRAFT`: measured (never asserted) speed of the verify replay on the CPU.
//! It loads the draft the way `kquant verify` does (`verify::drafters::load_drafter`), runs pass
//! A (the teacher-forced depth matches) and pass B (the walk) over a trace — a captured one, or
//! a deterministic synthetic `kquant-trace/1` built for the draft's taps, hidden size and vocab —
//! and reports the load time, the pass-A time, token·depths per second (generated positions ×
//! depths / pass-A seconds) and the process's peak RSS, after the load and at the end.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use serde_json::json;

use crate::checkpoint::Checkpoint;
use crate::cli::human_bytes;
use crate::error::{Error, Result};
use crate::verify::drafters::load_drafter;
use crate::verify::trace::{self, Manifest, NewSample, SampleMeta, Trace};
use crate::verify::walk::{walk, Walk};

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
    /// Draft depths per round (a DFlash draft uses its block size − 1).
    #[arg(long, default_value_t = 3, value_parser = crate::cli::flags::steps)]
    pub steps: usize,
    /// Target checkpoint, for drafts that run with its embedding (and lm_head).
    #[arg(long)]
    pub target_checkpoint: Option<String>,
    /// Print the figures as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Default length of a synthetic sample.
pub const SYNTHETIC_LEN: usize = 512;
/// Seed of the synthetic trace's LCG.
pub const SEED: u64 = 0x6b71_7561_6e74;

/// A 64-bit LCG (Knuth's MMIX constants); the high bits are used.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// What a synthetic trace must match.
pub struct TraceShape {
    pub taps: Vec<usize>,
    pub hidden: usize,
    pub vocab: usize,
}

/// Most tap values (samples × tokens × taps × hidden) a synthetic trace may hold: 4 GiB as f32.
pub const MAX_SYNTHETIC_VALUES: usize = 1 << 30;

/// Write a deterministic synthetic `kquant-trace/1` at `dir`: `samples` samples of `len` tokens
/// (`prompt_len` of them prompt), tokens uniform over `0..vocab` and every tap uniform in
/// ±0.5 (stored as bf16). The same arguments always give the same bytes.
pub fn write_synthetic(
    dir: &Path,
    shape: &TraceShape,
    len: usize,
    prompt_len: usize,
    samples: usize,
) -> Result<()> {
    if len < 2 || prompt_len == 0 || prompt_len >= len {
        return Err(Error::Usage(format!(
            "a synthetic trace needs 0 < prompt length ({prompt_len}) < length ({len})"
        )));
    }
    if shape.vocab == 0 || shape.hidden == 0 || shape.taps.is_empty() {
        return Err(Error::Usage(
            "the draft reports no vocab, hidden size or taps".into(),
        ));
    }
    // Every tap value is held in memory as f32 while the trace is built: bounded up front.
    let values = [shape.taps.len(), len, shape.hidden]
        .iter()
        .try_fold(samples, |a, &b| a.checked_mul(b))
        .filter(|&v| v <= MAX_SYNTHETIC_VALUES);
    if values.is_none() {
        return Err(Error::Flags {
            msg: format!(
                "a synthetic trace of {samples} sample(s) × {len} tokens × {} tap(s) × hidden {} is more than {MAX_SYNTHETIC_VALUES} values",
                shape.taps.len(),
                shape.hidden
            ),
            hint: "lower --synthetic-trace or --samples".into(),
        });
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| Error::io("create", parent, e))?;
    }
    // A bench trace is replaced without --force, but only when kquant wrote it.
    let claim = trace::claim(dir, true, &[])?;
    let mut taps = shape.taps.clone();
    taps.sort_unstable();
    taps.dedup();
    let mut rng = Lcg(SEED);
    let data: Vec<(Vec<u32>, Vec<Vec<f32>>)> = (0..samples)
        .map(|_| {
            let toks = (0..len)
                .map(|_| ((rng.next() >> 33) % shape.vocab as u64) as u32)
                .collect();
            let vals = taps
                .iter()
                .map(|_| (0..len * shape.hidden).map(|_| 0.5 * rng.unit()).collect())
                .collect();
            (toks, vals)
        })
        .collect();
    let meta = |i: usize| SampleMeta {
        id: i as u64,
        category: "synthetic".into(),
        dataset: "kquant-bench-lcg".into(),
        shard: String::new(),
        prompt_len,
        gen_len: len - prompt_len,
        finish_reason: "length".into(),
        turn: 0,
    };
    let new: Vec<NewSample<'_>> = data
        .iter()
        .enumerate()
        .map(|(i, (toks, vals))| NewSample {
            meta: meta(i),
            tokens: toks,
            taps: taps
                .iter()
                .copied()
                .zip(vals.iter().map(|v| &v[..]))
                .collect(),
            target_top1: None,
        })
        .collect();
    let mut extra = serde_json::Map::new();
    extra.insert(
        "synthetic".into(),
        json!({"generator": "kquant bench replay", "seed": SEED, "taps": "uniform ±0.5"}),
    );
    let manifest = Manifest {
        format: trace::FORMAT.into(),
        target: json!({"name": "synthetic"}),
        hidden_size: shape.hidden,
        num_layers: taps.last().copied().unwrap_or(0).max(1),
        vocab_size: Some(shape.vocab),
        taps,
        tap_convention: trace::TAP_CONVENTION.into(),
        taps_pre_norm: true,
        dtype: "bf16".into(),
        greedy_selfcheck: None,
        samples: (0..samples).map(meta).collect(),
        shards: vec![],
        extra,
    };
    trace::write(claim, manifest, &new)
}

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
            write_synthetic(&dir, &shape, len, prompt_len, a.samples.unwrap_or(1))?;
            (
                tmp,
                dir,
                Some(json!({"len": len, "prompt_len": prompt_len, "seed": SEED})),
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
    let depths = d.depths(a.steps);
    let (mut taps_s, mut pass_a_s, mut pass_b_s) = (0f64, 0f64, 0f64);
    let mut total = Walk::default();
    let mut positions = 0u64;
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
        let m = d.matches(&x, &taps, s.prompt_len, a.steps);
        pass_a_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        total.add(&walk(&m));
        pass_b_s += t.elapsed().as_secs_f64();
        positions += s.gen_len as u64;
    }
    let td_per_s = (positions * depths as u64) as f64 / pass_a_s;
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
        "steps": a.steps,
        "depths": depths,
        "load_s": load_s,
        "trace_s": trace_s,
        "taps_read_s": taps_s,
        "pass_a_s": pass_a_s,
        "pass_b_s": pass_b_s,
        "token_depths_per_s": td_per_s,
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
            "pass A          {pass_a_s:.2} s, {depths} depths: {td_per_s:.1} token·depths/s ({:.2} positions/s)",
            positions as f64 / pass_a_s
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The synthetic trace opens, is deterministic, and holds what it was asked for.
    #[test]
    fn synthetic_trace_is_valid_and_deterministic() {
        let base = std::env::temp_dir().join(format!("kq-synth-trace-{}", std::process::id()));
        let shape = TraceShape {
            taps: vec![5, 2, 9],
            hidden: 16,
            vocab: 37,
        };
        let (a, b) = (base.join("a"), base.join("b"));
        write_synthetic(&a, &shape, 40, 5, 2).unwrap();
        write_synthetic(&b, &shape, 40, 5, 2).unwrap();
        let ta = Trace::open(&a).unwrap();
        let tb = Trace::open(&b).unwrap();
        assert_eq!(
            ta.manifest.shards, tb.manifest.shards,
            "same bytes, same sha256"
        );
        assert_eq!(ta.manifest.taps, vec![2, 5, 9]);
        ta.require(&[2, 5, 9], 16, Some(37), "d").unwrap();
        assert!(
            ta.require(&[2], 16, Some(30), "d").is_err(),
            "tokens span the vocab"
        );
        let s = &ta.manifest.samples[1];
        assert_eq!((s.prompt_len, s.gen_len), (5, 35));
        let x = ta.tokens(s).unwrap();
        assert_ne!(x, ta.tokens(&ta.manifest.samples[0]).unwrap());
        let tap = ta.tap(s, 9).unwrap();
        assert_eq!(tap.len(), 40 * 16);
        assert!(tap.iter().all(|v| v.abs() <= 0.5) && tap.iter().any(|v| v.abs() > 0.1));
        assert!(write_synthetic(&a, &shape, 40, 40, 1).is_err());
        let _ = std::fs::remove_dir_all(&base);
    }
}
