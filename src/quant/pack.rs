//! INT4 nibble packing into 32-bit words (Quark): eight consecutive codes along the packed axis
//! per word; bit field `[4i, 4i+3]` holds element `8c + ORDER[i]`; nibbles are two's complement
//! (`q & 0xF`); a trailing partial word is padded with zero nibbles.

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
