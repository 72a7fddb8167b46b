//! Second moments of the inputs each linear of a draft sees — `Σ x xᵀ` over every token (row)
//! of every call, the GPTQ Hessian up to a factor — collected through the linear hook
//! (`runtime::linears`) while the draft replays a trace, for `kquant quantize --calibrate`.
//!
//! Modules that read the same input (q/k/v of an attention, gate/up of an MLP) share one
//! accumulator: a module whose first call comes right after another's with a bit-identical
//! input joins that module's group, and every later call of the group is checked to see that
//! same input again (else the collection reports an error rather than a wrong matrix). Only
//! the modules asked for are collected, so a caller bounds the memory (`k² · 4` bytes a group)
//! by asking for a subset per replay.
//!
//! `Σ x xᵀ` is computed as the product `Xᵀ · X` by `ops::gemm::matmul_nt` (f32, as
//! llm-compressor's `GPTQ_PRECISION` and Quark accumulate) and added to an f32 sum; the plain
//! reference is [`outer_sum_ref`]. llm-compressor's H is `2/N · Σ x xᵀ` (N sequences), Quark's
//! and ModelOpt's a running mean over tokens: the scale of H does not change GPTQ's result
//! (its damping is relative to the mean of the diagonal), so [`Hessian::sum`] is kept as is and
//! [`Hessian::tokens`] beside it.

use std::collections::{BTreeMap, BTreeSet};

use crate::ops::gemm::{matmul_nt, Rows};

/// One accumulated `Σ x xᵀ` and what it was built from.
#[derive(Debug, Clone)]
pub struct Hessian {
    /// Input width.
    pub k: usize,
    /// `[k, k]`, row-major, symmetric: `Σ x xᵀ` over every row `x` the modules saw; or only
    /// its diagonal `[k]` (`Σ x_j²`) when collected with [`HessianSet::diagonal`].
    pub sum: Vec<f32>,
    /// Whether `sum` is the whole matrix (else its diagonal).
    pub full: bool,
    /// Rows (tokens) accumulated.
    pub tokens: u64,
    /// The modules that read this input, the first one first.
    pub modules: Vec<String>,
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
    groups: Vec<Hessian>,
    of: BTreeMap<String, usize>,
    /// The previous call's group and input, while calls of wanted modules follow each other.
    last: Option<(usize, Vec<f32>)>,
    error: Option<String>,
}

impl HessianSet {
    /// Collect for the modules `wanted` (checkpoint module names, without `.weight`).
    pub fn new(wanted: impl IntoIterator<Item = String>) -> HessianSet {
        HessianSet {
            wanted: wanted.into_iter().collect(),
            ..HessianSet::default()
        }
    }

    /// Collect only the diagonals `Σ x_j²` (`k` floats a group, `k` flops a row): what the
    /// activation-weighted scale search needs.
    pub fn diagonal(wanted: impl IntoIterator<Item = String>) -> HessianSet {
        HessianSet {
            diagonal: true,
            ..HessianSet::new(wanted)
        }
    }

    /// Bytes the accumulators hold now.
    pub fn bytes(&self) -> usize {
        self.groups.iter().map(|g| g.sum.len() * 4).sum()
    }

    /// One call of `module` on `x [m, k]`.
    pub fn add(&mut self, module: &str, x: &[f32], m: usize, k: usize) {
        if !self.wanted.contains(module) {
            self.last = None;
            return;
        }
        if self.error.is_some() || m == 0 {
            return;
        }
        let same_as_last = |g: usize, last: &Option<(usize, Vec<f32>)>| {
            matches!(last, Some((lg, lx)) if *lg == g && lx.len() == x.len()
                && lx.iter().zip(x).all(|(a, b)| a.to_bits() == b.to_bits()))
        };
        match self.of.get(module).copied() {
            Some(g) if self.groups[g].modules[0] == module => {
                self.accumulate(g, x, m);
                self.last = Some((g, x.to_vec()));
            }
            Some(g) => {
                // A member follows its group's first module with the same input, or the
                // sharing assumed at its first call does not hold.
                if !same_as_last(g, &self.last) {
                    self.error = Some(format!(
                        "`{module}` read an input that `{}` did not (they were first seen sharing one)",
                        self.groups[g].modules[0]
                    ));
                }
            }
            None => {
                let joins = self
                    .last
                    .as_ref()
                    .map(|(g, _)| *g)
                    .filter(|&g| self.groups[g].k == k && same_as_last(g, &self.last));
                match joins {
                    Some(g) => {
                        self.groups[g].modules.push(module.to_string());
                        self.of.insert(module.to_string(), g);
                    }
                    None => {
                        let g = self.groups.len();
                        self.groups.push(Hessian {
                            k,
                            sum: vec![0.0; if self.diagonal { k } else { k * k }],
                            full: !self.diagonal,
                            tokens: 0,
                            modules: vec![module.to_string()],
                        });
                        self.of.insert(module.to_string(), g);
                        self.accumulate(g, x, m);
                        self.last = Some((g, x.to_vec()));
                    }
                }
            }
        }
    }

    fn accumulate(&mut self, g: usize, x: &[f32], m: usize) {
        let k = self.groups[g].k;
        if self.diagonal {
            let h = &mut self.groups[g];
            for row in x.chunks(k).take(m) {
                for (a, &v) in h.sum.iter_mut().zip(row) {
                    *a += v * v;
                }
            }
            h.tokens += m as u64;
            return;
        }
        // Xᵀ [k, m]; Xᵀ · (Xᵀ)ᵀ = Σ x xᵀ.
        let mut xt = vec![0f32; k * m];
        for (r, row) in x.chunks(k).take(m).enumerate() {
            for (i, &v) in row.iter().enumerate() {
                xt[i * m + r] = v;
            }
        }
        let p = matmul_nt(&xt, k, m, Rows::F32(&xt), k);
        let h = &mut self.groups[g];
        for (a, b) in h.sum.iter_mut().zip(&p) {
            *a += b;
        }
        h.tokens += m as u64;
    }

    /// Module → its accumulated input moments (shared ones appear under each module), or the
    /// error that makes them wrong. A wanted module never called is absent.
    pub fn finish(self) -> Result<BTreeMap<String, std::sync::Arc<Hessian>>, String> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let groups: Vec<std::sync::Arc<Hessian>> =
            self.groups.into_iter().map(std::sync::Arc::new).collect();
        Ok(self
            .of
            .into_iter()
            .map(|(m, g)| (m, groups[g].clone()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).max(1);
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Bound of the f32 accumulation against the f64 reference, relative to `Σ |x_i x_j|`.
    const HESSIAN_REL_TOL: f32 = 1e-5;

    /// Shared inputs share one accumulator; the sum over calls is the reference's within the
    /// bound; a module outside the wanted set breaks a chain; a member whose input later
    /// differs from its group's is an error.
    #[test]
    fn accumulates_and_shares_inputs() {
        let k = 37;
        let mut set = HessianSet::new(["q", "k", "v", "o"].map(String::from));
        let (x1, x2, x3) = (data(5 * k, 1), data(3 * k, 2), data(4 * k, 3));
        for x in [&x1, &x2] {
            let m = x.len() / k;
            set.add("q", x, m, k);
            set.add("k", x, m, k);
            set.add("v", x, m, k);
            set.add("unwanted", &x3, 4, k);
            set.add("o", &x3, 4, k);
        }
        let h = set.finish().unwrap();
        assert!(std::sync::Arc::ptr_eq(&h["q"], &h["v"]));
        assert_eq!(h["q"].modules, ["q", "k", "v"]);
        assert_eq!((h["q"].tokens, h["o"].tokens), (8, 8));
        assert!(!h.contains_key("unwanted"));
        let mut both = x1.clone();
        both.extend(&x2);
        let want = outer_sum_ref(&both, 8, k);
        for i in 0..k {
            for j in 0..k {
                let mag: f32 = both.chunks(k).map(|r| (r[i] * r[j]).abs()).sum();
                let (g, w) = (h["q"].sum[i * k + j], want[i * k + j]);
                assert!(
                    (g - w).abs() <= HESSIAN_REL_TOL * mag,
                    "[{i},{j}] {g} vs {w}"
                );
            }
        }

        // The diagonal alone is the full matrix's diagonal.
        let mut dset = HessianSet::diagonal(["q", "k"].map(String::from));
        for x in [&x1, &x2] {
            dset.add("q", x, x.len() / k, k);
            dset.add("k", x, x.len() / k, k);
        }
        let dh = dset.finish().unwrap();
        for (a, b) in dh["k"].diag().iter().zip(h["q"].diag()) {
            assert!((a - b).abs() <= HESSIAN_REL_TOL * b.abs(), "{a} vs {b}");
        }
        assert_eq!(dh["q"].sum.len(), k);

        let mut set = HessianSet::new(["q", "k"].map(String::from));
        set.add("q", &x1, 5, k);
        set.add("k", &x1, 5, k);
        set.add("q", &x1, 5, k);
        set.add("k", &x2, 3, k);
        assert!(set.finish().unwrap_err().contains("`k` read an input"));
    }
}
