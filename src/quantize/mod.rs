//! `kquant quantize` as a library: resolve → plan → drive.
//!
//! - [`resolve`] (this file): the user's flags over a preset over the defaults (`int4-pc`,
//!   `quark`, `lm_head`) into a [`Recipe`]: a validated (scheme, format, options) choice of the
//!   scheme table (`quant::registry`) and the exclude patterns; it refuses an already quantized
//!   source and a preset written for another draft family.
//! - [`plan`]: what happens to every tensor (quantize, or copy and why), the shape checks, the
//!   pre-pass for the statistics a scheme needs (`quant::stats`), the codec built from them, the
//!   output tensors and sizes, the unquantized-module list as the format writes it; `--dry-run`
//!   renders the plan.
//! - [`drive`]: claim the output, encode the modules in the writer's order on a producer thread
//!   while this one copies the rest, then the config files, a retargeted TensorRT-LLM YAML, and
//!   what to do next.
//!
//! - [`amax`]: `kquant calibrate`, each linear's input abs-max over a replay of a trace, for
//!   NVFP4 W4A4's static input scales.
//! - [`sensitivity`]: the module groups `kquant sensitivity` quantizes one at a time, and the
//!   exclusion sets its `--pick` tries, cheapest first.
//!
//! `cli::quantize` parses the arguments and renders; everything else is here.

pub mod amax;
pub mod calibrate;
pub mod drive;
pub mod plan;
pub mod schedule;
pub mod sensitivity;

use std::path::PathBuf;

use crate::checkpoint::{Checkpoint, Detection, Family};
use crate::error::{Error, Result};
use crate::quant::exclude::{kept_for, parse_patterns, Kept, DFLASH2_KEPT, DSPARK_KEPT};
use crate::quant::format::Format;
use crate::quant::input_amax::InputAmax;
use crate::quant::preset;
use crate::quant::quark;
use crate::quant::registry::{self, Choice, QuarkFlags, Scheme};

/// What the user asked for; `None` takes the preset's value, then the default.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub scheme: Option<String>,
    pub format: Option<Format>,
    /// A preset: a name from quant-configs/ or a JSON file.
    pub config: Option<String>,
    /// Comma-separated exclude patterns.
    pub exclude: Option<String>,
    pub quark_layout: Option<quark::Layout>,
    pub quark_version: Option<quark::Version>,
    pub quark_sequential: bool,
    pub input_amax: Option<PathBuf>,
    /// `--fixed-input-amax`: ModelOpt's drafter quantizer's fixed amax for every module.
    pub fixed_input_amax: bool,
}

/// A resolved, validated recipe.
#[derive(Debug)]
pub struct Recipe {
    pub choice: Choice,
    /// The exclude patterns (Python fnmatch on module names).
    pub patterns: Vec<String>,
    /// The tensors the draft family's engines load only unquantized ([`Kept`]): its fixed
    /// ones, and its defaults unless the patterns came from `--exclude` or a preset.
    pub kept: Vec<Kept>,
}

impl Recipe {
    pub fn scheme(&self) -> Scheme {
        self.choice.scheme.id
    }
    pub fn format(&self) -> Format {
        self.choice.format()
    }
    /// Why tensor `name` stays unquantized for the family, when it does.
    pub fn kept(&self, name: &str) -> Option<&'static str> {
        kept_for(&self.kept, name).map(|k| k.why)
    }
}

/// The tensors a `family` draft keeps unquantized; `defaults` adds those only excluded by
/// default.
pub fn family_kept(family: &Family, defaults: bool) -> Vec<Kept> {
    let all: &[Kept] = match family {
        Family::Dspark => DSPARK_KEPT,
        Family::Dflash2 => DFLASH2_KEPT,
        _ => &[],
    };
    all.iter()
        .filter(|k| k.always || defaults)
        .copied()
        .collect()
}

/// The refusal of DFlash2's MLA layout: no engine builds it, so there are no engine-proven
/// exclusions, and kquant has no runtime to verify it. Inferact's MLA DSpark (`k3-dspark`) is
/// taken: vLLM's `K3DSparkModel` builds `context_proj`, every MLA projection and the MLP with the
/// quant config, and its heads as `Qwen3DSparkModel` does (`DSPARK_KEPT`). Nor is a block draft
/// whose config contradicts itself or its tensors taken.
fn refuse_mla_block(ck: &Checkpoint, det: &Detection) -> Result<()> {
    let Some(b) = det
        .block_draft
        .as_ref()
        .filter(|b| b.layout == crate::checkpoint::block::Layout::Dflash2Mla)
    else {
        // A config that contradicts itself or its tensors: `convert` and the gate's replay
        // refuse the draft (`BlockDraft::contradiction`), so its quantized copy would be too.
        return match det.block_draft.as_ref().and_then(|b| b.contradiction()) {
            Some(why) => Err(Error::Source {
                path: ck.weights.dir.clone(),
                msg: format!("cannot be quantized as written: {why}"),
                hint: Some("fix its config.json (in a copy of the draft) so that its keys agree with each other, the vocabulary and the tensors; `kquant inspect` lists every problem".into()),
            }),
            None => Ok(()),
        };
    };
    let fam = b.layout.family_name();
    Err(Error::Source {
        path: ck.weights.dir.clone(),
        msg: format!(
            "is a {fam} draft in the MLA `{}` layout: `kquant quantize` takes the GQA {fam} layouts only (no engine builds it, and kquant has no runtime to verify the result)",
            b.layout.id()
        ),
        hint: Some(
            "`kquant inspect` describes it; `kquant quantize` takes the qwen3-dspark, k3-dspark, specforge-dspark, speculators-dspark and dflash2 layouts".into(),
        ),
    })
}

/// The recipe for quantizing `ck` (opened from `src`, detected as `det`).
pub fn resolve(ck: &Checkpoint, det: &Detection, src: &str, req: &Request) -> Result<Recipe> {
    refuse_mla_block(ck, det)?;
    if det.quantization.quantized {
        return Err(Error::Source {
            path: ck
                .weights
                .config_path
                .clone()
                .unwrap_or_else(|| ck.weights.dir.clone()),
            msg: format!(
                "is already quantized ({})",
                det.quantization
                    .method
                    .as_deref()
                    .unwrap_or("quantization tensors present")
            ),
            hint: Some(
                "quantize the original BF16/F16 checkpoint, or `kquant dequantize` it first".into(),
            ),
        });
    }
    let preset = req.config.as_deref().map(preset::load).transpose()?;
    if let Some(p) = &preset {
        if !p.family.is_empty() && !p.family.iter().any(|f| f == det.family.id()) {
            return Err(wrong_family(
                req.config.as_deref().unwrap_or(""),
                p,
                det,
                src,
            ));
        }
    }
    let scheme = req
        .scheme
        .clone()
        .or_else(|| preset.as_ref().map(|p| p.scheme.clone()));
    let format = req
        .format
        .or(preset.as_ref().map(|p| p.format))
        .unwrap_or(Format::Quark);
    let kept = family_kept(&det.family, req.exclude.is_none() && preset.is_none());
    let patterns = match (&req.exclude, &preset) {
        (Some(e), _) => parse_patterns(e),
        (None, Some(p)) => p.exclude.clone(),
        (None, None) => vec!["lm_head".to_string()],
    };
    // A preset's Quark settings apply only when the output is Quark.
    let quark_preset = preset.as_ref().filter(|_| format == Format::Quark);
    let flags = QuarkFlags {
        layout: req
            .quark_layout
            .or(quark_preset.and_then(|p| p.quark_layout)),
        version: req
            .quark_version
            .or(quark_preset.and_then(|p| p.quark_version)),
        sequential: req.quark_sequential || quark_preset.is_some_and(|p| p.quark_sequential),
    };
    let input_amax = match (&req.input_amax, req.fixed_input_amax) {
        (_, true) => Some(InputAmax::fixed(
            crate::quant::modelopt::drafter::FIXED_INPUT_AMAX,
        )),
        (Some(p), false) => Some(InputAmax::load(p)?),
        (None, false) => None,
    };
    let scheme = match scheme {
        Some(id) => id.parse()?,
        None => Scheme::Int4Pc,
    };
    let choice = registry::resolve(scheme, format, flags, input_amax)?;
    Ok(Recipe {
        choice,
        patterns,
        kept,
    })
}

/// The refusal of a preset written for other draft families, naming the built-in presets that
/// fit this one.
fn wrong_family(name: &str, p: &preset::Preset, det: &Detection, src: &str) -> Error {
    let family = det.family.id();
    let fitting: Vec<&str> = preset::BUILTIN
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| preset::load(n).is_ok_and(|o| o.family.iter().any(|f| f == family)))
        .collect();
    Error::Flags {
        msg: format!(
            "preset `{name}` is for {} drafts, but `{src}` is {family}",
            p.family.join("/"),
        ),
        hint: if fitting.is_empty() {
            format!(
                "no built-in preset is for {family} drafts: pass --scheme/--format/--exclude instead"
            )
        } else {
            format!("presets for {family} drafts: {}", fitting.join(", "))
        },
    }
}
