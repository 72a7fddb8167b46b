//! Attention of query rows over a replay's keys (`kq_attend`, [`Attend`]): its checks, its
//! launch (one warp per (row, head)) and its CPU replay, in the kernel's order — per-lane strided
//! dot products, the warp butterfly, the online softmax.

use super::step::{holds, indexes, int, layout, size, Bufs, DeviceOp, Launch};
use super::tensor::DevTensor;
use crate::gpu::emu_launch::{at, HostBuf, Replay};
use crate::gpu::source::{args, Kernel, ATT_VALUES_PER_LANE};
use crate::gpu::{Elem, GpuError, Result};

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

/// Attention of query rows `rows` over a replay's keys (`kq_attend`).
pub struct Attend<'a> {
    pub q: &'a DevTensor,
    pub k0: &'a DevTensor,
    pub v0: &'a DevTensor,
    pub kd: &'a DevTensor,
    pub vd: &'a DevTensor,
    pub rows: &'a DevTensor,
    pub slots: &'a DevTensor,
    pub out: &'a DevTensor,
    pub dims: AttendDims,
}

impl<'a> DeviceOp<'a> for Attend<'a> {
    fn check(&self) -> Result<()> {
        let f = Elem::F32;
        let d = self.dims;
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
        let queries = size("m·heads·dq", &[&[d.m, d.heads, d.dq]])?;
        holds("queries", self.q, f, queries)?;
        indexes("query rows", self.rows, d.m, d.n)?;
        // Row i attends depth-0 keys 0..=start + i, so k0 holds start + n rows.
        let keys = size("keys", &[&[d.start], &[d.n]])?;
        holds("depth-0 keys", self.k0, f, size("keys", &[&[keys, kw]])?)?;
        holds(
            "depth-0 values",
            self.v0,
            f,
            size("values", &[&[keys, vw]])?,
        )?;
        let diag_keys = size("diag keys", &[&[d.diag, d.n, kw]])?;
        holds("diagonal keys", self.kd, f, diag_keys)?;
        let diag_values = size("diag values", &[&[d.diag, d.n, vw]])?;
        holds("diagonal values", self.vd, f, diag_values)?;
        if d.diag > 0 {
            indexes("slots", self.slots, size("slots", &[&[d.diag, d.n]])?, d.n)?;
        }
        let outs = size("m·heads·dv", &[&[d.m, d.heads, d.dv]])?;
        holds("attention out", self.out, f, outs)
    }

    fn launch<B: 'a>(&self, b: &Bufs<'a, '_, B>, warp: u32) -> Result<Launch<'a, B>> {
        let d = self.dims;
        let lanes = warp;
        if d.dv > ATT_VALUES_PER_LANE * lanes as usize {
            return Err(GpuError::Unsupported(
                "attention value width",
                format!("{} > {ATT_VALUES_PER_LANE} per lane × {lanes} lanes", d.dv),
            ));
        }
        let k = Kernel::Attend(args::Attend {
            q: b(self.q)?,
            k0: b(self.k0)?,
            v0: b(self.v0)?,
            kd: b(self.kd)?,
            vd: b(self.vd)?,
            rows: b(self.rows)?,
            slots: b(self.slots)?,
            out: b(self.out)?,
            m: d.m,
            n: d.n,
            start: d.start,
            diag: d.diag,
            heads: d.heads,
            kv_heads: d.kv_heads,
            dq: d.dq,
            dv: d.dv,
            scale_bits: d.scale.to_bits() as usize,
        });
        // Rows on x (up to 2^31 − 1 blocks), heads on y (up to 65535).
        if d.heads > 65535 {
            return Err(GpuError::Unsupported(
                "attention heads",
                format!("{} (a grid's y holds 65535)", d.heads),
            ));
        }
        let grid = (int("m", d.m)? as u32, d.heads as u32, 1);
        Ok((k, grid, (lanes, 1, 1)))
    }
}

/// `kq_attend`'s operands, read back from the host.
struct Operands<'a> {
    q: &'a [f32],
    k0: &'a [f32],
    v0: &'a [f32],
    kd: &'a [f32],
    vd: &'a [f32],
    rows: &'a [i32],
    slots: &'a [i32],
    dims: AttendDims,
}

impl Attend<'_> {
    /// `kq_attend` on the CPU.
    pub fn replay(k: &args::Attend<'_, HostBuf>, r: &Replay<'_>) -> Result<()> {
        r.warp()?;
        r.rows_cover(k.m)?;
        r.covers("heads", r.grid.1 as usize, k.heads)?;
        let dims = AttendDims {
            m: k.m,
            n: k.n,
            start: k.start,
            diag: k.diag,
            heads: k.heads,
            kv_heads: k.kv_heads,
            dq: k.dq,
            dv: k.dv,
            scale: f32::from_bits(k.scale_bits as u32),
        };
        let (m, n, diag) = (k.m, k.n, k.diag);
        let (kw, vw) = (k.kv_heads * k.dq, k.kv_heads * k.dv);
        let a = Operands {
            q: &k.q.read::<f32>(m * k.heads * k.dq)?,
            k0: &k.k0.read::<f32>((k.start + n) * kw)?,
            v0: &k.v0.read::<f32>((k.start + n) * vw)?,
            kd: &k.kd.read::<f32>(diag * n * kw)?,
            vd: &k.vd.read::<f32>(diag * n * vw)?,
            rows: &k.rows.read::<i32>(m)?,
            slots: &k.slots.read::<i32>(if diag > 0 { diag * n } else { 0 })?,
            dims,
        };
        k.out.write(&attend(&a, r.lanes())?)
    }
}

/// `kq_attend` with `lanes` lanes per warp: `[m, heads, dv]`.
fn attend(a: &Operands<'_>, lanes: usize) -> Result<Vec<f32>> {
    let d = a.dims;
    let (kw, vw) = (d.kv_heads * d.dq, d.kv_heads * d.dv);
    let group = d.heads / d.kv_heads;
    let mut out = vec![0f32; d.m * d.heads * d.dv];
    for r in 0..d.m {
        let i = at("query row", a.rows[r], d.n)?;
        let t = d.start + i;
        for head in 0..d.heads {
            let kvh = head / group;
            let qh = &a.q[(r * d.heads + head) * d.dq..][..d.dq];
            let (mut mx, mut l) = (f32::NEG_INFINITY, 0f32);
            let mut acc = vec![0f32; d.dv];
            for e in 0..=t + d.diag {
                let (kr, vr) = if e <= t {
                    (&a.k0[e * kw..], &a.v0[e * vw..])
                } else {
                    let dd = e - t - 1;
                    let s = at("slot", a.slots[dd * d.n + i], d.n)?;
                    (&a.kd[(dd * d.n + s) * kw..], &a.vd[(dd * d.n + s) * vw..])
                };
                let (kr, vr) = (&kr[kvh * d.dq..][..d.dq], &vr[kvh * d.dv..][..d.dv]);
                let sc = warp_dot(qh, kr, lanes) * d.scale;
                let mn = mx.max(sc);
                let (corr, pe) = ((mx - mn).exp(), (sc - mn).exp());
                l = l * corr + pe;
                for (x, v) in acc.iter_mut().zip(vr) {
                    *x = *x * corr + pe * v;
                }
                mx = mn;
            }
            let o = &mut out[(r * d.heads + head) * d.dv..][..d.dv];
            for (y, x) in o.iter_mut().zip(&acc) {
                *y = x / l;
            }
        }
    }
    Ok(out)
}

/// `q · k` as one warp of `lanes` takes it: per-lane strided partial sums, then the butterfly
/// (every lane ends with the same value: each step adds the same two numbers in either order).
fn warp_dot(q: &[f32], k: &[f32], lanes: usize) -> f32 {
    let mut p: Vec<f32> = (0..lanes)
        .map(|l| {
            (l..q.len())
                .step_by(lanes)
                .fold(0f32, |acc, j| acc + q[j] * k[j])
        })
        .collect();
    let mut o = lanes / 2;
    while o > 0 {
        p = (0..lanes).map(|l| p[l] + p[l ^ o]).collect();
        o /= 2;
    }
    p[0]
}
