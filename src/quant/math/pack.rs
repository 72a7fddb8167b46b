//! INT4 nibble packing into 32-bit words (Quark): eight consecutive codes along the packed axis
//! per word; bit field `[4i, 4i+3]` holds element `8c + ORDER[i]`; nibbles are two's complement
//! (`q & 0xF`); a trailing partial word is padded with zero nibbles. Also the helpers every
//! word-packed layout shares: whole matrices row by row ([`pack_rows`], [`unpack_rows`]) and
//! words to and from little-endian bytes.

use rayon::prelude::*;

/// Nibble order within a word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Quark's default `reorder`: `[0, 2, 4, 6, 1, 3, 5, 7]`.
    Reorder,
    /// Sequential `[0..8]` (Quark `order`, and every file-to-file single-stage export).
    Sequential,
}

impl Order {
    pub fn map(self) -> [usize; 8] {
        match self {
            Order::Reorder => [0, 2, 4, 6, 1, 3, 5, 7],
            Order::Sequential => [0, 1, 2, 3, 4, 5, 6, 7],
        }
    }
}

/// Pack one run of codes (any length) into `len.div_ceil(8)` words.
pub fn pack(codes: &[i8], order: Order, out: &mut Vec<i32>) {
    let map = order.map();
    for chunk in codes.chunks(8) {
        let mut word = 0u32;
        for (i, &src) in map.iter().enumerate() {
            let q = chunk.get(src).copied().unwrap_or(0);
            word |= ((q as u32) & 0xf) << (4 * i);
        }
        out.push(word as i32);
    }
}

/// Unpack `n` codes from words (sign-extending nibbles).
pub fn unpack(words: &[i32], n: usize, order: Order, out: &mut Vec<i8>) {
    let map = order.map();
    let start = out.len();
    out.resize(start + words.len() * 8, 0);
    for (c, &w) in words.iter().enumerate() {
        for (i, &dst) in map.iter().enumerate() {
            let nib = ((w as u32) >> (4 * i)) & 0xf;
            out[start + 8 * c + dst] = ((nib << 4) as u8 as i8) >> 4;
        }
    }
    out.truncate(start + n);
}

/// `n` runs of `len` codes, run `i` packed into `⌈len/8⌉` words by `pack_run(i, out)` (runs in
/// parallel): `[n, ⌈len/8⌉]` words.
pub fn pack_runs(n: usize, len: usize, pack_run: impl Fn(usize, &mut Vec<i32>) + Sync) -> Vec<i32> {
    let wpr = len.div_ceil(8);
    let mut words = vec![0i32; n * wpr];
    if wpr > 0 {
        words.par_chunks_mut(wpr).enumerate().for_each(|(i, out)| {
            let mut v = Vec::with_capacity(wpr);
            pack_run(i, &mut v);
            out.copy_from_slice(&v);
        });
    }
    words
}

/// Pack each row of `[rows, cols]` codes with `pack_row`: `[rows, ⌈cols/8⌉]` words.
pub fn pack_rows(
    codes: &[i8],
    rows: usize,
    cols: usize,
    pack_row: impl Fn(&[i8], &mut Vec<i32>) + Sync,
) -> Vec<i32> {
    pack_runs(rows, cols, |r, v| {
        pack_row(&codes[r * cols..(r + 1) * cols], v)
    })
}

/// Unpack `[rows, ⌈cols/8⌉]` words into `[rows, cols]` codes (sign-extending nibbles).
pub fn unpack_rows(words: &[i32], rows: usize, cols: usize, order: Order) -> Vec<i8> {
    let wpr = cols.div_ceil(8);
    let mut codes = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        unpack(&words[r * wpr..(r + 1) * wpr], cols, order, &mut codes);
    }
    codes
}

/// Words to little-endian bytes (an I32 tensor's data).
pub fn le_bytes(words: &[i32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Little-endian bytes (an I32 tensor's data) to words.
pub fn words(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_words() {
        let codes = [7, -8, 0, 2, 2, 0, -2, -2];
        let mut v = Vec::new();
        pack(&codes, Order::Reorder, &mut v);
        pack(&codes, Order::Sequential, &mut v);
        assert_eq!(
            v.iter().map(|&w| w as u32).collect::<Vec<_>>(),
            vec![0xe028e207, 0xee022087]
        );
    }

    #[test]
    fn round_trip_with_padding() {
        let codes: Vec<i8> = (0..21).map(|i| (i % 16 - 8) as i8).collect();
        for o in [Order::Reorder, Order::Sequential] {
            let mut w = Vec::new();
            pack(&codes, o, &mut w);
            assert_eq!(w.len(), 3);
            let mut back = Vec::new();
            unpack(&w, codes.len(), o, &mut back);
            assert_eq!(back, codes);
        }
    }
}
