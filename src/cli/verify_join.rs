//! `kquant verify-join LIVE OFFLINE [--side draft|baseline] [--json]`: the per-request join of
//! a live verify report and an offline one (`crate::verify::join`), as a table of the requests
//! that differ or as JSON. Exit 0 (it decides nothing), 2 on a file that is not such a report.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::escape::printable;

/// Which deployment's requests to join.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Side {
    Draft,
    Baseline,
}

/// Arguments of `kquant verify-join`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A live verify's JSON report (`verify --endpoint … --json FILE`).
    pub live: PathBuf,
    /// An offline verify's JSON report over the same prompts (`verify --trace … --near-ties M
    /// --json FILE`; with `--near-ties` each difference is told explained or not).
    pub offline: PathBuf,
    /// Which deployment's requests: the draft's, or the baseline's.
    #[arg(long, value_enum, default_value_t = Side::Draft)]
    pub side: Side,
    /// Print the join as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

fn read(path: &Path) -> Result<Value> {
    let text =
        crate::io::text::read_regular_text(path, crate::io::text::MAX_PROMPTS, "verify report")?;
    serde_json::from_str(&text).map_err(|e| Error::Source {
        path: path.to_path_buf(),
        msg: format!("is not JSON ({e})"),
        hint: Some("give the files `kquant verify … --json FILE` wrote".into()),
    })
}

pub fn run(a: Args) -> Result<ExitCode> {
    let reports = [read(&a.live)?, read(&a.offline)?];
    let side = match a.side {
        Side::Draft => "draft",
        Side::Baseline => "baseline",
    };
    let j = crate::verify::join::join(&reports[0], &reports[1], side).map_err(|(i, msg)| {
        Error::Source {
            path: [&a.live, &a.offline][i].clone(),
            msg,
            hint: Some("kquant verify-join LIVE.json OFFLINE.json: the live report first, then the offline one, each written by `kquant verify … --json FILE`".into()),
        }
    })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
        return Ok(ExitCode::SUCCESS);
    }
    let n = |k: &str| j[k].as_u64().unwrap_or(0);
    println!(
        "{side}: {} requests joined: {} the same, {} differ where a near-tie can explain it, {} differ with no near-tie step{}",
        n("joined"),
        n("same"),
        n("near_tie"),
        n("unexplained"),
        if j["near_ties_known"].as_bool() == Some(true) {
            String::new()
        } else {
            format!(
                ", {} differ (the offline report has no near-tie figures: rerun it with --near-ties)",
                n("differs")
            )
        }
    );
    let rows: Vec<&Value> = j["requests"]
        .as_array()
        .map(|r| r.iter().filter(|r| r["verdict"] != "same").collect())
        .unwrap_or_default();
    if !rows.is_empty() {
        println!(
            "{:<16} {:<12} {:>11} {:>15} {:>11} {:>15} {:>10}  verdict",
            "id",
            "category",
            "live steps",
            "live committed",
            "off. steps",
            "off. committed",
            "near-tie"
        );
        for r in rows {
            println!(
                "{:<16} {:<12} {:>11} {:>15} {:>11} {:>15} {:>10}  {}",
                printable(r["id"].as_str().unwrap_or("")),
                printable(r["category"].as_str().unwrap_or("")),
                r["live"]["steps"],
                r["live"]["committed"],
                r["offline"]["steps"],
                r["offline"]["committed"],
                r["offline"]["near_tie_steps"]
                    .as_u64()
                    .map_or("-".to_string(), |t| t.to_string()),
                r["verdict"].as_str().unwrap_or("")
            );
        }
    }
    for (k, what) in [
        ("only_live", "only in the live report"),
        ("only_offline", "only in the offline report"),
    ] {
        let ids: Vec<String> = j[k]
            .as_array()
            .map(|v| {
                v.iter()
                    .filter_map(Value::as_str)
                    .map(|s| printable(s).into_owned())
                    .collect()
            })
            .unwrap_or_default();
        if !ids.is_empty() {
            println!("{} requests {what}: {}", ids.len(), ids.join(", "));
        }
    }
    Ok(ExitCode::SUCCESS)
}
