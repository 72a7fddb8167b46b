//! The Kimi-K3 text hyper-parameters, read from config.json's `text_config` as the checkpoint
//! writes them (vLLM 0.33.0 `vllm/transformers_utils/configs/kimi_linear.py`, which K3 reuses):
//! everything Kimi-Linear has ([`KlConfig`], its layer lists 1-based, the KDA variants K3 adds
//! admitted), plus the attention-residual block (`attn_res_block_size`), the activation
//! (`hidden_act: situ` with `activation_situ_beta` / `activation_situ_linear_beta`), the
//! LatentMoE (`routed_expert_hidden_size`, `latent_moe_use_norm`) and the MLA output gate
//! (`mla_use_output_gate`).

use serde_json::{Map, Value};

use crate::checkpoint::Config;
use crate::error::{Error, Result};
use crate::runtime::deepseek::weights::Act;
use crate::runtime::deepseek::DsConfig;
use crate::runtime::kimi_linear::config::{self as kl, KlConfig};

/// Everything the K3 forward needs besides the weights.
#[derive(Debug, Clone)]
pub struct K3Config {
    /// The MLA, KDA and MoE sizes and the layer pattern, as the Kimi-Linear blocks read them.
    pub kl: KlConfig,
    /// Layers per attention-residual block (`attn_res_block_size`).
    pub block: usize,
    /// The MLP activation of the dense layers, the shared and the routed experts.
    pub act: Act,
    /// The routed experts' latent width (`routed_expert_hidden_size`).
    pub latent: usize,
    /// Whether the latent combination is RMS-normed before the up projection
    /// (`latent_moe_use_norm`).
    pub latent_norm: bool,
    /// `mla_use_output_gate`.
    pub mla_gate: bool,
}

impl K3Config {
    /// Read and check; errors name the key and the file.
    pub fn read(cfg: &Config) -> Result<K3Config> {
        read(cfg.text(), cfg).map_err(|msg| Error::Config {
            path: cfg.path.clone(),
            msg,
        })
    }

    pub fn ds(&self) -> &DsConfig {
        &self.kl.ds
    }

    /// The number of block sums the output mixture reads (`cdiv(layers, block)`), the
    /// embedding's included.
    pub fn blocks(&self) -> usize {
        self.kl.ds.layers.div_ceil(self.block)
    }
}

fn read(t: &Map<String, Value>, cfg: &Config) -> std::result::Result<K3Config, String> {
    let get = |k: &str| t.get(k).filter(|v| !v.is_null());
    let kl = kl::read(t, cfg, true)?;
    let block = get("attn_res_block_size")
        .map(|v| {
            v.as_u64()
                .filter(|b| (1..=kl::MAX_LAYERS as u64).contains(b))
                .ok_or_else(|| format!("`attn_res_block_size` is {v}: a layer count ≥ 1"))
        })
        .transpose()?
        .ok_or(
            "`attn_res_block_size` is missing: this runtime runs Kimi-K3's attention residuals",
        )? as usize;
    let beta = |k: &str| -> std::result::Result<Option<f32>, String> {
        match get(k) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x > 0.0 && x.is_finite() => Ok(Some(x as f32)),
                _ => Err(format!("`{k}` is {v}: a positive number")),
            },
        }
    };
    let act = match get("hidden_act").and_then(Value::as_str).unwrap_or("silu") {
        "silu" => Act::Silu,
        // vLLM `KimiMLP`: `SituAndMul(beta=activation_situ_beta or 1.0, linear_beta=…)`.
        "situ" => Act::Situ {
            beta: beta("activation_situ_beta")?.unwrap_or(1.0),
            linear_beta: beta("activation_situ_linear_beta")?,
        },
        a => return Err(format!("`hidden_act` is `{a}`: silu or situ")),
    };
    let latent = match get("routed_expert_hidden_size") {
        None => {
            return Err(
                "`routed_expert_hidden_size` is missing: this runtime runs Kimi-K3's LatentMoE"
                    .into(),
            )
        }
        Some(v) => v
            .as_u64()
            .filter(|x| (1..=crate::checkpoint::detect::MAX_DIM).contains(x))
            .ok_or_else(|| format!("`routed_expert_hidden_size` is {v}: a width ≥ 1"))?
            as usize,
    };
    // A value of the wrong type is refused, not read as the default (the Kimi-Linear reader's
    // numbers and flags fall back to theirs): each changes what the forward computes.
    let flag = |k: &str| match get(k) {
        None => Ok(false),
        Some(v) => v
            .as_bool()
            .ok_or_else(|| format!("`{k}` is {v}: true or false")),
    };
    for (k, min, what) in [
        ("rms_norm_eps", 0.0, "a number ≥ 0"),
        ("routed_scaling_factor", f64::MIN, "a number"),
    ] {
        if let Some(v) = get(k).filter(|v| v.as_f64().is_none_or(|x| x < min)) {
            return Err(format!("`{k}` is {v}: {what}"));
        }
    }
    Ok(K3Config {
        kl,
        block,
        act,
        latent,
        latent_norm: flag("latent_moe_use_norm")?,
        mla_gate: flag("mla_use_output_gate")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::kimi_linear::Mixer;

    fn read_in(dir: &str) -> K3Config {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        K3Config::read(&Config::read(&p.join("config.json")).unwrap()).unwrap()
    }

    #[test]
    fn reads_the_tiny_k3_config() {
        let c = read_in("fixtures/kimi-k3-tiny/target-random");
        use Mixer::{Kda, Mla};
        assert_eq!(c.kl.mixers, vec![Kda, Kda, Mla, Kda, Mla, Mla]);
        assert_eq!((c.block, c.blocks(), c.latent), (4, 2, 32));
        assert!(c.latent_norm && c.mla_gate && c.kl.kda.full_rank_gate);
        assert_eq!(c.kl.kda.lower_bound, Some(-5.0));
        assert_eq!(
            c.act,
            Act::Situ {
                beta: 1.0,
                linear_beta: Some(1.5)
            }
        );
        assert_eq!((c.ds().q_lora, c.ds().latent_eps), (Some(32), 1e-5));
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        let path = std::path::Path::new("config.json");
        let with = |k: &str, v: Value| {
            let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures/kimi-k3-tiny/target-random/config.json");
            let mut j: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
            j["text_config"][k] = v;
            let c = Config::from_value(path, j).unwrap();
            read(c.text(), &c).unwrap_err()
        };
        assert!(with("attn_res_block_size", Value::Null).contains("attn_res_block_size"));
        assert!(with("attn_res_block_size", 0.into()).contains("≥ 1"));
        assert!(with("hidden_act", "gelu".into()).contains("silu or situ"));
        assert!(with("activation_situ_beta", (-1.0).into()).contains("positive"));
        assert!(with("routed_expert_hidden_size", 0.into()).contains("width"));
        assert!(with("routed_expert_hidden_size", Value::Null).contains("LatentMoE"));
        // Wrong types are refused, not read as the defaults (defects round 5).
        assert!(with("latent_moe_use_norm", "yes".into()).contains("true or false"));
        assert!(with("mla_use_output_gate", 1.into()).contains("true or false"));
        assert!(with("rms_norm_eps", (-1.0).into()).contains("≥ 0"));
        assert!(with("rms_norm_eps", "1e-5".into()).contains("≥ 0"));
        assert!(with("routed_scaling_factor", "2.5".into()).contains("a number"));
    }
}
