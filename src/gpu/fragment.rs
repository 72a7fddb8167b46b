//! Operand ownership of the matrix instructions the regime-B kernels (`kernels/w4_mma.cu`) issue,
//! transcribed from the vendors' documentation: which lane holds which element of A, B and C/D.
//! The CPU emulation ([`super::emu_mma`]) executes an atom only through these maps, so the
//! kernel's register assembly is checked against the documented semantics, not against itself.
//!
//! Items are numbered in register order: a 16-bit item `i` sits in register `i / 2`, half `i % 2`
//! (low half first); an 8-bit item `i` in register `i / 4`, byte `i % 4` (PTX "Elements (low to
//! high)"; AMD packs `v4f16` / `i64` operands the same way).
//!
//! NVIDIA (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" and "... for
//! mma.m16n8k32" with `.s8`), with `groupID = %laneid >> 2`, `threadID_in_group = %laneid % 4`:
//!
//! ```text
//! m16n8k16 .f16/.bf16
//!   A: row = groupID                                 for ai where 0 <= i < 2 || 4 <= i < 6
//!            groupID + 8                             Otherwise
//!      col = (threadID_in_group * 2) + (i & 0x1)     for ai where i < 4
//!            (threadID_in_group * 2) + (i & 0x1) + 8 for ai where i >= 4
//!   B: row = (threadID_in_group * 2) + (i & 0x1)     for bi where i < 2
//!            (threadID_in_group * 2) + (i & 0x1) + 8 for bi where i >= 2
//!      col = groupID
//!   C/D: row = groupID                               for ci where i < 2
//!              groupID + 8                           for ci where i >= 2
//!        col = (threadID_in_group * 2) + (i & 0x1)   for ci where i = {0,..,3}
//! m16n8k32 .s8
//!   A: row = groupID                                 for ai where 0 <= i < 4 || 8 <= i < 12
//!            groupID + 8                             otherwise
//!      col = (threadID_in_group * 4) + (i & 0x3)      for ai where i < 8
//!            (threadID_in_group * 4) + (i & 0x3) + 16 for ai where i >= 8
//!   B: row = (threadID_in_group * 4) + (i & 0x3)      for bi where i < 4
//!            (threadID_in_group * 4) + (i & 0x3) + 16 for bi where i >= 4
//!      col = groupID
//!   C/D: as m16n8k16 (.s32)
//! ```
//!
//! AMD CDNA3 (`v_mfma_f32_16x16x16_f16` / `_bf16`, wave64), as AMD's own tables in flashinfer's
//! HIP backend (`gpu_iface/backend/hip/mma_layouts`) give them: A\[i\]\[k\] in lane
//! `i + 16·(k/4)`, item `k % 4`; B\[k\]\[j\] in lane `j + 16·(k/4)`, item `k % 4`; C/D\[i\]\[j\] in
//! lane `j + 16·(i/4)`, item `i % 4`. `v_mfma_i32_16x16x32_i8` (gfx940+): the same with 8 items
//! per lane (`k/8`, `k % 8`). These AMD maps are not checked on hardware yet (docs/kernels.md).

/// One matrix instruction shape/type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Atom {
    /// `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32`.
    NvM16n8k16,
    /// `mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32`.
    NvM16n8k32S8,
    /// `v_mfma_f32_16x16x16_{f16,bf16}`.
    Amd16x16x16,
    /// `v_mfma_i32_16x16x32_i8`.
    Amd16x16x32I8,
}

impl Atom {
    /// Lanes executing the atom together.
    pub fn lanes(self) -> usize {
        match self {
            Atom::NvM16n8k16 | Atom::NvM16n8k32S8 => 32,
            Atom::Amd16x16x16 | Atom::Amd16x16x32I8 => 64,
        }
    }
    /// Rows of A / D.
    pub fn m(self) -> usize {
        16
    }
    /// Columns of B / D.
    pub fn n(self) -> usize {
        match self {
            Atom::NvM16n8k16 | Atom::NvM16n8k32S8 => 8,
            Atom::Amd16x16x16 | Atom::Amd16x16x32I8 => 16,
        }
    }
    /// The reduction depth.
    pub fn k(self) -> usize {
        match self {
            Atom::NvM16n8k16 | Atom::Amd16x16x16 => 16,
            Atom::NvM16n8k32S8 | Atom::Amd16x16x32I8 => 32,
        }
    }
    /// Whether the operands are 8-bit integers (else 16-bit floats).
    pub fn int8(self) -> bool {
        matches!(self, Atom::NvM16n8k32S8 | Atom::Amd16x16x32I8)
    }
    /// A items per lane.
    pub fn a_items(self) -> usize {
        self.m() * self.k() / self.lanes()
    }
    /// B items per lane.
    pub fn b_items(self) -> usize {
        self.k() * self.n() / self.lanes()
    }
    /// C/D items per lane.
    pub fn d_items(self) -> usize {
        4
    }

    /// NVIDIA's operand elements per 32-bit register: two 16-bit floats or four 8-bit integers.
    fn per_register(self) -> usize {
        if self.int8() {
            4
        } else {
            2
        }
    }

    /// `(row, k)` of A item `i` of `lane`.
    pub fn a(self, lane: usize, i: usize) -> (usize, usize) {
        match self {
            // Registers a0..a3 of `w` items: rows g, g + 8, g, g + 8; k from t·w, the last two
            // registers in the second half of k.
            Atom::NvM16n8k16 | Atom::NvM16n8k32S8 => {
                let (g, t, w) = (lane >> 2, lane % 4, self.per_register());
                let reg = i / w;
                (
                    g + 8 * (reg % 2),
                    t * w + i % w + if reg < 2 { 0 } else { 4 * w },
                )
            }
            Atom::Amd16x16x16 | Atom::Amd16x16x32I8 => {
                (lane % 16, self.a_items() * (lane / 16) + i)
            }
        }
    }

    /// `(k, col)` of B item `i` of `lane`.
    pub fn b(self, lane: usize, i: usize) -> (usize, usize) {
        match self {
            // Registers b0, b1 of `w` items: k from t·w, b1 in the second half of k; column g.
            Atom::NvM16n8k16 | Atom::NvM16n8k32S8 => {
                let (g, t, w) = (lane >> 2, lane % 4, self.per_register());
                (t * w + i % w + if i < w { 0 } else { 4 * w }, g)
            }
            Atom::Amd16x16x16 | Atom::Amd16x16x32I8 => {
                (self.b_items() * (lane / 16) + i, lane % 16)
            }
        }
    }

    /// `(row, col)` of C/D item `i` of `lane`.
    pub fn d(self, lane: usize, i: usize) -> (usize, usize) {
        match self {
            Atom::NvM16n8k16 | Atom::NvM16n8k32S8 => {
                let (g, t) = (lane >> 2, lane % 4);
                (if i < 2 { g } else { g + 8 }, t * 2 + (i & 1))
            }
            Atom::Amd16x16x16 | Atom::Amd16x16x32I8 => (4 * (lane / 16) + i, lane % 16),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Atom; 4] = [
        Atom::NvM16n8k16,
        Atom::NvM16n8k32S8,
        Atom::Amd16x16x16,
        Atom::Amd16x16x32I8,
    ];

    /// Every element of A, B and D is owned by exactly one (lane, item): the transcription is a
    /// permutation, as the documentation's figures show.
    #[test]
    fn every_operand_map_is_a_permutation() {
        for atom in ALL {
            let (m, n, k, l) = (atom.m(), atom.n(), atom.k(), atom.lanes());
            let mut a = vec![0u8; m * k];
            let mut b = vec![0u8; k * n];
            let mut d = vec![0u8; m * n];
            for lane in 0..l {
                for i in 0..atom.a_items() {
                    let (r, c) = atom.a(lane, i);
                    a[r * k + c] += 1;
                }
                for i in 0..atom.b_items() {
                    let (r, c) = atom.b(lane, i);
                    b[r * n + c] += 1;
                }
                for i in 0..atom.d_items() {
                    let (r, c) = atom.d(lane, i);
                    d[r * n + c] += 1;
                }
            }
            assert!(a.iter().all(|&x| x == 1), "{atom:?} A");
            assert!(b.iter().all(|&x| x == 1), "{atom:?} B");
            assert!(d.iter().all(|&x| x == 1), "{atom:?} D");
        }
    }

    /// Spot values straight from the documents' figures.
    #[test]
    fn figure_spot_checks() {
        // PTX m16n8k16 A: T0 holds a0,a1 = (0,0),(0,1); a2 = (8,0); a4 = (0,8); T5 a7 = (9,11).
        assert_eq!(Atom::NvM16n8k16.a(0, 0), (0, 0));
        assert_eq!(Atom::NvM16n8k16.a(0, 1), (0, 1));
        assert_eq!(Atom::NvM16n8k16.a(0, 2), (8, 0));
        assert_eq!(Atom::NvM16n8k16.a(0, 4), (0, 8));
        assert_eq!(Atom::NvM16n8k16.a(5, 7), (9, 11));
        // C: T1 c0 = (0,2), c3 = (8,3).
        assert_eq!(Atom::NvM16n8k16.d(1, 0), (0, 2));
        assert_eq!(Atom::NvM16n8k16.d(1, 3), (8, 3));
        // m16n8k32 s8 A: T1 a8 = (0, 20); a4 = (8, 4).
        assert_eq!(Atom::NvM16n8k32S8.a(1, 8), (0, 20));
        assert_eq!(Atom::NvM16n8k32S8.a(1, 4), (8, 4));
        // CDNA3 A: row 0 cols 4..7 in T16; B: row 4 col 1 in T17; C: row 5 col 2 in T18 item 1.
        assert_eq!(Atom::Amd16x16x16.a(16, 0), (0, 4));
        assert_eq!(Atom::Amd16x16x16.b(17, 0), (4, 1));
        assert_eq!(Atom::Amd16x16x16.d(18, 1), (5, 2));
    }
}
