//! A draft's `d2t` tensor: per draft-vocabulary id, the offset to its target id (EAGLE-3 and
//! DSpark drafts with a reduced vocabulary), each checked to land in the target's vocabulary.

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};

/// The draft id → target id offsets (`d2t`), when the draft has them, each checked to land in
/// the target's vocabulary.
pub fn read(ck: &Checkpoint, draft_vocab: usize, vocab: usize) -> Result<Option<Vec<i64>>> {
    let d2t = match ck.weights.tensor("d2t") {
        Some(v) if v.shape() == [draft_vocab] => Some(match v.dtype() {
            crate::io::Dtype::I64 => v
                .data
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            _ => v.to_f32().iter().map(|&x| x as i64).collect(),
        }),
        Some(v) => {
            return Err(Error::Tensor {
                path: ck.weights.dir.clone(),
                tensor: "d2t".into(),
                msg: format!("shape {:?}, expected [{draft_vocab}]", v.shape()),
                hint: None,
            })
        }
        None => None,
    };
    // Every draft id must map into the target's vocabulary: a hostile offset would wrap to
    // another token (#38, the extras), so the first one that does not is named.
    if let Some(d) = &d2t {
        let d: &Vec<i64> = d;
        let bad = d.iter().enumerate().find(|&(i, &o)| {
            (i as i64)
                .checked_add(o)
                .is_none_or(|t| t < 0 || t as u64 >= vocab as u64)
        });
        if let Some((i, o)) = bad {
            return Err(Error::source(
                &ck.weights.dir,
                format!(
                    "tensor `d2t`: draft id {i} + offset {o} is outside the target \
                     vocabulary 0..{vocab}"
                ),
            )
            .with_hint(
                "`d2t` holds, per draft id, the offset to its target id; this draft's file \
                 is damaged or not for this target (`kquant inspect --tensors` shows it)",
            ));
        }
    }
    Ok(d2t)
}
