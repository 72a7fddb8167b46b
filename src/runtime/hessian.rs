//! Second moments of the inputs each linear of a draft sees — `Σ x xᵀ` over every token (row)
//! of every call, the GPTQ Hessian up to a factor, or only its diagonal — collected through the
//! linear hook (`runtime::linears`) while the draft replays a trace, for `kquant quantize
//! --calibrate`.
//!
//! Each module has its own accumulator; only the modules asked for are collected, so a caller
//! bounds the memory (`k² · 4` bytes a module) by asking for a subset per replay. Modules that
//! read the same input one after the other (q/k/v of an attention, gate/up of an MLP, DFlash's
//! per-layer k/v of one context) share the product: the last call's `Xᵀ · X` is kept while the
//! next call reads a bit-identical input, and dropped before any other is computed, so at most
//! one product exists at a time.
//!
//! `Σ x xᵀ` is computed as the product `Xᵀ · X` by `ops::gemm::matmul_nt` (f32, as
//! llm-compressor's `GPTQ_PRECISION` and Quark accumulate) and added to an f32 sum; the plain
//! reference is [`outer_sum_ref`]. llm-compressor's H is `2/N · Σ x xᵀ` (N sequences), Quark's
//! and ModelOpt's a running mean over tokens: the scale of H does not change GPTQ's result
//! (its damping is relative to the mean of the diagonal), so [`Hessian::sum`] is kept as is and
//! [`Hessian::tokens`] beside it.

use std::collections::{BTreeMap, BTreeSet};

use crate::ops::gemm::{matmul_nt, Rows};

/// One module's accumulated `Σ x xᵀ` and what it was built from.
#[derive(Debug, Clone)]
pub struct Hessian {
    /// Input width.
    pub k: usize,
    /// `[k, k]`, row-major, symmetric: `Σ x xᵀ` over every row `x` the module saw; or only
    /// its diagonal `[k]` (`Σ x_j²`) when collected with [`HessianSet::diagonal`].
    pub sum: Vec<f32>,
    /// Whether `sum` is the whole matrix (else its diagonal).
    pub full: bool,
    /// Rows (tokens) accumulated.
    pub tokens: u64,
}

impl Hessian {
    /// The diagonal `Σ x_j²`, `[k]`.
    pub fn diag(&self) -> Vec<f32> {
        if self.full {
            (0..self.k).map(|j| self.sum[j * self.k + j]).collect()
        } else {
            self.sum.clone()
        }
    }
}

/// `Σ_i x_i x_iᵀ` over the `m` rows of `x [m, k]`, sequentially in f64 then rounded: the
/// reference [`HessianSet`]'s product is tested against.
pub fn outer_sum_ref(x: &[f32], m: usize, k: usize) -> Vec<f32> {
    let mut h = vec![0f64; k * k];
    for r in x.chunks(k).take(m) {
        for i in 0..k {
            for j in 0..k {
                h[i * k + j] += r[i] as f64 * r[j] as f64;
            }
        }
    }
    h.into_iter().map(|v| v as f32).collect()
}

/// The accumulators of one collection.
#[derive(Debug, Default)]
pub struct HessianSet {
    wanted: BTreeSet<String>,
    /// Only the diagonals.
    diagonal: bool,
    acc: BTreeMap<String, Hessian>,
    /// The last call's input and its product (`Xᵀ · X`, or the column sums of squares).
    last: Option<(Vec<f32>, Vec<f32>)>,
}

impl HessianSet {
    /// Collect `Σ x xᵀ` for the modules `wanted` (checkpoint module names, without `.weight`).
    pub fn new(wanted: impl IntoIterator<Item = String>) -> HessianSet {
        HessianSet {
            wanted: wanted.into_iter().collect(),
            ..HessianSet::default()
        }
    }

    /// Collect only the diagonals `Σ x_j²` (`k` floats a module, `k` flops a row): what the
    /// activation-weighted scale search needs.
    pub fn diagonal(wanted: impl IntoIterator<Item = String>) -> HessianSet {
        HessianSet {
            diagonal: true,
            ..HessianSet::new(wanted)
        }
    }

    /// Whether `module` is collected.
    pub fn wants(&self, module: &str) -> bool {
        self.wanted.contains(module)
    }

    /// Bytes the accumulators hold now.
    pub fn bytes(&self) -> usize {
        self.acc.values().map(|h| h.sum.len() * 4).sum()
    }

    /// One call of `module` on `x [m, k]`.
    pub fn add(&mut self, module: &str, x: &[f32], m: usize, k: usize) {
        if !self.wanted.contains(module) || m == 0 {
            return;
        }
        let same = matches!(&self.last, Some((lx, _)) if lx.len() == x.len()
            && lx.iter().zip(x).all(|(a, b)| a.to_bits() == b.to_bits()));
        if !same {
            // Dropped before the next product exists.
            self.last = None;
            let p = if self.diagonal {
                let mut d = vec![0f32; k];
                for row in x.chunks(k).take(m) {
                    for (a, &v) in d.iter_mut().zip(row) {
                        *a += v * v;
                    }
                }
                d
            } else {
                // Xᵀ [k, m]; Xᵀ · (Xᵀ)ᵀ = Σ x xᵀ.
                let mut xt = vec![0f32; k * m];
                for (r, row) in x.chunks(k).take(m).enumerate() {
                    for (i, &v) in row.iter().enumerate() {
                        xt[i * m + r] = v;
                    }
                }
                matmul_nt(&xt, k, m, Rows::F32(&xt), k)
            };
            self.last = Some((x.to_vec(), p));
        }
        let p = &self.last.as_ref().expect("just computed").1;
        let full = !self.diagonal;
        let h = self
            .acc
            .entry(module.to_string())
            .or_insert_with(|| Hessian {
                k,
                sum: vec![0.0; p.len()],
                full,
                tokens: 0,
            });
        for (a, b) in h.sum.iter_mut().zip(p) {
            *a += b;
        }
        h.tokens += m as u64;
    }

    /// Module → its accumulated input moments. A wanted module never called is absent.
    pub fn finish(self) -> BTreeMap<String, std::sync::Arc<Hessian>> {
        self.acc
            .into_iter()
            .map(|(m, h)| (m, std::sync::Arc::new(h)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: u64) -> Vec<f32> {
        crate::test_rng::Rng(seed.wrapping_mul(2654435761).max(1)).signed_units(len)
    }

    /// Bound of the f32 accumulation against the f64 reference, relative to `Σ |x_i x_j|`.
    const HESSIAN_REL_TOL: f32 = 1e-5;

    /// Each module's sum over its calls is the reference's within the bound, whether its
    /// product was computed or reused from the call before; a module outside the wanted set
    /// is not collected; the diagonal alone is the full matrix's diagonal.
    #[test]
    fn accumulates_each_module_over_its_own_inputs() {
        let k = 37;
        let (x1, x2, x3) = (data(5 * k, 1), data(3 * k, 2), data(4 * k, 3));
        // q, k, v read one input; "o" its own; v reads x3 once where q and k do not.
        let calls: [(&str, &Vec<f32>); 9] = [
            ("q", &x1),
            ("k", &x1),
            ("v", &x1),
            ("unwanted", &x3),
            ("o", &x3),
            ("q", &x2),
            ("k", &x2),
            ("v", &x3),
            ("o", &x2),
        ];
        let run = |mut set: HessianSet| {
            for (m, x) in calls {
                set.add(m, x, x.len() / k, k);
            }
            set.finish()
        };
        let h = run(HessianSet::new(["q", "k", "v", "o"].map(String::from)));
        let d = run(HessianSet::diagonal(["q", "k", "v", "o"].map(String::from)));
        assert!(!h.contains_key("unwanted"));
        for (module, seen) in [
            ("q", vec![&x1, &x2]),
            ("k", vec![&x1, &x2]),
            ("v", vec![&x1, &x3]),
            ("o", vec![&x3, &x2]),
        ] {
            let all: Vec<f32> = seen.iter().flat_map(|x| x.iter().copied()).collect();
            let m = all.len() / k;
            assert_eq!(h[module].tokens, m as u64);
            let want = outer_sum_ref(&all, m, k);
            for i in 0..k {
                for j in 0..k {
                    let mag: f32 = all.chunks(k).map(|r| (r[i] * r[j]).abs()).sum();
                    let (g, w) = (h[module].sum[i * k + j], want[i * k + j]);
                    assert!(
                        (g - w).abs() <= HESSIAN_REL_TOL * mag,
                        "{module} [{i},{j}] {g} vs {w}"
                    );
                }
            }
            assert_eq!(d[module].sum.len(), k);
            for (a, b) in d[module].diag().iter().zip(h[module].diag()) {
                assert!((a - b).abs() <= HESSIAN_REL_TOL * b.abs(), "{a} vs {b}");
            }
        }
    }
}
