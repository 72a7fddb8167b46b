//! Every scheme kquant knows, the formats that can carry it, and the one place that turns a
//! (scheme, format, options) choice into a [`Codec`]. `--scheme`, `kquant schemes`, the quantize
//! driver's shape checks and pre-pass, and docs/schemes.md (generated from it and tested) read
//! this table; where each result loads is `crate::engines::quantized`.
//!
//! Adding a scheme: a row here (its facts are fields, derived nowhere else), its codec under
//! its format's folder and an arm in [`Choice::build`], its engine claims
//! (`crate::engines::quantized`), and the read-back of its tensors (the format's `read.rs`, a
//! `Stored` variant and its decode arm in `quant/decode.rs`, for `dequantize`, `inspect`,
//! `verify`; INT4 also `gpu/layout.rs`). Adding a format: a variant of [`Format`] with its list
//! facts (`quant/format.rs`), a folder with its codecs and `read.rs`, its carriers here, and its
//! config identification (`quant/identify.rs`).
//! Each of those places has a test that walks this table and fails on a row it lacks:
//! `every_carrier_builds_and_every_other_pair_is_refused` and `encode_stored_equals_plain_encode`
//! (here), `engines::quantized::tests::every_implemented_carrier_has_claims`,
//! `identify::tests::every_written_config_is_identified`, the read-back of every carrier of every
//! tiny draft in `tests/inspect.rs` (`inspect_schemes_and_the_quantize_warning_tell_one_story`),
//! and `tests/schemes_doc.rs` for the docs.

use serde::Serialize;

use crate::error::{Error, Result};
use crate::quant::codec::Codec;
pub use crate::quant::format::Format;
use crate::quant::input_amax::InputAmax;
use crate::quant::math::pack::Order;
use crate::quant::stats::{Needs, Stats};
use crate::quant::{compressed_tensors, modelopt, quark};

/// One format that can carry a scheme.
#[derive(Debug, Clone, Serialize)]
pub struct Carrier {
    pub format: Format,
    /// Implemented in kquant today.
    pub implemented: bool,
    /// The reference tool's name for it.
    pub reference: &'static str,
    /// The tool packs two output rows per byte: an odd output dimension is refused.
    pub even_rows: bool,
}

/// One scheme.
#[derive(Debug, Clone, Serialize)]
pub struct SchemeInfo {
    pub id: &'static str,
    /// Storage bits per weight including scales, for a 7168-wide row.
    pub bits_per_weight: f32,
    /// Group size along the input dimension (every quantized tensor's input dimension must be
    /// a multiple of it); `None` for per-channel schemes.
    pub group: Option<usize>,
    /// What the pre-pass measures before this scheme encodes.
    pub needs: Needs,
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
        even_rows: false,
    }
}

/// The registry.
pub static SCHEMES: &[SchemeInfo] = &[
    SchemeInfo {
        id: "int4-pc",
        bits_per_weight: 4.0 + 16.0 / 7168.0,
        group: None,
        needs: Needs::Nothing,
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
        group: Some(32),
        needs: Needs::Nothing,
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
        group: Some(64),
        needs: Needs::Nothing,
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
        group: Some(128),
        needs: Needs::Nothing,
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
            Carrier {
                even_rows: true,
                ..c(
                    Format::Modelopt,
                    true,
                    "INT4_AWQ_CFG (W4A16_AWQ; no AWQ search)",
                )
            },
        ],
    },
    SchemeInfo {
        id: "fp8-pc",
        bits_per_weight: 8.0 + 16.0 / 7168.0,
        group: None,
        needs: Needs::Nothing,
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
        group: None,
        needs: Needs::Nothing,
        granularity: "per output channel (INT4) on a per-tensor FP8 stage",
        activations: "FP8 E4M3, dynamic per tensor",
        about: "two-stage weights: FP8 per tensor, then INT4 symmetric per output row (Quark's \"W4A8\")",
        carriers: &[c(Format::Quark, true, "Quark int4_fp8")],
    },
    SchemeInfo {
        id: "w4a8-int8",
        bits_per_weight: 8.0 + 16.0 / 128.0,
        group: Some(128),
        needs: Needs::Nothing,
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
        group: Some(32),
        needs: Needs::Nothing,
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
        group: Some(64),
        needs: Needs::Nothing,
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
        group: Some(128),
        needs: Needs::Nothing,
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
        group: Some(16),
        needs: Needs::FusedWeightAmax,
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
        group: Some(16),
        needs: Needs::FusedWeightAmax,
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

/// A scheme in a format with its options, validated: everything [`Choice::build`] needs but the
/// pre-pass's statistics.
#[derive(Debug)]
pub struct Choice {
    pub scheme: &'static SchemeInfo,
    pub carrier: &'static Carrier,
    /// The Quark options (the defaults for the other formats, which refuse the flags).
    pub quark: quark::Options,
    /// `--input-amax`, for W4A4 NVFP4.
    pub input_amax: Option<InputAmax>,
}

impl Choice {
    pub fn format(&self) -> Format {
        self.carrier.format
    }

    /// Why a `[rows, cols]` weight cannot be written in this choice (the reference tool
    /// refuses it or no engine can load it), or `None`.
    pub fn refuse_shape(&self, rows: usize, cols: usize) -> Option<String> {
        match self.scheme.group {
            Some(g) if !cols.is_multiple_of(g) => {
                return Some(format!(
                    "input dimension {cols} is not a multiple of the group size {g}"
                ))
            }
            _ => {}
        }
        // Two output rows share a byte; ModelOpt refuses an odd count and TensorRT-LLM could
        // not load a padded one.
        (self.carrier.even_rows && !rows.is_multiple_of(2)).then(|| {
            format!("output dimension {rows} is odd; ModelOpt packs two output rows per byte")
        })
    }

    /// The codec, from the statistics the scheme [`Needs`] (`Stats::default()` for one that
    /// needs none). It may refuse them (e.g. a module the `--input-amax` file lacks).
    pub fn build(&self, stats: &Stats) -> Result<Box<dyn Codec>> {
        let id = self.scheme.id;
        let group = self.scheme.group;
        let o = self.quark;
        let input = self.input_amax.as_ref();
        Ok(match (id, self.format()) {
            ("int4-pc", Format::Quark) => Box::new(quark::Int4PerChannel(o)),
            ("int4-g32" | "int4-g64" | "int4-g128", Format::Quark) => {
                Box::new(quark::int4_group::Int4PerGroup {
                    opts: o,
                    group: group.expect("a group scheme"),
                })
            }
            ("uint4-g32" | "uint4-g64" | "uint4-g128", Format::Quark) => {
                Box::new(quark::uint4::Uint4PerGroup {
                    opts: o,
                    group: group.expect("a group scheme"),
                })
            }
            ("fp8-pc", Format::Quark) => Box::new(quark::fp8::Ptpc(o)),
            ("w4a8-fp8", Format::Quark) => Box::new(quark::fp8::Int4Fp8Codec(o)),
            ("int4-pc" | "int4-g32" | "int4-g64" | "int4-g128", Format::CompressedTensors) => {
                Box::new(compressed_tensors::PackQuantized { group })
            }
            ("fp8-pc", Format::CompressedTensors) => {
                Box::new(compressed_tensors::fp8_w4a8::FloatQuantized)
            }
            ("w4a8-int8", Format::CompressedTensors) => {
                Box::new(compressed_tensors::fp8_w4a8::IntQuantizedW4A8)
            }
            ("nvfp4-a16" | "nvfp4", Format::CompressedTensors) => Box::new(
                compressed_tensors::nvfp4::Nvfp4PackQuantized::new(input, stats)?,
            ),
            ("int4-g128", Format::Modelopt) => {
                Box::new(modelopt::Modelopt(modelopt::Algo::W4a16Awq {
                    group: group.expect("a group scheme"),
                }))
            }
            ("fp8-pc", Format::Modelopt) => {
                Box::new(modelopt::Modelopt(modelopt::Algo::Fp8PerChannelPerToken))
            }
            ("nvfp4-a16" | "nvfp4", Format::Modelopt) => {
                Box::new(modelopt::nvfp4::Nvfp4Codec::new(input, stats)?)
            }
            (id, f) => unreachable!(
                "{id} as {} is marked implemented but has no codec",
                f.name()
            ),
        })
    }
}

/// Validate `scheme` in `format` with the Quark flags and `--input-amax`, or say why that
/// choice cannot be written. `input_amax` is required by the W4A4 scheme `nvfp4` and refused
/// by every other.
pub fn resolve(
    scheme_id: &str,
    format: Format,
    q: QuarkFlags,
    input_amax: Option<InputAmax>,
) -> Result<Choice> {
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
    let Some(carrier) = info
        .carriers
        .iter()
        .find(|c| c.format == format && c.implemented)
    else {
        let can: Vec<&str> = info
            .carriers
            .iter()
            .filter(|c| c.implemented)
            .map(|c| c.format.name())
            .collect();
        return Err(Error::Flags {
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
        });
    };
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
    let quark = match (scheme_id, format) {
        (_, Format::Quark) if scheme_id.starts_with("int4-g") => {
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
            q.options()
        }
        ("fp8-pc", Format::Quark) => quark_013_model(scheme_id, q, false)?,
        ("w4a8-fp8" | "uint4-g32" | "uint4-g64" | "uint4-g128", Format::Quark) => {
            quark_013_model(scheme_id, q, true)?
        }
        _ => q.options(),
    };
    Ok(Choice {
        scheme: info,
        carrier,
        quark,
        input_amax,
    })
}

/// [`resolve`] and [`Choice::build`] for a scheme that needs no statistics, or with empty ones
/// (as on `--dry-run`): for tests and tools that encode single modules.
pub fn build(
    scheme_id: &str,
    format: Format,
    q: QuarkFlags,
    input_amax: Option<InputAmax>,
) -> Result<Box<dyn Codec>> {
    resolve(scheme_id, format, q, input_amax)?.build(&Stats::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::codec::{RawEncoded, StoredWeight};

    fn amax() -> Option<InputAmax> {
        Some(InputAmax {
            path: "a.json".into(),
            amax: Default::default(),
        })
    }

    /// The table and the builders agree: every carrier marked implemented builds, every other
    /// one is refused with a message naming the formats that do work.
    #[test]
    fn every_carrier_builds_and_every_other_pair_is_refused() {
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

    /// Every codec's path from the stored bytes (`encode_stored`: the fused one where a codec
    /// has it) gives the bytes of its plain path (`encode` of the f32 conversion) — every scheme,
    /// format and Quark layout, BF16 and F16, per-channel and grouped shapes, odd widths, an
    /// all-zero row and rows of mixed scale — and names the first non-finite weight.
    #[test]
    fn encode_stored_equals_plain_encode() {
        use crate::io::Dtype;
        let layouts = [
            QuarkFlags::default(),
            QuarkFlags {
                layout: Some(quark::Layout::File2file),
                ..Default::default()
            },
        ];
        let mut fused = 0;
        let mut grids = std::collections::BTreeSet::new();
        for s in SCHEMES.iter().filter(|s| s.id != "nvfp4") {
            for f in [Format::Quark, Format::CompressedTensors, Format::Modelopt] {
                for q in layouts.iter().filter(|q| f == Format::Quark || !q.any()) {
                    let Ok(choice) = resolve(s.id, f, *q, None) else {
                        continue;
                    };
                    for dtype in [Dtype::BF16, Dtype::F16] {
                        for (rows, cols) in [(5, 256), (9, 384), (3, 136), (16, 1024)] {
                            if choice.refuse_shape(rows, cols).is_some() {
                                continue;
                            }
                            let mut w: Vec<f32> = crate::quant::math::rowwise::test_matrix(
                                rows, cols, dtype, 1.5, 0.02,
                            );
                            for (i, x) in w.iter_mut().enumerate() {
                                let r = i / cols;
                                if r == 1 {
                                    *x = 0.0;
                                } else {
                                    *x = crate::quant::math::int4::round_to(
                                        dtype,
                                        *x * (1 << (r % 4)) as f32 / 3.0,
                                    );
                                }
                            }
                            let stats = Stats {
                                quantized: vec!["m".into()],
                                families: Vec::new(),
                                weight_amax: Some(
                                    [("m".to_string(), crate::quant::math::rowwise::amax(&w))]
                                        .into(),
                                ),
                            };
                            let t = choice.build(&stats).unwrap();
                            let raw = crate::quant::math::rowwise::encode_floats(&w, dtype);
                            let stored = |raw: &'_ [u8]| -> RawEncoded {
                                let w = StoredWeight {
                                    raw,
                                    dtype,
                                    rows,
                                    cols,
                                    release: &|| {},
                                };
                                t.encode_stored("m", &w, &mut Vec::new())
                            };
                            let got = stored(&raw);
                            // In the codec's `specs`, by name and size.
                            let specs = t.specs("m", rows, cols, dtype);
                            let enc = got.as_ref().unwrap();
                            assert_eq!(enc.len(), specs.len(), "{} {}", s.id, f.name());
                            for ((n, b), spec) in enc.iter().zip(&specs) {
                                assert_eq!(n, &spec.name);
                                assert_eq!(b.len() as u64, spec.nbytes(), "{n}");
                            }
                            fused += 1;
                            let want = t.encode("m", &w, rows, cols, dtype);
                            // The integer grid a calibrated method writes through: its RTN,
                            // written, is the plain path's bytes.
                            if let Some(g) = t.int_grid() {
                                let q = g.rtn(&w, rows, cols, dtype);
                                assert_eq!(q.group, g.group(cols));
                                let gpr = cols.div_ceil(q.group);
                                for (i, (&x, &c)) in w.iter().zip(&q.codes).enumerate() {
                                    let sc = q.scales[i / cols * gpr + i % cols / q.group];
                                    assert_eq!(g.code(x, sc, dtype), c, "{} {i}", s.id);
                                }
                                assert!(q
                                    .codes
                                    .iter()
                                    .all(|c| (g.range().0..=g.range().1).contains(c)));
                                assert_eq!(
                                    g.write("m", &q, dtype),
                                    want,
                                    "int_grid {} {}",
                                    s.id,
                                    f.name()
                                );
                                grids.insert((s.id, f.name()));
                            }
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
                            let raw = crate::quant::math::rowwise::encode_floats(&bad, dtype);
                            let e = stored(&raw);
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
        assert!(fused >= 40, "every codec was run ({fused})");
        // Exactly the symmetric INT4 codecs have a grid.
        let want: std::collections::BTreeSet<(&str, &str)> = [
            ("int4-pc", "quark"),
            ("int4-g32", "quark"),
            ("int4-g64", "quark"),
            ("int4-g128", "quark"),
            ("int4-pc", "compressed-tensors"),
            ("int4-g32", "compressed-tensors"),
            ("int4-g64", "compressed-tensors"),
            ("int4-g128", "compressed-tensors"),
            ("int4-g128", "modelopt"),
        ]
        .into();
        assert_eq!(grids, want);
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
