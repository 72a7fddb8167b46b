//! `kquant quantize SRC -o OUT [--scheme int4-pc|int4-g32|int4-g64|int4-g128]
//! [--format quark|compressed-tensors] [--exclude PATTERNS]`: plan (which tensors, why not the
//! others) → quantize per tensor with the chosen format's own recipe → stream into the writer.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{json, Value};

use crate::checkpoint::Checkpoint;
use crate::cli::{command_line, human_bytes, progress};
use crate::error::{Error, Result};
use crate::io::writer::{parse_size, TensorSpec, WriteOptions, Writer};
use crate::io::{Dtype, TensorInfo};
use crate::quant::exclude::{excluded_by, module_of, not_candidate, parse_patterns};
use crate::quant::pack::Order;
use crate::quant::{compressed_tensors as ct, int4, quark, quark_group};

/// Quantization schemes `quantize` can write today.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scheme {
    /// INT4 per-output-channel symmetric weights, 16-bit activations (Quark `int4_wo_per_channel`,
    /// compressed-tensors W4A16 `strategy: channel`).
    #[value(name = "int4-pc")]
    Int4Pc,
    /// INT4 symmetric weights, one scale per 32 input columns (Quark `int4_wo_32`,
    /// compressed-tensors W4A16 `group_size: 32`).
    #[value(name = "int4-g32")]
    Int4G32,
    /// INT4 symmetric weights, one scale per 64 input columns (Quark `int4_wo_64`,
    /// compressed-tensors W4A16 `group_size: 64`).
    #[value(name = "int4-g64")]
    Int4G64,
    /// INT4 symmetric weights, one scale per 128 input columns (Quark `int4_wo_128`,
    /// compressed-tensors preset `W4A16`).
    #[value(name = "int4-g128")]
    Int4G128,
}

impl Scheme {
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Int4Pc => "int4-pc",
            Scheme::Int4G32 => "int4-g32",
            Scheme::Int4G64 => "int4-g64",
            Scheme::Int4G128 => "int4-g128",
        }
    }
    /// Group size along the input dimension; `None` is per channel.
    pub fn group(self) -> Option<usize> {
        match self {
            Scheme::Int4Pc => None,
            Scheme::Int4G32 => Some(32),
            Scheme::Int4G64 => Some(64),
            Scheme::Int4G128 => Some(128),
        }
    }
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// AMD Quark `quantization_config` (quant_method "quark").
    Quark,
    /// compressed-tensors `pack-quantized` (llm-compressor's format, quant_method
    /// "compressed-tensors"), as compressed-tensors 0.20.0 writes it.
    #[value(name = "compressed-tensors")]
    CompressedTensors,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Quark => "quark",
            Format::CompressedTensors => "compressed-tensors",
        }
    }
}

/// What each quantized module is written as: a format, its options and the scheme's group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// Quark per-channel (model or file2file layout).
    QuarkPc(quark::Options),
    /// Quark per-group, model path.
    QuarkGroup(quark::Options, usize),
    /// compressed-tensors pack-quantized; `None` is per channel.
    Ct(Option<usize>),
}

impl Target {
    fn group(&self) -> Option<usize> {
        match *self {
            Target::QuarkPc(_) => None,
            Target::QuarkGroup(_, g) => Some(g),
            Target::Ct(g) => g,
        }
    }
    fn specs(&self, module: &str, rows: usize, cols: usize, dtype: Dtype) -> Vec<TensorSpec> {
        match self {
            Target::QuarkPc(o) => quark::specs(module, rows, cols, dtype, o),
            Target::QuarkGroup(_, g) => quark_group::specs(module, rows, cols, *g, dtype),
            Target::Ct(g) => ct::specs(module, rows, cols, g.unwrap_or(cols), dtype),
        }
    }
    /// Quantize one weight with the format's own recipe and encode its tensors.
    fn encode(
        &self,
        module: &str,
        w: &[f32],
        rows: usize,
        cols: usize,
        dtype: Dtype,
    ) -> Vec<(String, Vec<u8>)> {
        match self {
            Target::QuarkPc(o) => {
                let q = int4::quantize(w, rows, cols, cols, dtype);
                quark::encode(module, &q, dtype, o)
            }
            Target::QuarkGroup(o, g) => {
                let q = int4::quantize(w, rows, cols, *g, dtype);
                quark_group::encode(module, &q, dtype, o)
            }
            Target::Ct(g) => {
                let q = ct::quantize(w, rows, cols, g.unwrap_or(cols), dtype);
                ct::encode(module, &q, dtype)
            }
        }
    }
    fn config(&self, exclude: &[String]) -> Value {
        match self {
            Target::QuarkPc(o) => quark::config(o, exclude),
            Target::QuarkGroup(o, g) => quark_group::config(o, *g, exclude),
            Target::Ct(g) => ct::config(*g, exclude),
        }
    }
    /// The `quantization_config` key that lists the modules left unquantized.
    fn exclude_key(&self) -> &'static str {
        match self {
            Target::Ct(_) => "ignore",
            _ => "exclude",
        }
    }
    fn describe(&self) -> String {
        match self {
            Target::QuarkPc(o) => format!("Quark {:?} layout", o.layout),
            Target::QuarkGroup(..) => "Quark Model layout".into(),
            Target::Ct(_) => format!("compressed-tensors {} pack-quantized", ct::VERSION),
        }
    }
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
    /// Comma-separated patterns (Python fnmatch on the module name = tensor name without
    /// `.weight`, as Quark matches them; for both formats). Embeddings, norms, 1-D tensors and
    /// d2t/t2d are never quantized.
    #[arg(long, default_value = "lm_head")]
    pub exclude: String,
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
    let target = target(&a)?;

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
    if let Some(g) = target.group() {
        check_groups(&ck, &plan, g, a.scheme)?;
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
    match target {
        Target::QuarkPc(o) if o.layout == quark::Layout::File2file => {
            for t in &file_order {
                if unquantized_candidate(t) {
                    excluded_modules.push(module_of(&t.name).to_string());
                }
            }
            excluded_modules.sort();
        }
        Target::QuarkPc(_) | Target::QuarkGroup(..) => {
            for t in &file_order {
                let m = module_of(&t.name);
                let listed = excluded_by(&patterns, m).is_some() || unquantized_candidate(t);
                if listed && !excluded_modules.iter().any(|x| x == m) {
                    excluded_modules.push(m.to_string());
                }
            }
        }
        Target::Ct(_) => {
            for t in &file_order {
                if unquantized_candidate(t) {
                    excluded_modules.push(module_of(&t.name).to_string());
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
                "scheme": a.scheme.name(), "format": a.format.name(),
                "tensors": plan.iter().map(|(t, act)| match act {
                    Action::Quantize { .. } => json!({"name": t.name, "action": "quantize", "scheme": a.scheme.name(), "bytes_before": t.nbytes(),
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
                    Action::Quantize { .. } => a.scheme.name().to_string(),
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
            println!("quantization_config.{}: {exclude:?}", target.exclude_key());
        }
        return Ok(ExitCode::SUCCESS);
    }

    if let Target::QuarkPc(o) = target {
        warn_loadability(&o);
    }
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
                for (n, bytes) in target.encode(module, &wf, *rows, *cols, t.dtype) {
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
    config["quantization_config"] = target.config(&exclude);
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
        "quantized {n_q} tensors ({}, {}): {} -> {} in {}",
        a.scheme.name(),
        target.describe(),
        human_bytes(before),
        human_bytes(after),
        s.dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// The output target for the scheme, format and Quark flags, or a usage error for combinations
/// whose reference output is unknown.
fn target(a: &Args) -> Result<Target> {
    match a.format {
        Format::Quark => {
            let o = quark::Options {
                layout: a.quark_layout.unwrap_or(quark::Layout::Model),
                version: a.quark_version.unwrap_or(quark::Version::V013),
                order: if a.quark_sequential {
                    Order::Sequential
                } else {
                    Order::Reorder
                },
            };
            match a.scheme.group() {
                None => Ok(Target::QuarkPc(o)),
                Some(_) if o.layout == quark::Layout::File2file => Err(Error::Usage(format!(
                    "--scheme {} with --quark-layout file2file: kquant has no reference output of Quark's file-to-file path for per-group INT4; use --quark-layout model",
                    a.scheme.name()
                ))),
                Some(g) => Ok(Target::QuarkGroup(o, g)),
            }
        }
        Format::CompressedTensors => {
            if a.quark_layout.is_some() || a.quark_version.is_some() || a.quark_sequential {
                return Err(Error::Usage(
                    "--quark-layout, --quark-version and --quark-sequential apply to --format quark only".into(),
                ));
            }
            Ok(Target::Ct(a.scheme.group()))
        }
    }
}

/// Refuse any tensor to be quantized whose input dimension is not a multiple of the group size:
/// compressed-tensors raises on it, and Quark's output for it is unknown.
fn check_groups(
    ck: &Checkpoint,
    plan: &[(&TensorInfo, Action)],
    g: usize,
    s: Scheme,
) -> Result<()> {
    for (t, act) in plan {
        if let Action::Quantize { module, cols, .. } = act {
            if cols % g != 0 {
                let path = ck
                    .weights
                    .shard_of(&t.name)
                    .map(|sh| sh.path().to_path_buf())
                    .unwrap_or_else(|| ck.weights.dir.clone());
                return Err(Error::Tensor {
                    path,
                    tensor: t.name.clone(),
                    msg: format!(
                        "input dimension {cols} (shape {:?}) is not a multiple of the group size {g} of --scheme {}; \
                         add `{module}` to --exclude, or use a scheme whose group divides it (int4-pc has no group)",
                        t.shape,
                        s.name()
                    ),
                });
            }
        }
    }
    Ok(())
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

/// Printed only for Quark per-channel INT4, the one combination no engine loads.
fn warn_loadability(o: &quark::Options) {
    eprintln!(
        "warning: no serving engine loads dense Quark INT4 per-channel weights today: vLLM's Quark INT4 path (QuarkW4A16Int4) needs per-group scales and SGLang has no Quark INT4 scheme.\n  \
         This {:?}-layout output is for kquant's own kernels, `kquant verify`, and Quark-compatible pipelines. For vLLM use `--format compressed-tensors` (W4A16; CUDA and ROCm) or a per-group Quark scheme such as `--scheme int4-g128` (QuarkW4A16Int4); for TensorRT-LLM ModelOpt W4A16_AWQ (coming in kquant).",
        o.layout
    );
}
