//! Block Attention Residuals (vLLM 0.33.0 `vllm/models/kimi_k3/nvidia/ops/attn_res.py`,
//! `_attn_res_kernel`, written here as its math): a sublayer's input is a softmax mixture of the
//! completed block sums (block 0 the embedding) and the current block's partial sum, each source
//! `v` scored `⟨norm.weight ⊙ proj.weight, v⟩ · rsqrt(mean(v²) + eps)` in f32, per row. The
//! caller applies the sublayer's own RMSNorm after (the kernel's `APPLY_OUTPUT_NORM`).

/// The score vector of one mixture: `res_norm.weight ⊙ res_proj.weight` (the kernel's
/// `input_qk_weight`), `[H]`.
pub fn score(norm: &[f32], proj: &[f32]) -> Vec<f32> {
    norm.iter().zip(proj).map(|(a, b)| a * b).collect()
}

/// The mixture over `n` rows of width `h` of `blocks` (each `[n, h]`) and `partial`, scored by
/// `w` (from [`score`]), `[n, h]`. With no block the mixture is the partial sum itself.
pub fn mix(
    blocks: &[Vec<f32>],
    partial: &[f32],
    w: &[f32],
    n: usize,
    h: usize,
    eps: f32,
) -> Vec<f32> {
    if blocks.is_empty() {
        return partial.to_vec();
    }
    let mut out = vec![0f32; n * h];
    let mut logits = vec![0f32; blocks.len() + 1];
    for t in 0..n {
        let row = |s: usize| -> &[f32] {
            let src = if s < blocks.len() {
                &blocks[s][..]
            } else {
                partial
            };
            &src[t * h..(t + 1) * h]
        };
        for (s, lg) in logits.iter_mut().enumerate() {
            let v = row(s);
            let ms = v.iter().map(|x| x * x).sum::<f32>() / h as f32;
            let dot = v.iter().zip(w).map(|(a, b)| a * b).sum::<f32>();
            *lg = dot / (ms + eps).sqrt();
        }
        crate::ops::softmax(&mut logits);
        let o = &mut out[t * h..(t + 1) * h];
        for (s, p) in logits.iter().enumerate() {
            for (y, x) in o.iter_mut().zip(row(s)) {
                *y += p * x;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_scores_average_and_one_source_passes_through() {
        // Two rows of width 2; a zero score vector gives every source the same weight.
        let b = vec![vec![1.0, 2.0, 3.0, 4.0]];
        let p = [3.0, 0.0, 1.0, 0.0];
        assert_eq!(
            mix(&b, &p, &[0.0, 0.0], 2, 2, 1e-5),
            vec![2.0, 1.0, 2.0, 2.0]
        );
        assert_eq!(mix(&[], &p, &[1.0, 1.0], 2, 2, 1e-5), p.to_vec());
        // A score along the first channel prefers the source whose normalised row points there.
        let m = mix(&b, &p, &[10.0, 0.0], 2, 2, 1e-5);
        assert!(m[0] > 2.9 && m[1] < 0.1, "{m:?}");
    }
}
