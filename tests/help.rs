//! Every command's `--help` through the real binary: each argument and option has a
//! description, and none says the same sentence twice. Commands are found from the help itself (`kquant help`, then each command's
//! own `Commands:` list), so a new command or option is covered without editing this file.

use std::process::Command;

fn help(path: &[String]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_kquant"))
        .args(path)
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "kquant {} --help: {}",
        path.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// The entries of section `title` (`Commands:`, `Options:`, `Arguments:`): each entry's first
/// line and the description lines that follow it (more indented, up to the next entry).
fn section(text: &str, title: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if !line.starts_with(' ') && !line.is_empty() {
            inside = line.trim_end() == title;
            continue;
        }
        if !inside {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        if (1..=6).contains(&indent) {
            out.push((line.to_string(), Vec::new()));
        } else if let Some(e) = out.last_mut() {
            e.1.push(line.trim().to_string());
        }
    }
    out
}

/// The description of an entry: text on its own line after the flag (two or more spaces
/// apart), else its first following non-blank line, unless that line only lists values or a
/// default.
fn description(first: &str, rest: &[String]) -> Option<String> {
    let generated = [
        "[default:",
        "[possible values:",
        "Possible values:",
        "[env:",
        "[aliases:",
    ];
    let spec = first.trim_start();
    let d = match spec.find("  ").map(|i| spec[i..].trim()) {
        Some(d) if !d.is_empty() => d,
        _ => rest.iter().find(|l| !l.is_empty())?,
    };
    (!generated.iter().any(|g| d.starts_with(g))).then(|| d.to_string())
}

/// `kquant help`'s commands, then each one's subcommands: every command path.
fn commands() -> Vec<Vec<String>> {
    let mut todo: Vec<Vec<String>> = vec![vec![]];
    let mut all = Vec::new();
    while let Some(p) = todo.pop() {
        let text = help(&p);
        for (line, _) in section(&text, "Commands:") {
            let name = line.split_whitespace().next().unwrap().to_string();
            if name != "help" {
                let mut q = p.clone();
                q.push(name);
                todo.push(q);
            }
        }
        all.push(p);
    }
    all
}

#[test]
fn every_argument_and_option_of_every_command_has_a_description() {
    let cmds = commands();
    // The walk found the nested commands too (a broken parser would find none).
    for want in [&["convert"][..], &["dequantize"], &["trace", "import"]] {
        assert!(
            cmds.iter().any(|c| c == want),
            "{want:?} not found in {cmds:?}"
        );
    }
    let mut missing = Vec::new();
    let mut checked = 0;
    for c in &cmds {
        let text = help(c);
        for title in ["Arguments:", "Options:"] {
            for (first, rest) in section(&text, title) {
                checked += 1;
                if description(&first, &rest).is_none() {
                    missing.push(format!("kquant {}: {}", c.join(" "), first.trim()));
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} entries parsed");
    assert!(
        missing.is_empty(),
        "options without a description:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_description_parser_sees_a_missing_one() {
    // Both of clap's layouts: short (description on the flag's line) and long (next lines).
    let short = "Options:\n  -o, --output <OUTPUT>\n          \n      --dtype <DTYPE>\n          dtype of the weights [possible values: bf16]\n";
    let e = section(short, "Options:");
    assert_eq!(e.len(), 2);
    assert_eq!(description(&e[0].0, &e[0].1), None);
    assert!(description(&e[1].0, &e[1].1).is_some());
    let e = section(
        "Options:\n      --scratch <S>  [default: /tmp]\n",
        "Options:",
    );
    assert_eq!(description(&e[0].0, &e[0].1), None);
    let long = "Options:\n      --steps <STEPS>\n          \n          [default: 3]\n\n      --json\n          Print JSON\n\n  -h, --help     Print help\n";
    let e = section(long, "Options:");
    assert_eq!(e.len(), 3);
    assert_eq!(description(&e[0].0, &e[0].1), None);
    assert_eq!(description(&e[1].0, &e[1].1).as_deref(), Some("Print JSON"));
    assert_eq!(description(&e[2].0, &e[2].1).as_deref(), Some("Print help"));
}

/// No help line says the same sentence twice (`--scheme`'s once did), and the top-level list
/// names every output format `quantize` writes.
#[test]
fn help_says_each_thing_once() {
    let top = help(&[]);
    let q = section(&top, "Commands:")
        .into_iter()
        .find(|(l, _)| l.trim_start().starts_with("quantize"))
        .unwrap()
        .0;
    for f in ["Quark", "compressed-tensors", "ModelOpt"] {
        assert!(
            q.contains(f),
            "quantize's one-line description leaves out {f}: {q}"
        );
    }
    for c in commands() {
        for line in help(&c).lines() {
            let sentences: Vec<&str> = line
                .split(". ")
                .map(|s| s.trim().trim_end_matches('.'))
                .filter(|s| s.len() > 20)
                .collect();
            for (i, s) in sentences.iter().enumerate() {
                assert!(
                    !sentences[i + 1..].contains(s),
                    "`kquant {} --help` says twice: {s}",
                    c.join(" ")
                );
            }
        }
    }
}
