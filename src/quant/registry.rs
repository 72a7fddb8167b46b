//! Every scheme kquant knows ([`Scheme`]), the formats that can carry it, and the one place
//! that turns a (scheme, format, options) choice into a [`Codec`]: each carrier's row names its
//! codec's constructor. `--scheme`, `kquant schemes`, the quantize driver's shape checks and
//! pre-pass, and docs/schemes.md (generated from it and tested) read this table; where each
//! result loads is `crate::engines::quantized`.
//!
//! Adding a scheme: a [`Scheme`] variant in [`Scheme::ALL`] (the compiler asks for its id) and
//! its row in [`SCHEMES`] (its facts are fields, derived nowhere else), each carrier naming its
//! codec's constructor (below the table; the codec lives in its format's folder); then its
//! engine claims (`crate::engines::quantized`) and its config identified back
//! (`quant/identify.rs`). A tensor layout no scheme has yet also needs reading back, and a new
//! format its own places: docs/guides.md lists them.
//! Tests walk this table and fail on a row a place lacks:
//! `every_carrier_builds_and_every_other_pair_is_refused` and `encode_stored_equals_plain_encode`
//! (here), `engines::quantized::tests::every_implemented_carrier_has_claims`,
//! `identify::tests::every_written_config_is_identified`, the read-back of every carrier of every
//! tiny draft in `tests/inspect.rs` (`inspect_schemes_and_the_quantize_warning_tell_one_story`),
//! and `tests/schemes_doc.rs` for the docs.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::quant::codec::Codec;
pub use crate::quant::format::Format;
use crate::quant::input_amax::InputAmax;
use crate::quant::math::pack::Order;
use crate::quant::stats::{Needs, Stats};
use crate::quant::{compressed_tensors, modelopt, quark};

/// A scheme: what `--scheme` names (parsed with [`FromStr`]) and `inspect` identifies. Its facts
/// are its row of [`SCHEMES`] ([`Scheme::info`]); code that must still tell schemes apart
/// matches on it exhaustively (no `_` arm), so a new variant is a compile error wherever it
/// needs an answer. Shown and serialized as its id (`"int4-g64"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scheme {
    Int4Pc,
    Int4G32,
    Int4G64,
    Int4G128,
    Fp8Pc,
    W4a8Fp8,
    W4a8Int8,
    Uint4G32,
    Uint4G64,
    Uint4G128,
    Nvfp4A16,
    Nvfp4,
    Fp8Pt,
}

impl Scheme {
    /// Every scheme, in table (and declaration) order.
    pub const ALL: [Scheme; 13] = [
        Scheme::Int4Pc,
        Scheme::Int4G32,
        Scheme::Int4G64,
        Scheme::Int4G128,
        Scheme::Fp8Pc,
        Scheme::W4a8Fp8,
        Scheme::W4a8Int8,
        Scheme::Uint4G32,
        Scheme::Uint4G64,
        Scheme::Uint4G128,
        Scheme::Nvfp4A16,
        Scheme::Nvfp4,
        Scheme::Fp8Pt,
    ];

    /// Its id: `--scheme`, `kquant schemes`, JSON and messages spell it so.
    pub const fn id(self) -> &'static str {
        match self {
            Scheme::Int4Pc => "int4-pc",
            Scheme::Int4G32 => "int4-g32",
            Scheme::Int4G64 => "int4-g64",
            Scheme::Int4G128 => "int4-g128",
            Scheme::Fp8Pc => "fp8-pc",
            Scheme::W4a8Fp8 => "w4a8-fp8",
            Scheme::W4a8Int8 => "w4a8-int8",
            Scheme::Uint4G32 => "uint4-g32",
            Scheme::Uint4G64 => "uint4-g64",
            Scheme::Uint4G128 => "uint4-g128",
            Scheme::Nvfp4A16 => "nvfp4-a16",
            Scheme::Nvfp4 => "nvfp4",
            Scheme::Fp8Pt => "fp8-pt",
        }
    }

    /// Its row of the table.
    pub fn info(self) -> &'static SchemeInfo {
        &SCHEMES[self as usize]
    }
}

// One row per scheme, in `Scheme` order (what `Scheme::info` indexes by), and `Scheme::ALL`
// in the same order: checked when the crate compiles.
const _: () = {
    assert!(SCHEMES.len() == Scheme::ALL.len());
    let mut i = 0;
    while i < SCHEMES.len() {
        assert!(SCHEMES[i].id as usize == i && Scheme::ALL[i] as usize == i);
        i += 1;
    }
};

impl FromStr for Scheme {
    type Err = Error;

    /// The scheme with id `id`, or the `unknown scheme` error naming them all.
    fn from_str(id: &str) -> Result<Scheme> {
        Scheme::ALL
            .into_iter()
            .find(|s| s.id() == id)
            .ok_or_else(|| Error::Flags {
                msg: format!("unknown scheme `{id}`"),
                hint: format!(
                    "--scheme is one of: {} (`kquant schemes` says what each is and where it loads)",
                    Scheme::ALL.map(Scheme::id).join(", ")
                ),
            })
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.id())
    }
}

impl Serialize for Scheme {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.id())
    }
}

/// How a carrier's codec is built: from the validated choice and the statistics its scheme
/// [`Needs`] (it may refuse them).
pub type Build = fn(&Choice, &Stats) -> Result<Box<dyn Codec>>;

/// Which of Quark's paths kquant has a reference output of for a carrier: the `--quark-*`
/// flags it accepts ([`resolve`] refuses the others; other formats refuse every such flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuarkPaths {
    /// Either layout, version and nibble order.
    Any,
    /// The model layout only, either version and order (per-group INT4).
    ModelLayout,
    /// Quark 0.13's model layout only; `--quark-sequential` only where nibbles are packed.
    V013Model { packs: bool },
}

/// One format that can carry a scheme.
#[derive(Debug, Clone, Serialize)]
pub struct Carrier {
    pub format: Format,
    /// The constructor of its codec; `None`: not implemented in kquant today (serialized as
    /// `implemented`).
    #[serde(rename = "implemented", serialize_with = "is_some")]
    pub build: Option<Build>,
    /// The reference tool's name for it.
    pub reference: &'static str,
    /// The tool packs two output rows per byte: an odd output dimension is refused.
    pub even_rows: bool,
    /// The Quark flags it accepts (a Quark carrier; the others refuse them all).
    #[serde(skip)]
    pub quark: QuarkPaths,
}

impl Carrier {
    /// Implemented in kquant today (it has a codec).
    pub fn implemented(&self) -> bool {
        self.build.is_some()
    }
}

fn is_some<S: serde::Serializer>(
    build: &Option<Build>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_bool(build.is_some())
}

/// One scheme.
#[derive(Debug, Clone, Serialize)]
pub struct SchemeInfo {
    pub id: Scheme,
    /// Storage bits per weight including scales, for a 7168-wide row.
    pub bits_per_weight: f32,
    /// Group size along the input dimension (every quantized tensor's input dimension must be
    /// a multiple of it); `None` for per-channel schemes.
    pub group: Option<usize>,
    /// What the pre-pass measures before this scheme encodes.
    pub needs: Needs,
    /// Activations are quantized with a static per-tensor input scale, from the calibrated
    /// input amax `--input-amax` gives (required; every other scheme refuses the flag).
    #[serde(skip)]
    pub static_input_scale: bool,
    pub granularity: &'static str,
    pub activations: &'static str,
    pub about: &'static str,
    pub carriers: &'static [Carrier],
}

/// A carrier kquant writes, its codec built by `build`.
const fn c(format: Format, reference: &'static str, build: Build) -> Carrier {
    Carrier {
        format,
        build: Some(build),
        reference,
        even_rows: false,
        quark: QuarkPaths::Any,
    }
}

/// A carrier kquant does not write (yet).
const fn not_written(format: Format, reference: &'static str) -> Carrier {
    Carrier {
        format,
        build: None,
        reference,
        even_rows: false,
        quark: QuarkPaths::Any,
    }
}

/// The registry, in [`Scheme`] order.
pub static SCHEMES: &[SchemeInfo] = &[
    SchemeInfo {
        id: Scheme::Int4Pc,
        bits_per_weight: 4.0 + 16.0 / 7168.0,
        group: None,
        needs: Needs::Nothing,
        static_input_scale: false,
        granularity: "per output channel",
        activations: "bf16/f16 (weight-only)",
        about: "INT4 symmetric, one scale per output row (the seed recipe)",
        carriers: &[
            c(Format::Quark, "Quark int4_wo_per_channel", quark_int4_pc),
            c(
                Format::CompressedTensors,
                "W4A16 strategy channel",
                ct_pack_quantized,
            ),
            // ModelOpt exports 4-bit integer weights per group only (W4A16_AWQ); TensorRT-LLM's
            // per-channel W4A16 has no ModelOpt writer. See docs/quantize.md.
            not_written(Format::Modelopt, "none: ModelOpt INT4 is per group"),
        ],
    },
    SchemeInfo {
        id: Scheme::Int4G32,
        bits_per_weight: 4.0 + 16.0 / 32.0,
        group: Some(32),
        needs: Needs::Nothing,
        static_input_scale: false,
        granularity: "per group of 32 input columns",
        activations: "bf16/f16 (weight-only)",
        about: "INT4 symmetric, one scale per 32 inputs",
        carriers: &[
            Carrier {
                quark: QuarkPaths::ModelLayout,
                ..c(Format::Quark, "Quark int4_wo_32", quark_int4_group)
            },
            c(
                Format::CompressedTensors,
                "W4A16 group_size 32",
                ct_pack_quantized,
            ),
        ],
    },
    SchemeInfo {
        id: Scheme::Int4G64,
        bits_per_weight: 4.0 + 16.0 / 64.0,
        group: Some(64),
        needs: Needs::Nothing,
        static_input_scale: false,
        granularity: "per group of 64 input columns",
        activations: "bf16/f16 (weight-only)",
        about: "INT4 symmetric, one scale per 64 inputs",
        carriers: &[
            Carrier {
                quark: QuarkPaths::ModelLayout,
                ..c(Format::Quark, "Quark int4_wo_64", quark_int4_group)
            },
            c(
                Format::CompressedTensors,
                "W4A16 group_size 64",
                ct_pack_quantized,
            ),
        ],
    },
    SchemeInfo {
        id: Scheme::Int4G128,
        bits_per_weight: 4.0 + 16.0 / 128.0,
        group: Some(128),
        needs: Needs::Nothing,
        static_input_scale: false,
        granularity: "per group of 128 input columns",
        activations: "bf16/f16 (weight-only)",
        about: "INT4 symmetric, one scale per 128 inputs",
        carriers: &[
            Carrier {
                quark: QuarkPaths::ModelLayout,
                ..c(Format::Quark, "Quark int4_wo_128", quark_int4_group)
            },
            c(Format::CompressedTensors, "W4A16 preset", ct_pack_quantized),
            Carrier {
                even_rows: true,
                ..c(
                    Format::Modelopt,
                    "INT4_AWQ_CFG (W4A16_AWQ; no AWQ search)",
                    modelopt_w4a16_awq,
                )
            },
        ],
    },
    SchemeInfo {
        id: Scheme::Fp8Pc,
        bits_per_weight: 8.0 + 16.0 / 7168.0,
        group: None,
        needs: Needs::Nothing,
        static_input_scale: false,
        granularity: "per output channel",
        activations: "FP8 E4M3, dynamic per token",
        about: "FP8 E4M3 weights, one scale per output row; activations quantized per token at run time",
        carriers: &[
            Carrier {
                quark: QuarkPaths::V013Model { packs: false },
                ..c(Format::Quark, "Quark ptpc_fp8", quark_ptpc_fp8)
            },
            c(
                Format::CompressedTensors,
                "FP8_DYNAMIC (float-quantized)",
                ct_float_quantized,
            ),
            c(
                Format::Modelopt,
                "FP8_PER_CHANNEL_PER_TOKEN_CFG",
                modelopt_fp8_per_channel,
            ),
        ],
    },
    SchemeInfo {
        id: Scheme::W4a8Fp8,
        bits_per_weight: 4.0 + 32.0 / 7168.0,
        group: None,
        needs: Needs::Nothing,
        static_input_scale: false,
        granularity: "per output channel (INT4) on a per-tensor FP8 stage",
        activations: "FP8 E4M3, dynamic per tensor",
        about: "two-stage weights: FP8 per tensor, then INT4 symmetric per output row (Quark's \"W4A8\")",
        carriers: &[Carrier {
            quark: QuarkPaths::V013Model { packs: true },
            ..c(Format::Quark, "Quark int4_fp8", quark_int4_fp8)
        }],
    },
    SchemeInfo {
        id: Scheme::W4a8Int8,
        bits_per_weight: 8.0 + 16.0 / 128.0,
        group: Some(128),
        needs: Needs::Nothing,
        static_input_scale: false,
        granularity: "per group of 128 input columns",
        activations: "INT8, dynamic per token",
        about: "INT4 symmetric weights, one scale per 128 inputs, stored unpacked as I8 (8 bits on disk)",
        carriers: &[c(
            Format::CompressedTensors,
            "W4A8 preset (int-quantized)",
            ct_int_quantized_w4a8,
        )],
    },
    SchemeInfo {
        id: Scheme::Uint4G32,
        bits_per_weight: 4.0 + 20.0 / 32.0,
        group: Some(32),
        needs: Needs::Nothing,
        static_input_scale: false,
        granularity: "per group of 32 input columns",
        activations: "bf16/f16 (weight-only)",
        about: "UINT4 asymmetric (scale + 4-bit zero point) per 32 inputs",
        carriers: &[Carrier {
            quark: QuarkPaths::V013Model { packs: true },
            ..c(Format::Quark, "Quark uint4_wo_32", quark_uint4_group)
        }],
    },
    SchemeInfo {
        id: Scheme::Uint4G64,
        bits_per_weight: 4.0 + 20.0 / 64.0,
        group: Some(64),
        needs: Needs::Nothing,
        static_input_scale: false,
        granularity: "per group of 64 input columns",
        activations: "bf16/f16 (weight-only)",
        about: "UINT4 asymmetric (scale + 4-bit zero point) per 64 inputs",
        carriers: &[Carrier {
            quark: QuarkPaths::V013Model { packs: true },
            ..c(Format::Quark, "Quark uint4_wo_64", quark_uint4_group)
        }],
    },
    SchemeInfo {
        id: Scheme::Uint4G128,
        bits_per_weight: 4.0 + 20.0 / 128.0,
        group: Some(128),
        needs: Needs::Nothing,
        static_input_scale: false,
        granularity: "per group of 128 input columns",
        activations: "bf16/f16 (weight-only)",
        about: "UINT4 asymmetric (scale + 4-bit zero point) per 128 inputs",
        carriers: &[Carrier {
            quark: QuarkPaths::V013Model { packs: true },
            ..c(Format::Quark, "Quark uint4_wo_128", quark_uint4_group)
        }],
    },
    SchemeInfo {
        id: Scheme::Nvfp4A16,
        bits_per_weight: 4.0 + 8.0 / 16.0,
        group: Some(16),
        needs: Needs::FusedWeightAmax,
        static_input_scale: false,
        granularity: "per group of 16 input columns (FP8 E4M3) under one F32 scale per tensor",
        activations: "bf16/f16 (weight-only)",
        about: "NVFP4 weights (FP4 E2M1); the per-tensor scale is shared by fused q/k/v, gate/up (and MLA q_a/kv_a); NVIDIA GPUs only",
        carriers: &[
            c(
                Format::CompressedTensors,
                "NVFP4A16 preset (nvfp4-pack-quantized)",
                ct_nvfp4,
            ),
            c(
                Format::Modelopt,
                "W4A16_NVFP4_CFG (W4A16_NVFP4)",
                modelopt_nvfp4,
            ),
            // Quark's nvfp4 scheme (FP4Block16ScaleE4M3Scheme) is W4A4 only. See docs/quantize.md.
            not_written(Format::Quark, "none: Quark's nvfp4 is W4A4 only"),
        ],
    },
    SchemeInfo {
        id: Scheme::Nvfp4,
        bits_per_weight: 4.0 + 8.0 / 16.0,
        group: Some(16),
        needs: Needs::FusedWeightAmax,
        static_input_scale: true,
        granularity: "per group of 16 input columns (FP8 E4M3) under one F32 scale per tensor",
        activations: "NVFP4, block scales at run time under a static per-tensor scale (--input-amax)",
        about: "NVFP4 weights and activations (W4A4); needs calibrated input amax (--input-amax); per-tensor scales shared by fused siblings; NVIDIA GPUs only",
        carriers: &[
            c(
                Format::CompressedTensors,
                "NVFP4 preset (nvfp4-pack-quantized)",
                ct_nvfp4,
            ),
            c(Format::Modelopt, "NVFP4_DEFAULT_CFG (NVFP4)", modelopt_nvfp4),
            not_written(Format::Quark, "Quark nvfp4 (FP4Block16ScaleE4M3Scheme)"),
        ],
    },
    SchemeInfo {
        id: Scheme::Fp8Pt,
        bits_per_weight: 8.0 + 32.0 / (7168.0 * 7168.0),
        group: None,
        needs: Needs::Modules,
        static_input_scale: true,
        granularity: "per tensor",
        activations: "FP8 E4M3 under a static per-tensor input scale (--input-amax, or ModelOpt's fixed 1.0 with --fixed-input-amax)",
        about: "FP8 E4M3 weights, one scale per tensor, static per-tensor input scale: ModelOpt's calibration-free drafter quantizer (quantize_drafter.py --qformat fp8) and its layout",
        carriers: &[c(
            Format::Modelopt,
            "quantize_drafter.py --qformat fp8 (FP8_DEFAULT_CFG, FP8)",
            modelopt_fp8_per_tensor,
        )],
    },
];

// The codec constructors the rows name, one per codec (the codecs live under their format's
// folder).

fn quark_int4_pc(ch: &Choice, _: &Stats) -> Result<Box<dyn Codec>> {
    Ok(Box::new(quark::Int4PerChannel(ch.quark)))
}

fn quark_group(ch: &Choice) -> quark::int4_group::Int4PerGroup {
    quark::int4_group::Int4PerGroup {
        opts: ch.quark,
        group: ch.group(),
    }
}

fn quark_int4_group(ch: &Choice, _: &Stats) -> Result<Box<dyn Codec>> {
    Ok(Box::new(quark_group(ch)))
}

fn quark_uint4_group(ch: &Choice, _: &Stats) -> Result<Box<dyn Codec>> {
    Ok(Box::new(quark::uint4::Uint4PerGroup(quark_group(ch))))
}

fn quark_ptpc_fp8(ch: &Choice, _: &Stats) -> Result<Box<dyn Codec>> {
    Ok(Box::new(quark::fp8::Ptpc(ch.quark)))
}

fn quark_int4_fp8(ch: &Choice, _: &Stats) -> Result<Box<dyn Codec>> {
    Ok(Box::new(quark::fp8::Int4Fp8Codec(ch.quark)))
}

fn ct_pack_quantized(ch: &Choice, _: &Stats) -> Result<Box<dyn Codec>> {
    Ok(Box::new(compressed_tensors::PackQuantized {
        group: ch.scheme.group,
    }))
}

fn ct_float_quantized(_: &Choice, _: &Stats) -> Result<Box<dyn Codec>> {
    Ok(Box::new(compressed_tensors::fp8_w4a8::FloatQuantized))
}

fn ct_int_quantized_w4a8(_: &Choice, _: &Stats) -> Result<Box<dyn Codec>> {
    Ok(Box::new(compressed_tensors::fp8_w4a8::IntQuantizedW4A8))
}

fn ct_nvfp4(ch: &Choice, stats: &Stats) -> Result<Box<dyn Codec>> {
    Ok(Box::new(
        compressed_tensors::nvfp4::Nvfp4PackQuantized::new(ch.input_amax.as_ref(), stats)?,
    ))
}

fn modelopt_w4a16_awq(ch: &Choice, _: &Stats) -> Result<Box<dyn Codec>> {
    Ok(Box::new(modelopt::Modelopt(modelopt::Algo::W4a16Awq {
        group: ch.group(),
    })))
}

fn modelopt_fp8_per_channel(_: &Choice, _: &Stats) -> Result<Box<dyn Codec>> {
    Ok(Box::new(modelopt::Modelopt(
        modelopt::Algo::Fp8PerChannelPerToken,
    )))
}

fn modelopt_nvfp4(ch: &Choice, stats: &Stats) -> Result<Box<dyn Codec>> {
    Ok(Box::new(modelopt::nvfp4::Nvfp4Codec::new(
        ch.input_amax.as_ref(),
        stats,
    )?))
}

fn modelopt_fp8_per_tensor(ch: &Choice, stats: &Stats) -> Result<Box<dyn Codec>> {
    Ok(Box::new(modelopt::drafter::Fp8PerTensor::new(
        ch.input_amax.as_ref(),
        stats,
    )?))
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
fn quark_013_model(scheme: Scheme, q: QuarkFlags, packs: bool) -> Result<quark::Options> {
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
            msg: format!("--scheme {scheme} with {w}"),
            hint: format!(
                "Quark 0.13 model layout is what kquant writes for --scheme {scheme}: drop \
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
    /// The carrier's codec constructor.
    build: Build,
}

impl Choice {
    pub fn format(&self) -> Format {
        self.carrier.format
    }

    /// The group size of a per-group scheme's codec.
    fn group(&self) -> usize {
        self.scheme.group.expect("a group scheme")
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

    /// The codec (its carrier's constructor), from the statistics the scheme [`Needs`]
    /// (`Stats::default()` for one that needs none). It may refuse them (e.g. a module the
    /// `--input-amax` file lacks).
    pub fn build(&self, stats: &Stats) -> Result<Box<dyn Codec>> {
        (self.build)(self, stats)
    }
}

/// Validate `scheme` in `format` with the Quark flags and `--input-amax`, or say why that
/// choice cannot be written. `input_amax` is required by a scheme with a static input scale
/// (`nvfp4`) and refused by every other.
pub fn resolve(
    scheme: Scheme,
    format: Format,
    q: QuarkFlags,
    input_amax: Option<InputAmax>,
) -> Result<Choice> {
    let info = scheme.info();
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
    let Some((carrier, build)) = info.carriers.iter().find_map(|c| match c.build {
        Some(b) if c.format == format => Some((c, b)),
        _ => None,
    }) else {
        let can: Vec<&str> = info
            .carriers
            .iter()
            .filter(|c| c.implemented())
            .map(|c| c.format.name())
            .collect();
        return Err(Error::Flags {
            msg: format!(
                "--scheme {scheme} cannot be written as --format {} yet",
                format.name()
            ),
            hint: format!(
                "--scheme {scheme} is written as --format {}; or keep --format {} with one \
                 of: {}",
                can.join(" or --format "),
                format.name(),
                SCHEMES
                    .iter()
                    .filter(|s| s
                        .carriers
                        .iter()
                        .any(|c| c.format == format && c.implemented()))
                    .map(|s| s.id.id())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    };
    match (info.static_input_scale, &input_amax) {
        (true, None) => {
            return Err(Error::Flags {
                msg: format!("--scheme {scheme} quantizes activations with a static per-tensor input scale, which needs each module's calibrated input amax; kquant does not invent one"),
                hint: match scheme {
                    Scheme::Fp8Pt => "pass --input-amax FILE (module → amax JSON, see docs/quantize.md), or --fixed-input-amax for ModelOpt's calibration-free fixed input scale (amax 448: input_scale 1.0)".into(),
                    _ => "pass --input-amax FILE (module → amax JSON, see docs/quantize.md), or use --scheme nvfp4-a16 (weight-only NVFP4, no input scale)".into(),
                },
            })
        }
        (true, Some(_)) | (false, None) => {}
        (false, Some(f)) => {
            return Err(Error::Flags {
                msg: match f.fixed {
                    Some(_) => format!("--fixed-input-amax: --scheme {scheme} has no static input scale"),
                    None => format!(
                        "--input-amax `{}`: --scheme {scheme} has no static input scale",
                        f.path.display()
                    ),
                },
                hint: format!(
                    "{} applies to the schemes with a static input scale ({}) only; drop it",
                    f.path.display(),
                    SCHEMES
                        .iter()
                        .filter(|s| s.static_input_scale)
                        .map(|s| s.id.id())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
        }
    }
    let quark = match carrier.quark {
        QuarkPaths::Any => q.options(),
        QuarkPaths::ModelLayout => {
            if q.options().layout == quark::Layout::File2file {
                return Err(Error::Flags {
                    msg: format!(
                        "--scheme {scheme} with --quark-layout file2file: kquant has no \
                         reference output of Quark's file-to-file path for per-group INT4"
                    ),
                    hint: "use --quark-layout model (Quark 0.13's model layout), or --scheme \
                           int4-pc for the file-to-file layout"
                        .into(),
                });
            }
            q.options()
        }
        QuarkPaths::V013Model { packs } => quark_013_model(scheme, q, packs)?,
    };
    Ok(Choice {
        scheme: info,
        carrier,
        quark,
        input_amax,
        build,
    })
}

/// [`resolve`] and [`Choice::build`] for a scheme that needs no statistics, or with empty ones
/// (as on `--dry-run`): for tests and tools that encode single modules.
pub fn build(
    scheme: Scheme,
    format: Format,
    q: QuarkFlags,
    input_amax: Option<InputAmax>,
) -> Result<Box<dyn Codec>> {
    resolve(scheme, format, q, input_amax)?.build(&Stats::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::codec::{RawEncoded, StoredWeight};

    fn amax() -> Option<InputAmax> {
        Some(InputAmax {
            path: "a.json".into(),
            amax: Default::default(),
            fixed: None,
        })
    }

    /// The table and the builders agree: every carrier marked implemented builds, every other
    /// one is refused with a message naming the formats that do work.
    #[test]
    fn every_carrier_builds_and_every_other_pair_is_refused() {
        for s in SCHEMES {
            for f in [Format::Quark, Format::CompressedTensors, Format::Modelopt] {
                let implemented = s.carriers.iter().any(|c| c.format == f && c.implemented());
                let input = if s.static_input_scale { amax() } else { None };
                let built = build(s.id, f, QuarkFlags::default(), input);
                assert_eq!(built.is_ok(), implemented, "{} as {}", s.id, f.name());
                if let Err(e) = built {
                    let hint = e.hint().unwrap_or_default();
                    assert!(hint.contains("is written as --format"), "{e}: {hint}");
                }
            }
        }
        let flags = QuarkFlags {
            sequential: true,
            ..Default::default()
        };
        assert!(build(Scheme::Int4Pc, Format::CompressedTensors, flags, None).is_err());
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
        for s in SCHEMES.iter().filter(|s| !s.static_input_scale) {
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
        let want: std::collections::BTreeSet<(Scheme, &str)> = [
            (Scheme::Int4Pc, "quark"),
            (Scheme::Int4G32, "quark"),
            (Scheme::Int4G64, "quark"),
            (Scheme::Int4G128, "quark"),
            (Scheme::Int4Pc, "compressed-tensors"),
            (Scheme::Int4G32, "compressed-tensors"),
            (Scheme::Int4G64, "compressed-tensors"),
            (Scheme::Int4G128, "compressed-tensors"),
            (Scheme::Int4G128, "modelopt"),
        ]
        .into();
        assert_eq!(grids, want);
    }

    /// W4A4 NVFP4 needs an input amax file (exit 2 with a hint at the weight-only scheme);
    /// every other scheme refuses one.
    #[test]
    fn input_amax_only_for_nvfp4() {
        for f in [Format::CompressedTensors, Format::Modelopt] {
            let e = build(Scheme::Nvfp4, f, QuarkFlags::default(), None)
                .err()
                .unwrap();
            assert!(e.hint().unwrap().contains("nvfp4-a16"), "{e}");
            assert!(e.hint().unwrap().contains("--input-amax"), "{e}");
            assert!(build(Scheme::Nvfp4A16, f, QuarkFlags::default(), amax()).is_err());
            assert!(build(Scheme::Nvfp4, f, QuarkFlags::default(), amax()).is_ok());
        }
        assert!(build(Scheme::Int4Pc, Format::Quark, QuarkFlags::default(), amax()).is_err());
        // fp8-pt: a file or the fixed amax; nothing else refuses with the fixed one's name.
        let fixed = || Some(InputAmax::fixed(448.0));
        assert!(build(
            Scheme::Fp8Pt,
            Format::Modelopt,
            QuarkFlags::default(),
            fixed()
        )
        .is_ok());
        assert!(build(
            Scheme::Fp8Pt,
            Format::Modelopt,
            QuarkFlags::default(),
            amax()
        )
        .is_ok());
        let e = build(Scheme::Fp8Pt, Format::Modelopt, QuarkFlags::default(), None)
            .err()
            .unwrap();
        assert!(e.hint().unwrap().contains("--fixed-input-amax"), "{e}");
        let e = build(
            Scheme::Fp8Pc,
            Format::Modelopt,
            QuarkFlags::default(),
            fixed(),
        )
        .err()
        .unwrap();
        assert!(e.to_string().starts_with("--fixed-input-amax: "), "{e}");
        assert!(e.hint().unwrap().contains("nvfp4, fp8-pt"), "{e}");
    }

    /// Every id parses back to its scheme and is shown and serialized as itself; an unknown id
    /// is refused naming them all, as `--scheme` and a preset have always refused it.
    #[test]
    fn scheme_ids_round_trip() {
        for s in Scheme::ALL {
            assert_eq!(s.id().parse::<Scheme>().unwrap(), s);
            assert_eq!(s.to_string(), s.id());
            assert_eq!(format!("{s:<10}|"), format!("{:<10}|", s.id()));
            assert_eq!(serde_json::to_value(s).unwrap(), s.id());
            assert_eq!(s.info().id, s);
        }
        let e = "nope".parse::<Scheme>().unwrap_err();
        assert_eq!(e.to_string(), "unknown scheme `nope`");
        assert_eq!(
            e.hint().unwrap(),
            "--scheme is one of: int4-pc, int4-g32, int4-g64, int4-g128, fp8-pc, w4a8-fp8, \
             w4a8-int8, uint4-g32, uint4-g64, uint4-g128, nvfp4-a16, nvfp4, fp8-pt (`kquant \
             schemes` says what each is and where it loads)"
        );
    }
}
