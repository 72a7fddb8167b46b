//! docs/guides.md, held to the code: every path it names exists, and every source file that
//! mentions a section's probe (an existing scheme, format, engine, family, target or device op)
//! is named in that section, by itself or by its folder.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The backticked repository paths of `text` (`src/…`, `tests/…`, `docs/…`, `fixtures/…`,
/// `quant-configs/…`).
fn paths(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            ["src/", "tests/", "docs/", "fixtures/", "quant-configs/"]
                .iter()
                .any(|p| s.starts_with(p))
                && !s.contains(' ')
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn each_guide_names_every_file_its_probe_is_in() {
    let doc = std::fs::read_to_string(root().join("docs/guides.md")).unwrap();
    let mut all = Vec::new();
    sources(&root().join("src"), &mut all);
    let sections: Vec<(&str, &[&str])> = vec![
        (
            "## Adding a scheme",
            &["Int4G64", "\"int4-g64\"", "CtPacked"],
        ),
        ("## Adding a format", &["Format::Modelopt"]),
        ("## Adding a serving engine", &["Engine::Sglang"]),
        (
            "## Adding a draft family or target",
            &["Family::Dflash", "Family::Dspark", "DeepseekV3", "KimiK3"],
        ),
        ("## Adding a device op", &["SiluMul"]),
    ];
    let mut problems = Vec::new();
    for (head, probes) in sections {
        let at = doc
            .find(head)
            .unwrap_or_else(|| panic!("docs/guides.md has no `{head}`"));
        let rest = &doc[at + head.len()..];
        let body = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
        let named = paths(body);
        for p in &named {
            if !root().join(p).exists() {
                problems.push(format!("{head}: `{p}` does not exist"));
            }
        }
        for f in &all {
            let rel = f
                .strip_prefix(root())
                .unwrap()
                .to_string_lossy()
                .to_string();
            let text = std::fs::read_to_string(f).unwrap();
            if !probes.iter().any(|p| text.contains(p)) {
                continue;
            }
            let covered = named
                .iter()
                .any(|n| *n == rel || (n.ends_with('/') && rel.starts_with(n.as_str())));
            if !covered {
                problems.push(format!(
                    "{head}: `{rel}` mentions {probes:?} but is not named"
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/guides.md:\n{}",
        problems.join("\n")
    );
}
