//! docs/formats.md stays in sync with the code: every engine `--to` value and every dialect
//! kquant detects has a row.

use clap::ValueEnum;

#[test]
fn every_engine_and_dialect_is_documented() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/formats.md")).unwrap();
    for e in kquant::convert::DraftLayout::value_variants() {
        assert!(
            doc.contains(&format!("| `{}`", e.id())),
            "engine `{}` missing from docs/formats.md",
            e.id()
        );
    }
    for d in kquant::checkpoint::Dialect::ALL {
        assert!(
            doc.contains(&format!("| `{}`", d.id())),
            "dialect `{}` missing from docs/formats.md",
            d.id()
        );
    }
}
