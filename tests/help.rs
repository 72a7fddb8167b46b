//! Every command's `--help` through the real binary: each argument and option has a
//! description, and none says the same sentence twice. Commands are found from the help itself (`kquant help`, then each command's
//! own `Commands:` list), so a new command or option is covered without editing this file.

use crate::common;

use common::kquant_cmd;

fn help(path: &[String]) -> String {
    let o = kquant_cmd().args(path).arg("--help").output().unwrap();
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

/// Whether a flag takes a value: none (a switch), an optional one (`[<FILE>]`) or a required one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Takes {
    Nothing,
    Optional,
    Value,
}

/// One flag of a command's help: long name, short alias, what it takes.
type Flag = (String, Option<String>, Takes);

/// The flags of one command's help, from its `Options:` entries (`-o, --output <OUTPUT>`,
/// `--json [<FILE>]`, `--force`).
fn flags_of(help: &str) -> Vec<Flag> {
    section(help, "Options:")
        .into_iter()
        .map(|(first, _)| {
            let spec = first.trim_start();
            let spec = spec.split("  ").next().unwrap();
            let mut short = None;
            let mut long = None;
            for part in spec.split(", ") {
                if part.starts_with("--") {
                    long = Some(part.to_string());
                } else if part.starts_with('-') {
                    short = Some(part.to_string());
                }
            }
            let long = long.unwrap_or_else(|| panic!("no long flag in `{spec}`"));
            let (name, rest) = long.split_once(' ').unwrap_or((&long, ""));
            let takes = if rest.starts_with("[<") {
                Takes::Optional
            } else if rest.starts_with('<') {
                Takes::Value
            } else {
                Takes::Nothing
            };
            (name.to_string(), short, takes)
        })
        .collect()
}

/// The backquoted words of a table cell.
fn ticks(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect()
}

/// The cells of a Markdown table row (`\|` inside a cell is not a separator).
fn cells(row: &str) -> Vec<String> {
    let inner = row.trim().trim_start_matches('|').trim_end_matches('|');
    let mut out = vec![String::new()];
    let mut prev = ' ';
    for ch in inner.chars() {
        if ch == '|' && prev != '\\' {
            out.push(String::new());
        } else {
            out.last_mut().unwrap().push(ch);
        }
        prev = ch;
    }
    out.iter().map(|c| c.trim().to_string()).collect()
}

/// The rows of the table under `## heading` in `doc` (header and separator left out).
fn table(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let mut inside = false;
    let mut rows = Vec::new();
    for line in doc.lines() {
        if line.starts_with("## ") {
            inside = line.trim() == format!("## {heading}");
            continue;
        }
        if inside && line.starts_with('|') && !line.starts_with("|---") {
            rows.push(cells(line));
        }
    }
    assert!(
        rows.len() > 1,
        "docs/flags.md has no table under `## {heading}`"
    );
    rows.remove(0);
    rows
}

/// docs/flags.md's flag table is the CLI's: every flag of every command's `--help` has the one
/// row that names it (with its short alias and that command), every command a row names has the
/// flag, a switch is documented as one, and each deprecated spelling is hidden and still taken.
#[test]
fn docs_flags_md_lists_every_flag_once_with_the_commands_that_take_it() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/flags.md")).unwrap();
    let name = |c: &[String]| {
        if c.is_empty() {
            "kquant".to_string()
        } else {
            c.join(" ")
        }
    };
    let cmds = commands();
    let helps: Vec<(String, Vec<Flag>)> =
        cmds.iter().map(|c| (name(c), flags_of(&help(c)))).collect();
    let deprecated: Vec<(String, String, Vec<String>)> = table(&doc, "Deprecated spellings")
        .iter()
        .map(|r| {
            assert_eq!(r.len(), 3, "{r:?}");
            (
                ticks(&r[0])[0].clone(),
                ticks(&r[1])[0].clone(),
                ticks(&r[2]),
            )
        })
        .collect();

    let mut problems = Vec::new();
    let mut rows: std::collections::BTreeMap<String, (Option<String>, Vec<String>, String)> =
        Default::default();
    for r in table(&doc, "Flags") {
        assert_eq!(
            r.len(),
            4,
            "docs/flags.md row {r:?}: flag | commands | meaning | value"
        );
        let f = ticks(&r[0]);
        let long = f.iter().find(|x| x.starts_with("--")).cloned();
        let Some(long) = long else {
            problems.push(format!("row without a long flag: {r:?}"));
            continue;
        };
        let short = f.iter().find(|x| !x.starts_with("--")).cloned();
        let on: Vec<String> = if r[1] == "every command" {
            helps.iter().map(|(c, _)| c.clone()).collect()
        } else {
            ticks(&r[1])
        };
        if r[2].is_empty() || r[3].is_empty() {
            problems.push(format!("{long}: the meaning or the value form is empty"));
        }
        if rows
            .insert(long.clone(), (short, on, r[3].clone()))
            .is_some()
        {
            problems.push(format!("{long} has two rows: one flag, one meaning"));
        }
    }
    // Every flag of every command's help is in its row, with the same short alias.
    for (cmd, flags) in &helps {
        for (long, short, takes) in flags {
            match rows.get(long) {
                None => problems.push(format!("`{cmd} {long}` is missing from docs/flags.md")),
                Some((s, on, value)) => {
                    if !on.contains(cmd) {
                        problems.push(format!("`{cmd} {long}`: its row does not name `{cmd}`"));
                    }
                    if s != short {
                        problems.push(format!("`{cmd} {long}`: short alias {short:?} in --help, {s:?} in docs/flags.md"));
                    }
                    let switch = value.starts_with("switch");
                    if switch != (*takes != Takes::Value) {
                        problems.push(format!(
                            "`{cmd} {long}` takes {takes:?}, docs/flags.md says `{value}`"
                        ));
                    }
                }
            }
        }
    }
    // Every (flag, command) a row names exists.
    for (long, (_, on, _)) in &rows {
        for cmd in on {
            match helps.iter().find(|(c, _)| c == cmd) {
                None => problems.push(format!("{long}: no command `{cmd}`")),
                Some((_, flags)) => {
                    if !flags.iter().any(|f| &f.0 == long) {
                        problems.push(format!(
                            "docs/flags.md says `{cmd}` takes {long}; it does not"
                        ));
                    }
                }
            }
        }
    }
    // Deprecated spellings: hidden, the new one documented for the command, the old one still
    // known to the parser (an unknown flag is `unexpected argument`, before `--help` is read).
    for (old, new, on) in &deprecated {
        for cmd in on {
            let flags = &helps
                .iter()
                .find(|(c, _)| c == cmd)
                .unwrap_or_else(|| panic!("{cmd}"))
                .1;
            if flags.iter().any(|f| &f.0 == old) {
                problems.push(format!("deprecated `{cmd} {old}` shows in --help"));
            }
            match rows.get(new) {
                Some((_, cs, value)) if cs.contains(cmd) => {
                    let mut args: Vec<String> = cmd.split(' ').map(String::from).collect();
                    args.push(old.clone());
                    if !value.starts_with("switch") {
                        args.push("x".into());
                    }
                    args.push("--help".into());
                    let o = kquant_cmd().args(&args).output().unwrap();
                    // Known: help printed, or the value refused (`x` is no `--from` engine).
                    if String::from_utf8_lossy(&o.stderr).contains("unexpected argument") {
                        problems.push(format!(
                            "kquant {}: {}",
                            args.join(" "),
                            String::from_utf8_lossy(&o.stderr)
                        ));
                    }
                }
                _ => problems.push(format!(
                    "{old} → {new}: docs/flags.md has no `{cmd}` in {new}'s row"
                )),
            }
        }
    }
    assert!(rows.len() > 50, "only {} rows parsed", rows.len());
    assert!(
        problems.is_empty(),
        "docs/flags.md vs --help:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_flag_table_parser_reads_aliases_values_and_escaped_pipes() {
    let help = "Options:\n  -o, --output <OUTPUT>  Output\n      --json [<FILE>]\n          JSON\n      --force\n          Replace\n          Possible values:\n          - a: b\n";
    assert_eq!(
        flags_of(help),
        vec![
            ("--output".to_string(), Some("-o".to_string()), Takes::Value),
            ("--json".to_string(), None, Takes::Optional),
            ("--force".to_string(), None, Takes::Nothing),
        ]
    );
    assert_eq!(
        cells("| `--act` | `bench gemm` | dtype | `bf16` \\| `f16` |"),
        vec!["`--act`", "`bench gemm`", "dtype", "`bf16` \\| `f16`"]
    );
    assert_eq!(ticks("`--output`, `-o`"), vec!["--output", "-o"]);
}

/// An unknown command or flag is answered with what exists: the commands of the command the
/// usage names, or every flag of the command (as its --help lists them), not `kquant --help`.
#[test]
fn unknown_commands_and_flags_get_a_hint_naming_what_exists() {
    let hint_of = |args: &[&str]| -> String {
        let o = kquant_cmd().args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let e = String::from_utf8_lossy(&o.stderr).into_owned();
        e.lines()
            .find_map(|l| l.strip_prefix("hint: "))
            .unwrap_or_else(|| panic!("{args:?}: {e}"))
            .to_string()
    };
    for path in [&[][..], &["trace"], &["bench"]] {
        let p: Vec<String> = path.iter().map(|s| s.to_string()).collect();
        let mut args = path.to_vec();
        args.push("frobnicate");
        let h = hint_of(&args);
        let subs: Vec<String> = section(&help(&p), "Commands:")
            .iter()
            .map(|(l, _)| l.split_whitespace().next().unwrap().to_string())
            .filter(|n| n != "help")
            .collect();
        assert!(!subs.is_empty());
        for s in &subs {
            assert!(
                h.contains(&format!(" {s}")),
                "{path:?}: {s} missing from: {h}"
            );
        }
    }
    let mut checked = 0;
    for c in commands() {
        let text = help(&c);
        if !section(&text, "Commands:").is_empty() {
            continue;
        }
        let mut args: Vec<&str> = c.iter().map(String::as_str).collect();
        args.push("--no-such-flag");
        let o = kquant_cmd().args(&args).output().unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        if !e.contains("unexpected argument") {
            continue; // takes trailing arguments (bench quantize / convert pass them on)
        }
        let h = hint_of(&args);
        for (long, short, _) in flags_of(&text) {
            if long == "--help" || long == "--version" {
                continue;
            }
            let want = match short {
                Some(s) => format!("{long} ({s})"),
                None => long.clone(),
            };
            assert!(
                h.contains(&want),
                "kquant {}: {want} missing from: {h}",
                c.join(" ")
            );
        }
        checked += 1;
    }
    assert!(
        checked >= 10,
        "only {checked} commands refused an unknown flag"
    );
}

/// #38.23: docs/flags.md names no test constant the test does not have (the `trace import`
/// change it said was pending has landed), and no doc lists a deprecated spelling as a
/// command's flag.
#[test]
fn docs_describe_the_flags_as_they_are() {
    let root = env!("CARGO_MANIFEST_DIR");
    let flags = std::fs::read_to_string(format!("{root}/docs/flags.md")).unwrap();
    let this = std::fs::read_to_string(format!("{root}/tests/help.rs")).unwrap();
    for word in flags.split('`').skip(1).step_by(2) {
        let constant = word.len() > 3
            && word
                .chars()
                .all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_digit())
            && word.contains('_');
        if constant {
            assert!(
                this.contains(&format!("const {word}")),
                "docs/flags.md names `{word}`, which tests/help.rs does not define"
            );
        }
    }
    assert!(
        !flags.contains("being changed"),
        "docs/flags.md: a change said to be pending"
    );
    for page in ["docs/verify.md", "docs/quantize.md", "README.md"] {
        let text = std::fs::read_to_string(format!("{root}/{page}")).unwrap();
        for old in ["--input", "--out"] {
            assert!(
                !text.contains(&format!("- `{old}`:")),
                "{page} lists the deprecated `{old}` as a flag"
            );
        }
    }
}

/// #38.23: `verify --target`'s help names every live profile `kquant targets` lists, and `bench
/// replay` is not said to run on the CPU only (it takes `--device`).
#[test]
fn help_names_what_the_binary_has() {
    let o = kquant_cmd().args(["targets", "--json"]).output().unwrap();
    let t: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let verify = help(&["verify".to_string()]);
    let flat = verify.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut live = 0;
    for p in t["targets"].as_array().unwrap() {
        if !p["live"].is_null() {
            live += 1;
            let name = p["name"].as_str().unwrap();
            assert!(
                flat.contains(&format!("`{name}`")),
                "verify --help names no live `{name}`"
            );
        }
    }
    assert!(live >= 2);
    let bench = help(&["bench".to_string()]);
    let replay = help(&["bench".to_string(), "replay".to_string()]);
    assert!(replay.contains("--device"));
    assert!(!bench.contains("replay of a draft on the CPU"), "{bench}");
    assert!(!replay.contains("replay of a draft on the CPU"), "{replay}");
}
