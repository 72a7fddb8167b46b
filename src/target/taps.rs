//! The taps a target profile gives each draft family (`checkpoint::Family`): HF
//! `hidden_states` indices, with the views other conventions number them by.

use serde::{Deserialize, Serialize};

use super::fact::Fact;
use crate::checkpoint::Family;

/// The tap convention of every profile (and of `kquant-trace/1`): `hs[0]` is the embedding
/// output, `hs[i]` the output of block `i−1`, and `hs[L]` the last block's output *before* the
/// final norm (transformers' own `hidden_states[L]` is after it).
pub const TAP_CONVENTION: &str = "hf_output_hidden_states";

/// The draft families a profile lists taps for, in the profiles' order.
pub const FAMILIES: [Family; 5] = [
    Family::Eagle3,
    Family::Eagle3Mla,
    Family::Dflash,
    Family::Dspark,
    Family::Dflash2,
];

/// Whether `n` taps are what a draft of family `f` reads: EAGLE-3 always three, the block
/// drafters (DFlash, DSpark, DFlash2) one per target layer id.
pub fn count_ok(f: &Family, n: usize) -> bool {
    match f {
        Family::Eagle3 | Family::Eagle3Mla => n == 3,
        _ => n >= 1,
    }
}

/// The default taps of one draft family.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TapSet {
    /// HF `hidden_states` indices, ascending.
    pub hs: Vec<usize>,
    /// Where they come from.
    pub source: String,
}

impl TapSet {
    /// The ids to give vLLM's `eagle_aux_hidden_state_layer_ids` (and `kquant trace import
    /// --layer-ids`) to capture these taps: vLLM's id k is `hs[k]`, so the same numbers.
    pub fn vllm_ids(&self) -> Vec<usize> {
        self.hs.clone()
    }

    /// The same taps as "output of layer k" ids (SpecForge, TorchSpec, DFlash `target_layer_ids`,
    /// SGLang config ids before its +1): `hs[k+1]`. `None` when a tap is the embedding (`hs[0]`).
    pub fn output_of_layer_ids(&self) -> Option<Vec<usize>> {
        self.hs.iter().map(|&h| h.checked_sub(1)).collect()
    }
}

/// Default taps per draft family.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Taps {
    pub eagle3: Fact<TapSet>,
    #[serde(rename = "eagle3-mla")]
    pub eagle3_mla: Fact<TapSet>,
    pub dflash: Fact<TapSet>,
    /// DSpark and DFlash2 (#40): absent from a profile written before them = unknown.
    #[serde(default = "unknown")]
    pub dspark: Fact<TapSet>,
    #[serde(default = "unknown")]
    pub dflash2: Fact<TapSet>,
}

fn unknown() -> Fact<TapSet> {
    Fact::Unknown(super::fact::Unknown::Unknown)
}

impl Taps {
    /// The taps of `f`, when known (none for a family that is not a draft's).
    pub fn get(&self, f: &Family) -> Option<&TapSet> {
        match f {
            Family::Eagle3 => self.eagle3.known(),
            Family::Eagle3Mla => self.eagle3_mla.known(),
            Family::Dflash => self.dflash.known(),
            Family::Dspark => self.dspark.known(),
            Family::Dflash2 => self.dflash2.known(),
            Family::Target | Family::Unknown => None,
        }
    }

    /// Each draft family with known taps, in [`FAMILIES`] order.
    pub fn known(&self) -> impl Iterator<Item = (Family, &TapSet)> {
        FAMILIES
            .into_iter()
            .filter_map(|f| self.get(&f).map(|t| (f, t)))
    }

    /// The family whose default taps are exactly `hs`, if any (the first in [`FAMILIES`]).
    pub fn family_of(&self, hs: &[usize]) -> Option<Family> {
        self.known().find(|(_, t)| t.hs == hs).map(|(f, _)| f)
    }
}
