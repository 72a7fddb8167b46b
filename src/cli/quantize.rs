//! `kquant quantize SRC -o OUT --scheme int4-pc [--format quark] [--exclude PATTERNS]`:
//! plan (which tensors, why not the others) → quantize per tensor → stream into the writer.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{json, Value};

use crate::checkpoint::Checkpoint;
use crate::cli::{command_line, human_bytes, progress};
use crate::error::{Error, Result};
use crate::io::writer::{parse_size, TensorSpec, WriteOptions, Writer};
use crate::io::TensorInfo;
use crate::quant::exclude::{excluded_by, module_of, not_candidate, parse_patterns};
use crate::quant::pack::Order;
use crate::quant::{int4, quark};

/// Quantization schemes `quantize` can write today.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scheme {
    /// INT4 per-output-channel symmetric weights, 16-bit activations (Quark `int4_wo_per_channel`).
    #[value(name = "int4-pc")]
    Int4Pc,
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// AMD Quark `quantization_config` (quant_method "quark").
    Quark,
}

/// Arguments of `kquant quantize`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Source checkpoint: directory, `.safetensors` file or hub id.
    pub src: String,
    /// Output directory (built beside it, renamed into place when complete).
    #[arg(short, long)]
    pub output: PathBuf,
    #[arg(long, value_enum, default_value = "int4-pc")]
    pub scheme: Scheme,
    #[arg(long, value_enum, default_value = "quark")]
    pub format: Format,
    /// Comma-separated Quark patterns (fnmatch on the module name = tensor name without
    /// `.weight`). Embeddings, norms, 1-D tensors and d2t/t2d are never quantized.
    #[arg(long, default_value = "lm_head")]
    pub exclude: String,
    /// Quark path to reproduce: `model` (reorder nibbles + zero-point) or `file2file`.
    #[arg(long, value_enum, default_value = "model")]
    pub quark_layout: quark::Layout,
    /// Quark release whose output to reproduce.
    #[arg(long, value_enum, default_value = "0.13")]
    pub quark_version: quark::Version,
    /// Model path only: pack nibbles in sequential order (Quark `pack_method="order"`).
    #[arg(long)]
    pub quark_sequential: bool,
    /// Split the output into shards of at most this size (e.g. `5GB`).
    #[arg(long, value_parser = parse_size)]
    pub max_shard_size: Option<u64>,
    /// Replace an existing output.
    #[arg(long)]
    pub force: bool,
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
    let patterns = parse_patterns(&a.exclude);
    let opts = quark::Options {
        layout: a.quark_layout,
        version: a.quark_version,
        order: if a.quark_sequential {
            Order::Sequential
        } else {
            Order::Reorder
        },
    };

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
            (None, None) => Action::Quantize {
                module,
                rows: t.shape[0],
                cols: t.shape[1],
            },
        };
        plan.push((t, action));
    }
    // Quark's config lists the concrete excluded module names: every matched module (model
    // path) or only matched Linear candidates, sorted (file2file).
    match opts.layout {
        quark::Layout::Model => {
            for t in &file_order {
                let m = module_of(&t.name);
                if excluded_by(&patterns, m).is_some() && !excluded_modules.iter().any(|x| x == m) {
                    excluded_modules.push(m.to_string());
                }
            }
        }
        quark::Layout::File2file => {
            for (t, act) in &plan {
                if matches!(act, Action::Copy { .. }) && not_candidate(t).is_none() {
                    excluded_modules.push(module_of(&t.name).to_string());
                }
            }
            excluded_modules.sort();
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
            Action::Quantize { module, rows, cols } => {
                quark::specs(module, *rows, *cols, t.dtype, &opts)
            }
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
                "scheme": "int4-pc", "format": "quark",
                "tensors": plan.iter().map(|(t, act)| match act {
                    Action::Quantize { .. } => json!({"name": t.name, "action": "quantize", "scheme": "int4-pc", "bytes_before": t.nbytes(),
                        "bytes_after": specs.iter().filter(|s| producer[&s.name] == plan.iter().position(|(x, _)| x.name == t.name).unwrap()).map(TensorSpec::nbytes).sum::<u64>()}),
                    Action::Copy { reason } => json!({"name": t.name, "action": "excluded", "reason": reason, "bytes_before": t.nbytes(), "bytes_after": t.nbytes()}),
                }).collect::<Vec<_>>(),
                "exclude": exclude, "bytes_before": before, "bytes_after": after,
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
                    Action::Quantize { .. } => "int4-pc".to_string(),
                    Action::Copy { reason } => format!("excluded ({reason})"),
                };
                println!(
                    "{:<48} {:<40} {:>12} -> {:>12}",
                    t.name,
                    what,
                    human_bytes(t.nbytes()),
                    human_bytes(out)
                );
            }
            println!(
                "{n_q} tensors quantized; total {} -> {}",
                human_bytes(before),
                human_bytes(after)
            );
            println!("quantization_config.exclude: {exclude:?}");
        }
        return Ok(ExitCode::SUCCESS);
    }

    warn_loadability(&opts);
    let mut inputs: Vec<PathBuf> = ck.weights.files().iter().map(|p| p.to_path_buf()).collect();
    inputs.extend(ck.weights.config_path.clone());
    let wopts = WriteOptions {
        max_shard_size: a.max_shard_size,
        force: a.force,
        command: command_line(),
        inputs,
        ..Default::default()
    };
    let mut w = Writer::create(&a.output, specs, wopts)?;
    let order: Vec<String> = w.order().into_iter().map(String::from).collect();
    let pb = progress(before, "quantize");
    let mut pending: HashMap<String, Vec<u8>> = HashMap::new();
    for name in order {
        if let Some(bytes) = pending.remove(&name) {
            w.write(&name, &bytes)?;
            continue;
        }
        let (t, act) = &plan[producer[&name]];
        let shard = ck.weights.shard_of(&t.name).expect("routed");
        let view = shard.view(t);
        match act {
            Action::Copy { .. } => w.write(&name, view.data)?,
            Action::Quantize { module, rows, cols } => {
                let wf = view.to_f32();
                check_finite(&wf, *cols, shard.path(), &t.name)?;
                let q = int4::quantize(&wf, *rows, *cols, *cols, t.dtype);
                for (n, bytes) in quark::encode(module, &q, t.dtype, &opts) {
                    if n == name {
                        w.write(&n, &bytes)?;
                    } else {
                        pending.insert(n, bytes);
                    }
                }
            }
        }
        shard.release(t);
        pb.inc(t.nbytes());
    }
    pb.finish_and_clear();
    let mut config = match &ck.config {
        Some(c) => Value::Object(c.root.clone()),
        None => json!({}),
    };
    config["quantization_config"] = quark::config(&opts, &exclude);
    w.add_file(
        "config.json",
        &serde_json::to_vec_pretty(&config).expect("config JSON"),
    )?;
    let s = w.finish()?;
    if a.json {
        let doc = json!({"schema": "kquant.quantize/1", "output": s.dir, "quantized": n_q, "bytes_before": before, "bytes_after": after, "files": s.files, "exclude": exclude});
        println!("{}", serde_json::to_string_pretty(&doc).expect("JSON"));
    }
    eprintln!(
        "quantized {n_q} tensors (int4-pc, Quark {:?} layout): {} -> {} in {}",
        opts.layout,
        human_bytes(before),
        human_bytes(after),
        s.dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn check_finite(w: &[f32], cols: usize, path: &std::path::Path, name: &str) -> Result<()> {
    if let Some(i) = w.iter().position(|x| !x.is_finite()) {
        return Err(Error::Tensor {
            path: path.into(),
            tensor: name.into(),
            msg: format!(
                "row {} column {} is {} — refusing to quantize non-finite weights",
                i / cols,
                i % cols,
                w[i]
            ),
        });
    }
    Ok(())
}

fn warn_loadability(o: &quark::Options) {
    eprintln!(
        "warning: no serving engine loads dense Quark INT4 per-channel weights today: vLLM's Quark INT4 path (QuarkW4A16Int4) needs per-group scales and SGLang has no Quark INT4 scheme.\n  \
         This {:?}-layout output is for kquant's own kernels, `kquant verify`, and Quark-compatible pipelines; for vLLM use compressed-tensors W4A16, for TensorRT-LLM ModelOpt W4A16_AWQ (coming in kquant).",
        o.layout
    );
}
