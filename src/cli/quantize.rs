//! `kquant quantize SRC -o OUT [--scheme …] [--format quark|compressed-tensors|modelopt]
//! [--exclude PATTERNS] [--input-amax FILE]`: plan (which tensors, why not the others) → for
//! schemes with a per-tensor scale shared by fused siblings (NVFP4), a pre-pass over the weights
//! ([`Target::prepare`]) → quantize per tensor with the chosen format's own recipe → stream into
//! the writer.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{json, Value};

use crate::checkpoint::Checkpoint;
use crate::checkpoint::Family;
use crate::cli::{command_line, human_bytes, progress};
use crate::error::{Error, Result};
use crate::escape::printable;
use crate::io::writer::{parse_size, TensorSpec, WriteOptions, Writer};
use crate::io::TensorInfo;
use crate::quant::exclude::{excluded_by, module_of, not_candidate, parse_patterns};
use crate::quant::fused::{self, Prepass};
use crate::quant::input_amax::InputAmax;
use crate::quant::registry::{self, Format, QuarkFlags, SCHEMES};
use crate::quant::rowwise;
use crate::quant::target::{ExcludeStyle, Target};
use crate::quant::{preset, quark, schedule};

/// Arguments of `kquant quantize`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Source checkpoint: directory, `.safetensors` file or hub id.
    pub src: String,
    /// Output directory (built beside it, renamed into place when complete).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Quantization scheme (`kquant schemes` lists them and where each loads); default int4-pc,
    /// or the preset's with `--config`.
    #[arg(long, value_parser = scheme_parser())]
    pub scheme: Option<String>,
    /// Output format. Default quark.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// A preset: a name from quant-configs/ (built in) or a JSON file. Flags override it.
    #[arg(long)]
    pub config: Option<String>,
    /// Comma-separated patterns (Python fnmatch on the module name = tensor name without
    /// `.weight`, as Quark matches them; for both formats). Embeddings, norms, 1-D tensors and
    /// d2t/t2d are never quantized.
    /// (Default `lm_head`, or the preset's list.)
    #[arg(long)]
    pub exclude: Option<String>,
    /// Quark path to reproduce: `model` (reorder nibbles + zero-point; the default) or
    /// `file2file` (per-channel only). `--format quark` only.
    #[arg(long, value_enum)]
    pub quark_layout: Option<quark::Layout>,
    /// Quark release whose output to reproduce (default 0.13). `--format quark` only.
    #[arg(long, value_enum)]
    pub quark_version: Option<quark::Version>,
    /// Model path only: pack nibbles in sequential order (Quark `pack_method="order"`).
    #[arg(long)]
    pub quark_sequential: bool,
    /// Calibrated input amax per module (JSON `{"schema": "kquant.input-amax/1", "amax":
    /// {MODULE: AMAX}}`), required by `--scheme nvfp4` (W4A4) for its static input scales.
    #[arg(long, value_name = "FILE")]
    pub input_amax: Option<PathBuf>,
    /// Split the output into shards of at most this size (e.g. `5GB`).
    #[arg(long, value_parser = parse_size)]
    pub max_shard_size: Option<u64>,
    /// Replace an existing output.
    #[arg(long)]
    pub force: bool,
    /// Record the sha256 of every input file in the output's manifest, however large
    /// (inputs over 64 MiB are otherwise recorded by path and size only).
    #[arg(long)]
    pub hash_inputs: bool,
    /// Print the per-tensor plan and sizes; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the plan / result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// What happens to one source tensor.
#[derive(Debug, Clone)]
enum Action {
    Quantize {
        module: String,
        rows: usize,
        cols: usize,
    },
    Copy {
        reason: String,
    },
}

pub fn run(a: Args) -> Result<ExitCode> {
    let ck = Checkpoint::open(&a.src)?;
    let det = ck.detect()?;
    let cfg_path = ck
        .weights
        .config_path
        .clone()
        .unwrap_or_else(|| ck.weights.dir.clone());
    if det.quantization.quantized {
        return Err(Error::Source {
            path: cfg_path,
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
    let preset = a.config.as_deref().map(preset::load).transpose()?;
    if let Some(p) = &preset {
        if !p.family.is_empty() && !p.family.iter().any(|f| f == det.family.id()) {
            let fitting: Vec<&str> = preset::BUILTIN
                .iter()
                .map(|(n, _)| *n)
                .filter(|n| {
                    preset::load(n).is_ok_and(|o| o.family.iter().any(|f| f == det.family.id()))
                })
                .collect();
            return Err(Error::Flags {
                msg: format!(
                    "preset `{}` is for {} drafts, but `{}` is {}",
                    a.config.as_deref().unwrap_or(""),
                    p.family.join("/"),
                    a.src,
                    det.family.id()
                ),
                hint: if fitting.is_empty() {
                    format!(
                        "no built-in preset is for {} drafts: pass --scheme/--format/--exclude instead",
                        det.family.id()
                    )
                } else {
                    format!(
                        "presets for {} drafts: {}",
                        det.family.id(),
                        fitting.join(", ")
                    )
                },
            });
        }
    }
    let scheme = a
        .scheme
        .clone()
        .or_else(|| preset.as_ref().map(|p| p.scheme.clone()))
        .unwrap_or_else(|| "int4-pc".into());
    let format = a
        .format
        .or(preset.as_ref().map(|p| p.format))
        .unwrap_or(Format::Quark);
    let patterns = match (&a.exclude, &preset) {
        (Some(e), _) => parse_patterns(e),
        (None, Some(p)) => p.exclude.clone(),
        (None, None) => vec!["lm_head".to_string()],
    };
    // A preset's Quark settings apply only when the output is Quark.
    let qp = preset.as_ref().filter(|_| format == Format::Quark);
    let flags = QuarkFlags {
        layout: a.quark_layout.or(qp.and_then(|p| p.quark_layout)),
        version: a.quark_version.or(qp.and_then(|p| p.quark_version)),
        sequential: a.quark_sequential || qp.is_some_and(|p| p.quark_sequential),
    };
    let input_amax = a.input_amax.as_deref().map(InputAmax::load).transpose()?;
    let mut target = registry::build(&scheme, format, flags, input_amax)?;

    // Plan.
    let mut plan: Vec<(&TensorInfo, Action)> = Vec::new();
    let mut excluded_modules: Vec<String> = Vec::new();
    let mut file_order: Vec<&TensorInfo> = ck.weights.infos().collect();
    file_order.sort_by_key(|t| (t.start, t.name.clone()));
    for t in ck.weights.infos() {
        let module = module_of(&t.name).to_string();
        let action = match (not_candidate(t), excluded_by(&patterns, &module)) {
            (Some(why), Some(p)) => Action::Copy {
                reason: format!("{why}; matches `{p}`"),
            },
            (Some(why), None) => Action::Copy { reason: why.into() },
            (None, Some(p)) => Action::Copy {
                reason: format!("excluded by `{p}`"),
            },
            (None, None) if t.shape.contains(&0) => Action::Copy {
                reason: "empty".into(),
            },
            (None, None) => Action::Quantize {
                module,
                rows: t.shape[0],
                cols: t.shape[1],
            },
        };
        plan.push((t, action));
    }
    check_shapes(&ck, &plan, target.as_ref(), &scheme)?;
    if target.shares_fused_scales() {
        let prepass = prepass(&ck, &plan, &scheme, a.dry_run)?;
        target.prepare(&prepass)?;
    }
    // The config lists the concrete excluded module names. Quark: every matched module (model
    // path) or only matched Linear candidates, sorted (file2file). compressed-tensors: the
    // Linear modules left unquantized (its `ignore`, in module order).
    let quantized: HashSet<&str> = plan
        .iter()
        .filter(|(_, act)| matches!(act, Action::Quantize { .. }))
        .map(|(t, _)| t.name.as_str())
        .collect();
    let unquantized_candidate =
        |t: &TensorInfo| not_candidate(t).is_none() && !quantized.contains(t.name.as_str());
    match target.exclude_style() {
        ExcludeStyle::SortedCandidates | ExcludeStyle::Candidates => {
            for t in &file_order {
                if unquantized_candidate(t) {
                    excluded_modules.push(module_of(&t.name).to_string());
                }
            }
            if target.exclude_style() == ExcludeStyle::SortedCandidates {
                excluded_modules.sort();
            }
        }
        ExcludeStyle::MatchedModules => {
            for t in &file_order {
                let m = module_of(&t.name);
                let listed = excluded_by(&patterns, m).is_some() || unquantized_candidate(t);
                if listed && !excluded_modules.iter().any(|x| x == m) {
                    excluded_modules.push(m.to_string());
                }
            }
        }
    }
    let mut exclude: Vec<String> = excluded_modules.clone();
    exclude.extend(excluded_modules.iter().map(|m| quark::engine_pattern(m)));

    // Output tensors.
    let mut specs: Vec<TensorSpec> = Vec::new();
    let mut producer: HashMap<String, usize> = HashMap::new();
    for (i, (t, act)) in plan.iter().enumerate() {
        let out = match act {
            Action::Copy { .. } => vec![TensorSpec::new(t.name.clone(), t.dtype, t.shape.clone())],
            Action::Quantize { module, rows, cols } => target.specs(module, *rows, *cols, t.dtype),
        };
        for s in out {
            producer.insert(s.name.clone(), i);
            specs.push(s);
        }
    }
    let before: u64 = plan.iter().map(|(t, _)| t.nbytes()).sum();
    let after: u64 = specs.iter().map(TensorSpec::nbytes).sum();
    let n_q = plan
        .iter()
        .filter(|(_, a)| matches!(a, Action::Quantize { .. }))
        .count();

    if a.dry_run {
        if a.json {
            let doc = json!({
                "schema": "kquant.quantize-plan/1",
                "scheme": scheme, "format": format.name(),
                "tensors": plan.iter().map(|(t, act)| match act {
                    Action::Quantize { .. } => json!({"name": t.name, "action": "quantize", "scheme": scheme, "bytes_before": t.nbytes(),
                        "bytes_after": specs.iter().filter(|s| producer[&s.name] == plan.iter().position(|(x, _)| x.name == t.name).unwrap()).map(TensorSpec::nbytes).sum::<u64>()}),
                    Action::Copy { reason } => json!({"name": t.name, "action": "excluded", "reason": reason, "bytes_before": t.nbytes(), "bytes_after": t.nbytes()}),
                }).collect::<Vec<_>>(),
                "exclude": written_exclude(target.as_ref(), &exclude), "bytes_before": before, "bytes_after": after,
            });
            println!("{}", serde_json::to_string_pretty(&doc).expect("JSON"));
        } else {
            for (i, (t, act)) in plan.iter().enumerate() {
                let out: u64 = specs
                    .iter()
                    .filter(|s| producer[&s.name] == i)
                    .map(TensorSpec::nbytes)
                    .sum();
                let what = match act {
                    Action::Quantize { .. } => scheme.to_string(),
                    Action::Copy { reason } => format!("excluded ({reason})"),
                };
                // Names and patterns are escaped for the terminal (crate::escape).
                println!(
                    "{:<48} {:<40} {:>12} -> {:>12}",
                    printable(&t.name),
                    printable(&what),
                    human_bytes(t.nbytes()),
                    human_bytes(out)
                );
            }
            println!(
                "{n_q} tensors quantized; total {} -> {}",
                human_bytes(before),
                human_bytes(after)
            );
            println!(
                "quantization_config.{}: {}",
                target.exclude_key(),
                printable(&written_exclude(target.as_ref(), &exclude).to_string())
            );
        }
        return Ok(ExitCode::SUCCESS);
    }

    let mut inputs: Vec<PathBuf> = ck.weights.files().iter().map(|p| p.to_path_buf()).collect();
    inputs.extend(ck.weights.config_path.clone());
    let wopts = WriteOptions {
        max_shard_size: a.max_shard_size,
        force: a.force,
        command: command_line(),
        inputs,
        hash_inputs: a.hash_inputs,
        ..Default::default()
    };
    let sizes: HashMap<String, u64> = specs.iter().map(|s| (s.name.clone(), s.nbytes())).collect();
    let mut w = Writer::create(&a.output, specs, wopts)?;
    // Warned once the output is claimed: a refused output is one `error:`, not a page of
    // engine notes before it.
    let advice = target.advice();
    let mut warnings = Vec::new();
    if let Some(w) = crate::engines::quantized::unloadable_warning(
        format,
        &scheme,
        &det.family,
        advice.as_deref(),
    ) {
        // One line per engine: each escaped on its own (crate::escape).
        for (i, line) in w.lines().enumerate() {
            let head = if i == 0 { "warning: " } else { "" };
            eprintln!("{head}{}", printable(line));
        }
        warnings.push(w);
    }
    if det.family == Family::Target {
        let w = format!(
            "`{}` is not a draft (family {}): kquant's engine claims, presets, convert and verify are for EAGLE-3 and DFlash drafts",
            a.src,
            det.family.id()
        );
        eprintln!("warning: {}", printable(&w));
        warnings.push(w);
    }
    let order: Vec<String> = w.order().into_iter().map(String::from).collect();
    let pb = progress(before, "quantize");
    // The encodings, in the order the writer needs them (a module again where keeping its later
    // tensors would pass the memory budget): a producer thread runs them one ahead while this
    // thread copies the unchanged tensors, so encoding overlaps the I/O and hashing.
    let jobs = schedule::plan(
        &order,
        |n| {
            let i = producer[n];
            matches!(plan[i].1, Action::Quantize { .. }).then_some(i)
        },
        |n| sizes[n],
        pending_budget(&plan, &producer, &sizes),
    );
    let modules: Vec<usize> = jobs.iter().map(|j| j.module).collect();
    let encode = |i: usize, wf: &mut Vec<f32>| -> Result<Vec<(String, Vec<u8>)>> {
        let (t, act) = &plan[i];
        let Action::Quantize { module, rows, cols } = act else {
            unreachable!("only quantized modules are encoded")
        };
        let shard = ck.weights.shard_of(&t.name).expect("routed");
        let raw = shard.view(t).data;
        if let Some(r) = target.encode_raw(module, raw, *rows, *cols, t.dtype) {
            // The target's fused path: row by row from the mapped bytes.
            shard.release(t);
            return r.map_err(|i| {
                let esz = t.dtype.size();
                let mut v = Vec::new();
                crate::io::dtype::to_f32(t.dtype, &raw[i * esz..(i + 1) * esz], &mut v);
                non_finite(shard.path(), &t.name, i, *cols, v[0])
            });
        }
        // Peak memory per tensor: its f32 copy (one buffer reused for every tensor) plus the
        // encoded output; the mapped input pages are dropped as soon as they are converted.
        shard.view(t).to_f32_par_into(wf);
        shard.release(t);
        check_finite(wf, *cols, shard.path(), &t.name)?;
        Ok(target.encode(module, wf, *rows, *cols, t.dtype))
    };
    std::thread::scope(|sc| -> Result<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let encode = &encode;
        sc.spawn(move || {
            let mut wf = Vec::new();
            for i in modules {
                if tx.send((i, encode(i, &mut wf))).is_err() {
                    break;
                }
            }
        });
        let mut pending: HashMap<String, Vec<u8>> = HashMap::new();
        let mut jobs = jobs.into_iter();
        for name in order {
            if let Some(bytes) = pending.remove(&name) {
                w.write(&name, &bytes)?;
                continue;
            }
            let i = producer[&name];
            let (t, act) = &plan[i];
            match act {
                Action::Copy { .. } => {
                    // Read into the writer's blocks, never mapped: a multi-GB embedding never
                    // sits in this process's RSS.
                    let shard = ck.weights.shard_of(&t.name).expect("routed");
                    w.copy_tensor(&name, shard, t, |k| pb.inc(k))?;
                }
                Action::Quantize { .. } => {
                    let job = jobs.next().expect("a job for every encoded tensor");
                    let (j, encoded) = rx.recv().expect("the encoder sends every job");
                    debug_assert!(j == i && job.module == i && job.now == name);
                    for (n, bytes) in encoded? {
                        if n == name {
                            w.write(&n, &bytes)?;
                        } else if job.keep.contains(&n) {
                            pending.insert(n, bytes);
                        }
                    }
                    if job.first {
                        pb.inc(t.nbytes());
                    }
                }
            }
        }
        Ok(())
    })?;
    pb.finish_and_clear();
    let mut config = match &ck.config {
        Some(c) => Value::Object(c.root.clone()),
        None => json!({}),
    };
    config["quantization_config"] = target.config(&exclude);
    w.add_file(
        "config.json",
        &serde_json::to_vec_pretty(&config).expect("config JSON"),
    )?;
    for (name, bytes) in target.side_files(&exclude) {
        w.add_file(&name, &bytes)?;
    }
    if let Some(note) = trtllm_config(&ck, &det.family, format, &scheme, &a.output, &mut w)? {
        eprintln!("warning: {}", printable(&note));
        warnings.push(note);
    }
    let s = w.finish()?;
    let next = next_steps(&det.family, format, &scheme, &s.dir, &a.src);
    if a.json {
        let doc = json!({"schema": "kquant.quantize/1", "output": s.dir, "scheme": scheme, "format": format.name(), "quantized": n_q, "bytes_before": before, "bytes_after": after, "files": s.files, "exclude": written_exclude(target.as_ref(), &exclude), "warnings": warnings, "next": next});
        println!("{}", serde_json::to_string_pretty(&doc).expect("JSON"));
    }
    eprintln!(
        "quantized {n_q} tensors ({}, {}): {} -> {} in {}",
        scheme,
        target.describe(),
        human_bytes(before),
        human_bytes(after),
        s.dir.display()
    );
    for n in &next {
        eprintln!("next: {}", printable(n));
    }
    Ok(ExitCode::SUCCESS)
}

/// A source laid out for TensorRT-LLM by `convert --to trtllm` carries an
/// `extra-llm-api-config.yml` whose `speculative_model_dir` is the source. The output gets its
/// own, pointing at itself (the same `max_draft_len`, decoding type and taps), when TensorRT-LLM
/// loads the result; otherwise none, and a warning (returned) says why. A YAML kquant did not
/// write is not copied either (it would point at the source), with a warning.
fn trtllm_config(
    ck: &Checkpoint,
    family: &Family,
    format: Format,
    scheme: &str,
    output: &std::path::Path,
    w: &mut Writer,
) -> Result<Option<String>> {
    use crate::convert::engine::TRTLLM_YAML;
    use crate::engines::{quantized, Engine, Loads};
    let path = ck.weights.dir.join(TRTLLM_YAML);
    if !path.is_file() {
        return Ok(None);
    }
    let yaml = std::fs::read_to_string(&path).map_err(|e| Error::io("read", &path, e))?;
    let loads = quantized::claim_for(format, scheme, Engine::Trtllm, family)
        .is_some_and(|c| c.loads == Loads::Yes);
    if !loads {
        return Ok(Some(format!(
            "{TRTLLM_YAML} of the source is not carried over: TensorRT-LLM does not load \
             --format {} --scheme {scheme} (`kquant schemes`)",
            format.name()
        )));
    }
    let dir = crate::convert::final_dir(output);
    match crate::convert::retarget_trtllm_yaml(&yaml, &dir.to_string_lossy()) {
        Some(y) => {
            w.add_file(TRTLLM_YAML, y.as_bytes())?;
            Ok(None)
        }
        None => {
            Ok(Some(format!(
            "{} was not written by kquant convert: not copied (its speculative_model_dir is the \
             source); `kquant convert {} {} --to trtllm` writes one for the output",
            path.display(),
            if *family == Family::Dflash { "dflash" } else { "eagle3" },
            output.display()
        )))
        }
    }
}

/// What a user does with a quantized draft next: the layout (and launch line) of each engine
/// that loads it (`convert --to`), and the accept-length gate (`verify`). None for a target.
fn next_steps(
    family: &Family,
    format: Format,
    scheme: &str,
    out: &std::path::Path,
    src: &str,
) -> Vec<String> {
    use crate::engines::{quantized, Engine, Loads};
    let kind = match family {
        Family::Eagle3 | Family::Eagle3Mla => "eagle3",
        Family::Dflash => "dflash",
        _ => return Vec::new(),
    };
    let out = out.display();
    let mut v = Vec::new();
    for e in Engine::ALL {
        if quantized::claim_for(format, scheme, e, family).is_some_and(|c| c.loads == Loads::Yes) {
            let extra = if e == Engine::Trtllm {
                " (writes extra-llm-api-config.yml and the trtllm-serve line)"
            } else {
                " (prints the launch line)"
            };
            v.push(format!(
                "kquant convert {kind} {out} --to {} -o {out}-{}{extra}",
                e.id(),
                e.id()
            ));
        }
    }
    v.push(format!(
        "kquant verify --target kimi-k2.5 --draft {out} --baseline {src} --trace TRACE (the accept-length gate; docs/verify.md)"
    ));
    v
}

/// Refuse any tensor the target cannot write (group size, ModelOpt's odd output rows), naming
/// the tensor and file, before anything is written.
fn check_shapes(
    ck: &Checkpoint,
    plan: &[(&TensorInfo, Action)],
    target: &dyn Target,
    scheme: &str,
) -> Result<()> {
    for (t, act) in plan {
        if let Action::Quantize { module, rows, cols } = act {
            if let Some(why) = target.refuse_shape(*rows, *cols) {
                let path = ck
                    .weights
                    .shard_of(&t.name)
                    .map(|sh| sh.path().to_path_buf())
                    .unwrap_or_else(|| ck.weights.dir.clone());
                return Err(Error::Tensor {
                    path,
                    tensor: t.name.clone(),
                    msg: format!(
                        "shape {:?} cannot be written as --scheme {scheme} ({}): {why}; add `{module}` to --exclude, or pick a scheme without that constraint (int4-pc has no group)",
                        t.shape,
                        target.describe()
                    ),
                });
            }
        }
    }
    Ok(())
}

/// The sibling-aware pre-pass of a target whose per-tensor scale fused siblings share: refuse
/// a fused family (q/k/v, gate/up, …) that is only partly quantized (the engines load it as one
/// Linear with one scale, and the reference tools refuse it too), then read each quantized
/// weight once for its amax (not on `--dry-run`).
fn prepass(
    ck: &Checkpoint,
    plan: &[(&TensorInfo, Action)],
    scheme: &str,
    dry_run: bool,
) -> Result<Prepass> {
    let candidates: Vec<&str> = plan
        .iter()
        .filter(|(t, _)| not_candidate(t).is_none())
        .map(|(t, _)| module_of(&t.name))
        .collect();
    let quantized: Vec<String> = plan
        .iter()
        .filter_map(|(_, act)| match act {
            Action::Quantize { module, .. } => Some(module.clone()),
            Action::Copy { .. } => None,
        })
        .collect();
    let qset: HashSet<&str> = quantized.iter().map(String::as_str).collect();
    let families = fused::families(candidates);
    if let Some((q, rest)) = fused::partial(&families, &qset) {
        return Err(Error::Flags {
            msg: format!(
                "--scheme {scheme} quantizes {} but not its fused sibling(s) {}: engines load them as one Linear with one per-tensor scale",
                q.join(", "),
                rest.join(", ")
            ),
            hint: format!(
                "exclude all of {} or none of them",
                q.iter().chain(&rest).copied().collect::<Vec<_>>().join(", ")
            ),
        });
    }
    let families: Vec<Vec<String>> = families
        .into_iter()
        .filter(|f| qset.contains(f[0].as_str()))
        .collect();
    let weight_amax = if dry_run {
        None
    } else {
        let mut m = std::collections::BTreeMap::new();
        for (t, act) in plan {
            if let Action::Quantize { module, cols, .. } = act {
                let shard = ck.weights.shard_of(&t.name).expect("routed");
                let wf = shard.view(t).to_f32_par();
                shard.release(t);
                check_finite(&wf, *cols, shard.path(), &t.name)?;
                m.insert(module.clone(), rowwise::amax(&wf));
            }
        }
        Some(m)
    };
    Ok(Prepass {
        quantized,
        families,
        weight_amax,
    })
}

/// The memory `quantize` aims to stay within (the target for the 6 GB draft).
const MEMORY_TARGET: u64 = 896 << 20;

/// Most bytes of encoded tensors held for the writer at once (see [`schedule`]): what is left
/// of [`MEMORY_TARGET`] after the encoder's f32 buffer (the largest weight) and three encoded
/// modules (the one being written, the one in the channel, the one being encoded).
fn pending_budget(
    plan: &[(&TensorInfo, Action)],
    producer: &HashMap<String, usize>,
    sizes: &HashMap<String, u64>,
) -> u64 {
    let mut f32_max = 0u64;
    let mut module_bytes: HashMap<usize, u64> = HashMap::new();
    for (n, &i) in producer {
        if let Action::Quantize { rows, cols, .. } = plan[i].1 {
            f32_max = f32_max.max((rows * cols * 4) as u64);
            *module_bytes.entry(i).or_default() += sizes[n];
        }
    }
    let enc_max = module_bytes.values().copied().max().unwrap_or(0);
    MEMORY_TARGET.saturating_sub(f32_max + 3 * enc_max)
}

fn check_finite(w: &[f32], cols: usize, path: &std::path::Path, name: &str) -> Result<()> {
    use rayon::prelude::*;
    // In parallel chunks; within a chunk, `first_non_finite`'s vectorised test.
    const CHUNK: usize = 1 << 16;
    let first = w
        .par_chunks(CHUNK)
        .enumerate()
        .find_map_first(|(k, c)| rowwise::first_non_finite(c).map(|j| k * CHUNK + j));
    match first {
        Some(i) => Err(non_finite(path, name, i, cols, w[i])),
        None => Ok(()),
    }
}

/// The refusal of a non-finite weight: flat index `i` of a `[_, cols]` tensor, value `v`.
fn non_finite(path: &std::path::Path, name: &str, i: usize, cols: usize, v: f32) -> Error {
    Error::Tensor {
        path: path.into(),
        tensor: name.into(),
        msg: format!(
            "row {} column {} is {v} — refusing to quantize non-finite weights",
            i / cols,
            i % cols,
        ),
    }
}

fn scheme_parser() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(SCHEMES.iter().map(|s| s.id))
}

/// The unquantized-module list as the target writes it into its config.
fn written_exclude(target: &dyn Target, exclude: &[String]) -> Value {
    let cfg = target.config(exclude);
    cfg.get(target.exclude_key())
        .cloned()
        .unwrap_or_else(|| json!(exclude))
}
