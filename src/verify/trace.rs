//! `kquant-trace/1` (shared/reference/verify.md §5.5): a directory with `manifest.json` and
//! safetensors shards holding, per sample, the token sequence (prompt + greedy continuation)
//! and the target's hidden states at each tapped layer, keyed by HF `hidden_states[i]` index.
//! Captured once where the target runs; replayed anywhere.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::io::output::{Claim, Kind};
use crate::io::writer::{hash_file, TensorSpec, WriteOptions, Writer};
use crate::io::{Dtype, Shard, TensorView};

pub const FORMAT: &str = "kquant-trace/1";
pub const TAP_CONVENTION: &str = "hf_output_hidden_states";

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
}

fn terr(dir: &Path, msg: String) -> Error {
    Error::Source {
        path: dir.join("manifest.json"),
        msg,
        hint: Some("see docs/verify.md for the kquant-trace/1 layout".into()),
    }
}

impl Trace {
    /// Open `dir`, check the manifest, every shard's sha256 and every sample's tensors.
    pub fn open(dir: &Path) -> Result<Trace> {
        let mpath = dir.join("manifest.json");
        let bytes = std::fs::read(&mpath).map_err(|e| Error::io("read", &mpath, e))?;
        let manifest: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| terr(dir, format!("not a kquant trace manifest: {e}")))?;
        if manifest.format != FORMAT {
            return Err(terr(
                dir,
                format!("format is `{}`, expected `{FORMAT}`", manifest.format),
            ));
        }
        if manifest.tap_convention != TAP_CONVENTION {
            return Err(terr(
                dir,
                format!(
                    "tap_convention `{}` is not `{TAP_CONVENTION}`",
                    manifest.tap_convention
                ),
            ));
        }
        let mut shards = Vec::new();
        for s in &manifest.shards {
            if !crate::io::index::is_plain_file_name(&s.file) {
                return Err(terr(
                    dir,
                    format!("shard name `{}` is not a plain file name", s.file),
                ));
            }
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
        let t = Trace {
            dir: dir.into(),
            manifest,
            shards,
        };
        for s in &t.manifest.samples {
            let len = s.prompt_len + s.gen_len;
            let tok = t.tensor(s, "tokens")?;
            if tok.dtype() != Dtype::I32 || tok.shape() != [len] {
                return Err(terr(
                    dir,
                    format!(
                        "sample {}: `tokens` is {} {:?}, expected I32 [{len}]",
                        s.id,
                        tok.dtype(),
                        tok.shape()
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
        let i = self
            .manifest
            .shards
            .iter()
            .position(|m| m.file == s.shard)
            .ok_or_else(|| {
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
        if v.dtype() != Dtype::I32 || v.shape() != [s.prompt_len + s.gen_len] {
            return Err(terr(
                &self.dir,
                format!(
                    "sample {}: `target_top1` is {} {:?}, expected I32 [{}]",
                    s.id,
                    v.dtype(),
                    v.shape(),
                    s.prompt_len + s.gen_len
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

    /// Hidden states `[T, H]` of tap `hs[i]` as f32.
    pub fn tap(&self, s: &SampleMeta, i: usize) -> Result<Vec<f32>> {
        Ok(self.tensor(s, &format!("tap.{i}"))?.to_f32())
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

/// Write a trace (one shard) with the streaming writer into the claim's staging directory,
/// then put it in place.
pub fn write(claim: Claim, mut manifest: Manifest, samples: &[NewSample<'_>]) -> Result<()> {
    const SHARD: &str = "shard-00000.safetensors";
    let h = manifest.hidden_size;
    let mut specs = Vec::new();
    for s in samples {
        let t = s.tokens.len();
        specs.push(TensorSpec::new(
            format!("s{}.tokens", s.meta.id),
            Dtype::I32,
            vec![t],
        ));
        for (tap, _) in &s.taps {
            specs.push(TensorSpec::new(
                format!("s{}.tap.{tap}", s.meta.id),
                Dtype::BF16,
                vec![t, h],
            ));
        }
        if s.target_top1.is_some() {
            specs.push(TensorSpec::new(
                format!("s{}.target_top1", s.meta.id),
                Dtype::I32,
                vec![t],
            ));
        }
    }
    // The shard is written as `model.safetensors` by the generic writer, then renamed inside the
    // staging directory before the manifest names it.
    let tmp = claim.staging().to_path_buf();
    let mut w = Writer::in_dir(&tmp, specs, WriteOptions::default())?;
    let by_name: std::collections::HashMap<String, Vec<u8>> = samples
        .iter()
        .flat_map(|s| {
            let ids = |v: &[u32]| -> Vec<u8> {
                v.iter().flat_map(|&t| (t as i32).to_le_bytes()).collect()
            };
            let mut v = vec![(format!("s{}.tokens", s.meta.id), ids(s.tokens))];
            if let Some(top1) = s.target_top1 {
                v.push((format!("s{}.target_top1", s.meta.id), ids(top1)));
            }
            for (tap, vals) in &s.taps {
                v.push((
                    format!("s{}.tap.{tap}", s.meta.id),
                    vals.iter()
                        .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                        .collect(),
                ));
            }
            v
        })
        .collect();
    for name in w.order().into_iter().map(String::from).collect::<Vec<_>>() {
        w.write(&name, &by_name[&name])?;
    }
    w.finish()?;
    let shard_path = tmp.join(SHARD);
    std::fs::rename(tmp.join("model.safetensors"), &shard_path)
        .map_err(|e| Error::io("rename", &shard_path, e))?;
    let _ = std::fs::remove_file(tmp.join(crate::io::manifest::MANIFEST_FILE));
    manifest.format = FORMAT.into();
    manifest.tap_convention = TAP_CONVENTION.into();
    manifest.dtype = "bf16".into();
    manifest.shards = vec![ShardMeta {
        file: SHARD.into(),
        sha256: hash_file(&shard_path)?.sha256,
    }];
    for (m, s) in manifest.samples.iter_mut().zip(samples) {
        *m = SampleMeta {
            shard: SHARD.into(),
            ..s.meta.clone()
        };
    }
    let mp = tmp.join("manifest.json");
    let mut f = std::fs::File::create(&mp).map_err(|e| Error::io("create", &mp, e))?;
    std::io::Write::write_all(&mut f, &serde_json::to_vec_pretty(&manifest).expect("JSON"))
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::io("write", &mp, e))?;
    claim.commit()?;
    Ok(())
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
}
