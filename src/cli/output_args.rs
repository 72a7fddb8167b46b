//! The flags every command that writes a checkpoint from a source shares (`quantize`,
//! `convert`, `dequantize`; flattened into each one's arguments), and the writer options they
//! make. `synth` writes from nothing and takes only `--output`, `--max-shard-size`, `--force`.

use std::path::PathBuf;

use crate::cli::command_line;
use crate::io::writer::{parse_size, WriteOptions};

/// Where and how the output is written.
#[derive(Debug, clap::Args)]
pub struct OutputArgs {
    /// Output directory (built beside it, renamed into place when complete).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Split the output into shards of at most this size (e.g. `5GB`).
    #[arg(long, value_parser = parse_size)]
    pub max_shard_size: Option<u64>,
    /// Replace an existing output (only one kquant wrote).
    #[arg(long)]
    pub force: bool,
    /// Record the sha256 of every input file in the output's manifest, however large
    /// (inputs over 64 MiB are otherwise recorded by path and size only).
    #[arg(long)]
    pub hash_inputs: bool,
}

impl OutputArgs {
    /// The writer's options, with this command line and `inputs` (recorded in the manifest,
    /// and protected from being overwritten by the output).
    pub fn write_options(&self, inputs: Vec<PathBuf>) -> WriteOptions {
        WriteOptions {
            max_shard_size: self.max_shard_size,
            force: self.force,
            command: command_line(),
            inputs,
            hash_inputs: self.hash_inputs,
            ..Default::default()
        }
    }
}
