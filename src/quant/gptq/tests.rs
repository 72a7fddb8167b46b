//! The fast path against the plain reference, the exact properties both must have (a diagonal
//! Hessian is RTN; act-order is invariant to how the input columns are numbered; dead columns
//! quantize to 0), the Cholesky retry, and every typed error.

use super::*;
use crate::io::Dtype;
use crate::quant::compressed_tensors::symmetric_scale;
use crate::test_rng::Rng;

/// Minimum share of identical codes, fast path (f32) vs reference (f64), on the random layers
/// below. A code differs only where `w / s` lands within f32 noise of a rounding boundary; the
/// flip then feeds a different error into the rest of its row, which can flip a few more codes
/// there (GPTQ is not bit-reproducible across precisions; Quark's `algorithm/common.py` warns of
/// the same between CPU and GPU). Measured: 100 % on every layer here.
const FAST_VS_REF_MIN_CODE_AGREEMENT: f64 = 0.99;
/// Maximum relative difference of the total GPTQ loss, fast vs reference: the loss is a sum over
/// thousands of terms, a handful of flipped codes move it by far less than 1 %. Measured:
/// ≤ 1.1·10⁻⁶.
const FAST_VS_REF_MAX_LOSS_REL: f64 = 0.01;
/// Maximum of `|U_fast − U_ref| / max|U_ref|`: f32 with faer's blocked Cholesky and triangular
/// inverse vs the f64 literal chain, on a damped Hessian whose condition number is ≲ 10⁴ (the
/// 1 % damping bounds it by 101 · max eig / mean eig): f32 eps · cond ≈ 10⁻³. Measured:
/// 1.5·10⁻⁶.
const FACTOR_MAX_REL_ERR: f64 = 2e-3;
/// Minimum share of identical codes between block sizes in the f64 reference: the block size
/// changes only the order of the floating-point sums, so only exact near-ties can flip.
const BLOCK_SIZE_MIN_CODE_AGREEMENT: f64 = 0.999;

pub(super) struct Problem {
    pub rows: usize,
    pub cols: usize,
    pub group: usize,
    pub grid: Grid,
    pub w: Vec<f32>,
    pub h: Vec<f64>,
    pub scales: Vec<f32>,
}

impl Problem {
    /// A random layer: heavy-tailed weights, and a Hessian from `tokens` correlated inputs whose
    /// columns have scales spread over ~8× (so act-order permutes and H is not diagonal).
    pub fn random(seed: u64, rows: usize, cols: usize, group: usize, grid: Grid) -> Self {
        let mut rng = Rng(seed);
        let w: Vec<f32> = (0..rows * cols)
            .map(|_| {
                let v = rng.normal() * 0.02;
                (if rng.below(50) == 0 { v * 4.0 } else { v }) as f32
            })
            .collect();
        let tokens = cols + cols / 2;
        let k = 16;
        let mix: Vec<f64> = (0..k * cols).map(|_| rng.normal() / 4.0).collect();
        let cscale: Vec<f64> = (0..cols).map(|_| (rng.unit() * 2.1 - 1.0).exp()).collect();
        let mut h = vec![0f64; cols * cols];
        let mut x = vec![0f64; cols];
        for _ in 0..tokens {
            let z: Vec<f64> = (0..k).map(|_| rng.normal()).collect();
            for (c, xc) in x.iter_mut().enumerate() {
                let shared: f64 = (0..k).map(|j| z[j] * mix[j * cols + c]).sum();
                *xc = (0.8 * shared + 0.6 * rng.normal()) * cscale[c];
            }
            for i in 0..cols {
                for j in 0..cols {
                    h[i * cols + j] += 2.0 / tokens as f64 * x[i] * x[j];
                }
            }
        }
        let divisor = (grid.qmax - grid.qmin) as f32 / 2.0;
        let scales = w
            .chunks_exact(group)
            .map(|run| symmetric_scale(run, divisor, grid.scale_dtype))
            .collect();
        Self {
            rows,
            cols,
            group,
            grid,
            w,
            h,
            scales,
        }
    }

    pub fn layer(&self) -> Layer<'_> {
        Layer {
            weight: &self.w,
            rows: self.rows,
            cols: self.cols,
            scales: &self.scales,
            group: self.group,
            grid: self.grid,
        }
    }

    pub fn h32(&self) -> Vec<f32> {
        self.h.iter().map(|&v| v as f32).collect()
    }

    /// Make columns `dead` dead: their inputs are always 0.
    pub fn kill(&mut self, dead: &[usize]) {
        let n = self.cols;
        for &d in dead {
            for i in 0..n {
                self.h[d * n + i] = 0.0;
                self.h[i * n + d] = 0.0;
            }
        }
    }
}

pub(super) fn agreement(a: &[i8], b: &[i8]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / a.len() as f64
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(f64::MIN_POSITIVE)
}

fn total(loss: &[f64]) -> f64 {
    loss.iter().sum()
}

fn fast_vs_ref(p: &Problem, cfg: &Config) -> (Output, Output) {
    let fast = quantize(&p.layer(), &mut p.h32(), cfg).unwrap();
    let reference = reference::quantize(&p.layer(), &p.h, cfg).unwrap();
    let agree = agreement(&fast.codes, &reference.codes);
    let lrel = rel(total(&fast.loss), total(&reference.loss));
    eprintln!(
        "{}x{} group {} grid {:?} act_order {}: codes {:.4} %, loss {:.3e} rel",
        p.rows,
        p.cols,
        p.group,
        p.grid,
        cfg.act_order,
        agree * 100.0,
        lrel
    );
    assert!(
        agree >= FAST_VS_REF_MIN_CODE_AGREEMENT,
        "codes agree {agree}"
    );
    assert!(lrel <= FAST_VS_REF_MAX_LOSS_REL, "loss rel {lrel}");
    assert_eq!(fast.report.dead, reference.report.dead);
    assert_eq!(fast.report.retries, reference.report.retries);
    assert!(rel(fast.report.damp, reference.report.damp) < 1e-6);
    for (&k, c) in fast.codes.iter().zip(0..) {
        assert!(
            (p.grid.qmin..=p.grid.qmax).contains(&(k as i32)),
            "code {c}"
        );
    }
    (fast, reference)
}

#[test]
fn fast_matches_reference_per_channel_and_group() {
    let cfg = Config::default();
    let noact = Config {
        act_order: false,
        ..cfg
    };
    // block boundaries inside and at the end; a partial last block (cols 200 = 128 + 72)
    for (seed, rows, cols, group, c) in [
        (1, 40, 200, 200, cfg),
        (2, 40, 200, 200, noact),
        (3, 37, 256, 32, cfg),
        (4, 33, 256, 128, noact),
        (5, 20, 96, 96, cfg),
    ] {
        let p = Problem::random(seed, rows, cols, group, Grid::int4(Dtype::BF16));
        fast_vs_ref(&p, &c);
    }
}

#[test]
fn fast_matches_reference_other_grids_and_dtypes() {
    let cfg = Config::default();
    for (seed, grid) in [
        (6, Grid::int8(Dtype::BF16)),
        (7, Grid::int8(Dtype::F32)),
        (8, Grid::int4(Dtype::F16)),
        (9, Grid::int4(Dtype::F32)),
    ] {
        let p = Problem::random(seed, 24, 160, 160, grid);
        fast_vs_ref(&p, &cfg);
    }
}

#[test]
fn factor_matches_reference() {
    let p = Problem::random(10, 1, 300, 300, Grid::int4(Dtype::BF16));
    let n = p.cols;
    let cfg = Config::default();
    let mut h = p.h.clone();
    let (u_ref, _) = reference::factor(&mut h, &mut [0.0; 300], 1, n, &cfg).unwrap();
    let mut h32 = p.h32();
    let (u, _) = factor::upper_inverse_factor(&mut h32, n, &cfg).unwrap();
    let scale = u_ref.iter().fold(0f64, |m, v| m.max(v.abs()));
    let mut worst = 0f64;
    for i in 0..n {
        for j in i..n {
            worst = worst.max((u[i * n + j] as f64 - u_ref[i * n + j]).abs() / scale);
        }
    }
    eprintln!("factor: max |U_fast − U_ref| / max|U_ref| = {worst:.2e}");
    assert!(worst <= FACTOR_MAX_REL_ERR, "{worst}");
}

/// With a diagonal Hessian `U` is diagonal, nothing is fed back and GPTQ is RTN with the same
/// scales, code for code, in both paths.
#[test]
fn diagonal_hessian_is_rtn() {
    let mut p = Problem::random(11, 30, 144, 48, Grid::int4(Dtype::BF16));
    let n = p.cols;
    for i in 0..n {
        for j in 0..n {
            if i != j {
                p.h[i * n + j] = 0.0;
            }
        }
    }
    let groups = n / p.group;
    let scale = |r: usize, c: usize| p.scales[r * groups + c / p.group];
    let fast = quantize(&p.layer(), &mut p.h32(), &Config::default()).unwrap();
    let reference = reference::quantize(&p.layer(), &p.h, &Config::default()).unwrap();
    for r in 0..p.rows {
        for c in 0..n {
            let (wv, s) = (p.w[r * n + c], scale(r, c));
            assert_eq!(fast.codes[r * n + c], p.grid.code_f32(wv, s), "({r},{c})");
            assert_eq!(
                reference.codes[r * n + c],
                p.grid.code_f64(wv as f64, s as f64),
                "({r},{c})"
            );
        }
    }
}

/// Renumbering the input columns (of W and H alike) does not change act-order's result: the
/// columns are processed in the same order, so the codes are the same numbers, renumbered.
#[test]
fn act_order_is_invariant_to_column_numbering() {
    let p = Problem::random(12, 16, 150, 150, Grid::int4(Dtype::BF16));
    let n = p.cols;
    let mut rng = Rng(99);
    let mut perm: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        perm.swap(i, rng.below(i + 1));
    }
    let mut q = Problem {
        w: order::permute_columns(&p.w, p.rows, n, &perm),
        h: p.h.clone(),
        scales: p.scales.clone(),
        ..p
    };
    order::permute_square(&mut q.h, n, &perm);
    let cfg = Config::default();
    let a = quantize(&p.layer(), &mut p.h32(), &cfg).unwrap();
    let b = quantize(&q.layer(), &mut q.h32(), &cfg).unwrap();
    let ar = reference::quantize(&p.layer(), &p.h, &cfg).unwrap();
    let br = reference::quantize(&q.layer(), &q.h, &cfg).unwrap();
    for r in 0..p.rows {
        for (c, &pc) in perm.iter().enumerate() {
            assert_eq!(b.codes[r * n + c], a.codes[r * n + pc], "fast ({r},{c})");
            assert_eq!(br.codes[r * n + c], ar.codes[r * n + pc], "ref ({r},{c})");
        }
    }
    assert_eq!(a.loss, b.loss);
    assert_eq!(ar.loss, br.loss);
    // and act-order does change the result (it is not a no-op)
    let off = Config {
        act_order: false,
        ..cfg
    };
    let c = reference::quantize(&p.layer(), &p.h, &off).unwrap();
    assert_ne!(c.codes, ar.codes);
}

#[test]
fn dead_columns_quantize_to_zero() {
    let dead = [0, 5, 6, 63, 99];
    for act_order in [true, false] {
        let mut p = Problem::random(13, 20, 100, 100, Grid::int4(Dtype::BF16));
        p.kill(&dead);
        let cfg = Config {
            act_order,
            ..Config::default()
        };
        let (fast, reference) = fast_vs_ref(&p, &cfg);
        assert_eq!(fast.report.dead, dead.len());
        for out in [&fast, &reference] {
            for r in 0..p.rows {
                for &d in &dead {
                    assert_eq!(out.codes[r * p.cols + d], 0);
                }
            }
        }
    }
}

/// A Hessian the 1 % damping cannot make positive definite, but Quark's extra damping can
/// (first retry fails, later one succeeds); both paths take the same number of retries.
#[test]
fn cholesky_retries_with_more_damping() {
    // 300 columns: faer's blocked (not only its unblocked) Cholesky fails part-way and restarts
    let mut p = Problem::random(14, 12, 300, 300, Grid::int4(Dtype::BF16));
    let n = p.cols;
    // H − c·I with c between the damping and the damping plus ~100× extra
    // H − 0.3·mean(diag)·I: indefinite. The damping then adds 0.007·mean, the retries
    // 0.007, 0.07, 0.7·mean: the third succeeds, with a margin (well conditioned, so f32 and
    // f64 still agree as closely as on any layer).
    let mean = (0..n).map(|i| p.h[i * n + i]).sum::<f64>() / n as f64;
    for i in 0..n {
        p.h[i * n + i] -= 0.3 * mean;
    }
    let (fast, reference) = fast_vs_ref(&p, &Config::default());
    assert_eq!(reference.report.retries, 3, "{:?}", reference.report);
    assert!(rel(fast.report.extra_damp, reference.report.extra_damp) < 1e-6);
    // no retries: the typed error, not RTN
    let strict = Config {
        retries: 0,
        ..Config::default()
    };
    for r in [
        quantize(&p.layer(), &mut p.h32(), &strict),
        reference::quantize(&p.layer(), &p.h, &strict),
    ] {
        assert!(
            matches!(r, Err(GptqError::NotPositiveDefinite { retries: 0, .. })),
            "{r:?}"
        );
    }
}

/// Indefinite beyond any retry: `[[1, a], [a, 1]]` blocks with `a = 10⁶` need ~10⁶ of extra
/// damping, the 5 retries reach 100× the damping.
#[test]
fn not_positive_definite_is_a_typed_error() {
    let mut p = Problem::random(15, 4, 8, 8, Grid::int4(Dtype::BF16));
    p.h = vec![0.0; 64];
    for i in 0..8 {
        p.h[i * 8 + i] = 1.0;
        p.h[i * 8 + (i ^ 1)] = 1e6;
    }
    let e = quantize(&p.layer(), &mut p.h32(), &Config::default()).unwrap_err();
    assert!(
        matches!(e, GptqError::NotPositiveDefinite { retries: 5, .. }),
        "{e}"
    );
    let e = reference::quantize(&p.layer(), &p.h, &Config::default()).unwrap_err();
    assert!(
        matches!(e, GptqError::NotPositiveDefinite { retries: 5, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("hint:"), "{e}");
}

#[test]
fn block_size_changes_only_rounding_order() {
    let p = Problem::random(16, 24, 192, 192, Grid::int4(Dtype::BF16));
    let base = reference::quantize(&p.layer(), &p.h, &Config::default()).unwrap();
    for bs in [1, 7, 64, 192, 1000] {
        let cfg = Config {
            block_size: bs,
            ..Config::default()
        };
        let r = reference::quantize(&p.layer(), &p.h, &cfg).unwrap();
        let agree = agreement(&r.codes, &base.codes);
        assert!(
            agree >= BLOCK_SIZE_MIN_CODE_AGREEMENT,
            "block {bs}: {agree}"
        );
        assert!(rel(total(&r.loss), total(&base.loss)) < 1e-9, "block {bs}");
        let f = quantize(&p.layer(), &mut p.h32(), &cfg).unwrap();
        assert!(agreement(&f.codes, &base.codes) >= FAST_VS_REF_MIN_CODE_AGREEMENT);
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    let p = Problem::random(17, 4, 16, 8, Grid::int4(Dtype::BF16));
    let cfg = Config::default();
    let run = |layer: &Layer, h: &[f64], cfg: &Config| {
        let f = quantize(
            layer,
            &mut h.iter().map(|&v| v as f32).collect::<Vec<_>>(),
            cfg,
        );
        let r = reference::quantize(layer, h, cfg);
        // (Debug text: a NaN in the error is not equal to itself)
        assert_eq!(format!("{:?}", f.clone().err()), format!("{:?}", r.err()));
        f.unwrap_err()
    };
    let mut h = p.h.clone();
    h[17] = f64::NAN;
    assert!(matches!(
        run(&p.layer(), &h, &cfg),
        GptqError::NonFinite {
            what: "hessian",
            index: 17
        }
    ));
    assert!(matches!(
        run(&p.layer(), &p.h[1..], &cfg),
        GptqError::Length {
            what: "hessian",
            ..
        }
    ));
    let mut w = p.w.clone();
    w[3] = f32::INFINITY;
    let l = Layer {
        weight: &w,
        ..p.layer()
    };
    assert!(matches!(
        run(&l, &p.h, &cfg),
        GptqError::NonFinite {
            what: "weight",
            index: 3
        }
    ));
    let l = Layer {
        weight: &p.w[..10],
        ..p.layer()
    };
    assert!(matches!(
        run(&l, &p.h, &cfg),
        GptqError::Length { what: "weight", .. }
    ));
    let l = Layer {
        group: 5,
        ..p.layer()
    };
    assert!(matches!(
        run(&l, &p.h, &cfg),
        GptqError::Group { group: 5, .. }
    ));
    let l = Layer {
        scales: &p.scales[1..],
        ..p.layer()
    };
    assert!(matches!(
        run(&l, &p.h, &cfg),
        GptqError::Length { what: "scales", .. }
    ));
    for bad in [0.0, -1.0, f32::NAN, 1.0 + f32::EPSILON] {
        let mut s = p.scales.clone();
        s[2] = bad;
        let l = Layer {
            scales: &s,
            ..p.layer()
        };
        assert!(
            matches!(run(&l, &p.h, &cfg), GptqError::Scale { index: 2, .. }),
            "{bad}"
        );
    }
    let l = Layer {
        grid: Grid {
            qmin: 1,
            qmax: 7,
            scale_dtype: Dtype::BF16,
        },
        ..p.layer()
    };
    assert!(matches!(run(&l, &p.h, &cfg), GptqError::Grid { .. }));
    let l = Layer {
        grid: Grid::int4(Dtype::I32),
        ..p.layer()
    };
    assert!(matches!(run(&l, &p.h, &cfg), GptqError::ScaleDtype(_)));
    let c = Config {
        block_size: 0,
        ..cfg
    };
    assert!(matches!(run(&p.layer(), &p.h, &c), GptqError::BlockSize));
    let c = Config {
        damp_frac: f64::NAN,
        ..cfg
    };
    assert!(matches!(run(&p.layer(), &p.h, &c), GptqError::DampFrac(_)));
    let l = Layer {
        rows: 0,
        weight: &[],
        scales: &[],
        ..p.layer()
    };
    assert!(matches!(run(&l, &p.h, &cfg), GptqError::Empty { .. }));
}

/// Same input, same build, same thread pool: the same codes and loss, bit for bit (faer's
/// parallel kernels and the row tasks do not race on any sum).
#[test]
fn fast_path_is_deterministic() {
    let p = Problem::random(18, 70, 300, 300, Grid::int4(Dtype::BF16));
    let cfg = Config {
        block_size: 64,
        ..Config::default()
    };
    let a = quantize(&p.layer(), &mut p.h32(), &cfg).unwrap();
    let b = quantize(&p.layer(), &mut p.h32(), &cfg).unwrap();
    assert_eq!(a, b);
}
