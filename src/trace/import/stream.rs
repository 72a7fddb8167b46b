//! Pass 2 of an import: the values, request by request in the trace's write order, each row
//! checked finite as it is converted to BF16 and written through a [`TraceWriter`] a piece of
//! one tap at a time; at most one request's file is mapped at once.

use super::files::{reopen, Checked, ConnFile};
use super::layout::{Layout, HIDDEN};
use crate::error::{Error, Result};
use crate::io::{Dtype, Shard, TensorView};
use crate::trace::file::{Entry, TraceWriter};

/// Largest piece of a tap converted at once (bytes of BF16 rows).
const PART_BYTES: usize = 4 << 20;

/// What pass 2 reads and where it writes.
pub(super) struct Values<'a> {
    pub(super) files: &'a [ConnFile],
    pub(super) checked: &'a [Checked],
    /// The trace's taps, HF indices ascending: slot j of a file's stack holds `slots[j]`.
    pub(super) slots: &'a [usize],
    pub(super) layout: Layout,
    pub(super) hidden: usize,
    /// `None` for a dry run: the values are checked, nothing is written.
    pub(super) writer: Option<TraceWriter>,
}

/// The conversion buffers: one piece of one tap as BF16 bytes, one row as f32.
#[derive(Default)]
struct Buffers {
    buf: Vec<u8>,
    row: Vec<f32>,
    /// The most bytes they held at once.
    peak: usize,
}

impl Values<'_> {
    /// Write (or, for a dry run, check) every entry of `order`, then finish the trace. The
    /// largest conversion buffer held at once (bytes).
    pub(super) fn run(mut self, order: Vec<Entry>) -> Result<usize> {
        let mut open: Option<(usize, Shard)> = None;
        let mut b = Buffers::default();
        for e in order {
            match e {
                Entry::Tokens(i) | Entry::Top1(i) => {
                    if let Some(tw) = self.writer.as_mut() {
                        tw.write_ids(e, &self.checked[i].tokens)?;
                    }
                }
                Entry::Tap(i, tap) => {
                    if open.as_ref().map(|(k, _)| *k) != Some(i) {
                        drop(open.take()); // unmaps the previous request first
                        open = Some((i, reopen(&self.files[i], &self.checked[i])?));
                    }
                    let shard = &open.as_ref().expect("opened").1;
                    let view = shard.tensor(HIDDEN).expect("checked by reopen");
                    self.tap(e, &view, i, tap, &mut b)?;
                }
            }
        }
        drop(open);
        if let Some(tw) = self.writer {
            tw.finish()?;
        }
        Ok(b.peak)
    }

    /// Tap `hs[tap]` of request `i` (entry `e`), a piece of [`PART_BYTES`] at a time.
    fn tap(
        &mut self,
        e: Entry,
        view: &TensorView,
        i: usize,
        tap: usize,
        b: &mut Buffers,
    ) -> Result<()> {
        let (hidden, layout) = (self.hidden, self.layout);
        let n = self.slots.len();
        let j = self
            .slots
            .iter()
            .position(|&s| s == tap)
            .expect("declared tap");
        let c = &self.checked[i];
        let (t, size) = (c.tokens.len(), c.dtype.size());
        let rows_per_part = (PART_BYTES / (2 * hidden)).max(1);
        b.buf
            .reserve_exact((rows_per_part * 2 * hidden).saturating_sub(b.buf.len()));
        let mut pos = 0;
        while pos < t {
            let end = (pos + rows_per_part).min(t);
            b.buf.clear();
            for p in pos..end {
                let r = layout.row(j, p, n, t) * hidden;
                let src = &view.data[r * size..(r + hidden) * size];
                b.push_row(src, c.dtype, hidden)
                    .map_err(|(k, v)| Error::Tensor {
                        path: self.files[i].path.clone(),
                        tensor: HIDDEN.into(),
                        msg: format!(
                        "holds {v} at tap slot {j} (hs[{tap}]), token position {p}, channel {k}"
                    ),
                        hint: None,
                    })?;
            }
            b.peak = b.peak.max(b.buf.capacity() + b.row.capacity() * 4);
            if let Some(tw) = self.writer.as_mut() {
                tw.write_part(e, &b.buf)?;
            }
            pos = end;
        }
        if let Some(tw) = self.writer.as_mut() {
            tw.end(e)?;
        }
        Ok(())
    }
}

impl Buffers {
    /// Append one row (`hidden` values of `dtype`) as BF16; the channel and value of the first
    /// one that is not finite, if any.
    fn push_row(
        &mut self,
        src: &[u8],
        dtype: Dtype,
        hidden: usize,
    ) -> std::result::Result<(), (usize, f32)> {
        if dtype == Dtype::BF16 {
            if let Some(k) = src
                .chunks_exact(2)
                .position(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7F80 == 0x7F80)
            {
                let b = u16::from_le_bytes([src[2 * k], src[2 * k + 1]]);
                return Err((k, half::bf16::from_bits(b).to_f32()));
            }
            self.buf.extend_from_slice(src);
        } else {
            self.row.resize(hidden, 0.0);
            crate::io::dtype::to_f32_into(dtype, src, &mut self.row);
            if let Some(k) = self.row.iter().position(|x| !x.is_finite()) {
                return Err((k, self.row[k]));
            }
            self.buf.extend(
                self.row
                    .iter()
                    .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()),
            );
        }
        Ok(())
    }
}
