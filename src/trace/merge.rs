//! `kquant trace merge`: several traces of one target as one, so a user can calibrate (or
//! evaluate) on their own prompts mixed with the bundled ones.
//!
//! The inputs must describe the same capture of the same target: target revision, hidden size,
//! layers, vocabulary, taps, tap convention and tap dtype equal (an error names the first that
//! differs and both values). Samples keep their order (input by input), their category,
//! dataset and stop; they are numbered again from 0, since two traces both count from 0. The
//! copy streams one tensor at a time, bytes as stored (no dtype round trip), into the claim's
//! staging directory ([`TraceWriter`]): a kill leaves nothing under the output name. The
//! manifest records where each sample came from (`extra.merged_from`).

use std::path::{Path, PathBuf};

use super::file::{self, Entry, Manifest, SampleSpec, Trace, TraceWriter};
use crate::{Error, Result};

/// What a merge wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Merged {
    pub out: PathBuf,
    pub samples: usize,
    /// (input, its samples).
    pub inputs: Vec<(PathBuf, usize)>,
}

/// The first manifest field in which `b` differs from `a` (name, a's value, b's value).
fn differs(a: &Manifest, b: &Manifest) -> Option<(&'static str, String, String)> {
    let rev = |m: &Manifest| m.target.get("revision").map(|v| v.to_string());
    let fields: [(&'static str, String, String); 8] = [
        (
            "target revision",
            format!("{:?}", rev(a)),
            format!("{:?}", rev(b)),
        ),
        (
            "hidden_size",
            a.hidden_size.to_string(),
            b.hidden_size.to_string(),
        ),
        (
            "num_layers",
            a.num_layers.to_string(),
            b.num_layers.to_string(),
        ),
        (
            "vocab_size",
            format!("{:?}", a.vocab_size),
            format!("{:?}", b.vocab_size),
        ),
        ("taps", format!("{:?}", a.taps), format!("{:?}", b.taps)),
        (
            "tap_convention",
            a.tap_convention.clone(),
            b.tap_convention.clone(),
        ),
        (
            "taps_pre_norm",
            a.taps_pre_norm.to_string(),
            b.taps_pre_norm.to_string(),
        ),
        (
            "dtype",
            file::tap_dtype(a).name().to_string(),
            file::tap_dtype(b).name().to_string(),
        ),
    ];
    fields.into_iter().find(|(_, x, y)| x != y)
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
    })
}
