//! The GEMV kernels' weight layout `kq-w4-gemv/1` and the CPU repack into it from each INT4
//! checkpoint layout kquant writes.
//!
//! - `qweight` u32 `[n, kp/8]` with `kp = ⌈k/32⌉·32`: K-contiguous rows of whole 16-byte chunks
//!   (one 128-bit load = 32 weights);
//! - nibble `i` of word `j` holds element `8j + ORDER[i]`, `ORDER = [0,2,4,6,1,3,5,7]` (Quark's
//!   `reorder`), as offset binary `u = q + 8`; padding nibbles are 8 (`q = 0`);
//! - `scales` f32 `[n, G]`: `G = 1` per channel (`group == k`), else `G = k / group` with
//!   `group % 32 == 0` (one scale per 128-bit load).
//!
//! Which repack a module takes is its layout's to say (`quant::stored::Layout::gemv`, beside the
//! format's encoder). Repacks ([`W4Layout::repack`], each proven by a test to dequantize to the
//! checkpoint's own decode): Quark per-channel `reorder` = XOR `0x88888888` per word; Quark
//! `order` (sequential, and every file2file export) = nibble shuffle + XOR; compressed-tensors
//! `pack-quantized` (sequential, already offset binary) = nibble shuffle, padding nibbles
//! rewritten; ModelOpt U8 `[⌈n/2⌉, k]` (packed along N) = transpose into K-packing.

use super::{GpuError, Result};
use crate::quant::decode::{layout, Logical, QModule};
use crate::quant::math::int4::Int4;
use crate::quant::math::pack::Order;
use crate::quant::stored::Gemv;

/// Nibble order inside a kernel word.
pub const ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
/// A word of eight zero codes.
pub const PAD_WORD: u32 = 0x8888_8888;
/// Weights per 128-bit chunk.
pub const CHUNK: usize = 32;

/// Weights in the kernel layout.
#[derive(Debug, Clone, PartialEq)]
pub struct W4Layout {
    /// Output channels (rows).
    pub n: usize,
    /// Input dimension (columns), unpadded.
    pub k: usize,
    /// Group size along K; `k` means per channel.
    pub group: usize,
    /// `[n, words_per_row(k)]`.
    pub qweight: Vec<u32>,
    /// `[n, groups]`.
    pub scales: Vec<f32>,
}

/// Words per kernel row.
pub fn words_per_row(k: usize) -> usize {
    k.div_ceil(CHUNK) * (CHUNK / 8)
}

/// Kernel word from eight codes in element order.
pub fn encode_word(codes: &[i8; 8]) -> u32 {
    let mut w = 0u32;
    for (i, &e) in ORDER.iter().enumerate() {
        w |= (((codes[e] as i32 + 8) as u32) & 0xf) << (4 * i);
    }
    w
}

/// Codes of one kernel word, in element order.
pub fn decode_word(w: u32) -> [i8; 8] {
    let mut c = [0i8; 8];
    for (i, &e) in ORDER.iter().enumerate() {
        c[e] = ((w >> (4 * i)) & 0xf) as i8 - 8;
    }
    c
}

/// A sequential-order word (element `i` in nibble `i`) into the kernel's nibble order.
pub fn sequential_to_kernel_order(w: u32) -> u32 {
    let mut o = 0u32;
    for (i, &e) in ORDER.iter().enumerate() {
        o |= ((w >> (4 * e)) & 0xf) << (4 * i);
    }
    o
}

/// Little-endian bytes (an I32 tensor's data) to words.
fn le_words(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Set the nibbles of elements `valid..8` of a kernel word to 8 (code 0).
fn pad_tail(w: u32, valid: usize) -> u32 {
    let mut o = w;
    for (i, &e) in ORDER.iter().enumerate() {
        if e >= valid {
            o = (o & !(0xf << (4 * i))) | (8 << (4 * i));
        }
    }
    o
}

impl W4Layout {
    pub fn groups(&self) -> usize {
        self.k.div_ceil(self.group)
    }
    pub fn per_channel(&self) -> bool {
        self.group == self.k
    }
    pub fn words_per_row(&self) -> usize {
        words_per_row(self.k)
    }
    /// Packed weight bytes (what a GEMV streams).
    pub fn weight_bytes(&self) -> usize {
        self.qweight.len() * 4
    }

    /// The kernel's preconditions on the layout.
    pub fn check(&self) -> Result<()> {
        if self.n == 0 || self.k == 0 {
            return Err(GpuError::Layout(format!(
                "empty matrix {}×{}",
                self.n, self.k
            )));
        }
        if !(self.per_channel()
            || (self.group.is_multiple_of(CHUNK) && self.k.is_multiple_of(self.group)))
        {
            return Err(GpuError::Unsupported(
                "group size",
                format!(
                    "per channel or a multiple of {CHUNK} dividing K; got group {} for K {}",
                    self.group, self.k
                ),
            ));
        }
        if self.qweight.len() != self.n * self.words_per_row()
            || self.scales.len() != self.n * self.groups()
        {
            return Err(GpuError::Layout(format!(
                "{}×{} group {}: {} words, {} scales",
                self.n,
                self.k,
                self.group,
                self.qweight.len(),
                self.scales.len()
            )));
        }
        Ok(())
    }

    /// The layout of these parts, if it meets the kernel's preconditions ([`W4Layout::check`]).
    fn checked(
        n: usize,
        k: usize,
        group: usize,
        qweight: Vec<u32>,
        scales: Vec<f32>,
    ) -> Result<W4Layout> {
        let l = W4Layout {
            n,
            k,
            group,
            qweight,
            scales,
        };
        l.check()?;
        Ok(l)
    }

    /// From codes and scales (the canonical form every decoder gives).
    pub fn from_int4(q: &Int4) -> Result<W4Layout> {
        let wpr = words_per_row(q.cols);
        let mut qweight = vec![PAD_WORD; q.rows * wpr];
        for r in 0..q.rows {
            let row = &q.codes[r * q.cols..(r + 1) * q.cols];
            for (j, chunk) in row.chunks(8).enumerate() {
                let mut c = [0i8; 8];
                c[..chunk.len()].copy_from_slice(chunk);
                qweight[r * wpr + j] = encode_word(&c);
            }
        }
        Self::checked(q.rows, q.cols, q.group, qweight, q.scales.clone())
    }

    /// Back to codes and scales.
    pub fn to_int4(&self) -> Int4 {
        let wpr = self.words_per_row();
        let mut codes = Vec::with_capacity(self.n * self.k);
        for r in 0..self.n {
            for j in 0..self.k.div_ceil(8) {
                let c = decode_word(self.qweight[r * wpr + j]);
                let take = (self.k - 8 * j).min(8);
                codes.extend_from_slice(&c[..take]);
            }
        }
        Int4 {
            rows: self.n,
            cols: self.k,
            group: self.group,
            scales: self.scales.clone(),
            codes,
        }
    }

    /// `w = q · s`, `[n, k]` f32.
    pub fn dequantize(&self) -> Vec<f32> {
        self.to_int4().dequantize_ref()
    }

    /// Word-level repack of `[rows, ⌈cols/8⌉]` checkpoint words: `f` maps one checkpoint word to
    /// a kernel word; the partial last word's padding nibbles are rewritten to code 0.
    fn from_words(
        words: &[i32],
        scales: &[f32],
        rows: usize,
        cols: usize,
        group: usize,
        f: impl Fn(u32) -> u32,
    ) -> Result<W4Layout> {
        let (src_wpr, wpr) = (cols.div_ceil(8), words_per_row(cols));
        if words.len() != rows * src_wpr {
            return Err(GpuError::Layout(format!(
                "{} words for {rows}×{cols}",
                words.len()
            )));
        }
        let mut qweight = vec![PAD_WORD; rows * wpr];
        for r in 0..rows {
            for j in 0..src_wpr {
                let mut w = f(words[r * src_wpr + j] as u32);
                if j == src_wpr - 1 && !cols.is_multiple_of(8) {
                    w = pad_tail(w, cols % 8);
                }
                qweight[r * wpr + j] = w;
            }
        }
        Self::checked(rows, cols, group, qweight, scales.to_vec())
    }

    /// Repack a module's stored codes `weight` (its tensor [`Gemv::tensor`]) with its `scales`
    /// (`[rows, cols]`) as its layout's [`Gemv`] says:
    /// - Quark per channel (`X.weight` I32 `[rows, ⌈cols/8⌉]`, two's complement nibbles, scale
    ///   `[rows]`): `reorder` is already the kernel's nibble order, so the repack is one XOR;
    ///   `order` (sequential) a nibble shuffle and the XOR;
    /// - compressed-tensors `pack-quantized` (`weight_packed` I32 `[rows, ⌈cols/8⌉]`,
    ///   sequential, offset binary, scale `[rows, cols/group]`): a nibble shuffle;
    /// - ModelOpt `W4A16_AWQ` (`weight` U8 `[⌈rows/2⌉, cols]`, low nibble = even row, two's
    ///   complement; scale F32 `[rows, cols/group]`): a transpose from N- to K-packing.
    pub fn repack(
        g: Gemv,
        weight: &[u8],
        scales: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<W4Layout> {
        let words = || le_words(weight);
        match g {
            Gemv::QuarkWords { order } => {
                let f: fn(u32) -> u32 = match order {
                    Order::Reorder => |w| w ^ PAD_WORD,
                    Order::Sequential => |w| sequential_to_kernel_order(w) ^ PAD_WORD,
                };
                Self::from_words(&words(), scales, rows, cols, cols, f)
            }
            Gemv::OffsetWords { group } => {
                let f = sequential_to_kernel_order;
                Self::from_words(&words(), scales, rows, cols, group, f)
            }
            Gemv::RowPairs { group } => Self::from_row_pairs(weight, scales, rows, cols, group),
        }
    }

    /// ModelOpt's U8 `[⌈rows/2⌉, cols]`, two output rows per byte, transposed into K-packing.
    fn from_row_pairs(
        weight: &[u8],
        scales: &[f32],
        rows: usize,
        cols: usize,
        group: usize,
    ) -> Result<W4Layout> {
        if weight.len() != rows.div_ceil(2) * cols {
            return Err(GpuError::Layout(format!(
                "{} bytes for {rows}×{cols} (U8 [⌈rows/2⌉, cols])",
                weight.len()
            )));
        }
        let wpr = words_per_row(cols);
        let mut qweight = vec![PAD_WORD; rows * wpr];
        for r in 0..rows {
            let src = &weight[(r / 2) * cols..(r / 2 + 1) * cols];
            let shift = 4 * (r % 2);
            for j in 0..cols.div_ceil(8) {
                let mut c = [0i8; 8];
                for (e, ce) in c.iter_mut().enumerate().take((cols - 8 * j).min(8)) {
                    *ce = ((((src[8 * j + e] >> shift) & 0xf) << 4) as i8) >> 4;
                }
                qweight[r * wpr + j] = encode_word(&c);
            }
        }
        Self::checked(rows, cols, group, qweight, scales.to_vec())
    }

    /// Repack one quantized module of a checkpoint straight from its stored tensors, as its
    /// layout says ([`Layout::gemv`](crate::quant::stored::Layout::gemv): the INT4 symmetric
    /// layouts kquant writes). ModelOpt's `pre_quant_scale`, if not all ones, is not folded
    /// here: the caller must scale the activations.
    pub fn from_module(lg: &Logical, m: &QModule) -> Result<W4Layout> {
        let w = &lg.ck.weights;
        let data = |suffix: &str| {
            w.tensor(&format!("{}.{suffix}", m.module))
                .ok_or_else(|| GpuError::Layout(format!("{}.{suffix} missing", m.module)))
        };
        let scale = data("weight_scale")?.to_f32();
        let Some(g) = layout(&m.stored).gemv() else {
            return Err(GpuError::Unsupported(
                "stored layout",
                format!(
                    "{}: {:?} (the GEMV kernels take symmetric INT4)",
                    m.module, m.stored
                ),
            ));
        };
        Self::repack(g, data(g.tensor())?.data, &scale, m.rows, m.cols)
    }
}

/// CPU model of the kernel's magic-number dequant (`kq_dequant8`), in f16 arithmetic as the GPU
/// does it: `(w & 0x000f000f) | 0x64006400` is the f16 pair `1024 + u`, minus 1032 gives `q`;
/// the high nibbles give `1024 + 16u`, times 1/16 minus 72.
pub fn dequant8_magic(q: u32) -> [f32; 8] {
    use half::f16;
    let pair = |v: u32| (f16::from_bits(v as u16), f16::from_bits((v >> 16) as u16));
    let sub = |v: u32| {
        let (a, b) = pair(v);
        let c = f16::from_f32(1032.0);
        [
            f16::from_f32(a.to_f32() - c.to_f32()),
            f16::from_f32(b.to_f32() - c.to_f32()),
        ]
    };
    let fma = |v: u32| {
        let (a, b) = pair(v);
        let f = |x: f16| f16::from_f32(x.to_f32().mul_add(1.0 / 16.0, -72.0));
        [f(a), f(b)]
    };
    let (lo, hi, ex) = (0x000f_000fu32, 0x00f0_00f0u32, 0x6400_6400u32);
    let a = sub((q & lo) | ex);
    let b = fma((q & hi) | ex);
    let q8 = q >> 8;
    let c = sub((q8 & lo) | ex);
    let d = fma((q8 & hi) | ex);
    [a[0], a[1], b[0], b[1], c[0], c[1], d[0], d[1]].map(|h| h.to_f32())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::Dtype;
    use crate::quant::math::int4;
    use crate::quant::{compressed_tensors, modelopt, quark};

    /// Deterministic bf16-representable weights in about `[-0.053, 0.047]`.
    fn weights(rows: usize, cols: usize) -> Vec<f32> {
        crate::quant::math::rowwise::test_matrix(rows, cols, Dtype::BF16, 0.05, -0.003)
    }

    type Words = fn(&[u8], &[f32], usize, usize, usize) -> Int4;

    /// For each `(rows, cols, group)`: a format's codes `q` (`quantize`) written as its stored
    /// bytes (`write`); the repack of those bytes and the format's own decode agree, and the
    /// decode gives `q` back.
    fn check_repack(
        shapes: &[(usize, usize, usize)],
        quantize: impl Fn(&[f32], usize, usize, usize) -> Int4,
        write: impl Fn(&Int4) -> Vec<u8>,
        gemv: fn(usize) -> Gemv,
        decode: Words,
    ) {
        for &(rows, cols, group) in shapes {
            let q = quantize(&weights(rows, cols), rows, cols, group);
            let enc = write(&q);
            let l = W4Layout::repack(gemv(group), &enc, &q.scales, rows, cols).unwrap();
            let back = decode(&enc, &q.scales, rows, cols, group);
            assert_same(&l, &back);
            assert_eq!(back, q);
        }
    }

    fn assert_same(l: &W4Layout, q: &Int4) {
        l.check().unwrap();
        assert_eq!(l.to_int4(), *q, "codes and scales");
        assert_eq!(l.dequantize(), q.dequantize_ref(), "dequantized values");
        // Padding words/nibbles are code 0.
        let wpr = l.words_per_row();
        for r in 0..l.n {
            for j in l.k.div_ceil(8)..wpr {
                assert_eq!(l.qweight[r * wpr + j], PAD_WORD);
            }
        }
    }

    #[test]
    fn magic_dequant_matches_the_layout() {
        for seed in 0..64u32 {
            let c: [i8; 8] = std::array::from_fn(|i| {
                ((seed.wrapping_mul(2654435761) >> (3 * i)) % 16) as i8 - 8
            });
            let w = encode_word(&c);
            assert_eq!(decode_word(w), c);
            assert_eq!(dequant8_magic(w), c.map(|v| v as f32), "word {w:08x}");
        }
        assert_eq!(dequant8_magic(PAD_WORD), [0.0; 8]);
    }

    #[test]
    fn golden_kernel_word() {
        // Quark's golden row [7,-8,0,2,2,0,-2,-2] in reorder order is 0xe028e207; the kernel
        // word is the same bits XOR 0x88888888.
        let c = [7, -8, 0, 2, 2, 0, -2, -2];
        assert_eq!(encode_word(&c), 0xe028_e207 ^ PAD_WORD);
        // compressed-tensors' golden word 0x668aa80f (sequential, offset binary).
        assert_eq!(sequential_to_kernel_order(0x668a_a80f), encode_word(&c));
    }

    #[test]
    fn repack_quark_per_channel_reorder_and_sequential() {
        for (rows, cols) in [(16, 7168), (5, 100), (3, 13)] {
            let w = weights(rows, cols);
            let q = int4::quantize(&w, rows, cols, cols, Dtype::BF16);
            for (layout, order) in [
                (quark::Layout::Model, Order::Reorder),
                (quark::Layout::Model, Order::Sequential),
                (quark::Layout::File2file, Order::Sequential),
            ] {
                let o = quark::Options {
                    layout,
                    version: quark::Version::V013,
                    order,
                };
                let enc = quark::encode("m", &q, Dtype::BF16, &o);
                let scales = q.scales.clone();
                let g = Gemv::QuarkWords { order };
                let l = W4Layout::repack(g, &enc[0].1, &scales, rows, cols).unwrap();
                let back = quark::decode(&enc[0].1, &scales, rows, cols, order);
                assert_same(&l, &back);
                assert_eq!(back, q);
            }
        }
    }

    #[test]
    fn repack_compressed_tensors_pack_quantized() {
        use compressed_tensors as ct;
        check_repack(
            &[(16, 7168, 7168), (8, 256, 128), (4, 96, 32), (3, 13, 13)],
            |w, r, c, g| ct::quantize(w, r, c, g, Dtype::BF16),
            |q| ct::encode("m", q, Dtype::BF16).remove(0).1,
            |group| Gemv::OffsetWords { group },
            ct::decode,
        );
    }

    #[test]
    fn repack_modelopt_u8() {
        check_repack(
            &[(16, 512, 128), (7, 256, 128), (4, 96, 96)],
            |w, r, c, g| modelopt::int4_quantize(w, r, c, g, Dtype::BF16),
            |q| {
                modelopt::int4_encode("m.o_proj", q, Dtype::BF16)
                    .remove(0)
                    .1
            },
            |group| Gemv::RowPairs { group },
            modelopt::int4_decode,
        );
    }

    #[test]
    fn unsupported_group_is_refused() {
        let w = weights(2, 96);
        let q = compressed_tensors::quantize(&w, 2, 96, 48, Dtype::BF16);
        assert!(matches!(
            W4Layout::from_int4(&q),
            Err(GpuError::Unsupported("group size", _))
        ));
    }
}
