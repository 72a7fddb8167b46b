//! docs/schemes.md carries the scheme table exactly as `kquant schemes --markdown` renders it
//! from `quant::registry::SCHEMES`.

use crate::common;

#[test]
fn docs_schemes_md_is_the_scheme_table() {
    let doc = std::fs::read_to_string(common::root().join("docs/schemes.md")).unwrap();
    let begin = "<!-- BEGIN kquant schemes --markdown -->\n";
    let end = "<!-- END kquant schemes --markdown -->";
    let (_, rest) = doc
        .split_once(begin)
        .expect("docs/schemes.md has the BEGIN marker");
    let (table, _) = rest
        .split_once(end)
        .expect("docs/schemes.md has the END marker");
    let out = common::kquant(&["schemes", "--markdown"]);
    assert!(out.status.success());
    let want = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        table, want,
        "docs/schemes.md is stale: paste the output of `kquant schemes --markdown` between its markers"
    );
    // Every scheme has its rows.
    for s in kquant::quant::registry::SCHEMES {
        assert!(table.contains(&format!("| `{}` |", s.id)), "{}", s.id);
    }
}
