//! Verify results as people and CI read them: the [`Report`] offline and live verify fill
//! (`schema`, built in `build`), and what is rendered from it: a table like the seed model
//! cards (category, N, AL baseline, AL draft, Δ; `table`), the JSON document (the report
//! serialized), and JUnit XML (the gate, each threshold, each category; `junit`).

mod build;
mod junit;
pub mod schema;
mod table;

use crate::io::output::{self, Kind};
use std::path::{Path, PathBuf};

pub use build::{agreement_of, build_on, near_ties, Run, MIN_CI_SAMPLES};
pub use junit::junit;
pub use schema::Report;
pub use table::{synthetic_lines, table};

/// How an existing `--json` report is recognised as kquant's (and so may be replaced).
pub const JSON_REPORT: Kind = Kind::File {
    what: "verify JSON report",
    flag: "--json",
    is_ours: |b| output::is_json_with_schema(b, "kquant.verify/"),
};

/// How an existing `--junit` report is recognised as kquant's.
pub const JUNIT_REPORT: Kind = Kind::File {
    what: "JUnit report",
    flag: "--junit",
    is_ours: |b| {
        const MARK: &[u8] = b"<testsuite name=\"kquant verify\"";
        b.starts_with(b"<?xml") && b.windows(MARK.len()).any(|w| w == MARK)
    },
};

/// What a verify found: the report (table, JSON and JUnit are rendered from it), the gate's
/// decision, and the inputs an output may not overwrite.
pub struct Verdict {
    pub report: Report,
    pub passed: bool,
    pub sources: Vec<PathBuf>,
}

/// Print the report (the table, or the JSON with `--json` / `--json -`) and write `--json FILE`
/// and `--junit FILE`. Reports are regenerated on every run: an existing one is replaced when
/// kquant wrote it, anything else is refused (`io::output`), and none may be one of `sources`.
pub fn emit(
    rep: &Report,
    json_to: Option<&Path>,
    junit_to: Option<&Path>,
    sources: &[PathBuf],
) -> crate::error::Result<()> {
    let json_to_stdout = json_to == Some(Path::new("-"));
    if json_to_stdout {
        println!("{}", serde_json::to_string_pretty(rep).expect("JSON"));
    } else {
        print!("{}", table(rep));
    }
    if let Some(p) = json_to.filter(|_| !json_to_stdout) {
        output::write_file(
            p,
            JSON_REPORT,
            true,
            sources,
            &serde_json::to_vec_pretty(rep).expect("JSON"),
        )?;
    }
    if let Some(p) = junit_to {
        output::write_file(p, JUNIT_REPORT, true, sources, junit(rep).as_bytes())?;
    }
    Ok(())
}
