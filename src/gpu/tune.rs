//! Launch geometry for the GEMV kernels, mirroring `kernels/kq_tune.h` (change both together).
//! Block = (warp, rows): one warp / wavefront per output channel; grid = (⌈n/rows⌉, splits),
//! with split-K chosen so that there are at least `units × blocks_per_unit` blocks, and every
//! split still gives each lane at least one 32-weight chunk.

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

/// One row of `kq_tune.h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tune {
    pub warp: u32,
    pub rows: u32,
    pub unroll: u32,
    pub units: u32,
    pub blocks_per_unit: u32,
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
            },
            Arch::Sm100 => Tune {
                warp: 32,
                rows: 8,
                unroll: 4,
                units: 148,
                blocks_per_unit: 4,
            },
            Arch::Gfx942 => Tune {
                warp: 64,
                rows: 4,
                unroll: 2,
                units: 304,
                blocks_per_unit: 4,
            },
            Arch::Generic { warp } => Tune {
                warp,
                rows: 4,
                unroll: 2,
                units: 64,
                blocks_per_unit: 4,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kimi_shapes_fill_the_device() {
        for arch in [Arch::Sm90, Arch::Sm100, Arch::Gfx942] {
            let t = arch.tune();
            for (k, n) in [
                (21504, 7168),
                (14336, 24576),
                (8192, 7168),
                (7168, 24576),
                (12288, 7168),
            ] {
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
}
