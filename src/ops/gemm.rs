//! The blocked matrix product of the CPU runtimes: `y [m, n] = x [m, k] · Wᵀ` (PyTorch
//! `Linear`, `W` is `[out, in]`), with `W` kept in its stored precision (f32, BF16, F16 rows) and
//! converted to f32 one panel of rows at a time inside the product, never as a whole-matrix
//! copy. The product of each panel is the `gemm` crate's (blocked, packed, with AVX-512 / AVX2 /
//! NEON micro-kernels chosen at run time and a portable fallback); panels run in parallel over
//! rayon. [`super::linear_ref`] is the spec; [`matmul_nt`] is tested against it under
//! [`GEMM_REL_TOL`].

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
    /// Stored bytes of `dtype` (BF16, F16 or F32), or `None` for another dtype.
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

/// Rows of `W` per panel: a panel is converted (if not f32) into one f32 buffer of
/// `PANEL · k` (for k = 7168: 1.8 MB) and multiplied as one `gemm` call.
const PANEL: usize = 64;

/// A raw output pointer shared by the panel tasks, each of which writes its own columns.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: the tasks write disjoint column ranges of one `[m, n]` buffer that outlives them
// (`matmul_nt` joins them before returning it).
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// The pointer (a method, so that closures capture the whole `Out`, which is `Sync`).
    fn at(self, j: usize) -> *mut f32 {
        // SAFETY: the caller's offset stays inside the output buffer (see `matmul_nt`).
        unsafe { self.0.add(j) }
    }
}

/// `y [m, n] = x [m, k] · Wᵀ` with `w` the `[n, k]` rows in their stored precision.
pub fn matmul_nt(x: &[f32], m: usize, k: usize, w: Rows<'_>, n: usize) -> Vec<f32> {
    assert_eq!(x.len(), m * k, "x is [m, k]");
    assert_eq!(w.len(), n * k, "w is [n, k]");
    let mut y = vec![0f32; m * n];
    if m == 0 || n == 0 {
        return y;
    }
    if k == 0 {
        return y;
    }
    let out = Out(y.as_mut_ptr());
    let panels = n.div_ceil(PANEL);
    (0..panels)
        .into_par_iter()
        .for_each_init(Vec::new, |buf: &mut Vec<f32>, p| {
            let j0 = p * PANEL;
            let nb = PANEL.min(n - j0);
            let rhs: &[f32] = match w {
                Rows::F32(w) => &w[j0 * k..(j0 + nb) * k],
                _ => {
                    buf.resize(nb * k, 0.0);
                    w.to_f32(j0 * k, &mut buf[..nb * k]);
                    &buf[..nb * k]
                }
            };
            // SAFETY: `dst` is column `j0` of the `[m, n]` output (row stride n, column stride
            // 1) and this task writes only its `nb` columns; `lhs` is `x` `[m, k]` (row stride
            // k); `rhs` is the panel's `[nb, k]` rows read as the `[k, nb]` matrix Wᵀ (row
            // stride 1, column stride k). Every index stays inside its slice.
            unsafe {
                gemm::gemm(
                    m,
                    nb,
                    k,
                    out.at(j0),
                    1,
                    n as isize,
                    false,
                    x.as_ptr(),
                    1,
                    k as isize,
                    rhs.as_ptr(),
                    k as isize,
                    1,
                    0.0f32,
                    1.0f32,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        });
    y
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

    #[test]
    fn empty_shapes() {
        assert!(matmul_nt(&[], 0, 4, Rows::F32(&[0.0; 8]), 2).is_empty());
        assert_eq!(matmul_nt(&[], 2, 0, Rows::F32(&[]), 3), vec![0.0; 6]);
    }
}
