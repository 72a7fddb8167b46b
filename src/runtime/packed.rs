//! Quantized draft weights kept in memory as their codes and scales, for the CPU product
//! (`ops::gemm::Rows::Packed`): integer codes (INT4 two to a byte, wider codes one to a byte)
//! with one scale per (row, group) and ModelOpt's optional `pre_quant_scale` per input, or FP8
//! E4M3 bytes with one scale per row or per tensor. The product expands a block at a time in
//! its packing step; nothing holds the module in f32.
//!
//! What a module keeps is its layout's to say (`quant::stored::Layout::packed`, beside the
//! format's encoder). The expansion is each format's own dequantization, operation for operation
//! (`quant::decode::Logical::dequantize`: `q · s`, then `· pqs` for ModelOpt; `f8(code) · s`),
//! so the values the product multiplies are bit for bit those of the f32 reference path
//! (tested here against `dequantize` on every stored layout this takes). NVFP4 and Quark's
//! two-stage `int4_fp8` are not taken ([`Packed::load`] returns `None`): they stay on the f32
//! path, dequantized at load.

use crate::io::dtype::f8_e4m3_to_f32;
use crate::ops::gemm::Decode;
use crate::quant::decode::{layout, Logical, QModule};
use crate::quant::math::int4::Int4;
use crate::quant::stored::Packing;

/// Integer codes, as compact as their range allows.
pub enum Codes {
    /// Two codes a byte (low nibble first), each stored `+ 8`: codes in `−8..=7`.
    Nibbles(Vec<u8>),
    /// One code a byte.
    Bytes(Vec<i8>),
}

/// One quantized module, packed.
pub enum Packed {
    Int {
        n: usize,
        k: usize,
        group: usize,
        codes: Codes,
        /// `[n, ⌈k / group⌉]`.
        scales: Vec<f32>,
        /// ModelOpt's `pre_quant_scale` `[k]`, multiplied into each weight after its scale.
        pre: Option<Vec<f32>>,
    },
    Fp8 {
        n: usize,
        k: usize,
        /// `[n]`, or `[1]` for the whole tensor.
        scales: Vec<f32>,
        codes: Vec<u8>,
    },
}

impl Packed {
    /// Module `m` of `lg` packed as its layout says ([`Layout::packed`](crate::quant::stored::Layout::packed)), or `None` for a
    /// layout kept on the f32 path (NVFP4, `int4_fp8`).
    pub fn load(lg: &Logical, m: &QModule) -> Option<Packed> {
        Some(match layout(&m.stored).packed(&lg.parts(m))? {
            Packing::Int { q, pre } => Packed::int(q, pre),
            Packing::Fp8(f) => Packed::Fp8 {
                n: f.rows,
                k: f.cols,
                scales: f.scales,
                codes: f.codes,
            },
        })
    }

    fn int(q: Int4, pre: Option<Vec<f32>>) -> Packed {
        let codes = if q.codes.iter().all(|c| (-8..=7).contains(c)) {
            Codes::Nibbles(
                q.codes
                    .chunks(2)
                    .map(|p| {
                        let lo = (p[0] + 8) as u8;
                        let hi = p.get(1).map_or(0, |&c| (c + 8) as u8);
                        lo | hi << 4
                    })
                    .collect(),
            )
        } else {
            Codes::Bytes(q.codes)
        };
        Packed::Int {
            n: q.rows,
            k: q.cols,
            group: q.group.max(1),
            codes,
            scales: q.scales,
            pre,
        }
    }

    /// Bytes held (codes and scales).
    pub fn bytes(&self) -> usize {
        match self {
            Packed::Int {
                codes, scales, pre, ..
            } => {
                let c = match codes {
                    Codes::Nibbles(b) => b.len(),
                    Codes::Bytes(b) => b.len(),
                };
                c + 4 * scales.len() + 4 * pre.as_ref().map_or(0, |p| p.len())
            }
            Packed::Fp8 { scales, codes, .. } => codes.len() + 4 * scales.len(),
        }
    }

    fn shape(&self) -> (usize, usize) {
        match self {
            Packed::Int { n, k, .. } | Packed::Fp8 { n, k, .. } => (*n, *k),
        }
    }

    /// Elements `c0..c0 + out.len()` of row `r` (inside the row).
    fn decode_row(&self, r: usize, c0: usize, out: &mut [f32]) {
        match self {
            Packed::Int {
                k,
                group,
                codes,
                scales,
                pre,
                ..
            } => {
                let g = k.div_ceil(*group);
                let srow = &scales[r * g..(r + 1) * g];
                let base = r * k + c0;
                match codes {
                    Codes::Nibbles(b) => {
                        for (t, o) in out.iter_mut().enumerate() {
                            let i = base + t;
                            let q = (b[i / 2] >> (4 * (i % 2)) & 0xf) as i32 - 8;
                            *o = q as f32 * srow[(c0 + t) / group];
                        }
                    }
                    Codes::Bytes(b) => {
                        for (t, o) in out.iter_mut().enumerate() {
                            *o = b[base + t] as f32 * srow[(c0 + t) / group];
                        }
                    }
                }
                if let Some(p) = pre {
                    for (o, s) in out.iter_mut().zip(&p[c0..]) {
                        *o *= s;
                    }
                }
            }
            Packed::Fp8 {
                k, scales, codes, ..
            } => {
                let s = if scales.len() == 1 {
                    scales[0]
                } else {
                    scales[r]
                };
                let base = r * k + c0;
                for (o, &b) in out.iter_mut().zip(&codes[base..]) {
                    *o = f8_e4m3_to_f32(b) * s;
                }
            }
        }
    }
}

impl Decode for Packed {
    fn elements(&self) -> usize {
        let (n, k) = self.shape();
        n * k
    }

    fn decode(&self, from: usize, out: &mut [f32]) {
        let (_, k) = self.shape();
        let (mut i, mut o) = (from, 0);
        while o < out.len() {
            let (r, c0) = (i / k, i % k);
            let len = (k - c0).min(out.len() - o);
            self.decode_row(r, c0, &mut out[o..o + len]);
            i += len;
            o += len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int4(rows: usize, cols: usize, group: usize, lo: i8, hi: i8) -> Int4 {
        let mut s = 12345u32;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        let span = (hi as i32 - lo as i32 + 1) as u32;
        Int4 {
            rows,
            cols,
            group,
            scales: (0..rows * cols.div_ceil(group))
                .map(|_| half::bf16::from_f32(next() as f32 * 1e-12).to_f32())
                .collect(),
            codes: (0..rows * cols)
                .map(|_| (lo as i32 + (next() % span) as i32) as i8)
                .collect(),
        }
    }

    fn all(p: &Packed) -> Vec<f32> {
        let mut v = vec![0f32; p.elements()];
        p.decode(0, &mut v);
        v
    }

    /// Every range decodes to `dequantize_ref` (then `· pqs`) bit for bit: nibbles and bytes,
    /// per channel and per group (a partial last group), odd lengths, ranges across rows.
    #[test]
    fn int_codes_decode_to_the_reference() {
        for (group, lo, hi, nibbles) in [(37, -8, 7, true), (16, -8, 7, true), (37, -15, 15, false)]
        {
            let q = int4(5, 37, group, lo, hi);
            let want = q.dequantize_ref();
            let p = Packed::int(q.clone(), None);
            assert_eq!(
                matches!(
                    p,
                    Packed::Int {
                        codes: Codes::Nibbles(_),
                        ..
                    }
                ),
                nibbles
            );
            assert!(all(&p) == want);
            for (from, len) in [(0, 1), (3, 40), (36, 2), (74, 111)] {
                let mut v = vec![0f32; len];
                p.decode(from, &mut v);
                assert!(v == want[from..from + len], "{from}+{len}");
            }
            let pre: Vec<f32> = (0..37).map(|c| 0.5 + c as f32 / 37.0).collect();
            let p = Packed::int(q.clone(), Some(pre.clone()));
            let mut want = want.clone();
            for row in want.chunks_mut(37) {
                for (x, s) in row.iter_mut().zip(&pre) {
                    *x *= s;
                }
            }
            assert!(all(&p) == want);
        }
    }

    #[test]
    fn fp8_decodes_to_the_reference() {
        use crate::quant::math::fp8::Fp8;
        let codes: Vec<u8> = (0..6 * 9).map(|i| (i * 37 % 256) as u8 & 0xfe).collect();
        for scales in [vec![0.25f32, 3.0, 1e-3, 7.0, 0.5, 2.0], vec![0.125]] {
            let f = Fp8 {
                rows: 6,
                cols: 9,
                scales: scales.clone(),
                codes: codes.clone(),
            };
            let want = f.dequantize_ref();
            let p = Packed::Fp8 {
                n: 6,
                k: 9,
                scales,
                codes: codes.clone(),
            };
            let got = all(&p);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "bit for bit"
            );
        }
    }
}
