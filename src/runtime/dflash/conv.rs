//! DFlash2's two-sided grouped dynamic depthwise convolution (vLLM 0.32/0.33
//! `model_executor/models/qwen3_dflash2.py`, `DFlashGroupedConv`): around every attention and
//! every MLP of a layer, `coeff = kernel_projection(x)` `[rows, 2 (side), taps, groups]` from the
//! normed sublayer input x; side 0 convolves x before the sublayer, side 1 the sublayer's output:
//! `out[i, c] = Σ_{t<taps} (base[side, t, c] + coeff[i, side, t, c / group]) · y[i − t, c]`, with
//! rows of one query block only (`y[i − t] = 0` across the block start; vLLM's block is the
//! request's `1 + num_speculative_tokens` rows). Written from the CPU path of vLLM's
//! `_grouped_conv` (its CUDA path is a Triton kernel computing the same sum).

use super::super::linears::Linear;

/// One `attention_conv` or `mlp_conv` of a layer.
pub struct GroupedConv {
    pub kernel: Kernel,
    /// `kernel_projection` `[2 · taps · h / group, h]`.
    pub(super) proj: Linear,
}

/// The static part of a convolution: widths and `base_kernel` `[2, taps, h]`.
pub struct Kernel {
    pub taps: usize,
    pub group: usize,
    pub h: usize,
    pub(super) base: Vec<f32>,
}

/// The coefficients of one application: `[rows, 2, taps, groups]`.
pub struct Coeff(Vec<f32>);

impl GroupedConv {
    /// Side 0 of `x` (`[rows, h]`, blocks of `b` rows) and the coefficients side 1 uses.
    /// `reference`: the projection on the plain reference matmul.
    pub fn prepare(&self, x: &[f32], rows: usize, b: usize, reference: bool) -> (Vec<f32>, Coeff) {
        let c = if reference {
            self.proj.apply_ref(x, rows)
        } else {
            self.proj.apply(x, rows)
        };
        let c = Coeff(c);
        (self.kernel.convolve(x, &c, 0, rows, b), c)
    }

    /// Side 1 of the sublayer's output `y` with the coefficients of [`GroupedConv::prepare`].
    pub fn finish(&self, y: &[f32], c: &Coeff, rows: usize, b: usize) -> Vec<f32> {
        self.kernel.convolve(y, c, 1, rows, b)
    }
}

impl Kernel {
    fn groups(&self) -> usize {
        self.h / self.group
    }

    fn convolve(&self, x: &[f32], c: &Coeff, side: usize, rows: usize, b: usize) -> Vec<f32> {
        let (h, taps, g, ng) = (self.h, self.taps, self.group, self.groups());
        let mut out = vec![0f32; rows * h];
        for i in 0..rows {
            let pos = i % b;
            let coeff = &c.0[(i * 2 + side) * taps * ng..(i * 2 + side + 1) * taps * ng];
            let o = &mut out[i * h..(i + 1) * h];
            for t in 0..taps.min(pos + 1) {
                let base = &self.base[(side * taps + t) * h..(side * taps + t + 1) * h];
                let xr = &x[(i - t) * h..(i - t + 1) * h];
                for ch in 0..h {
                    o[ch] += (base[ch] + coeff[t * ng + ch / g]) * xr[ch];
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sum written out for one row, against vLLM's formula: taps 2, group 2, h 4, a block of
    /// 3 rows then a second block (its first row sees no previous row).
    #[test]
    fn convolution_is_the_grouped_two_tap_sum_within_a_block() {
        let (h, taps, group) = (4, 2, 2);
        let ng = h / group;
        let base: Vec<f32> = (0..2 * taps * h).map(|i| 0.1 * i as f32).collect();
        let conv = Kernel {
            taps,
            group,
            h,
            base: base.clone(),
        };
        let rows = 4;
        let x: Vec<f32> = (0..rows * h).map(|i| 1.0 + i as f32).collect();
        let coeff: Vec<f32> = (0..rows * 2 * taps * ng).map(|i| 0.01 * i as f32).collect();
        let c = Coeff(coeff.clone());
        let y = conv.convolve(&x, &c, 1, rows, 3);
        for i in 0..rows {
            for ch in 0..h {
                let mut want = 0f32;
                for t in 0..taps {
                    if i % 3 >= t {
                        let k = base[(taps + t) * h + ch]
                            + coeff[((i * 2 + 1) * taps + t) * ng + ch / group];
                        want += k * x[(i - t) * h + ch];
                    }
                }
                assert!((y[i * h + ch] - want).abs() < 1e-5, "row {i} channel {ch}");
            }
        }
        // Row 3 starts the second block: tap 1 reads nothing.
        let k0 = base[taps * h] + coeff[(3 * 2 + 1) * taps * ng];
        assert!((y[3 * h] - k0 * x[3 * h]).abs() < 1e-5);
    }
}
