//! `kquant schemes [--json]`: every quantization scheme, its bits per weight, granularity,
//! activation format, the formats that carry it and where each result loads (engine × GPU).

use std::process::ExitCode;

use crate::error::Result;
use crate::quant::registry::SCHEMES;

/// Arguments of `kquant schemes`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the registry as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    if a.json {
        let doc = serde_json::json!({"schema": "kquant.schemes/1", "schemes": SCHEMES});
        println!("{}", serde_json::to_string_pretty(&doc).expect("JSON"));
        return Ok(ExitCode::SUCCESS);
    }
    for s in SCHEMES {
        println!(
            "{}  ({:.3} bits/weight, {}, activations {})",
            s.id, s.bits_per_weight, s.granularity, s.activations
        );
        println!("    {}", s.about);
        for c in s.carriers {
            let status = if c.implemented {
                ""
            } else {
                " [not yet in kquant]"
            };
            let loads = if c.loads.is_empty() {
                "no engine loads it".to_string()
            } else {
                c.loads.join("; ")
            };
            println!(
                "    --format {:<19} {:<34} loads: {loads}{status}",
                c.format.name(),
                c.reference
            );
        }
        println!();
    }
    Ok(ExitCode::SUCCESS)
}
