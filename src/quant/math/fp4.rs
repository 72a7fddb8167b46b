//! The NVFP4 storage layout both NVFP4 formats share (compressed-tensors `nvfp4-pack-quantized`
//! and ModelOpt `NVFP4` / `W4A16_NVFP4`): FP4 E2M1 codes, two per byte along the input
//! dimension, and one FP8 E4M3 scale per run of 16 inputs. Only the layout lives here: the
//! recipes (how the per-tensor and per-block scales and the codes are computed, and how a
//! format dequantizes) are each format's own, in `compressed_tensors/nvfp4.rs` and `modelopt/nvfp4.rs`.
//!
//! A code is a nibble: bit 3 the sign, bits 0..2 an index into [`E2M1`]. Byte `j` of a row
//! holds element `2j` in its low nibble and `2j + 1` in its high nibble (compressed-tensors
//! `pack_fp4_to_uint8`, ModelOpt `NVFP4QTensor.quantize`: `q[..., 1::2] << 4 | q[..., 0::2]`).

use rayon::prelude::*;

use crate::io::dtype::f8_e4m3_to_f32;
use crate::io::writer::TensorSpec;
use crate::io::Dtype;
use crate::quant::math::rowwise::{self, encode_floats, Path};

/// E2M1 magnitudes by index (`code & 7`).
pub const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
/// Largest E2M1 magnitude.
pub const E2M1_MAX: f32 = 6.0;
/// NVFP4 block size along the input dimension.
pub const BLOCK: usize = 16;

/// The value of one E2M1 code.
pub fn value(code: u8) -> f32 {
    let v = E2M1[(code & 7) as usize];
    if code & 8 != 0 {
        -v
    } else {
        v
    }
}

/// A matrix in NVFP4: E2M1 codes, one E4M3 block scale per run of [`BLOCK`] inputs, and the
/// per-tensor F32 scale (what it means, a multiplier or a divisor, is the format's).
#[derive(Debug, Clone, PartialEq)]
pub struct Nvfp4 {
    pub rows: usize,
    pub cols: usize,
    /// `[rows, cols]` nibbles (0..=15).
    pub codes: Vec<u8>,
    /// `[rows, cols / 16]` E4M3 bytes.
    pub scales: Vec<u8>,
    /// The per-tensor scale: compressed-tensors' `weight_global_scale` (a divisor of the block
    /// scales) or ModelOpt's `weight_scale_2` (a multiplier).
    pub global: f32,
}

impl Nvfp4 {
    /// Quantize `w` with one format's `run` recipe, one run per block of 16 inputs: `run(block,
    /// codes)` writes the block's codes and returns its E4M3 scale byte. `cols` must be a
    /// multiple of 16 (the driver refuses other tensors).
    pub fn quantize_blocks(
        path: Path,
        w: &[f32],
        rows: usize,
        cols: usize,
        global: f32,
        run: impl Fn(&[f32], &mut [u8]) -> u8 + Sync,
    ) -> Nvfp4 {
        assert_eq!(
            cols % BLOCK,
            0,
            "NVFP4 needs the input dimension in blocks of 16"
        );
        let (scales, codes) = rowwise::quantize(path, w, rows, cols, BLOCK, run);
        Nvfp4 {
            rows,
            cols,
            codes,
            scales,
            global,
        }
    }

    /// The codes packed two per byte, `[rows, cols / 2]`.
    pub fn packed(&self) -> Vec<u8> {
        pack(&self.codes)
    }

    /// `f8(scale)` of each block, as f32.
    pub fn block_scales_f32(&self) -> Vec<f32> {
        self.scales.iter().map(|&s| f8_e4m3_to_f32(s)).collect()
    }

    /// Read the stored tensors back: `packed` `[rows, cols/2]`, `scales` `[rows, cols/16]` E4M3,
    /// `global` the per-tensor scale.
    pub fn from_stored(
        packed: &[u8],
        scales: &[u8],
        global: f32,
        rows: usize,
        cols: usize,
    ) -> Nvfp4 {
        assert_eq!(packed.len() * 2, rows * cols);
        assert_eq!(scales.len() * BLOCK, rows * cols);
        Nvfp4 {
            rows,
            cols,
            codes: unpack(packed),
            scales: scales.to_vec(),
            global,
        }
    }

    /// `value(code) · block(f8(s))` for each element, in F32: the dequantization both formats
    /// write, each with its code values and its use of the per-tensor scale (`block`).
    pub fn dequantize_with(
        &self,
        value: impl Fn(u8) -> f32,
        block: impl Fn(f32) -> f32,
    ) -> Vec<f32> {
        let groups = self.cols / BLOCK;
        let eff: Vec<f32> = self.block_scales_f32().into_iter().map(block).collect();
        (0..self.rows * self.cols)
            .map(|i| value(self.codes[i]) * eff[(i / self.cols) * groups + (i % self.cols) / BLOCK])
            .collect()
    }
}

/// Pack nibbles two per byte: byte `j` = `codes[2j] | codes[2j + 1] << 4` (`codes.len()` even).
pub fn pack(codes: &[u8]) -> Vec<u8> {
    assert_eq!(codes.len() % 2, 0);
    codes
        .par_chunks(2)
        .map(|p| (p[0] & 0xf) | (p[1] << 4))
        .collect()
}

/// Unpack [`pack`]: two nibbles per byte, the low one first.
pub fn unpack(bytes: &[u8]) -> Vec<u8> {
    bytes.iter().flat_map(|&b| [b & 0xf, b >> 4]).collect()
}

/// Test support shared by the NVFP4 recipes: every weight within `max_steps` of its 16-element
/// block's effective scale `eff[block]` of its dequantized value; returns the RMSE.
/// What a carrier names an NVFP4 module's tensors beside `{module}.weight_scale` (the block
/// scales, E4M3 `[rows, cols / 16]`): the packed codes (U8 `[rows, cols / 2]`), the per-tensor
/// scale, and the W4A4 input scale, each scale F32 of shape `scalar`.
pub struct Nvfp4Names {
    pub packed: &'static str,
    pub global: &'static str,
    pub input: &'static str,
    pub scalar: &'static [usize],
}

impl Nvfp4Names {
    /// The tensors one module becomes (the input scale for W4A4 only).
    pub fn specs(&self, module: &str, rows: usize, cols: usize, w4a4: bool) -> Vec<TensorSpec> {
        let scalar = |name: &str| {
            TensorSpec::new(format!("{module}.{name}"), Dtype::F32, self.scalar.to_vec())
        };
        let mut v = vec![
            TensorSpec::new(
                format!("{module}.{}", self.packed),
                Dtype::U8,
                vec![rows, cols / 2],
            ),
            TensorSpec::new(
                format!("{module}.weight_scale"),
                Dtype::F8_E4M3,
                vec![rows, cols / BLOCK],
            ),
            scalar(self.global),
        ];
        if w4a4 {
            v.push(scalar(self.input));
        }
        v
    }

    /// Encode a module for each of its [`Nvfp4Names::specs`]; `input` the W4A4 input scale.
    pub fn encode(&self, module: &str, q: &Nvfp4, input: Option<f32>) -> Vec<(String, Vec<u8>)> {
        let scalar =
            |name: &str, x: f32| (format!("{module}.{name}"), encode_floats(&[x], Dtype::F32));
        let mut v = vec![
            (format!("{module}.{}", self.packed), q.packed()),
            (format!("{module}.weight_scale"), q.scales.clone()),
            scalar(self.global, q.global),
        ];
        v.extend(input.map(|x| scalar(self.input, x)));
        v
    }
}

#[cfg(test)]
pub fn assert_within_block_steps(
    w: &[f32],
    d: &[f32],
    eff: &[f32],
    cols: usize,
    max_steps: f32,
) -> f32 {
    let step = |i: usize| eff[(i / cols) * (cols / 16) + (i % cols) / 16];
    crate::quant::math::rowwise::rmse_within(w, d, |i, e| e <= max_steps * step(i) * (1.0 + 1e-6))
}

/// Test support shared by the NVFP4 recipes' named error bounds: on the 64 × 256 BF16 test
/// matrix quantized with its own amax, every weight within `max_steps` effective block scales
/// (`eff(f8(s), global)`) of its dequantized value, and the RMSE below `max_rmse`.
#[cfg(test)]
pub fn assert_error_bound(
    quantize: impl Fn(&[f32], usize, usize, f32) -> Nvfp4,
    dequantize: fn(&Nvfp4) -> Vec<f32>,
    eff: fn(f32, f32) -> f32,
    max_steps: f32,
    max_rmse: f32,
) {
    use crate::quant::math::rowwise;
    let (rows, cols) = (64, 256);
    let w = rowwise::test_data(rows, cols, crate::io::Dtype::BF16);
    let q = quantize(&w, rows, cols, rowwise::amax(&w));
    let d = dequantize(&q);
    let eff: Vec<f32> = q
        .block_scales_f32()
        .iter()
        .map(|&s| eff(s, q.global))
        .collect();
    let rmse = assert_within_block_steps(&w, &d, &eff, cols, max_steps);
    assert!(rmse < max_rmse, "rmse {rmse}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_packing() {
        let codes: Vec<u8> = (0..16).collect();
        let v: Vec<f32> = codes.iter().map(|&c| value(c)).collect();
        assert_eq!(&v[..8], &E2M1);
        assert_eq!(v[9], -0.5);
        assert_eq!(v[15], -6.0);
        assert!(v[8] == 0.0 && v[8].is_sign_negative());
        let b = pack(&codes);
        assert_eq!(b, vec![0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe]);
        assert_eq!(unpack(&b), codes);
    }
}
