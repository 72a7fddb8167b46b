//! The fast sweep (f32): block by block, the columns inside a block one at a time with their
//! error fed into the rest of the block, then the columns after the block updated at once by
//! `W[:, after] -= E · U[block, after]`.
//!
//! Rows never interact in the sweep (the scales are fixed, the feedback runs along a row), so
//! the in-block part runs in parallel over chunks of rows (rayon), each row on its own, and the
//! inter-block update is one matrix product (faer's f32 GEMM, parallel). That product is the
//! bulk of the work: `rows · cols²` multiply-adds over the whole sweep.

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

use super::api::Layer;

/// Rows per parallel task of the in-block sweep.
const ROWS_PER_TASK: usize = 16;

/// The sweep over `w` (row-major `[rows, n]`, columns already in `perm` order, dead columns
/// zeroed; clobbered) with `u` (row-major upper `[n, n]`). Returns the codes in the original
/// column order and the loss per row.
pub fn run(
    layer: &Layer,
    w: &mut [f32],
    u: &[f32],
    perm: &[usize],
    block_size: usize,
) -> (Vec<i8>, Vec<f64>) {
    let (rows, n, grid) = (layer.rows, layer.cols, layer.grid);
    let groups = n / layer.group;
    // the scale column of each processed column
    let gidx: Vec<usize> = perm.iter().map(|&p| p / layer.group).collect();
    let mut codes = vec![0i8; rows * n];
    let mut loss = vec![0f64; rows];
    let mut err = vec![0f32; rows * block_size];
    let mut i1 = 0;
    while i1 < n {
        let i2 = (i1 + block_size).min(n);
        let count = i2 - i1;
        let err = &mut err[..rows * count];
        w.par_chunks_mut(n * ROWS_PER_TASK)
            .zip(err.par_chunks_mut(count * ROWS_PER_TASK))
            .zip(codes.par_chunks_mut(n * ROWS_PER_TASK))
            .zip(loss.par_chunks_mut(ROWS_PER_TASK))
            .enumerate()
            .for_each(|(task, (((wc, ec), cc), lc))| {
                let r0 = task * ROWS_PER_TASK;
                for (rr, (((wr, er), cr), l)) in wc
                    .chunks_exact_mut(n)
                    .zip(ec.chunks_exact_mut(count))
                    .zip(cc.chunks_exact_mut(n))
                    .zip(lc.iter_mut())
                    .enumerate()
                {
                    let srow = &layer.scales[(r0 + rr) * groups..(r0 + rr + 1) * groups];
                    let mut acc = 0f64;
                    for (i, e_out) in er.iter_mut().enumerate() {
                        let col = i1 + i;
                        let urow = &u[col * n + col..col * n + i2];
                        let s = srow[gidx[col]];
                        let wv = wr[col];
                        let k = grid.code_f32(wv, s);
                        let q = grid.dequant(k, s);
                        cr[perm[col]] = k;
                        let e = (wv - q) / urow[0];
                        acc += (e as f64) * (e as f64);
                        for (x, &uv) in wr[col + 1..i2].iter_mut().zip(&urow[1..]) {
                            *x -= e * uv;
                        }
                        *e_out = e;
                    }
                    *l += acc / 2.0;
                }
            });
        if i2 < n {
            let e = MatRef::from_row_major_slice(err, rows, count);
            let ub = MatRef::from_row_major_slice(&u[i1 * n..i2 * n], count, n).subcols(i2, n - i2);
            let dst = MatMut::from_row_major_slice_mut(w, rows, n).subcols_mut(i2, n - i2);
            matmul(dst, Accum::Add, e, ub, -1.0f32, Par::rayon(0));
        }
        i1 = i2;
    }
    (codes, loss)
}
