//! `kquant-trace/1` (docs/verify.md, "`kquant-trace/1`"): a directory with `manifest.json` and
//! safetensors shards holding, per sample, the token sequence (prompt + greedy continuation)
//! and the target's hidden states at each tapped layer, keyed by HF `hidden_states[i]` index.
//! Captured once where the target runs; replayed anywhere.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::io::manifest::hash_file;
use crate::io::output::{Claim, Kind};
use crate::io::writer::{TensorSpec, WriteOptions, Writer};
use crate::io::{Dtype, Shard, TensorView};

pub const FORMAT: &str = "kquant-trace/1";
pub use crate::target::taps::TAP_CONVENTION;

/// One sample of the manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleMeta {
    pub id: u64,
    #[serde(default)]
    pub category: String,
    #[serde(default)]
    pub dataset: String,
    pub shard: String,
    pub prompt_len: usize,
    pub gen_len: usize,
    #[serde(default)]
    pub finish_reason: String,
    /// Turn of a multi-turn conversation (0 for single-turn prompts).
    #[serde(default)]
    pub turn: u32,
    /// Where the engine stops this request (tokens, prompt included: `max_tokens` reached, or
    /// just after an EOS), when the sample runs past it: the tokens after `stop_len` are
    /// lookahead (the target's greedy continuation past the stop, EOS ignored), what the
    /// engine's final verify step compared its drafts with before cutting them
    /// (`trace capture --lookahead`). Absent: the engine stops at the end of the sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_len: Option<usize>,
    /// The prompt file's own id where it is not a whole number (`test-0`, `HumanEval/0`):
    /// `id` is then the sample's number, and this is what a live run of the same file calls the
    /// request (`verify-join` matches on it). Absent where the id is the prompt file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_id: Option<String>,
}

/// A shard file and its hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardMeta {
    pub file: String,
    pub sha256: String,
}

/// `manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    #[serde(default)]
    pub target: serde_json::Value,
    pub hidden_size: usize,
    pub num_layers: usize,
    #[serde(default)]
    pub vocab_size: Option<usize>,
    pub taps: Vec<usize>,
    pub tap_convention: String,
    #[serde(default = "default_true")]
    pub taps_pre_norm: bool,
    /// Which hidden-state stream the taps hold (`residual`, `partial`, `mixture`;
    /// `trace::stream`). Absent in a trace written before kquant recorded it: see
    /// `trace::stream::TraceStream::of` for what that means.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tap_stream: Option<crate::target::stream::TapStream>,
    pub dtype: String,
    #[serde(default)]
    pub greedy_selfcheck: Option<u64>,
    pub samples: Vec<SampleMeta>,
    pub shards: Vec<ShardMeta>,
    /// The other fields of the manifest (`tokenizer_sha256`, `sampling`, `thinking`, …), kept
    /// as written.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

fn default_true() -> bool {
    true
}

/// An opened, checked trace.
pub struct Trace {
    pub dir: PathBuf,
    pub manifest: Manifest,
    shards: Vec<Shard>,
    /// Shard file name → index in `shards`.
    shard_index: HashMap<String, usize>,
}

fn terr(dir: &Path, msg: String) -> Error {
    Error::Source {
        path: dir.join("manifest.json"),
        msg,
        hint: Some("see docs/verify.md for the kquant-trace/1 layout".into()),
    }
}

impl SampleMeta {
    /// Where the engine stops (tokens, prompt included): `stop_len`, else the whole sample.
    pub fn stop(&self) -> usize {
        self.stop_len
            .unwrap_or(self.prompt_len.saturating_add(self.gen_len))
    }
    /// Tokens of the sample, `prompt_len + gen_len`; `Err` with both true values when the sum
    /// overflows.
    pub fn total_len(&self) -> std::result::Result<usize, String> {
        self.prompt_len.checked_add(self.gen_len).ok_or_else(|| {
            format!(
                "sample {}: prompt_len {} + gen_len {} overflows",
                self.id, self.prompt_len, self.gen_len
            )
        })
    }
}

/// The largest `manifest.json` read (4 GiB: some ten million samples).
pub const MAX_MANIFEST: u64 = 4 << 30;

/// The manifest key of the taps' stream.
pub const TAP_STREAM: &str = "tap_stream";

/// The manifest's raw `tap_stream` (absent or `null`: not recorded), checked before the manifest
/// is read: a value kquant does not know is an error naming it and the known ones.
pub fn check_tap_stream(v: Option<&serde_json::Value>) -> std::result::Result<(), String> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(()),
        Some(serde_json::Value::String(s)) if crate::target::stream::TapStream::parse(s).is_some() => Ok(()),
        Some(other) => Err(format!(
            "{TAP_STREAM} {other} is not a tap stream kquant knows (`residual`, `partial` or `mixture`); \
             a newer kquant may have written it, or the manifest was edited"
        )),
    }
}

/// Parse and check `manifest.json` bytes (pure: the `trace_manifest` fuzz target drives it).
/// Every length, count and name the manifest gives is checked before anything is read with
/// it: format and tap convention, taps within the target's depth (`0..=num_layers`), shard
/// names (plain file names, each listed once), a positive hidden size, sample ids listed once, each sample's shard listed, and `prompt_len + gen_len`
/// and `(prompt_len + gen_len) × hidden_size` computed with checked arithmetic (an overflow is
/// refused with the true values). The tensors themselves are checked by [`Trace::open`].
pub fn parse_manifest(bytes: &[u8]) -> std::result::Result<Manifest, String> {
    let raw: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not a kquant trace manifest: {e}"))?;
    // A stream kquant does not know, named as such (not as a JSON type error).
    check_tap_stream(raw.get(TAP_STREAM))?;
    let manifest: Manifest =
        serde_json::from_value(raw).map_err(|e| format!("not a kquant trace manifest: {e}"))?;
    if manifest.format != FORMAT {
        return Err(format!(
            "format is `{}`, expected `{FORMAT}`",
            manifest.format
        ));
    }
    if manifest.tap_convention != TAP_CONVENTION {
        return Err(format!(
            "tap_convention `{}` is not `{TAP_CONVENTION}`",
            manifest.tap_convention
        ));
    }
    if manifest.hidden_size == 0 {
        return Err("hidden_size is 0".into());
    }
    // A tap is a `hidden_states` index of the target: 0..=num_layers.
    if let Some(t) = manifest.taps.iter().find(|&&t| t > manifest.num_layers) {
        return Err(format!(
            "tap {t} is beyond the target's depth: num_layers is {}, so hidden_states run 0..={}",
            manifest.num_layers, manifest.num_layers
        ));
    }
    let mut shard_names = HashSet::new();
    for s in &manifest.shards {
        if !crate::io::index::is_plain_file_name(&s.file) {
            return Err(format!("shard name `{}` is not a plain file name", s.file));
        }
        if !shard_names.insert(s.file.as_str()) {
            return Err(format!("shard `{}` is listed twice", s.file));
        }
    }
    let mut ids = HashSet::new();
    for s in &manifest.samples {
        if !ids.insert(s.id) {
            return Err(format!(
                "sample id {} is listed twice (both would read the same tensors `s{}.*`)",
                s.id, s.id
            ));
        }
        if !shard_names.contains(s.shard.as_str()) {
            return Err(format!("sample {} names unknown shard `{}`", s.id, s.shard));
        }
        let len = s.total_len()?;
        if let Some(stop) = s.stop_len {
            if stop <= s.prompt_len || stop > len {
                return Err(format!(
                    "sample {}: stop_len {stop} is outside its generated region ({}..={len})",
                    s.id,
                    s.prompt_len + 1
                ));
            }
        }
        if len.checked_mul(manifest.hidden_size).is_none() {
            return Err(format!(
                "sample {}: {len} tokens × hidden_size {} overflows",
                s.id, manifest.hidden_size
            ));
        }
    }
    Ok(manifest)
}

impl Trace {
    /// Open `dir`, check the manifest ([`parse_manifest`]), every shard's sha256 and every
    /// sample's tensors.
    pub fn open(dir: &Path) -> Result<Trace> {
        crate::io::reads::note(dir);
        let mpath = dir.join("manifest.json");
        // A regular file of a bounded size: a link to /dev/zero or a FIFO is an error, not an
        // endless read.
        let bytes = crate::io::text::read_regular(&mpath, MAX_MANIFEST, "trace manifest")?;
        let manifest = parse_manifest(&bytes).map_err(|m| terr(dir, m))?;
        let mut shards = Vec::new();
        for s in &manifest.shards {
            let p = dir.join(&s.file);
            let h = hash_file(&p)?;
            if h.sha256 != s.sha256 {
                return Err(terr(
                    dir,
                    format!(
                        "shard `{}` sha256 {} does not match the manifest's {}",
                        s.file, h.sha256, s.sha256
                    ),
                ));
            }
            // SAFETY: the trace is read-only input; see `Shard::open`.
            shards.push(unsafe { Shard::open(&p)? });
        }
        let shard_index = manifest
            .shards
            .iter()
            .enumerate()
            .map(|(i, s)| (s.file.clone(), i))
            .collect();
        let t = Trace {
            dir: dir.into(),
            manifest,
            shards,
            shard_index,
        };
        for s in &t.manifest.samples {
            // Checked by `parse_manifest`; the same message if it ever is not.
            let len = s.total_len().map_err(|m| terr(dir, m))?;
            let tok = t.tensor(s, "tokens")?;
            if tok.dtype() != Dtype::I32 || tok.shape() != [len] {
                return Err(terr(
                    dir,
                    format!(
                        "sample {}: `tokens` is {} {:?}, expected I32 [{len}] (prompt_len {} + gen_len {})",
                        s.id,
                        tok.dtype(),
                        tok.shape(),
                        s.prompt_len,
                        s.gen_len
                    ),
                ));
            }
            for &tap in &t.manifest.taps {
                let v = t.tensor(s, &format!("tap.{tap}"))?;
                if v.shape() != [len, t.manifest.hidden_size] || !v.dtype().is_float() {
                    return Err(terr(
                        dir,
                        format!(
                            "sample {}: `tap.{tap}` is {} {:?}, expected float [{len}, {}]",
                            s.id,
                            v.dtype(),
                            v.shape(),
                            t.manifest.hidden_size
                        ),
                    ));
                }
            }
        }
        Ok(t)
    }

    fn tensor(&self, s: &SampleMeta, what: &str) -> Result<TensorView<'_>> {
        let i = *self.shard_index.get(&s.shard).ok_or_else(|| {
            terr(
                &self.dir,
                format!("sample {} names unknown shard `{}`", s.id, s.shard),
            )
        })?;
        let name = format!("s{}.{what}", s.id);
        self.shards[i].tensor(&name).ok_or_else(|| {
            terr(
                &self.dir,
                format!(
                    "sample {}: tensor `{name}` missing from `{}`",
                    s.id, s.shard
                ),
            )
        })
    }

    /// Token ids of a sample.
    pub fn tokens(&self, s: &SampleMeta) -> Result<Vec<u32>> {
        let v = self.tensor(s, "tokens")?;
        Ok(v.data
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect())
    }

    /// The capture pass's argmax per position (`target_top1`), when the trace stores it.
    pub fn target_top1(&self, s: &SampleMeta) -> Result<Option<Vec<u32>>> {
        let Ok(v) = self.tensor(s, "target_top1") else {
            return Ok(None);
        };
        let len = s.total_len().map_err(|m| terr(&self.dir, m))?;
        if v.dtype() != Dtype::I32 || v.shape() != [len] {
            return Err(terr(
                &self.dir,
                format!(
                    "sample {}: `target_top1` is {} {:?}, expected I32 [{len}]",
                    s.id,
                    v.dtype(),
                    v.shape(),
                ),
            ));
        }
        Ok(Some(
            v.data
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
                .collect(),
        ))
    }

    /// The stored bytes of one of a sample's tensors (`tokens`, `target_top1`, `tap.{i}`), as
    /// the shard holds them (for a copy that keeps the dtype: `trace merge`).
    pub fn tensor_bytes(&self, s: &SampleMeta, what: &str) -> Result<&[u8]> {
        Ok(self.tensor(s, what)?.data)
    }

    /// Hidden states `[T, H]` of tap `hs[i]` as f32. A value that is NaN or infinite is an
    /// error naming the sample, tap and position (#38.4: a draft fed NaN taps "predicts" a
    /// continuation of argmaxes over NaN, and a gate on such a trace passes anything); checked
    /// here, where every replay converts the taps, one sample at a time.
    pub fn tap(&self, s: &SampleMeta, i: usize) -> Result<Vec<f32>> {
        let v = self.tensor(s, &format!("tap.{i}"))?.to_f32();
        if let Some(j) = crate::ops::first_non_finite(&v) {
            let h = self.manifest.hidden_size.max(1);
            return Err(Error::Source {
                path: self.dir.clone(),
                msg: format!(
                    "sample {}: tap {i} holds a value that is not finite ({}) at position {}",
                    s.id,
                    v[j],
                    j / h
                ),
                hint: Some(
                    "the target that captured this trace computed NaN or infinity; capture it \
                     again from a sound target (`kquant trace capture` refuses such a target)"
                        .into(),
                ),
            });
        }
        Ok(v)
    }

    /// Refuse a trace that cannot feed a draft: missing taps, other hidden size, tokens out of
    /// the draft's vocab. `what` names the draft in the message.
    pub fn require(
        &self,
        taps: &[usize],
        hidden: usize,
        vocab: Option<usize>,
        what: &str,
    ) -> Result<()> {
        let missing: Vec<usize> = taps
            .iter()
            .copied()
            .filter(|t| !self.manifest.taps.contains(t))
            .collect();
        if !missing.is_empty() {
            return Err(terr(&self.dir, format!(
                "{what} needs hidden_states taps {taps:?} but the trace has {:?} (missing {missing:?})",
                self.manifest.taps
            )));
        }
        if self.manifest.hidden_size != hidden {
            return Err(terr(
                &self.dir,
                format!(
                    "{what} expects target hidden size {hidden}, the trace has {}",
                    self.manifest.hidden_size
                ),
            ));
        }
        if let Some(v) = vocab {
            for s in &self.manifest.samples {
                if let Some(&bad) = self.tokens(s)?.iter().find(|&&t| t as usize >= v) {
                    return Err(terr(
                        &self.dir,
                        format!(
                            "sample {}: token {bad} is outside {what}'s vocab of {v}",
                            s.id
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// One sample to write.
pub struct NewSample<'a> {
    pub meta: SampleMeta,
    pub tokens: &'a [u32],
    /// (tap index, `[T, H]` values) — stored as BF16.
    pub taps: Vec<(usize, &'a [f32])>,
    /// The capture pass's argmax per position, stored as `target_top1` I32 `[T]` when given.
    pub target_top1: Option<&'a [u32]>,
}

/// Claim `dir` for a trace ([`Claim`] with [`Kind::Trace`]: exclusive, never over one of
/// `sources`, `--force` only over a trace kquant wrote). Take it before the long work, so a
/// second run or an existing output is refused at once.
pub fn claim(dir: &Path, force: bool, sources: &[std::path::PathBuf]) -> Result<Claim> {
    Claim::new(dir, Kind::Trace, force, sources)
}

/// The shard every trace kquant writes holds.
pub const SHARD: &str = "shard-00000.safetensors";

/// What one sample of a trace will hold, declared before any of its values is written.
#[derive(Debug, Clone)]
pub struct SampleSpec {
    pub meta: SampleMeta,
    /// Tokens T (`tokens` `[T]`, each tap `[T, H]`).
    pub len: usize,
    /// The taps stored (HF indices).
    pub taps: Vec<usize>,
    /// Whether `target_top1` is stored.
    pub top1: bool,
}

/// One tensor of a trace: which sample (index into the declared samples) and what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    Tokens(usize),
    Top1(usize),
    /// (sample, tap index `hs[i]`): BF16 `[T, H]`.
    Tap(usize, usize),
}

fn entry_name(samples: &[SampleSpec], e: Entry) -> String {
    match e {
        Entry::Tokens(i) => format!("s{}.tokens", samples[i].meta.id),
        Entry::Top1(i) => format!("s{}.target_top1", samples[i].meta.id),
        Entry::Tap(i, tap) => format!("s{}.tap.{tap}", samples[i].meta.id),
    }
}

/// The dtype a trace's taps are written in: `f32` where the manifest says so (`trace capture
/// --tap-dtype f32`, what an engine serving in float32 feeds the draft), else BF16.
pub fn tap_dtype(manifest: &Manifest) -> Dtype {
    if manifest.dtype == "f32" {
        Dtype::F32
    } else {
        Dtype::BF16
    }
}

fn specs_of(
    samples: &[SampleSpec],
    h: usize,
    tap: Dtype,
) -> (Vec<TensorSpec>, HashMap<String, Entry>) {
    let mut specs = Vec::new();
    let mut by_name = HashMap::new();
    for (i, s) in samples.iter().enumerate() {
        let t = s.len;
        let mut add = |e: Entry, dtype: Dtype, shape: Vec<usize>| {
            let name = entry_name(samples, e);
            specs.push(TensorSpec::new(name.clone(), dtype, shape));
            by_name.insert(name, e);
        };
        add(Entry::Tokens(i), Dtype::I32, vec![t]);
        for &tap_id in &s.taps {
            add(Entry::Tap(i, tap_id), tap, vec![t, h]);
        }
        if s.top1 {
            add(Entry::Top1(i), Dtype::I32, vec![t]);
        }
    }
    (specs, by_name)
}

/// The order in which a trace's tensors are written (the safetensors library's: every I32
/// tensor, then the BF16 taps by name, so one sample's taps are consecutive). A streaming
/// caller produces the values in this order.
pub fn write_order(samples: &[SampleSpec], hidden_size: usize) -> Vec<Entry> {
    write_order_in(samples, hidden_size, Dtype::BF16)
}

/// [`write_order`] with the taps in `tap`.
fn write_order_in(samples: &[SampleSpec], hidden_size: usize, tap: Dtype) -> Vec<Entry> {
    let (mut specs, by_name) = specs_of(samples, hidden_size, tap);
    crate::io::writer::canonical_order(&mut specs);
    specs.iter().map(|s| by_name[&s.name]).collect()
}

/// A trace written tensor by tensor (in [`write_order`]), never held whole: the shard streams
/// into the claim's staging directory and is renamed into place by [`finish`](Self::finish),
/// so an error or a kill before then leaves nothing under the output name.
pub struct TraceWriter {
    claim: Claim,
    manifest: Manifest,
    samples: Vec<SampleSpec>,
    order: Vec<Entry>,
    next: usize,
    w: Writer,
}

impl TraceWriter {
    /// Declare every sample (the manifest's `samples` are replaced by theirs).
    pub fn new(claim: Claim, manifest: Manifest, samples: Vec<SampleSpec>) -> Result<TraceWriter> {
        let h = manifest.hidden_size;
        let tap = tap_dtype(&manifest);
        let (specs, _) = specs_of(&samples, h, tap);
        let order = write_order_in(&samples, h, tap);
        let tmp = claim.staging().to_path_buf();
        let w = Writer::in_dir(&tmp, specs, WriteOptions::default())?;
        debug_assert_eq!(
            w.order(),
            order
                .iter()
                .map(|&e| entry_name(&samples, e))
                .collect::<Vec<_>>()
        );
        Ok(TraceWriter {
            claim,
            manifest,
            samples,
            order,
            next: 0,
            w,
        })
    }

    /// The tensor expected next, if any.
    pub fn expected(&self) -> Option<Entry> {
        self.order.get(self.next).copied()
    }

    /// The whole write order.
    pub fn order(&self) -> &[Entry] {
        &self.order
    }

    /// The next bytes of the expected tensor `e` (I32 little-endian ids, or tap rows in the
    /// manifest's [`tap_dtype`]).
    pub fn write_part(&mut self, e: Entry, bytes: &[u8]) -> Result<()> {
        let name = entry_name(&self.samples, e);
        self.w.write_part(&name, bytes)
    }

    /// Close the expected tensor `e` (its byte count must be complete).
    pub fn end(&mut self, e: Entry) -> Result<()> {
        let name = entry_name(&self.samples, e);
        self.w.end_tensor(&name)?;
        self.next += 1;
        Ok(())
    }

    /// A whole token-id tensor (`tokens` or `target_top1`).
    pub fn write_ids(&mut self, e: Entry, ids: &[u32]) -> Result<()> {
        let bytes: Vec<u8> = ids.iter().flat_map(|&t| (t as i32).to_le_bytes()).collect();
        self.write_part(e, &bytes)?;
        self.end(e)
    }

    /// Write the manifest (with the shard's sha256, taken while it was written) and put the
    /// trace in place.
    pub fn finish(self) -> Result<()> {
        let TraceWriter {
            claim,
            mut manifest,
            samples,
            w,
            ..
        } = self;
        let summary = w.finish()?;
        let tmp = claim.staging().to_path_buf();
        let shard_path = tmp.join(SHARD);
        let written = tmp.join(crate::io::source::SINGLE_FILE);
        std::fs::rename(&written, &shard_path).map_err(|e| Error::io("rename", &shard_path, e))?;
        let _ = std::fs::remove_file(tmp.join(crate::io::manifest::MANIFEST_FILE));
        let sha256 = summary
            .files
            .iter()
            .find(|f| f.file == crate::io::source::SINGLE_FILE)
            .map(|f| f.sha256.clone())
            .ok_or_else(|| Error::Output {
                path: claim.out().to_path_buf(),
                msg: "the trace's shard was not written".into(),
                hint: None,
            })?;
        manifest.format = FORMAT.into();
        manifest.tap_convention = TAP_CONVENTION.into();
        manifest.dtype = if tap_dtype(&manifest) == Dtype::F32 {
            "f32"
        } else {
            "bf16"
        }
        .into();
        manifest.shards = vec![ShardMeta {
            file: SHARD.into(),
            sha256,
        }];
        manifest.samples = samples
            .into_iter()
            .map(|s| SampleMeta {
                shard: SHARD.into(),
                ..s.meta
            })
            .collect();
        let mp = tmp.join("manifest.json");
        let mut f = std::fs::File::create(&mp).map_err(|e| Error::io("create", &mp, e))?;
        std::io::Write::write_all(&mut f, &serde_json::to_vec_pretty(&manifest).expect("JSON"))
            .and_then(|_| f.sync_all())
            .map_err(|e| Error::io("write", &mp, e))?;
        claim.commit()?;
        Ok(())
    }
}

/// Write a trace (one shard) held in memory: [`TraceWriter`] fed from `samples`.
pub fn write(claim: Claim, manifest: Manifest, samples: &[NewSample<'_>]) -> Result<()> {
    let specs: Vec<SampleSpec> = samples
        .iter()
        .map(|s| SampleSpec {
            meta: s.meta.clone(),
            len: s.tokens.len(),
            taps: s.taps.iter().map(|(t, _)| *t).collect(),
            top1: s.target_top1.is_some(),
        })
        .collect();
    let f32_taps = tap_dtype(&manifest) == Dtype::F32;
    let mut tw = TraceWriter::new(claim, manifest, specs)?;
    for e in tw.order().to_vec() {
        match e {
            Entry::Tokens(i) => tw.write_ids(e, samples[i].tokens)?,
            Entry::Top1(i) => tw.write_ids(e, samples[i].target_top1.expect("declared"))?,
            Entry::Tap(i, tap) => {
                let vals = samples[i]
                    .taps
                    .iter()
                    .find(|(t, _)| *t == tap)
                    .expect("declared")
                    .1;
                let bytes: Vec<u8> = if f32_taps {
                    vals.iter().flat_map(|&x| x.to_le_bytes()).collect()
                } else {
                    vals.iter()
                        .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                        .collect()
                };
                tw.write_part(e, &bytes)?;
                tw.end(e)?;
            }
        }
    }
    tw.finish()
}

/// The files of a trace directory, `manifest.json` first, then the others in name order.
pub fn files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io("read", dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    names.sort_by_key(|p| (p.file_name() != Some("manifest.json".as_ref()), p.clone()));
    Ok(names)
}

/// The sha256 of a trace directory: of each file's sha256 (`manifest.json` first, then the
/// others in name order), so a changed sample or tap changes it.
pub fn digest(dir: &Path) -> Result<String> {
    let names = files(dir)?;
    let mut outer = Sha256::new();
    for p in names {
        let mut f = std::fs::File::open(&p).map_err(|e| Error::io("open", &p, e))?;
        let mut h = Sha256::new();
        std::io::copy(&mut f, &mut h).map_err(|e| Error::io("read", &p, e))?;
        outer.update(p.file_name().unwrap_or_default().as_encoded_bytes());
        outer.update(h.finalize());
    }
    Ok(format!("{:x}", outer.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(h: usize, taps: Vec<usize>, n: usize) -> Manifest {
        Manifest {
            format: FORMAT.into(),
            target: serde_json::json!({"name": "test"}),
            hidden_size: h,
            num_layers: 4,
            vocab_size: Some(100),
            taps,
            tap_convention: TAP_CONVENTION.into(),
            taps_pre_norm: true,
            tap_stream: None,
            dtype: "bf16".into(),
            greedy_selfcheck: Some(0),
            samples: (0..n)
                .map(|i| SampleMeta {
                    id: i as u64,
                    category: "code".into(),
                    dataset: "t".into(),
                    shard: String::new(),
                    prompt_len: 3,
                    gen_len: 2,
                    finish_reason: "length".into(),
                    turn: 0,
                    stop_len: None,
                    prompt_id: None,
                })
                .collect(),
            shards: vec![],
            extra: serde_json::Map::new(),
        }
    }

    #[test]
    fn write_then_read_back_and_checks() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("trace");
        let toks: Vec<u32> = vec![1, 2, 3, 4, 5];
        let tap: Vec<f32> = (0..5 * 8).map(|i| i as f32 * 0.5).collect();
        let samples = vec![NewSample {
            meta: manifest(8, vec![2], 1).samples[0].clone(),
            tokens: &toks,
            taps: vec![(2, &tap), (3, &tap)],
            target_top1: Some(&toks),
        }];
        write(
            claim(&dir, false, &[]).unwrap(),
            manifest(8, vec![2, 3], 1),
            &samples,
        )
        .unwrap();
        let t = Trace::open(&dir).unwrap();
        let s = &t.manifest.samples[0];
        assert_eq!(t.tokens(s).unwrap(), toks);
        assert_eq!(t.tap(s, 2).unwrap(), tap, "values exact in bf16");
        assert_eq!(t.target_top1(s).unwrap(), Some(toks.clone()));
        t.require(&[2, 3], 8, Some(6), "draft").unwrap();
        let e = t
            .require(&[2, 5], 8, None, "the draft")
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing [5]"), "{e}");
        assert!(t
            .require(&[2], 16, None, "d")
            .unwrap_err()
            .to_string()
            .contains("hidden size 16"));
        assert!(t
            .require(&[2], 8, Some(5), "d")
            .unwrap_err()
            .to_string()
            .contains("token 5"));
        // A changed shard is refused.
        let shard = dir.join("shard-00000.safetensors");
        let mut b = std::fs::read(&shard).unwrap();
        let n = b.len();
        b[n - 1] ^= 1;
        std::fs::write(&shard, b).unwrap();
        assert!(Trace::open(&dir)
            .err()
            .unwrap()
            .to_string()
            .contains("sha256"));
    }

    use crate::test_rng::Rng;

    /// Values a mutation puts in place of a field: edges of every integer width, floats,
    /// wrong types.
    fn hostile(rng: &mut Rng) -> serde_json::Value {
        use serde_json::json;
        let v = [
            json!(0),
            json!(1),
            json!(-1),
            json!(2),
            json!(5),
            json!(i64::MAX),
            json!(1u64 << 63),
            json!((1u64 << 63) - 2),
            json!(u64::MAX),
            json!(u64::MAX - 1),
            json!(u32::MAX),
            json!(1e300),
            json!(0.5),
            json!("x"),
            json!(""),
            json!("../x"),
            json!(null),
            json!([]),
            json!({}),
        ];
        v[rng.below(v.len())].clone()
    }

    /// Every JSON path (object keys, array indices) in `v`.
    fn paths(v: &serde_json::Value, here: Vec<String>, out: &mut Vec<Vec<String>>) {
        out.push(here.clone());
        match v {
            serde_json::Value::Object(m) => {
                for (k, c) in m {
                    let mut p = here.clone();
                    p.push(k.clone());
                    paths(c, p, out);
                }
            }
            serde_json::Value::Array(a) => {
                for (i, c) in a.iter().enumerate() {
                    let mut p = here.clone();
                    p.push(i.to_string());
                    paths(c, p, out);
                }
            }
            _ => {}
        }
    }

    /// The value at path `p`, if an earlier mutation left it there.
    fn at<'a>(v: &'a mut serde_json::Value, p: &[String]) -> Option<&'a mut serde_json::Value> {
        p.iter().try_fold(v, |v, k| match v {
            serde_json::Value::Array(a) => a.get_mut(k.parse::<usize>().ok()?),
            serde_json::Value::Object(o) => o.get_mut(k.as_str()),
            _ => None,
        })
    }

    /// Random mutations of a valid trace's manifest (a field set to a hostile value, removed,
    /// a sample or shard duplicated): opening never panics (an overflow in a debug build
    /// would), and what opens reads back every sample at its manifest length.
    #[test]
    fn mutated_manifests_never_panic() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("trace");
        let toks: Vec<u32> = vec![1, 2, 3, 4, 5];
        let tap: Vec<f32> = (0..5 * 8).map(|i| i as f32).collect();
        let mut m = manifest(8, vec![2], 2);
        m.samples[1].prompt_len = 4;
        m.samples[1].gen_len = 1;
        let samples: Vec<NewSample> = m
            .samples
            .iter()
            .map(|meta| NewSample {
                meta: meta.clone(),
                tokens: &toks,
                taps: vec![(2, &tap)],
                target_top1: Some(&toks),
            })
            .collect();
        write(claim(&dir, false, &[]).unwrap(), m, &samples).unwrap();
        let mpath = dir.join("manifest.json");
        let valid: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&mpath).unwrap()).unwrap();
        let mut all = Vec::new();
        paths(&valid, vec![], &mut all);
        let mut rng = Rng(0xdead_beef_cafe_f00d);
        let (mut opened, mut refused) = (0, 0);
        for _ in 0..1500 {
            let mut v = valid.clone();
            for _ in 0..1 + rng.below(3) {
                let p = all[rng.below(all.len())].clone();
                if p.is_empty() {
                    continue;
                }
                match rng.below(4) {
                    0 | 1 => {
                        if let Some(x) = at(&mut v, &p) {
                            *x = hostile(&mut rng);
                        }
                    }
                    2 => {
                        let (last, parent) = p.split_last().unwrap();
                        match at(&mut v, parent) {
                            Some(serde_json::Value::Object(o)) => {
                                o.remove(last);
                            }
                            Some(serde_json::Value::Array(a)) => {
                                let i = last.parse::<usize>().unwrap();
                                if i < a.len() {
                                    a.remove(i);
                                }
                            }
                            _ => {}
                        }
                    }
                    _ => {
                        for k in ["samples", "shards"] {
                            if let Some(a) = v[k].as_array_mut() {
                                if let Some(first) = a.first().cloned() {
                                    a.push(first);
                                }
                            }
                        }
                    }
                }
            }
            std::fs::write(&mpath, serde_json::to_vec(&v).unwrap()).unwrap();
            // The pure check agrees with the whole open on what it refuses.
            let parsed = parse_manifest(&serde_json::to_vec(&v).unwrap());
            match Trace::open(&dir) {
                Ok(t) => {
                    assert!(parsed.is_ok());
                    opened += 1;
                    for s in &t.manifest.samples {
                        let len = s.total_len().unwrap();
                        assert_eq!(t.tokens(s).unwrap().len(), len);
                        for &tap in &t.manifest.taps {
                            assert_eq!(t.tap(s, tap).unwrap().len(), len * t.manifest.hidden_size);
                        }
                    }
                }
                Err(e) => {
                    refused += 1;
                    let e = e.to_string();
                    assert!(e.contains("manifest.json"), "{e}");
                }
            }
        }
        assert!(
            opened > 20 && refused > 500,
            "{opened} opened, {refused} refused"
        );
    }

    #[test]
    fn tap_streams_are_checked_by_name() {
        use serde_json::json;
        for s in ["residual", "partial", "mixture"] {
            assert!(check_tap_stream(Some(&json!(s))).is_ok());
            assert_eq!(crate::target::stream::TapStream::parse(s).unwrap().id(), s);
        }
        assert!(check_tap_stream(None).is_ok());
        assert!(check_tap_stream(Some(&serde_json::Value::Null)).is_ok());
        for bad in [json!("Partial"), json!("prefix"), json!(1), json!([])] {
            let e = check_tap_stream(Some(&bad)).unwrap_err();
            assert!(e.contains("tap_stream") && e.contains("`mixture`"), "{e}");
        }
        // Through the whole parse: recorded, absent, refused.
        let mut v = serde_json::to_value(manifest(8, vec![2], 0)).unwrap();
        assert_eq!(
            parse_manifest(&serde_json::to_vec(&v).unwrap())
                .unwrap()
                .tap_stream,
            None
        );
        v["tap_stream"] = "mixture".into();
        let m = parse_manifest(&serde_json::to_vec(&v).unwrap()).unwrap();
        assert_eq!(
            m.tap_stream,
            Some(crate::target::stream::TapStream::Mixture)
        );
        assert!(!m.extra.contains_key("tap_stream"));
        v["tap_stream"] = "prefix".into();
        assert!(parse_manifest(&serde_json::to_vec(&v).unwrap()).is_err());
    }

    #[test]
    fn overflowing_lengths_are_refused_with_their_true_values() {
        let mut v = serde_json::to_value(manifest(8, vec![2], 1)).unwrap();
        v["shards"] = serde_json::json!([{"file": "s.safetensors", "sha256": "0"}]);
        v["samples"][0]["shard"] = "s.safetensors".into();
        v["samples"][0]["prompt_len"] = (1u64 << 63).into();
        v["samples"][0]["gen_len"] = (1u64 << 63).into();
        let e = parse_manifest(&serde_json::to_vec(&v).unwrap()).unwrap_err();
        assert!(
            e.contains("prompt_len 9223372036854775808 + gen_len 9223372036854775808 overflows"),
            "{e}"
        );
        v["samples"][0]["prompt_len"] = (1u64 << 61).into();
        v["samples"][0]["gen_len"] = 0.into();
        let e = parse_manifest(&serde_json::to_vec(&v).unwrap()).unwrap_err();
        assert!(
            e.contains("2305843009213693952 tokens × hidden_size 8 overflows"),
            "{e}"
        );
        v["samples"][0]["prompt_len"] = 3.into();
        v["samples"][0]["gen_len"] = 2.into();
        assert!(parse_manifest(&serde_json::to_vec(&v).unwrap()).is_ok());
    }
}
