//! `kquant synth --preset NAME -o OUT`: deterministic synthetic checkpoints (tiny fixtures, and
//! real-shape Kimi drafts for benchmarks).

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::{command_line, human_bytes};
use crate::error::{Error, Result};
use crate::io::writer::{parse_size, WriteOptions};
use crate::synth::{preset, PRESETS};

/// Arguments of `kquant synth`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Preset name (`--list` shows them).
    #[arg(long, required_unless_present = "list")]
    pub preset: Option<String>,
    /// Output directory.
    #[arg(short, long, required_unless_present = "list")]
    pub output: Option<PathBuf>,
    /// Split into shards of at most this size (e.g. `2GB`, `500MiB`).
    #[arg(long, value_parser = parse_size)]
    pub max_shard_size: Option<u64>,
    /// Replace an existing output.
    #[arg(long)]
    pub force: bool,
    /// Print what would be written and stop.
    #[arg(long)]
    pub dry_run: bool,
    /// List the presets.
    #[arg(long)]
    pub list: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    if a.list {
        for name in PRESETS {
            let p = preset(name).expect("listed preset");
            println!(
                "{name:<28}{:>10}  {}",
                human_bytes(p.total_bytes()),
                p.about
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let name = a.preset.expect("clap requires it");
    let p = preset(&name).ok_or_else(|| Error::Flags {
        msg: format!("unknown preset `{name}`"),
        hint: format!(
            "--preset takes one of {}; `kquant synth --list` shows each one's size and what it is",
            PRESETS.join(", ")
        ),
    })?;
    let out = a.output.expect("clap requires it");
    if a.dry_run {
        eprintln!(
            "would write {} ({} tensors, {}) to {}",
            p.name,
            p.tensors.len(),
            human_bytes(p.total_bytes()),
            out.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let pb = crate::progress::bytes(p.total_bytes(), "synth");
    let opts = WriteOptions {
        max_shard_size: a.max_shard_size,
        force: a.force,
        command: command_line(),
        ..Default::default()
    };
    let s = p.write(&out, opts, &pb)?;
    pb.finish_and_clear();
    eprintln!(
        "wrote {} ({} files, {} of tensors) to {}",
        p.name,
        s.files.len(),
        human_bytes(s.tensor_bytes),
        s.dir.display()
    );
    Ok(ExitCode::SUCCESS)
}
