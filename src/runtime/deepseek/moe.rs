//! The feed-forward blocks: the SwiGLU MLP (dense layers, shared experts, each routed expert)
//! and transformers' `DeepseekV3MoE`: sigmoid router scores, `e_score_correction_bias` added for
//! the choice only, groups ranked by the sum of their top-2 biased scores, the best `topk_group`
//! groups kept, the top `num_experts_per_tok` experts among them, their unbiased scores
//! normalised (`norm_topk_prob`, `+1e-20`) and scaled by `routed_scaling_factor`; routed
//! outputs summed in expert order, shared experts added. Each MLP carries its activation
//! (`weights::Act`: SwiGLU, or Kimi-K3's SiTU); the routed experts run in whatever width their input
//! rows have (Kimi-K3's LatentMoE runs them in its latent, `runtime::kimi_k3`).

use rayon::prelude::*;

use super::config::DsConfig;
use super::weights::{Mlp, Moe};
use super::OpImpl;

/// `down(act(gate x, up x))` on `n` rows of width `h`.
pub fn mlp(e: OpImpl, m: &Mlp, x: &[f32], n: usize, h: usize) -> Vec<f32> {
    let g = e.linear(x, n, h, &m.gate, m.inter);
    let u = e.linear(x, n, h, &m.up, m.inter);
    let act: Vec<f32> = g.iter().zip(&u).map(|(a, b)| m.act.apply(*a, *b)).collect();
    e.linear(&act, n, m.inter, &m.down, h)
}

/// The router's choice for `n` rows: `idx`/`weight` `[n, top_k]`, ordered by descending biased
/// score (the order torch's `topk(sorted=False)` returns for these sizes).
#[derive(Debug, Clone, PartialEq)]
pub struct Routed {
    pub idx: Vec<u32>,
    pub weight: Vec<f32>,
}

/// Indices of the `k` largest of `v` (descending; the lower index first on ties).
fn top(v: &[f32], k: usize) -> Vec<usize> {
    let mut i: Vec<usize> = (0..v.len()).collect();
    i.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
    i.truncate(k);
    i
}

/// Route one row from its router logits.
fn route_row(c: &DsConfig, bias: &[f32], logits: &[f32]) -> (Vec<u32>, Vec<f32>) {
    let scores: Vec<f32> = logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect();
    let choice: Vec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
    let per = c.experts / c.n_group;
    let group_score: Vec<f32> = choice
        .chunks(per)
        .map(|g| top(g, 2).iter().map(|&j| g[j]).sum())
        .collect();
    let keep = top(&group_score, c.topk_group);
    let masked: Vec<f32> = (0..c.experts)
        .map(|x| {
            if keep.contains(&(x / per)) {
                choice[x]
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    let idx = top(&masked, c.top_k);
    let mut w: Vec<f32> = idx.iter().map(|&x| scores[x]).collect();
    if c.norm_topk {
        let d = w.iter().sum::<f32>() + 1e-20;
        w.iter_mut().for_each(|x| *x /= d);
    }
    w.iter_mut().for_each(|x| *x *= c.routed_scale);
    (idx.into_iter().map(|x| x as u32).collect(), w)
}

/// Route `n` rows.
pub fn route(e: OpImpl, c: &DsConfig, m: &Moe, x: &[f32], n: usize) -> Routed {
    let logits = e.linear(x, n, c.hidden, &m.router, c.experts);
    let mut r = Routed {
        idx: Vec::with_capacity(n * c.top_k),
        weight: Vec::with_capacity(n * c.top_k),
    };
    for row in logits.chunks(c.experts) {
        let (i, w) = route_row(c, &m.bias, row);
        r.idx.extend(i);
        r.weight.extend(w);
    }
    r
}

/// Reference: each row through each of its experts, one at a time (rows of width `h`).
fn experts_ref(c: &DsConfig, m: &Moe, x: &[f32], n: usize, h: usize, r: &Routed) -> Vec<f32> {
    let k = c.top_k;
    let mut out = vec![0f32; n * h];
    for t in 0..n {
        let row = &x[t * h..(t + 1) * h];
        let mut chosen: Vec<(u32, f32)> = (0..k)
            .map(|j| (r.idx[t * k + j], r.weight[t * k + j]))
            .collect();
        chosen.sort_by_key(|p| p.0);
        for (ex, w) in chosen {
            let y = mlp(OpImpl::Reference, &m.experts[ex as usize], row, 1, h);
            for (o, v) in out[t * h..(t + 1) * h].iter_mut().zip(&y) {
                *o += v * w;
            }
        }
    }
    out
}

/// Fast: rows grouped per expert, experts run in parallel, summed in expert order.
fn experts_fast(c: &DsConfig, m: &Moe, x: &[f32], n: usize, h: usize, r: &Routed) -> Vec<f32> {
    let k = c.top_k;
    let mut rows: Vec<Vec<(usize, f32)>> = vec![Vec::new(); c.experts];
    for t in 0..n {
        for j in 0..k {
            rows[r.idx[t * k + j] as usize].push((t, r.weight[t * k + j]));
        }
    }
    let outs: Vec<Vec<f32>> = rows
        .par_iter()
        .enumerate()
        .map(|(ex, rs)| {
            if rs.is_empty() {
                return Vec::new();
            }
            let xs: Vec<f32> = rs
                .iter()
                .flat_map(|&(t, _)| x[t * h..(t + 1) * h].to_vec())
                .collect();
            mlp(OpImpl::Fast, &m.experts[ex], &xs, rs.len(), h)
        })
        .collect();
    let mut out = vec![0f32; n * h];
    for (rs, y) in rows.iter().zip(&outs) {
        for (i, &(t, w)) in rs.iter().enumerate() {
            for (o, v) in out[t * h..(t + 1) * h]
                .iter_mut()
                .zip(&y[i * h..(i + 1) * h])
            {
                *o += v * w;
            }
        }
    }
    out
}

/// The routed experts' weighted sum on `n` rows `x` of width `h` (the hidden size, or a
/// LatentMoE's latent) as `r` chose them, `[n, h]`.
pub(crate) fn routed(
    e: OpImpl,
    c: &DsConfig,
    m: &Moe,
    x: &[f32],
    n: usize,
    h: usize,
    r: &Routed,
) -> Vec<f32> {
    match e {
        OpImpl::Reference => experts_ref(c, m, x, n, h, r),
        OpImpl::Fast => experts_fast(c, m, x, n, h, r),
    }
}

/// The MoE block on `n` normed rows: output `[n, H]` and the router's choice.
pub fn forward(e: OpImpl, c: &DsConfig, m: &Moe, x: &[f32], n: usize) -> (Vec<f32>, Routed) {
    let r = route(e, c, m, x, n);
    let mut out = routed(e, c, m, x, n, c.hidden, &r);
    if let Some(s) = &m.shared {
        let y = mlp(e, s, x, n, c.hidden);
        out.iter_mut().zip(&y).for_each(|(o, v)| *o += v);
    }
    (out, r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::rope::Rope;

    fn cfg(experts: usize, n_group: usize, topk_group: usize, top_k: usize) -> DsConfig {
        DsConfig {
            hidden: 4,
            vocab: 8,
            layers: 1,
            heads: 1,
            q_lora: None,
            kv_lora: 2,
            nope: 2,
            rope_dim: 2,
            v_dim: 2,
            inter: 4,
            moe_inter: 4,
            experts,
            shared: 0,
            top_k,
            n_group,
            topk_group,
            norm_topk: true,
            routed_scale: 2.0,
            first_dense: 0,
            eps: 1e-6,
            latent_eps: 1e-6,
            nope_only: false,
            tie: false,
            interleave: true,
            rope: Rope::plain(2, 1e4),
            scale: 1.0,
            eos: vec![],
            max_pos: 4096,
        }
    }

    fn logit(p: f32) -> f32 {
        (p / (1.0 - p)).ln()
    }

    #[test]
    fn grouped_topk_uses_the_bias_for_the_choice_only() {
        // Scores by group: g0 {0.9, 0.1}, g1 {0.6, 0.55}, g2 {0.2, 0.2}, g3 {0.3, 0.0}.
        let s = [0.9, 0.1, 0.6, 0.55, 0.2, 0.2, 0.3, 0.01];
        let logits: Vec<f32> = s.iter().map(|&p| logit(p)).collect();
        let c = cfg(8, 4, 2, 2);
        // Group sums: 1.0, 1.15, 0.4, 0.31 → groups 1 and 0; best experts 0 (0.9), 2 (0.6).
        let (idx, w) = route_row(&c, &[0.0; 8], &logits);
        assert_eq!(idx, vec![0, 2]);
        assert!((w[0] - 2.0 * 0.9 / 1.5).abs() < 1e-5 && (w[1] - 2.0 * 0.6 / 1.5).abs() < 1e-5);
        // A bias on expert 6 lifts group 3 (0.3 + 0.8 + 0.01 = 1.11 > 1.0) and picks expert 6,
        // but its weight is its unbiased score.
        let mut bias = [0.0; 8];
        bias[6] = 0.8;
        let (idx, w) = route_row(&c, &bias, &logits);
        assert_eq!(idx, vec![6, 2], "group 1 (1.15) and group 3 (1.11) win");
        assert!((w[0] - 2.0 * 0.3 / 0.9).abs() < 1e-5, "{w:?}");
        // Without normalisation the weights are the scores times the scale.
        let c2 = DsConfig {
            norm_topk: false,
            ..cfg(8, 1, 1, 3)
        };
        let (idx, w) = route_row(&c2, &[0.0; 8], &logits);
        assert_eq!(idx, vec![0, 2, 3]);
        assert!((w[2] - 2.0 * 0.55).abs() < 1e-5);
    }
}
