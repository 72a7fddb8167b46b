//! What vLLM's connector files hold and how their taps are numbered: the two tensors, the two
//! stackings of `hidden_states` ([`Layout`]), and vLLM's tap ids as HF `hidden_states`
//! indices ([`tap_slots`]).

use std::collections::HashSet;

use crate::error::{Error, Result};

/// The tensor holding the stacked taps.
pub const HIDDEN: &str = "hidden_states";
/// The tensor holding the request's token ids.
pub const TOKENS: &str = "token_ids";

/// How the taps are stacked in `hidden_states`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `[n_taps, T, H]`: vLLM's first connector (`torch.stack(…, dim=0)`).
    TapsFirst,
    /// `[T, n_taps, H]`: current vLLM (the KV-cache rows, one "head" per tap).
    TokensFirst,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::TapsFirst => "taps-first",
            Layout::TokensFirst => "tokens-first",
        }
    }

    pub(super) fn shape(self, n: usize, t: usize, h: usize) -> [usize; 3] {
        match self {
            Layout::TapsFirst => [n, t, h],
            Layout::TokensFirst => [t, n, h],
        }
    }

    /// Offset of row (slot `j`, position `t`) in a stack of `n` taps over `len` tokens.
    pub(super) fn row(self, j: usize, t: usize, n: usize, len: usize) -> usize {
        match self {
            Layout::TapsFirst => j * len + t,
            Layout::TokensFirst => t * n + j,
        }
    }
}

/// The HF `hidden_states` index vLLM's tap id `id` captures on an `num_layers`-block target:
/// `hs[id]` (id k is taken before block k; id L after the last block, before the final norm).
/// `None` past `hs[L]`.
pub fn vllm_id_to_hs(id: usize, num_layers: usize) -> Option<usize> {
    (id <= num_layers).then_some(id)
}

/// The tap each slot of vLLM's stack holds, as HF indices: the ids sorted ascending (vLLM
/// appends taps as its layer loop passes them). Refuses repeated ids and ids past `hs[L]`.
pub fn tap_slots(ids: &[usize], num_layers: usize) -> Result<Vec<usize>> {
    if ids.is_empty() {
        return Err(Error::Usage("--layer-ids is empty".into()));
    }
    let mut seen = HashSet::new();
    let mut hs = Vec::with_capacity(ids.len());
    for &id in ids {
        if !seen.insert(id) {
            return Err(Error::Usage(format!(
                "--layer-ids lists {id} twice; vLLM captures a layer once, so the files would hold fewer taps than ids"
            )));
        }
        hs.push(vllm_id_to_hs(id, num_layers).ok_or_else(|| {
            Error::Usage(format!(
                "--layer-ids {id} is past the last hidden state of a {num_layers}-layer target (vLLM id {num_layers} is the last block's output)"
            ))
        })?);
    }
    hs.sort_unstable();
    Ok(hs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_map_to_hf_indices_in_layer_order() {
        assert_eq!(tap_slots(&[58, 2, 30], 61).unwrap(), vec![2, 30, 58]);
        assert_eq!(
            tap_slots(&[2, 30, 61], 61).unwrap(),
            vec![2, 30, 61],
            "id L = last block output"
        );
        assert!(tap_slots(&[2, 62], 61)
            .unwrap_err()
            .to_string()
            .contains("past the last hidden state"));
        assert!(tap_slots(&[2, 2, 3], 61)
            .unwrap_err()
            .to_string()
            .contains("twice"));
        assert!(tap_slots(&[], 61).is_err());
    }

    #[test]
    fn rows_are_found_in_both_layouts() {
        // n = 2 taps, T = 3: slot 1 at position 2.
        assert_eq!(Layout::TapsFirst.row(1, 2, 2, 3), 5);
        assert_eq!(Layout::TokensFirst.row(1, 2, 2, 3), 5);
        assert_eq!(Layout::TapsFirst.row(1, 0, 2, 3), 3);
        assert_eq!(Layout::TokensFirst.row(1, 0, 2, 3), 1);
        assert_eq!(Layout::TapsFirst.shape(2, 3, 8), [2, 3, 8]);
        assert_eq!(Layout::TokensFirst.shape(2, 3, 8), [3, 2, 8]);
    }
}
