//! Device-resident tensors and the step kernels over them (`kernels/ops.cu`): what lets a draft's
//! whole step stay on a device (`runtime::eagle3::device`), with only token ids going up and the
//! proposals' indices coming back. A [`DevTensor`] is a typed device buffer (f32, int32 indices
//! with the bound they were checked against, or 16-bit activations); an [`Op`] is one launch of a
//! step kernel over tensors. [`Op::check`] states every size and bound a kernel relies on, so that
//! [`super::Backend::op`] is safe: the kernels themselves check nothing. The linears and the row
//! argmax run on tensors through the same regimes as the host-slice calls
//! ([`super::Backend::w4a16_dev`], [`super::Backend::dense_dev`], [`super::Backend::argmax_dev`]).
//!
//! Written once for every [`Driver`] here (the launch geometry and the [`Kernel`] each op
//! becomes); the CPU emulation replays each kernel ([`super::emu_ops`]).

use std::any::Any;

use super::driver::Dim3;
use super::source::{Kernel, ATT_VALUES_PER_LANE, OPS_THREADS};
use super::{Act, Elem, GpuError, Result};

/// A typed device buffer of `len` elements.
pub struct DevTensor {
    elem: Elem,
    len: usize,
    /// For int32 index tensors: every value is in `0..bound` (checked at upload).
    bound: Option<usize>,
    inner: Box<dyn Any + Send + Sync>,
}

impl DevTensor {
    pub fn new(
        elem: Elem,
        len: usize,
        bound: Option<usize>,
        inner: Box<dyn Any + Send + Sync>,
    ) -> DevTensor {
        DevTensor {
            elem,
            len,
            bound,
            inner,
        }
    }
    pub fn elem(&self) -> Elem {
        self.elem
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The bound an index tensor's values were checked against.
    pub fn bound(&self) -> Option<usize> {
        self.bound
    }
    /// The backend's buffer, or an error if the tensor lives on another device.
    pub fn get<T: 'static>(&self, backend: &'static str) -> Result<&T> {
        self.inner.downcast_ref::<T>().ok_or(GpuError::Backend {
            backend,
            msg: "a tensor of a different device".into(),
        })
    }
}

/// Host values for an upload.
#[derive(Clone, Copy)]
pub enum Host<'a> {
    F32(&'a [f32]),
    /// Bit patterns of a 16-bit float.
    Half(Act, &'a [u16]),
    /// Indices, each checked to be in `0..bound`.
    Index(&'a [i32], usize),
    /// f32 or 16-bit values as little-endian bytes (a mapped file's tensor, uploaded as it is).
    Le(Elem, &'a [u8]),
}

impl Host<'_> {
    pub fn elem(&self) -> Elem {
        match self {
            Host::F32(_) => Elem::F32,
            Host::Half(a, _) => Elem::Half(*a),
            Host::Index(..) => Elem::I32,
            Host::Le(e, _) => *e,
        }
    }
    pub fn len(&self) -> usize {
        match self {
            Host::F32(v) => v.len(),
            Host::Half(_, v) => v.len(),
            Host::Index(v, _) => v.len(),
            Host::Le(e, b) => b.len() / e.size(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Every index in `0..bound`; raw bytes whole values of a float type, in the device's
    /// (little-endian) order.
    pub fn check(&self) -> Result<()> {
        if let Host::Le(e, b) = *self {
            if e == Elem::I32 || !b.len().is_multiple_of(e.size()) || cfg!(target_endian = "big") {
                return Err(layout(format!(
                    "{} bytes of little-endian {} on a {} host",
                    b.len(),
                    e.name(),
                    if cfg!(target_endian = "big") {
                        "big-endian"
                    } else {
                        "little-endian"
                    }
                )));
            }
        }
        if let Host::Index(v, bound) = *self {
            if let Some(bad) = v.iter().find(|&&i| i < 0 || i as usize >= bound) {
                return Err(GpuError::Layout(format!("index {bad} outside 0..{bound}")));
            }
        }
        Ok(())
    }
}

/// Rows of `ld` values, the op's `w` of them from column `off`.
#[derive(Debug, Clone, Copy)]
pub struct Strided {
    pub ld: usize,
    pub off: usize,
}

/// `kq_attend`'s dimensions.
#[derive(Debug, Clone, Copy)]
pub struct AttendDims {
    /// Query rows.
    pub m: usize,
    /// Rows of each depth's diagonal keys (the replay's rows).
    pub n: usize,
    /// The pair of replay row 0 (row `i` attends depth-0 keys `0..=start + i`).
    pub start: usize,
    /// Diagonal keys per query (the earlier depths).
    pub diag: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub dq: usize,
    pub dv: usize,
    pub scale: f32,
}

/// One launch of a step kernel (`kernels/ops.cu`) over device tensors.
pub enum Op<'a> {
    /// `out [n, h]` = rows `ids` of `table [vocab, h]`.
    Embed {
        table: &'a DevTensor,
        ids: &'a DevTensor,
        out: &'a DevTensor,
        n: usize,
        h: usize,
    },
    /// RMSNorm of `n` rows of `h` (`w [h]`, epsilon `eps`), read from and written to strided
    /// rows (in place when `x` and `out` are the same tensor at the same stride).
    RmsNorm {
        x: &'a DevTensor,
        w: &'a DevTensor,
        out: &'a DevTensor,
        n: usize,
        h: usize,
        eps: f32,
        input: Strided,
        output: Strided,
    },
    /// Rotary embedding in place on `heads` heads of `2·half` values, `head_ld` apart, from
    /// column `at.off` of rows of `at.ld`; row `r` at position `pos[r]` of the table
    /// `cs [positions, half, 2]`; pairs `(i, i + half)` (NeoX) or `(2i, 2i + 1)` (interleaved).
    Rope {
        x: &'a DevTensor,
        pos: &'a DevTensor,
        cs: &'a DevTensor,
        n: usize,
        heads: usize,
        half: usize,
        at: Strided,
        head_ld: usize,
        interleaved: bool,
    },
    /// `dst[r, dst.off + h·dst_hs ..][..w]` = `src[r, src.off + h·src_hs ..][..w]` for `n` rows
    /// and `heads` blocks (`src_hs` = 0: one block copied to every head).
    CopyCols {
        src: &'a DevTensor,
        dst: &'a DevTensor,
        n: usize,
        heads: usize,
        w: usize,
        from: (Strided, usize),
        to: (Strided, usize),
    },
    /// Attention of query rows `rows` over a replay's keys (`kq_attend`).
    Attend {
        q: &'a DevTensor,
        k0: &'a DevTensor,
        v0: &'a DevTensor,
        kd: &'a DevTensor,
        vd: &'a DevTensor,
        rows: &'a DevTensor,
        slots: &'a DevTensor,
        out: &'a DevTensor,
        dims: AttendDims,
    },
    /// `out = silu(g) · u` over `len` values.
    SiluMul {
        g: &'a DevTensor,
        u: &'a DevTensor,
        out: &'a DevTensor,
        len: usize,
    },
    /// `out = a + b` over `len` values.
    Add {
        a: &'a DevTensor,
        b: &'a DevTensor,
        out: &'a DevTensor,
        len: usize,
    },
    /// `y` (16-bit) = `x` rounded, `len` values.
    ToAct {
        x: &'a DevTensor,
        y: &'a DevTensor,
        len: usize,
    },
    /// `dst[dst_off + r·w ..]` = row `idx[r]` of `src` (rows of `w`), `m` rows.
    Gather {
        src: &'a DevTensor,
        idx: &'a DevTensor,
        dst: &'a DevTensor,
        m: usize,
        w: usize,
        dst_off: usize,
    },
}

fn layout(msg: String) -> GpuError {
    GpuError::Layout(msg)
}

/// `t` holds at least `need` elements of `elem`.
fn holds(what: &str, t: &DevTensor, elem: Elem, need: usize) -> Result<()> {
    if t.elem != elem {
        return Err(layout(format!(
            "{what}: a {} tensor where {} was expected",
            t.elem.name(),
            elem.name()
        )));
    }
    if t.len < need {
        return Err(layout(format!(
            "{what}: {} elements, the op needs {need}",
            t.len
        )));
    }
    Ok(())
}

/// `t` is an index tensor of at least `need` values, each below `limit`.
fn indexes(what: &str, t: &DevTensor, need: usize, limit: usize) -> Result<()> {
    holds(what, t, Elem::I32, need)?;
    match t.bound {
        Some(b) if b <= limit => Ok(()),
        Some(b) => Err(layout(format!(
            "{what}: indices up to {b}, the op indexes {limit}"
        ))),
        None => Err(layout(format!("{what}: indices never checked"))),
    }
}

/// `Σ` of products of `terms` (each a product of its factors), computed checked, and fitting a
/// kernel's `int`: every size [`Op::check`] compares is one, so a hostile geometry is an error,
/// never a wrapped product that passes (#38.11).
fn size(what: &str, terms: &[&[usize]]) -> Result<usize> {
    let v = terms
        .iter()
        .try_fold(0usize, |acc, t| {
            t.iter()
                .try_fold(1usize, |a, &b| a.checked_mul(b))
                .and_then(|x| acc.checked_add(x))
        })
        .ok_or_else(|| GpuError::Unsupported("size", format!("{what} {terms:?} overflows")))?;
    int(what, v)
}

/// `v` fits a kernel's `int`.
fn int(what: &str, v: usize) -> Result<usize> {
    if i32::try_from(v).is_ok() {
        Ok(v)
    } else {
        Err(GpuError::Unsupported(
            "size",
            format!("{what} = {v} exceeds a kernel's int"),
        ))
    }
}

fn half(t: &DevTensor, what: &str) -> Result<Act> {
    match t.elem {
        Elem::Half(a) => Ok(a),
        e => Err(layout(format!(
            "{what}: a {} tensor where bf16/f16 was expected",
            e.name()
        ))),
    }
}

impl Op<'_> {
    /// Every size, element type and index bound the kernel relies on: an op that passes reads
    /// and writes inside its tensors only.
    pub fn check(&self) -> Result<()> {
        let f = Elem::F32;
        match *self {
            Op::Embed {
                table,
                ids,
                out,
                n,
                h,
            } => {
                if h == 0 || !table.len.is_multiple_of(h) {
                    return Err(layout(format!(
                        "embedding table of {} values is not rows of {h}",
                        table.len
                    )));
                }
                if matches!(table.elem, Elem::I32) {
                    return Err(layout("embedding table of int32".into()));
                }
                indexes("ids", ids, n, table.len / h)?;
                holds("embedding out", out, f, size("n·h", &[&[n, h]])?)
            }
            Op::RmsNorm {
                x,
                w,
                out,
                n,
                h,
                input,
                output,
                ..
            } => {
                for (what, t, s) in [("norm in", x, input), ("norm out", out, output)] {
                    if size("norm row end", &[&[s.off], &[h]])? > s.ld {
                        return Err(layout(format!(
                            "{what}: {h} from {} in rows of {}",
                            s.off, s.ld
                        )));
                    }
                    holds(what, t, f, size("rows", &[&[n, s.ld]])?)?;
                }
                holds("norm weight", w, f, h)
            }
            Op::Rope {
                x,
                pos,
                cs,
                n,
                heads,
                half,
                at,
                head_ld,
                ..
            } => {
                if heads == 0
                    || size(
                        "rope row end",
                        &[&[at.off], &[heads - 1, head_ld], &[2, half]],
                    )? > at.ld
                {
                    return Err(layout(format!(
                        "rope: {heads} heads of {} every {head_ld} from {} in rows of {}",
                        2 * half,
                        at.off,
                        at.ld
                    )));
                }
                holds("rope x", x, f, size("rows", &[&[n, at.ld]])?)?;
                // The launch's thread count (heads may overlap: `head_ld` is not bounded below).
                size("rope threads", &[&[n, heads, half]])?;
                if half == 0 || !cs.len.is_multiple_of(size("rope pair", &[&[2, half]])?) {
                    return Err(layout(format!("rope table of {} values", cs.len)));
                }
                holds("rope table", cs, f, 0)?;
                indexes("positions", pos, n, cs.len / (2 * half))
            }
            Op::Attend {
                q,
                k0,
                v0,
                kd,
                vd,
                rows,
                slots,
                out,
                dims: d,
            } => {
                if d.kv_heads == 0 || !d.heads.is_multiple_of(d.kv_heads) {
                    return Err(layout(format!(
                        "{} heads over {} key/value heads",
                        d.heads, d.kv_heads
                    )));
                }
                if d.dv == 0 || d.dv > ATT_VALUES_PER_LANE * 64 {
                    return Err(GpuError::Unsupported(
                        "attention value width",
                        format!("{} (kq_attend holds {ATT_VALUES_PER_LANE} per lane)", d.dv),
                    ));
                }
                let (kw, vw) = (
                    size("kv_heads·dq", &[&[d.kv_heads, d.dq]])?,
                    size("kv_heads·dv", &[&[d.kv_heads, d.dv]])?,
                );
                holds(
                    "queries",
                    q,
                    f,
                    size("m·heads·dq", &[&[d.m, d.heads, d.dq]])?,
                )?;
                indexes("query rows", rows, d.m, d.n)?;
                // Row i attends depth-0 keys 0..=start + i, so k0 holds start + n rows.
                let keys = size("keys", &[&[d.start], &[d.n]])?;
                holds("depth-0 keys", k0, f, size("keys", &[&[keys, kw]])?)?;
                holds("depth-0 values", v0, f, size("values", &[&[keys, vw]])?)?;
                holds(
                    "diagonal keys",
                    kd,
                    f,
                    size("diag keys", &[&[d.diag, d.n, kw]])?,
                )?;
                holds(
                    "diagonal values",
                    vd,
                    f,
                    size("diag values", &[&[d.diag, d.n, vw]])?,
                )?;
                if d.diag > 0 {
                    indexes("slots", slots, size("slots", &[&[d.diag, d.n]])?, d.n)?;
                }
                holds(
                    "attention out",
                    out,
                    f,
                    size("m·heads·dv", &[&[d.m, d.heads, d.dv]])?,
                )
            }
            Op::CopyCols {
                src,
                dst,
                n,
                heads,
                w,
                from,
                to,
            } => {
                for (what, t, (s, hs)) in [("copy source", src, from), ("copy out", dst, to)] {
                    if heads == 0
                        || size("copy row end", &[&[s.off], &[heads - 1, hs], &[w]])? > s.ld
                    {
                        return Err(layout(format!(
                            "{what}: {heads} blocks of {w} every {hs} from {} in rows of {}",
                            s.off, s.ld
                        )));
                    }
                    holds(what, t, f, size("rows", &[&[n, s.ld]])?)?;
                }
                size("copy threads", &[&[n, heads, w]]).map(|_| ())
            }
            Op::SiluMul { g, u, out, len } => {
                holds("gate", g, f, int("len", len)?)?;
                holds("up", u, f, len)?;
                holds("silu out", out, f, len)
            }
            Op::Add { a, b, out, len } => {
                holds("add a", a, f, int("len", len)?)?;
                holds("add b", b, f, len)?;
                holds("add out", out, f, len)
            }
            Op::ToAct { x, y, len } => {
                holds("to_act in", x, f, int("len", len)?)?;
                let a = half(y, "to_act out")?;
                holds("to_act out", y, Elem::Half(a), len)
            }
            Op::Gather {
                src,
                idx,
                dst,
                m,
                w,
                dst_off,
            } => {
                if w == 0 || !src.len.is_multiple_of(w) {
                    return Err(layout(format!("gather source of {} values", src.len)));
                }
                holds("gather source", src, f, 0)?;
                indexes("gather rows", idx, m, src.len / w)?;
                holds("gather out", dst, f, size("out", &[&[dst_off], &[m, w]])?)
            }
        }
    }
}

/// Grid and block of an element-wise step kernel over `len` outputs.
fn elementwise(len: usize) -> (Dim3, Dim3) {
    (
        (len.div_ceil(OPS_THREADS as usize).max(1) as u32, 1, 1),
        (OPS_THREADS, 1, 1),
    )
}

/// The launch `op` becomes (checked first): its kernel over the buffers `buf` maps each tensor
/// to, its grid and block for a `warp`-lane device.
pub(super) fn launch_of<'t, B>(
    op: &Op<'t>,
    buf: impl Fn(&'t DevTensor) -> Result<&'t B>,
    warp: u32,
) -> Result<(Kernel<'t, B>, Dim3, Dim3)> {
    op.check()?;
    let b = buf;
    Ok(match *op {
        Op::Embed {
            table,
            ids,
            out,
            n,
            h,
        } => {
            let (g, bl) = elementwise(n * h);
            let k = Kernel::EmbedRows {
                elem: table.elem,
                table: b(table)?,
                ids: b(ids)?,
                out: b(out)?,
                n,
                h,
            };
            (k, g, bl)
        }
        Op::RmsNorm {
            x,
            w,
            out,
            n,
            h,
            eps,
            input,
            output,
        } => {
            let k = Kernel::RmsNorm {
                x: b(x)?,
                w: b(w)?,
                out: b(out)?,
                n,
                h,
                in_ld: input.ld,
                in_off: input.off,
                out_ld: output.ld,
                out_off: output.off,
                eps_bits: eps.to_bits() as usize,
            };
            (k, (n.max(1) as u32, 1, 1), (OPS_THREADS, 1, 1))
        }
        Op::Rope {
            x,
            pos,
            cs,
            n,
            heads,
            half,
            at,
            head_ld,
            interleaved,
        } => {
            let (g, bl) = elementwise(n * heads * half);
            let k = Kernel::Rope {
                x: b(x)?,
                pos: b(pos)?,
                cs: b(cs)?,
                n,
                heads,
                half,
                ld: at.ld,
                off: at.off,
                head_ld,
                interleaved: usize::from(interleaved),
            };
            (k, g, bl)
        }
        Op::CopyCols {
            src,
            dst,
            n,
            heads,
            w,
            from,
            to,
        } => {
            let (g, bl) = elementwise(n * heads * w);
            let k = Kernel::CopyCols {
                src: b(src)?,
                dst: b(dst)?,
                n,
                heads,
                w,
                src_ld: from.0.ld,
                src_off: from.0.off,
                src_hs: from.1,
                dst_ld: to.0.ld,
                dst_off: to.0.off,
                dst_hs: to.1,
            };
            (k, g, bl)
        }
        Op::Attend {
            q,
            k0,
            v0,
            kd,
            vd,
            rows,
            slots,
            out,
            dims: d,
        } => {
            let lanes = warp;
            if d.dv > ATT_VALUES_PER_LANE * lanes as usize {
                return Err(GpuError::Unsupported(
                    "attention value width",
                    format!("{} > {ATT_VALUES_PER_LANE} per lane × {lanes} lanes", d.dv),
                ));
            }
            let k = Kernel::Attend {
                q: b(q)?,
                k0: b(k0)?,
                v0: b(v0)?,
                kd: b(kd)?,
                vd: b(vd)?,
                rows: b(rows)?,
                slots: b(slots)?,
                out: b(out)?,
                m: d.m,
                n: d.n,
                start: d.start,
                diag: d.diag,
                heads: d.heads,
                kv_heads: d.kv_heads,
                dq: d.dq,
                dv: d.dv,
                scale_bits: d.scale.to_bits() as usize,
            };
            // Rows on x (up to 2^31 − 1 blocks), heads on y (up to 65535).
            if d.heads > 65535 {
                return Err(GpuError::Unsupported(
                    "attention heads",
                    format!("{} (a grid's y holds 65535)", d.heads),
                ));
            }
            let grid = (int("m", d.m)? as u32, d.heads as u32, 1);
            (k, grid, (lanes, 1, 1))
        }
        Op::SiluMul { g, u, out, len } => {
            let (gr, bl) = elementwise(len);
            let k = Kernel::SiluMul {
                g: b(g)?,
                u: b(u)?,
                out: b(out)?,
                len,
            };
            (k, gr, bl)
        }
        Op::Add { a, b: bb, out, len } => {
            let (gr, bl) = elementwise(len);
            let k = Kernel::Add {
                a: b(a)?,
                b: b(bb)?,
                out: b(out)?,
                len,
            };
            (k, gr, bl)
        }
        Op::ToAct { x, y, len } => {
            let (gr, bl) = elementwise(len);
            let k = Kernel::ToAct {
                act: half(y, "to_act out")?,
                x: b(x)?,
                y: b(y)?,
                len,
            };
            (k, gr, bl)
        }
        Op::Gather {
            src,
            idx,
            dst,
            m,
            w,
            dst_off,
        } => {
            let (gr, bl) = elementwise(m * w);
            let k = Kernel::GatherRows {
                src: b(src)?,
                idx: b(idx)?,
                dst: b(dst)?,
                m,
                w,
                dst_off,
            };
            (k, gr, bl)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{Backend, CpuEmu};

    /// #38.11: geometries whose sizes wrap a `usize` are refused, never checked as the wrapped
    /// (small) product: a `kq_rope` of 2^62 + 1 heads used to pass and read outside its tensor.
    #[test]
    fn wrapping_geometries_are_refused() {
        let d = CpuEmu::nvidia();
        let x = d.upload_tensor(Host::F32(&[0.5; 16])).unwrap();
        let cs = d.upload_tensor(Host::F32(&[1.0; 8])).unwrap();
        let pos = d.upload_tensor(Host::Index(&[0, 1], 2)).unwrap();
        let big = (1usize << 62) + 1;
        for (heads, head_ld, half, ld) in [
            // (heads-1)·head_ld wraps to 0: the row end looks like 2·half.
            (big, 4, 1, 16),
            (2, 1usize << 63, 1, 16),
            // Overlapping heads (head_ld 0) whose launch covers 2^62 threads.
            (big, 0, 1, 16),
            (2, 2, usize::MAX / 2 + 1, 16),
        ] {
            let rope = Op::Rope {
                x: &x,
                pos: &pos,
                cs: &cs,
                n: 1,
                heads,
                half,
                at: Strided { ld, off: 0 },
                head_ld,
                interleaved: false,
            };
            let e = d.op(&rope).err().unwrap_or_else(|| {
                panic!("rope {heads} heads every {head_ld} of {half} pairs passed")
            });
            let _ = e.to_string();
        }
        let copy = Op::CopyCols {
            src: &x,
            dst: &x,
            n: 1,
            heads: big,
            w: 1,
            from: (Strided { ld: 16, off: 0 }, 4),
            to: (Strided { ld: 16, off: 0 }, 4),
        };
        assert!(d.op(&copy).is_err());
        let norm = Op::RmsNorm {
            x: &x,
            w: &x,
            out: &x,
            n: 1,
            h: 4,
            eps: 1e-6,
            input: Strided {
                ld: 16,
                off: usize::MAX - 1,
            },
            output: Strided { ld: 16, off: 0 },
        };
        assert!(d.op(&norm).is_err());
        assert!(d.launches().is_empty(), "{:?}", d.launches());
    }

    /// A bad size, element type or index bound is an error before any launch.
    #[test]
    fn ops_that_would_read_or_write_outside_their_tensors_are_refused() {
        let d = CpuEmu::nvidia();
        let f = |v: &[f32]| d.upload_tensor(Host::F32(v)).unwrap();
        let table = f(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]); // 3 rows of 2
        let out = d.zeros(Elem::F32, 4).unwrap();
        let ok_ids = d.upload_tensor(Host::Index(&[2, 0], 3)).unwrap();
        let embed = |ids, out, n| Op::Embed {
            table: &table,
            ids,
            out,
            n,
            h: 2,
        };
        d.op(&embed(&ok_ids, &out, 2)).unwrap();
        assert_eq!(d.read_f32(&out).unwrap(), [5.0, 6.0, 1.0, 2.0]);
        // An index past its bound is refused at upload; a bound past the table at the op.
        let e = d.upload_tensor(Host::Index(&[3], 3)).err().unwrap();
        assert!(e.to_string().contains("index 3 outside 0..3"), "{e}");
        assert!(d.upload_tensor(Host::Index(&[-1], 3)).is_err());
        let wide = d.upload_tensor(Host::Index(&[0, 1], 4)).unwrap();
        let e = d.op(&embed(&wide, &out, 2)).err().unwrap();
        assert!(e.to_string().contains("indices up to 4"), "{e}");
        // Too few ids, too small an output, an output of the wrong type.
        assert!(d.op(&embed(&ok_ids, &out, 3)).is_err());
        let small = d.zeros(Elem::F32, 3).unwrap();
        assert!(d.op(&embed(&ok_ids, &small, 2)).is_err());
        let half = d.zeros(Elem::Half(Act::Bf16), 4).unwrap();
        assert!(d.op(&embed(&ok_ids, &half, 2)).is_err());
        // Index tensors come from the host only; raw bytes must be whole values.
        assert!(d.zeros(Elem::I32, 4).is_err());
        assert!(d.upload_tensor(Host::Le(Elem::F32, &[0u8; 6])).is_err());
        // A norm row that runs past its stride.
        let x = f(&[1.0; 8]);
        let norm = Op::RmsNorm {
            x: &x,
            w: &table,
            out: &x,
            n: 2,
            h: 4,
            eps: 1e-6,
            input: Strided { ld: 4, off: 1 },
            output: Strided { ld: 4, off: 0 },
        };
        assert!(d.op(&norm).is_err());
        // Attention whose keys do not cover the rows it is asked for.
        let dims = AttendDims {
            m: 1,
            n: 2,
            start: 1,
            diag: 0,
            heads: 1,
            kv_heads: 1,
            dq: 2,
            dv: 2,
            scale: 1.0,
        };
        let rows = d.upload_tensor(Host::Index(&[1], 2)).unwrap();
        let (q, kv) = (f(&[1.0, 0.0]), f(&[0.5; 4]));
        let att = d.zeros(Elem::F32, 2).unwrap();
        let e = d
            .op(&Op::Attend {
                q: &q,
                k0: &kv,
                v0: &kv,
                kd: &kv,
                vd: &kv,
                rows: &rows,
                slots: &rows,
                out: &att,
                dims,
            })
            .err()
            .unwrap();
        assert!(e.to_string().contains("depth-0 keys"), "{e}");
        assert!(
            d.launches().keys().all(|k| k == "kq_embed_rows_f32"),
            "{:?}",
            d.launches()
        );
    }
}
