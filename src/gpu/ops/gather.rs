//! Rows and columns moved between tensors: the embedding gather (`kq_embed_rows_*`, [`Embed`]),
//! rows of an f32 tensor by index (`kq_gather_rows`, [`Gather`]) and blocks of columns between
//! strided rows (`kq_copy_cols`, [`CopyCols`]) — each with its checks, its launch and its CPU
//! replay.

use super::step::{elementwise, holds, indexes, layout, size, Bufs, DeviceOp, Launch};
use super::tensor::{DevTensor, Strided};
use crate::gpu::emu_launch::{at, HostBuf, Replay};
use crate::gpu::source::{args, Kernel};
use crate::gpu::{Act, Elem, Result};

/// `out [n, h]` = rows `ids` of `table [vocab, h]`.
pub struct Embed<'a> {
    pub table: &'a DevTensor,
    pub ids: &'a DevTensor,
    pub out: &'a DevTensor,
    pub n: usize,
    pub h: usize,
}

impl<'a> DeviceOp<'a> for Embed<'a> {
    fn check(&self) -> Result<()> {
        let Embed {
            table,
            ids,
            out,
            n,
            h,
        } = *self;
        if h == 0 || !table.len().is_multiple_of(h) {
            return Err(layout(format!(
                "embedding table of {} values is not rows of {h}",
                table.len()
            )));
        }
        if matches!(table.elem(), Elem::I32) {
            return Err(layout("embedding table of int32".into()));
        }
        indexes("ids", ids, n, table.len() / h)?;
        holds("embedding out", out, Elem::F32, size("n·h", &[&[n, h]])?)
    }

    fn launch<B: 'a>(&self, b: &Bufs<'a, '_, B>, _warp: u32) -> Result<Launch<'a, B>> {
        let (g, bl) = elementwise(self.n * self.h);
        let k = Kernel::EmbedRows(args::EmbedRows {
            elem: self.table.elem(),
            table: b(self.table)?,
            ids: b(self.ids)?,
            out: b(self.out)?,
            n: self.n,
            h: self.h,
        });
        Ok((k, g, bl))
    }
}

impl Embed<'_> {
    /// `kq_embed_rows_*` on the CPU.
    pub fn replay(k: &args::EmbedRows<'_, HostBuf>, r: &Replay<'_>) -> Result<()> {
        r.threads_cover(k.n * k.h)?;
        let ids = k.ids.read::<i32>(k.n)?;
        let y = match k.elem {
            Elem::Half(a) => embed(Table::Half(a, &k.table.all::<u16>()), &ids, k.h),
            Elem::F32 => embed(Table::F32(&k.table.all::<f32>()), &ids, k.h),
            Elem::I32 => return Err(r.err(format_args!("an int32 table"))),
        }?;
        k.out.write(&y)
    }
}

/// An embedding table's values, as `kq_embed_rows_*` reads them.
pub enum Table<'a> {
    Half(Act, &'a [u16]),
    F32(&'a [f32]),
}

/// `kq_embed_rows_*`: `[ids.len(), h]` f32.
pub fn embed(table: Table<'_>, ids: &[i32], h: usize) -> Result<Vec<f32>> {
    let rows = match &table {
        Table::Half(_, t) => t.len() / h.max(1),
        Table::F32(t) => t.len() / h.max(1),
    };
    let mut out = Vec::with_capacity(ids.len() * h);
    for &id in ids {
        let r = at("embedding id", id, rows)?;
        match &table {
            Table::Half(a, t) => out.extend(t[r * h..(r + 1) * h].iter().map(|&b| a.to_f32(b))),
            Table::F32(t) => out.extend_from_slice(&t[r * h..(r + 1) * h]),
        }
    }
    Ok(out)
}

/// `dst[dst_off + r·w ..]` = row `idx[r]` of `src` (rows of `w`), `m` rows.
pub struct Gather<'a> {
    pub src: &'a DevTensor,
    pub idx: &'a DevTensor,
    pub dst: &'a DevTensor,
    pub m: usize,
    pub w: usize,
    pub dst_off: usize,
}

impl<'a> DeviceOp<'a> for Gather<'a> {
    fn check(&self) -> Result<()> {
        let Gather {
            src,
            idx,
            dst,
            m,
            w,
            dst_off,
        } = *self;
        if w == 0 || !src.len().is_multiple_of(w) {
            return Err(layout(format!("gather source of {} values", src.len())));
        }
        holds("gather source", src, Elem::F32, 0)?;
        indexes("gather rows", idx, m, src.len() / w)?;
        holds(
            "gather out",
            dst,
            Elem::F32,
            size("out", &[&[dst_off], &[m, w]])?,
        )
    }

    fn launch<B: 'a>(&self, b: &Bufs<'a, '_, B>, _warp: u32) -> Result<Launch<'a, B>> {
        let (gr, bl) = elementwise(self.m * self.w);
        let k = Kernel::GatherRows(args::GatherRows {
            src: b(self.src)?,
            idx: b(self.idx)?,
            dst: b(self.dst)?,
            m: self.m,
            w: self.w,
            dst_off: self.dst_off,
        });
        Ok((k, gr, bl))
    }
}

impl Gather<'_> {
    /// `kq_gather_rows` on the CPU.
    pub fn replay(k: &args::GatherRows<'_, HostBuf>, r: &Replay<'_>) -> Result<()> {
        let (m, w, dst_off) = (k.m, k.w, k.dst_off);
        r.threads_cover(m * w)?;
        let rows = gather(&k.src.all::<f32>(), &k.idx.read::<i32>(m)?, w)?;
        let mut y = k.dst.read::<f32>(dst_off + m * w)?;
        y[dst_off..].copy_from_slice(&rows);
        k.dst.write(&y)
    }
}

/// `kq_gather_rows`: rows `idx` of `src` (rows of `w`).
pub fn gather(src: &[f32], idx: &[i32], w: usize) -> Result<Vec<f32>> {
    let rows = src.len() / w.max(1);
    let mut out = Vec::with_capacity(idx.len() * w);
    for &i in idx {
        let r = at("gather row", i, rows)?;
        out.extend_from_slice(&src[r * w..(r + 1) * w]);
    }
    Ok(out)
}

/// `dst[r, dst.off + h·dst_hs ..][..w]` = `src[r, src.off + h·src_hs ..][..w]` for `n` rows
/// and `heads` blocks (`src_hs` = 0: one block copied to every head).
pub struct CopyCols<'a> {
    pub src: &'a DevTensor,
    pub dst: &'a DevTensor,
    pub n: usize,
    pub heads: usize,
    pub w: usize,
    pub from: (Strided, usize),
    pub to: (Strided, usize),
}

impl<'a> DeviceOp<'a> for CopyCols<'a> {
    fn check(&self) -> Result<()> {
        let CopyCols {
            src,
            dst,
            n,
            heads,
            w,
            from,
            to,
        } = *self;
        for (what, t, (s, hs)) in [("copy source", src, from), ("copy out", dst, to)] {
            if heads == 0 || size("copy row end", &[&[s.off], &[heads - 1, hs], &[w]])? > s.ld {
                return Err(layout(format!(
                    "{what}: {heads} blocks of {w} every {hs} from {} in rows of {}",
                    s.off, s.ld
                )));
            }
            holds(what, t, Elem::F32, size("rows", &[&[n, s.ld]])?)?;
        }
        size("copy threads", &[&[n, heads, w]]).map(|_| ())
    }

    fn launch<B: 'a>(&self, b: &Bufs<'a, '_, B>, _warp: u32) -> Result<Launch<'a, B>> {
        let (n, heads, w) = (self.n, self.heads, self.w);
        let ((from, src_hs), (to, dst_hs)) = (self.from, self.to);
        let (g, bl) = elementwise(n * heads * w);
        let k = Kernel::CopyCols(args::CopyCols {
            src: b(self.src)?,
            dst: b(self.dst)?,
            n,
            heads,
            w,
            src_ld: from.ld,
            src_off: from.off,
            src_hs,
            dst_ld: to.ld,
            dst_off: to.off,
            dst_hs,
        });
        Ok((k, g, bl))
    }
}

impl CopyCols<'_> {
    /// `kq_copy_cols` on the CPU: every block copied into `dst` (other columns kept).
    pub fn replay(k: &args::CopyCols<'_, HostBuf>, r: &Replay<'_>) -> Result<()> {
        let (n, heads, w) = (k.n, k.heads, k.w);
        r.threads_cover(n * heads * w)?;
        let s = k.src.read::<f32>(n * k.src_ld)?;
        let mut y = k.dst.read::<f32>(n * k.dst_ld)?;
        for row in 0..n {
            for h in 0..heads {
                let from = &s[row * k.src_ld + k.src_off + h * k.src_hs..][..w];
                y[row * k.dst_ld + k.dst_off + h * k.dst_hs..][..w].copy_from_slice(from);
            }
        }
        k.dst.write(&y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_indices_are_errors() {
        assert!(embed(Table::F32(&[1.0, 2.0]), &[2], 1).is_err());
        assert!(embed(Table::F32(&[1.0, 2.0]), &[-1], 1).is_err());
        assert_eq!(
            embed(Table::F32(&[1.0, 2.0]), &[1, 0], 1).unwrap(),
            [2.0, 1.0]
        );
        assert!(gather(&[1.0, 2.0], &[0, 2], 1).is_err());
    }
}
