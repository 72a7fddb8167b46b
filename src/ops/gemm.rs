//! The blocked matrix product of the CPU runtimes: `y [m, n] = x [m, k] · Wᵀ` (PyTorch
//! `Linear`, `W` is `[out, in]`), with `W` kept in its stored precision (f32, BF16, F16 rows, or
//! a packed quantized layout behind [`Decode`]) and converted to f32 one block at a time inside
//! the product (the packing step), never as a whole-matrix copy. [`super::linear_ref`] is the
//! spec; [`matmul_nt`] is tested against it under [`GEMM_REL_TOL`].
//!
//! Every output element is one chain of fused multiply-adds over `p = 0..k`, in order, starting
//! from zero — computed the same way whatever `m` is and wherever its row sits in the batch.
//! So a row's outputs do not depend on the rows beside it: the draft replay's incremental passes
//! equal its teacher-forced one bit for bit, which the runtimes' tests require. (The `gemm`
//! crate was measured first: its small-`m` kernels sum in another order than its large-`m`
//! ones, so a row changed with the batch it was in.) The portable loop (no AVX-512F) runs the
//! same chain with a separate multiply and add, which is `linear_ref`'s arithmetic exactly.
//!
//! The blocking is the classical one (BLIS / GotoBLAS): `x` is packed once per call into
//! micro-panels of [`MR`] rows (`[k][MR]`, zero rows past `m`); tasks of [`NC`] weight rows run
//! in parallel (rayon); inside a task, for each k-block of [`KC`] inputs the weight rows are
//! converted to f32 and packed transposed into strips of [`NR`] columns (`[KC][NR]`, zero
//! columns past `n`), and a register micro-kernel of `MR × NR` accumulators (24 AVX-512 vectors)
//! runs over every micro-panel × strip, each step three vector loads of weights and one
//! broadcast per input row. The accumulators of a task live in a `[m, NC]` buffer between
//! k-blocks.

use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use crate::io::Dtype;

/// A packed weight layout that can expand any range of its row-major `[n, k]` elements to f32
/// (a quantized module kept in memory as stored, its scales beside it).
pub trait Decode: Sync {
    /// Number of logical elements (`n · k`).
    fn elements(&self) -> usize;
    /// Elements `from..from + out.len()` (row-major) as f32, exactly the values the format's
    /// own dequantization gives.
    fn decode(&self, from: usize, out: &mut [f32]);
}

/// Weight rows `[n, k]`, row-major, as stored: f32, little-endian BF16 / F16 bytes, or a packed
/// layout.
#[derive(Clone, Copy)]
pub enum Rows<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u8]),
    F16(&'a [u8]),
    Packed(&'a dyn Decode),
}

impl std::fmt::Debug for Rows<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Rows::F32(_) => "F32",
            Rows::Bf16(_) => "Bf16",
            Rows::F16(_) => "F16",
            Rows::Packed(_) => "Packed",
        };
        write!(f, "Rows::{kind}({} elements)", self.len())
    }
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
            Rows::Packed(d) => d.elements(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements `from..from + out.len()` as f32 (exact: BF16 and F16 widen without rounding; a
    /// packed layout gives its format's dequantized values).
    pub fn to_f32(&self, from: usize, out: &mut [f32]) {
        let to = from + out.len();
        match self {
            Rows::F32(w) => out.copy_from_slice(&w[from..to]),
            Rows::Bf16(b) => crate::io::dtype::to_f32_into(Dtype::BF16, &b[2 * from..2 * to], out),
            Rows::F16(b) => crate::io::dtype::to_f32_into(Dtype::F16, &b[2 * from..2 * to], out),
            Rows::Packed(d) => d.decode(from, out),
        }
    }
}

/// The bound of [`matmul_nt`] against the sequential sum of [`super::linear_ref`], per output
/// element, relative to `Σ_p |x_p · w_p|`. Both run the same sequential order; the AVX-512 path
/// fuses each multiply-add (one rounding instead of two), so the two differ by at most
/// `γ_k = k·u/(1 − k·u)` of that magnitude (u = 2⁻²⁴) and in practice like √k·u. 2⁻¹⁴ (6.1e-5)
/// holds every K the drafts have (≤ 21 504) by a wide margin on random and on the fixtures'
/// weights (tested), and is far below the bf16 rounding (2⁻⁹) every weight already carries.
/// The portable path equals `linear_ref` bit for bit.
pub const GEMM_REL_TOL: f32 = 1.0 / 16384.0;

/// Input rows per micro-panel (register tile rows).
pub const MR: usize = 8;
/// Weight columns per strip (register tile columns: three 16-float vectors).
pub const NR: usize = 48;
/// Weight rows per task (four strips).
pub const NC: usize = 4 * NR;
/// Inputs per k-block.
pub const KC: usize = 256;
/// Inputs per k-block when the whole batch is one micro-panel (`m ≤ MR`): there every weight is
/// used once, the product is bound by reading the weights, and longer runs of each row keep the
/// hardware prefetchers streaming (measured: 8× at m = 1, K = 7168). Blocking does not change
/// any element's chain.
pub const KC_ONE_PANEL: usize = 2048;

/// Floating-point operations done by [`matmul_nt`] in this process (`2·m·n·k` a call) and the
/// wall time spent inside it, for `kquant bench replay`'s share of the FMA peak.
static FLOPS: AtomicU64 = AtomicU64::new(0);
static NANOS: AtomicU64 = AtomicU64::new(0);

/// [`FLOPS`] so far.
pub fn flops_done() -> u64 {
    FLOPS.load(Ordering::Relaxed)
}

/// Wall seconds spent inside [`matmul_nt`] so far (the runtimes call it from one thread at a
/// time; concurrent calls would count their overlap twice).
pub fn seconds_in() -> f64 {
    NANOS.load(Ordering::Relaxed) as f64 * 1e-9
}

/// A raw output pointer shared by the tasks, each of which writes its own columns.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: the tasks write disjoint column ranges of one `[m, n]` buffer that outlives them
// (`matmul_nt` joins them before returning it).
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// Copy `v` to flat indices `at..at + v.len()` (a method, so that closures capture the
    /// whole `Out`, which is `Sync`).
    ///
    /// # Safety
    /// The range is inside the output buffer and no other task writes it.
    unsafe fn put(self, at: usize, v: &[f32]) {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.0.add(at), v.len()) }
    }
}

/// `x [m, k]` as micro-panels: panel `i` holds rows `i·MR..` as `[k][MR]`, zeros past `m`.
fn pack_x(x: &[f32], m: usize, k: usize) -> Vec<f32> {
    let mut xp = vec![0f32; m.div_ceil(MR) * k * MR];
    xp.par_chunks_mut(k * MR).enumerate().for_each(|(i, dst)| {
        for r in 0..MR.min(m - i * MR) {
            let row = &x[(i * MR + r) * k..][..k];
            for (d, &v) in dst[r..].iter_mut().step_by(MR).zip(row) {
                *d = v;
            }
        }
    });
    xp
}

/// Weight rows `j0..j0 + nb`, inputs `pc..pc + kb`, as f32 strips `[kb][NR]` (strip `s` at
/// `s·kc·NR`; zero columns past `nb`). `rows` is scratch for [`NR`] rows of `kb`.
#[allow(clippy::too_many_arguments)]
fn pack_w(
    w: Rows<'_>,
    k: usize,
    j0: usize,
    nb: usize,
    pc: usize,
    kb: usize,
    kc: usize,
    bp: &mut [f32],
    rows: &mut [f32],
    avx512: bool,
) {
    for s in 0..nb.div_ceil(NR) {
        let strip = &mut bp[s * kc * NR..][..kb * NR];
        let cols = NR.min(nb - s * NR);
        for c in 0..cols {
            w.to_f32((j0 + s * NR + c) * k + pc, &mut rows[c * kb..][..kb]);
        }
        transpose(&rows[..cols * kb], cols, kb, strip, avx512);
    }
}

/// `strip [kb][NR]` = the transpose of `rows [cols][kb]`, zero columns past `cols`.
fn transpose(rows: &[f32], cols: usize, kb: usize, strip: &mut [f32], avx512: bool) {
    assert!(rows.len() == cols * kb && cols <= NR && strip.len() >= kb * NR);
    #[cfg(target_arch = "x86_64")]
    if avx512 {
        // SAFETY: the CPU has AVX-512F (the caller checked); lengths asserted above.
        unsafe { transpose_avx512(rows, cols, kb, strip) };
        return;
    }
    let _ = avx512;
    for (p, dst) in strip.chunks_exact_mut(NR).take(kb).enumerate() {
        for (c, d) in dst[..cols].iter_mut().enumerate() {
            *d = rows[c * kb + p];
        }
        dst[cols..].fill(0.0);
    }
}

/// [`transpose`] in 16 × 16 blocks in registers (two unpack stages and two 128-bit lane
/// shuffles); a last partial block of inputs is copied element by element.
///
/// # Safety
/// The CPU has AVX-512F; `rows.len() == cols·kb`, `cols ≤ NR`, `strip.len() ≥ kb·NR`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose_avx512(rows: &[f32], cols: usize, kb: usize, strip: &mut [f32]) {
    use std::arch::x86_64::*;
    let full = kb / 16 * 16;
    // SAFETY: row `c0 + i < cols` is read at `(c0 + i)·kb + p0 .. + 16 ≤ cols·kb` (p0 + 16 ≤
    // full ≤ kb); stores write 16 floats at `(p0 + c)·NR + c0`, c0 ≤ 32, p0 + c < kb.
    unsafe {
        for c0 in (0..NR).step_by(16) {
            let live = cols.saturating_sub(c0).min(16);
            for p0 in (0..full).step_by(16) {
                let r: [__m512; 16] = std::array::from_fn(|i| {
                    if i < live {
                        _mm512_loadu_ps(rows.as_ptr().add((c0 + i) * kb + p0))
                    } else {
                        _mm512_setzero_ps()
                    }
                });
                // 32-bit interleave of row pairs: t[2j] = (r[2j][0], r[2j+1][0], r[2j][1], …)
                // per 128-bit lane, t[2j+1] the upper halves.
                let t: [__m512; 16] = std::array::from_fn(|i| {
                    let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
                    if i % 2 == 0 {
                        _mm512_unpacklo_ps(a, b)
                    } else {
                        _mm512_unpackhi_ps(a, b)
                    }
                });
                // 64-bit interleave: u[4g + e] holds element 4L + e of rows 4g..4g + 3 in lane L.
                let u: [__m512; 16] = std::array::from_fn(|i| {
                    let (g, e) = (i / 4, i % 4);
                    let (a, b) = (t[4 * g + e / 2], t[4 * g + 2 + e / 2]);
                    let (a, b) = (_mm512_castps_pd(a), _mm512_castps_pd(b));
                    _mm512_castpd_ps(if e % 2 == 0 {
                        _mm512_unpacklo_pd(a, b)
                    } else {
                        _mm512_unpackhi_pd(a, b)
                    })
                });
                for e in 0..4 {
                    let v0 = _mm512_shuffle_f32x4::<0x88>(u[e], u[4 + e]);
                    let v1 = _mm512_shuffle_f32x4::<0xDD>(u[e], u[4 + e]);
                    let v2 = _mm512_shuffle_f32x4::<0x88>(u[8 + e], u[12 + e]);
                    let v3 = _mm512_shuffle_f32x4::<0xDD>(u[8 + e], u[12 + e]);
                    let cols_out = [
                        (e, _mm512_shuffle_f32x4::<0x88>(v0, v2)),
                        (4 + e, _mm512_shuffle_f32x4::<0x88>(v1, v3)),
                        (8 + e, _mm512_shuffle_f32x4::<0xDD>(v0, v2)),
                        (12 + e, _mm512_shuffle_f32x4::<0xDD>(v1, v3)),
                    ];
                    for (c, v) in cols_out {
                        _mm512_storeu_ps(strip.as_mut_ptr().add((p0 + c) * NR + c0), v);
                    }
                }
            }
            for p in full..kb {
                for i in 0..16 {
                    strip[p * NR + c0 + i] = if i < live {
                        rows[(c0 + i) * kb + p]
                    } else {
                        0.0
                    };
                }
            }
        }
    }
}

/// `y [m, n] = x [m, k] · Wᵀ` with `w` the `[n, k]` rows in their stored precision.
pub fn matmul_nt(x: &[f32], m: usize, k: usize, w: Rows<'_>, n: usize) -> Vec<f32> {
    matmul(x, m, k, w, n, has_avx512())
}

/// [`matmul_nt`] on the AVX-512 micro-kernel (`avx512`, which the caller has checked the CPU
/// has) or the portable one.
fn matmul(x: &[f32], m: usize, k: usize, w: Rows<'_>, n: usize, avx512: bool) -> Vec<f32> {
    assert_eq!(x.len(), m * k, "x is [m, k]");
    assert_eq!(w.len(), n * k, "w is [n, k]");
    let t0 = std::time::Instant::now();
    FLOPS.fetch_add(2 * (m * n * k) as u64, Ordering::Relaxed);
    let mut y = vec![0f32; m * n];
    if m == 0 || n == 0 || k == 0 {
        return y;
    }
    let xp = pack_x(x, m, k);
    let panels = m.div_ceil(MR);
    let kc = if panels == 1 { KC_ONE_PANEL } else { KC };
    let out = Out(y.as_mut_ptr());
    (0..n.div_ceil(NC)).into_par_iter().for_each_init(
        || (vec![0f32; kc * NC], vec![0f32; kc * NR], Vec::new()),
        |(bp, rows, c): &mut (Vec<f32>, Vec<f32>, Vec<f32>), task| {
            let j0 = task * NC;
            let nb = NC.min(n - j0);
            // The task's accumulators `[panels · MR, NC]`, zero before the first k-block.
            c.clear();
            c.resize(panels * MR * NC, 0.0);
            for pc in (0..k).step_by(kc) {
                let kb = kc.min(k - pc);
                pack_w(w, k, j0, nb, pc, kb, kc, bp, rows, avx512);
                for i in 0..panels {
                    let a = &xp[i * k * MR + pc * MR..][..kb * MR];
                    let live = MR.min(m - i * MR);
                    for s in 0..nb.div_ceil(NR) {
                        let b = &bp[s * kc * NR..][..kb * NR];
                        micro(a, b, kb, &mut c[i * MR * NC + s * NR..], live, avx512);
                    }
                }
            }
            for i in 0..m {
                // SAFETY: row i < m, columns j0..j0 + nb ≤ n are this task's alone.
                unsafe { out.put(i * n + j0, &c[i * NC..][..nb]) };
            }
        },
    );
    NANOS.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    y
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

/// One micro-tile: `c [rows, NR]` (row stride [`NC`]) += `a [kb][MR]` · `b [kb][NR]`, over the
/// first `rows` rows of the micro-panel (the others are padding and not computed).
fn micro(a: &[f32], b: &[f32], kb: usize, c: &mut [f32], rows: usize, avx512: bool) {
    assert!(
        a.len() >= kb * MR && b.len() >= kb * NR && (1..=MR).contains(&rows),
        "micro-tile operands"
    );
    assert!(c.len() >= (rows - 1) * NC + NR, "micro-tile accumulators");
    #[cfg(target_arch = "x86_64")]
    if avx512 {
        // SAFETY: the CPU has AVX-512F (the caller checked); the operand lengths are asserted
        // above.
        unsafe {
            match rows {
                8 => micro_avx512::<8>(a, b, kb, c),
                7 => micro_avx512::<7>(a, b, kb, c),
                6 => micro_avx512::<6>(a, b, kb, c),
                5 => micro_avx512::<5>(a, b, kb, c),
                4 => micro_avx512::<4>(a, b, kb, c),
                3 => micro_avx512::<3>(a, b, kb, c),
                2 => micro_avx512::<2>(a, b, kb, c),
                _ => micro_avx512::<1>(a, b, kb, c),
            }
        }
        return;
    }
    let _ = avx512;
    micro_portable(a, b, kb, c, rows);
}

/// The portable micro-tile: the same chain per element, multiply then add.
fn micro_portable(a: &[f32], b: &[f32], kb: usize, c: &mut [f32], rows: usize) {
    for r in 0..rows {
        let cr = &mut c[r * NC..][..NR];
        for p in 0..kb {
            let av = a[p * MR + r];
            for (acc, &bv) in cr.iter_mut().zip(&b[p * NR..][..NR]) {
                *acc += av * bv;
            }
        }
    }
}

/// The AVX-512 micro-tile: `R × 3` accumulator vectors, one fused multiply-add per input.
///
/// # Safety
/// The CPU has AVX-512F; `a.len() ≥ kb·MR`, `b.len() ≥ kb·NR`, and `c` holds `R` rows of
/// stride [`NC`] of at least [`NR`] floats each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn micro_avx512<const R: usize>(a: &[f32], b: &[f32], kb: usize, c: &mut [f32]) {
    use std::arch::x86_64::*;
    // SAFETY (every load and store): rows r < R of `c` at r·NC + {0, 16, 32} (16 floats each,
    // inside NR); `b` at p·NR + {0, 16, 32} for p < kb; `a` at p·MR + r, r < R ≤ MR.
    unsafe {
        let cp = c.as_mut_ptr();
        let mut acc: [[__m512; 3]; R] = std::array::from_fn(|r| {
            std::array::from_fn(|v| _mm512_loadu_ps(cp.add(r * NC + 16 * v)))
        });
        let (ap, bp) = (a.as_ptr(), b.as_ptr());
        for p in 0..kb {
            let b0 = _mm512_loadu_ps(bp.add(p * NR));
            let b1 = _mm512_loadu_ps(bp.add(p * NR + 16));
            let b2 = _mm512_loadu_ps(bp.add(p * NR + 32));
            for (r, acc) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*ap.add(p * MR + r));
                acc[0] = _mm512_fmadd_ps(av, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(av, b1, acc[1]);
                acc[2] = _mm512_fmadd_ps(av, b2, acc[2]);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (v, &x) in acc.iter().enumerate() {
                _mm512_storeu_ps(cp.add(r * NC + 16 * v), x);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::linear_ref;
    use half::{bf16, f16};

    fn data(len: usize, seed: u64) -> Vec<f32> {
        crate::test_rng::Rng(seed.wrapping_mul(2654435761).max(1)).signed_units(len)
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
            (9, 700, 2 * NC + 7),
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
    /// across the micro-panel edges (MR) and a k that is not a multiple of a vector.
    #[test]
    fn rows_do_not_depend_on_the_batch() {
        let (k, n) = (300, 70);
        let m = 2 * MR + 5;
        let x = data(m * k, 3);
        let w = data(n * k, 4);
        let bytes: Vec<u8> = w
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect();
        for rows in [Rows::F32(&w), Rows::Bf16(&bytes)] {
            let full = matmul_nt(&x, m, k, rows, n);
            for start in [1, 3, 4, MR - 1, MR, MR + 1, m - 2, m - 1] {
                let part = matmul_nt(&x[start * k..], m - start, k, rows, n);
                assert!(part == full[start * n..], "start {start}");
            }
        }
    }

    /// The portable micro-kernel is `linear_ref`'s arithmetic (the same sequential chain,
    /// multiply then add) bit for bit, across task, strip, micro-panel and k-block edges.
    #[test]
    fn portable_path_is_the_reference_bit_for_bit() {
        let (m, k, n) = (MR + 3, KC + 37, NC + NR + 5);
        let x = data(m * k, 5);
        let w = data(n * k, 6);
        assert!(matmul(&x, m, k, Rows::F32(&w), n, false) == linear_ref(&x, m, k, &w, n));
    }

    /// Every transpose path is the spec `strip[p·NR + c] = rows[c·kb + p]` (zero past `cols`),
    /// for every column count of a strip and an input count with a partial last block: the
    /// portable one always, the AVX-512 one as well on a CPU that has it (the portable loop is
    /// the only path elsewhere).
    #[test]
    fn transposes_are_the_spec() {
        let mut paths = vec![false];
        if has_avx512() {
            paths.push(true);
        }
        for cols in [1, 15, 16, 17, 33, NR] {
            let kb = 16 * 3 + 5;
            let rows = data(cols * kb, cols as u64);
            let want: Vec<f32> = (0..kb * NR)
                .map(|i| {
                    let (p, c) = (i / NR, i % NR);
                    if c < cols {
                        rows[c * kb + p]
                    } else {
                        0.0
                    }
                })
                .collect();
            for &avx512 in &paths {
                let mut got = vec![f32::NAN; kb * NR];
                transpose(&rows, cols, kb, &mut got, avx512);
                assert!(got == want, "cols {cols}, avx512 {avx512}");
            }
        }
    }

    #[test]
    fn empty_shapes() {
        assert!(matmul_nt(&[], 0, 4, Rows::F32(&[0.0; 8]), 2).is_empty());
        assert_eq!(matmul_nt(&[], 2, 0, Rows::F32(&[]), 3), vec![0.0; 6]);
    }
}

/// `cargo test --release --lib gemm_speed -- --ignored --nocapture`: the product's FLOP/s at
/// the Kimi draft's shapes on one thread, against the one-thread FMA peak measured beside it
/// (a tuning aid; `kquant bench replay` reports the figure that counts).
#[cfg(test)]
mod speed {
    use super::*;

    #[test]
    #[ignore = "a measurement, not a check"]
    fn gemm_speed() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        pool.install(|| {
            let peak = crate::ops::peak::measure(1, 0.5);
            for (m, k, n) in [
                (448, 7168, 4096),
                (448, 18432, 1024),
                (64, 7168, 4096),
                (1, 7168, 4096),
            ] {
                // KQUANT_GEMM_M=1: only the shapes of that m (for a profiler).
                if std::env::var("KQUANT_GEMM_M").is_ok_and(|v| v != m.to_string()) {
                    continue;
                }
                let x: Vec<f32> = (0..m * k).map(|i| (i % 97) as f32 * 0.01).collect();
                let w: Vec<u8> = (0..n * k)
                    .flat_map(|i| half::bf16::from_f32((i % 89) as f32 * 0.01).to_le_bytes())
                    .collect();
                let t = std::time::Instant::now();
                let mut reps = 0;
                while t.elapsed().as_secs_f64() < 1.0 {
                    std::hint::black_box(matmul_nt(&x, m, k, Rows::Bf16(&w), n));
                    reps += 1;
                }
                let f = 2.0 * (m * n * k * reps) as f64 / t.elapsed().as_secs_f64();
                eprintln!(
                    "m {m:4} k {k:5} n {n:5}: {:6.1} GFLOP/s = {:3.0} % of {:.1}",
                    f / 1e9,
                    100.0 * f / peak.flops,
                    peak.flops / 1e9
                );
            }
        });
    }
}
