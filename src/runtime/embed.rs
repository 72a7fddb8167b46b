//! A draft's token embedding (an EAGLE-3 draft's own or its target's, a DFlash drafter's
//! target's): either dense f32 rows (a quantized embedding, dequantized at load, or one handed
//! to the loader), or — for an unquantized one in a checkpoint — rows converted on demand from
//! the memory-mapped file. A real-size Kimi embedding is 163840 × 7168, 4.7 GB as f32; a replay
//! only ever reads the rows of the tokens it sees, so the mapped form costs those pages and
//! nothing else.

use std::borrow::Cow;

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::io::dtype;
use crate::io::Shard;

/// `[vocab, h]` token embedding rows.
pub enum Embedding {
    /// Rows as f32, row-major.
    Dense { h: usize, v: Vec<f32> },
    /// Tensor `index` (header order) of a mapped shard, in its stored float dtype.
    Mapped {
        h: usize,
        shard: Shard,
        index: usize,
    },
}

/// An embedding table as [`Embedding::stored`] gives it.
pub enum Stored<'a> {
    F32(&'a [f32]),
    Bytes(crate::io::Dtype, &'a [u8]),
}

impl Embedding {
    /// The mapped form of tensor `name` of `ck` when it is stored as a plain float tensor of
    /// shape `[vocab, h]`; `None` otherwise (a quantized or absent embedding).
    pub fn map(ck: &Checkpoint, name: &str, vocab: usize, h: usize) -> Result<Option<Embedding>> {
        let (Some(shard), Some(info)) = (ck.weights.shard_of(name), ck.weights.info(name)) else {
            return Ok(None);
        };
        if !info.dtype.is_float() || info.shape != [vocab, h] {
            return Ok(None);
        }
        // SAFETY: the same contract as the checkpoint's own mapping of this file (`Shard::open`):
        // kquant never writes to its inputs.
        let shard = unsafe { Shard::open(shard.path())? };
        let index = shard.index_of(name).expect("same file, same header");
        Ok(Some(Embedding::Mapped { h, shard, index }))
    }

    /// Number of values (`vocab · h`).
    pub fn numel(&self) -> usize {
        match self {
            Embedding::Dense { v, .. } => v.len(),
            Embedding::Mapped { shard, index, .. } => shard.tensors()[*index].numel() as usize,
        }
    }

    /// Row `tok` as f32.
    pub fn row(&self, tok: u32) -> Cow<'_, [f32]> {
        let t = tok as usize;
        match self {
            Embedding::Dense { h, v } => Cow::Borrowed(&v[t * h..(t + 1) * h]),
            Embedding::Mapped { h, shard, index } => {
                let info = &shard.tensors()[*index];
                let sz = info.dtype.size();
                let data = shard.view(info).data;
                let mut out = Vec::with_capacity(*h);
                dtype::to_f32(info.dtype, &data[t * h * sz..(t + 1) * h * sz], &mut out);
                Cow::Owned(out)
            }
        }
    }

    /// Rows of `toks`, concatenated (`[toks.len(), h]`).
    /// The whole table as it is held: f32 values, or the mapped file's bytes (little-endian)
    /// and their dtype (what a device step uploads once).
    pub fn stored(&self) -> Stored<'_> {
        match self {
            Embedding::Dense { v, .. } => Stored::F32(v),
            Embedding::Mapped { shard, index, .. } => {
                let info = &shard.tensors()[*index];
                Stored::Bytes(info.dtype, shard.view(info).data)
            }
        }
    }

    /// Row width.
    pub fn width(&self) -> usize {
        match self {
            Embedding::Dense { h, .. } | Embedding::Mapped { h, .. } => *h,
        }
    }

    pub fn rows(&self, toks: impl IntoIterator<Item = u32>) -> Vec<f32> {
        let mut out = Vec::new();
        for t in toks {
            out.extend_from_slice(&self.row(t));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mapped rows are exactly the dense f32 conversion of the stored tensor, row by row.
    #[test]
    fn mapped_rows_equal_the_dense_conversion() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/tiny/eagle3-mla-torchspec"
        );
        let ck = Checkpoint::open(dir).unwrap();
        let name = "embed_tokens.weight";
        let shape = ck.weights.info(name).unwrap().shape.clone();
        let (vocab, h) = (shape[0], shape[1]);
        let m = Embedding::map(&ck, name, vocab, h)
            .unwrap()
            .expect("bf16 embedding");
        assert!(matches!(m, Embedding::Mapped { .. }));
        let d = Embedding::Dense {
            h,
            v: ck.weights.tensor(name).unwrap().to_f32(),
        };
        assert_eq!(m.numel(), d.numel());
        let all: Vec<u32> = (0..vocab as u32).rev().collect();
        assert_eq!(m.rows(all.iter().copied()), d.rows(all.iter().copied()));
        assert!(d.rows([1, 2]).iter().any(|&x| x != 0.0), "a real embedding");
        // Another shape is not mapped (the loader then reports the shape).
        assert!(Embedding::map(&ck, name, vocab + 1, h).unwrap().is_none());
        assert!(Embedding::map(&ck, "no.such", vocab, h).unwrap().is_none());
    }
}
