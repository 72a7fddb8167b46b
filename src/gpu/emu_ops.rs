//! The CPU replay of the step kernels (`kernels/ops.cu`), for the emulation ([`super::emu`]):
//! each computes what its kernel computes, with the reductions in the kernel's order —
//! `kq_rms_norm`'s per-thread strided sums and shared-memory tree, `kq_attend`'s per-lane
//! strided dot products, warp butterfly and online softmax. Plain slices in, values out; an
//! index outside its table is an error (the launcher's checks make it unreachable).

use super::source::OPS_THREADS;
use super::{Act, GpuError, Result};

fn oob(what: &str, i: i64, len: usize) -> GpuError {
    GpuError::Backend {
        backend: "cpu",
        msg: format!("{what}: index {i} outside 0..{len}"),
    }
}

/// `idx` as a usize below `len`.
fn at(what: &str, idx: i32, len: usize) -> Result<usize> {
    usize::try_from(idx)
        .ok()
        .filter(|&i| i < len)
        .ok_or_else(|| oob(what, idx as i64, len))
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

/// The sum of `v` as `threads` threads take it: thread t sums `v[t], v[t + threads], …` in
/// order, then the shared-memory tree halves the threads (`s[t] += s[t + half]`).
pub fn block_sum(v: impl Fn(usize) -> f32, len: usize, threads: usize) -> f32 {
    let mut s: Vec<f32> = (0..threads)
        .map(|t| (t..len).step_by(threads).fold(0f32, |a, j| a + v(j)))
        .collect();
    let mut half = threads / 2;
    while half > 0 {
        for t in 0..half {
            s[t] += s[t + half];
        }
        half /= 2;
    }
    s[0]
}

/// Row strides of `kq_rms_norm`: `(ld, off)` of its input and output.
pub struct NormRows {
    pub n: usize,
    pub h: usize,
    pub input: (usize, usize),
    pub output: (usize, usize),
    pub eps: f32,
}

/// `kq_rms_norm` over `x`, into the strided rows of `out` (other columns kept).
pub fn rms_norm(x: &[f32], w: &[f32], out: &mut [f32], r: &NormRows) {
    let threads = OPS_THREADS as usize;
    for row in 0..r.n {
        let xr = &x[row * r.input.0 + r.input.1..][..r.h];
        let ss = block_sum(|j| xr[j] * xr[j], r.h, threads);
        let inv = 1.0 / (ss / r.h as f32 + r.eps).sqrt();
        let o = &mut out[row * r.output.0 + r.output.1..][..r.h];
        for j in 0..r.h {
            o[j] = xr[j] * inv * w[j];
        }
    }
}

/// `kq_rope`'s geometry: `heads` heads of `2·half`, `head_ld` apart, from column `off` of rows
/// of `ld`; NeoX or interleaved pairs.
pub struct RopeAt {
    pub n: usize,
    pub heads: usize,
    pub half: usize,
    pub ld: usize,
    pub off: usize,
    pub head_ld: usize,
    pub interleaved: bool,
}

/// `kq_rope` in place.
pub fn rope(x: &mut [f32], pos: &[i32], cs: &[f32], g: &RopeAt) -> Result<()> {
    let half = g.half;
    let positions = cs.len() / (2 * half).max(1);
    for r in 0..g.n {
        let p = at("rope position", pos[r], positions)?;
        for hh in 0..g.heads {
            let hp = &mut x[r * g.ld + g.off + hh * g.head_ld..][..2 * half];
            for j in 0..half {
                let (ia, ib) = if g.interleaved {
                    (2 * j, 2 * j + 1)
                } else {
                    (j, j + half)
                };
                let (c, s) = (cs[(p * half + j) * 2], cs[(p * half + j) * 2 + 1]);
                let (a, b) = (hp[ia], hp[ib]);
                hp[ia] = a * c - b * s;
                hp[ib] = b * c + a * s;
            }
        }
    }
    Ok(())
}

/// `kq_copy_cols` into `dst`: `(n, heads, w)`, then the source's and the output's
/// `(ld, off, head stride)`.
pub fn copy_cols(
    src: &[f32],
    dst: &mut [f32],
    (n, heads, w): (usize, usize, usize),
    (src_ld, src_off, src_hs): (usize, usize, usize),
    (dst_ld, dst_off, dst_hs): (usize, usize, usize),
) {
    for r in 0..n {
        for h in 0..heads {
            let s = &src[r * src_ld + src_off + h * src_hs..][..w];
            dst[r * dst_ld + dst_off + h * dst_hs..][..w].copy_from_slice(s);
        }
    }
}

/// `kq_attend`'s operands.
pub struct Attend<'a> {
    pub q: &'a [f32],
    pub k0: &'a [f32],
    pub v0: &'a [f32],
    pub kd: &'a [f32],
    pub vd: &'a [f32],
    pub rows: &'a [i32],
    pub slots: &'a [i32],
    pub dims: super::ops::AttendDims,
}

/// `kq_attend` with `lanes` lanes per warp: `[m, heads, dv]`.
pub fn attend(a: &Attend<'_>, lanes: usize) -> Result<Vec<f32>> {
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
                // Per-lane strided partial sums, then the butterfly (every lane ends with the
                // same value: each step adds the same two numbers in either order).
                let mut p: Vec<f32> = (0..lanes)
                    .map(|l| {
                        (l..d.dq)
                            .step_by(lanes)
                            .fold(0f32, |acc, j| acc + qh[j] * kr[j])
                    })
                    .collect();
                let mut o = lanes / 2;
                while o > 0 {
                    p = (0..lanes).map(|l| p[l] + p[l ^ o]).collect();
                    o /= 2;
                }
                let sc = p[0] * d.scale;
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

/// `kq_silu_mul`.
pub fn silu_mul(g: &[f32], u: &[f32]) -> Vec<f32> {
    g.iter()
        .zip(u)
        .map(|(&a, &b)| a / (1.0 + (-a).exp()) * b)
        .collect()
}

/// `kq_to_act_*`: round to nearest even, as `cvt.rn` (the half crate's conversion).
pub fn to_act(x: &[f32], act: Act) -> Vec<u16> {
    x.iter().map(|&v| act.from_f32(v)).collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The block and warp orders sum exactly what a plain sum does on values whose sums are
    /// exact, and stay within a few ulps otherwise.
    #[test]
    fn reduction_orders_are_sums() {
        let v: Vec<f32> = (0..1000).map(|i| (i % 7) as f32).collect();
        let plain: f32 = v.iter().sum();
        for threads in [1, 32, 256] {
            assert_eq!(block_sum(|j| v[j], v.len(), threads), plain);
        }
        let w: Vec<f32> = (0..777).map(|i| ((i * 37) % 101) as f32 * 0.013).collect();
        let plain: f64 = w.iter().map(|&x| x as f64).sum();
        let got = block_sum(|j| w[j], w.len(), 256) as f64;
        assert!((got - plain).abs() < 1e-5 * plain, "{got} vs {plain}");
    }

    #[test]
    fn out_of_range_indices_are_errors() {
        assert!(embed(Table::F32(&[1.0, 2.0]), &[2], 1).is_err());
        assert!(embed(Table::F32(&[1.0, 2.0]), &[-1], 1).is_err());
        assert_eq!(
            embed(Table::F32(&[1.0, 2.0]), &[1, 0], 1).unwrap(),
            [2.0, 1.0]
        );
        assert!(gather(&[1.0, 2.0], &[0, 2], 1).is_err());
        let mut x = [1.0, 0.0];
        let g = RopeAt {
            n: 1,
            heads: 1,
            half: 1,
            ld: 2,
            off: 0,
            head_ld: 2,
            interleaved: false,
        };
        assert!(rope(&mut x, &[1], &[1.0, 0.0], &g).is_err());
    }
}
