//! The per-checkpoint side of a quantized output: the file formats kquant writes, which one a
//! checkpoint is in ([`Format::of`], the one place that decides it), and what each knows about a
//! whole checkpoint rather than one module: which modules its config lists as unquantized, in
//! what order, under which key, with which engine patterns. The per-module
//! recipes are the codecs ([`crate::quant::codec`]); `convert` renames these lists through
//! [`MODULE_LIST_KEYS`].

use serde::Serialize;
use serde_json::Value;

use crate::io::TensorInfo;
use crate::quant::exclude::{excluded_by, module_of, not_candidate};
use crate::quant::{modelopt, quark};

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

/// The keys under which a `quantization_config` lists the modules left unquantized: Quark
/// `exclude`, compressed-tensors and ModelOpt `ignore`, ModelOpt's `hf_quant_config.json`
/// `exclude_modules`, and the Hugging Face (AWQ, bitsandbytes) `modules_to_not_convert`.
pub const MODULE_LIST_KEYS: [&str; 4] = [
    "exclude",
    "ignore",
    "exclude_modules",
    "modules_to_not_convert",
];

/// How a format composes its list of unquantized modules (each tool does it differently).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListStyle {
    /// Every module matched by an exclude pattern (Linear or not) plus unquantized Linear
    /// candidates, in file order (Quark model path; ModelOpt, which sorts them when written).
    MatchedModules,
    /// Unquantized Linear candidates, sorted (Quark file-to-file).
    SortedCandidates,
    /// Unquantized Linear candidates, in file order (compressed-tensors `ignore`).
    Candidates,
}

impl Format {
    pub const ALL: [Format; 3] = [Format::Quark, Format::CompressedTensors, Format::Modelopt];

    /// Its `--format` name, which is also its `quant_method`.
    pub fn name(self) -> &'static str {
        match self {
            Format::Quark => "quark",
            Format::CompressedTensors => "compressed-tensors",
            Format::Modelopt => "modelopt",
        }
    }

    /// The format a checkpoint is in, from its `quantization_config` (`config`) and whether
    /// ModelOpt's `hf_quant_config.json` is beside it (ModelOpt's legacy form has no
    /// `quant_method` in `config.json`): `None` when neither says the checkpoint is quantized,
    /// `Some(Err(m))` for a `quant_method` `m` that is no format of kquant's. Reading back
    /// (`quant::decode`) and identifying the scheme (`quant::identify`) both ask this.
    pub fn of(config: Option<&Value>, hf_quant_config: bool) -> Option<Result<Format, &str>> {
        match config
            .and_then(|q| q.get("quant_method"))
            .and_then(Value::as_str)
        {
            // ModelOpt's drafter quantizer (`quantize_drafter.py`) writes `modelopt_fp4` for its
            // NVFP4 formats, the name vLLM registers ModelOpt NVFP4 under.
            Some("modelopt_fp4") => Some(Ok(Format::Modelopt)),
            Some(m) => Some(Format::ALL.into_iter().find(|f| f.name() == m).ok_or(m)),
            None => hf_quant_config.then_some(Ok(Format::Modelopt)),
        }
    }

    /// The key of the unquantized-module list in `quantization_config`.
    pub fn list_key(self) -> &'static str {
        match self {
            Format::Quark => "exclude",
            Format::CompressedTensors | Format::Modelopt => "ignore",
        }
    }

    /// How the list is composed; for Quark it depends on the path reproduced (`layout`).
    pub fn list_style(self, layout: quark::Layout) -> ListStyle {
        match (self, layout) {
            (Format::Quark, quark::Layout::Model) | (Format::Modelopt, _) => {
                ListStyle::MatchedModules
            }
            (Format::Quark, quark::Layout::File2file) => ListStyle::SortedCandidates,
            (Format::CompressedTensors, _) => ListStyle::Candidates,
        }
    }

    /// The modules left unquantized, as the tool composes them: `tensors` in file order,
    /// `patterns` the exclude patterns, `quantized` whether a tensor is quantized.
    pub fn unquantized_modules(
        self,
        layout: quark::Layout,
        tensors: &[&TensorInfo],
        patterns: &[String],
        quantized: &dyn Fn(&TensorInfo) -> bool,
    ) -> Vec<String> {
        let unquantized_candidate = |t: &TensorInfo| not_candidate(t).is_none() && !quantized(t);
        let mut out: Vec<String> = Vec::new();
        match self.list_style(layout) {
            ListStyle::SortedCandidates | ListStyle::Candidates => {
                for t in tensors {
                    if unquantized_candidate(t) {
                        out.push(module_of(&t.name).to_string());
                    }
                }
                if self.list_style(layout) == ListStyle::SortedCandidates {
                    out.sort();
                }
            }
            ListStyle::MatchedModules => {
                for t in tensors {
                    let m = module_of(&t.name);
                    let listed = excluded_by(patterns, m).is_some() || unquantized_candidate(t);
                    if listed && !out.iter().any(|x| x == m) {
                        out.push(m.to_string());
                    }
                }
            }
        }
        out
    }

    /// The list as the format writes it for the unquantized `modules`: Quark and
    /// compressed-tensors add each module's engine pattern ([`quark::engine_pattern`], a `re:`
    /// entry vLLM and SGLang match after renaming); ModelOpt writes the sorted names and those
    /// TensorRT-LLM gives them ([`modelopt::exclude_modules`]).
    pub fn written_list(self, modules: &[String]) -> Vec<String> {
        match self {
            Format::Quark | Format::CompressedTensors => {
                let mut v = modules.to_vec();
                v.extend(modules.iter().map(|m| quark::engine_pattern(m)));
                v
            }
            Format::Modelopt => modelopt::exclude_modules(modules),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `quant_method` names the format; ModelOpt's side file alone says ModelOpt; another
    /// method is given back; neither is no format.
    #[test]
    fn of_reads_the_method_then_the_side_file() {
        for f in Format::ALL {
            let q = json!({"quant_method": f.name()});
            assert_eq!(Format::of(Some(&q), false), Some(Ok(f)));
            assert_eq!(Format::of(Some(&q), true), Some(Ok(f)));
        }
        let fp4 = json!({"quant_method": "modelopt_fp4", "quant_algo": "NVFP4"});
        assert_eq!(Format::of(Some(&fp4), false), Some(Ok(Format::Modelopt)));
        let gptq = json!({"quant_method": "gptq"});
        assert_eq!(Format::of(Some(&gptq), true), Some(Err("gptq")));
        let none = json!({"bits": 4});
        assert_eq!(Format::of(Some(&none), true), Some(Ok(Format::Modelopt)));
        assert_eq!(Format::of(None, true), Some(Ok(Format::Modelopt)));
        assert_eq!(Format::of(Some(&none), false), None);
        assert_eq!(Format::of(None, false), None);
    }
}
