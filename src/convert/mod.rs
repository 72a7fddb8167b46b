//! `convert`: move an EAGLE-3 (Llama or MLA) or DFlash draft between the on-disk layouts of
//! SGLang, vLLM, TensorRT-LLM/ModelOpt, SpecForge, TorchSpec, the EAGLE reference and z-lab.
//!
//! The source is read as roles (layer tensors, fc, norms, vocab maps, embeddings) and written
//! with the target engine's names, config keys and aux-layer convention. Tensor bytes are
//! copied, never decoded, except the two small vocab maps when an engine wants another dtype.
//! Quantized drafts stay quantized: scales and zero-points move with their module, and the
//! quantization config's module lists are renamed. The facts, with the engine and trainer
//! sources they were read from: docs/formats.md; what the engines' own loaders make of the
//! results: docs/engines.md.

pub mod layout;
pub mod names;
pub mod request;

use serde_json::{json, Map, Value};

pub use layout::DraftLayout;
pub use request::{Conversion, Kind, Request};

use crate::checkpoint::{AuxConvention, Checkpoint, Detection, Dialect, Family};
use crate::error::{Error, Result};
use crate::io::Dtype;

/// What `convert` was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// `eagle3` (Llama or MLA) or `dflash`.
    pub dflash: bool,
    pub engine: DraftLayout,
    /// Override of the detected source dialect.
    pub from: Option<Dialect>,
    /// Aux-layer ids given on the command line (with `aux_convention`).
    pub aux_layers: Option<Vec<i64>>,
    /// The convention of the source ids (required when the files cannot say).
    pub aux_convention: Option<AuxConvention>,
    /// `model_type` for MLA drafts (default per engine).
    pub model_type: Option<String>,
    /// `--steps`: EAGLE-3 draft depths per round (default 3); DFlash tokens proposed per step
    /// (default and at most the draft's `block_size` − 1).
    pub steps: Option<usize>,
}

/// Where one output tensor's bytes come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A source tensor, copied byte for byte.
    Copy(String),
    /// The source `d2t` cast to another integer type (values unchanged).
    CastInt(String),
    /// `t2d` derived from the source `d2t`: `t2d[arange(Vd) + d2t] = true`, length `vocab`.
    T2dFromD2t { d2t: String, vocab: usize },
    /// A tensor of the target checkpoint, copied.
    Target(String),
    /// Rows of a target tensor (`lm_head` pruned to the draft vocab by `d2t`).
    TargetRows { name: String, d2t: String },
}

/// One tensor of the output.
#[derive(Debug, Clone)]
pub struct Planned {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub source: Source,
}

/// Aux-layer taps as written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuxOut {
    pub hidden_states: Vec<i64>,
    pub written: Vec<i64>,
    pub convention: AuxConvention,
    pub keys: Vec<String>,
}

/// Everything `convert` will write.
#[derive(Debug, Clone)]
pub struct Plan {
    pub tensors: Vec<Planned>,
    /// (source tensor, why it is not written).
    pub dropped: Vec<(String, String)>,
    pub config: Value,
    pub side_files: Vec<(String, Vec<u8>)>,
    pub aux: Option<AuxOut>,
    pub warnings: Vec<String>,
    /// Draft depths per round (EAGLE-3) or tokens proposed per step (DFlash), for the launch
    /// line and TensorRT-LLM's `max_draft_len`.
    pub steps: usize,
    /// TensorRT-LLM's options file, written by [`place`] once the output's path is known.
    pub trtllm: Option<TrtllmYaml>,
    /// Set by [`place`].
    pub launch: Option<String>,
    /// SGLang's `--context-length` for the launch line: the draft's context, when it is below
    /// the target's (SGLang refuses the pair otherwise; [`sglang_context_length`]).
    pub context_length: Option<u64>,
    /// The target the draft serves beside, when known, and what the engine's source says
    /// about serving the draft's family on it (set by [`serving_target`]).
    pub target: Option<DraftsTarget>,
}

/// The target a draft serves beside, and whether the engine written for runs the pair.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DraftsTarget {
    /// `architectures[0]` of the target.
    pub architecture: String,
    /// How it is known: `--target-checkpoint`, or the built-in profile the draft's shape
    /// matches.
    pub known_from: String,
    /// The engine's verdict where its source says something stands in the way.
    pub serving: Option<crate::engines::target::OnTarget>,
}

/// What goes into `extra-llm-api-config.yml` besides the draft's path and `max_draft_len`.
#[derive(Debug, Clone)]
pub struct TrtllmYaml {
    pub dflash: bool,
    /// EAGLE-3 `eagle3_layers_to_capture` (outputs of layer k).
    pub capture_output_of: Option<Vec<i64>>,
}

fn derr(ck: &Checkpoint, msg: String, hint: Option<&str>) -> Error {
    Error::Source {
        path: ck
            .weights
            .config_path
            .clone()
            .unwrap_or_else(|| ck.weights.dir.clone()),
        msg,
        hint: hint.map(Into::into),
    }
}

/// Aux taps of the source as HF `hidden_states` indices, or why they cannot be known.
fn source_taps(ck: &Checkpoint, det: &Detection, o: &Options) -> Result<Option<Vec<i64>>> {
    if let Some(ids) = &o.aux_layers {
        let conv = o.aux_convention.ok_or_else(|| Error::Flags {
            msg: "--aux-layers needs --aux-convention: kquant keeps taps as HF hidden_states indices".into(),
            hint: "add --aux-convention output-of-layer (id k = output of layer k = hidden_states[k+1]: SpecForge, TorchSpec, ModelOpt, TensorRT-LLM) or --aux-convention input-of-layer (id k = hidden_states[k]: vLLM, EAGLE)".into(),
        })?;
        return Ok(Some(ids.iter().map(|&k| conv.to_hidden_state(k)).collect()));
    }
    let Some(aux) = &det.aux_layers else {
        return Ok(None);
    };
    let conv = match (o.aux_convention, aux.convention) {
        (Some(c), _) => c,
        (None, Some(c)) => c,
        (None, None) => {
            return Err(derr(
                ck,
                format!("aux-layer ids {:?} (`{}`) have no known convention: {}", aux.ids, aux.key, aux.reason),
                Some("pass --aux-convention input-of-layer if an engine that reads ids raw (vLLM) made it, or output-of-layer if SpecForge/TorchSpec/ModelOpt did; Kimi-K2.x defaults are [1,29,57] output-of-layer = [2,30,58] input-of-layer"),
            ))
        }
    };
    Ok(Some(
        aux.ids.iter().map(|&k| conv.to_hidden_state(k)).collect(),
    ))
}

/// Build the conversion plan (nothing is written).
pub fn plan(
    ck: &Checkpoint,
    det: &Detection,
    target: Option<&Checkpoint>,
    o: &Options,
) -> Result<Plan> {
    let fam_ok = matches!(
        (&det.family, o.dflash),
        (Family::Eagle3 | Family::Eagle3Mla, false) | (Family::Dflash, true)
    );
    if !fam_ok {
        return Err(derr(
            ck,
            format!(
                "is a `{}` checkpoint, not {}",
                det.family.id(),
                if o.dflash {
                    "a DFlash drafter"
                } else {
                    "an EAGLE-3 draft"
                }
            ),
            Some(if o.dflash {
                "use `kquant convert eagle3` for EAGLE-3 drafts"
            } else {
                "use `kquant convert dflash` for DFlash drafters"
            }),
        ));
    }
    if (o.dflash && !o.engine.for_dflash()) || (!o.dflash && !o.engine.for_eagle3()) {
        return Err(Error::Flags {
            msg: format!(
                "--to {} does not take {} drafts",
                o.engine.id(),
                if o.dflash { "DFlash" } else { "EAGLE-3" }
            ),
            hint: format!(
                "`kquant convert {}` takes --to {}",
                if o.dflash { "dflash" } else { "eagle3" },
                DraftLayout::ids_for(o.dflash)
            ),
        });
    }
    let taps = source_taps(ck, det, o)?;
    let mut p = if o.dflash {
        names::plan_dflash(ck, det, target, o, taps)?
    } else {
        names::plan_eagle3(ck, det, target, o, taps)?
    };
    if o.engine == DraftLayout::Sglang {
        sglang_context(&mut p, target);
    }
    Ok(p)
}

/// Name the draft's target (`crate::target::shape::identify`: the `--target-checkpoint`'s
/// architecture, else the built-in profile its shape matches) and warn where the engine
/// written for cannot serve the draft's family beside it (`crate::engines::target::on_target`):
/// the draft's layout is the same whatever the target, so the files are right either way, but
/// the engine may not run the pair.
pub fn serving_target(
    p: &mut Plan,
    ck: &Checkpoint,
    det: &Detection,
    target: Option<&Checkpoint>,
    known: &[crate::target::Profile],
    engine: DraftLayout,
) {
    use crate::engines::target::{on_target, Serves};
    use crate::target::shape::identify;
    let Some(named) = identify(ck, det, target, known) else {
        return;
    };
    let (architecture, known_from) = (named.architecture, named.known_from);
    let serving = engine
        .serving()
        .and_then(|e| on_target(&det.family, &architecture, e));
    if let Some(v) = &serving {
        let (verb, only) = match v.serves {
            Serves::No => ("does not serve", ""),
            Serves::FromBuild => ("serves", " only from a recent build"),
        };
        p.warnings.push(format!(
            "{} {verb} a {} draft beside a {architecture} target{only} ({known_from}): {} (source: {}). The files are written as {} reads them",
            v.engine.name(),
            det.family.id(),
            v.why,
            v.source,
            v.engine.name()
        ));
    }
    p.target = Some(DraftsTarget {
        architecture,
        known_from,
        serving,
    });
}

/// The context length SGLang derives from a config (`get_context_length` in
/// `sglang/srt/utils/hf_transformers/common.py`, 0.5.23): the first of `max_sequence_length`,
/// `seq_length`, `max_seq_len`, `model_max_length`, `max_position_embeddings` in the text
/// config, times `rope_scaling.factor` unless the scaling names `original_max_position_embeddings`
/// or is `llama3`; 2048 when none is set.
pub fn sglang_context_length(cfg: &Value) -> u64 {
    let text = cfg
        .get("text_config")
        .filter(|t| t.is_object())
        .unwrap_or(cfg);
    let factor = match text.get("rope_scaling").filter(|r| r.is_object()) {
        Some(r)
            if r.get("original_max_position_embeddings").is_none()
                && r.get("rope_type").and_then(Value::as_str) != Some("llama3") =>
        {
            r.get("factor").and_then(Value::as_f64).unwrap_or(1.0)
        }
        _ => 1.0,
    };
    [
        "max_sequence_length",
        "seq_length",
        "max_seq_len",
        "model_max_length",
        "max_position_embeddings",
    ]
    .iter()
    .find_map(|k| text.get(*k).and_then(Value::as_f64))
    .map_or(2048, |v| (factor * v).max(0.0) as u64)
}

/// SGLang serves a draft only up to the target's context: given a shorter one it raises
/// "Target model's context_length (T) is greater than the derived context_length (D)" unless
/// `--context-length` caps the server at D or `SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1`
/// stretches the draft (`ModelConfig._derive_context_length`). With the target known, the
/// launch line carries the cap; without it, a warning says what to check.
fn sglang_context(p: &mut Plan, target: Option<&Checkpoint>) {
    let draft = sglang_context_length(&p.config);
    let target_cfg = target
        .and_then(|t| t.config.as_ref())
        .map(|c| Value::Object(c.root.clone()));
    match target_cfg.map(|c| sglang_context_length(&c)) {
        Some(t) if draft < t => {
            p.context_length = Some(draft);
            p.warnings.push(format!(
                "SGLang refuses a draft whose context ({draft}) is below the target's ({t}): the launch line caps the server with --context-length {draft}; to serve the target's whole context instead, set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 (the draft then runs at positions past its own max_position_embeddings)"
            ));
        }
        Some(_) => {}
        None => p.warnings.push(format!(
            "SGLang refuses a draft whose context ({draft}) is below the target's: pass --target-checkpoint to have the launch line checked, or launch with --context-length {draft} when the target's is longer"
        )),
    }
}

/// Rename module names in a quantization config's module lists (Quark `exclude`,
/// compressed-tensors `ignore`, ModelOpt `exclude_modules`); `re:` entries are kept.
///
/// A ModelOpt list exactly as `quantize --format modelopt` writes it (the module names, then
/// the names TensorRT-LLM gives them: `crate::quant::modelopt::exclude_modules`) is written
/// again from the renamed module names, so that it is the list `quantize` writes for the
/// converted draft; any other list is renamed entry by entry.
pub fn rename_quant_lists(q: &mut Value, rename: &dyn Fn(&str) -> String) {
    match q {
        Value::Object(m) => {
            for (k, v) in m.iter_mut() {
                if matches!(
                    k.as_str(),
                    "exclude" | "ignore" | "exclude_modules" | "modules_to_not_convert"
                ) {
                    if let Value::Array(a) = v {
                        if let Some(again) = modelopt_list_renamed(a, rename) {
                            *a = again;
                            continue;
                        }
                        for e in a.iter_mut() {
                            if let Some(s) = e.as_str().filter(|s| !s.starts_with("re:")) {
                                *e = Value::String(rename(s));
                            }
                        }
                    }
                } else {
                    rename_quant_lists(v, rename);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|v| rename_quant_lists(v, rename)),
        _ => {}
    }
}

/// A list `quantize --format modelopt` wrote, written again for the renamed modules (`None`
/// for any other list).
fn modelopt_list_renamed(a: &[Value], rename: &dyn Fn(&str) -> String) -> Option<Vec<Value>> {
    use crate::quant::modelopt::exclude_modules;
    let names: Vec<String> = a
        .iter()
        .map(|e| e.as_str().map(String::from))
        .collect::<Option<_>>()?;
    // The module names: what TensorRT-LLM's names are derived from (they start with `model.`,
    // which no draft module kquant writes does).
    let modules: Vec<String> = names
        .iter()
        .filter(|n| !n.starts_with("model."))
        .cloned()
        .collect();
    if modules.len() == names.len() || exclude_modules(&modules) != names {
        return None;
    }
    let renamed: Vec<String> = modules.iter().map(|n| rename(n)).collect();
    Some(
        exclude_modules(&renamed)
            .into_iter()
            .map(Value::from)
            .collect(),
    )
}

/// Set `obj[key] = v`, creating `obj` as an object if needed.
pub(crate) fn set(obj: &mut Value, key: &str, v: Value) {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    obj.as_object_mut().unwrap().insert(key.into(), v);
}

/// Put `quantization_config` after every other key, where `quantize` appends it, so that
/// `config.json` has the same bytes whether a draft was quantized before or after converting.
pub(crate) fn quantization_config_last(cfg: &mut Value) {
    if let Some(m) = cfg.as_object_mut() {
        if let Some(q) = m.shift_remove("quantization_config") {
            m.insert("quantization_config".into(), q);
        }
    }
}

/// The block size of a DFlash config: `dflash_config.block_size`, else top-level `block_size`
/// (SGLang's order; z-lab's own drafts write the top-level key).
pub fn dflash_block_size(cfg: &Value) -> Option<u64> {
    cfg.pointer("/dflash_config/block_size")
        .and_then(Value::as_u64)
        .or_else(|| cfg.get("block_size").and_then(Value::as_u64))
}

/// `s` as a YAML scalar: plain when it is made of characters that cannot start or end one
/// badly, else double-quoted (a JSON string is a YAML double-quoted scalar).
fn yaml_str(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+".contains(&b));
    if plain {
        s.to_string()
    } else {
        serde_json::to_string(s).expect("JSON string")
    }
}

/// The TensorRT-LLM `extra_llm_api_options` YAML for the draft in `draft_dir` (absolute).
pub fn trtllm_yaml(draft_dir: &str, steps: usize, spec: &TrtllmYaml) -> String {
    // One comment line, whatever the path holds.
    let launch = layout::launch_line(DraftLayout::Trtllm, spec.dflash, draft_dir, steps, None)
        .expect("a TensorRT-LLM launch line")
        .replace('\n', "\\n")
        .replace('\r', "\\r");
    let mut y = format!("# Written by kquant convert --to trtllm. Serve with:\n#   {launch}\n");
    // The release the fields are for, named in the file a user deploys.
    y.push_str(if spec.dflash {
        "# For TensorRT-LLM's PyTorch backend with its DFlash drafter (NVIDIA/TensorRT-LLM#12794,\n\
         # April 2026; tensorrt_llm/_torch/models/modeling_dflash.py).\n"
    } else {
        "# For TensorRT-LLM's PyTorch backend: `decoding_type: Eagle` and `speculative_model_dir`,\n\
         # as nvidia/Kimi-K2.6-Eagle3's model card deploys it. Releases with NVIDIA/TensorRT-LLM#10124\n\
         # (December 2025) also read `decoding_type: Eagle3` and `speculative_model` for the same\n\
         # draft (tensorrt_llm/llmapi/llm_args.py@fcd3f31 reads both spellings).\n"
    });
    y.push_str("speculative_config:\n");
    if spec.dflash {
        // z-lab DFlash (NVIDIA/TensorRT-LLM#12794): taps and mask token from the draft's
        // dflash_config; max_draft_len = tokens proposed per step (block_size - 1).
        y.push_str(&format!(
            "  decoding_type: DFlash\n  max_draft_len: {steps}\n  speculative_model_dir: {}\n",
            yaml_str(draft_dir)
        ));
        return y;
    }
    y.push_str(&format!(
        "  decoding_type: Eagle\n  max_draft_len: {steps}\n  speculative_model_dir: {}\n  eagle3_one_model: true\n  eagle3_model_arch: llama3\n",
        yaml_str(draft_dir)
    ));
    if let Some(ids) = &spec.capture_output_of {
        y.push_str(&format!(
            "  eagle3_layers_to_capture: [{}]\n",
            ids.iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    y
}

/// Where the output will be: `dir`, the absolute path it will have under its final name.
/// Writes TensorRT-LLM's options file into the plan and sets the launch line.
pub fn place(p: &mut Plan, engine: DraftLayout, dflash: bool, dir: &std::path::Path) {
    let d = dir.to_string_lossy();
    if let Some(spec) = &p.trtllm {
        p.side_files.push((
            layout::TRTLLM_YAML.into(),
            trtllm_yaml(&d, p.steps, spec).into_bytes(),
        ));
    }
    p.launch = layout::launch_line(engine, dflash, &d, p.steps, p.context_length);
}

/// The `extra-llm-api-config.yml` that `convert --to trtllm` would write for the same draft at
/// `draft_dir`, read back from one it wrote for another directory (same `max_draft_len`, decoding
/// type and taps); `None` when `yaml` is not kquant's or does not parse. `quantize` uses it so
/// that a quantized TensorRT-LLM draft keeps a config that points at itself.
pub fn retarget_trtllm_yaml(yaml: &str, draft_dir: &str) -> Option<String> {
    if !yaml.starts_with("# Written by kquant convert --to trtllm.") {
        return None;
    }
    let field = |key: &str| {
        yaml.lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .map(str::trim)
    };
    let steps: usize = field("max_draft_len:")?.parse().ok()?;
    let dflash = match field("decoding_type:")? {
        "DFlash" => true,
        "Eagle" | "Eagle3" => false,
        _ => return None,
    };
    let capture_output_of = match field("eagle3_layers_to_capture:") {
        None => None,
        Some(v) => Some(
            v.strip_prefix('[')?
                .strip_suffix(']')?
                .split(',')
                .map(|x| x.trim().parse::<i64>().ok())
                .collect::<Option<Vec<_>>>()?,
        ),
    };
    (steps >= 1).then(|| {
        trtllm_yaml(
            draft_dir,
            steps,
            &TrtllmYaml {
                dflash,
                capture_output_of,
            },
        )
    })
}

/// The absolute path `out` will have: its parent canonicalized (symbolic links and `..`
/// resolved), joined with its name.
pub fn final_dir(out: &std::path::Path) -> std::path::PathBuf {
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    match (std::fs::canonicalize(parent), out.file_name()) {
        (Ok(p), Some(n)) => p.join(n),
        _ => std::path::absolute(out).unwrap_or_else(|_| out.to_path_buf()),
    }
}

/// JSON of a plan for `--dry-run --json` and the result.
pub fn plan_json(p: &Plan) -> Value {
    json!({
        "tensors": p.tensors.iter().map(|t| json!({
            "name": t.name, "dtype": t.dtype.name(), "shape": t.shape,
            "from": match &t.source {
                Source::Copy(n) => json!({"copy": n}),
                Source::CastInt(n) => json!({"cast": n}),
                Source::T2dFromD2t { d2t, vocab } => json!({"t2d_from_d2t": d2t, "vocab": vocab}),
                Source::Target(n) => json!({"target": n}),
                Source::TargetRows { name, d2t } => json!({"target_rows": name, "by": d2t}),
            }})).collect::<Vec<_>>(),
        "dropped": p.dropped.iter().map(|(n, why)| json!({"name": n, "why": why})).collect::<Vec<_>>(),
        "aux_layers": p.aux,
        "warnings": p.warnings,
        "launch": p.launch,
        "context_length": p.context_length,
        "target": p.target,
        "side_files": p.side_files.iter().map(|(n, _)| n).collect::<Vec<_>>(),
    })
}

/// Write a plan: every tensor streamed from the source (or target) into the writer.
pub fn write(
    ck: &Checkpoint,
    target: Option<&Checkpoint>,
    p: &Plan,
    out: &std::path::Path,
    opts: crate::io::writer::WriteOptions,
    progress: &indicatif::ProgressBar,
) -> Result<crate::io::writer::WriteSummary> {
    use crate::io::writer::{TensorSpec, Writer};
    let specs = p
        .tensors
        .iter()
        .map(|t| TensorSpec::new(t.name.clone(), t.dtype, t.shape.clone()))
        .collect();
    let mut w = Writer::create(out, specs, opts)?;
    let by: std::collections::HashMap<&str, &Planned> =
        p.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    for name in w.order().into_iter().map(String::from).collect::<Vec<_>>() {
        let t = by[name.as_str()];
        match &t.source {
            Source::Copy(n) | Source::Target(n) => {
                let c = if matches!(t.source, Source::Target(_)) {
                    target.expect("planned with a target")
                } else {
                    ck
                };
                let v = src_of(c, n)?;
                let shard = c.weights.shard_of(n).expect("routed");
                w.copy_tensor(&name, shard, v.info, |k| progress.inc(k))?;
            }
            Source::CastInt(n) => {
                let vals = int_values(&src_of(ck, n)?);
                let bytes: Vec<u8> = match t.dtype {
                    Dtype::I32 => vals
                        .iter()
                        .flat_map(|&x| (x as i32).to_le_bytes())
                        .collect(),
                    _ => vals.iter().flat_map(|&x| x.to_le_bytes()).collect(),
                };
                w.write(&name, &bytes)?;
            }
            Source::T2dFromD2t { d2t, vocab } => {
                let offs = int_values(&src_of(ck, d2t)?);
                let mut mask = vec![0u8; *vocab];
                for (i, o) in offs.iter().enumerate() {
                    let id = i as i64 + o;
                    if id < 0 || id as usize >= *vocab {
                        return Err(Error::Tensor {
                            path: ck.weights.dir.clone(),
                            tensor: d2t.clone(),
                            msg: format!(
                                "entry {i} maps to target id {id}, outside the vocab of {vocab}"
                            ),
                        });
                    }
                    mask[id as usize] = 1;
                }
                w.write(&name, &mask)?;
            }
            Source::TargetRows { name: tn, d2t } => {
                let tgt = target.expect("planned with a target");
                let v = src_of(tgt, tn)?;
                let offs = int_values(&src_of(ck, d2t)?);
                let row = v.data.len() / v.shape()[0];
                for (i, o) in offs.iter().enumerate() {
                    let id = (i as i64 + o) as usize;
                    let r = v
                        .data
                        .get(id * row..(id + 1) * row)
                        .ok_or_else(|| Error::Tensor {
                            path: ck.weights.dir.clone(),
                            tensor: d2t.clone(),
                            msg: format!("entry {i} maps to target row {id}, outside `{tn}`"),
                        })?;
                    w.write_part(&name, r)?;
                }
                w.end_tensor(&name)?;
            }
        }
    }
    // As `quantize`, `dequantize` and `synth` write it (no final newline).
    let cfg = serde_json::to_vec_pretty(&p.config).expect("config JSON");
    w.add_file("config.json", &cfg)?;
    for (n, b) in &p.side_files {
        w.add_file(n, b)?;
    }
    w.finish()
}

/// Integer tensor values (d2t) as i64.
fn int_values(v: &crate::io::TensorView<'_>) -> Vec<i64> {
    match v.dtype() {
        Dtype::I64 => v
            .data
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        Dtype::I32 => v
            .data
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        _ => v.to_f32().iter().map(|&x| x as i64).collect(),
    }
}

fn src_of<'a>(c: &'a Checkpoint, n: &str) -> Result<crate::io::TensorView<'a>> {
    c.weights
        .tensor(n)
        .ok_or_else(|| Error::Usage(format!("tensor `{n}` vanished")))
}

#[cfg(test)]
mod tests {
    use super::sglang_context_length as ctx;
    use serde_json::json;

    /// SGLang 0.5.23's `get_context_length`, case by case.
    #[test]
    fn sglang_context_length_follows_sglang() {
        assert_eq!(ctx(&json!({})), 2048);
        assert_eq!(ctx(&json!({"max_position_embeddings": 4096})), 4096);
        // The first key of SGLang's list wins.
        assert_eq!(
            ctx(&json!({"max_position_embeddings": 4096, "seq_length": 8192})),
            8192
        );
        // A plain factor multiplies; yarn with its original length (Kimi-K2.x) and llama3 do not.
        assert_eq!(
            ctx(
                &json!({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 4.0}})
            ),
            16384
        );
        assert_eq!(
            ctx(
                &json!({"max_position_embeddings": 262144, "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096}})
            ),
            262144
        );
        assert_eq!(
            ctx(
                &json!({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
            ),
            131072
        );
        // A multimodal config: the text config's.
        assert_eq!(
            ctx(
                &json!({"max_position_embeddings": 1, "text_config": {"max_position_embeddings": 262144}})
            ),
            262144
        );
    }
}
