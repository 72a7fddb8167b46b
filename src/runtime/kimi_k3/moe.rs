//! Kimi-K3's LatentMoE (vLLM 0.33.0 `vllm/models/kimi_k3/nvidia/model.py` `KimiMoE.forward`
//! and `latent_moe_runner.py`): the router (DeepSeek's sigmoid / `e_score_correction_bias` /
//! renormalised top-k × `routed_scaling_factor`, `runtime::deepseek::moe`) scores the full
//! hidden row; the routed experts run in the latent `routed_expert_down_proj x`; their weighted
//! sum is RMS-normed (`routed_expert_norm`, `latent_moe_use_norm`) and projected back by
//! `routed_expert_up_proj`; the shared experts run on the full row and are added.

use super::config::K3Config;
use super::weights::LatentMoe;
use crate::ops::rms_norm;
use crate::runtime::deepseek::moe::{self, Routed};
use crate::runtime::deepseek::OpImpl;

/// The block on `n` normed rows `[n, H]`: output `[n, H]` and the router's choice.
pub fn forward(e: OpImpl, c: &K3Config, m: &LatentMoe, x: &[f32], n: usize) -> (Vec<f32>, Routed) {
    let ds = c.ds();
    let h = ds.hidden;
    let r = moe::route(e, ds, &m.moe, x, n);
    let xl = e.linear(x, n, h, &m.down, c.latent);
    let y = moe::routed(e, ds, &m.moe, &xl, n, c.latent, &r);
    let y = match &m.norm {
        Some(w) => rms_norm(&y, c.latent, w, ds.eps),
        None => y,
    };
    let mut out = e.linear(&y, n, c.latent, &m.up, h);
    if let Some(s) = &m.moe.shared {
        let y = moe::mlp(e, s, x, n, h);
        out.iter_mut().zip(&y).for_each(|(o, v)| *o += v);
    }
    (out, r)
}
