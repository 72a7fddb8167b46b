//! Which hidden-state stream a trace's taps hold (`manifest.json` `tap_stream`, docs/verify.md,
//! "Tap streams"): `residual` on a target without attention residuals, `partial` or
//! `mixture` on one with them (Kimi-K3; [`TapStream`]). Every writer records it (capture,
//! import, merge, synthetic); a trace written before kquant recorded it has none, and then the
//! stream is *implied* `residual` where the trace's target has no attention residuals and
//! *unknown* where it has them ([`TraceStream::of`]). A value kquant does not know is refused
//! when the manifest is read (`trace::file::check_tap_stream`), and one the trace's target
//! cannot have, or a target its witnesses disagree on, when the trace is used
//! ([`TraceStream::checked`]: verify, merge).

use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::target::profile::{self, Profile};
use crate::target::stream::TapStream;
use crate::trace::file::Manifest;

/// How a trace's stream is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Known {
    /// The manifest records it.
    Recorded,
    /// Not recorded; `residual`, since the target has no attention residuals.
    Implied,
    /// Not recorded, and the target has attention residuals: `partial` or `mixture`.
    Unknown,
}

/// A trace's tap stream and how it is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TraceStream {
    /// The stream, where known.
    pub stream: Option<TapStream>,
    pub known: Known,
}

impl TraceStream {
    /// The stream of a trace with manifest `m`; `profile` (the `--target` given) says whether
    /// its target has attention residuals where the manifest records no stream
    /// ([`has_attention_residuals`]).
    pub fn of(m: &Manifest, profile: Option<&Profile>) -> TraceStream {
        match m.tap_stream {
            Some(s) => TraceStream {
                stream: Some(s),
                known: Known::Recorded,
            },
            None if has_attention_residuals(m, profile) => TraceStream {
                stream: None,
                known: Known::Unknown,
            },
            None => TraceStream {
                stream: Some(TapStream::Residual),
                known: Known::Implied,
            },
        }
    }

    /// In words, for a summary line: ``partial` (recorded)`, …
    pub fn describe(&self) -> String {
        match (self.stream, self.known) {
            (Some(s), Known::Recorded) => format!("`{}` (recorded)", s.id()),
            (Some(s), _) => format!(
                "`{}` (not recorded; implied: the target has no attention residuals)",
                s.id()
            ),
            (None, _) => "unknown (not recorded, and the target has attention residuals: `partial` or `mixture`)".into(),
        }
    }
}

/// Whether the trace's target has Block Attention Residuals: the profile's word where one is
/// given, else a built-in profile with them named by the manifest's `target.name`, of its
/// `target.architecture` (which `trace capture` records), or of the trace's shape (hidden
/// size, layers, vocabulary where recorded). Every other target kquant
/// knows has one residual stream.
pub fn has_attention_residuals(m: &Manifest, profile: Option<&Profile>) -> bool {
    if let Some(p) = profile {
        return p.attention_residuals.is_some();
    }
    let field = |k: &str| m.target.get(k).and_then(Value::as_str);
    let (name, arch) = (field("name"), field("architecture"));
    profile::builtin_or_empty()
        .iter()
        .filter(|p| p.attention_residuals.is_some())
        .any(|p| {
            Some(p.name.as_str()) == name
                || (arch.is_some() && p.architecture.known().map(String::as_str) == arch)
                || same_shape(m, p)
        })
}

/// One thing that says whether a trace's target has Block Attention Residuals, and what it is
/// (for the message that names two that disagree).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Witness {
    pub attention_residuals: bool,
    /// `profile `kimi-k3` (--target)`, `the manifest's target.architecture …`, …
    pub what: String,
}

/// Whether an architecture kquant's target runtimes run has attention residuals (what `trace
/// capture` records as `target.architecture`: `runtime::target::Target::architecture`); `None`
/// for one kquant does not run.
fn architecture_has(arch: &str) -> Option<bool> {
    match arch {
        "KimiK3ForConditionalGeneration" => Some(true),
        "DeepseekV3ForCausalLM" | "KimiLinearForCausalLM" => Some(false),
        _ => None,
    }
}

/// Whether the target checkpoint `dir` with config `cfg` has attention residuals
/// ([`config_has_attention_residuals`](crate::target::stream::config_has_attention_residuals)).
pub fn checkpoint_witness(dir: &str, cfg: &crate::checkpoint::Config) -> Witness {
    Witness {
        attention_residuals: crate::target::stream::config_has_attention_residuals(cfg),
        what: format!(
            "target checkpoint `{}` ({})",
            crate::escape::printable(dir),
            crate::escape::printable(&cfg.architectures().join(", "))
        ),
    }
}

/// Everything that says whether the trace's target has attention residuals, strongest first:
/// the `--target` profile, the target checkpoint given (`checkpoint`, [`checkpoint_witness`]),
/// the manifest's `target.architecture` (which `trace capture` records) where kquant runs that
/// architecture, and a built-in profile named by `target.name`. A trace's shape alone is no
/// witness (another target may share it).
pub fn witnesses(
    m: &Manifest,
    profile: Option<&Profile>,
    checkpoint: Option<Witness>,
) -> Vec<Witness> {
    let field = |k: &str| m.target.get(k).and_then(Value::as_str);
    let mut w: Vec<Witness> = profile
        .map(|p| Witness {
            attention_residuals: p.attention_residuals.is_some(),
            what: format!("profile `{}` (--target)", crate::escape::printable(&p.name)),
        })
        .into_iter()
        .chain(checkpoint)
        .collect();
    if let Some(a) = field("architecture") {
        if let Some(has) = architecture_has(a) {
            w.push(Witness {
                attention_residuals: has,
                what: format!(
                    "the manifest's target.architecture `{}`",
                    crate::escape::printable(a)
                ),
            });
        }
    }
    if let Some(p) = field("name").and_then(|n| {
        profile::builtin_or_empty()
            .into_iter()
            .find(|p| p.name == n)
    }) {
        w.push(Witness {
            attention_residuals: p.attention_residuals.is_some(),
            what: format!(
                "built-in profile `{}`, which the manifest's target.name names",
                p.name
            ),
        });
    }
    w
}

impl TraceStream {
    /// The stream of `trace` as [`TraceStream::of`] reads it, held against every [`witnesses`]
    /// entry: two witnesses that disagree, or a recorded stream the target cannot have
    /// (`partial`/`mixture` on a target without attention residuals, `residual` on one with
    /// them), are refused, since the taps would be read as something they are not. Without a
    /// recorded stream, a witness decides between implied `residual` and unknown (the trace's
    /// shape where there is none, as [`TraceStream::of`]).
    pub fn checked(
        trace: &crate::trace::file::Trace,
        profile: Option<&Profile>,
        checkpoint: Option<Witness>,
    ) -> Result<TraceStream> {
        let m = &trace.manifest;
        let ws = witnesses(m, profile, checkpoint);
        let refuse = |msg: String| {
            Error::Source {
            path: trace.dir.join("manifest.json"),
            msg,
            hint: Some("the trace was written for another target, or its manifest was edited: pass the --target (and --target-checkpoint) it was captured from, or capture it again (`kquant trace capture --stream`, `scripts/vllm_capture.py --stream`); docs/verify.md, \"Tap streams\"".into()),
        }
        };
        if let Some(b) = ws
            .iter()
            .find(|w| w.attention_residuals != ws[0].attention_residuals)
        {
            let (with, without) = match ws[0].attention_residuals {
                true => (&ws[0], b),
                false => (b, &ws[0]),
            };
            return Err(refuse(format!(
                "the trace's target has attention residuals according to {}, and none according to {}",
                with.what, without.what
            )));
        }
        match (m.tap_stream, ws.first()) {
            (Some(s), Some(w)) if (s == TapStream::Residual) == w.attention_residuals => {
                Err(refuse(format!(
                    "records tap_stream `{}`, a stream of a target {} attention residuals, but its target has {} ({})",
                    s.id(),
                    if w.attention_residuals { "without" } else { "with" },
                    if w.attention_residuals { "them" } else { "none" },
                    w.what
                )))
            }
            (None, Some(w)) if w.attention_residuals => Ok(TraceStream {
                stream: None,
                known: Known::Unknown,
            }),
            (None, Some(_)) => Ok(TraceStream {
                stream: Some(TapStream::Residual),
                known: Known::Implied,
            }),
            _ => Ok(TraceStream::of(m, profile)),
        }
    }

    /// Whether the trace's target has attention residuals, as its stream says (an unknown
    /// stream is one of an attention-residual target).
    pub fn attention_residuals(&self) -> bool {
        match self.known {
            Known::Unknown => true,
            _ => self.stream != Some(TapStream::Residual),
        }
    }
}

fn same_shape(m: &Manifest, p: &Profile) -> bool {
    p.hidden_size.known() == Some(&m.hidden_size)
        && p.num_layers.known() == Some(&m.num_layers)
        && match (p.vocab_size.known(), m.vocab_size) {
            (Some(a), Some(b)) => *a == b,
            _ => true,
        }
}

/// The stream a capture taps on a target (`attention_residuals`: whether it has them), asked
/// (`flag`, named `flag_name` in the error) or by default: `residual` without attention
/// residuals, vLLM's default `partial` with them. `partial` or `mixture` on a target without
/// attention residuals, and `residual` on one with them, are refused.
pub fn for_target(
    asked: Option<TapStream>,
    attention_residuals: bool,
    target: &str,
    flag_name: &str,
) -> Result<TapStream> {
    match (asked, attention_residuals) {
        (None, false) => Ok(TapStream::Residual),
        (None, true) => Ok(TapStream::Partial),
        (Some(TapStream::Residual), false) => Ok(TapStream::Residual),
        (Some(s @ (TapStream::Partial | TapStream::Mixture)), true) => Ok(s),
        (Some(s), false) => Err(Error::Flags {
            msg: format!(
                "{flag_name} {}: target `{}` has no attention residuals; its taps are the one residual stream",
                s.id(),
                crate::escape::printable(target)
            ),
            hint: format!("leave {flag_name} out (or say `residual`): `partial` and `mixture` are the two streams of an attention-residual target (Kimi-K3)"),
        }),
        (Some(s), true) => Err(Error::Flags {
            msg: format!(
                "{flag_name} {}: target `{}` has attention residuals; a tap there is the `partial` or the `mixture` stream",
                s.id(),
                crate::escape::printable(target)
            ),
            hint: format!("{flag_name} partial (vLLM's default) or {flag_name} mixture (SGLang's; vLLM with VLLM_KIMI_K3_AUX_ATTN_RES_STREAM=1): docs/verify.md, \"Tap streams\""),
        }),
    }
}

/// The stream traces to be merged share: the first's (recorded, or implied), and an error
/// naming both where another's differs (`None`: every input's is unknown).
pub fn common(streams: &[TraceStream]) -> std::result::Result<Option<TapStream>, (usize, String)> {
    let first = streams.first().map_or(
        TraceStream {
            stream: None,
            known: Known::Unknown,
        },
        |s| *s,
    );
    for (i, s) in streams.iter().enumerate().skip(1) {
        if s.stream != first.stream {
            return Err((
                i,
                format!(
                    "taps of stream {} where the first trace's are {}: taps of two streams are two inputs a draft tells apart, not one trace",
                    s.describe(),
                    first.describe()
                ),
            ));
        }
    }
    Ok(first.stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_decides_the_default_and_refuses_the_other_kind() {
        use TapStream::*;
        assert_eq!(for_target(None, false, "t", "--stream").unwrap(), Residual);
        assert_eq!(for_target(None, true, "t", "--stream").unwrap(), Partial);
        assert_eq!(
            for_target(Some(Mixture), true, "t", "--stream").unwrap(),
            Mixture
        );
        let e = for_target(Some(Mixture), false, "k2", "--stream")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no attention residuals"), "{e}");
        assert!(for_target(Some(Residual), true, "k3", "--stream").is_err());
    }

    #[test]
    fn merging_needs_one_stream() {
        let r = |s, known| TraceStream { stream: s, known };
        let part = r(Some(TapStream::Partial), Known::Recorded);
        let mix = r(Some(TapStream::Mixture), Known::Recorded);
        assert_eq!(common(&[part, part]).unwrap(), Some(TapStream::Partial));
        let (i, e) = common(&[part, mix]).unwrap_err();
        assert_eq!(i, 1);
        assert!(e.contains("`mixture`") && e.contains("`partial`"), "{e}");
        let implied = r(Some(TapStream::Residual), Known::Implied);
        let rec = r(Some(TapStream::Residual), Known::Recorded);
        assert_eq!(common(&[implied, rec]).unwrap(), Some(TapStream::Residual));
        assert!(common(&[part, r(None, Known::Unknown)]).is_err());
    }
}
