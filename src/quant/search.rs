//! The activation-weighted scale search (`kquant quantize --method search`): for each run of
//! weights that shares a scale (a row per channel, a (row, group) per group), try the format's
//! round-to-nearest scale times each ratio of [`RATIOS`] — above 1 up to 8/7.5 (the largest
//! positive weight otherwise clips to 7/7.5 of the amax), and down to 0.60 (clipping outliers)
//! — each rounded to the dtype the format stores scales in and coded with the format's own
//! rounding ([`IntGrid::code`]), and keep the scale with the least error weighted by the
//! inputs' second moments: `Σ_j d_j (w_j − s·q_j)²`, `d = diag(Σ x xᵀ)`, what each input
//! contributes to the layer's output error (llm-compressor's `imatrix_mse` observer with norm
//! 2; AMD Quark's AWQ `apply_clip` and ModelOpt's `mse_calibrate` search the same kind of
//! grid). Candidates are tried in the order of [`RATIOS`] and a later one must be strictly
//! better, so the RTN scale (ratio 1, first) is kept on ties and the result is never worse than
//! RTN on this error. Only scales and codes change: the file is the format's (`IntGrid::write`).
//!
//! [`search_ref`] is the plain reference (f64 sums, one run at a time); [`search`] runs rows in
//! parallel with the same sums, identical output (tested).

use rayon::prelude::*;

use crate::io::Dtype;
use crate::quant::codec::IntGrid;
use crate::quant::math::int4::{round_to, Int4};
use crate::quant::math::rowwise::{self, Path};

/// The ratios of the RTN scale tried, in order: 1 first (kept on ties), 8/7.5, then 0.99 down
/// to 0.60 by 0.01.
pub const RATIOS: [f32; 42] = {
    let mut r = [0f32; 42];
    r[0] = 1.0;
    r[1] = 8.0 / 7.5;
    let mut i = 2;
    while i < 42 {
        r[i] = 1.0 - (i - 1) as f32 / 100.0;
        i += 1;
    }
    r
};

/// The best scale of one run and its codes: `w` the run, `d` its inputs' weights, `s0` the
/// RTN scale.
fn run_best(
    g: &dyn IntGrid,
    w: &[f32],
    d: &[f32],
    s0: f32,
    sdt: Dtype,
    model: Dtype,
    codes: &mut [i8],
) -> f32 {
    let err = |s: f32, out: &mut [i8]| -> f64 {
        let mut e = 0f64;
        for ((&x, &dj), q) in w.iter().zip(d).zip(out.iter_mut()) {
            *q = g.code(x, s, model);
            let r = x as f64 - s as f64 * *q as f64;
            e += dj as f64 * r * r;
        }
        e
    };
    let mut best = (err(s0, codes), s0);
    let mut tmp = vec![0i8; w.len()];
    for &p in &RATIOS[1..] {
        let s = round_to(sdt, s0 * p);
        if !(s.is_finite() && s > 0.0) || s == best.1 {
            continue;
        }
        let e = err(s, &mut tmp);
        if e < best.0 {
            best = (e, s);
            codes.copy_from_slice(&tmp);
        }
    }
    best.1
}

fn search_on(
    path: Path,
    g: &dyn IntGrid,
    w: &[f32],
    rows: usize,
    cols: usize,
    d: &[f32],
    model: Dtype,
) -> Int4 {
    assert_eq!(w.len(), rows * cols, "w is [rows, cols]");
    assert_eq!(d.len(), cols, "one input weight per column");
    let mut q = g.rtn(w, rows, cols, model);
    let group = q.group;
    let gpr = cols.div_ceil(group);
    let sdt = g.scale_dtype(model);
    let row = |(r, (codes, scales)): (usize, (&mut [i8], &mut [f32]))| {
        for (gi, s) in scales.iter_mut().enumerate() {
            let (a, b) = (gi * group, ((gi + 1) * group).min(cols));
            *s = run_best(
                g,
                &w[r * cols + a..r * cols + b],
                &d[a..b],
                *s,
                sdt,
                model,
                &mut codes[a..b],
            );
        }
    };
    let items = q
        .codes
        .chunks_mut(cols)
        .zip(q.scales.chunks_mut(gpr))
        .enumerate();
    match path {
        Path::Parallel => items.par_bridge().for_each(row),
        Path::Reference => items.for_each(row),
    }
    q
}

rowwise::paths! {
    /// `d`: the inputs' second moments, one per column.
    search_on: search_ref, search(g: &dyn IntGrid, w: &[f32], rows: usize, cols: usize, d: &[f32], model: Dtype) -> Int4
}

/// `Σ_j d_j (w_j − s·q_j)²` over every run of `q` (the objective [`search`] minimises).
pub fn weighted_error(w: &[f32], q: &Int4, d: &[f32]) -> f64 {
    let gpr = q.cols.div_ceil(q.group);
    let mut e = 0f64;
    for (i, (&x, &c)) in w.iter().zip(&q.codes).enumerate() {
        let (r, j) = (i / q.cols, i % q.cols);
        let s = q.scales[r * gpr + j / q.group] as f64;
        let res = x as f64 - s * c as f64;
        e += d[j] as f64 * res * res;
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::compressed_tensors::PackQuantized;
    use crate::quant::math::pack::Order;
    use crate::quant::quark::{Int4PerChannel, Layout, Options, Version};

    fn quark() -> Int4PerChannel {
        Int4PerChannel(Options {
            layout: Layout::Model,
            version: Version::V013,
            order: Order::Sequential,
        })
    }

    fn data(rows: usize, cols: usize) -> (Vec<f32>, Vec<f32>) {
        let w = crate::quant::math::rowwise::test_matrix(rows, cols, Dtype::BF16, 0.05, 0.003);
        // Input weights spanning three orders of magnitude, a dead input.
        let d = (0..cols)
            .map(|j| {
                if j == 3 {
                    0.0
                } else {
                    10f32.powf((j % 7) as f32 / 2.0 - 1.5)
                }
            })
            .collect();
        (w, d)
    }

    /// On each format's grid: every run's error is at most RTN's, the codes are the format's
    /// codes under the chosen scales, every scale is a stored-dtype value, the parallel path
    /// is the reference's, and somewhere a ratio other than 1 wins.
    #[test]
    fn search_is_never_worse_than_rtn_and_keeps_the_format() {
        let quark = quark();
        let ct_group = PackQuantized { group: Some(32) };
        let grids: [&dyn IntGrid; 2] = [&quark, &ct_group];
        let (rows, cols) = (12, 96);
        let (w, d) = data(rows, cols);
        for g in grids {
            let rtn = g.rtn(&w, rows, cols, Dtype::BF16);
            let q = search_ref(g, &w, rows, cols, &d, Dtype::BF16);
            assert_eq!(search(g, &w, rows, cols, &d, Dtype::BF16), q);
            assert_eq!(q.group, rtn.group);
            let gpr = cols.div_ceil(q.group);
            let mut moved = 0;
            for r in 0..rows {
                for gi in 0..gpr {
                    let one = |x: &Int4| Int4 {
                        rows: 1,
                        cols: q.group,
                        group: q.group,
                        scales: vec![x.scales[r * gpr + gi]],
                        codes: x.codes[r * cols + gi * q.group..][..q.group].to_vec(),
                    };
                    let (wr, dr) = (
                        &w[r * cols + gi * q.group..][..q.group],
                        &d[gi * q.group..][..q.group],
                    );
                    let (a, b) = (
                        weighted_error(wr, &one(&q), dr),
                        weighted_error(wr, &one(&rtn), dr),
                    );
                    assert!(a <= b, "row {r} group {gi}: {a} > {b}");
                    let s = q.scales[r * gpr + gi];
                    assert_eq!(round_to(g.scale_dtype(Dtype::BF16), s), s);
                    if s != rtn.scales[r * gpr + gi] {
                        moved += 1;
                        assert!(a < b);
                    }
                    for (j, &c) in one(&q).codes.iter().enumerate() {
                        assert_eq!(c, g.code(wr[j], s, Dtype::BF16));
                    }
                }
            }
            assert!(moved > 0, "the search never left RTN");
        }
    }

    /// With every input weighted alike the objective is the plain squared error; with all
    /// weights zero nothing is preferred and RTN is kept byte for byte.
    #[test]
    fn zero_weights_keep_rtn() {
        let quark = quark();
        let (w, _) = data(4, 64);
        let q = search(&quark, &w, 4, 64, &[0.0; 64], Dtype::BF16);
        assert_eq!(q, quark.rtn(&w, 4, 64, Dtype::BF16));
    }
}
