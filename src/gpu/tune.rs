//! Launch geometry and kernel choice, mirroring `kernels/kq_tune.h` (change both together).
//!
//! - Regime by M ([`regime`]): GEMV (A) up to `gemv_max_m`, tensor/matrix-core MMA (B) up to
//!   `mma_max_m`, dequant-to-dense + vendor BLAS (C) above.
//! - GEMV ([`gemv`]): block = (warp, rows), one warp / wavefront per output channel; grid =
//!   (⌈n/rows⌉, splits), split-K chosen so that there are at least `units × blocks_per_unit`
//!   blocks, and every split still gives each lane at least one 32-weight chunk.
//! - MMA ([`mma`]): block = (warp, mma_warps), 16 output channels per warp; grid = (⌈n/(16·warps)⌉,
//!   splits, ⌈m/toks⌉) with `toks` ∈ {16, 32, 64, 128} tokens per block (grouped kernels stop at
//!   64); split-K over 128-weight k-tiles, at least 4 tiles per split.
//! - Dense ([`dense`]): one thread per 32-weight chunk, `KQ_DENSE_THREADS` per block.

use super::layout::CHUNK;

/// Target architecture of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Hopper (sm_90 / sm_90a).
    Sm90,
    /// Blackwell datacenter (sm_100 / sm_100a).
    Sm100,
    /// CDNA3 MI300X / MI325X (gfx942).
    Gfx942,
    /// Anything else, with its warp width.
    Generic { warp: u32 },
}

/// One row of `kq_tune.h` (plus the host-only regime thresholds and cache size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tune {
    pub warp: u32,
    pub rows: u32,
    pub unroll: u32,
    pub units: u32,
    pub blocks_per_unit: u32,
    /// Warps / wavefronts per MMA block (`KQ_MMA_WARPS`).
    pub mma_warps: u32,
    /// k-tiles whose weight loads the MMA kernel issues ahead (`KQ_MMA_UNROLL`).
    pub mma_unroll: u32,
    /// Largest M the regime choice sends to the GEMV kernels (regime A; 0: never). The kernels
    /// themselves take up to `source::GEMV_MAX_M`, which an explicit `Regime::Gemv` may use.
    pub gemv_max_m: usize,
    /// Largest M that goes to the MMA kernels (regime B); above: dequant + BLAS (regime C).
    pub mma_max_m: usize,
    /// The same for weights kept on the device ([`super::Backend::upload_kept`], every verify
    /// replay): their regime C is the vendor GEMM alone on the kept dense copy, so it takes over
    /// where the MMA kernel falls behind bf16 itself.
    pub mma_max_m_kept: usize,
    /// Last-level cache in bytes (L2 / Infinity Cache): benchmarks rotate over more than twice it.
    pub llc_bytes: usize,
}

/// Which kernel family runs a GEMM (docs/kernels.md, "Design").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Regime {
    /// A: CUDA-core / VALU GEMV (`w4_gemv.cu`), M ≤ 8 (`source::GEMV_MAX_M`).
    Gemv,
    /// B: tensor-core / matrix-core tiles (`w4_mma.cu`), any M (chosen for 9..=128).
    Mma,
    /// C: dequantize to dense + vendor GEMM (`w4_dense.cu` + cuBLAS / hipBLAS).
    Dense,
}

impl Regime {
    pub fn name(self) -> &'static str {
        match self {
            Regime::Gemv => "gemv",
            Regime::Mma => "mma",
            Regime::Dense => "dense",
        }
    }
}

/// The regime `arch` uses for `m` tokens.
pub fn regime(arch: Arch, m: usize) -> Regime {
    let t = arch.tune();
    pick(m, t.gemv_max_m, t.mma_max_m)
}

/// The regime `arch` uses for `m` tokens on kept weights (`Tune::mma_max_m_kept`).
pub fn regime_kept(arch: Arch, m: usize) -> Regime {
    let t = arch.tune();
    pick(m, t.gemv_max_m.min(t.mma_max_m_kept), t.mma_max_m_kept)
}

fn pick(m: usize, gemv_max_m: usize, mma_max_m: usize) -> Regime {
    if m <= gemv_max_m {
        Regime::Gemv
    } else if m <= mma_max_m {
        Regime::Mma
    } else {
        Regime::Dense
    }
}

impl Arch {
    pub fn from_cuda_cc(major: i32, minor: i32) -> Arch {
        match (major, minor) {
            (9, _) => Arch::Sm90,
            (10, _) => Arch::Sm100,
            _ => Arch::Generic { warp: 32 },
        }
    }
    pub fn tune(self) -> Tune {
        match self {
            Arch::Sm90 => Tune {
                warp: 32,
                rows: 8,
                unroll: 4,
                units: 132,
                blocks_per_unit: 4,
                mma_warps: 4,
                mma_unroll: 2,
                // Measured on an H200 (`bench gemm --regime gemv,mma,dense`, docs/performance.md):
                // the MMA kernel beats the GEMV at every M, 1 included (fc: 36.9 vs 59.3 µs), and
                // dequant + cuBLAS beats the MMA from M = 96 on four of the five Kimi shapes; the
                // MMA kernel is 1.19–1.35× bf16 cuBLAS at M = 16 and 0.33–0.45× at M = 64, so on
                // kept weights (bf16 cuBLAS on the dense copy) regime C takes over above 16.
                gemv_max_m: 0,
                mma_max_m: 64,
                mma_max_m_kept: 16,
                llc_bytes: 50 << 20,
            },
            Arch::Sm100 => Tune {
                warp: 32,
                rows: 8,
                unroll: 4,
                units: 148,
                blocks_per_unit: 4,
                mma_warps: 4,
                mma_unroll: 2,
                gemv_max_m: 8,
                mma_max_m: 128,
                // Not measured: Hopper's crossover against bf16 until it is.
                mma_max_m_kept: 16,
                llc_bytes: 126 << 20,
            },
            Arch::Gfx942 => Tune {
                warp: 64,
                rows: 4,
                unroll: 2,
                units: 304,
                blocks_per_unit: 4,
                mma_warps: 4,
                mma_unroll: 2,
                gemv_max_m: 8,
                mma_max_m: 128,
                // Not measured: Hopper's crossover against bf16 until it is.
                mma_max_m_kept: 16,
                llc_bytes: 256 << 20,
            },
            Arch::Generic { warp } => Tune {
                warp,
                rows: 4,
                unroll: 2,
                units: 64,
                blocks_per_unit: 4,
                mma_warps: 4,
                mma_unroll: 1,
                gemv_max_m: 8,
                mma_max_m: 128,
                // Not measured: Hopper's crossover against bf16 until it is.
                mma_max_m_kept: 16,
                llc_bytes: 32 << 20,
            },
        }
    }
}

/// Grid and block of one GEMV launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemv {
    pub block: (u32, u32, u32),
    pub grid: (u32, u32, u32),
    pub splits: usize,
    pub chunks_per_split: usize,
}

/// Geometry for an `n × k` matrix on `arch`.
pub fn gemv(arch: Arch, n: usize, k: usize) -> Gemv {
    let t = arch.tune();
    let blocks = n.div_ceil(t.rows as usize);
    let chunks = k.div_ceil(CHUNK);
    let want = ((t.units * t.blocks_per_unit) as usize).div_ceil(blocks.max(1));
    let max_splits = (chunks / t.warp as usize).max(1);
    let splits = want.clamp(1, max_splits);
    let chunks_per_split = chunks.div_ceil(splits);
    let splits = chunks.div_ceil(chunks_per_split);
    Gemv {
        block: (t.warp, t.rows, 1),
        grid: (blocks as u32, splits as u32, 1),
        splits,
        chunks_per_split,
    }
}

/// Grid and block of one MMA launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mma {
    pub block: (u32, u32, u32),
    pub grid: (u32, u32, u32),
    pub splits: usize,
    pub tiles_per_split: usize,
    /// Tokens per block (the kernel's `_m{toks}` suffix).
    pub toks: usize,
}

/// Weights per MMA k-tile (4 lanes × one 32-weight chunk).
pub const MMA_KTILE: usize = 128;
/// Output channels per MMA warp.
pub const MMA_ROWS: usize = 16;

/// Geometry of an MMA launch for an `n × k` matrix and `m` tokens on `arch`.
pub fn mma(arch: Arch, n: usize, k: usize, m: usize, grouped: bool) -> Mma {
    let t = arch.tune();
    let max_toks = if grouped { 64 } else { 128 };
    let toks = [16, 32, 64, 128]
        .into_iter()
        .find(|&b| b >= m.min(max_toks))
        .unwrap_or(max_toks);
    let z = m.div_ceil(toks).max(1);
    let bx = n.div_ceil(MMA_ROWS * t.mma_warps as usize);
    let ktiles = k.div_ceil(MMA_KTILE);
    let want = ((t.units * t.blocks_per_unit) as usize).div_ceil((bx * z).max(1));
    let max_splits = (ktiles / 4).max(1);
    let splits = want.clamp(1, max_splits);
    let tiles_per_split = ktiles.div_ceil(splits);
    let splits = ktiles.div_ceil(tiles_per_split);
    Mma {
        block: (t.warp, t.mma_warps, 1),
        grid: (bx as u32, splits as u32, z as u32),
        splits,
        tiles_per_split,
        toks,
    }
}

/// Threads per block of the dequant-to-dense kernel (`KQ_DENSE_THREADS`).
pub const DENSE_THREADS: u32 = 256;

/// Grid of the dequant-to-dense kernel: one thread per 32-weight chunk.
pub fn dense(n: usize, k: usize) -> (u32, u32, u32) {
    (
        (n * k.div_ceil(CHUNK)).div_ceil(DENSE_THREADS as usize) as u32,
        1,
        1,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GPU archs the geometry tests run over.
    const GPUS: [Arch; 3] = [Arch::Sm90, Arch::Sm100, Arch::Gfx942];
    /// Kimi's linear shapes, `(k, n)`.
    const KIMI: [(usize, usize); 5] = [
        (21504, 7168),
        (14336, 24576),
        (8192, 7168),
        (7168, 24576),
        (12288, 7168),
    ];

    #[test]
    fn kimi_shapes_fill_the_device() {
        for arch in GPUS {
            let t = arch.tune();
            for (k, n) in KIMI {
                let g = gemv(arch, n, k);
                let chunks = k.div_ceil(CHUNK);
                assert!(g.splits * g.chunks_per_split >= chunks);
                assert!(
                    (g.splits - 1) * g.chunks_per_split < chunks,
                    "no empty split"
                );
                assert!(
                    g.grid.0 as usize * g.grid.1 as usize >= (t.units * t.blocks_per_unit) as usize
                        || g.chunks_per_split <= t.warp as usize * 2,
                    "{arch:?} {k}×{n}: {g:?}"
                );
            }
        }
    }

    #[test]
    fn mma_geometry_covers_every_tile_and_token() {
        for arch in GPUS {
            let t = arch.tune();
            for (k, n) in KIMI.into_iter().chain([(40, 3), (1000, 17)]) {
                for m in [9, 16, 17, 33, 64, 100, 128, 300] {
                    for grouped in [false, true] {
                        let g = mma(arch, n, k, m, grouped);
                        let ktiles = k.div_ceil(MMA_KTILE);
                        assert!(g.splits * g.tiles_per_split >= ktiles);
                        assert!(
                            (g.splits - 1) * g.tiles_per_split < ktiles,
                            "no empty split"
                        );
                        assert!(g.grid.2 as usize * g.toks >= m, "every token in a block");
                        assert!(g.toks <= if grouped { 64 } else { 128 });
                        assert_eq!(g.toks % (if t.warp == 64 { 16 } else { 8 }), 0);
                        assert!(g.grid.0 as usize * MMA_ROWS * t.mma_warps as usize >= n);
                    }
                }
            }
        }
        // The thresholds stay inside what the kernels take.
        for arch in [
            Arch::Sm90,
            Arch::Sm100,
            Arch::Gfx942,
            Arch::Generic { warp: 32 },
        ] {
            assert!(arch.tune().gemv_max_m <= super::super::source::GEMV_MAX_M);
        }
        // Hopper, as measured on an H200: the MMA kernel from M = 1, dense above 64.
        assert_eq!(regime(Arch::Sm90, 1), Regime::Mma);
        assert_eq!(regime(Arch::Sm90, 64), Regime::Mma);
        assert_eq!(regime(Arch::Sm90, 65), Regime::Dense);
        // The others, not yet measured: A ≤ 8 < B ≤ 128 < C.
        assert_eq!(regime(Arch::Sm100, 8), Regime::Gemv);
        assert_eq!(regime(Arch::Gfx942, 9), Regime::Mma);
        assert_eq!(regime(Arch::Gfx942, 128), Regime::Mma);
        assert_eq!(regime(Arch::Sm100, 129), Regime::Dense);
    }
    /// `kernels/kq_tune.h` and [`Arch::tune`] hold the same launch constants for every arch
    /// (the kernels compile with the header's, the host launches with the table's).
    #[test]
    fn kq_tune_h_agrees_with_the_table() {
        let h = include_str!("../../kernels/kq_tune.h");
        let define = |block: &str, name: &str| -> u32 {
            block
                .lines()
                .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("{name} missing"))
                .trim()
                .parse()
                .unwrap()
        };
        assert_eq!(define(h, "KQ_DENSE_THREADS"), DENSE_THREADS);
        let mut seen = Vec::new();
        // Each arch's block runs from its KQ_ARCH_NAME to the next #elif / #else / #endif.
        for block in h.split("#define KQ_ARCH_NAME ").skip(1) {
            let name = block.split_whitespace().next().unwrap().trim_matches('"');
            let arch = match name {
                "sm_90" => Arch::Sm90,
                "sm_100" => Arch::Sm100,
                "gfx942" => Arch::Gfx942,
                "generic" => Arch::Generic { warp: 32 },
                other => panic!("kq_tune.h names an arch the table lacks: {other}"),
            };
            let t = arch.tune();
            let got = [
                ("KQ_GEMV_ROWS", t.rows),
                ("KQ_GEMV_UNROLL", t.unroll),
                ("KQ_UNITS", t.units),
                ("KQ_BLOCKS_PER_UNIT", t.blocks_per_unit),
                ("KQ_MMA_WARPS", t.mma_warps),
                ("KQ_MMA_UNROLL", t.mma_unroll),
            ];
            for (k, v) in got {
                assert_eq!(define(block, k), v, "{name} {k}");
            }
            seen.push(name.to_string());
        }
        assert_eq!(seen, ["gfx942", "sm_100", "sm_90", "generic"]);
    }
}
