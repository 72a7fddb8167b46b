//! `kquant targets [NAME|FILE] [--json]`: the target profiles (`quant-configs/targets/`) — shape,
//! a hybrid's layer pattern, default taps per draft family in each numbering convention, the model cards' published accept
//! lengths, and whether kquant can run the target live.

use std::process::ExitCode;

use crate::cli::print_json;
use crate::error::Result;
use crate::target::profile::{self, Profile};
use crate::target::taps::{FAMILIES, TAP_CONVENTION};

/// Arguments of `kquant targets`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Show one profile (a built-in name or a JSON file) instead of all built-in ones.
    pub target: Option<String>,
    /// Print the profiles as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

fn ids(v: &[usize]) -> String {
    v.iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// One line of a profile: a profile may be a user's JSON file, so its text is escaped.
fn say(line: String) {
    println!("{}", crate::escape::printable(&line));
}

fn show(p: &Profile) {
    say(format!(
        "{}  ({})",
        p.name,
        p.hf_id.as_deref().unwrap_or("not on the hub")
    ));
    say(format!("    {}", p.description));
    say(format!(
        "    architecture {}; {} layers, hidden size {}, vocabulary {}",
        p.architecture.show(),
        p.num_layers.show(),
        p.hidden_size.show(),
        p.vocab_size.show()
    ));
    if let Some(lp) = &p.layers {
        say(format!(
            "    layers (0-based): KDA {}; MLA {}  [{}]",
            ids(&lp.kda),
            ids(&lp.mla),
            lp.source
        ));
    }
    for f in FAMILIES {
        match p.taps_of(&f) {
            Some(t) => {
                let out = t
                    .output_of_layer_ids()
                    .map_or_else(|| "n/a (taps the embedding)".into(), |v| ids(&v));
                say(format!(
                    "    {:<10} taps hs[{}]  vLLM ids {}  output-of-layer ids {}",
                    f.id(),
                    ids(&t.hs),
                    ids(&t.vllm_ids()),
                    out
                ));
            }
            None => say(format!("    {:<10} taps unknown", f.id())),
        }
    }
    if let Some(ar) = &p.attention_residuals {
        say(format!(
            "    attention residuals: blocks of {} layers; a tap is one of two streams  [{}]",
            ar.block_size, ar.source
        ));
        for e in &ar.engines {
            say(format!(
                "      {} taps `{}`: {}{}  [{}]",
                e.engine,
                e.default.id(),
                e.default.about(),
                e.switch
                    .as_deref()
                    .map_or_else(String::new, |s| format!("; {s}")),
                e.source
            ));
        }
    }
    for d in &p.published_drafts {
        say(format!(
            "    draft {} ({}, {}): hs[{}], stream {}; {}  [{}; {}]",
            d.draft,
            d.family,
            d.layout,
            ids(&d.hs),
            d.stream.show_with(|s| s.id().to_string()),
            d.config_ids,
            d.status,
            d.source
        ));
    }
    for a in &p.published_accept_lengths {
        say(format!(
            "    published: {} on {} (N {}): {}  [{}; {}; {}{}]",
            a.draft,
            a.benchmark,
            a.n.show(),
            a.accept_length,
            a.engine,
            a.draft_length,
            a.source,
            a.provenance
                .as_deref()
                .map_or_else(String::new, |p| format!("; {p}"))
        ));
    }
    if let Some(l) = &p.live {
        say(format!(
            "    live: target {}, prompts {}, trace {}",
            l.target, l.prompts, l.trace
        ));
    }
    println!();
}

pub fn run(a: Args) -> Result<ExitCode> {
    let profiles = match &a.target {
        Some(spec) => vec![profile::load(spec)?],
        None => profile::builtin()?,
    };
    if a.json {
        let doc = serde_json::json!({
            "schema": "kquant.targets/1",
            "tap_convention": TAP_CONVENTION,
            "targets": profiles,
        });
        print_json(&doc);
        return Ok(ExitCode::SUCCESS);
    }
    println!("Taps are HF hidden_states indices: hs[0] = embeddings, hs[i] = output of block i-1, hs[L] = last block before the final norm.\n");
    for p in &profiles {
        show(p);
    }
    Ok(ExitCode::SUCCESS)
}
