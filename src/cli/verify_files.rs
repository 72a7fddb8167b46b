//! `kquant verify-files DIR [--json]`: re-hash an output against its `kquant-manifest.json`,
//! and check, without trusting the manifest, that the files make a whole checkpoint (the
//! reader's checks: `config.json`, every shard its index names, valid headers), so that a
//! manifest edited to match a deleted shard does not pass.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::print_json;
use crate::error::{Error, Result};
use crate::io::manifest::{Manifest, MANIFEST_FILE};

/// Arguments of `kquant verify-files`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A directory written by kquant.
    pub dir: PathBuf,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let m = Manifest::read(&a.dir)?;
    let c = m.check(&a.dir)?;
    // Independent of the manifest: the checkpoint as the reader sees it.
    let whole = match crate::io::source::open_dir(&a.dir) {
        Ok(w) => Ok(w.files().len()),
        Err(e) => Err(e.to_string()),
    };
    let passed = c.passed() && whole.is_ok();
    if a.json {
        let doc = serde_json::json!({
            "schema": "kquant.verify-files/1",
            "dir": a.dir,
            "kquant_version": m.kquant_version,
            "command": m.command,
            "passed": passed,
            "checkpoint": match &whole { Ok(_) => "whole".to_string(), Err(e) => e.clone() },
            "ok": c.ok, "mismatched": c.mismatched, "missing": c.missing, "unlisted": c.unlisted,
        });
        print_json(&doc);
    } else {
        for f in &c.ok {
            eprintln!("ok        {}", crate::escape::printable(f));
        }
    }
    if passed {
        if !a.json {
            eprintln!("{} files match {MANIFEST_FILE}", c.ok.len());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut problems = Vec::new();
    for (what, v) in [
        ("changed", &c.mismatched),
        ("missing", &c.missing),
        ("not in the manifest", &c.unlisted),
    ] {
        if !v.is_empty() {
            problems.push(format!("{what}: {}", v.join(", ")));
        }
    }
    if let Err(e) = whole {
        problems.push(format!(
            "the files it lists are not a whole checkpoint: {e}"
        ));
    }
    Err(Error::Manifest {
        path: a.dir.join(MANIFEST_FILE),
        msg: format!(
            "output does not match its manifest ({})",
            problems.join("; ")
        ),
    })
}
