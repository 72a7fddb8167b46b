//! The skeleton every row-/group-wise quantizer shares, and the layout helpers their encoders
//! share. Only loops and byte shuffling live here: each format's recipe (how a run of weights
//! gives its scale, how a weight and that scale give its code: the arithmetic that makes each
//! output bit-exact) stays in its own file and is passed in as a closure. Recipes are never
//! unified.
//!
//! [`quantize`] walks `[rows, cols]` row-major f32 weights in runs of `group` input columns
//! (`group == cols`: one run per row) and calls the recipe once per run, which writes the run's
//! codes and returns what is stored per run (a scale, or a scale and a zero point).
//! [`Path::Reference`] is plain loops; [`Path::Parallel`] takes rows in parallel (rayon). Every
//! recipe tests the two identical.

use rayon::prelude::*;

use crate::io::Dtype;

/// How [`quantize`] walks the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Plain loops, no threads: the reference.
    Reference,
    /// Rows in parallel: the fast path, identical output.
    Parallel,
}

/// `max |x|` over a run (0 for an empty one; NaN ignored, as `f32::max` does).
///
/// Eight independent maxima, so the loop vectorises; a maximum does not depend on the order
/// its operands are taken in, so the result is that of the plain fold ([`amax_ref`]).
pub fn amax(w: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = w.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a = a.max(x.abs());
        }
    }
    let m = tail.iter().fold(0f32, |m, &x| m.max(x.abs()));
    acc.iter().fold(m, |m, &a| m.max(a))
}

/// The plain fold [`amax`] is tested against.
pub fn amax_ref(w: &[f32]) -> f32 {
    w.iter().fold(0f32, |m, &x| m.max(x.abs()))
}

/// Write `code(x)` for each weight `x` of `run` into `out`.
pub fn codes<C>(run: &[f32], out: &mut [C], code: impl Fn(f32) -> C) {
    for (q, &x) in out.iter_mut().zip(run) {
        *q = code(x);
    }
}

/// Quantize `w` (`[rows, cols]`, row-major) in runs of `group` input columns (the last run of a
/// row may be shorter; `group == cols` is one run per row, even an empty one). `run(values,
/// codes)` is the recipe for one run: it writes one code per value and returns what is stored for
/// the run. Returns the per-run values (`[rows, ⌈cols/group⌉]`) and the codes (`[rows, cols]`).
///
/// On the parallel path a row of no columns is never handed to `run` (its per-run value stays
/// `S::default()`).
pub fn quantize<S, C, F>(
    path: Path,
    w: &[f32],
    rows: usize,
    cols: usize,
    group: usize,
    run: F,
) -> (Vec<S>, Vec<C>)
where
    S: Clone + Default + Send,
    C: Clone + Default + Send,
    F: Fn(&[f32], &mut [C]) -> S + Sync,
{
    assert_eq!(w.len(), rows * cols);
    let g = if group == cols {
        1
    } else {
        cols.div_ceil(group)
    };
    let mut codes = vec![C::default(); rows * cols];
    match path {
        Path::Reference => {
            let mut scales = Vec::with_capacity(rows * g);
            for r in 0..rows {
                for j in 0..g {
                    let (a, b) = (r * cols + j * group, r * cols + ((j + 1) * group).min(cols));
                    scales.push(run(&w[a..b], &mut codes[a..b]));
                }
            }
            (scales, codes)
        }
        Path::Parallel => {
            let mut scales = vec![S::default(); rows * g];
            if cols > 0 {
                scales
                    .par_chunks_mut(g)
                    .zip(codes.par_chunks_mut(cols))
                    .zip(w.par_chunks(cols))
                    .for_each(|((sc, cd), row)| {
                        for ((s, c), x) in sc
                            .iter_mut()
                            .zip(cd.chunks_mut(group))
                            .zip(row.chunks(group))
                        {
                            *s = run(x, c);
                        }
                    });
            }
            (scales, codes)
        }
    }
}

/// One run's recipe from a format's two rules: the run's scale (`scale`), then each weight's
/// code under it (`code(w, s)`); the run's value is its scale. The `run` of [`quantize`] for
/// every recipe whose codes depend on the run's scale alone.
pub fn scaled<C>(
    scale: impl Fn(&[f32]) -> f32 + Sync,
    code: impl Fn(f32, f32) -> C + Sync,
) -> impl Fn(&[f32], &mut [C]) -> f32 + Sync {
    move |run, out| {
        let s = scale(run);
        codes(run, out, |x| code(x, s));
        s
    }
}

/// A recipe's two entry points over its `$on(path, …)`: `$reference` (plain loops, no
/// threads) and `$fast` (rows in parallel, output identical: each recipe's tests hold them
/// equal); doc lines given before `$on` go to both.
macro_rules! paths {
    ($(#[$doc:meta])* $on:ident: $reference:ident, $fast:ident ($($arg:ident: $ty:ty),* $(,)?) -> $out:ty) => {
        /// The reference: plain loops, no threads.
        $(#[$doc])*
        pub fn $reference($($arg: $ty),*) -> $out {
            $on($crate::quant::math::rowwise::Path::Reference, $($arg),*)
        }
        /// The fast path: rows in parallel; output identical to the reference's.
        $(#[$doc])*
        pub fn $fast($($arg: $ty),*) -> $out {
            $on($crate::quant::math::rowwise::Path::Parallel, $($arg),*)
        }
    };
}
pub(crate) use paths;

/// Index of the first NaN or infinity in `w`. The whole slice is tested without an early exit
/// (so the test vectorises), and searched only when it has one.
pub fn first_non_finite(w: &[f32]) -> Option<usize> {
    if w.iter().fold(false, |acc, x| acc | !x.is_finite()) {
        w.iter().position(|x| !x.is_finite())
    } else {
        None
    }
}

/// The fused fast path of an encoder that packs each row of INT4 codes into 32-bit words:
/// straight from the stored weight bytes (`raw`, `[rows, cols]` of `dtype`), rows in parallel,
/// each row converted to f32 in a per-thread buffer, cut into runs of `group` as in
/// [`quantize`] (`run` is the recipe), and its codes packed by `pack_row`. No matrix-sized f32
/// or code buffer exists; the output is the per-run values and the packed words as
/// little-endian bytes (`[rows, ⌈cols/8⌉]` I32), exactly what [`quantize`] followed by the
/// row packer and [`le_bytes`](crate::quant::math::pack::le_bytes) give (each user tests that).
///
/// `Err(i)`: `i` is the flat index of the first non-finite weight (row-major), found whatever
/// the thread schedule.
pub fn packed_from_raw<S, F, P>(
    raw: &[u8],
    dtype: Dtype,
    rows: usize,
    cols: usize,
    group: usize,
    run: F,
    pack_row: P,
) -> std::result::Result<(Vec<S>, Vec<u8>), usize>
where
    S: Clone + Default + Send,
    F: Fn(&[f32], &mut [i8]) -> S + Sync,
    P: Fn(&[i8], &mut Vec<i32>) + Sync,
{
    use std::sync::atomic::{AtomicUsize, Ordering};
    let esz = dtype.size();
    assert_eq!(raw.len(), rows * cols * esz, "raw bytes of [rows, cols]");
    let g = if group == cols {
        1
    } else {
        cols.div_ceil(group)
    };
    let wpr = cols.div_ceil(8);
    let mut scales = vec![S::default(); rows * g];
    let mut bytes = vec![0u8; rows * wpr * 4];
    let bad = AtomicUsize::new(usize::MAX);
    if cols > 0 {
        scales
            .par_chunks_mut(g)
            .zip(bytes.par_chunks_mut(wpr * 4))
            .zip(raw.par_chunks(cols * esz))
            .enumerate()
            .for_each_init(
                || (vec![0f32; cols], vec![0i8; cols], Vec::with_capacity(wpr)),
                |(f, c, words), (r, ((sc, out), row))| {
                    crate::io::dtype::to_f32_into(dtype, row, f);
                    if let Some(j) = first_non_finite(f) {
                        bad.fetch_min(r * cols + j, Ordering::Relaxed);
                        return;
                    }
                    for ((s, cd), x) in sc.iter_mut().zip(c.chunks_mut(group)).zip(f.chunks(group))
                    {
                        *s = run(x, cd);
                    }
                    words.clear();
                    pack_row(c, words);
                    for (o, w) in out.chunks_exact_mut(4).zip(words.iter()) {
                        o.copy_from_slice(&w.to_le_bytes());
                    }
                },
            );
    }
    match bad.into_inner() {
        usize::MAX => Ok((scales, bytes)),
        i => Err(i),
    }
}

/// `[rows, cols]` → `[cols, rows]` (output rows in parallel).
pub fn transpose<T: Copy + Default + Send + Sync>(v: &[T], rows: usize, cols: usize) -> Vec<T> {
    assert_eq!(v.len(), rows * cols);
    let mut out = vec![T::default(); rows * cols];
    if rows > 0 {
        out.par_chunks_mut(rows).enumerate().for_each(|(c, col)| {
            for (r, o) in col.iter_mut().enumerate() {
                *o = v[r * cols + c];
            }
        });
    }
    out
}

/// f32 values (already representable) to little-endian bytes of `dtype`.
pub fn encode_floats(v: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::BF16 => v
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect(),
        Dtype::F16 => v
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect(),
        Dtype::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        d => panic!("scale dtype {d} not supported"),
    }
}

/// The number of groups of `group` in a module's input dimension `cols`, which it must divide
/// (the driver refuses other tensors before writing).
pub fn groups(module: &str, cols: usize, group: usize) -> usize {
    assert_eq!(
        cols % group,
        0,
        "{module}: in {cols} not a multiple of {group}"
    );
    cols / group
}

/// Test data: `dtype(a · cos(0.37 i) + b)` for the `rows × cols` elements `i` (smooth, signed,
/// no zero run), each rounded to `dtype` (BF16, F16 or F32) by encoding and reading it back.
#[cfg(test)]
pub(crate) fn test_matrix(rows: usize, cols: usize, dtype: Dtype, a: f32, b: f32) -> Vec<f32> {
    let exact: Vec<f32> = (0..rows * cols)
        .map(|i| a * ((i as f32) * 0.37).cos() + b)
        .collect();
    let mut out = Vec::new();
    crate::io::dtype::to_f32(dtype, &encode_floats(&exact, dtype), &mut out);
    out
}

/// Test support: the planted row of the goldens' summaries, `[7.5, −7.5, 0.5, …]` (amax 7.5,
/// and every tie a format rounds).
#[cfg(test)]
pub(crate) const PLANTED_ROW: [f32; 8] = [7.5, -7.5, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5];

/// Test support: a recipe's fast and reference paths (`paths(w, rows, cols, dtype)` gives both
/// results, after any checks of its own) agree on [`test_data`] of every shape, in BF16, F16
/// and F32.
#[cfg(test)]
pub(crate) fn assert_paths_agree<T: PartialEq + std::fmt::Debug>(
    shapes: &[(usize, usize)],
    paths: impl Fn(&[f32], usize, usize, Dtype) -> (T, T),
) {
    for &(rows, cols) in shapes {
        for dt in [Dtype::BF16, Dtype::F16, Dtype::F32] {
            let (fast, reference) = paths(&test_data(rows, cols, dt), rows, cols, dt);
            assert_eq!(fast, reference, "{rows}×{cols} {dt:?}");
        }
    }
}

/// Test support: the RMSE of `d` against `w`, each error `|w_i − d_i|` first held to
/// `within(i, error)`.
#[cfg(test)]
pub(crate) fn rmse_within(w: &[f32], d: &[f32], within: impl Fn(usize, f32) -> bool) -> f32 {
    let mut se = 0f64;
    for (i, (&x, &y)) in w.iter().zip(d).enumerate() {
        let e = (x - y).abs();
        assert!(within(i, e), "{i}: {x} vs {y}");
        se += (e as f64).powi(2);
    }
    (se / w.len() as f64).sqrt() as f32
}

/// [`test_matrix`] about `[-0.054, 0.046]` (`0.05 · cos + (−0.004)`): the formats' tests' data.
#[cfg(test)]
pub(crate) fn test_data(rows: usize, cols: usize, dtype: Dtype) -> Vec<f32> {
    test_matrix(rows, cols, dtype, 0.05, -0.004)
}

/// [`test_matrix`] about `[-0.034, 0.026]` (`0.03 · cos + (−0.004)`).
#[cfg(test)]
pub(crate) fn test_data_narrow(rows: usize, cols: usize, dtype: Dtype) -> Vec<f32> {
    test_matrix(rows, cols, dtype, 0.03, -0.004)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length up to 40 and a long run, with negative values, -0.0, NaN and infinities.
    #[test]
    fn amax_equals_the_plain_fold() {
        let vals: Vec<f32> = (0..1000)
            .map(|i| match i % 97 {
                13 => f32::NAN,
                29 => -0.0,
                61 if i > 500 => f32::NEG_INFINITY,
                _ => ((i as f32) * 0.731).sin() * (1 + i % 7) as f32,
            })
            .collect();
        for n in (0..=40).chain([999, 1000]) {
            for start in [0, 3, 13] {
                let w = &vals[start.min(vals.len() - n)..][..n];
                assert_eq!(
                    amax(w).to_bits(),
                    amax_ref(w).to_bits(),
                    "n={n} start={start}"
                );
            }
        }
    }
}
