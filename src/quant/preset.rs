//! Presets for `kquant quantize --config NAME|FILE`: documented JSON files in `quant-configs/`,
//! also compiled into the binary so a bare name works anywhere.

use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::quant::quark;
use crate::quant::registry::Format;

/// The presets shipped in `quant-configs/` (name, file contents).
pub const BUILTIN: &[(&str, &str)] = &[
    (
        "kimi-k2.5-eagle3-int4-pc",
        include_str!("../../quant-configs/kimi-k2.5-eagle3-int4-pc.json"),
    ),
    (
        "kimi-k2.5-eagle3-mla-int4-pc",
        include_str!("../../quant-configs/kimi-k2.5-eagle3-mla-int4-pc.json"),
    ),
    (
        "kimi-k2.5-eagle3-vllm-int4",
        include_str!("../../quant-configs/kimi-k2.5-eagle3-vllm-int4.json"),
    ),
    (
        "kimi-k2.5-eagle3-quark-int4-g128",
        include_str!("../../quant-configs/kimi-k2.5-eagle3-quark-int4-g128.json"),
    ),
    (
        "kimi-k2.5-eagle3-w4a8-fp8",
        include_str!("../../quant-configs/kimi-k2.5-eagle3-w4a8-fp8.json"),
    ),
    (
        "kimi-k2.5-eagle3-fp8-pc",
        include_str!("../../quant-configs/kimi-k2.5-eagle3-fp8-pc.json"),
    ),
    (
        "kimi-k2.5-eagle3-trtllm-int4",
        include_str!("../../quant-configs/kimi-k2.5-eagle3-trtllm-int4.json"),
    ),
    (
        "kimi-k2.5-eagle3-nvfp4-a16",
        include_str!("../../quant-configs/kimi-k2.5-eagle3-nvfp4-a16.json"),
    ),
];

/// One preset. Command-line flags override its fields.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preset {
    pub description: String,
    /// Draft families it is meant for (checked against detection).
    #[serde(default)]
    pub family: Vec<String>,
    pub scheme: String,
    pub format: Format,
    #[serde(default)]
    pub exclude: Vec<String>,
    pub quark_layout: Option<quark::Layout>,
    pub quark_version: Option<quark::Version>,
    #[serde(default)]
    pub quark_sequential: bool,
    /// Where the result loads, in words.
    pub loads: String,
    /// How the codes were chosen when the preset was measured (`sensitivity --pick` on a
    /// calibrated method: `search`, `gptq`, `search-gptq`); `quantize --config` then uses it
    /// and needs `--calibrate`. Absent: round to nearest.
    #[serde(default)]
    pub method: Option<String>,
}

/// Parse preset JSON.
pub fn parse(path: &Path, text: &str) -> Result<Preset> {
    serde_json::from_str(text).map_err(|e| Error::Source {
        path: path.into(),
        msg: format!("not a kquant quantize preset: {e}"),
        hint: Some(format!(
            "a preset is a JSON object with the fields of the built-in ones (quant-configs/*.json: \
             {}); or pass --scheme and --format instead of --config",
            BUILTIN.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
        )),
    })
}

/// Load a preset by built-in name or file path.
pub fn load(spec: &str) -> Result<Preset> {
    let (path, text) = crate::io::text::builtin_or_file(
        spec,
        BUILTIN,
        |name| format!("quant-configs/{name}.json").into(),
        "preset",
        |names| {
            Error::Flags {
            msg: format!("--config: no preset `{spec}` (not a built-in name, not a file)"),
            hint: format!(
                "the built-in presets are {names} (their files are in quant-configs/); or give the path of a preset JSON file"
            ),
        }
        },
    )?;
    parse(&path, &text)
}
