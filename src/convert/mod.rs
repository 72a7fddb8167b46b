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

pub mod block;
pub mod config;
pub mod layout;
pub mod names;
pub mod plan;
pub mod request;

use serde_json::{json, Value};

pub use config::{dflash_block_size, rename_quant_lists};
pub(crate) use config::{quantization_config_last, set};
pub use layout::DraftLayout;
pub use plan::{AuxOut, BlockOut, DraftsTarget, Options, Plan, Planned, Source, TrtllmYaml};
pub use request::{Conversion, Kind, Request};

use crate::checkpoint::{Checkpoint, Detection, Family};
use crate::error::{Error, Result};
use crate::io::Dtype;

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
    block::refuse_other_verb(ck, det, o.dflash)?;
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
    let input = names::Input {
        ck,
        det,
        target,
        o,
        taps,
    };
    let mut p = if o.dflash {
        names::plan_dflash(input)?
    } else {
        names::plan_eagle3(input)?
    };
    if o.engine == DraftLayout::Sglang {
        sglang_context(&mut p, target);
    }
    Ok(p)
}

/// Build the conversion plan of a DSpark or DFlash2 draft (`block::plan`; nothing is written).
pub fn plan_block(
    ck: &Checkpoint,
    det: &Detection,
    target: Option<&Checkpoint>,
    o: &Options,
    kind: crate::checkpoint::block::Kind,
) -> Result<Plan> {
    // The family first: a draft of another family has no taps to read.
    let taps = match det.family.block_kind() {
        Some(k) if k == kind => source_taps(ck, det, o)?,
        _ => None,
    };
    let mut p = block::plan(ck, det, target, o, (kind, taps))?;
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
    p.launch = match p.block {
        Some(b) => layout::block_launch_line(
            engine,
            (b.layout, b.block_size),
            &d,
            p.steps,
            p.context_length,
        ),
        None => layout::launch_line(engine, dflash, &d, p.steps, p.context_length),
    };
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
        "layout": p.block.map(|b| b.layout.id()),
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
                            hint: None,
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
                            hint: None,
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
