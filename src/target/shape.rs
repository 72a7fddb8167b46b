//! A draft and the target it was made for: what a draft's files say about its target
//! ([`DraftShape`]), matched against the target profiles' shapes and default taps
//! ([`candidates`]), and the target named from that or from a target checkpoint ([`identify`]).
//! Which engines serve the pair is `crate::engines::target`.

use serde::Serialize;

use super::profile::Profile;
use crate::checkpoint::{Checkpoint, Detection, Family};

/// What a draft's files say about its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftShape {
    pub family: Family,
    /// The target's hidden size: an EAGLE-3 draft's `target_hidden_size`, else the draft's
    /// own `hidden_size` (a DFlash drafter and a Kimi EAGLE-3 draft take the target's width).
    pub hidden: Option<u64>,
    /// The target's depth: a block drafter's `num_target_layers` where it counts the target's
    /// layers, a K3DSparkModel's `target_num_hidden_layers` (its `num_target_layers` counts taps).
    pub num_target_layers: Option<u64>,
    /// The draft's taps as HF `hidden_states` indices, when their convention is known.
    pub taps: Option<Vec<usize>>,
}

impl DraftShape {
    /// Read from a draft's config and detection.
    pub fn of(ck: &Checkpoint, det: &Detection) -> DraftShape {
        let uint = |k: &str| ck.config.as_ref().and_then(|c| c.uint(k).ok().flatten());
        DraftShape {
            family: det.family.clone(),
            hidden: uint("target_hidden_size").or_else(|| uint("hidden_size")),
            num_target_layers: uint("target_num_hidden_layers").or_else(|| {
                let counts_taps = det
                    .block_draft
                    .as_ref()
                    .and_then(|b| b.num_target_layers.as_ref())
                    .is_some_and(|n| n.means == "taps");
                uint("num_target_layers").filter(|_| !counts_taps)
            }),
            taps: det
                .aux_layers
                .as_ref()
                .and_then(|a| a.hidden_states.as_ref())
                .map(|v| v.iter().filter_map(|&x| usize::try_from(x).ok()).collect()),
        }
    }
}

/// The targets a draft may be for: those of its target's hidden size (and layer count, where
/// the draft names one); among them the ones whose default taps for the draft's family are the
/// draft's, else those with any taps for the family, else all of that size. Empty when the
/// draft's hidden size is unknown or no target has it.
pub fn candidates<'a>(targets: &'a [Profile], d: &DraftShape) -> Vec<&'a Profile> {
    let sized: Vec<&Profile> = targets
        .iter()
        .filter(|t| {
            d.hidden
                .is_some_and(|h| t.hidden_size.known().is_some_and(|&s| s as u64 == h))
                && match (d.num_target_layers, t.num_layers.known()) {
                    (Some(n), Some(&l)) => n == l as u64,
                    _ => true,
                }
        })
        .collect();
    fn taps_of<'p>(t: &'p Profile, f: &Family) -> Option<&'p Vec<usize>> {
        t.taps_of(f).map(|s| &s.hs)
    }
    let same_taps: Vec<_> = sized
        .iter()
        .copied()
        .filter(|t| d.taps.is_some() && taps_of(t, &d.family) == d.taps.as_ref())
        .collect();
    if !same_taps.is_empty() {
        return same_taps;
    }
    let known_taps: Vec<_> = sized
        .iter()
        .copied()
        .filter(|t| taps_of(t, &d.family).is_some())
        .collect();
    if !known_taps.is_empty() {
        known_taps
    } else {
        sized
    }
}

/// The architecture all of `targets` share (`architectures[0]`, known); `None` when there are
/// none, one is unknown, or two differ.
pub fn one_architecture(targets: &[&Profile]) -> Option<String> {
    let arch = targets.first()?.architecture.known()?;
    targets
        .iter()
        .all(|t| t.architecture.known() == Some(arch))
        .then(|| arch.clone())
}

/// A draft's target, named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NamedTarget {
    /// `architectures[0]` of the target.
    pub architecture: String,
    /// How it is known: `--target-checkpoint`, or the profile(s) the draft's shape matches.
    pub known_from: String,
}

/// The draft's target: the architecture of `target` (a target checkpoint given by the user),
/// else that of the [`candidates`] among `known` when they all agree on one. `None` when
/// neither says.
pub fn identify(
    ck: &Checkpoint,
    det: &Detection,
    target: Option<&Checkpoint>,
    known: &[Profile],
) -> Option<NamedTarget> {
    if let Some(t) = target {
        let arch = t
            .config
            .as_ref()
            .and_then(|c| c.root.get("architectures"))
            .and_then(|a| a.as_array()?.first()?.as_str().map(String::from));
        return arch.map(|architecture| NamedTarget {
            architecture,
            known_from: "--target-checkpoint".into(),
        });
    }
    let shape = DraftShape::of(ck, det);
    let c = candidates(known, &shape);
    let arch = one_architecture(&c)?;
    let names: Vec<&str> = c.iter().map(|t| t.name.as_str()).collect();
    Some(NamedTarget {
        architecture: arch,
        known_from: format!(
            "the draft's shape (target hidden size {}{}{}) matches target profile {}",
            shape.hidden.map_or("?".into(), |h| h.to_string()),
            shape
                .num_target_layers
                .map_or(String::new(), |n| format!(", {n} target layers")),
            shape
                .taps
                .as_ref()
                .map_or(String::new(), |t| format!(", taps hs{t:?}")),
            names.join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::fact::{Fact, Unknown};
    use crate::target::taps::TapSet;

    fn shape(name: &str, arch: &str, layers: usize, hidden: usize, dflash: &[usize]) -> Profile {
        let mut p = crate::target::profile::load("kimi-k2.5-tiny").unwrap();
        p.name = name.into();
        p.architecture = Fact::Known(arch.into());
        p.num_layers = Fact::Known(layers);
        p.hidden_size = Fact::Known(hidden);
        p.taps.eagle3 = Fact::Unknown(Unknown::Unknown);
        p.taps.eagle3_mla = Fact::Unknown(Unknown::Unknown);
        p.taps.dflash = Fact::Known(TapSet {
            hs: dflash.to_vec(),
            source: "test".into(),
        });
        p.live = None;
        p
    }

    fn dflash(hidden: u64, layers: Option<u64>, taps: Option<&[usize]>) -> DraftShape {
        DraftShape {
            family: Family::Dflash,
            hidden: Some(hidden),
            num_target_layers: layers,
            taps: taps.map(<[usize]>::to_vec),
        }
    }

    #[test]
    fn a_draft_is_matched_on_hidden_size_layers_and_taps() {
        const KIMI_LINEAR: &str = "KimiLinearForCausalLM";
        let t = [
            shape("k2-tiny", "DeepseekV3ForCausalLM", 4, 256, &[1, 3]),
            shape("kl-tiny", KIMI_LINEAR, 4, 256, &[2, 3]),
            shape("kl", KIMI_LINEAR, 27, 2304, &[4, 8, 16, 20, 24]),
            shape("k2", "DeepseekV3ForCausalLM", 61, 7168, &[2, 30, 58]),
        ];
        let names = |d: &DraftShape| {
            candidates(&t, d)
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
        };
        // Two targets of one width, told apart by the taps.
        assert_eq!(names(&dflash(256, Some(4), Some(&[2, 3]))), ["kl-tiny"]);
        assert_eq!(names(&dflash(256, Some(4), Some(&[1, 3]))), ["k2-tiny"]);
        // Taps nobody defaults to: every target of that shape.
        assert_eq!(
            names(&dflash(256, Some(4), Some(&[1, 2]))),
            ["k2-tiny", "kl-tiny"]
        );
        // Custom taps on the real target: its width and layer count still find it.
        assert_eq!(names(&dflash(2304, Some(27), Some(&[1, 2]))), ["kl"]);
        assert_eq!(names(&dflash(2304, None, None)), ["kl"]);
        // A layer count the target does not have, or an unknown width: none.
        assert!(names(&dflash(2304, Some(61), None)).is_empty());
        assert!(names(&dflash(999, None, None)).is_empty());
        let unknown = DraftShape {
            hidden: None,
            ..dflash(0, None, None)
        };
        assert!(names(&unknown).is_empty());
        // One architecture among the candidates names it; two name none.
        let c = candidates(&t, &dflash(256, Some(4), Some(&[2, 3])));
        assert_eq!(one_architecture(&c).as_deref(), Some(KIMI_LINEAR));
        let c = candidates(&t, &dflash(256, Some(4), Some(&[1, 2])));
        assert_eq!(one_architecture(&c), None);
    }
}
