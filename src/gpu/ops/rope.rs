//! Rotary embedding in place (`kq_rope`, [`Rope`]): its checks, its launch (one thread per
//! rotated pair) and its CPU replay.

use super::step::{elementwise, holds, indexes, layout, size, Bufs, DeviceOp, Launch};
use super::tensor::{DevTensor, Strided};
use crate::gpu::emu_launch::{at, HostBuf, Replay};
use crate::gpu::source::{args, Kernel};
use crate::gpu::{Elem, Result};

/// Rotary embedding in place on `heads` heads of `2·half` values, `head_ld` apart, from column
/// `at.off` of rows of `at.ld`; row `r` at position `pos[r]` of the table `cs [positions, half,
/// 2]`; pairs `(i, i + half)` (NeoX) or `(2i, 2i + 1)` (interleaved).
pub struct Rope<'a> {
    pub x: &'a DevTensor,
    pub pos: &'a DevTensor,
    pub cs: &'a DevTensor,
    pub n: usize,
    pub heads: usize,
    pub half: usize,
    pub at: Strided,
    pub head_ld: usize,
    pub interleaved: bool,
}

impl<'a> DeviceOp<'a> for Rope<'a> {
    fn check(&self) -> Result<()> {
        let (x, pos, cs) = (self.x, self.pos, self.cs);
        let (n, heads, half, at, head_ld) = (self.n, self.heads, self.half, self.at, self.head_ld);
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
        holds("rope x", x, Elem::F32, size("rows", &[&[n, at.ld]])?)?;
        // The launch's thread count (heads may overlap: `head_ld` is not bounded below).
        size("rope threads", &[&[n, heads, half]])?;
        if half == 0 || !cs.len().is_multiple_of(size("rope pair", &[&[2, half]])?) {
            return Err(layout(format!("rope table of {} values", cs.len())));
        }
        holds("rope table", cs, Elem::F32, 0)?;
        indexes("positions", pos, n, cs.len() / (2 * half))
    }

    fn launch<B: 'a>(&self, b: &Bufs<'a, '_, B>, _warp: u32) -> Result<Launch<'a, B>> {
        let (g, bl) = elementwise(self.n * self.heads * self.half);
        let k = Kernel::Rope(args::Rope {
            x: b(self.x)?,
            pos: b(self.pos)?,
            cs: b(self.cs)?,
            n: self.n,
            heads: self.heads,
            half: self.half,
            ld: self.at.ld,
            off: self.at.off,
            head_ld: self.head_ld,
            interleaved: usize::from(self.interleaved),
        });
        Ok((k, g, bl))
    }
}

impl Rope<'_> {
    /// `kq_rope` on the CPU.
    pub fn replay(k: &args::Rope<'_, HostBuf>, r: &Replay<'_>) -> Result<()> {
        r.threads_cover(k.n * k.heads * k.half)?;
        let mut y = k.x.read::<f32>(k.n * k.ld)?;
        let p = k.pos.read::<i32>(k.n)?;
        rope(&mut y, &p, &k.cs.all::<f32>(), k)?;
        k.x.write(&y)
    }
}

/// `kq_rope` in place on `x`, at the geometry of `g`.
fn rope<B>(x: &mut [f32], pos: &[i32], cs: &[f32], g: &args::Rope<'_, B>) -> Result<()> {
    let half = g.half;
    let positions = cs.len() / (2 * half).max(1);
    for r in 0..g.n {
        let p = at("rope position", pos[r], positions)?;
        for hh in 0..g.heads {
            let hp = &mut x[r * g.ld + g.off + hh * g.head_ld..][..2 * half];
            for j in 0..half {
                let (ia, ib) = if g.interleaved != 0 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_positions_are_errors() {
        let mut x = [1.0, 0.0];
        let (xb, pb, cb) = ((), (), ());
        let g = args::Rope {
            x: &xb,
            pos: &pb,
            cs: &cb,
            n: 1,
            heads: 1,
            half: 1,
            ld: 2,
            off: 0,
            head_ld: 2,
            interleaved: 0,
        };
        assert!(rope(&mut x, &[1], &[1.0, 0.0], &g).is_err());
    }
}
