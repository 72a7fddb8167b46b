//! GPTQ (Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
//! Transformers", 2022) for symmetric integer weights whose scales are fixed before the sweep:
//! the column-by-column sweep with error feedback through the upper Cholesky factor of the
//! inverse Hessian, as llm-compressor's `GPTQModifier` and AMD Quark's GPTQ run it.
//!
//! What the caller gives: the weight `[rows, cols]` (f32), the Hessian `H = (2/N)·Σ x xᵀ`
//! `[cols, cols]` (its overall scale does not change the codes: damping is relative), and the
//! scales `[rows, cols / group]`, already computed by the format's own RTN recipe and rounded to
//! the stored scale dtype (per channel: `group == cols`; per group: static groups in the original
//! column order, Quark's `static_groups` and llm-compressor's GROUP strategy). What comes back:
//! the codes `[rows, cols]` (row-major `i8`, original column order) and the GPTQ loss per row,
//! `Σ_j ((w_j − q_j) / d_j)² / 2` (llm-compressor's, `d_j = U[j, j]`).
//!
//! The algorithm as implemented (sources and agreement: docs/quantize.md, "GPTQ"):
//!
//! 1. act-order (static, on by default): permute columns by descending `diag(H)` (stable: ties
//!    keep their index order), codes written back in the original order;
//! 2. dead columns (`H[d, d] == 0`): `H[d, d] = 1`, `W[:, d] = 0` (their code is 0);
//! 3. damping `0.01 · mean(diag H)` added to the diagonal;
//! 4. `U` upper with `H⁻¹ = Uᵀ U`; if the Cholesky fails, retry with extra diagonal damping
//!    `max(|damp|, 1e-6 · mean|diag H|, eps)`, ×10 per try, up to 5 tries (Quark's
//!    `_compute_hinv_cholesky_factor`), then [`GptqError::NotPositiveDefinite`]: never a silent
//!    fallback to RTN (llm-compressor falls back to RTN with a warning; a caller that wants that
//!    can do it knowingly);
//! 5. the sweep in blocks of 128 columns: `k = clamp(round_half_even(w / s), qmin, qmax)` (true
//!    division, as compressed-tensors' `x / scale`, not Quark's multiplication by `1/s`),
//!    `q = dtype(k · s)` (the product rounded to the scale's dtype, as compressed-tensors'
//!    `quantized.to(scale.dtype) * scale`), `e = (w − q) / U[j, j]`, the rest of the block
//!    updated by `e · U[j, j+1..]`, the columns after the block by `E · U[block, after]`.
//!
//! [`reference::quantize`] is the plain transliteration in f64; [`quantize`] is the fast path
//! (f32; the factor with faer in [`factor`], the sweep parallel over rows in [`sweep`]), tested
//! against it with named bounds. [`grid`] is the one quantizer both use; [`order`] the
//! act-order permutation.

pub mod api;
pub mod factor;
pub mod grid;
pub mod order;
pub mod reference;
pub mod sweep;
#[cfg(test)]
mod tests;

pub use api::{Config, GptqError, Layer, Output, Report};
pub use grid::Grid;

use api::{check_finite, validate};

/// The fast path: f32, the factor with faer ([`factor`]), the sweep parallel over rows
/// ([`sweep`]). `h` is the Hessian `[cols, cols]` (symmetric), used as the workspace: on return
/// it holds the permuted, damped Hessian's factor and is no longer the Hessian. Peak memory
/// beyond the caller's buffers: one more `cols²` f32 (the factor) and the weight's f32 copy.
pub fn quantize(layer: &Layer, h: &mut [f32], cfg: &Config) -> Result<Output, GptqError> {
    validate(layer, h.len(), cfg)?;
    check_finite(h)?;
    let n = layer.cols;
    let perm = if cfg.act_order {
        order::descending_diag(n, |i| h[i * n + i] as f64)
    } else {
        (0..n).collect()
    };
    order::permute_square(h, n, &perm);
    let mut w = order::permute_columns(layer.weight, layer.rows, n, &perm);
    let dead = factor::fix_dead(h, &mut w, layer.rows, n);
    let (u, mut report) = factor::upper_inverse_factor(h, n, cfg)?;
    report.dead = dead;
    let (codes, loss) = sweep::run(layer, &mut w, &u, &perm, cfg.block_size);
    Ok(Output {
        codes,
        loss,
        report,
    })
}
