//! The README's and docs' own commands say what the text says they do: the quick start's output
//! format, the CI gate's threshold against the default, the ModelOpt dry-run's exclusion list.

use crate::common;

use common::kquant_cmd;

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap()
}

/// The arguments of the README line that starts with `kquant <sub>` (in a code block or after
/// `&&`), without the program name.
fn command(text: &str, sub: &str) -> Vec<String> {
    let needle = format!("kquant {sub} ");
    let line = text
        .lines()
        .flat_map(|l| l.split("&&"))
        .map(str::trim)
        .find(|l| l.starts_with(&needle))
        .unwrap_or_else(|| panic!("README has no `{needle}` command"));
    line.split_whitespace().skip(1).map(String::from).collect()
}

#[test]
fn quick_start_writes_the_layout_the_readme_names() {
    let r = readme();
    let mut args = command(&r, "quantize fixtures/tiny/eagle3-specforge");
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("q");
    let o = args.iter().position(|a| a == "-o").unwrap();
    args[o + 1] = out.to_str().unwrap().to_string();
    let run = kquant_cmd().args(&args).output().unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    let version = cfg["quantization_config"]["version"].as_str().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(said.contains("Quark Model layout"), "{said}");
    assert!(
        r.contains(&format!(
            "Quark's model layout\n(`quantization_config.version` {version}"
        )),
        "the README's quick start must name the layout and version it writes ({version})"
    );
    assert!(
        !r.contains("the way\nthe seed recipe does") && !r.contains("the way the seed recipe does")
    );
}

#[test]
fn ci_gate_threshold_is_stated_against_the_default() {
    let r = readme();
    let args = command(&r, "verify --target kimi-k2.5-tiny");
    let m = args.iter().position(|a| a == "--max-regression").unwrap();
    let used = &args[m + 1];
    let help = kquant_cmd().args(["verify", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let default = help
        .split("--max-regression <MAX_REGRESSION>")
        .nth(1)
        .and_then(|s| s.split("[default: ").nth(1))
        .and_then(|s| s.split(']').next())
        .unwrap();
    assert_ne!(
        used, default,
        "the README's gate uses the default: say nothing special"
    );
    assert!(
        r.contains(&format!(
            "{used} is deliberately looser than the default\n`--max-regression {default}`"
        )),
        "the README must say its gate ({used}) is looser than the default ({default})"
    );
}

/// `quantize --dry-run` prints the exclusion list exactly as the real run writes it (docs/quantize.md
/// says so for ModelOpt, whose list has no `re:` entries).
#[test]
fn dry_run_prints_the_exclusion_list_that_is_written() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("q");
    let args = |dry: bool| {
        let mut a = vec![
            "quantize",
            "fixtures/tiny/eagle3-specforge",
            "-o",
            out.to_str().unwrap(),
            "--scheme",
            "fp8-pc",
            "--format",
            "modelopt",
            "--exclude",
            "fc,lm_head",
        ];
        if dry {
            a.push("--dry-run");
        }
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let dry = kquant_cmd().args(args(true)).output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&dry.stdout),
        String::from_utf8_lossy(&dry.stderr)
    );
    let printed = said
        .lines()
        .find_map(|l| l.strip_prefix("quantization_config.ignore: "))
        .unwrap_or_else(|| panic!("{said}"));
    let printed: serde_json::Value = serde_json::from_str(printed).unwrap();
    let run = kquant_cmd().args(args(false)).output().unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(printed, cfg["quantization_config"]["ignore"]);
    assert!(!printed.to_string().contains("re:"), "{printed}");
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/quantize.md")).unwrap();
    assert!(doc.contains("`--dry-run` prints the list\n  exactly as it will be written"));
}

/// docs/architecture.md's module map names every file under `src/`, by itself (`quant/fp8.rs`)
/// or by its folder (`gpu/`); a module's own `mod.rs` and the crate roots need no row.
#[test]
fn every_source_file_is_on_the_map() {
    let map = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/architecture.md"))
        .unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut missing = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let rel = p.strip_prefix(&src).unwrap().to_string_lossy().to_string();
            let name = p.file_name().unwrap().to_string_lossy();
            if !rel.ends_with(".rs") || name == "mod.rs" || rel == "lib.rs" || rel == "main.rs" {
                continue;
            }
            let dir = p
                .parent()
                .unwrap()
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .to_string();
            let named = map.contains(&format!("`{rel}`"))
                || (!dir.is_empty() && map.contains(&format!("`{dir}/`")));
            if !named {
                missing.push(rel);
            }
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "docs/architecture.md does not name: {missing:?}"
    );
}

/// The README's layout names every top-level module of `src/` (a folder as `name/`, a file as
/// `name.rs`; the crate roots need none), so a new module cannot leave it stale.
#[test]
fn the_readme_layout_names_every_top_level_module() {
    let text = readme();
    let layout = &text[text.find("## Layout").expect("a Layout section")..];
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut missing = Vec::new();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let want = if p.is_dir() {
            format!("`{name}/`")
        } else if name.ends_with(".rs") && name != "lib.rs" && name != "main.rs" {
            format!("`{name}`")
        } else {
            continue;
        };
        if !layout.contains(&want) {
            missing.push(want);
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "README.md's layout does not name: {missing:?}"
    );
}

/// #38.23: the README's example is what the binary prints, line for line.
#[test]
fn the_readme_example_is_the_binarys_output() {
    let r = readme();
    let start = r.find("$ kquant inspect ").expect("the README's example");
    let block = &r[start..r[start..].find("```").map_or(r.len(), |e| start + e)];
    let mut lines = block.lines();
    let args: Vec<&str> = lines.next().unwrap().split_whitespace().skip(2).collect();
    let o = kquant_cmd().args(&args).output().unwrap();
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    let said: Vec<&str> = lines.filter(|l| !l.trim().is_empty()).collect();
    let printed: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        said,
        printed,
        "README's `kquant {}` example",
        args.join(" ")
    );
}

/// #38.23: every command and subcommand the binary has is in the README's "What works today".
#[test]
fn what_works_today_names_every_command() {
    let r = readme();
    let start = r.find("## What works today").unwrap();
    let table = &r[start..start + r[start..].find("\n## ").unwrap_or(r.len() - start)];
    let subcommands = |args: &[&str]| -> Vec<String> {
        let mut a = args.to_vec();
        a.push("--help");
        let o = kquant_cmd().args(&a).output().unwrap();
        let h = String::from_utf8_lossy(&o.stdout).into_owned();
        h.split("Commands:")
            .nth(1)
            .map(|c| {
                c.lines()
                    .skip(1)
                    .take_while(|l| l.starts_with("  "))
                    .filter_map(|l| l.split_whitespace().next().map(String::from))
                    .filter(|c| c != "help")
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut missing = Vec::new();
    for c in subcommands(&[]) {
        let subs = subcommands(&[c.as_str()]);
        let names: Vec<String> = if subs.is_empty() {
            vec![format!("kquant {c}")]
        } else {
            subs.iter().map(|s| format!("kquant {c} {s}")).collect()
        };
        for n in names {
            if !table.contains(&format!("`{n} ")) && !table.contains(&format!("`{n}`")) {
                missing.push(n);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "README's \"What works today\" lacks {missing:?}"
    );
}
