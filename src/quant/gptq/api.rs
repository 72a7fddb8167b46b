//! GPTQ's API types: the options ([`Config`]), one layer's inputs ([`Layer`]), what comes back
//! ([`Output`], [`Report`]), the typed failures ([`GptqError`]), and the input checks both paths
//! run first (`validate`, `check_finite`).

use crate::io::Dtype;
use crate::quant::math::int4::round_to;

use super::grid::Grid;

/// GPTQ's options. [`Default`] is llm-compressor's and Quark's: block 128, damping 0.01 of the
/// mean diagonal, static act-order, Quark's 5 Cholesky retries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// Columns per lazy-batch block (the inter-block update is one matrix product). Changes only
    /// the floating-point order, not the maths.
    pub block_size: usize,
    /// Relative dampening: `damp_frac · mean(diag H)` is added to the diagonal.
    pub damp_frac: f64,
    /// Static act-order: process columns by descending `diag(H)`.
    pub act_order: bool,
    /// Cholesky retries with 10× more extra damping each (Quark: 5); 0 fails at once.
    pub retries: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            block_size: 128,
            damp_frac: 0.01,
            act_order: true,
            retries: 5,
        }
    }
}

/// One layer to quantize: the weight, its fixed scales and the integer grid.
#[derive(Debug, Clone, Copy)]
pub struct Layer<'a> {
    /// `[rows, cols]` row-major.
    pub weight: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    /// `[rows, cols / group]` row-major, each positive, finite and exactly representable in
    /// `grid.scale_dtype`.
    pub scales: &'a [f32],
    /// Columns per scale (static groups in the original column order); `cols` is per channel.
    pub group: usize,
    pub grid: Grid,
}

/// What GPTQ did besides the codes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Report {
    /// Dead columns (`diag H == 0`), quantized to 0.
    pub dead: usize,
    /// The damping added to the diagonal (`damp_frac · mean(diag H)`, after the dead fix).
    pub damp: f64,
    /// The extra diagonal damping of the Cholesky try that succeeded (0 on the first try).
    pub extra_damp: f64,
    /// Cholesky retries needed (0: the damped H factored at once).
    pub retries: u32,
}

/// GPTQ's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// `[rows, cols]` row-major, original column order, each in `qmin..=qmax`.
    pub codes: Vec<i8>,
    /// Per row: `Σ_j ((w_j − q_j) / U[j, j])² / 2` (llm-compressor's loss; its log shows the
    /// sum over rows).
    pub loss: Vec<f64>,
    pub report: Report,
}

/// Why GPTQ refused a layer. Never a panic, never a silent RTN.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GptqError {
    #[error("{what} has {actual} values, expected {expected}")]
    Length {
        what: &'static str,
        expected: usize,
        actual: usize,
    },
    #[error("empty layer ({rows} x {cols})")]
    Empty { rows: usize, cols: usize },
    #[error("group size {group} must be at least 1 and divide the {cols} input columns")]
    Group { group: usize, cols: usize },
    #[error("block size must be at least 1")]
    BlockSize,
    #[error("dampening fraction {0} must be finite and non-negative")]
    DampFrac(f64),
    #[error("integer grid {qmin}..={qmax} must contain 0 and fit in i8")]
    Grid { qmin: i32, qmax: i32 },
    #[error("scale dtype {0} is not bf16, f16 or f32")]
    ScaleDtype(Dtype),
    #[error("{what} value {index} is not finite")]
    NonFinite { what: &'static str, index: usize },
    #[error("scale {index} ({value:e}) must be positive and exactly representable in {dtype}")]
    Scale {
        index: usize,
        value: f32,
        dtype: Dtype,
    },
    #[error(
        "the damped Hessian ({cols} x {cols}, damping {damp:e}) is not positive definite, even with \
         extra diagonal damping up to {extra_damp:e} ({retries} retries); hint: more calibration \
         tokens, or a larger dampening fraction"
    )]
    NotPositiveDefinite {
        cols: usize,
        damp: f64,
        extra_damp: f64,
        retries: u32,
    },
}

/// Check everything but H's values; `h_len` is the Hessian's length.
pub(crate) fn validate(layer: &Layer, h_len: usize, cfg: &Config) -> Result<(), GptqError> {
    let (rows, cols, group) = (layer.rows, layer.cols, layer.group);
    if rows == 0 || cols == 0 {
        return Err(GptqError::Empty { rows, cols });
    }
    // `expected` is None when the product overflows (reported as usize::MAX).
    let len = |what, expected: Option<usize>, actual| {
        if expected == Some(actual) {
            Ok(())
        } else {
            Err(GptqError::Length {
                what,
                expected: expected.unwrap_or(usize::MAX),
                actual,
            })
        }
    };
    len("weight", rows.checked_mul(cols), layer.weight.len())?;
    len("hessian", cols.checked_mul(cols), h_len)?;
    if group == 0 || cols % group != 0 {
        return Err(GptqError::Group { group, cols });
    }
    len("scales", rows.checked_mul(cols / group), layer.scales.len())?;
    if cfg.block_size == 0 {
        return Err(GptqError::BlockSize);
    }
    if !cfg.damp_frac.is_finite() || cfg.damp_frac < 0.0 {
        return Err(GptqError::DampFrac(cfg.damp_frac));
    }
    let g = layer.grid;
    if g.qmin > 0 || g.qmax < 0 || g.qmin < i8::MIN as i32 || g.qmax > i8::MAX as i32 {
        return Err(GptqError::Grid {
            qmin: g.qmin,
            qmax: g.qmax,
        });
    }
    if !matches!(g.scale_dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
        return Err(GptqError::ScaleDtype(g.scale_dtype));
    }
    if let Some(index) = layer.weight.iter().position(|v| !v.is_finite()) {
        return Err(GptqError::NonFinite {
            what: "weight",
            index,
        });
    }
    for (index, &value) in layer.scales.iter().enumerate() {
        if !(value.is_finite() && value > 0.0 && round_to(g.scale_dtype, value) == value) {
            return Err(GptqError::Scale {
                index,
                value,
                dtype: g.scale_dtype,
            });
        }
    }
    Ok(())
}

/// The first non-finite value of a Hessian, as the typed error.
pub(crate) fn check_finite<T: Copy + Into<f64>>(h: &[T]) -> Result<(), GptqError> {
    match h.iter().position(|&v| !v.into().is_finite()) {
        Some(index) => Err(GptqError::NonFinite {
            what: "hessian",
            index,
        }),
        None => Ok(()),
    }
}
