//! Which (format, scheme) of the registry a checkpoint's `quantization_config` (and ModelOpt's
//! `hf_quant_config.json`) describes, read from the config alone: the global (or first group's)
//! weight and input specs, as Quark 0.13, compressed-tensors 0.20.0 and ModelOpt 0.47.0 write
//! them. Per-layer overrides are not looked at.

use serde_json::Value;

use crate::quant::registry::{Format, Scheme};

/// What the config says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identified {
    /// A scheme of the registry in this format.
    Scheme { format: Format, scheme: Scheme },
    /// A config kquant reads, describing no scheme of its registry (`what` says what it is).
    Other {
        format: Option<Format>,
        what: String,
    },
}

fn s<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v.get(k).and_then(Value::as_str)
}

fn u(v: &Value, k: &str) -> Option<u64> {
    v.get(k).and_then(Value::as_u64)
}

/// `int4-gN` / `uint4-gN` for the registry's group sizes.
fn grouped(prefix: &str, group: Option<u64>) -> Option<Scheme> {
    Some(match (prefix, group?) {
        ("int4", 32) => Scheme::Int4G32,
        ("int4", 64) => Scheme::Int4G64,
        ("int4", 128) => Scheme::Int4G128,
        ("uint4", 32) => Scheme::Uint4G32,
        ("uint4", 64) => Scheme::Uint4G64,
        ("uint4", 128) => Scheme::Uint4G128,
        _ => return None,
    })
}

fn quark(q: &Value) -> Result<Scheme, String> {
    let g = q.get("global_quant_config").unwrap_or(&Value::Null);
    let w = g.get("weight").unwrap_or(&Value::Null);
    let input = g.get("input_tensors").filter(|v| !v.is_null());
    let desc = |w: &Value| {
        format!(
            "{} {}{}",
            s(w, "dtype").unwrap_or("?"),
            s(w, "qscheme").unwrap_or("?"),
            u(w, "group_size")
                .map(|g| format!(" group {g}"))
                .unwrap_or_default()
        )
    };
    if let Some(stages) = w.as_array() {
        let d: Vec<String> = stages.iter().map(desc).collect();
        return match d.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["fp8_e4m3 per_tensor", "int4 per_channel"] => Ok(Scheme::W4a8Fp8),
            _ => Err(format!("weight stages [{}]", d.join(", "))),
        };
    }
    let input_dtype = input.and_then(|i| s(i, "dtype"));
    match (s(w, "dtype"), s(w, "qscheme"), input_dtype) {
        (Some("int4"), Some("per_channel"), None) => Ok(Scheme::Int4Pc),
        (Some(d @ ("int4" | "uint4")), Some("per_group"), None) => {
            grouped(d, u(w, "group_size")).ok_or_else(|| desc(w))
        }
        (Some("fp8_e4m3"), Some("per_channel"), Some("fp8_e4m3")) => Ok(Scheme::Fp8Pc),
        _ => Err(format!(
            "weight {}{}",
            desc(w),
            input_dtype
                .map(|d| format!(", input {d}"))
                .unwrap_or_default()
        )),
    }
}

fn compressed_tensors(q: &Value) -> Result<Scheme, String> {
    let groups: Vec<&Value> = q
        .get("config_groups")
        .and_then(Value::as_object)
        .map(|m| m.values().collect())
        .unwrap_or_default();
    let Some(g) = groups.first() else {
        return Err("no config_groups".into());
    };
    let fmt = s(g, "format").or_else(|| s(q, "format")).unwrap_or("?");
    let w = g.get("weights").unwrap_or(&Value::Null);
    let input = g.get("input_activations").filter(|v| !v.is_null());
    let bits = u(w, "num_bits");
    let ty = s(w, "type").unwrap_or("int");
    let symmetric = w.get("symmetric").and_then(Value::as_bool).unwrap_or(true);
    let strategy = s(w, "strategy").unwrap_or("?");
    let group = u(w, "group_size");
    let input_of = |i: &Value| (s(i, "type").unwrap_or("int").to_string(), u(i, "num_bits"));
    let found = match (fmt, ty, bits, strategy, input.map(input_of)) {
        ("pack-quantized", "int", Some(4), "channel", None) if symmetric => Some(Scheme::Int4Pc),
        ("pack-quantized", "int", Some(4), "group", None) if symmetric => grouped("int4", group),
        ("float-quantized", "float", Some(8), "channel", Some((ref t, Some(8))))
            if t == "float" =>
        {
            Some(Scheme::Fp8Pc)
        }
        ("int-quantized", "int", Some(4), "group", Some((ref t, Some(8))))
            if t == "int" && symmetric && group == Some(128) =>
        {
            Some(Scheme::W4a8Int8)
        }
        ("nvfp4-pack-quantized", _, _, _, None) => Some(Scheme::Nvfp4A16),
        ("nvfp4-pack-quantized", _, _, _, Some(_)) => Some(Scheme::Nvfp4),
        _ => None,
    };
    found.ok_or_else(|| {
        format!(
            "{fmt}: {ty}{} {strategy}{}{}{}",
            bits.map(|b| b.to_string()).unwrap_or_default(),
            group.map(|g| format!(" group {g}")).unwrap_or_default(),
            if symmetric { "" } else { " asymmetric" },
            input
                .map(|i| format!(
                    ", activations {}{}",
                    s(i, "type").unwrap_or("int"),
                    u(i, "num_bits").unwrap_or(0)
                ))
                .unwrap_or_default()
        )
    })
}

fn modelopt(q: Option<&Value>, hf: Option<&Value>) -> Result<Scheme, String> {
    let hq = hf.and_then(|h| h.get("quantization"));
    let algo = q
        .and_then(|q| s(q, "quant_algo"))
        .or_else(|| hq.and_then(|h| s(h, "quant_algo")))
        .unwrap_or("?");
    let group = hq
        .and_then(|h| u(h, "group_size"))
        .or_else(|| q.and_then(|q| u(q, "group_size")));
    match (algo, group) {
        // ModelOpt's AWQ block is 128 unless the config says otherwise.
        ("W4A16_AWQ", None | Some(128)) => Ok(Scheme::Int4G128),
        ("FP8_PER_CHANNEL_PER_TOKEN", _) => Ok(Scheme::Fp8Pc),
        ("W4A16_NVFP4", _) => Ok(Scheme::Nvfp4A16),
        ("NVFP4", _) => Ok(Scheme::Nvfp4),
        ("FP8", _) => Ok(Scheme::Fp8Pt),
        (a, Some(g)) => Err(format!("quant_algo {a} group {g}")),
        (a, None) => Err(format!("quant_algo {a}")),
    }
}

/// Identify the scheme; `None` when the checkpoint has no quantization config at all.
/// `config` is `quantization_config`; `hf_quant_config` is ModelOpt's side file. The format is
/// [`Format::of`]'s.
pub fn identify(config: Option<&Value>, hf_quant_config: Option<&Value>) -> Option<Identified> {
    let format = match Format::of(config, hf_quant_config.is_some())? {
        Ok(f) => f,
        Err(m) => {
            return Some(Identified::Other {
                format: None,
                what: format!("quant_method `{m}`"),
            })
        }
    };
    let r = match format {
        Format::Quark => quark(config?),
        Format::CompressedTensors => compressed_tensors(config?),
        Format::Modelopt => modelopt(config, hf_quant_config),
    };
    Some(match r {
        Ok(scheme) => Identified::Scheme { format, scheme },
        Err(what) => Identified::Other {
            format: Some(format),
            what: format!("{} {what}", format.name()),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::registry::{build, QuarkFlags, SCHEMES};

    /// Every carrier kquant writes is identified as itself from the config it writes.
    #[test]
    fn every_written_config_is_identified() {
        let amax = || {
            Some(crate::quant::input_amax::InputAmax {
                path: "a.json".into(),
                amax: Default::default(),
                fixed: None,
            })
        };
        let mut n = 0;
        for s in SCHEMES {
            for c in s.carriers.iter().filter(|c| c.implemented()) {
                let input = if s.static_input_scale { amax() } else { None };
                let t = build(s.id, c.format, QuarkFlags::default(), input).unwrap();
                let exclude = vec!["lm_head".to_string()];
                let files = t.config(&c.format.written_list(&exclude));
                let cfg = files.quantization_config;
                let side: Option<Value> = files
                    .side_files
                    .into_iter()
                    .find(|(n, _)| n == "hf_quant_config.json")
                    .map(|(_, b)| serde_json::from_slice(&b).unwrap());
                assert_eq!(
                    identify(Some(&cfg), side.as_ref()),
                    Some(Identified::Scheme {
                        format: c.format,
                        scheme: s.id
                    }),
                    "{} {}: {cfg}",
                    s.id,
                    c.format.name()
                );
                // ModelOpt's legacy form: the side file alone.
                if let Some(side) = &side {
                    assert_eq!(
                        identify(None, Some(side)),
                        Some(Identified::Scheme {
                            format: c.format,
                            scheme: s.id
                        })
                    );
                }
                n += 1;
            }
        }
        assert!(n >= 20, "{n}");
    }

    #[test]
    fn others_are_described() {
        let q = serde_json::json!({"quant_method": "compressed-tensors", "config_groups": {"g": {
            "format": "pack-quantized", "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 256, "symmetric": true}}}});
        match identify(Some(&q), None) {
            Some(Identified::Other { format, what }) => {
                assert_eq!(format, Some(Format::CompressedTensors));
                assert!(what.contains("group 256"), "{what}");
            }
            x => panic!("{x:?}"),
        }
        let q = serde_json::json!({"quant_method": "gptq"});
        assert!(matches!(
            identify(Some(&q), None),
            Some(Identified::Other { format: None, .. })
        ));
        assert_eq!(identify(None, None), None);
    }
}
