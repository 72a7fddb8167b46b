//! Rotary position embeddings: the frequency tables (plain and DeepSeek YaRN, as transformers'
//! `_compute_yarn_parameters` with `truncate=True` and TorchSpec's `LlamaYarnRotaryEmbedding`
//! compute them) and the two ways of applying them (Llama `rotate_half` over the whole head;
//! DeepSeek interleaved pairs on the rope dims). Mirrors `fixtures/gen/verify/common.py`.

use serde_json::Value;

/// A frequency table with the cos/sin multiplier YaRN applies (1 without YaRN).
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    /// `dim / 2` inverse frequencies.
    pub inv_freq: Vec<f32>,
    /// Multiplier on cos and sin (YaRN "attention factor").
    pub attn_factor: f32,
}

/// YaRN's `get_mscale(scale, mscale)`: `0.1 · mscale · ln(scale) + 1` for scale > 1.
pub fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// `1 / theta^(2i/dim)` in f32 as torch computes it (`arange(0, dim, 2) / dim` in f32, then pow).
pub fn plain_inv_freq(dim: usize, theta: f64) -> Vec<f32> {
    (0..dim / 2)
        .map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / dim as f32))
        .collect()
}

impl Rope {
    /// Plain RoPE over `dim` dims.
    pub fn plain(dim: usize, theta: f64) -> Rope {
        Rope {
            inv_freq: plain_inv_freq(dim, theta),
            attn_factor: 1.0,
        }
    }

    /// From a config's `rope_scaling` / `rope_parameters` object (`None` or a type other than
    /// `yarn` gives plain RoPE). Returns the table and the softmax-scale multiplier DeepSeek
    /// attention applies, `mscale(factor, mscale_all_dim)²` (1 without YaRN).
    pub fn from_config(dim: usize, theta: f64, scaling: Option<&Value>) -> (Rope, f32) {
        let Some(rs) = scaling.filter(|r| {
            r.get("rope_type")
                .or_else(|| r.get("type"))
                .and_then(Value::as_str)
                == Some("yarn")
        }) else {
            return (Rope::plain(dim, theta), 1.0);
        };
        let f = |k: &str, d: f64| rs.get(k).and_then(Value::as_f64).unwrap_or(d);
        let factor = f("factor", 1.0);
        let orig = f("original_max_position_embeddings", 4096.0);
        // `x or default` in the Python: 0 and null both fall back.
        let nz = |k: &str, d: f64| Some(f(k, d)).filter(|v| *v != 0.0).unwrap_or(d);
        let (beta_fast, beta_slow) = (nz("beta_fast", 32.0), nz("beta_slow", 1.0));
        let corr_dim = |rot: f64| {
            (dim as f64 * (orig / (rot * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * theta.ln())
        };
        let low = corr_dim(beta_fast).floor().max(0.0);
        let mut high = corr_dim(beta_slow).ceil().min(dim as f64 - 1.0);
        if low == high {
            high += 0.001;
        }
        let inv_freq = (0..dim / 2)
            .map(|i| {
                let ramp = ((i as f32 - low as f32) / (high as f32 - low as f32)).clamp(0.0, 1.0);
                let extra_mask = 1.0 - ramp;
                let pos_freq = (theta as f32).powf((2 * i) as f32 / dim as f32);
                let inv_extra = 1.0 / pos_freq;
                let inv_inter = 1.0 / (factor as f32 * pos_freq);
                inv_inter * (1.0 - extra_mask) + inv_extra * extra_mask
            })
            .collect();
        let mscale = f("mscale", 1.0);
        let all_dim = f("mscale_all_dim", 0.0);
        let attn_factor = if all_dim != 0.0 {
            yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dim)
        } else {
            yarn_mscale(factor, 1.0)
        };
        let softmax_mult = yarn_mscale(factor, all_dim).powi(2);
        (
            Rope {
                inv_freq,
                attn_factor: attn_factor as f32,
            },
            softmax_mult as f32,
        )
    }

    /// `(cos, sin)` per frequency at `pos`, times the attention factor, computed as torch does
    /// (`pos` in f32 times `inv_freq`, then cos/sin).
    /// `(cos, sin)` of every frequency at positions `0..positions`, `[positions, dim/2, 2]`, the
    /// attention factor applied: exactly the values [`Rope::apply_neox`] rotates by (what a
    /// device step uploads).
    pub fn table(&self, positions: usize) -> Vec<f32> {
        (0..positions)
            .flat_map(|p| self.angles(p).flat_map(|(c, s)| [c, s]))
            .collect()
    }

    fn angles(&self, pos: usize) -> impl Iterator<Item = (f32, f32)> + '_ {
        self.inv_freq.iter().map(move |&f| {
            let a = pos as f32 * f;
            (a.cos() * self.attn_factor, a.sin() * self.attn_factor)
        })
    }

    /// Llama / Qwen3 (`rotate_half`) in place on every `dim`-row of `x` (dim = 2 · inv_freq).
    pub fn apply_neox(&self, x: &mut [f32], pos: usize) {
        let half = self.inv_freq.len();
        for head in x.chunks_mut(2 * half) {
            for (i, (c, s)) in self.angles(pos).enumerate() {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * c - b * s;
                head[i + half] = b * c + a * s;
            }
        }
    }

    /// DeepSeek interleaved: pairs `(x0,x1), (x2,x3), …` each rotated by one frequency, layout
    /// kept, in place on every `dim`-row of `x`.
    pub fn apply_interleaved(&self, x: &mut [f32], pos: usize) {
        let half = self.inv_freq.len();
        for head in x.chunks_mut(2 * half) {
            for (i, (c, s)) in self.angles(pos).enumerate() {
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * c - b * s;
                head[2 * i + 1] = b * c + a * s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn plain_matches_the_llama_formula_and_position_zero_is_identity() {
        let r = Rope::plain(8, 10000.0);
        assert_eq!(r.inv_freq[0], 1.0);
        assert!((r.inv_freq[1] - 0.1).abs() < 1e-7);
        let mut v = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let orig = v.clone();
        r.apply_neox(&mut v, 0);
        assert_eq!(v, orig);
        r.apply_interleaved(&mut v, 0);
        assert_eq!(v, orig);
        // neox pairs (i, i + half); interleaved pairs (2i, 2i+1): rotation by pos·1 on pair 0.
        let mut n = orig.clone();
        r.apply_neox(&mut n, 1);
        let (c, s) = (1f32.cos(), 1f32.sin());
        assert!((n[0] - (1.0 * c - 5.0 * s)).abs() < 1e-6);
        let mut il = orig;
        r.apply_interleaved(&mut il, 1);
        assert!((il[1] - (2.0 * c + 1.0 * s)).abs() < 1e-6);
    }

    /// Values computed with `yarn_inv_freq(16, 50000, ROPE_YARN)` in
    /// fixtures/gen/verify/common.py (the tiny Kimi target's rope dims).
    #[test]
    fn yarn_matches_the_python_reference() {
        let rs = json!({"rope_type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
            "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0});
        let (r, mult) = Rope::from_config(16, 50000.0, Some(&rs));
        assert_eq!(r.inv_freq.len(), 8);
        // mscale == mscale_all_dim → attention factor 1; softmax multiplier mscale(64,1)².
        assert!((r.attn_factor - 1.0).abs() < 1e-7);
        let m = 0.1 * 64f64.ln() + 1.0;
        assert!((mult as f64 - m * m).abs() < 1e-6);
        let want = [
            1.0,
            0.2586001455783844,
            0.06687403470277786,
            0.01729363389313221,
            0.004472136031836271,
            1.8070233636535704e-05,
            4.672965133067919e-06,
            1.2084293530278956e-06,
        ];
        for (g, w) in r.inv_freq.iter().zip(want) {
            assert!((*g as f64 - w).abs() <= 1e-6 * w, "{g} vs {w}");
        }
        let (p, one) = Rope::from_config(16, 50000.0, None);
        assert_eq!((p, one), (Rope::plain(16, 50000.0), 1.0));
    }
}
