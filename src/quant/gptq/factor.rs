//! The fast Hessian factor: dead columns, damping, and `U` upper with `H⁻¹ = Uᵀ U`, in f32 with
//! faer's blocked, rayon-parallel Cholesky and triangular inverse.
//!
//! The references compute `U` as `cholesky(cholesky_inverse(cholesky(H)), upper=True)`: three
//! `n³/3` factorizations/products plus a triangular inverse (≈ `4n³/3` flops). The same `U`
//! comes from one Cholesky and one triangular inverse (≈ `2n³/3`), half the work, which matters
//! at `n = 21504` (the Kimi draft's `fc`): with `J` the order-reversing permutation, factor
//! `J H J = M Mᵀ` (M lower); then `H = R Rᵀ` with `R = J M J` upper, so
//! `H⁻¹ = R⁻ᵀ R⁻¹ = Uᵀ U` with `U = R⁻¹ = J M⁻¹ J`, upper with a positive diagonal, hence the
//! unique upper Cholesky factor of `H⁻¹`. `J H J` of a row-major buffer is the buffer reversed;
//! `J M⁻¹ J` is written by faer straight into a reversed view of the output.
//!
//! The Cholesky retry (Quark's): faer factors in place and, on a failure, has overwritten part
//! of both triangles (it zeroes the strict upper part of the columns it has processed), so the
//! damped `J H J` is first copied into the buffer that later receives `U` (needed anyway: peak
//! memory stays two `n²` f32) and each retry starts again from that copy with more damping.

use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::cholesky::llt::factor::{cholesky_in_place, cholesky_in_place_scratch};
use faer::linalg::triangular_inverse::invert_lower_triangular;
use faer::{MatMut, MatRef, Par};
use rayon::prelude::*;

use super::api::{Config, GptqError, Report};

/// Dead columns (`H[d, d] == 0`): `H[d, d] = 1` and `W[:, d] = 0` (row-major `[rows, n]`).
/// Returns how many.
pub fn fix_dead(h: &mut [f32], w: &mut [f32], rows: usize, n: usize) -> usize {
    let dead: Vec<usize> = (0..n).filter(|&d| h[d * n + d] == 0.0).collect();
    for &d in &dead {
        h[d * n + d] = 1.0;
        for r in 0..rows {
            w[r * n + d] = 0.0;
        }
    }
    dead.len()
}

/// In place of `h` (row-major `[n, n]`, symmetric): `M` with `J H J = M Mᵀ` in the lower
/// triangle of `h`'s column-major view. `Err(())` if a pivot is not positive; then only that
/// lower triangle has been written.
fn cholesky(h: &mut [f32], n: usize, par: Par) -> Result<(), ()> {
    let mut mem = MemBuffer::new(cholesky_in_place_scratch::<f32>(n, par, Default::default()));
    let a = MatMut::from_column_major_slice_mut(h, n, n);
    cholesky_in_place(
        a,
        Default::default(),
        par,
        MemStack::new(&mut mem),
        Default::default(),
    )
    .map(|_| ())
    .map_err(|_| ())
}

/// Steps 3–4 on the permuted, dead-fixed Hessian `h` (clobbered): damping, then `U` upper
/// (row-major `[n, n]`, its strict lower triangle zero) with `(H + damp·I)⁻¹ = Uᵀ U`, retrying
/// the Cholesky as Quark does. The report's `dead` is left 0 for the caller.
pub fn upper_inverse_factor(
    h: &mut [f32],
    n: usize,
    cfg: &Config,
) -> Result<(Vec<f32>, Report), GptqError> {
    let par = Par::rayon(0);
    let mean = (0..n).map(|i| h[i * n + i] as f64).sum::<f64>() / n as f64;
    let damp = cfg.damp_frac * mean;
    for i in 0..n {
        h[i * n + i] = (h[i * n + i] as f64 + damp) as f32;
    }
    let mut report = Report {
        dead: 0,
        damp,
        extra_damp: 0.0,
        retries: 0,
    };
    // J H J: reversing a row-major square reverses both axes.
    h.reverse();
    // The copy a failed Cholesky restarts from, later overwritten by U.
    let mut u = h.to_vec();
    if cholesky(h, n, par).is_err() {
        let mean_abs = (0..n).map(|i| u[i * n + i].abs() as f64).sum::<f64>() / n as f64;
        let mut extra = damp.abs().max(mean_abs * 1e-6).max(f32::EPSILON as f64);
        let mut ok = false;
        for attempt in 1..=cfg.retries {
            h.copy_from_slice(&u);
            for i in 0..n {
                h[i * n + i] = (h[i * n + i] as f64 + extra) as f32;
            }
            if cholesky(h, n, par).is_ok() {
                report.extra_damp = extra;
                report.retries = attempt;
                ok = true;
                break;
            }
            if attempt < cfg.retries {
                extra *= 10.0;
            }
        }
        if !ok {
            return Err(GptqError::NotPositiveDefinite {
                cols: n,
                damp,
                extra_damp: if cfg.retries == 0 { 0.0 } else { extra },
                retries: cfg.retries,
            });
        }
    }
    let m = MatRef::from_column_major_slice(h, n, n);
    {
        // U = J M⁻¹ J: write M⁻¹(a, b) at row-major (n−1−a, n−1−b).
        let dst = MatMut::from_row_major_slice_mut(&mut u, n, n)
            .reverse_rows_and_cols_mut()
            .as_dyn_stride_mut();
        invert_lower_triangular(dst, m, par);
    }
    // faer writes only the triangle it computes; clear the copy's rest (U's strict lower part).
    u.par_chunks_mut(n)
        .enumerate()
        .for_each(|(i, row)| row[..i].fill(0.0));
    Ok((u, report))
}
