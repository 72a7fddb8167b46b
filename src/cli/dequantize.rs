//! `kquant dequantize SRC -o OUT [--dtype bf16|f16|f32] [--dry-run] [--json]`: a quantized
//! checkpoint back to plain float weights (`w = q · s`), every other tensor copied,
//! `quantization_config` removed. `--dry-run` prints that plan and writes nothing; `--json`
//! prints the plan (`kquant.dequantize-plan/1`) or the result (`kquant.dequantize/1`) on stdout.

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{json, Value};

use crate::checkpoint::Checkpoint;
use crate::cli::human_bytes;
use crate::cli::output_args::OutputArgs;
use crate::cli::print_json;
use crate::error::{Error, Result};
use crate::escape::printable;
use crate::io::writer::{TensorSpec, Writer};
use crate::io::Dtype;
use crate::quant::decode::Logical;
use crate::quant::math::rowwise::encode_floats;

/// Float output types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutDtype {
    Bf16,
    F16,
    F32,
}

impl OutDtype {
    fn dtype(self) -> Dtype {
        match self {
            OutDtype::Bf16 => Dtype::BF16,
            OutDtype::F16 => Dtype::F16,
            OutDtype::F32 => Dtype::F32,
        }
    }
}

/// Arguments of `kquant dequantize`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A checkpoint kquant (or Quark / compressed-tensors) quantized.
    pub src: String,
    #[command(flatten)]
    pub out: OutputArgs,
    /// dtype of the dequantized weights (default: the config's `torch_dtype`/`dtype`, else bf16).
    #[arg(long, value_enum)]
    pub dtype: Option<OutDtype>,
    /// Print the plan (each tensor dequantized or copied, its dtype, shape and bytes) and
    /// write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the plan / result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

fn config_dtype(ck: &Checkpoint) -> Option<Dtype> {
    let c = ck.config.as_ref()?;
    match c.str("torch_dtype").or_else(|| c.str("dtype"))? {
        "bfloat16" => Some(Dtype::BF16),
        "float16" => Some(Dtype::F16),
        "float32" => Some(Dtype::F32),
        _ => None,
    }
}

pub fn run(a: Args) -> Result<ExitCode> {
    let ck = Checkpoint::open(&a.src)?;
    let lg = Logical::new(&ck)?;
    if lg.modules.is_empty() {
        return Err(Error::Source {
            path: ck.weights.dir.clone(),
            msg: "has no quantized modules kquant can read".into(),
            hint: Some("`kquant inspect` shows the quantization state".into()),
        });
    }
    let out_dtype = a
        .dtype
        .map(OutDtype::dtype)
        .or_else(|| config_dtype(&ck))
        .unwrap_or(Dtype::BF16);
    let specs: Vec<TensorSpec> = lg
        .names
        .iter()
        .map(|n| match lg.module(n) {
            Some(m) => TensorSpec::new(n.clone(), out_dtype, vec![m.rows, m.cols]),
            None => {
                let t = ck
                    .weights
                    .info(n)
                    .expect("logical names come from the checkpoint");
                TensorSpec::new(n.clone(), t.dtype, t.shape.clone())
            }
        })
        .collect();
    let total: u64 = specs.iter().map(TensorSpec::nbytes).sum();
    if a.dry_run {
        print_plan(&a, &lg, &specs, out_dtype, total);
        return Ok(ExitCode::SUCCESS);
    }
    let mut inputs: Vec<PathBuf> = ck.weights.files().iter().map(|p| p.to_path_buf()).collect();
    inputs.extend(ck.weights.config_path.clone());
    let opts = a.out.write_options(inputs);
    let mut w = Writer::create(&a.out.output, specs, opts)?;
    let pb = crate::progress::bytes(total, "dequantize");
    for name in w.order().into_iter().map(String::from).collect::<Vec<_>>() {
        match lg.module(&name) {
            Some(m) => {
                let vals = lg.dequantize(m);
                let bytes = encode_floats(
                    &vals
                        .iter()
                        .map(|v| round(out_dtype, *v))
                        .collect::<Vec<_>>(),
                    out_dtype,
                );
                pb.inc(bytes.len() as u64);
                w.write(&name, &bytes)?;
            }
            None => {
                let v = ck.weights.tensor(&name).expect("routed");
                let shard = ck.weights.shard_of(&name).expect("routed");
                w.copy_tensor(&name, shard, v.info, |k| pb.inc(k))?;
            }
        }
    }
    pb.finish_and_clear();
    let mut config = ck
        .config
        .as_ref()
        .map(|c| Value::Object(c.root.clone()))
        .unwrap_or_else(|| serde_json::json!({}));
    if let Some(o) = config.as_object_mut() {
        o.remove("quantization_config");
    }
    w.add_file(
        "config.json",
        &serde_json::to_vec_pretty(&config).expect("config JSON"),
    )?;
    let s = w.finish()?;
    let next = next_steps(&s.dir);
    if a.json {
        let doc = json!({
            "schema": "kquant.dequantize/1",
            "output": s.dir,
            "dtype": out_dtype.name(),
            "dequantized": lg.modules.len(),
            "bytes": s.tensor_bytes,
            "files": s.files,
            "warnings": Vec::<String>::new(),
            "next": next,
        });
        print_json(&doc);
    }
    eprintln!(
        "dequantized {} modules to {} ({}) in {}",
        lg.modules.len(),
        out_dtype,
        human_bytes(s.tensor_bytes),
        s.dir.display()
    );
    for n in &next {
        eprintln!("next: {}", printable(n));
    }
    Ok(ExitCode::SUCCESS)
}

/// `--dry-run`: each tensor of the output (dequantized from which stored tensors, or copied),
/// the totals and what happens to config.json; as `kquant.dequantize-plan/1` with `--json`.
fn print_plan(a: &Args, lg: &Logical, specs: &[TensorSpec], out_dtype: Dtype, total: u64) {
    let before: u64 = lg.ck.weights.infos().map(|t| t.nbytes()).sum();
    if a.json {
        let doc = json!({
            "schema": "kquant.dequantize-plan/1",
            "output": a.out.output,
            "dtype": out_dtype.name(),
            "tensors": specs.iter().map(|t| match lg.module(&t.name) {
                Some(m) => json!({"name": t.name, "action": "dequantize", "from": m.parts,
                    "dtype": t.dtype.name(), "shape": t.shape, "bytes": t.nbytes()}),
                None => json!({"name": t.name, "action": "copy", "dtype": t.dtype.name(),
                    "shape": t.shape, "bytes": t.nbytes()}),
            }).collect::<Vec<_>>(),
            "dequantized": lg.modules.len(),
            "bytes_before": before,
            "bytes_after": total,
            "config_removed": ["quantization_config"],
            "warnings": Vec::<String>::new(),
        });
        print_json(&doc);
        return;
    }
    // Names come from the files: escaped for the terminal (crate::escape).
    for t in specs {
        let what = match lg.module(&t.name) {
            Some(m) => format!("dequantize <- {}", m.parts.join(", ")),
            None => "copy".into(),
        };
        println!(
            "{:<52} {:<7} {:<14} {:>12}  {}",
            printable(&t.name),
            t.dtype.name(),
            format!("{:?}", t.shape),
            human_bytes(t.nbytes()),
            printable(&what)
        );
    }
    println!(
        "{} modules dequantized to {}; total {} -> {}",
        lg.modules.len(),
        out_dtype,
        human_bytes(before),
        human_bytes(total)
    );
    println!("config.json: quantization_config removed");
    println!("dry run: nothing written to {}", a.out.output.display());
}

/// What a user does with a dequantized checkpoint next: measure the quantization error against
/// the unquantized original, and see what the float checkpoint is.
fn next_steps(out: &std::path::Path) -> Vec<String> {
    let out = out.display();
    vec![
        format!("kquant diff ORIGINAL {out} (per-tensor error against the unquantized original; docs/diff.md)"),
        format!("kquant inspect {out}"),
    ]
}

fn round(d: Dtype, v: f32) -> f32 {
    crate::quant::math::int4::round_to(d, v)
}
