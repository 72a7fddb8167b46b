//! Element types a safetensors file may hold, their sizes, and exact conversion of raw
//! little-endian bytes (at any alignment) to `f32`.

use std::fmt;

/// A safetensors dtype. Names are the on-disk spellings. The variant order is the `safetensors`
/// crate's (alignment order): writers sort tensors by it, so it must not change.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    BOOL,
    U8,
    I8,
    F8_E5M2,
    F8_E4M3,
    F8_E8M0,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    F64,
    I64,
    U64,
}

impl Dtype {
    /// Every dtype, in the alignment order safetensors uses.
    pub const ALL: [Dtype; 16] = [
        Dtype::BOOL,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8_E5M2,
        Dtype::F8_E4M3,
        Dtype::F8_E8M0,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::BOOL
            | Dtype::U8
            | Dtype::I8
            | Dtype::F8_E4M3
            | Dtype::F8_E5M2
            | Dtype::F8_E8M0 => 1,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::I64 | Dtype::U64 | Dtype::F64 => 8,
        }
    }

    /// The on-disk name (`"BF16"`, `"F8_E4M3"`, …).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::BOOL => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8_E4M3 => "F8_E4M3",
            Dtype::F8_E5M2 => "F8_E5M2",
            Dtype::F8_E8M0 => "F8_E8M0",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
            Dtype::F64 => "F64",
        }
    }

    /// Parse an on-disk name.
    pub fn parse(s: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == s)
    }

    /// Floating-point types (quantizable weights are among these).
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// FP8 E4M3 (the `fn` variant: no infinities, NaN = S.1111.111) to f32.
pub fn f8_e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = (b >> 3) & 0x0f;
    let man = (b & 0x07) as f32;
    if exp == 0x0f && (b & 0x07) == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp as i32 - 7)
    }
}

/// FP8 E5M2 (IEEE-like, the top byte of an f16) to f32.
pub fn f8_e5m2_to_f32(b: u8) -> f32 {
    half::f16::from_bits((b as u16) << 8).to_f32()
}

/// E8M0 (power-of-two scale, 255 = NaN) to f32.
pub fn f8_e8m0_to_f32(b: u8) -> f32 {
    if b == 0xff {
        f32::NAN
    } else {
        2f32.powi(b as i32 - 127)
    }
}

/// Convert raw little-endian bytes of `dtype` to f32, appending to `out`.
///
/// Works for any alignment of `bytes` (each element is assembled with `from_le_bytes`).
/// `bytes.len()` must be a multiple of `dtype.size()`; a trailing partial element is ignored.
/// Integer types convert by value (`i64`/`u64` may round); BOOL is 0.0 or 1.0.
pub fn to_f32(dtype: Dtype, bytes: &[u8], out: &mut Vec<f32>) {
    let at = out.len();
    out.resize(at + bytes.len() / dtype.size(), 0.0);
    to_f32_into(dtype, bytes, &mut out[at..]);
}

/// [`to_f32`] into `out` (replacing its contents), split over threads in chunks: identical
/// output. A caller converting tensor after tensor reuses one buffer instead of faulting in
/// fresh pages for each.
pub fn to_f32_par_into(dtype: Dtype, bytes: &[u8], out: &mut Vec<f32>) {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    let size = dtype.size();
    out.clear();
    out.resize(bytes.len() / size, 0.0);
    out.par_chunks_mut(CHUNK)
        .zip(bytes.par_chunks(CHUNK * size))
        .for_each(|(o, c)| to_f32_into(dtype, &c[..o.len() * size], o));
}

/// [`to_f32`] into a slice of exactly `bytes.len() / dtype.size()` elements.
pub fn to_f32_into(dtype: Dtype, bytes: &[u8], out: &mut [f32]) {
    assert_eq!(out.len(), bytes.len() / dtype.size(), "one f32 per element");
    macro_rules! conv {
        ($n:literal, $f:expr) => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact($n)) {
                let a: [u8; $n] = c.try_into().unwrap();
                #[allow(clippy::redundant_closure_call)]
                {
                    *o = ($f)(a);
                }
            }
        };
    }
    match dtype {
        Dtype::BOOL => conv!(1, |a: [u8; 1]| (a[0] != 0) as u8 as f32),
        Dtype::U8 => conv!(1, |a: [u8; 1]| a[0] as f32),
        Dtype::I8 => conv!(1, |a: [u8; 1]| a[0] as i8 as f32),
        Dtype::F8_E4M3 => {
            let lut = e4m3_lut();
            conv!(1, |a: [u8; 1]| lut[a[0] as usize])
        }
        Dtype::F8_E5M2 => conv!(1, |a: [u8; 1]| f8_e5m2_to_f32(a[0])),
        Dtype::F8_E8M0 => conv!(1, |a: [u8; 1]| f8_e8m0_to_f32(a[0])),
        Dtype::I16 => conv!(2, |a| i16::from_le_bytes(a) as f32),
        Dtype::U16 => conv!(2, |a| u16::from_le_bytes(a) as f32),
        Dtype::F16 => conv!(2, |a| half::f16::from_bits(u16::from_le_bytes(a)).to_f32()),
        // Written for the auto-vectorizer (the widening sits inside every CPU matmul's
        // packing step): two byte loads and shifts per element, no per-chunk conversion.
        Dtype::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f32::from_bits(((c[0] as u32) << 16) | ((c[1] as u32) << 24));
            }
        }
        Dtype::I32 => conv!(4, |a| i32::from_le_bytes(a) as f32),
        Dtype::U32 => conv!(4, |a| u32::from_le_bytes(a) as f32),
        Dtype::F32 => conv!(4, f32::from_le_bytes),
        Dtype::I64 => conv!(8, |a| i64::from_le_bytes(a) as f32),
        Dtype::U64 => conv!(8, |a| u64::from_le_bytes(a) as f32),
        Dtype::F64 => conv!(8, |a| f64::from_le_bytes(a) as f32),
    }
}

fn e4m3_lut() -> &'static [f32; 256] {
    static LUT: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    LUT.get_or_init(|| std::array::from_fn(|i| f8_e4m3_to_f32(i as u8)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in Dtype::ALL {
            assert_eq!(Dtype::parse(d.name()), Some(d));
        }
        assert_eq!(Dtype::parse("F4"), None);
    }

    #[test]
    fn e4m3_known_values() {
        assert_eq!(f8_e4m3_to_f32(0x00), 0.0);
        assert_eq!(f8_e4m3_to_f32(0x38), 1.0);
        assert_eq!(f8_e4m3_to_f32(0x7e), 448.0);
        assert_eq!(f8_e4m3_to_f32(0xfe), -448.0);
        assert_eq!(f8_e4m3_to_f32(0x01), 2f32.powi(-9));
        assert!(f8_e4m3_to_f32(0x7f).is_nan());
    }

    #[test]
    fn e5m2_and_e8m0() {
        assert_eq!(f8_e5m2_to_f32(0x3c), 1.0);
        assert_eq!(f8_e5m2_to_f32(0x7b), 57344.0);
        assert_eq!(f8_e8m0_to_f32(127), 1.0);
        assert_eq!(f8_e8m0_to_f32(130), 8.0);
        assert!(f8_e8m0_to_f32(255).is_nan());
    }

    #[test]
    fn unaligned_conversion_matches_aligned() {
        let vals = [1.5f32, -2.25, 3.0e-3, 65504.0];
        let mut raw = vec![0u8; 1];
        for v in vals {
            raw.extend_from_slice(&v.to_le_bytes());
        }
        let mut out = Vec::new();
        to_f32(Dtype::F32, &raw[1..], &mut out);
        assert_eq!(out, vals);

        // The 16-bit types, at an odd offset: each value stored as its `bits` reads back as
        // `round` (the value rounded to the type).
        type Half = (Dtype, usize, fn(f32) -> u16, fn(f32) -> f32);
        let halves: [Half; 2] = [
            (
                Dtype::BF16,
                1,
                |v| half::bf16::from_f32(v).to_bits(),
                |v| half::bf16::from_f32(v).to_f32(),
            ),
            (
                Dtype::F16,
                3,
                |v| half::f16::from_f32(v).to_bits(),
                |v| half::f16::from_f32(v).to_f32(),
            ),
        ];
        for (dtype, off, bits, round) in halves {
            let mut raw = vec![0u8; off];
            for v in vals {
                raw.extend_from_slice(&bits(v).to_le_bytes());
            }
            out.clear();
            to_f32(dtype, &raw[off..], &mut out);
            let want: Vec<f32> = vals.iter().map(|&v| round(v)).collect();
            assert_eq!(out, want, "{dtype:?}");
        }
    }

    #[test]
    fn integers_and_bool() {
        let mut out = Vec::new();
        to_f32(Dtype::I64, &(-5i64).to_le_bytes(), &mut out);
        to_f32(Dtype::I8, &[0xff], &mut out);
        to_f32(Dtype::BOOL, &[0, 1, 7], &mut out);
        to_f32(Dtype::I16, &(-300i16).to_le_bytes(), &mut out);
        assert_eq!(out, vec![-5.0, -1.0, 0.0, 1.0, 1.0, -300.0]);
    }
}
