//! The machine's own f32 FMA peak, measured: every thread runs independent chains of fused
//! multiply-adds in the widest vectors the CPU has (AVX-512F, else AVX2 + FMA, else scalar
//! `mul_add`, chosen at run time), enough chains to cover the FMA latency on two pipes. `kquant
//! bench replay` reports the replay's GEMM FLOP/s as a share of it, measured in the same run.

use std::hint::black_box;
use std::time::Instant;

/// The f32 FMA peak: what ran and how fast.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Peak {
    /// The instruction set the chains ran in (`avx512f`, `avx2+fma`, `scalar`).
    pub isa: &'static str,
    pub threads: usize,
    /// Floating-point operations per second (an FMA counts two), all threads together.
    pub flops: f64,
}

/// Independent accumulator chains per thread: FMA latency (4 cycles) × 2 pipes, with room.
const CHAINS: usize = 12;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn chains_avx512(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_set1_ps(0.5); CHAINS];
    let a = _mm512_set1_ps(black_box(0.999_999));
    let b = _mm512_set1_ps(black_box(1e-7));
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm512_fmadd_ps(*x, a, b);
        }
    }
    let mut s = _mm512_setzero_ps();
    for x in acc {
        s = _mm512_add_ps(s, x);
    }
    _mm512_reduce_add_ps(s)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chains_avx2(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_set1_ps(0.5); CHAINS];
    let a = _mm256_set1_ps(black_box(0.999_999));
    let b = _mm256_set1_ps(black_box(1e-7));
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    let mut out = [0f32; 8];
    let mut s = _mm256_setzero_ps();
    for x in acc {
        s = _mm256_add_ps(s, x);
    }
    _mm256_storeu_ps(out.as_mut_ptr(), s);
    out.iter().sum()
}

fn chains_scalar(iters: u64) -> f32 {
    let mut acc = [0.5f32; CHAINS];
    let (a, b) = (black_box(0.999_999f32), black_box(1e-7f32));
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = x.mul_add(a, b);
        }
    }
    acc.iter().sum()
}

/// The widest chains this CPU runs: name, lanes, and the loop.
fn kernel() -> (&'static str, u64, fn(u64) -> f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return ("avx512f", 16, |n| unsafe { chains_avx512(n) });
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            return ("avx2+fma", 8, |n| unsafe { chains_avx2(n) });
        }
    }
    ("scalar", 1, chains_scalar)
}

/// Measure the peak on `threads` threads for about `seconds` (the best of three rounds, each
/// thread timing its own chains).
pub fn measure(threads: usize, seconds: f64) -> Peak {
    let (isa, lanes, f) = kernel();
    let threads = threads.max(1);
    // Calibrate the iteration count on one thread.
    let mut iters = 1u64 << 16;
    loop {
        let t = Instant::now();
        black_box(f(iters));
        let s = t.elapsed().as_secs_f64();
        if s > seconds / 6.0 || iters > 1 << 36 {
            iters = ((iters as f64) * (seconds / 3.0) / s.max(1e-9)).max(1.0) as u64;
            break;
        }
        iters *= 4;
    }
    let mut best = 0f64;
    for _ in 0..3 {
        let t = Instant::now();
        std::thread::scope(|sc| {
            for _ in 0..threads {
                sc.spawn(|| black_box(f(iters)));
            }
        });
        let s = t.elapsed().as_secs_f64();
        let flops = (threads as u64 * iters * CHAINS as u64 * lanes * 2) as f64 / s;
        best = best.max(flops);
    }
    Peak {
        isa,
        threads,
        flops: best,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The measurement runs and gives a plausible figure: at least a scalar core's worth
    /// (≥ 0.5 GFLOP/s) and below a few TFLOP/s per thread.
    #[test]
    fn peak_is_measured() {
        let p = measure(1, 0.05);
        assert!(p.flops > 5e8 && p.flops < 5e12, "{p:?}");
    }
}
