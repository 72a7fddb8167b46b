//! [`DenseLinear`]: one unquantized (BF16 / F16) linear layer uploaded to a [`Backend`] once,
//! `y = x · Wᵀ` there through the vendor BLAS, with each row's argmax reduced on the device
//! for an lm_head.

use std::sync::Arc;

use super::backend::Backend;
use super::dense::DeviceDense;
use super::elem::{Act, Elem};
use super::error::{GpuError, Result};
use super::ops::DevTensor;
use crate::io::Dtype;

/// One unquantized linear layer on one device.
pub struct DenseLinear {
    dev: Arc<dyn Backend>,
    w: DeviceDense,
}

impl DenseLinear {
    /// `y [m, n]` f32 = `x [m, k]` (already in [`DenseLinear::dtype`]) · Wᵀ, left on the device.
    pub fn forward_dev(&self, x: &DevTensor, m: usize) -> Result<DevTensor> {
        let out = self.dev.zeros(Elem::F32, m * self.w.n)?;
        self.dev.dense_dev(&self.w, x, m, &out)?;
        Ok(out)
    }

    /// Upload `w` (`[n, k]`, bit patterns of `dtype`) to `dev`.
    pub fn new(
        dev: Arc<dyn Backend>,
        w: &[u16],
        n: usize,
        k: usize,
        dtype: Act,
    ) -> Result<DenseLinear> {
        let w = dev.upload_dense(w, n, k, dtype)?;
        Ok(DenseLinear { dev, w })
    }

    /// Upload a tensor stored as BF16 / F16 (`bytes` little-endian, as in safetensors) as it is.
    pub fn from_stored(
        dev: Arc<dyn Backend>,
        dtype: Dtype,
        bytes: &[u8],
        n: usize,
        k: usize,
    ) -> Result<DenseLinear> {
        let act = match dtype {
            Dtype::BF16 => Act::Bf16,
            Dtype::F16 => Act::F16,
            other => {
                return Err(GpuError::Unsupported(
                    "dense weight dtype",
                    format!("{other:?} (BF16 and F16 only)"),
                ))
            }
        };
        let w: Vec<u16> = bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        DenseLinear::new(dev, &w, n, k, act)
    }

    /// Upload f32 weights as bf16 when that is exact for every value (e.g. a BF16 tensor read as
    /// f32); `Ok(None)` when one would round (the caller keeps them in f32 on the CPU).
    pub fn from_f32_exact(
        dev: Arc<dyn Backend>,
        w: &[f32],
        n: usize,
        k: usize,
    ) -> Result<Option<DenseLinear>> {
        let mut bits = Vec::with_capacity(w.len());
        for &v in w {
            let b = Act::Bf16.from_f32(v);
            if Act::Bf16.to_f32(b).to_bits() != v.to_bits() {
                return Ok(None);
            }
            bits.push(b);
        }
        DenseLinear::new(dev, &bits, n, k, Act::Bf16).map(Some)
    }

    /// Output features.
    pub fn n(&self) -> usize {
        self.w.n
    }
    /// Input features.
    pub fn k(&self) -> usize {
        self.w.k
    }
    /// The dtype the GEMM runs in (the weight's; activations are rounded to it).
    pub fn dtype(&self) -> Act {
        self.w.dtype
    }

    fn round(&self, x: &[f32]) -> Vec<u16> {
        x.iter().map(|&v| self.w.dtype.from_f32(v)).collect()
    }

    /// `y [m, n] = x [m, k] · Wᵀ` on the device (`x` rounded to [`DenseLinear::dtype`] first).
    pub fn forward(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        self.dev.dense_on(&self.w, &self.round(x), m)
    }

    /// The index of the largest output of each of the `m` rows of `x · Wᵀ`, computed and reduced
    /// on the device (`kq_argmax_rows`: first on ties, a NaN counts as the largest).
    pub fn argmax_rows(&self, x: &[f32], m: usize) -> Result<Vec<usize>> {
        self.dev.dense_argmax_on(&self.w, &self.round(x), m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::CpuEmu;

    fn emu() -> Arc<dyn Backend> {
        Arc::new(CpuEmu::nvidia())
    }

    /// F32 weights go up only when bf16 holds them exactly; stored BF16 / F16 bytes go up as
    /// they are, in their own dtype; other dtypes and malformed shapes are typed errors.
    #[test]
    fn uploads_are_lossless_or_refused() {
        let exact = [1.0f32, -0.5, 3.0, 0.0];
        let l = DenseLinear::from_f32_exact(emu(), &exact, 2, 2)
            .unwrap()
            .unwrap();
        assert_eq!((l.n(), l.k(), l.dtype()), (2, 2, Act::Bf16));
        assert_eq!(l.forward(&[1.0, 1.0], 1).unwrap(), vec![0.5, 3.0]);
        let inexact = [1.0f32, 1.0 + f32::EPSILON, 3.0, 0.0];
        assert!(DenseLinear::from_f32_exact(emu(), &inexact, 2, 2)
            .unwrap()
            .is_none());
        let bytes: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
            .collect();
        let l = DenseLinear::from_stored(emu(), Dtype::F16, &bytes, 1, 2).unwrap();
        assert_eq!(l.dtype(), Act::F16);
        assert_eq!(l.forward(&[2.0, 1.0], 1).unwrap(), vec![1.0]);
        assert_eq!(
            l.argmax_rows(&[2.0, 1.0, -1.0, 0.0], 2).unwrap(),
            vec![0, 0]
        );
        assert!(matches!(
            DenseLinear::from_stored(emu(), Dtype::F32, &[0; 8], 1, 2),
            Err(GpuError::Unsupported(..))
        ));
        assert!(matches!(
            DenseLinear::new(emu(), &[0; 3], 1, 2, Act::Bf16),
            Err(GpuError::Layout(_))
        ));
        assert!(matches!(
            DenseLinear::new(emu(), &[], 0, 2, Act::Bf16),
            Err(GpuError::Unsupported("N", _))
        ));
        assert!(matches!(l.forward(&[1.0], 1), Err(GpuError::Layout(_))));
        assert!(matches!(
            l.forward(&[], 0),
            Err(GpuError::Unsupported("M", _))
        ));
        assert!(matches!(
            l.argmax_rows(&[], 0),
            Err(GpuError::Unsupported("M", _))
        ));
    }
}
