//! `kquant schemes [--json]`: every quantization scheme, its bits per weight, granularity,
//! activation format, the formats that carry it and, per format, each engine's claim
//! (`crate::engines::quantized`: loads or not, why, and the release it was checked with).

use std::process::ExitCode;

use serde_json::json;

use crate::cli::print_json;
use crate::engines::quantized;
use crate::error::Result;
use crate::escape::printable;
use crate::quant::registry::SCHEMES;

/// Arguments of `kquant schemes`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the registry as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Print the registry as the Markdown table of docs/schemes.md.
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
}

/// The scheme table as Markdown: one row per (scheme, format), with the engines that load it
/// (docs/schemes.md carries this output; `tests/schemes_doc.rs` keeps it current).
pub fn markdown() -> String {
    let mut out = String::from(
        "| scheme | bits/weight | group | activations | `--format` | reference tool | loads in |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for s in SCHEMES {
        for c in s.carriers {
            let loads: Vec<String> = quantized::claims(c.format, s.id)
                .map(|e| format!("{} {}", e.engine.id(), e.loads.id()))
                .collect();
            let loads = if c.implemented() {
                loads.join(", ")
            } else {
                "not written by kquant".into()
            };
            let group = match s.group {
                Some(g) => g.to_string(),
                None if s.granularity == "per tensor" => "per tensor".into(),
                None => "per channel".into(),
            };
            out.push_str(&format!(
                "| `{}` | {:.3} | {group} | {} | `{}` | {} | {loads} |\n",
                s.id,
                s.bits_per_weight,
                s.activations,
                c.format.name(),
                c.reference,
            ));
        }
    }
    out
}

pub fn run(a: Args) -> Result<ExitCode> {
    if a.markdown {
        print!("{}", markdown());
        return Ok(ExitCode::SUCCESS);
    }
    if a.json {
        let schemes: Vec<_> = SCHEMES
            .iter()
            .map(|s| {
                let mut v = serde_json::to_value(s).expect("JSON");
                for (c, j) in s
                    .carriers
                    .iter()
                    .zip(v["carriers"].as_array_mut().expect("carriers").iter_mut())
                {
                    j["engines"] = json!(quantized::claims(c.format, s.id).collect::<Vec<_>>());
                    j["exceptions"] = json!(quantized::exceptions(c.format, s.id)
                        .map(|r| json!({"drafts": r.drafts.name(), "claim": r.claim}))
                        .collect::<Vec<_>>());
                }
                v
            })
            .collect();
        let doc = json!({"schema": "kquant.schemes/2", "schemes": schemes});
        print_json(&doc);
        return Ok(ExitCode::SUCCESS);
    }
    for s in SCHEMES {
        println!(
            "{}  ({:.3} bits/weight, {}, activations {})",
            s.id, s.bits_per_weight, s.granularity, s.activations
        );
        println!("    {}", s.about);
        for c in s.carriers {
            let status = if c.implemented() {
                ""
            } else {
                " [not yet in kquant]"
            };
            println!(
                "    --format {:<19} {}{status}",
                c.format.name(),
                c.reference
            );
            let rows = quantized::claims(c.format, s.id)
                .map(|e| ("", e))
                .chain(quantized::exceptions(c.format, s.id).map(|r| (r.drafts.name(), &r.claim)));
            for (only, e) in rows {
                let only = if only.is_empty() {
                    String::new()
                } else {
                    format!("{only}: ")
                };
                let basis = e.basis();
                println!(
                    "        {:<7}{only}{:<8}{} [{basis}]",
                    e.engine.id(),
                    e.loads.id(),
                    printable(e.why)
                );
            }
        }
        println!();
    }
    Ok(ExitCode::SUCCESS)
}
