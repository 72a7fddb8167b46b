//! The plain reference: a straight transliteration of llm-compressor 0.14.0.1's
//! `gptq_quantize.py::quantize_weight` + `helpers.py::factorize_hessian` (eager path), in f64
//! (its `GPTQ_PRECISION = torch.float64`), with Quark's Cholesky retry. Plain loops, no threads,
//! no blocking tricks: the Cholesky, `cholesky_inverse` and the upper Cholesky of the inverse
//! are computed literally as torch's chain `cholesky → cholesky_inverse → cholesky(upper)`.
//! O(cols³): for tests and goldens (cols up to a few hundred), not for real layers.

use super::api::{check_finite, validate, Config, GptqError, Layer, Output, Report};
use super::order;

/// Lower Cholesky factor of the row-major `[n, n]` `a` (reads its lower triangle); `None` when
/// a pivot is not positive (torch's `LinAlgError`).
pub fn cholesky_lower(a: &[f64], n: usize) -> Option<Vec<f64>> {
    let mut l = vec![0f64; n * n];
    for i in 0..n {
        for j in 0..=i {
            let mut sum = a[i * n + j];
            for k in 0..j {
                sum -= l[i * n + k] * l[j * n + k];
            }
            if i == j {
                if sum.is_nan() || sum <= 0.0 {
                    return None;
                }
                l[i * n + i] = sum.sqrt();
            } else {
                l[i * n + j] = sum / l[j * n + j];
            }
        }
    }
    Some(l)
}

/// `torch.cholesky_inverse(L)`: `(L Lᵀ)⁻¹ = L⁻ᵀ L⁻¹`.
pub fn cholesky_inverse(l: &[f64], n: usize) -> Vec<f64> {
    // L⁻¹ by forward substitution, column by column.
    let mut li = vec![0f64; n * n];
    for c in 0..n {
        for i in c..n {
            let mut sum = if i == c { 1.0 } else { 0.0 };
            for k in c..i {
                sum -= l[i * n + k] * li[k * n + c];
            }
            li[i * n + c] = sum / l[i * n + i];
        }
    }
    let mut inv = vec![0f64; n * n];
    for i in 0..n {
        for j in 0..n {
            let mut sum = 0.0;
            for k in i.max(j)..n {
                sum += li[k * n + i] * li[k * n + j];
            }
            inv[i * n + j] = sum;
        }
    }
    inv
}

/// `torch.linalg.cholesky(a, upper=True)`: upper `U` with `a = Uᵀ U` (the lower factor's
/// transpose).
pub fn cholesky_upper(a: &[f64], n: usize) -> Option<Vec<f64>> {
    let l = cholesky_lower(a, n)?;
    let mut u = vec![0f64; n * n];
    for i in 0..n {
        for j in 0..=i {
            u[j * n + i] = l[i * n + j];
        }
    }
    Some(u)
}

/// Steps 2–4 on the (permuted) Hessian: dead columns, damping, then `U` upper with
/// `H⁻¹ = Uᵀ U`, retrying the first Cholesky as Quark does. Returns `U` and the report.
pub fn factor(
    h: &mut [f64],
    w: &mut [f64],
    rows: usize,
    n: usize,
    cfg: &Config,
) -> Result<(Vec<f64>, Report), GptqError> {
    let mut dead = 0;
    for d in 0..n {
        if h[d * n + d] == 0.0 {
            dead += 1;
            h[d * n + d] = 1.0;
            for r in 0..rows {
                w[r * n + d] = 0.0;
            }
        }
    }
    let damp = cfg.damp_frac * (0..n).map(|i| h[i * n + i]).sum::<f64>() / n as f64;
    for i in 0..n {
        h[i * n + i] += damp;
    }
    let mut report = Report {
        dead,
        damp,
        extra_damp: 0.0,
        retries: 0,
    };
    let l = match cholesky_lower(h, n) {
        Some(l) => l,
        None => {
            // Quark: extra = max(|damp|, mean|diag H| · 1e-6, eps), H + extra·I, ×10 per try.
            let mean_abs = (0..n).map(|i| h[i * n + i].abs()).sum::<f64>() / n as f64;
            let mut extra = damp.abs().max(mean_abs * 1e-6).max(f64::EPSILON);
            let mut found = None;
            for attempt in 1..=cfg.retries {
                let mut hh = h.to_vec();
                for i in 0..n {
                    hh[i * n + i] += extra;
                }
                if let Some(l) = cholesky_lower(&hh, n) {
                    report.extra_damp = extra;
                    report.retries = attempt;
                    found = Some(l);
                    break;
                }
                if attempt < cfg.retries {
                    extra *= 10.0;
                }
            }
            found.ok_or(GptqError::NotPositiveDefinite {
                cols: n,
                damp,
                extra_damp: if cfg.retries == 0 { 0.0 } else { extra },
                retries: cfg.retries,
            })?
        }
    };
    let hinv = cholesky_inverse(&l, n);
    // The inverse of an SPD matrix is SPD; a failure here is the same typed error.
    let u = cholesky_upper(&hinv, n).ok_or(GptqError::NotPositiveDefinite {
        cols: n,
        damp,
        extra_damp: report.extra_damp,
        retries: report.retries,
    })?;
    Ok((u, report))
}

/// GPTQ in f64, plain loops. `h` is the Hessian `[cols, cols]` (symmetric; copied).
pub fn quantize(layer: &Layer, h: &[f64], cfg: &Config) -> Result<Output, GptqError> {
    validate(layer, h.len(), cfg)?;
    check_finite(h)?;
    let (rows, n, grid) = (layer.rows, layer.cols, layer.grid);
    let groups = n / layer.group;
    let perm = if cfg.act_order {
        order::descending_diag(n, |i| h[i * n + i])
    } else {
        (0..n).collect()
    };
    let mut hp = vec![0f64; n * n];
    for i in 0..n {
        for j in 0..n {
            hp[i * n + j] = h[perm[i] * n + perm[j]];
        }
    }
    let mut w = vec![0f64; rows * n];
    for r in 0..rows {
        for c in 0..n {
            w[r * n + c] = layer.weight[r * n + perm[c]] as f64;
        }
    }
    let (u, report) = factor(&mut hp, &mut w, rows, n, cfg)?;

    let mut qcodes = vec![0i8; rows * n]; // permuted order
    let mut loss = vec![0f64; rows];
    let bs = cfg.block_size;
    let mut i1 = 0;
    while i1 < n {
        let i2 = (i1 + bs).min(n);
        let count = i2 - i1;
        let mut w1 = vec![0f64; rows * count];
        for r in 0..rows {
            w1[r * count..(r + 1) * count].copy_from_slice(&w[r * n + i1..r * n + i2]);
        }
        let mut err1 = vec![0f64; rows * count];
        let mut losses1 = vec![0f64; rows * count];
        for i in 0..count {
            let col = i1 + i;
            let d = u[col * n + col];
            let g = perm[col] / layer.group;
            for r in 0..rows {
                let wv = w1[r * count + i];
                let s = layer.scales[r * groups + g];
                let k = grid.code_f64(wv, s as f64);
                let q = grid.dequant(k, s) as f64;
                qcodes[r * n + col] = k;
                let e = (wv - q) / d;
                losses1[r * count + i] = e * e;
                for j in i..count {
                    w1[r * count + j] -= e * u[col * n + i1 + j];
                }
                err1[r * count + i] = e;
            }
        }
        for r in 0..rows {
            loss[r] += losses1[r * count..(r + 1) * count].iter().sum::<f64>() / 2.0;
        }
        // W[:, i2:] -= Err1 @ U[i1:i2, i2:]
        for r in 0..rows {
            for c in i2..n {
                let mut sum = 0.0;
                for k in 0..count {
                    sum += err1[r * count + k] * u[(i1 + k) * n + c];
                }
                w[r * n + c] -= sum;
            }
        }
        i1 = i2;
    }
    let mut codes = vec![0i8; rows * n];
    for r in 0..rows {
        for c in 0..n {
            codes[r * n + perm[c]] = qcodes[r * n + c];
        }
    }
    Ok(Output {
        codes,
        loss,
        report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::Rng;

    /// `Uᵀ U H = I` in f64 for a random SPD H: the chain is the inverse's upper factor.
    #[test]
    fn factor_inverts_the_damped_hessian() {
        let n = 40;
        let mut rng = Rng(7);
        let x: Vec<f64> = (0..n * 60).map(|_| rng.normal()).collect();
        let mut h = vec![0f64; n * n];
        for t in 0..60 {
            for i in 0..n {
                for j in 0..n {
                    h[i * n + j] += x[t * n + i] * x[t * n + j] / 30.0;
                }
            }
        }
        let mut hd = h.clone();
        let mut w = vec![0f64; n];
        let (u, rep) = factor(&mut hd, &mut w, 1, n, &Config::default()).unwrap();
        assert_eq!((rep.dead, rep.retries), (0, 0));
        for i in 0..n {
            for j in 0..i {
                assert_eq!(u[i * n + j], 0.0, "U must be upper");
            }
        }
        for i in 0..n {
            for j in 0..n {
                // (Uᵀ U H)[i, j]
                let mut s = 0.0;
                for k in 0..n {
                    let mut utu = 0.0;
                    for m in 0..n {
                        utu += u[m * n + i] * u[m * n + k];
                    }
                    s += utu * hd[k * n + j];
                }
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((s - want).abs() < 1e-9, "({i},{j}) = {s}");
            }
        }
    }
}
