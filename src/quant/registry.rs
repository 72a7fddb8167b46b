//! Every scheme kquant knows, the formats that can carry it, and the one function that builds
//! the [`Target`] for a (scheme, format) pair. `kquant schemes` and `--scheme` validation come
//! from this table; where each result loads is `crate::engines::quantized`. Adding a scheme or
//! format today touches more than this file: its target under `quant/`, a row here and an arm in
//! [`build`], its engine claims, the `Stored` variant that reads it back (`quant/decode.rs`), the
//! tensor suffixes of `checkpoint/quant_state.rs`, the config keys `convert` renames
//! (`convert/mod.rs`) and, for INT4, the kernel repack (`gpu/layout.rs`). Making that one place is
//! issue #14's first item.

use serde::Serialize;

use super::input_amax::InputAmax;
use super::pack::Order;
use super::target::Target;
use super::{
    compressed_tensors, ct_nvfp4, ct_quantized, modelopt, modelopt_nvfp4, quark, quark_fp8,
    quark_group, quark_uint4,
};
use crate::error::{Error, Result};

/// Output file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// AMD Quark `quantization_config` (quant_method "quark").
    Quark,
    /// compressed-tensors (llm-compressor; quant_method "compressed-tensors"), as 0.20.0 writes it.
    #[value(name = "compressed-tensors")]
    CompressedTensors,
    /// NVIDIA ModelOpt / TensorRT-LLM (`hf_quant_config.json` + quant_method "modelopt").
    Modelopt,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Quark => "quark",
            Format::CompressedTensors => "compressed-tensors",
            Format::Modelopt => "modelopt",
        }
    }
}

/// One format that can carry a scheme.
#[derive(Debug, Clone, Serialize)]
pub struct Carrier {
    pub format: Format,
    /// Implemented in kquant today.
    pub implemented: bool,
    /// The reference tool's name for it.
    pub reference: &'static str,
}

/// One scheme.
#[derive(Debug, Clone, Serialize)]
pub struct SchemeInfo {
    pub id: &'static str,
    /// Storage bits per weight including scales, for a 7168-wide row.
    pub bits_per_weight: f32,
    pub granularity: &'static str,
    pub activations: &'static str,
    pub about: &'static str,
    pub carriers: &'static [Carrier],
}

const fn c(format: Format, implemented: bool, reference: &'static str) -> Carrier {
    Carrier {
        format,
        implemented,
        reference,
    }
}

/// The registry.
pub static SCHEMES: &[SchemeInfo] = &[
    SchemeInfo {
        id: "int4-pc",
        bits_per_weight: 4.0 + 16.0 / 7168.0,
        granularity: "per output channel",
        activations: "bf16/f16 (weight-only)",
        about: "INT4 symmetric, one scale per output row (the seed recipe)",
        carriers: &[
            c(Format::Quark, true, "Quark int4_wo_per_channel"),
            c(
                Format::CompressedTensors,
                true,
                "W4A16 strategy channel",
            ),
            // ModelOpt exports 4-bit integer weights per group only (W4A16_AWQ); TensorRT-LLM's
            // per-channel W4A16 has no ModelOpt writer. See docs/quantize.md.
            c(
                Format::Modelopt,
                false,
                "none: ModelOpt INT4 is per group",
            ),
        ],
    },
    SchemeInfo {
        id: "int4-g32",
        bits_per_weight: 4.0 + 16.0 / 32.0,
        granularity: "per group of 32 input columns",
        activations: "bf16/f16 (weight-only)",
        about: "INT4 symmetric, one scale per 32 inputs",
        carriers: &[
            c(
                Format::Quark,
                true,
                "Quark int4_wo_32",
            ),
            c(
                Format::CompressedTensors,
                true,
                "W4A16 group_size 32",
            ),
        ],
    },
    SchemeInfo {
        id: "int4-g64",
        bits_per_weight: 4.0 + 16.0 / 64.0,
        granularity: "per group of 64 input columns",
        activations: "bf16/f16 (weight-only)",
        about: "INT4 symmetric, one scale per 64 inputs",
        carriers: &[
            c(
                Format::Quark,
                true,
                "Quark int4_wo_64",
            ),
            c(
                Format::CompressedTensors,
                true,
                "W4A16 group_size 64",
            ),
        ],
    },
    SchemeInfo {
        id: "int4-g128",
        bits_per_weight: 4.0 + 16.0 / 128.0,
        granularity: "per group of 128 input columns",
        activations: "bf16/f16 (weight-only)",
        about: "INT4 symmetric, one scale per 128 inputs",
        carriers: &[
            c(
                Format::Quark,
                true,
                "Quark int4_wo_128",
            ),
            c(
                Format::CompressedTensors,
                true,
                "W4A16 preset",
            ),
            c(
                Format::Modelopt,
                true,
                "INT4_AWQ_CFG (W4A16_AWQ; no AWQ search)",
            ),
        ],
    },
    SchemeInfo {
        id: "fp8-pc",
        bits_per_weight: 8.0 + 16.0 / 7168.0,
        granularity: "per output channel",
        activations: "FP8 E4M3, dynamic per token",
        about: "FP8 E4M3 weights, one scale per output row; activations quantized per token at run time",
        carriers: &[
            c(
                Format::Quark,
                true,
                "Quark ptpc_fp8",
            ),
            c(
                Format::CompressedTensors,
                true,
                "FP8_DYNAMIC (float-quantized)",
            ),
            c(
                Format::Modelopt,
                true,
                "FP8_PER_CHANNEL_PER_TOKEN_CFG",
            ),
        ],
    },
    SchemeInfo {
        id: "w4a8-fp8",
        bits_per_weight: 4.0 + 32.0 / 7168.0,
        granularity: "per output channel (INT4) on a per-tensor FP8 stage",
        activations: "FP8 E4M3, dynamic per tensor",
        about: "two-stage weights: FP8 per tensor, then INT4 symmetric per output row (Quark's \"W4A8\")",
        carriers: &[c(Format::Quark, true, "Quark int4_fp8")],
    },
    SchemeInfo {
        id: "w4a8-int8",
        bits_per_weight: 8.0 + 16.0 / 128.0,
        granularity: "per group of 128 input columns",
        activations: "INT8, dynamic per token",
        about: "INT4 symmetric weights, one scale per 128 inputs, stored unpacked as I8 (8 bits on disk)",
        carriers: &[c(
            Format::CompressedTensors,
            true,
            "W4A8 preset (int-quantized)",
        )],
    },
    SchemeInfo {
        id: "uint4-g32",
        bits_per_weight: 4.0 + 20.0 / 32.0,
        granularity: "per group of 32 input columns",
        activations: "bf16/f16 (weight-only)",
        about: "UINT4 asymmetric (scale + 4-bit zero point) per 32 inputs",
        carriers: &[c(
            Format::Quark,
            true,
            "Quark uint4_wo_32",
        )],
    },
    SchemeInfo {
        id: "uint4-g64",
        bits_per_weight: 4.0 + 20.0 / 64.0,
        granularity: "per group of 64 input columns",
        activations: "bf16/f16 (weight-only)",
        about: "UINT4 asymmetric (scale + 4-bit zero point) per 64 inputs",
        carriers: &[c(
            Format::Quark,
            true,
            "Quark uint4_wo_64",
        )],
    },
    SchemeInfo {
        id: "uint4-g128",
        bits_per_weight: 4.0 + 20.0 / 128.0,
        granularity: "per group of 128 input columns",
        activations: "bf16/f16 (weight-only)",
        about: "UINT4 asymmetric (scale + 4-bit zero point) per 128 inputs",
        carriers: &[c(
            Format::Quark,
            true,
            "Quark uint4_wo_128",
        )],
    },
    SchemeInfo {
        id: "nvfp4-a16",
        bits_per_weight: 4.0 + 8.0 / 16.0,
        granularity: "per group of 16 input columns (FP8 E4M3) under one F32 scale per tensor",
        activations: "bf16/f16 (weight-only)",
        about: "NVFP4 weights (FP4 E2M1); the per-tensor scale is shared by fused q/k/v, gate/up (and MLA q_a/kv_a); NVIDIA GPUs only",
        carriers: &[
            c(
                Format::CompressedTensors,
                true,
                "NVFP4A16 preset (nvfp4-pack-quantized)",
            ),
            c(
                Format::Modelopt,
                true,
                "W4A16_NVFP4_CFG (W4A16_NVFP4)",
            ),
            // Quark's nvfp4 scheme (FP4Block16ScaleE4M3Scheme) is W4A4 only. See docs/quantize.md.
            c(
                Format::Quark,
                false,
                "none: Quark's nvfp4 is W4A4 only",
            ),
        ],
    },
    SchemeInfo {
        id: "nvfp4",
        bits_per_weight: 4.0 + 8.0 / 16.0,
        granularity: "per group of 16 input columns (FP8 E4M3) under one F32 scale per tensor",
        activations: "NVFP4, block scales at run time under a static per-tensor scale (--input-amax)",
        about: "NVFP4 weights and activations (W4A4); needs calibrated input amax (--input-amax); per-tensor scales shared by fused siblings; NVIDIA GPUs only",
        carriers: &[
            c(
                Format::CompressedTensors,
                true,
                "NVFP4 preset (nvfp4-pack-quantized)",
            ),
            c(
                Format::Modelopt,
                true,
                "NVFP4_DEFAULT_CFG (NVFP4)",
            ),
            c(
                Format::Quark,
                false,
                "Quark nvfp4 (FP4Block16ScaleE4M3Scheme)",
            ),
        ],
    },
];

/// Look a scheme up by id.
pub fn scheme(id: &str) -> Option<&'static SchemeInfo> {
    SCHEMES.iter().find(|s| s.id == id)
}

/// Quark-only flags, checked here so every format refuses the ones that do not apply.
#[derive(Debug, Clone, Copy, Default)]
pub struct QuarkFlags {
    pub layout: Option<quark::Layout>,
    pub version: Option<quark::Version>,
    pub sequential: bool,
}

impl QuarkFlags {
    fn any(&self) -> bool {
        self.layout.is_some() || self.version.is_some() || self.sequential
    }
    fn options(&self) -> quark::Options {
        quark::Options {
            layout: self.layout.unwrap_or(quark::Layout::Model),
            version: self.version.unwrap_or(quark::Version::V013),
            order: if self.sequential {
                Order::Sequential
            } else {
                Order::Reorder
            },
        }
    }
}

/// Quark options for a scheme kquant has only Quark 0.13's model-path reference for: refuses
/// `--quark-layout file2file`, `--quark-version 0.11.1` and (unless nibbles are packed)
/// `--quark-sequential`.
fn quark_013_model(scheme_id: &str, q: QuarkFlags, packs: bool) -> Result<quark::Options> {
    let o = q.options();
    let why = if o.layout == quark::Layout::File2file {
        Some("--quark-layout file2file: kquant has no reference output of Quark's file-to-file path for it; use --quark-layout model")
    } else if o.version != quark::Version::V013 {
        Some("--quark-version 0.11.1: the reference is Quark 0.13 (0.11.1 output is unknown)")
    } else if q.sequential && !packs {
        Some("--quark-sequential: its weights are not nibble-packed")
    } else {
        None
    };
    match why {
        Some(w) => Err(Error::Flags {
            msg: format!("--scheme {scheme_id} with {w}"),
            hint: format!(
                "Quark 0.13 model layout is what kquant writes for --scheme {scheme_id}: drop \
                 --quark-layout / --quark-version, or pick a scheme the seed preset covers \
                 (`kquant schemes`)"
            ),
        }),
        None => Ok(o),
    }
}

/// Build the output for `scheme` in `format`, or say why that pair cannot be written.
/// `input_amax` (`--input-amax`) is required by the W4A4 scheme `nvfp4` and refused by every
/// other.
pub fn build(
    scheme_id: &str,
    format: Format,
    q: QuarkFlags,
    input_amax: Option<InputAmax>,
) -> Result<Box<dyn Target>> {
    let info = scheme(scheme_id).ok_or_else(|| Error::Flags {
        msg: format!("unknown scheme `{scheme_id}`"),
        hint: format!(
            "--scheme is one of: {} (`kquant schemes` says what each is and where it loads)",
            SCHEMES.iter().map(|s| s.id).collect::<Vec<_>>().join(", ")
        ),
    })?;
    if format != Format::Quark && q.any() {
        return Err(Error::Flags {
            msg: format!(
                "--quark-layout, --quark-version and --quark-sequential apply to --format quark \
                 only, not --format {}",
                format.name()
            ),
            hint: "drop the --quark-* flags, or say --format quark".into(),
        });
    }
    let cannot = || {
        let can: Vec<&str> = info
            .carriers
            .iter()
            .filter(|c| c.implemented)
            .map(|c| c.format.name())
            .collect();
        Error::Flags {
            msg: format!(
                "--scheme {scheme_id} cannot be written as --format {} yet",
                format.name()
            ),
            hint: format!(
                "--scheme {scheme_id} is written as --format {}; or keep --format {} with one \
                 of: {}",
                can.join(" or --format "),
                format.name(),
                SCHEMES
                    .iter()
                    .filter(|s| s
                        .carriers
                        .iter()
                        .any(|c| c.format == format && c.implemented))
                    .map(|s| s.id)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    };
    if !info
        .carriers
        .iter()
        .any(|c| c.format == format && c.implemented)
    {
        return Err(cannot());
    }
    match (scheme_id, &input_amax) {
        ("nvfp4", None) => {
            return Err(Error::Flags {
                msg: "--scheme nvfp4 quantizes activations with a static per-tensor input scale, which needs each module's calibrated input amax; kquant does not invent one".into(),
                hint: "pass --input-amax FILE (module → amax JSON, see docs/quantize.md), or use --scheme nvfp4-a16 (weight-only NVFP4, no input scale)".into(),
            })
        }
        ("nvfp4", Some(_)) | (_, None) => {}
        (_, Some(f)) => {
            return Err(Error::Flags {
                msg: format!(
                    "--input-amax `{}`: --scheme {scheme_id} has no static input scale",
                    f.path.display()
                ),
                hint: "--input-amax applies to --scheme nvfp4 (W4A4) only; drop it".into(),
            })
        }
    }
    let group = match scheme_id {
        "int4-g32" => Some(32),
        "int4-g64" => Some(64),
        "int4-g128" => Some(128),
        _ => None,
    };
    let t: Option<Box<dyn Target>> = match (scheme_id, format) {
        ("int4-pc", Format::Quark) => Some(Box::new(quark::PerChannel(q.options()))),
        ("int4-g32" | "int4-g64" | "int4-g128", Format::Quark) => {
            if q.options().layout == quark::Layout::File2file {
                return Err(Error::Flags {
                    msg: format!(
                        "--scheme {scheme_id} with --quark-layout file2file: kquant has no \
                         reference output of Quark's file-to-file path for per-group INT4"
                    ),
                    hint: "use --quark-layout model (Quark 0.13's model layout), or --scheme \
                           int4-pc for the file-to-file layout"
                        .into(),
                });
            }
            Some(Box::new(quark_group::PerGroup {
                opts: q.options(),
                group: group.expect("group scheme"),
            }))
        }
        ("int4-pc" | "int4-g32" | "int4-g64" | "int4-g128", Format::CompressedTensors) => {
            Some(Box::new(compressed_tensors::PackQuantized { group }))
        }
        ("fp8-pc", Format::Quark) => Some(Box::new(quark_fp8::Ptpc(quark_013_model(
            scheme_id, q, false,
        )?))),
        ("w4a8-fp8", Format::Quark) => Some(Box::new(quark_fp8::Int4Fp8Target(quark_013_model(
            scheme_id, q, true,
        )?))),
        ("fp8-pc", Format::CompressedTensors) => Some(Box::new(ct_quantized::FloatQuantized)),
        ("uint4-g32" | "uint4-g64" | "uint4-g128", Format::Quark) => {
            Some(Box::new(quark_uint4::PerGroupAsym {
                opts: quark_013_model(scheme_id, q, true)?,
                group: scheme_id["uint4-g".len()..].parse().expect("uint4-gN"),
            }))
        }
        ("int4-g128", Format::Modelopt) => {
            Some(Box::new(modelopt::Modelopt(modelopt::Algo::W4a16Awq {
                group: modelopt::AWQ_GROUP,
            })))
        }
        ("fp8-pc", Format::Modelopt) => Some(Box::new(modelopt::Modelopt(
            modelopt::Algo::Fp8PerChannelPerToken,
        ))),
        ("w4a8-int8", Format::CompressedTensors) => Some(Box::new(ct_quantized::IntQuantizedW4A8)),
        ("nvfp4-a16" | "nvfp4", Format::CompressedTensors) => {
            Some(Box::new(ct_nvfp4::CtNvfp4::new(input_amax)))
        }
        ("nvfp4-a16" | "nvfp4", Format::Modelopt) => {
            Some(Box::new(modelopt_nvfp4::ModeloptNvfp4::new(input_amax)))
        }
        _ => None,
    };
    t.ok_or_else(cannot)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amax() -> Option<InputAmax> {
        Some(InputAmax {
            path: "a.json".into(),
            amax: Default::default(),
        })
    }

    /// The table and `build` agree: every carrier marked implemented builds, every other one
    /// is refused with a message naming the formats that do work.
    #[test]
    fn registry_is_honest() {
        for s in SCHEMES {
            for f in [Format::Quark, Format::CompressedTensors, Format::Modelopt] {
                let implemented = s.carriers.iter().any(|c| c.format == f && c.implemented);
                let input = if s.id == "nvfp4" { amax() } else { None };
                let built = build(s.id, f, QuarkFlags::default(), input);
                assert_eq!(built.is_ok(), implemented, "{} as {}", s.id, f.name());
                if let Err(e) = built {
                    let hint = e.hint().unwrap_or_default();
                    assert!(hint.contains("is written as --format"), "{e}: {hint}");
                }
            }
        }
        assert!(build("nope", Format::Quark, QuarkFlags::default(), None).is_err());
        let flags = QuarkFlags {
            sequential: true,
            ..Default::default()
        };
        assert!(build("int4-pc", Format::CompressedTensors, flags, None).is_err());
    }

    /// Every target's fused path (`encode_raw`, straight from the stored bytes) gives the bytes
    /// of its plain path (`encode` of the f32 conversion) — every scheme, format and Quark
    /// layout, BF16 and F16, per-channel and grouped shapes, odd widths, an all-zero row and
    /// rows of mixed scale — and names the same first non-finite weight.
    #[test]
    fn fused_paths_equal_plain_encode() {
        use crate::io::Dtype;
        let layouts = [
            QuarkFlags::default(),
            QuarkFlags {
                layout: Some(quark::Layout::File2file),
                ..Default::default()
            },
        ];
        let mut fused = 0;
        for s in SCHEMES.iter().filter(|s| s.id != "nvfp4") {
            for f in [Format::Quark, Format::CompressedTensors, Format::Modelopt] {
                for q in layouts.iter().filter(|q| f == Format::Quark || !q.any()) {
                    let Ok(t) = build(s.id, f, *q, None) else {
                        continue;
                    };
                    for dtype in [Dtype::BF16, Dtype::F16] {
                        for (rows, cols) in [(5, 256), (9, 384), (3, 136), (16, 1024)] {
                            if t.refuse_shape(rows, cols).is_some() {
                                continue;
                            }
                            let mut w: Vec<f32> =
                                crate::quant::rowwise::test_matrix(rows, cols, dtype, 1.5, 0.02);
                            for (i, x) in w.iter_mut().enumerate() {
                                let r = i / cols;
                                if r == 1 {
                                    *x = 0.0;
                                } else {
                                    *x = crate::quant::int4::round_to(
                                        dtype,
                                        *x * (1 << (r % 4)) as f32 / 3.0,
                                    );
                                }
                            }
                            let raw = crate::quant::rowwise::encode_floats(&w, dtype);
                            let Some(got) = t.encode_raw("m", &raw, rows, cols, dtype) else {
                                continue;
                            };
                            fused += 1;
                            let want = t.encode("m", &w, rows, cols, dtype);
                            assert_eq!(
                                got.unwrap(),
                                want,
                                "{} {} {q:?} {dtype} {rows}x{cols}",
                                s.id,
                                f.name()
                            );
                            let mut bad = w.clone();
                            bad[cols * 2 + 7] = f32::INFINITY;
                            bad[cols * (rows - 1)] = f32::NAN;
                            let raw = crate::quant::rowwise::encode_floats(&bad, dtype);
                            let e = t.encode_raw("m", &raw, rows, cols, dtype).unwrap();
                            let first = (cols * 2 + 7).min(cols * (rows - 1));
                            assert_eq!(
                                e.unwrap_err(),
                                first,
                                "{} {} {q:?} {dtype} {rows}x{cols}",
                                s.id,
                                f.name()
                            );
                        }
                    }
                }
            }
        }
        assert!(
            fused >= 8,
            "the int4 per-channel and grouped targets have fused paths ({fused})"
        );
    }

    /// W4A4 NVFP4 needs an input amax file (exit 2 with a hint at the weight-only scheme);
    /// every other scheme refuses one.
    #[test]
    fn input_amax_only_for_nvfp4() {
        for f in [Format::CompressedTensors, Format::Modelopt] {
            let e = build("nvfp4", f, QuarkFlags::default(), None)
                .err()
                .unwrap();
            assert!(e.hint().unwrap().contains("nvfp4-a16"), "{e}");
            assert!(e.hint().unwrap().contains("--input-amax"), "{e}");
            assert!(build("nvfp4-a16", f, QuarkFlags::default(), amax()).is_err());
            assert!(build("nvfp4", f, QuarkFlags::default(), amax()).is_ok());
        }
        assert!(build("int4-pc", Format::Quark, QuarkFlags::default(), amax()).is_err());
    }
}
