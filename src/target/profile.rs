//! Target profiles: what kquant knows about each target model, in `quant-configs/targets/*.json`
//! (compiled into the binary, so a bare name works anywhere). A profile gives the target's shape,
//! the default taps of each draft family as HF `hidden_states` indices, the accept lengths the
//! model cards publish (quoted exactly, with card, benchmark, engine and draft length), and,
//! for a target kquant can run, where its live fixture lives. Facts nobody has checked are the
//! string `"unknown"` ([`Fact`]), never a guess; `sources` cites where each known fact comes
//! from.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::fact::Fact;
use super::stream::{AttentionResiduals, TapStream};
use super::taps::{self, TapSet, Taps, FAMILIES};
use crate::checkpoint::{Detection, Family};
use crate::error::{Error, Result};

/// The profiles shipped in `quant-configs/targets/` (name, file contents).
pub const BUILTIN: &[(&str, &str)] = &[
    (
        "kimi-k2.5",
        include_str!("../../quant-configs/targets/kimi-k2.5.json"),
    ),
    (
        "kimi-k2.6",
        include_str!("../../quant-configs/targets/kimi-k2.6.json"),
    ),
    (
        "kimi-linear-48b-a3b",
        include_str!("../../quant-configs/targets/kimi-linear-48b-a3b.json"),
    ),
    (
        "kimi-k3",
        include_str!("../../quant-configs/targets/kimi-k3.json"),
    ),
    (
        "kimi-k2.5-tiny",
        include_str!("../../quant-configs/targets/kimi-k2.5-tiny.json"),
    ),
    (
        "kimi-linear-tiny",
        include_str!("../../quant-configs/targets/kimi-linear-tiny.json"),
    ),
    (
        "kimi-k3-tiny",
        include_str!("../../quant-configs/targets/kimi-k3-tiny.json"),
    ),
];

/// One published accept length, quoted exactly from its source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishedAl {
    /// The draft (HF id or the card's own words).
    pub draft: String,
    /// `eagle3`, `eagle3-mla` or `dflash`.
    pub family: String,
    pub benchmark: String,
    /// Prompts in the benchmark run.
    pub n: Fact<u64>,
    /// The number as the card prints it (`"2.940"`, `"~3.97"`).
    pub accept_length: String,
    /// Engine (and hardware) as the card states it, or why it is not known.
    pub engine: String,
    /// Draft tokens per round, in the card's own terms.
    pub draft_length: String,
    /// The model card the number is quoted from (its address and the excerpt under
    /// `quant-configs/targets/cards/`).
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Set when the figure is second-hand: who quotes it, and that its own source was not read
    /// (absent: quoted verbatim from the card excerpt `source` names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<String>,
}

/// A published draft of this target and the taps it reads, in its own config's words and as
/// HF `hidden_states` indices, with the stream it was trained on where that is known.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishedDraft {
    /// HF id (with the revision read, when one was).
    pub draft: String,
    /// `dspark`, `dflash`, `dflash2`, `eagle3` or `eagle3-mla`.
    pub family: String,
    /// Its on-disk layout (`kquant inspect`'s `block_draft.layout` where it has one).
    pub layout: String,
    /// The tap key and ids as its config writes them, and how each engine reads them.
    pub config_ids: String,
    /// The taps as HF `hidden_states` indices.
    pub hs: Vec<usize>,
    /// The stream it was trained on.
    pub stream: Fact<TapStream>,
    /// How sure the facts are: `read` (the file itself), or what they rest on.
    pub status: String,
    pub source: String,
}

impl PublishedAl {
    /// The number, without an approximation sign.
    pub fn value(&self) -> Option<f64> {
        self.accept_length.trim_start_matches('~').parse().ok()
    }
}

/// Paths (relative to the repository root) of a target kquant can run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Live {
    /// The target checkpoint directory.
    pub target: String,
    /// Prompts (JSONL).
    pub prompts: String,
    /// A `kquant-trace/1` captured from the target over those prompts.
    pub trace: String,
}

impl Live {
    /// One of the live paths, found relative to the working directory or, failing that, to the
    /// kquant source tree this binary was built from (where the fixture lives).
    pub fn resolve(&self, rel: &str) -> Result<std::path::PathBuf> {
        let p = Path::new(rel);
        if p.exists() {
            return Ok(p.to_path_buf());
        }
        let built = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
        if built.exists() {
            return Ok(built);
        }
        Err(Error::Source {
            path: p.into(),
            msg: "is not there (looked in the working directory and in the kquant source tree)"
                .into(),
            hint: Some(
                "run from a kquant checkout (the live fixtures are fixtures/kimi-k2.5-tiny/, fixtures/kimi-linear-tiny/ and fixtures/kimi-k3-tiny/), or pass --trace and --target-checkpoint".into(),
            ),
        })
    }
}

/// Which decoder layers mix tokens how, for a hybrid target (Kimi-Linear: KDA and MLA).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerPattern {
    /// Kimi Delta Attention layers, 0-based decoder-layer indices (the output of layer i is
    /// `hs[i+1]`).
    pub kda: Vec<usize>,
    /// Full (MLA) attention layers, 0-based.
    pub mla: Vec<usize>,
    /// Where the pattern comes from (and the file's own numbering).
    pub source: String,
}

/// Where each shape fact comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sources {
    pub hf_id: String,
    pub architecture: String,
    pub num_layers: String,
    pub hidden_size: String,
    pub vocab_size: String,
}

/// One target profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    pub description: String,
    /// Hugging Face id; `null` for a target that is not on the hub.
    pub hf_id: Option<String>,
    pub architecture: Fact<String>,
    /// Decoder blocks L (taps range over `hs[0..=L]`).
    pub num_layers: Fact<usize>,
    pub hidden_size: Fact<usize>,
    pub vocab_size: Fact<usize>,
    /// The layer pattern of a hybrid target (absent for one kind of attention throughout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<LayerPattern>,
    pub taps: Taps,
    pub published_accept_lengths: Vec<PublishedAl>,
    /// The published drafts and their taps, where a target has several of one family.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub published_drafts: Vec<PublishedDraft>,
    /// Block Attention Residuals (Kimi-K3): which stream each engine taps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_residuals: Option<AttentionResiduals>,
    pub sources: Sources,
    /// Set when kquant can run the target itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<Live>,
}

/// What is wrong with profile file `path`, with the hint where its fields are described.
fn bad(path: &Path, msg: String) -> Error {
    Error::source(path, msg).with_hint("see quant-configs/targets/README.md for the profile fields")
}

impl Profile {
    /// The default taps of draft family `f`, when known.
    pub fn taps_of(&self, f: &Family) -> Option<&TapSet> {
        self.taps.get(f)
    }

    /// Check that the facts agree with each other: taps ascending, distinct and within
    /// `hs[0..=L]`, the right count per family, published numbers that parse as accept lengths,
    /// every source given, live paths relative to the repository.
    pub fn check(&self, path: &Path) -> Result<()> {
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        {
            return Err(bad(
                path,
                format!(
                    "name `{}` must be lowercase letters, digits, `-` and `.`",
                    self.name
                ),
            ));
        }
        for (what, v) in [
            ("num_layers", &self.num_layers),
            ("hidden_size", &self.hidden_size),
            ("vocab_size", &self.vocab_size),
        ] {
            if v.known() == Some(&0) {
                return Err(bad(path, format!("{what} is 0")));
            }
            // #38.12: bounded before anything is sized or listed from it.
            if let Some(&n) = v
                .known()
                .filter(|&&n| n as u64 > crate::checkpoint::detect::MAX_DIM)
            {
                return Err(bad(
                    path,
                    format!(
                        "{what} is {n}; kquant takes values up to {}",
                        crate::checkpoint::detect::MAX_DIM
                    ),
                ));
            }
        }
        self.check_taps(path)?;
        self.check_published(path)?;
        self.check_layers(path)?;
        self.check_drafts(path)?;
        let s = &self.sources;
        for (what, v) in [
            ("hf_id", &s.hf_id),
            ("architecture", &s.architecture),
            ("num_layers", &s.num_layers),
            ("hidden_size", &s.hidden_size),
            ("vocab_size", &s.vocab_size),
        ] {
            if v.trim().is_empty() {
                return Err(bad(path, format!("sources.{what} is empty")));
            }
        }
        if let Some(live) = &self.live {
            for p in [&live.target, &live.prompts, &live.trace] {
                let pp = Path::new(p);
                if pp.is_absolute()
                    || pp
                        .components()
                        .any(|c| c == std::path::Component::ParentDir)
                {
                    return Err(bad(
                        path,
                        format!("live path `{p}` must be relative to the repository root"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Each family's taps: the count it reads, strictly ascending, within `hs[0..=L]`, sourced.
    fn check_taps(&self, path: &Path) -> Result<()> {
        for (f, t) in self.taps.known() {
            if !taps::count_ok(&f, t.hs.len()) {
                return Err(bad(path, format!("{} lists {} taps", f.id(), t.hs.len())));
            }
            if !t.hs.windows(2).all(|w| w[0] < w[1]) {
                return Err(bad(
                    path,
                    format!("{} taps {:?} are not strictly ascending", f.id(), t.hs),
                ));
            }
            if let (Some(&l), Some(&top)) = (self.num_layers.known(), t.hs.last()) {
                if top > l {
                    return Err(bad(path, format!(
                        "{} tap hs[{top}] is past the last hidden state hs[{l}] of a {l}-layer target",
                        f.id()
                    )));
                }
            }
            if t.source.trim().is_empty() {
                return Err(bad(path, format!("{} taps have no source", f.id())));
            }
        }
        Ok(())
    }

    /// Each published draft: a draft family, taps strictly ascending within `hs[0..=L]` in the
    /// count its family reads, sourced; an attention-residual block of at least one layer.
    fn check_drafts(&self, path: &Path) -> Result<()> {
        for d in &self.published_drafts {
            let Some(f) = FAMILIES.iter().find(|f| f.id() == d.family) else {
                return Err(bad(
                    path,
                    format!(
                        "published draft `{}`: unknown family `{}`",
                        d.draft, d.family
                    ),
                ));
            };
            let ok_count = taps::count_ok(f, d.hs.len());
            let ascending = d.hs.windows(2).all(|w| w[0] < w[1]);
            let within = match (self.num_layers.known(), d.hs.last()) {
                (Some(&l), Some(&top)) => top <= l,
                _ => true,
            };
            if !(ok_count && ascending && within) {
                return Err(bad(path, format!(
                    "published draft `{}`: taps hs{:?} must be {} strictly ascending hidden states within hs[0..={}]",
                    d.draft, d.hs, if matches!(f, Family::Eagle3 | Family::Eagle3Mla) { "3" } else { "one or more" }, self.num_layers.show()
                )));
            }
            if d.source.trim().is_empty() || d.status.trim().is_empty() {
                return Err(bad(
                    path,
                    format!("published draft `{}` has no source or status", d.draft),
                ));
            }
        }
        if let Some(a) = &self.attention_residuals {
            if a.block_size == 0 || a.source.trim().is_empty() {
                return Err(bad(
                    path,
                    "attention_residuals: block_size must be ≥ 1 and sourced".into(),
                ));
            }
            if a.engines.iter().any(|e| e.default == TapStream::Residual) {
                return Err(bad(path, "attention_residuals: an engine's default stream on an attention-residual target is `partial` or `mixture`".into()));
            }
        }
        Ok(())
    }

    /// Each published accept length: a draft family, a number ≥ 1, a source.
    fn check_published(&self, path: &Path) -> Result<()> {
        for p in &self.published_accept_lengths {
            if !FAMILIES.iter().any(|f| f.id() == p.family) {
                return Err(bad(
                    path,
                    format!(
                        "published accept length for `{}`: unknown family `{}`",
                        p.draft, p.family
                    ),
                ));
            }
            match p.value() {
                Some(v) if v >= 1.0 && v.is_finite() => {}
                _ => {
                    return Err(bad(
                        path,
                        format!(
                            "published accept length `{}` ({} on {}) is not a number ≥ 1",
                            p.accept_length, p.draft, p.benchmark
                        ),
                    ))
                }
            }
            if p.source.trim().is_empty() {
                return Err(bad(
                    path,
                    format!(
                        "published accept length of {} on {} has no source",
                        p.draft, p.benchmark
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A hybrid's layer pattern: each layer once, sourced.
    fn check_layers(&self, path: &Path) -> Result<()> {
        if let Some(lp) = &self.layers {
            let mut all: Vec<usize> = lp.kda.iter().chain(&lp.mla).copied().collect();
            all.sort_unstable();
            let n = self.num_layers.known().copied().unwrap_or(all.len());
            // Compared without listing 0..n (n comes from the file).
            if all.len() != n || all.iter().enumerate().any(|(i, &l)| i != l) {
                return Err(bad(
                    path,
                    format!("layers: kda {:?} and mla {:?} must together be each of the {n} layers 0..{n} once", lp.kda, lp.mla),
                ));
            }
            if lp.source.trim().is_empty() {
                return Err(bad(path, "layers has no source".into()));
            }
        }
        Ok(())
    }
}

/// Parse and check profile JSON.
pub fn parse(path: &Path, text: &str) -> Result<Profile> {
    let p: Profile = serde_json::from_str(text)
        .map_err(|e| bad(path, format!("not a kquant target profile: {e}")))?;
    p.check(path)?;
    Ok(p)
}

/// Every built-in profile, parsed.
pub fn builtin() -> Result<Vec<Profile>> {
    BUILTIN
        .iter()
        .map(|(name, text)| parse(&builtin_path(name), text))
        .collect()
}

/// The built-in profiles for matching a draft to its target (`super::shape`); none when they
/// cannot be read.
pub fn builtin_or_empty() -> Vec<Profile> {
    builtin().unwrap_or_default()
}

fn builtin_path(name: &str) -> std::path::PathBuf {
    format!("quant-configs/targets/{name}.json").into()
}

/// Load a profile by built-in name or file path.
pub fn load(spec: &str) -> Result<Profile> {
    let (path, text) = crate::io::text::builtin_or_file(
        spec,
        BUILTIN,
        builtin_path,
        "target profile",
        |names| {
            Error::Flags {
            msg: format!("no target profile `{spec}` (not a built-in name, not a file)"),
            hint: format!(
                "the built-in profiles are {names} (`kquant targets` shows them); or give the path of a profile JSON file"
            ),
        }
        },
    )?;
    parse(&path, &text)
}

/// The published drafts of `p` that the detected draft is: the same family, the same layout
/// where `det` is a block draft (DSpark, DFlash2: the layout id `kquant inspect` detects, which
/// the profile's `layout` begins with, e.g. `k3-dspark (…)`), and the same taps (HF indices)
/// where `det` names them.
pub fn published_match<'p>(p: &'p Profile, det: &Detection) -> Vec<&'p PublishedDraft> {
    let taps: Option<Vec<usize>> = det.aux_layers.as_ref().and_then(|a| {
        let mut t: Vec<usize> = a
            .hidden_states
            .as_ref()?
            .iter()
            .map(|&i| usize::try_from(i).ok())
            .collect::<Option<_>>()?;
        t.sort_unstable();
        Some(t)
    });
    let layout = det.block_draft.as_ref().map(|b| b.layout.id());
    p.published_drafts
        .iter()
        .filter(|d| d.family == det.family.id())
        .filter(|d| match (layout, d.layout.split_whitespace().next()) {
            (Some(l), Some(named)) => l.starts_with(named),
            _ => true,
        })
        .filter(|d| taps.as_ref().is_none_or(|t| *t == d.hs))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Profile {
        load("kimi-k2.5-tiny").unwrap()
    }

    #[test]
    fn every_builtin_parses_and_is_named_after_its_file() {
        for (p, (name, _)) in builtin().unwrap().iter().zip(BUILTIN) {
            assert_eq!(&p.name, name);
        }
    }

    #[test]
    fn inconsistent_profiles_are_refused() {
        let p = Path::new("x.json");
        // One family's taps replaced by `hs`: refused with `msg`.
        let taps = |family: fn(&mut Taps) -> &mut Fact<TapSet>, hs: Vec<usize>, msg: &str| {
            let mut t = tiny();
            *family(&mut t.taps) = Fact::Known(TapSet {
                hs,
                source: "s".into(),
            });
            let e = t.check(p).unwrap_err().to_string();
            assert!(e.contains(msg), "{e}");
        };
        taps(
            |t| &mut t.eagle3,
            vec![1, 2, 5],
            "past the last hidden state hs[4]",
        );
        taps(|t| &mut t.dflash, vec![3, 1], "strictly ascending");
        taps(|t| &mut t.eagle3_mla, vec![1, 2], "lists 2 taps");
        let mut t = load("kimi-k2.5").unwrap();
        t.published_accept_lengths[0].accept_length = "n/a".into();
        assert!(t.check(p).unwrap_err().to_string().contains("not a number"));
        let mut t = tiny();
        t.live.as_mut().unwrap().trace = "../elsewhere".into();
        assert!(t.check(p).unwrap_err().to_string().contains("relative"));
        assert!(matches!(load("no-such-target"), Err(Error::Flags { .. })));
        // #38.12: a hostile layer count is refused before anything is listed from it.
        let mut t = load("kimi-linear-48b-a3b").unwrap();
        t.num_layers = Fact::Known(1 << 32);
        let e = t.check(p).unwrap_err().to_string();
        assert!(e.contains("num_layers is 4294967296"), "{e}");
        let mut t = load("kimi-linear-48b-a3b").unwrap();
        if let Some(lp) = t.layers.as_mut() {
            lp.mla.push(1 << 40);
        }
        assert!(t.check(p).is_err());
        // A published draft's taps past the target, or in the wrong count; a residual default.
        let k3 = || load("kimi-k3").unwrap();
        let mut t = k3();
        t.published_drafts[0].hs = vec![3, 94];
        assert!(t
            .check(p)
            .unwrap_err()
            .to_string()
            .contains("within hs[0..=93]"));
        let mut t = k3();
        let e3 = t
            .published_drafts
            .iter_mut()
            .find(|d| d.family == "eagle3-mla")
            .unwrap();
        e3.hs = vec![2, 46];
        assert!(t.check(p).unwrap_err().to_string().contains("must be 3"));
        let mut t = k3();
        t.published_drafts[0].family = "medusa".into();
        assert!(t
            .check(p)
            .unwrap_err()
            .to_string()
            .contains("unknown family"));
        let mut t = k3();
        t.attention_residuals.as_mut().unwrap().engines[0].default = TapStream::Residual;
        assert!(t
            .check(p)
            .unwrap_err()
            .to_string()
            .contains("`partial` or `mixture`"));
    }

    #[test]
    fn tap_views_follow_the_conventions() {
        let k = load("kimi-k2.5").unwrap();
        let e = k.taps_of(&Family::Eagle3).unwrap();
        assert_eq!(e.vllm_ids(), vec![2, 30, 58]);
        assert_eq!(e.output_of_layer_ids(), Some(vec![1, 29, 57]));
        let d = k.taps_of(&Family::Dflash).unwrap();
        assert_eq!(d.output_of_layer_ids(), Some(vec![1, 12, 24, 35, 47, 58]));
    }
}
