//! The blocked matrix product of the CPU runtimes: `y [m, n] = x [m, k] · Wᵀ` (PyTorch
//! `Linear`, `W` is `[out, in]`), with `W` kept in its stored precision (f32, BF16, F16 rows) and
//! converted to f32 one panel of rows at a time inside the product, never as a whole-matrix
//! copy. [`super::linear_ref`] is the spec; [`matmul_nt`] is tested against it under
//! [`GEMM_REL_TOL`].
//!
//! Every output element is a dot product computed the same way whatever `m` is and wherever its
//! row sits in the batch: 16 lane partial sums (lane `l` takes the inputs `p ≡ l (mod 16)`, in
//! order, fused multiply-adds; a partial last chunk is masked to zeros), then one fixed
//! reduction of the lanes. So a row's outputs do not depend on the rows beside it: the draft
//! replay's incremental passes equal its teacher-forced one bit for bit, which the runtimes'
//! tests require. (The `gemm` crate was measured first: its small-`m` kernels sum in another
//! order than its large-`m` ones, so a row changed with the batch it was in.)
//!
//! The blocking: panels of [`PANEL`] weight rows in parallel (rayon); inside a panel, blocks of
//! [`MC`] input rows × [`KC`] inputs whose lane partials live in a scratch buffer between
//! k-blocks; inside a block, register tiles of 4 input rows × 4 weight rows (16 accumulator
//! vectors). AVX-512F when the CPU has it (detected at run time), else a portable loop with the
//! same lane structure (plain multiply-add: results are reproducible per path, not across
//! paths).

use rayon::prelude::*;

use crate::io::Dtype;

/// Weight rows `[n, k]`, row-major, as stored: f32, or little-endian BF16 / F16 bytes.
#[derive(Clone, Copy, Debug)]
pub enum Rows<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u8]),
    F16(&'a [u8]),
}

impl<'a> Rows<'a> {
    /// Stored bytes of `dtype` (BF16 or F16), or `None` for another dtype (F32 rows are
    /// [`Rows::F32`] over the converted values).
    pub fn from_bytes(dtype: Dtype, bytes: &'a [u8]) -> Option<Rows<'a>> {
        match dtype {
            Dtype::BF16 => Some(Rows::Bf16(bytes)),
            Dtype::F16 => Some(Rows::F16(bytes)),
            _ => None,
        }
    }

    /// Number of stored elements.
    pub fn len(&self) -> usize {
        match self {
            Rows::F32(w) => w.len(),
            Rows::Bf16(b) | Rows::F16(b) => b.len() / 2,
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements `from..from + out.len()` as f32 (exact: BF16 and F16 widen without rounding).
    pub fn to_f32(&self, from: usize, out: &mut [f32]) {
        let to = from + out.len();
        match self {
            Rows::F32(w) => out.copy_from_slice(&w[from..to]),
            Rows::Bf16(b) => crate::io::dtype::to_f32_into(Dtype::BF16, &b[2 * from..2 * to], out),
            Rows::F16(b) => crate::io::dtype::to_f32_into(Dtype::F16, &b[2 * from..2 * to], out),
        }
    }
}

/// The bound of [`matmul_nt`] against the sequential sum of [`super::linear_ref`], per output
/// element, relative to `Σ_p |x_p · w_p|`: both sums carry at most `γ_k = k·u/(1 − k·u)` of that
/// (u = 2⁻²⁴); the blocked product's partial sums run over register lanes and k-blocks, so in
/// practice its error grows like √k·u. 2⁻¹⁴ (6.1e-5) holds every K the drafts have (≤ 21 504)
/// by a wide margin on random and on the fixtures' weights (tested), and is far below the
/// bf16 rounding (2⁻⁹) every weight already carries.
pub const GEMM_REL_TOL: f32 = 1.0 / 16384.0;

/// Weight rows per panel (one task; converted to f32 in one buffer of `PANEL · k`).
pub const PANEL: usize = 64;
/// Input rows per block inside a panel.
pub const MC: usize = 64;
/// Inputs per k-block (a multiple of [`LANES`]).
pub const KC: usize = 256;
/// Lanes of the partial sums.
pub const LANES: usize = 16;
/// Register tile: input rows × weight rows.
const TM: usize = 4;
const TN: usize = 4;

/// A raw output pointer shared by the panel tasks, each of which writes its own columns.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: the tasks write disjoint column ranges of one `[m, n]` buffer that outlives them
// (`matmul_nt` joins them before returning it).
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// Store `v` at flat index `at` (a method, so that closures capture the whole `Out`, which
    /// is `Sync`).
    ///
    /// # Safety
    /// `at` is inside the output buffer and no other task writes it.
    unsafe fn put(self, at: usize, v: f32) {
        // SAFETY: the caller's contract.
        unsafe { *self.0.add(at) = v }
    }
}

/// Floating-point operations done by [`matmul_nt`] in this process (`2·m·n·k` a call), for
/// `kquant bench replay`'s share of the FMA peak.
static FLOPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// [`FLOPS`] so far.
pub fn flops_done() -> u64 {
    FLOPS.load(std::sync::atomic::Ordering::Relaxed)
}

/// `y [m, n] = x [m, k] · Wᵀ` with `w` the `[n, k]` rows in their stored precision.
pub fn matmul_nt(x: &[f32], m: usize, k: usize, w: Rows<'_>, n: usize) -> Vec<f32> {
    assert_eq!(x.len(), m * k, "x is [m, k]");
    assert_eq!(w.len(), n * k, "w is [n, k]");
    FLOPS.fetch_add(2 * (m * n * k) as u64, std::sync::atomic::Ordering::Relaxed);
    let mut y = vec![0f32; m * n];
    if m == 0 || n == 0 || k == 0 {
        return y;
    }
    let out = Out(y.as_mut_ptr());
    let avx512 = has_avx512();
    (0..n.div_ceil(PANEL)).into_par_iter().for_each_init(
        || (Vec::new(), Vec::new()),
        |(buf, acc): &mut (Vec<f32>, Vec<f32>), p| {
            let j0 = p * PANEL;
            let nb = PANEL.min(n - j0);
            let panel: &[f32] = match w {
                Rows::F32(w) => &w[j0 * k..(j0 + nb) * k],
                _ => {
                    buf.resize(nb * k, 0.0);
                    w.to_f32(j0 * k, &mut buf[..nb * k]);
                    &buf[..nb * k]
                }
            };
            acc.resize(MC * PANEL * LANES, 0.0);
            for i0 in (0..m).step_by(MC) {
                let mb = MC.min(m - i0);
                let acc = &mut acc[..mb * nb * LANES];
                acc.fill(0.0);
                for k0 in (0..k).step_by(KC) {
                    let kb = KC.min(k - k0);
                    block(x, k, i0, mb, panel, nb, k0, kb, acc, avx512);
                }
                for i in 0..mb {
                    for j in 0..nb {
                        let lanes = &acc[(i * nb + j) * LANES..][..LANES];
                        // SAFETY: row i0 + i < m, column j0 + j < n, and columns j0..j0 + nb
                        // are this task's alone.
                        unsafe { out.put((i0 + i) * n + j0 + j, reduce(lanes)) };
                    }
                }
            }
        },
    );
    y
}

/// The lanes' sum, in one fixed order (pairwise: 8 + 8, 4 + 4, 2 + 2, 1 + 1).
fn reduce(l: &[f32]) -> f32 {
    let mut v = [0f32; LANES];
    v.copy_from_slice(l);
    let mut w = LANES / 2;
    while w > 0 {
        for i in 0..w {
            v[i] += v[i + w];
        }
        w /= 2;
    }
    v[0]
}

fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One block: input rows `i0..i0 + mb` × the panel's `nb` rows × inputs `k0..k0 + kb`, adding
/// into `acc` (`[mb, nb, LANES]`). Tiles of 4 × 4; an edge tile repeats its last row (its
/// extra results are not stored), so every element is computed by the same arithmetic.
#[allow(clippy::too_many_arguments)]
fn block(
    x: &[f32],
    k: usize,
    i0: usize,
    mb: usize,
    panel: &[f32],
    nb: usize,
    k0: usize,
    kb: usize,
    acc: &mut [f32],
    avx512: bool,
) {
    for ti in (0..mb).step_by(TM) {
        for tj in (0..nb).step_by(TN) {
            let rows: [usize; TM] = std::array::from_fn(|r| (ti + r).min(mb - 1));
            let cols: [usize; TN] = std::array::from_fn(|c| (tj + c).min(nb - 1));
            let xs: [&[f32]; TM] = std::array::from_fn(|r| &x[(i0 + rows[r]) * k + k0..][..kb]);
            let ws: [&[f32]; TN] = std::array::from_fn(|c| &panel[cols[c] * k + k0..][..kb]);
            let mut tile = [[0f32; LANES]; TM * TN];
            for r in 0..TM {
                for c in 0..TN {
                    tile[r * TN + c]
                        .copy_from_slice(&acc[(rows[r] * nb + cols[c]) * LANES..][..LANES]);
                }
            }
            #[cfg(target_arch = "x86_64")]
            if avx512 {
                // SAFETY: the CPU has AVX-512F (`has_avx512`); every slice is `kb` long.
                unsafe { tile_avx512(&xs, &ws, kb, &mut tile) };
            } else {
                tile_portable(&xs, &ws, kb, &mut tile);
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                let _ = avx512;
                tile_portable(&xs, &ws, kb, &mut tile);
            }
            for r in 0..TM {
                if ti + r >= mb {
                    break;
                }
                for c in 0..TN {
                    if tj + c >= nb {
                        break;
                    }
                    acc[(rows[r] * nb + cols[c]) * LANES..][..LANES]
                        .copy_from_slice(&tile[r * TN + c]);
                }
            }
        }
    }
}

/// The portable tile: the lane structure of the AVX-512 one, multiply then add.
fn tile_portable(
    xs: &[&[f32]; TM],
    ws: &[&[f32]; TN],
    kb: usize,
    tile: &mut [[f32; LANES]; TM * TN],
) {
    for p0 in (0..kb).step_by(LANES) {
        let len = LANES.min(kb - p0);
        for r in 0..TM {
            for c in 0..TN {
                let t = &mut tile[r * TN + c];
                for l in 0..len {
                    t[l] += xs[r][p0 + l] * ws[c][p0 + l];
                }
            }
        }
    }
}

/// The AVX-512 tile: 16 accumulator vectors, fused multiply-adds, a masked last chunk.
///
/// # Safety
/// The CPU has AVX-512F, and every slice of `xs` and `ws` is `kb` long.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile_avx512(
    xs: &[&[f32]; TM],
    ws: &[&[f32]; TN],
    kb: usize,
    tile: &mut [[f32; LANES]; TM * TN],
) {
    use std::arch::x86_64::*;
    // SAFETY (every load and store below): loads read `LANES` floats at `p0 < kb - LANES + 1`
    // (full chunks) or masked to the `kb - p0` valid ones; the tile arrays are `LANES` long.
    unsafe {
        let mut a: [__m512; TM * TN] = std::array::from_fn(|i| _mm512_loadu_ps(tile[i].as_ptr()));
        let full = kb / LANES * LANES;
        let mut p0 = 0;
        while p0 < full {
            let xv: [__m512; TM] = std::array::from_fn(|r| _mm512_loadu_ps(xs[r].as_ptr().add(p0)));
            for c in 0..TN {
                let wv = _mm512_loadu_ps(ws[c].as_ptr().add(p0));
                for r in 0..TM {
                    a[r * TN + c] = _mm512_fmadd_ps(xv[r], wv, a[r * TN + c]);
                }
            }
            p0 += LANES;
        }
        if full < kb {
            let mask: __mmask16 = (1u32 << (kb - full)).wrapping_sub(1) as __mmask16;
            let xv: [__m512; TM] =
                std::array::from_fn(|r| _mm512_maskz_loadu_ps(mask, xs[r].as_ptr().add(full)));
            for c in 0..TN {
                let wv = _mm512_maskz_loadu_ps(mask, ws[c].as_ptr().add(full));
                for r in 0..TM {
                    a[r * TN + c] = _mm512_fmadd_ps(xv[r], wv, a[r * TN + c]);
                }
            }
        }
        for (t, v) in tile.iter_mut().zip(a) {
            _mm512_storeu_ps(t.as_mut_ptr(), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::linear_ref;
    use half::{bf16, f16};

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

    /// Within the bound of the reference, per element, for every stored precision, odd
    /// shapes (panels that do not divide n, m = 1, k not a multiple of a vector).
    #[test]
    fn blocked_product_is_within_the_bound_of_the_reference() {
        for (m, k, n) in [
            (1, 7, 3),
            (5, 64, 130),
            (17, 333, 65),
            (64, 1024, 256),
            (3, 4096, 70),
        ] {
            let x = data(m * k, 1);
            let w = data(n * k, 2);
            for dtype in [Dtype::F32, Dtype::BF16, Dtype::F16] {
                let (wq, bytes): (Vec<f32>, Vec<u8>) = match dtype {
                    Dtype::BF16 => (
                        w.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
                        w.iter()
                            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                            .collect(),
                    ),
                    Dtype::F16 => (
                        w.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
                        w.iter()
                            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                            .collect(),
                    ),
                    _ => (w.clone(), Vec::new()),
                };
                let rows = match dtype {
                    Dtype::F32 => Rows::F32(&wq),
                    _ => Rows::from_bytes(dtype, &bytes).unwrap(),
                };
                let got = matmul_nt(&x, m, k, rows, n);
                let want = linear_ref(&x, m, k, &wq, n);
                for i in 0..m {
                    for j in 0..n {
                        let mag: f32 = (0..k).map(|p| (x[i * k + p] * wq[j * k + p]).abs()).sum();
                        let (g, r) = (got[i * n + j], want[i * n + j]);
                        assert!(
                            (g - r).abs() <= GEMM_REL_TOL * mag,
                            "{dtype} {m}x{k}x{n} [{i},{j}]: {g} vs {r} (Σ|xw| {mag})"
                        );
                    }
                }
            }
        }
    }

    /// A row's outputs do not depend on the rows beside it or how many there are (what the
    /// runtimes' incremental and teacher-forced passes need), for every stored precision and
    /// across the block edges (MC, TM) and a k that is not a multiple of the lanes.
    #[test]
    fn rows_do_not_depend_on_the_batch() {
        let (k, n) = (300, 70);
        let m = MC + 9;
        let x = data(m * k, 3);
        let w = data(n * k, 4);
        let bytes: Vec<u8> = w
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect();
        for rows in [Rows::F32(&w), Rows::Bf16(&bytes)] {
            let full = matmul_nt(&x, m, k, rows, n);
            for start in [1, 3, 4, 9, MC - 1, MC, m - 2, m - 1] {
                let part = matmul_nt(&x[start * k..], m - start, k, rows, n);
                assert!(part == full[start * n..], "start {start}");
            }
        }
    }

    #[test]
    fn empty_shapes() {
        assert!(matmul_nt(&[], 0, 4, Rows::F32(&[0.0; 8]), 2).is_empty());
        assert_eq!(matmul_nt(&[], 2, 0, Rows::F32(&[]), 3), vec![0.0; 6]);
    }
}
