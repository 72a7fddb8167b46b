//! Timing, apart from compute: [`Bench`] is what `kquant bench gemm` (and nothing else) measures
//! on a device — a W4A16 call on device-resident operands, the device-to-device copy bandwidth
//! that bounds it, and a dense bf16 GEMM with the vendor BLAS for comparison — written once over
//! [`Driver::time`] (events on a GPU, the host clock on the CPU emulation).

use super::dispatch::{Call, Device};
use super::driver::{Driver, Gemm};
use super::tune::Regime;
use super::{check_call, Act, Backend, DeviceW4, Result};

/// A device `kquant bench gemm` can time.
pub trait Bench: Backend {
    /// Seconds per W4A16 call on device-resident activations and output, cycling over `ws`
    /// (several copies of one matrix, so the weights stream from memory, not cache): mean of
    /// `iters` calls after a warm-up, host transfers excluded.
    fn time_w4a16(
        &self,
        ws: &[DeviceW4],
        act: Act,
        m: usize,
        regime: Regime,
        iters: usize,
    ) -> Result<f64>;
    /// Device-to-device copy bandwidth in bytes/s (read + write counted once each: 2·bytes per
    /// copy), copying `bytes` at a time over buffers totalling more than twice the LLC.
    fn copy_bandwidth(&self, bytes: usize, iters: usize) -> Result<f64>;
    /// Seconds per dense bf16 GEMM `[m, k] · [n, k]ᵀ → f32` with the vendor BLAS (the f32
    /// GEMM on the CPU emulation), cycling over `copies` weight matrices.
    fn time_dense_bf16(
        &self,
        n: usize,
        k: usize,
        m: usize,
        copies: usize,
        iters: usize,
    ) -> Result<f64>;
}

impl<D: Driver> Bench for Device<D> {
    fn time_w4a16(
        &self,
        ws: &[DeviceW4],
        act: Act,
        m: usize,
        regime: Regime,
        iters: usize,
    ) -> Result<f64> {
        let Some(first) = ws.first() else {
            return Ok(0.0);
        };
        let bufs = ws
            .iter()
            .map(|w| self.bufs(w))
            .collect::<Result<Vec<_>>>()?;
        check_call(first, m * first.k, m, regime)?;
        let d = self.driver();
        let x = d.htod(&vec![act.from_f32(0.5); m * first.k])?;
        let out = d.alloc(m * first.n * 4)?;
        let mut sc = self.scratch();
        d.time(iters, &mut |i| {
            let j = i % ws.len();
            let c = Call {
                w: &ws[j],
                bufs: bufs[j],
                x: &x,
                act,
                m,
                out: &out,
            };
            self.run_w4a16(&c, regime, &mut sc)
        })
    }

    fn copy_bandwidth(&self, bytes: usize, iters: usize) -> Result<f64> {
        let d = self.driver();
        let count = (2 * d.arch().tune().llc_bytes).div_ceil(bytes.max(1)) + 1;
        let src = (0..count)
            .map(|_| d.alloc(bytes))
            .collect::<Result<Vec<_>>>()?;
        let mut dst = d.alloc(bytes)?;
        let t = d.time(iters, &mut |i| d.copy(&src[i % count], &mut dst))?;
        Ok(2.0 * bytes as f64 / t)
    }

    fn time_dense_bf16(
        &self,
        n: usize,
        k: usize,
        m: usize,
        copies: usize,
        iters: usize,
    ) -> Result<f64> {
        let d = self.driver();
        let ws = (0..copies.max(1))
            .map(|_| d.alloc(n * k * 2))
            .collect::<Result<Vec<_>>>()?;
        let x = d.htod(&vec![Act::Bf16.from_f32(0.5); m * k])?;
        let out = d.alloc(m * n * 4)?;
        let g = Gemm {
            n,
            k,
            m,
            act: Act::Bf16,
        };
        let _turn = self.scratch();
        d.time(iters, &mut |i| {
            // SAFETY: every weight copy holds n·k and x m·k bf16 values, out m·n f32.
            unsafe { d.gemm(g, &ws[i % ws.len()], &x, &out) }
        })
    }
}
