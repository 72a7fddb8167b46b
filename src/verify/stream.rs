//! The tap-stream check of an offline `verify` (docs/verify.md, "Tap streams"): the stream the
//! trace's taps hold (`trace::stream`) against the stream each draft was trained on. On a
//! target with attention residuals (Kimi-K3) a draft replayed on the other stream is measured
//! on inputs it never saw, so a known mismatch is refused (exit 2) unless
//! `--allow-stream-mismatch` asks for that measurement; a stream not known on either side is
//! said (a `note:` and the report's `tap_stream`), never passed over. A stream flag naming a
//! stream the trace's target cannot have is refused before that ([`check_flags`]).
//!
//! A draft's training stream is known from `--draft-stream` (`--baseline-stream` for a draft
//! baseline), else from the target profile's `published_drafts` where the draft is
//! recognisably one of them ([`published_match`]: the same family, the same layout where the
//! family has several, the same taps). On a target without attention residuals every draft
//! reads the one `residual` stream.

use serde::Serialize;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::escape::printable;
use crate::target::profile::{published_match, Profile};
use crate::target::stream::TapStream;
use crate::trace::stream::{Known, TraceStream};

/// Why a draft's stream is `residual`: its target has one stream.
const NO_ATTENTION_RESIDUALS: &str = "the target has no attention residuals";

/// One draft's training stream and where it is known from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DraftStream {
    /// The stream, where known.
    pub stream: Option<TapStream>,
    /// Where it is known from (`--draft-stream`, `published draft NAME (profile P)`), or why
    /// it is not.
    pub from: String,
}

/// What the report says about the streams (`tail.tap_stream`).
#[derive(Debug, Clone, Serialize)]
pub struct StreamCheck {
    /// The trace's stream (`null`: not known).
    pub trace: Option<TapStream>,
    /// `recorded` (the manifest's `tap_stream`), `implied` (`residual`: the target has no
    /// attention residuals) or `unknown`.
    pub trace_known: Known,
    pub draft: DraftStream,
    /// A draft baseline's (absent for prompt lookup or no baseline).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<DraftStream>,
    /// `--allow-stream-mismatch` was given.
    pub mismatch_allowed: bool,
    /// What is not known, or replayed on another stream (printed as `note:` lines).
    pub notes: Vec<String>,
}

/// The training stream of the draft at `spec`: `flag` (named `flag_name`), else the published
/// draft of `profile` it is (one match, or several that agree), else not known. On a target
/// without attention residuals (`profile` says so, or the trace's stream is `residual`) it is
/// `residual` unless the flag says otherwise.
pub fn of_draft(
    spec: &str,
    flag: Option<TapStream>,
    flag_name: &str,
    profile: Option<&Profile>,
    trace: TraceStream,
) -> DraftStream {
    if let Some(s) = flag {
        return DraftStream {
            stream: Some(s),
            from: flag_name.into(),
        };
    }
    let attn_res = profile.map(|p| p.attention_residuals.is_some());
    if attn_res == Some(false) || (attn_res.is_none() && trace.stream == Some(TapStream::Residual))
    {
        return DraftStream {
            stream: Some(TapStream::Residual),
            from: NO_ATTENTION_RESIDUALS.into(),
        };
    }
    let Some(p) = profile else {
        return DraftStream {
            stream: None,
            from: format!(
                "not known: no target profile lists `{}` (give --target, or {flag_name})",
                printable(spec)
            ),
        };
    };
    let det = Checkpoint::open(spec).and_then(|ck| ck.detect());
    let found = det
        .as_ref()
        .map(|d| published_match(p, d))
        .unwrap_or_default();
    let streams: Vec<Option<TapStream>> = found.iter().map(|d| d.stream.known().copied()).collect();
    match found.first() {
        None => DraftStream {
            stream: None,
            from: format!(
                "not known: `{}` is none of profile `{}`'s published drafts (family, layout and taps)",
                printable(spec),
                p.name
            ),
        },
        Some(d) if streams.iter().all(|s| *s == streams[0]) => DraftStream {
            stream: streams[0],
            from: match streams[0] {
                Some(_) => format!("published draft {} (profile `{}`)", d.draft, p.name),
                None => format!(
                    "not known: published draft {} (profile `{}`) states no training stream",
                    d.draft, p.name
                ),
            },
        },
        Some(_) => DraftStream {
            stream: None,
            from: format!(
                "not known: `{}` matches published drafts of profile `{}` trained on different streams ({})",
                printable(spec),
                p.name,
                found.iter().map(|d| d.draft.as_str()).collect::<Vec<_>>().join(", ")
            ),
        },
    }
}

/// The stream flags (`flags`: each flag's value and name, `--draft-stream` then
/// `--baseline-stream`) checked against the trace's target before any replay: a stream that
/// target cannot have (`partial`/`mixture` without attention residuals, `residual` with them,
/// as `trace::stream::for_target` says; the target's kind from the trace's checked stream) and
/// `--baseline-stream` for the `prompt-lookup` baseline, which reads no taps, are refused, with
/// or without `--allow-stream-mismatch` (which measures a draft on the other stream of its own
/// target, never on a stream the target does not have).
pub fn check_flags(
    flags: &[(Option<TapStream>, &str)],
    baseline: Option<&str>,
    trace: TraceStream,
    target: &str,
) -> Result<()> {
    for &(flag, name) in flags {
        let Some(s) = flag else { continue };
        if name == "--baseline-stream" && baseline == Some("prompt-lookup") {
            return Err(Error::Flags {
                msg: format!(
                    "--baseline-stream {} with --baseline prompt-lookup: prompt lookup reads no taps, so it has no tap stream",
                    s.id()
                ),
                hint: "leave --baseline-stream out, or give a draft --baseline".into(),
            });
        }
        crate::trace::stream::for_target(Some(s), trace.attention_residuals(), target, name)?;
    }
    Ok(())
}

/// Hold each draft's stream against the trace's: a known mismatch is an error unless `allow`;
/// what is not known, or allowed to differ, becomes a note. `drafts`: (spec, its stream), the
/// draft first, then a draft baseline.
pub fn check(
    trace: TraceStream,
    drafts: &[(&str, DraftStream)],
    allow: bool,
) -> Result<StreamCheck> {
    let mut notes = Vec::new();
    if trace.stream.is_none() {
        notes.push(format!(
            "the trace's tap stream is {}: its drafts' streams cannot be checked against it; capture it again with kquant (`trace capture --stream`) or scripts/vllm_capture.py (`--stream`), which record it",
            trace.describe()
        ));
    }
    for (spec, d) in drafts {
        match (trace.stream, d.stream) {
            (Some(t), Some(s)) if t != s && !allow => {
                return Err(Error::Flags {
                    msg: format!(
                        "draft `{}` was trained on the `{}` tap stream ({}), and the trace holds the `{}` stream ({}): replayed here it would be measured on inputs it never saw",
                        printable(spec),
                        s.id(),
                        d.from,
                        t.id(),
                        match trace.known {
                            Known::Recorded => "recorded in its manifest",
                            _ => "implied: the target has no attention residuals",
                        }
                    ),
                    hint: format!(
                        "capture a trace on the draft's stream (`kquant trace capture --stream {s}`, `scripts/vllm_capture.py --stream {s}`), or give --allow-stream-mismatch to measure it on this one; docs/verify.md, \"Tap streams\"",
                        s = s.id()
                    ),
                });
            }
            (Some(t), Some(s)) if t != s => notes.push(format!(
                "`{}` was trained on the `{}` stream ({}) and is replayed on the trace's `{}` stream (--allow-stream-mismatch): inputs it never saw",
                printable(spec),
                s.id(),
                d.from,
                t.id()
            )),
            (_, None) => notes.push(format!(
                "`{}`'s training stream is {}: whether the trace's stream is the one it was trained on is not checked",
                printable(spec),
                d.from
            )),
            _ => {}
        }
    }
    let mut it = drafts.iter().map(|(_, d)| d.clone());
    Ok(StreamCheck {
        trace: trace.stream,
        trace_known: trace.known,
        draft: it.next().expect("the draft"),
        baseline: it.next(),
        mismatch_allowed: allow,
        notes,
    })
}

impl StreamCheck {
    /// The line the table prints: the trace's stream and the drafts' (left out where they are
    /// `residual` only because the target has one stream).
    pub fn line(&self) -> String {
        let t = TraceStream {
            stream: self.trace,
            known: self.trace_known,
        };
        let mut line = format!("tap stream: trace {}", t.describe());
        let sides = [
            ("draft", Some(&self.draft)),
            ("baseline", self.baseline.as_ref()),
        ];
        for (what, d) in sides {
            let Some(d) = d.filter(|d| d.from != NO_ATTENTION_RESIDUALS) else {
                continue;
            };
            line += &match d.stream {
                Some(s) => format!("; {what} trained on `{}` ({})", s.id(), d.from),
                None => format!("; {what} trained on an unknown stream"),
            };
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: Option<TapStream>, known: Known) -> TraceStream {
        TraceStream { stream: s, known }
    }

    #[test]
    fn a_mismatch_is_refused_unless_allowed_and_unknowns_are_noted() {
        let part = ts(Some(TapStream::Partial), Known::Recorded);
        let mix = DraftStream {
            stream: Some(TapStream::Mixture),
            from: "--draft-stream".into(),
        };
        let e = match check(part, &[("d", mix.clone())], false).unwrap_err() {
            Error::Flags { msg, hint } => format!("{msg}\n{hint}"),
            other => panic!("{other}"),
        };
        for want in [
            "`mixture`",
            "`partial`",
            "--stream mixture",
            "--allow-stream-mismatch",
        ] {
            assert!(e.contains(want), "{want} in {e}");
        }
        let c = check(part, &[("d", mix.clone())], true).unwrap();
        assert!(
            c.mismatch_allowed && c.notes[0].contains("never saw"),
            "{:?}",
            c.notes
        );
        let unknown = DraftStream {
            stream: None,
            from: "not known: x".into(),
        };
        let c = check(part, &[("d", unknown)], false).unwrap();
        assert_eq!(c.notes.len(), 1);
        let c = check(ts(None, Known::Unknown), &[("d", mix)], false).unwrap();
        assert!(c.notes[0].contains("cannot be checked"), "{:?}", c.notes);
        let same = DraftStream {
            stream: Some(TapStream::Partial),
            from: "--draft-stream".into(),
        };
        assert!(check(part, &[("d", same)], false).unwrap().notes.is_empty());
    }

    #[test]
    fn a_target_without_attention_residuals_has_residual_drafts() {
        let implied = ts(Some(TapStream::Residual), Known::Implied);
        let d = of_draft("x", None, "--draft-stream", None, implied);
        assert_eq!(d.stream, Some(TapStream::Residual));
        assert!(check(implied, &[("x", d)], false).unwrap().notes.is_empty());
    }

    /// A detected K3 DSpark (`target_layer_ids [0, 2]`, output of layer: hs[1], hs[3]) is the
    /// published entry of its layout and taps, and none of another layout or other taps.
    #[test]
    fn a_detected_draft_matches_its_published_entry_only() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/kimi-k2.5-tiny/k3-dspark"
        );
        let det = Checkpoint::open(dir).unwrap().detect().unwrap();
        let mut p = crate::target::profile::load("kimi-k3").unwrap();
        let entry = |layout: &str, hs: Vec<usize>, draft: &str| {
            let mut d = p.published_drafts[0].clone();
            (d.layout, d.hs, d.draft) = (layout.into(), hs, draft.into());
            d
        };
        p.published_drafts = vec![
            entry("k3-dspark (test)", vec![1, 3], "mine"),
            entry("specforge-dspark (test)", vec![1, 3], "other layout"),
            entry("k3-dspark (test)", vec![1, 2], "other taps"),
        ];
        let found: Vec<&str> = published_match(&p, &det)
            .iter()
            .map(|d| d.draft.as_str())
            .collect();
        assert_eq!(found, ["mine"]);
        let ts = TraceStream {
            stream: Some(TapStream::Mixture),
            known: Known::Recorded,
        };
        let d = of_draft(dir, None, "--draft-stream", Some(&p), ts);
        assert_eq!(d.stream, Some(TapStream::Partial), "{}", d.from);
        assert!(d.from.contains("published draft mine"), "{}", d.from);
    }

    #[test]
    fn the_k3_profiles_published_drafts_are_told_apart_by_layout_and_taps() {
        let p = crate::target::profile::load("kimi-k3").unwrap();
        let by = |family: &str, hs: &[usize]| -> Vec<&str> {
            p.published_drafts
                .iter()
                .filter(|d| d.family == family && d.hs == hs)
                .map(|d| d.draft.as_str())
                .collect()
        };
        // Each DSpark release has taps of its own; DFlash and DFlash2 share taps, not family.
        assert_eq!(by("dspark", &[3, 24, 48, 72, 90]).len(), 1);
        assert_eq!(by("dspark", &[8, 24, 52, 68, 84]).len(), 1);
        assert_eq!(by("dflash", &[20, 38, 55, 67, 79, 91]).len(), 1);
        // Every block-draft entry names its layout first, as the match reads it.
        for d in p
            .published_drafts
            .iter()
            .filter(|d| ["dspark", "dflash2"].contains(&d.family.as_str()))
        {
            let first = d.layout.split_whitespace().next().unwrap();
            assert!(
                [
                    "k3-dspark",
                    "specforge-dspark",
                    "speculators-dspark",
                    "dflash2"
                ]
                .contains(&first),
                "{}",
                d.layout
            );
        }
    }
}
