//! A deterministic synthetic `kquant-trace/1` shaped for a draft (its taps, hidden size and
//! vocabulary): tokens from a fixed LCG, small random bf16 taps. `kquant bench replay` replays
//! one when it is given no `--trace`; the same arguments always give the same bytes.

use std::path::Path;

use serde_json::json;

use super::file::{self, Manifest, NewSample, SampleMeta};
use crate::error::{Error, Result};
use crate::target::stream::TapStream;

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
    /// The target's layer count when the draft records it; else the trace says the fewest
    /// layers its taps need.
    pub num_layers: Option<usize>,
    /// Whether the target has attention residuals, where its checkpoint is given
    /// (`target::stream::config_has_attention_residuals`); else a built-in profile of the
    /// trace's shape says (`trace::stream::has_attention_residuals`).
    pub attention_residuals: Option<bool>,
}

/// Most tap values (samples × tokens × taps × hidden) a synthetic trace may hold: 4 GiB as f32.
pub const MAX_SYNTHETIC_VALUES: usize = 1 << 30;

/// Write a deterministic synthetic `kquant-trace/1` at `dir`: `samples` samples of `len` tokens
/// (`prompt_len` of them prompt), tokens uniform over `0..vocab` and every tap uniform in
/// ±0.5 (stored as bf16). The same arguments always give the same bytes. `stream` is the tap
/// stream the trace is recorded as (noise is no stream in particular; see below).
pub fn write(
    dir: &Path,
    shape: &TraceShape,
    len: usize,
    prompt_len: usize,
    samples: usize,
    force: bool,
    stream: Option<TapStream>,
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
    // Replaced with `force` only, and then only when kquant wrote it (`io::output`).
    let claim = file::claim(dir, force, &[])?;
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
        stop_len: None,
        prompt_id: None,
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
    let mut manifest = Manifest {
        format: file::FORMAT.into(),
        target: json!({"name": "synthetic"}),
        hidden_size: shape.hidden,
        num_layers: shape
            .num_layers
            .unwrap_or(0)
            .max(taps.last().copied().unwrap_or(0))
            .max(1),
        vocab_size: Some(shape.vocab),
        taps,
        tap_convention: file::TAP_CONVENTION.into(),
        taps_pre_norm: true,
        tap_stream: None,
        dtype: "bf16".into(),
        greedy_selfcheck: None,
        samples: (0..samples).map(meta).collect(),
        shards: vec![],
        extra,
    };
    // Noise stands for no stream in particular; recorded as `stream` where asked (the stream of
    // the draft it is for), else as what a capture of a target of this shape would tap by
    // default (vLLM's `partial` on an attention-residual target), so that the trace is read as
    // one of its target's.
    let attn_res = shape
        .attention_residuals
        .unwrap_or_else(|| crate::trace::stream::has_attention_residuals(&manifest, None));
    manifest.tap_stream = Some(crate::trace::stream::for_target(
        stream,
        attn_res,
        match shape.attention_residuals {
            Some(_) => "the --target-checkpoint",
            None => "a synthetic trace of this shape",
        },
        "--stream",
    )?);
    file::write(claim, manifest, &new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::file::Trace;

    fn shape_of(s: &TraceShape) -> TraceShape {
        TraceShape {
            taps: s.taps.clone(),
            hidden: s.hidden,
            vocab: s.vocab,
            num_layers: s.num_layers,
            attention_residuals: s.attention_residuals,
        }
    }

    /// The synthetic trace opens, is deterministic, and holds what it was asked for.
    #[test]
    fn synthetic_trace_is_valid_and_deterministic() {
        let base = std::env::temp_dir().join(format!("kq-synth-trace-{}", std::process::id()));
        let shape = TraceShape {
            taps: vec![5, 2, 9],
            hidden: 16,
            vocab: 37,
            num_layers: None,
            attention_residuals: None,
        };
        let (a, b) = (base.join("a"), base.join("b"));
        write(&a, &shape, 40, 5, 2, false, None).unwrap();
        write(&b, &shape, 40, 5, 2, false, None).unwrap();
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
        assert!(write(&a, &shape, 40, 40, 1, false, None).is_err());
        // Without the target's layer count, the fewest its taps need; with it, that count
        // (never below the taps).
        assert_eq!(ta.manifest.num_layers, 9);
        for (given, says) in [(27, 27), (4, 9)] {
            let c = base.join(format!("c{given}"));
            let shape = TraceShape {
                num_layers: Some(given),
                ..shape_of(&shape)
            };
            write(&c, &shape, 40, 5, 1, false, None).unwrap();
            assert_eq!(Trace::open(&c).unwrap().manifest.num_layers, says);
        }
        let _ = std::fs::remove_dir_all(&base);
    }
}
