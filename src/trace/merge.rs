//! `kquant trace merge`: several traces of one target as one, so a user can calibrate (or
//! evaluate) on their own prompts mixed with the bundled ones.
//!
//! The inputs must describe the same capture of the same target: target revision, hidden size,
//! layers, vocabulary, taps, tap convention and tap dtype equal (an error names the first that
//! differs and both values), and the taps of one stream (`tap_stream`; one a trace does not
//! record is what `trace::stream::TraceStream::checked` implies; one its target contradicts is refused), which the merge records. Samples keep their order (input by input), their category,
//! dataset and stop; they are numbered again from 0, since two traces both count from 0. The
//! copy streams one tensor at a time, bytes as stored (no dtype round trip), into the claim's
//! staging directory ([`TraceWriter`]): a kill leaves nothing under the output name. The
//! manifest records where each sample came from (`extra.merged_from`).

use std::path::{Path, PathBuf};

use super::file::{self, Entry, Manifest, SampleSpec, Trace, TraceWriter};
use super::stream::{self, TraceStream};
use crate::{Error, Result};

/// What a merge wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Merged {
    pub out: PathBuf,
    pub samples: usize,
    /// (input, its samples).
    pub inputs: Vec<(PathBuf, usize)>,
    /// The stream the merged taps hold (`null`: not known).
    pub tap_stream: Option<crate::target::stream::TapStream>,
}

/// The first manifest field in which `b` differs from `a` (name, a's value, b's value). The
/// target's config and tokenizer digests count where both traces record them (a trace made
/// before kquant recorded `config_sha256`, the bundled one included, has none).
fn differs(a: &Manifest, b: &Manifest) -> Option<(&'static str, String, String)> {
    let rev = |m: &Manifest| m.target.get("revision").map(|v| v.to_string());
    let both = |f: &dyn Fn(&Manifest) -> Option<String>| match (f(a), f(b)) {
        (Some(x), Some(y)) => (x, y),
        _ => (String::new(), String::new()),
    };
    let digest = |v: Option<&serde_json::Value>| v.and_then(|v| v.as_str()).map(String::from);
    let pair = |f: &dyn Fn(&Manifest) -> String| (f(a), f(b));
    let fields: [(&'static str, (String, String)); 10] = [
        ("target revision", pair(&|m| format!("{:?}", rev(m)))),
        (
            "target config (config_sha256)",
            both(&|m| digest(m.target.get("config_sha256"))),
        ),
        (
            "tokenizer (tokenizer_sha256)",
            both(&|m| digest(m.extra.get("tokenizer_sha256"))),
        ),
        ("hidden_size", pair(&|m| m.hidden_size.to_string())),
        ("num_layers", pair(&|m| m.num_layers.to_string())),
        ("vocab_size", pair(&|m| format!("{:?}", m.vocab_size))),
        ("taps", pair(&|m| format!("{:?}", m.taps))),
        ("tap_convention", pair(&|m| m.tap_convention.clone())),
        ("taps_pre_norm", pair(&|m| m.taps_pre_norm.to_string())),
        ("dtype", pair(&|m| file::tap_dtype(m).name().to_string())),
    ];
    fields
        .into_iter()
        .find(|(_, (x, y))| x != y)
        .map(|(what, (x, y))| (what, x, y))
}

/// Merge `inputs` (at least two traces) into a new trace at `out`.
pub fn merge(inputs: &[PathBuf], out: &Path, force: bool) -> Result<Merged> {
    if inputs.len() < 2 {
        return Err(Error::Flags {
            msg: format!("trace merge needs at least two traces, got {}", inputs.len()),
            hint: "give two or more trace directories, e.g. `kquant trace merge MINE BUNDLED -o MIXED`".into(),
        });
    }
    let traces: Vec<Trace> = inputs
        .iter()
        .map(|p| Trace::open(p))
        .collect::<Result<_>>()?;
    for (p, t) in inputs.iter().zip(&traces).skip(1) {
        if let Some((what, a, b)) = differs(&traces[0].manifest, &t.manifest) {
            return Err(Error::Source {
                path: p.clone(),
                msg: format!(
                    "has {what} {b} where `{}` has {a}: traces of different captures cannot be merged",
                    inputs[0].display()
                ),
                hint: Some("capture every trace from the same target with the same --taps and --tap-dtype (`kquant trace capture`), then merge".into()),
            });
        }
    }
    // Taps of one stream only (`tap_stream`, or what an unrecorded one implies), recorded.
    let streams: Vec<TraceStream> = traces
        .iter()
        .map(|t| TraceStream::checked(t, None, None))
        .collect::<Result<_>>()?;
    let stream = stream::common(&streams).map_err(|(i, msg)| Error::Source {
        path: inputs[i].clone(),
        msg: format!("has {msg} (the first trace: `{}`)", inputs[0].display()),
        hint: Some("merge traces captured on one stream (`kquant trace capture --stream`, `scripts/vllm_capture.py --stream`; docs/verify.md, \"Tap streams\")".into()),
    })?;
    // The same capture twice (the same path, or a copy of it) would count its samples twice and
    // narrow every confidence interval computed over the merge.
    for (j, t) in traces.iter().enumerate() {
        for (i, u) in traces[..j].iter().enumerate() {
            let shared = t
                .manifest
                .shards
                .iter()
                .find(|s| u.manifest.shards.iter().any(|r| r.sha256 == s.sha256));
            if let Some(s) = shared {
                return Err(Error::Source {
                    path: inputs[j].clone(),
                    msg: format!(
                        "holds shard `{}` (sha256 {}…) that `{}` holds too: the same samples \
                         twice would be counted twice",
                        s.file,
                        &s.sha256[..s.sha256.len().min(12)],
                        inputs[i].display()
                    ),
                    hint: Some("give each trace once".into()),
                });
            }
        }
    }
    // Claim before the copy; never over an input.
    let claim = file::claim(out, force, inputs)?;
    let mut specs = Vec::new();
    let mut from = Vec::new(); // (input, sample meta) per output sample
    for (k, t) in traces.iter().enumerate() {
        for s in &t.manifest.samples {
            let len = t.tokens(s)?.len();
            let top1 = t.tensor_bytes(s, "target_top1").is_ok();
            let mut meta = s.clone();
            meta.id = specs.len() as u64;
            specs.push(SampleSpec {
                meta,
                len,
                taps: t.manifest.taps.clone(),
                top1,
            });
            from.push((k, s.clone()));
        }
    }
    let mut manifest = traces[0].manifest.clone();
    manifest.greedy_selfcheck = None;
    manifest.tap_stream = stream;
    manifest.extra.insert(
        "merged_from".into(),
        serde_json::json!(inputs
            .iter()
            .zip(&traces)
            .map(|(p, t)| serde_json::json!({"trace": p.display().to_string(), "samples": t.manifest.samples.len(), "target": t.manifest.target}))
            .collect::<Vec<_>>()),
    );
    let n = specs.len();
    let mut tw = TraceWriter::new(claim, manifest, specs)?;
    for e in tw.order().to_vec() {
        let (i, what) = match e {
            Entry::Tokens(i) => (i, "tokens".to_string()),
            Entry::Top1(i) => (i, "target_top1".to_string()),
            Entry::Tap(i, tap) => (i, format!("tap.{tap}")),
        };
        let (k, s) = &from[i];
        let bytes = traces[*k].tensor_bytes(s, &what)?;
        tw.write_part(e, bytes)?;
        tw.end(e)?;
    }
    tw.finish()?;
    Ok(Merged {
        out: out.to_path_buf(),
        samples: n,
        inputs: inputs
            .iter()
            .zip(&traces)
            .map(|(p, t)| (p.clone(), t.manifest.samples.len()))
            .collect(),
        tap_stream: stream,
    })
}
