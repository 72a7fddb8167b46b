//! Times kquant's GPTQ fast path on a random layer of a real draft's shape (docs/performance.md,
//! "GPTQ"): the Hessian factor (`U` upper with `H⁻¹ = Uᵀ U`, faer) and the sweep, separately.
//!
//!     cargo run --release -j 1 --example gptq_bench -- COLS ROWS [TOKENS]
//!
//! e.g. `21504 7168` (the Kimi draft's `fc`), `7168 7168`. ROWS 0 times the factor alone. The
//! Hessian is `(2/N)·XᵀX` of `TOKENS` (default 4096) random correlated inputs, built with faer
//! (not timed as GPTQ: the calibration accumulates it).

use std::time::Instant;

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use kquant::io::Dtype;
use kquant::quant::compressed_tensors::ct_scale;
use kquant::quant::gptq::{factor, order, sweep, Config, Grid, Layer};

/// xorshift64 → roughly normal values (sum of 4 uniforms, centred).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        let mut s = 0.0;
        for _ in 0..4 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            s += (self.0 >> 40) as f32 / (1u64 << 24) as f32;
        }
        (s - 2.0) * 1.7
    }
}

fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().expect("COLS ROWS [TOKENS]"))
        .collect();
    let (cols, rows) = (a[0], a[1]);
    let tokens = a.get(2).copied().unwrap_or(4096);
    let threads = rayon::current_num_threads();
    let mut rng = Rng(0x9e3779b97f4a7c15);

    let t = Instant::now();
    let cscale: Vec<f32> = (0..cols).map(|_| (rng.next() * 0.5).exp()).collect();
    let x: Vec<f32> = (0..tokens * cols)
        .map(|i| rng.next() * cscale[i % cols])
        .collect();
    let mut h = vec![0f32; cols * cols];
    let xm = MatRef::from_row_major_slice(&x, tokens, cols);
    matmul(
        MatMut::from_row_major_slice_mut(&mut h, cols, cols),
        Accum::Replace,
        xm.transpose(),
        xm,
        2.0 / tokens as f32,
        Par::rayon(0),
    );
    drop(x);
    println!(
        "H = (2/N)·XᵀX, {cols}² from {tokens} tokens: {:.1} s (setup, not GPTQ)",
        t.elapsed().as_secs_f64()
    );

    let cfg = Config::default();
    let w: Vec<f32> = (0..rows * cols).map(|_| rng.next() * 0.02).collect();
    let scales: Vec<f32> = w
        .chunks_exact(cols)
        .map(|r| ct_scale(r, Dtype::BF16))
        .collect();
    let layer = Layer {
        weight: &w,
        rows,
        cols,
        scales: &scales,
        group: cols,
        grid: Grid::int4(Dtype::BF16),
    };

    let t = Instant::now();
    let perm = order::descending_diag(cols, |i| h[i * cols + i] as f64);
    order::permute_square(&mut h, cols, &perm);
    let mut wp = order::permute_columns(&w, rows, cols, &perm);
    factor::fix_dead(&mut h, &mut wp, rows, cols);
    let t_order = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let (u, report) = factor::upper_inverse_factor(&mut h, cols, &cfg).expect("factor");
    let t_factor = t.elapsed().as_secs_f64();
    drop(h);
    println!(
        "act-order permutation: {t_order:.1} s; factor (Cholesky + triangular inverse, f32, {threads} threads): {t_factor:.1} s ({:.0} GFLOP/s at 2n³/3), retries {}",
        2.0 * (cols as f64).powi(3) / 3.0 / t_factor / 1e9,
        report.retries
    );
    if rows > 0 {
        let t = Instant::now();
        let (codes, loss) = sweep::run(&layer, &mut wp, &u, &perm, cfg.block_size);
        let t_sweep = t.elapsed().as_secs_f64();
        println!(
            "sweep {rows} x {cols}: {t_sweep:.1} s ({:.0} GFLOP/s at 2·rows·cols²/2); total GPTQ {:.1} s; loss {:.4e}, codes {}",
            (rows as f64) * (cols as f64).powi(2) / t_sweep / 1e9,
            t_order + t_factor + t_sweep,
            loss.iter().sum::<f64>(),
            codes.len()
        );
    }
}
