//! RMSNorm between strided rows (`kq_rms_norm`, [`RmsNorm`]): its checks, its launch (one block
//! of `KQ_OPS_THREADS` per row) and its CPU replay, which sums in the kernel's order (per-thread
//! strided sums, then the shared-memory tree: [`block_sum`]).

use super::step::{holds, layout, size, Bufs, DeviceOp, Launch};
use super::tensor::{DevTensor, Strided};
use crate::gpu::emu_launch::{HostBuf, Replay};
use crate::gpu::source::{args, Kernel, OPS_THREADS};
use crate::gpu::{Elem, Result};

/// RMSNorm of `n` rows of `h` (`w [h]`, epsilon `eps`), read from and written to strided rows
/// (in place when `x` and `out` are the same tensor at the same stride).
pub struct RmsNorm<'a> {
    pub x: &'a DevTensor,
    pub w: &'a DevTensor,
    pub out: &'a DevTensor,
    pub n: usize,
    pub h: usize,
    pub eps: f32,
    pub input: Strided,
    pub output: Strided,
}

impl<'a> DeviceOp<'a> for RmsNorm<'a> {
    fn check(&self) -> Result<()> {
        let (x, w, out, n, h) = (self.x, self.w, self.out, self.n, self.h);
        let (input, output) = (self.input, self.output);
        for (what, t, s) in [("norm in", x, input), ("norm out", out, output)] {
            if size("norm row end", &[&[s.off], &[h]])? > s.ld {
                return Err(layout(format!(
                    "{what}: {h} from {} in rows of {}",
                    s.off, s.ld
                )));
            }
            holds(what, t, Elem::F32, size("rows", &[&[n, s.ld]])?)?;
        }
        holds("norm weight", w, Elem::F32, h)
    }

    fn launch<B: 'a>(&self, b: &Bufs<'a, '_, B>, _warp: u32) -> Result<Launch<'a, B>> {
        let (input, output) = (self.input, self.output);
        let k = Kernel::RmsNorm(args::RmsNorm {
            x: b(self.x)?,
            w: b(self.w)?,
            out: b(self.out)?,
            n: self.n,
            h: self.h,
            in_ld: input.ld,
            in_off: input.off,
            out_ld: output.ld,
            out_off: output.off,
            eps_bits: self.eps.to_bits() as usize,
        });
        Ok((k, (self.n.max(1) as u32, 1, 1), (OPS_THREADS, 1, 1)))
    }
}

impl RmsNorm<'_> {
    /// `kq_rms_norm` on the CPU, into the strided rows of `out` (other columns kept).
    pub fn replay(k: &args::RmsNorm<'_, HostBuf>, r: &Replay<'_>) -> Result<()> {
        if r.block.0 != OPS_THREADS {
            return Err(r.err(format_args!("block {:?}", r.block)));
        }
        let (n, h) = (k.n, k.h);
        r.rows_cover(n)?;
        let xs = k.x.read::<f32>(n * k.in_ld)?;
        let mut y = k.out.read::<f32>(n * k.out_ld)?;
        let w = k.w.read::<f32>(h)?;
        let eps = f32::from_bits(k.eps_bits as u32);
        let threads = OPS_THREADS as usize;
        for row in 0..n {
            let xr = &xs[row * k.in_ld + k.in_off..][..h];
            let ss = block_sum(|j| xr[j] * xr[j], h, threads);
            let inv = 1.0 / (ss / h as f32 + eps).sqrt();
            let o = &mut y[row * k.out_ld + k.out_off..][..h];
            for j in 0..h {
                o[j] = xr[j] * inv * w[j];
            }
        }
        k.out.write(&y)
    }
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
}
