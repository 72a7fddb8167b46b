//! The module graph stays acyclic, between top-level modules and between the files of each
//! folder: tests that read every source file under `src/`, take the `crate::`, `super::` and
//! `self::` paths each file uses (comments left out), and fail on a cycle, naming it.
//! docs/architecture.md draws the resulting layers.

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    /// The `crate::<name>` heads used in `text`, comments (`//` to the end of the line) removed.
    fn crate_paths(text: &str) -> BTreeSet<String> {
        let mut v = BTreeSet::new();
        for line in text.lines() {
            let code = line.split("//").next().unwrap();
            let mut rest = code;
            while let Some(i) = rest.find("crate::") {
                rest = &rest[i + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    v.insert(name);
                }
            }
        }
        v
    }

    /// Top-level module → the top-level modules it uses.
    fn graph() -> BTreeMap<String, BTreeSet<String>> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for f in &files {
            let rel = f.strip_prefix(&src).unwrap();
            let top = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let top = top.trim_end_matches(".rs").to_string();
            if top == "lib" || top == "main" || top == "layering" {
                continue;
            }
            let text = std::fs::read_to_string(f).unwrap();
            let uses = crate_paths(&text);
            let e = g.entry(top.clone()).or_default();
            e.extend(uses.into_iter().filter(|u| *u != top));
        }
        // Only edges between modules that exist (not `crate::Error` re-exports and the like).
        let names: BTreeSet<String> = g.keys().cloned().collect();
        for v in g.values_mut() {
            v.retain(|u| names.contains(u));
        }
        g
    }

    /// A cycle through the graph, if there is one (depth-first search, gray/black marking).
    fn cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
        fn visit(
            v: &str,
            g: &BTreeMap<String, BTreeSet<String>>,
            state: &mut BTreeMap<String, u8>,
            stack: &mut Vec<String>,
        ) -> Option<Vec<String>> {
            state.insert(v.to_string(), 1);
            stack.push(v.to_string());
            for w in &g[v] {
                match state.get(w.as_str()).copied().unwrap_or(0) {
                    1 => {
                        let i = stack.iter().position(|s| s == w).unwrap();
                        let mut c = stack[i..].to_vec();
                        c.push(w.clone());
                        return Some(c);
                    }
                    0 => {
                        if let Some(c) = visit(w, g, state, stack) {
                            return Some(c);
                        }
                    }
                    _ => {}
                }
            }
            stack.pop();
            state.insert(v.to_string(), 2);
            None
        }
        let mut state = BTreeMap::new();
        for v in g.keys() {
            if state.get(v.as_str()).copied().unwrap_or(0) == 0 {
                if let Some(c) = visit(v, g, &mut state, &mut Vec::new()) {
                    return Some(c);
                }
            }
        }
        None
    }

    /// Each file's module path (`src/io/writer.rs` → `["io", "writer"]`, `mod.rs` → its
    /// folder), and its text with `//` comments removed.
    fn modules() -> BTreeMap<Vec<String>, String> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut out = BTreeMap::new();
        for f in files {
            let rel = f.strip_prefix(&src).unwrap().with_extension("");
            let mut m: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if m.last()
                .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
            {
                m.pop();
            }
            let text = std::fs::read_to_string(&f).unwrap();
            let code: Vec<&str> = text
                .lines()
                .map(|l| l.split("//").next().unwrap())
                .collect();
            out.insert(m, code.join("\n"));
        }
        out
    }

    /// The paths `code` names from inside module `at`: `crate::a::b`, `super::c`, `self::d`,
    /// and each item of a `{…}` group after one, as absolute segment lists.
    fn named_paths(at: &[String], code: &str) -> Vec<Vec<String>> {
        let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
        let mut out = Vec::new();
        let b = code.as_bytes();
        let mut i = 0;
        while i < code.len() {
            let rest = &code[i..];
            let starts = ["crate::", "super::", "self::"]
                .iter()
                .any(|h| rest.starts_with(h));
            if !starts || (i > 0 && ident(b[i - 1] as char)) {
                i += rest.chars().next().map_or(1, char::len_utf8);
                continue;
            }
            // The `a::b::c` run, then an optional `::{…}` group.
            let run_len = rest
                .find(|c: char| !(ident(c) || c == ':'))
                .unwrap_or(rest.len());
            let run = rest[..run_len].trim_end_matches(':');
            let mut segs: Vec<&str> = run.split("::").collect();
            let mut abs: Vec<String> = match segs[0] {
                "crate" => Vec::new(),
                _ => at.to_vec(),
            };
            while segs.first() == Some(&"super") {
                abs.pop();
                segs.remove(0);
            }
            if matches!(segs.first(), Some(&"crate" | &"self")) {
                segs.remove(0);
            }
            abs.extend(segs.iter().map(|s| s.to_string()));
            out.push(abs.clone());
            let after = &rest[run_len..];
            if run_len >= 2 && rest[..run_len].ends_with("::") && after.starts_with('{') {
                let group = &after[1..after.find('}').unwrap_or(after.len())];
                for item in group.split(',') {
                    let head = item.trim().split("::").next().unwrap_or("").trim();
                    if !head.is_empty() && head != "self" && head.chars().all(ident) {
                        let mut p = abs.clone();
                        p.push(head.to_string());
                        out.push(p);
                    }
                }
            }
            i += run_len.max(1);
        }
        out
    }

    /// For each folder (`[]` the crate root), its files → the sibling files they use (a file
    /// stands for everything under it; a path counts as the longest module it names).
    fn file_graphs() -> BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> {
        let mods = modules();
        let longest = |p: &[String]| -> Option<Vec<String>> {
            (1..=p.len())
                .rev()
                .map(|k| p[..k].to_vec())
                .find(|m| mods.contains_key(m))
        };
        let mut out: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
        for (m, code) in &mods {
            for depth in 0..m.len() {
                let folder = m[..depth].to_vec();
                let from = m[depth].clone();
                let e = out
                    .entry(folder.clone())
                    .or_default()
                    .entry(from.clone())
                    .or_default();
                for p in named_paths(m, code) {
                    let Some(target) = longest(&p) else { continue };
                    if target.len() > depth
                        && target[..depth] == folder[..]
                        && target[depth] != from
                    {
                        e.insert(target[depth].clone());
                    }
                }
            }
        }
        out
    }

    #[test]
    fn the_module_graph_is_acyclic() {
        let g = graph();
        assert!(g.len() >= 10, "{g:?}");
        if let Some(c) = cycle(&g) {
            panic!(
                "module cycle: {} (docs/architecture.md, \"Module graph\", says which way each \
                 edge goes)",
                c.join(" -> ")
            );
        }
    }

    #[test]
    fn the_checker_finds_a_planted_cycle() {
        let mut g = graph();
        g.get_mut("error").unwrap().insert("cli".into());
        let c = cycle(&g).expect("error -> cli closes a cycle");
        assert_eq!(c.first(), c.last());
        assert!(c.contains(&"error".to_string()) && c.contains(&"cli".to_string()));
    }

    #[test]
    fn comments_do_not_count() {
        let p = crate_paths(
            "use crate::io::Shard; // see crate::cli\n//! crate::gpu\nlet x = crate::quant::f();",
        );
        assert_eq!(p, ["io", "quant"].map(String::from).into());
    }
    #[test]
    fn no_folder_has_a_file_level_cycle() {
        let gs = file_graphs();
        assert!(gs.len() >= 10, "{:?}", gs.keys());
        let mut found = Vec::new();
        for (folder, g) in &gs {
            if folder.is_empty() {
                continue; // the top level is the_module_graph_is_acyclic's
            }
            if let Some(c) = cycle(g) {
                found.push(format!("src/{}: {}", folder.join("/"), c.join(" -> ")));
            }
        }
        assert!(found.is_empty(), "file-level cycles: {found:#?}");
    }

    #[test]
    fn the_file_checker_reads_super_self_and_groups() {
        let at: Vec<String> = ["io", "writer"].map(String::from).into();
        let p = named_paths(
            &at,
            "use super::manifest::{hash_file, Manifest};\nlet h = super::hash::hex(b);\nuse self::x::Y;\nlet z = crate::quant::{codec, math::int4};",
        );
        let s: BTreeSet<String> = p.iter().map(|v| v.join("::")).collect();
        for want in [
            "io::manifest",
            "io::manifest::hash_file",
            "io::hash::hex",
            "io::writer::x::Y",
            "quant",
            "quant::codec",
            "quant::math",
        ] {
            assert!(s.contains(want), "{want} not in {s:?}");
        }
        // A planted pair of siblings that use each other is a cycle.
        let mut g = file_graphs()[&vec!["io".to_string()]].clone();
        g.get_mut("hash").unwrap().insert("writer".into());
        let c = cycle(&g).expect("hash -> writer -> hash");
        assert_eq!(c.first(), c.last());
    }
    /// The layers of the top-level graph, drawn: each module one row above the highest module
    /// it uses, then what each module uses directly.
    fn diagram(g: &BTreeMap<String, BTreeSet<String>>) -> String {
        fn level(
            m: &str,
            g: &BTreeMap<String, BTreeSet<String>>,
            memo: &mut BTreeMap<String, usize>,
        ) -> usize {
            if let Some(&l) = memo.get(m) {
                return l;
            }
            let l = g[m]
                .iter()
                .map(|d| level(d, g, memo) + 1)
                .max()
                .unwrap_or(0);
            memo.insert(m.to_string(), l);
            l
        }
        let mut memo = BTreeMap::new();
        let mut rows: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
        for m in g.keys() {
            rows.entry(level(m, g, &mut memo)).or_default().push(m);
        }
        let mut out = String::new();
        for (l, ms) in rows.iter().rev() {
            out.push_str(&format!("{l:>2}  {}\n", ms.join("  ")));
        }
        out.push('\n');
        for (l, ms) in rows.iter().rev() {
            for m in ms {
                let uses: Vec<&str> = g[*m].iter().map(String::as_str).collect();
                let uses = if uses.is_empty() {
                    "nothing".to_string()
                } else {
                    uses.join(", ")
                };
                out.push_str(&format!("{m:<10} (layer {l}) uses {uses}\n"));
            }
        }
        out
    }

    /// docs/architecture.md's layer diagram is the one the code makes: the fenced block after
    /// the "### Module graph" heading's paragraph.
    #[test]
    fn the_architecture_diagram_is_the_module_graph() {
        let want = diagram(&graph());
        let doc = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md"),
        )
        .unwrap();
        let section = &doc[doc
            .find("### Module graph")
            .expect("the Module graph section")..];
        let start = section.find("```text\n").expect("a ```text block") + "```text\n".len();
        let end = start + section[start..].find("```").unwrap();
        assert_eq!(
            &section[start..end],
            want,
            "docs/architecture.md's layer diagram is stale; the code's is:\n{want}"
        );
    }

    #[test]
    fn the_diagram_puts_a_user_above_what_it_uses() {
        let mut g = BTreeMap::new();
        g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
        g.insert("b".to_string(), BTreeSet::new());
        g.insert("c".to_string(), BTreeSet::from(["b".to_string()]));
        let d = diagram(&g);
        assert!(d.starts_with(" 1  a  c\n 0  b\n\n"), "{d}");
        assert!(d.contains("b          (layer 0) uses nothing\n"), "{d}");
    }
    /// The functions in `code` with their line counts (signature to closing brace), by a brace
    /// count over the code with `//` comments, strings and char literals blanked.
    fn fn_lengths(code: &str) -> Vec<(String, usize)> {
        let lines: Vec<String> = code.lines().map(blank_strings).collect();
        let mut out = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            let t = l.trim_start();
            let t = t
                .strip_prefix("pub(crate) ")
                .or(t.strip_prefix("pub "))
                .unwrap_or(t);
            let Some(rest) = t.strip_prefix("fn ") else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let (mut depth, mut opened) = (0i64, false);
            for (j, m) in lines.iter().enumerate().skip(i) {
                for c in m.chars() {
                    match c {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth -= 1,
                        _ => {}
                    }
                }
                if !opened && m.trim_end().ends_with(';') {
                    break; // a declaration without a body
                }
                if opened && depth == 0 {
                    out.push((name.clone(), j - i + 1));
                    break;
                }
            }
        }
        out
    }

    /// `line` with its string and char literals' contents blanked (so braces in them do not
    /// count).
    fn blank_strings(line: &str) -> String {
        let mut out = String::new();
        let (mut in_str, mut esc) = (false, false);
        let cs: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < cs.len() {
            let c = cs[i];
            if in_str {
                if esc {
                    esc = false;
                } else if c == '\\' {
                    esc = true;
                } else if c == '"' {
                    in_str = false;
                    out.push('"');
                }
                i += 1;
                continue;
            }
            match c {
                '"' => {
                    in_str = true;
                    out.push('"');
                }
                '\'' if i + 2 < cs.len() && (cs[i + 2] == '\'' || cs[i + 1] == '\\') => {
                    // a char literal: 'x' or '\n'
                    let end = (i + 1..cs.len())
                        .find(|&k| k > i + 1 && cs[k] == '\'')
                        .unwrap_or(i);
                    out.push_str("' '");
                    i = end + 1;
                    continue;
                }
                _ => out.push(c),
            }
            i += 1;
        }
        out
    }

    /// The CLI parses and renders: no function in `src/cli/` is longer than 100 lines, and no
    /// file there uses another's items, except the shared flag groups (`flags`,
    /// `output_args`, `deprecated`), the render helpers of `cli/mod.rs`, and a verb's
    /// subcommand files (`Args`, `run`).
    #[test]
    fn the_cli_only_parses_and_renders() {
        let mods = modules();
        let mut long = Vec::new();
        let mut reach = Vec::new();
        for (m, code) in &mods {
            if m.first().map(String::as_str) != Some("cli") || m.len() < 2 {
                continue;
            }
            for (name, n) in fn_lengths(code) {
                if n > 100 {
                    long.push(format!("src/{}.rs: fn {name}: {n} lines", m.join("/")));
                }
            }
            for p in named_paths(m, code) {
                if p.len() < 2 || p[0] != "cli" || p[1] == m[1] {
                    continue;
                }
                let shared = ["flags", "output_args", "deprecated"].contains(&p[1].as_str())
                    || !mods.contains_key(&p[..2]);
                let dispatch = p.get(2).is_some_and(|i| i == "Args" || i == "run");
                if !shared && !dispatch {
                    reach.push(format!("src/{}.rs uses {}", m.join("/"), p.join("::")));
                }
            }
        }
        // Outside `cli/`, nothing names it (main.rs runs it).
        for (m, code) in &mods {
            // (This file's own tests spell `crate::cli` in strings.)
            if m.is_empty() || ["cli", "layering"].contains(&m[0].as_str()) {
                continue;
            }
            if named_paths(m, code)
                .iter()
                .any(|p| p.first().map(String::as_str) == Some("cli"))
            {
                reach.push(format!("src/{}.rs uses crate::cli", m.join("/")));
            }
        }
        assert!(
            long.is_empty(),
            "functions over 100 lines in src/cli/: {long:#?}"
        );
        assert!(
            reach.is_empty(),
            "logic in src/cli/ called from elsewhere: {reach:#?}"
        );
    }

    #[test]
    fn the_length_count_sees_braces_in_code_only() {
        let code = "fn a() {\n    let s = \"}}}\";\n    let c = '{';\n}\npub fn b(x: u8) -> u8 {\n    x\n}\nfn c();\n";
        assert_eq!(
            fn_lengths(code),
            vec![("a".to_string(), 4), ("b".to_string(), 3)]
        );
    }
}
