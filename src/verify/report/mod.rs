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
    check_outputs(json_to, junit_to)?;
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

/// `--json FILE` and `--junit FILE` must be two files: one would replace the other (and the
/// second write, finding a report that is not its kind, refused it after the run).
pub fn check_outputs(json_to: Option<&Path>, junit_to: Option<&Path>) -> crate::error::Result<()> {
    let (Some(j), Some(u)) = (json_to.filter(|p| *p != Path::new("-")), junit_to) else {
        return Ok(());
    };
    // The directory resolved (links, `.`), the name as given.
    let place = |p: &Path| {
        let parent = p.parent().filter(|d| !d.as_os_str().is_empty());
        std::fs::canonicalize(parent.unwrap_or(Path::new(".")))
            .ok()
            .zip(p.file_name())
            .map(|(d, n)| d.join(n))
            .unwrap_or_else(|| p.to_path_buf())
    };
    if place(j) == place(u) {
        return Err(crate::error::Error::Flags {
            msg: format!(
                "--json and --junit name the same file `{}`",
                crate::escape::printable(&j.display().to_string())
            ),
            hint: "give each report its own file (e.g. --json report.json --junit report.xml)"
                .into(),
        });
    }
    Ok(())
}
