//! The dense (unquantized) device path and the row argmax on every device, in tiers
//! (`common::device_tests!`: `::cpu_emu` always, `::cuda` / `::hip` `#[ignore]`d under their
//! feature): (1) `Backend::dense_on` (bf16 / f16 weights through the vendor `GemmEx`, f32 compute)
//! against the plain f32 product `reference::dense_ref` within `DENSE_REL_L1_TOL`; (2)
//! `kq_argmax_rows` against `reference::argmax_ref` exactly, on rows with ties, signed zeros,
//! infinities, subnormals and NaNs, narrower and wider than its block, up to a Kimi vocabulary;
//! (3) the fused paths (GEMM or W4A16 in each regime, then the argmax on the device) return the
//! argmax of the outputs the unfused calls return; (4) malformed calls are typed errors.
//! Shapes: the Kimi draft's lm_head and fc K with a slice of N (the full N on a GPU under
//! `KQUANT_GPU_FULL_SHAPES=1`).

use crate::common::{self, device_tests};

use std::sync::Arc;

use kquant::gpu::reference::{
    argmax_ref, dense_abs_l1, dense_ref, first_violation, DENSE_REL_L1_TOL,
};
use kquant::gpu::{Act, Backend, GpuError, Regime, W4Layout};
use kquant::io::Dtype;
use kquant::ops;
use kquant::quant::math::int4;

/// Deterministic values in `[-a, a)` as bit patterns of `dtype`.
fn values(len: usize, seed: u32, a: f32, dtype: Act) -> Vec<u16> {
    (0..len)
        .map(|i| {
            let h = (i as u32).wrapping_mul(2654435761).rotate_left(11) ^ seed;
            dtype.from_f32(((h % 20001) as f32 / 10000.0 - 1.0) * a)
        })
        .collect()
}

/// (N, K): the Kimi-K2.5 EAGLE-3 draft's lm_head (163840 × 7168) and fc (7168 × 21504), and a
/// K that is no multiple of 8.
const SHAPES: [(usize, usize); 3] = [(163840, 7168), (7168, 21504), (37, 1001)];

fn slice_n(dev: &dyn Backend, n: usize) -> usize {
    if !common::is_emulation(dev) && std::env::var("KQUANT_GPU_FULL_SHAPES").as_deref() == Ok("1") {
        n
    } else {
        n.min(24)
    }
}

/// The weight rows whose outputs are held to the plain product: all of them up to 4096, else
/// the first and last 32 and every 61st between (61 is prime: the stride meets every residue of
/// the kernels' tile sizes).
fn checked_rows(n: usize) -> Vec<usize> {
    if n <= 4096 {
        return (0..n).collect();
    }
    let mut r: Vec<usize> = (0..32)
        .chain((32..n - 32).step_by(61))
        .chain(n - 32..n)
        .collect();
    r.dedup();
    r
}

#[test]
fn checked_rows_cover_small_shapes_and_sample_large_ones() {
    assert_eq!(checked_rows(24), (0..24).collect::<Vec<_>>());
    let r = checked_rows(163840);
    assert!(r.windows(2).all(|w| w[0] < w[1]));
    assert_eq!((r[0], *r.last().unwrap()), (0, 163839));
    assert!((2500..2800).contains(&r.len()), "{}", r.len());
}

device_tests! {
    fn dense_matches_the_plain_f32_product(dev) {
        for (n, k) in SHAPES {
            let n = slice_n(dev.as_ref(), n);
            for dtype in [Act::Bf16, Act::F16] {
                let w = values(n * k, 0x51ed, 0.05, dtype);
                let d = dev.upload_dense(&w, n, k, dtype).expect("upload");
                // The plain serial product over all 163840 rows of the lm_head is minutes of CPU
                // per M: at full shapes every output of a strided set of weight rows (the first
                // and last ones and every 61st between) is held to it; the fused argmax below
                // still covers every row.
                let rows = checked_rows(n);
                let ws: Vec<u16> = rows.iter().flat_map(|&r| w[r * k..(r + 1) * k].iter().copied()).collect();
                for m in [1, 7, 130] {
                    let x = values(m * k, 0x2545 + m as u32, 2.0, dtype);
                    let all = dev.dense_on(&d, &x, m).expect("gemm");
                    let got: Vec<f32> = (0..m).flat_map(|i| rows.iter().map(move |&r| (i, r))).map(|(i, r)| all[i * n + r]).collect();
                    let want = dense_ref(&ws, &x, dtype, m, rows.len(), k);
                    let l1 = dense_abs_l1(&ws, &x, dtype, m, rows.len(), k);
                    if let Some((i, g, r, b)) = first_violation(&got, &want, &l1, DENSE_REL_L1_TOL) {
                        panic!(
                            "dense {} n={n} k={k} m={m} on {}: y[{}, {}] = {g}, reference {r}, bound {b}",
                            dtype.name(),
                            dev.name(),
                            i / rows.len(),
                            rows[i % rows.len()]
                        );
                    }
                    let got = all;
                    // The fused path: the argmax of these very outputs, computed on the device.
                    let best = dev.dense_argmax_on(&d, &x, m).expect("argmax");
                    let want: Vec<usize> = got.chunks(n).map(argmax_ref).collect();
                    assert_eq!(best, want, "dense argmax {} n={n} k={k} m={m}", dtype.name());
                }
            }
        }
    }

    fn argmax_rows_is_exact(dev) {
        argmax_rows(dev);
    }

    fn w4a16_argmax_is_the_argmax_of_each_regime(dev) {
        let (n, k) = (40, 1024);
        let w: Vec<f32> = values(n * k, 0x77, 0.05, Act::Bf16)
            .into_iter()
            .map(|h| Act::Bf16.to_f32(h))
            .collect();
        let q = int4::quantize(&w, n, k, k, Dtype::BF16);
        let l = W4Layout::from_int4(&q).unwrap();
        let d = dev.upload(&l).unwrap();
        for (regime, m) in [(Regime::Gemv, 3), (Regime::Mma, 20), (Regime::Dense, 130)] {
            let x = values(m * k, 0x99, 1.0, Act::Bf16);
            let y = dev.w4a16_on(&d, &x, Act::Bf16, m, regime).unwrap();
            let best = dev.w4a16_argmax_on(&d, &x, Act::Bf16, m, regime).unwrap();
            let want: Vec<usize> = y.chunks(n).map(argmax_ref).collect();
            assert_eq!(best, want, "{} m={m}", regime.name());
        }
    }

    fn malformed_dense_calls_are_typed_errors(dev) {
        let w = values(6, 1, 1.0, Act::Bf16);
        assert!(matches!(dev.upload_dense(&w, 2, 2, Act::Bf16), Err(GpuError::Layout(_))));
        assert!(matches!(dev.upload_dense(&[], 0, 3, Act::Bf16), Err(GpuError::Unsupported("N", _))));
        assert!(matches!(dev.upload_dense(&[], 3, 0, Act::Bf16), Err(GpuError::Unsupported("K", _))));
        let d = dev.upload_dense(&w, 2, 3, Act::Bf16).unwrap();
        assert!(matches!(dev.dense_on(&d, &w[..5], 2), Err(GpuError::Layout(_))));
        assert!(matches!(dev.dense_on(&d, &[], 0), Err(GpuError::Unsupported("M", _))));
        assert!(matches!(dev.dense_argmax_on(&d, &w[..4], 1), Err(GpuError::Layout(_))));
        assert!(matches!(dev.argmax_rows(&[1.0; 5], 2, 3), Err(GpuError::Layout(_))));
        assert!(matches!(dev.argmax_rows(&[], 0, 3), Err(GpuError::Unsupported(..))));
        assert!(matches!(dev.argmax_rows(&[], 3, 0), Err(GpuError::Unsupported(..))));
        // Weights uploaded by one device are refused by another.
        let other = kquant::gpu::CpuEmu::amd();
        if !common::is_emulation(dev.as_ref()) {
            assert!(matches!(other.dense_on(&d, &w[..3], 1), Err(GpuError::Backend { .. })));
        }
    }
}

/// Rows that exercise every rule of the order, then random rows, then a Kimi-sized vocabulary.
fn argmax_rows(dev: Arc<dyn Backend>) {
    let (nan, inf, sub) = (f32::NAN, f32::INFINITY, f32::from_bits(1));
    let special: Vec<Vec<f32>> = vec![
        vec![2.0, 1.0, 2.0, 0.5, 2.0],    // first of the ties
        vec![-0.0, 0.0, -0.0, 0.0, -0.0], // signed zeros tie
        vec![-inf; 5],                    // all -inf: the first
        vec![0.0, sub, sub, -sub, 0.0],   // subnormals order as numbers
        vec![1.0, nan, 3.0, nan, inf],    // the first NaN beats +inf
        vec![nan, 1.0, 2.0, 3.0, 4.0],    // a leading NaN
        vec![1.0, 2.0, 3.0, 4.0, -nan],   // a NaN of either sign
        vec![-1.0, inf, 0.0, inf, -inf],  // +inf, first
        vec![f32::MAX, f32::MIN, f32::MAX, 1.0, 0.0],
    ];
    let n = special[0].len();
    assert!(special.iter().all(|r| r.len() == n));
    let y: Vec<f32> = special.concat();
    let got = dev.argmax_rows(&y, special.len(), n).unwrap();
    let want: Vec<usize> = special.iter().map(|r| argmax_ref(r)).collect();
    assert_eq!(got, want, "on {}", dev.name());
    assert_eq!(want, [0, 0, 0, 1, 1, 0, 4, 1, 0], "the documented order");
    // Where no row holds a NaN the CPU runtimes' `ops::argmax` agrees; on NaN rows it never
    // picks a NaN (#38.4; documented in reference::argmax_ref).
    for (r, row) in special.iter().enumerate() {
        let has_nan = row.iter().any(|v| v.is_nan());
        let cpu = ops::argmax(row);
        assert_eq!(cpu == got[r], !has_nan, "row {r}");
        assert!(!row[cpu].is_nan(), "row {r}");
    }
    // Widths around the block (256 threads) and a Kimi vocabulary, with the winner placed
    // in the last column, the first, and a tie split across threads.
    for n in [1, 255, 256, 257, 1000, 163840] {
        let m = 4;
        let mut y: Vec<f32> = (0..m * n)
            .map(|i| ((i as u32).wrapping_mul(2654435761) >> 9) as f32 / (1 << 23) as f32)
            .collect();
        y[n - 1] = 2.0; // row 0: the last column
        y[n] = 2.0; // row 1: the first column
        if n > 300 {
            y[2 * n + 7] = 3.0; // row 2: tie between columns 7 and 263 (different threads)
            y[2 * n + 263] = 3.0;
            y[3 * n + 299] = f32::NAN; // row 3: a NaN wins
        }
        let got = dev.argmax_rows(&y, m, n).unwrap();
        let want: Vec<usize> = y.chunks(n).map(argmax_ref).collect();
        assert_eq!(got, want, "n={n}");
        assert_eq!(got[0], n - 1);
        assert_eq!(got[1], 0);
        if n > 300 {
            assert_eq!((got[2], got[3]), (7, 299));
        }
    }
}
