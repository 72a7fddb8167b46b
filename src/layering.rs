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

    /// One source file: its text with `//` comments removed, and whether it is a folder's
    /// `mod.rs` (a node named `mod` in its own folder's graph).
    #[derive(Clone)]
    struct Src {
        code: String,
        folder: bool,
    }

    /// Each file's module path (`src/io/writer.rs` → `["io", "writer"]`, `mod.rs` → its
    /// folder).
    fn modules() -> BTreeMap<Vec<String>, Src> {
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
            if m.last().is_some_and(|l| l == "main") {
                continue; // the binary: it only runs the library's `cli`
            }
            let folder = m.last().is_some_and(|l| l == "mod" || l == "lib");
            if folder {
                m.pop();
            }
            let text = std::fs::read_to_string(&f).unwrap();
            out.insert(m, src_of(&text, folder));
        }
        out
    }

    fn src_of(text: &str, folder: bool) -> Src {
        let code: Vec<&str> = text
            .lines()
            .map(|l| l.split("//").next().unwrap())
            .collect();
        Src {
            code: code.join("\n"),
            folder,
        }
    }

    fn is_ident(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '_'
    }

    /// `segs` (a path as written: `crate::a`, `super::b`, `self::c`, `d`) made absolute from
    /// inside module `at`; `None` for a bare head, which only a caller that knows `at`'s
    /// children can place.
    fn absolute(at: &[String], segs: &[&str]) -> Option<Vec<String>> {
        let mut segs = segs.to_vec();
        let mut abs: Vec<String> = match segs.first() {
            Some(&"crate") => Vec::new(),
            Some(&"super" | &"self") => at.to_vec(),
            _ => return None,
        };
        while segs.first() == Some(&"super") {
            abs.pop();
            segs.remove(0);
        }
        if matches!(segs.first(), Some(&"crate" | &"self")) {
            segs.remove(0);
        }
        abs.extend(segs.iter().map(|s| s.to_string()));
        Some(abs)
    }

    /// The paths `code` names from inside module `at`: `crate::a::b`, `super::c`, `self::d`,
    /// and each item of a `{…}` group after one, as absolute segment lists. With `children`,
    /// also a bare `child::x` naming one of `at`'s own child modules (a `mod.rs` reaching its
    /// files), outside `mod child;` declarations and `pub use` re-exports.
    fn named_paths_in(at: &[String], code: &str, children: &BTreeSet<String>) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        let b = code.as_bytes();
        let mut i = 0;
        while i < code.len() {
            let rest = &code[i..];
            let head: String = rest.chars().take_while(|c| is_ident(*c)).collect();
            let prev = (i > 0).then(|| b[i - 1] as char);
            let fresh = !prev.is_some_and(|c| is_ident(c) || c == ':');
            let starts =
                ["crate", "super", "self"].contains(&head.as_str()) || children.contains(&head);
            if !fresh || head.is_empty() || !starts || !rest[head.len()..].starts_with("::") {
                i += rest
                    .chars()
                    .next()
                    .map_or(1, char::len_utf8)
                    .max(head.len());
                continue;
            }
            // The `a::b::c` run, then an optional `::{…}` group.
            let run_len = rest
                .find(|c: char| !(is_ident(c) || c == ':'))
                .unwrap_or(rest.len());
            let run = rest[..run_len].trim_end_matches(':');
            let segs: Vec<&str> = run.split("::").collect();
            let abs = absolute(at, &segs).unwrap_or_else(|| {
                let mut p = at.to_vec();
                p.extend(segs.iter().map(|s| s.to_string()));
                p
            });
            out.push(abs.clone());
            let after = &rest[run_len..];
            if run_len >= 2 && rest[..run_len].ends_with("::") && after.starts_with('{') {
                let group = &after[1..after.find('}').unwrap_or(after.len())];
                for item in group.split(',') {
                    let head = item.trim().split("::").next().unwrap_or("").trim();
                    if !head.is_empty() && head != "self" && head.chars().all(is_ident) {
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

    fn named_paths(at: &[String], code: &str) -> Vec<Vec<String>> {
        named_paths_in(at, code, &BTreeSet::new())
    }

    /// The `pub … use …;` statements of `code`, as byte ranges (a re-export names a file's
    /// items for the folder's users; it is not a use of them).
    fn reexport_spans(code: &str) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut at = 0;
        for line in code.split_inclusive('\n') {
            let t = line.trim_start();
            let rest = t.strip_prefix("pub").unwrap_or("");
            let rest = match rest.strip_prefix('(') {
                Some(r) => r.split_once(')').map_or("", |(_, r)| r),
                None => rest,
            };
            if rest.starts_with(' ') && rest.trim_start().starts_with("use ") {
                let start = at + (line.len() - t.len());
                let end = code[start..]
                    .find(';')
                    .map_or(code.len(), |k| start + k + 1);
                out.push((start, end));
            }
            at += line.len();
        }
        out
    }

    /// `code` with its re-exports and `mod x;` declarations blanked (newlines kept): what a
    /// `mod.rs`'s own code names.
    fn own_code(code: &str) -> String {
        let mut b = code.as_bytes().to_vec();
        for (s, e) in reexport_spans(code) {
            for c in &mut b[s..e] {
                if *c != b'\n' {
                    *c = b' ';
                }
            }
        }
        let text = String::from_utf8(b).unwrap();
        text.lines()
            .map(|l| {
                let t = l.trim_start();
                let t = t.strip_prefix("pub ").unwrap_or(t);
                if t.starts_with("mod ") && t.trim_end().ends_with(';') {
                    ""
                } else {
                    l
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `mod x;` children of a module, `pub use` re-exports (`(module, name) → the path it
    /// names`), and the items a folder's `mod.rs` defines itself.
    struct Names {
        children: BTreeMap<Vec<String>, BTreeSet<String>>,
        reexports: BTreeMap<(Vec<String>, String), Vec<String>>,
        own_items: BTreeMap<Vec<String>, BTreeSet<String>>,
    }

    fn names(mods: &BTreeMap<Vec<String>, Src>) -> Names {
        let mut n = Names {
            children: BTreeMap::new(),
            reexports: BTreeMap::new(),
            own_items: BTreeMap::new(),
        };
        for m in mods.keys() {
            if let Some((last, parent)) = m.split_last() {
                n.children
                    .entry(parent.to_vec())
                    .or_default()
                    .insert(last.clone());
            }
        }
        for (m, s) in mods {
            let kids = n.children.get(m).cloned().unwrap_or_default();
            for (start, end) in reexport_spans(&s.code) {
                let stmt = s.code[start..end].trim_end_matches(';');
                let u = &stmt[stmt.find("use ").unwrap() + 4..];
                for (path, name) in use_tree(u.trim()) {
                    let segs: Vec<&str> = path.iter().map(String::as_str).collect();
                    let abs = absolute(m, &segs).or_else(|| {
                        kids.contains(segs[0]).then(|| {
                            let mut p = m.clone();
                            p.extend(path.iter().cloned());
                            p
                        })
                    });
                    if let Some(abs) = abs {
                        n.reexports.insert((m.clone(), name), abs);
                    }
                }
            }
            if s.folder {
                let mut own = BTreeSet::new();
                for line in s.code.lines() {
                    if line.starts_with(char::is_whitespace) {
                        continue; // not a top-level item
                    }
                    let words: Vec<&str> = line
                        .split(|c: char| !is_ident(c) && c != '!')
                        .filter(|w| !w.is_empty())
                        .collect();
                    let kinds = [
                        "fn",
                        "struct",
                        "enum",
                        "trait",
                        "type",
                        "const",
                        "static",
                        "union",
                        "macro_rules!",
                    ];
                    if let Some(k) = words.iter().position(|w| kinds.contains(w)) {
                        if let Some(name) = words.get(k + 1) {
                            own.insert(name.to_string());
                        }
                    }
                }
                n.own_items.insert(m.clone(), own);
            }
        }
        n
    }

    /// The (path, name) pairs a `use` tree brings in: `a::b::C` → ([a, b, C], C),
    /// `a::{B, c::D as E}` → ([a, B], B), ([a, c, D], E). Globs bring in nothing nameable.
    fn use_tree(u: &str) -> Vec<(Vec<String>, String)> {
        let u: String = u.chars().filter(|c| !c.is_whitespace()).collect();
        let mut out = Vec::new();
        fn walk(prefix: &[String], t: &str, out: &mut Vec<(Vec<String>, String)>) {
            if let Some(open) = t.find('{') {
                let mut p = prefix.to_vec();
                p.extend(
                    t[..open]
                        .trim_end_matches("::")
                        .split("::")
                        .filter(|s| !s.is_empty())
                        .map(String::from),
                );
                let inner = &t[open + 1..t.rfind('}').unwrap_or(t.len())];
                let (mut depth, mut last) = (0, 0);
                for (k, c) in inner.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            walk(&p, &inner[last..k], out);
                            last = k + 1;
                        }
                        _ => {}
                    }
                }
                walk(&p, &inner[last..], out);
                return;
            }
            let (path, alias) = match t.split_once("as") {
                Some((p, a)) if !a.is_empty() && p.ends_with(|c: char| is_ident(c)) => (p, Some(a)),
                _ => (t, None),
            };
            let mut p = prefix.to_vec();
            p.extend(path.split("::").filter(|s| !s.is_empty()).map(String::from));
            let Some(last) = p.last().cloned() else {
                return;
            };
            if last == "*" || last == "self" {
                return;
            }
            out.push((p, alias.unwrap_or(&last).to_string()));
        }
        walk(&[], &u, &mut out);
        out
    }

    /// Where `p` really leads: the longest module it names, with each `pub use` re-export on
    /// the way followed to the file that defines the name; and the item after the module,
    /// if any.
    fn resolve(
        p: &[String],
        mods: &BTreeMap<Vec<String>, Src>,
        n: &Names,
    ) -> Option<(Vec<String>, Option<String>)> {
        let mut p = p.to_vec();
        for _ in 0..16 {
            let m = (0..=p.len())
                .rev()
                .map(|k| p[..k].to_vec())
                .find(|m| mods.contains_key(m))?;
            let item = p.get(m.len()).cloned();
            let Some(next) = item
                .as_ref()
                .and_then(|i| n.reexports.get(&(m.clone(), i.clone())))
            else {
                return Some((m, item));
            };
            let mut q = next.clone();
            q.extend(p[m.len() + 1..].iter().cloned());
            p = q;
        }
        None
    }

    /// For each folder (`[]` the crate root), its files → the sibling files they use (a file
    /// stands for everything under it; a path counts as the module it resolves to, re-exports
    /// followed; a folder's `mod.rs` is the node `mod`: used through the items it defines
    /// itself, using its files through what its own code names). Test code is left out: a
    /// file's tests may use any sibling (the emulator, a fixture); the layers are the product's.
    fn file_graphs_of(
        mods: &BTreeMap<Vec<String>, Src>,
    ) -> BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> {
        let n = names(mods);
        let none = BTreeSet::new();
        let mut out: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
        for (m, s) in mods {
            let kids = if s.folder {
                n.children.get(m).unwrap_or(&none)
            } else {
                &none
            };
            let code = without_tests(&s.code);
            let all = named_paths(m, &code);
            let own = named_paths_in(m, &own_code(&code), kids);
            // The file as a node of each folder above it; a `mod.rs` also in its own.
            let mut nodes: Vec<(Vec<String>, String)> = (0..m.len())
                .map(|depth| (m[..depth].to_vec(), m[depth].clone()))
                .collect();
            if s.folder && !m.is_empty() {
                nodes.push((m.clone(), "mod".to_string()));
            }
            for (folder, from) in nodes {
                let depth = folder.len();
                let e = out
                    .entry(folder.clone())
                    .or_default()
                    .entry(from.clone())
                    .or_default();
                let paths = if depth == m.len() { &own } else { &all };
                for p in paths {
                    let Some((target, item)) = resolve(p, mods, &n) else {
                        continue;
                    };
                    if target.len() < depth || target[..depth] != folder[..] {
                        continue;
                    }
                    let to = if target.len() > depth {
                        target[depth].clone()
                    } else if mods[&target].folder
                        && item.is_some_and(|i| n.own_items[&target].contains(&i))
                    {
                        "mod".to_string()
                    } else {
                        continue;
                    };
                    if to != from {
                        e.insert(to);
                    }
                }
            }
        }
        out
    }

    fn file_graphs() -> BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> {
        file_graphs_of(&modules())
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
    /// The nodes of `g` that lie on some cycle (each reaches itself).
    fn tangled(g: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<String> {
        let reach = |from: &str| {
            let mut seen = BTreeSet::new();
            let mut todo: Vec<&str> = g
                .get(from)
                .into_iter()
                .flatten()
                .map(String::as_str)
                .collect();
            while let Some(n) = todo.pop() {
                if seen.insert(n.to_string()) {
                    todo.extend(g.get(n).into_iter().flatten().map(String::as_str));
                }
            }
            seen
        };
        g.keys()
            .filter(|k| reach(k).contains(*k))
            .cloned()
            .collect()
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
                // The cycle, then every edge among the files that reach each other.
                let tangle = tangled(g);
                let edges: Vec<String> = tangle
                    .iter()
                    .flat_map(|a| {
                        g[a].iter()
                            .filter(|b| tangle.contains(*b))
                            .map(move |b| format!("{a} -> {b}"))
                    })
                    .collect();
                found.push(format!(
                    "src/{}: {} (edges: {})",
                    folder.join("/"),
                    c.join(" -> "),
                    edges.join(", ")
                ));
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
    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    /// A planted folder `x/` (files from `files`: name → text; `mod` is `x/mod.rs`), its
    /// file-level graph.
    fn planted(files: &[(&str, &str)]) -> BTreeMap<String, BTreeSet<String>> {
        let mut mods = BTreeMap::new();
        mods.insert(Vec::new(), src_of("pub mod x;\n", true));
        for (name, text) in files {
            let m = if *name == "mod" {
                v(&["x"])
            } else {
                v(&["x", name])
            };
            mods.insert(m, src_of(text, *name == "mod"));
        }
        file_graphs_of(&mods)[&v(&["x"])].clone()
    }

    /// A cycle through a `mod.rs` re-export is found: `a` names `super::B`, which `mod.rs`
    /// re-exports from `b`, and `b` names `a`'s item the same way.
    #[test]
    fn the_file_checker_follows_reexports() {
        let g = planted(&[
            (
                "mod",
                "mod a;\nmod b;\npub use a::A;\npub(crate) use self::b::{B as Bee, C};\n",
            ),
            ("a", "use super::Bee;\npub struct A;\n"),
            (
                "b",
                "pub struct B;\npub struct C;\nfn f() -> super::A { todo!() }\n",
            ),
        ]);
        assert!(g["a"].contains("b") && g["b"].contains("a"), "{g:?}");
        assert!(cycle(&g).is_some());
        // Re-exports alone are not uses: `mod` uses nothing.
        assert!(g["mod"].is_empty(), "{g:?}");
        // Without the loop back, no cycle.
        let g = planted(&[
            ("mod", "mod a;\nmod b;\npub use b::B;\n"),
            ("a", "use super::B;\n"),
            ("b", "pub struct B;\n"),
        ]);
        assert_eq!(g["a"], BTreeSet::from(["b".to_string()]));
        assert!(cycle(&g).is_none(), "{g:?}");
    }

    /// `mod.rs` is a node: its own code using a file, and that file using an item `mod.rs`
    /// defines, is a cycle (a child named bare, `a::f()`, counts; `mod a;` does not).
    #[test]
    fn the_file_checker_treats_mod_rs_as_a_node() {
        let g = planted(&[
            ("mod", "mod a;\npub struct M;\nfn f() { a::g() }\n"),
            ("a", "pub fn g() {}\nfn h(_: super::M) {}\n"),
        ]);
        assert_eq!(g["mod"], BTreeSet::from(["a".to_string()]), "{g:?}");
        assert_eq!(g["a"], BTreeSet::from(["mod".to_string()]), "{g:?}");
        assert!(cycle(&g).is_some());
        let g = planted(&[
            ("mod", "mod a;\npub struct M;\n"),
            ("a", "fn h(_: super::M) {}\n"),
        ]);
        assert!(g["mod"].is_empty() && cycle(&g).is_none(), "{g:?}");
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
            let Some(rest) = fn_signature(l) else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if let Some((j, true)) = item_end(&lines, i) {
                out.push((name, j - i + 1));
            }
        }
        out
    }

    /// Where the item starting at line `i` ends: the line whose `}` closes its first `{`
    /// (`true`), or the line ending in `;` before any brace opens (`false`: a declaration).
    fn item_end(lines: &[String], i: usize) -> Option<(usize, bool)> {
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
            if opened && depth == 0 {
                return Some((j, true));
            }
            if !opened && m.trim_end().ends_with(';') {
                return Some((j, false));
            }
        }
        None
    }

    /// The text after `fn ` when `line` starts a function, in any of its forms: any
    /// visibility (`pub`, `pub(crate)`, `pub(super)`, `pub(in …)`), then any of `default`,
    /// `const`, `async`, `unsafe`, `extern "…"` (strings already blanked).
    fn fn_signature(line: &str) -> Option<&str> {
        let mut t = line.trim_start();
        if let Some(r) = t.strip_prefix("pub") {
            t = match r.strip_prefix('(') {
                Some(r) => r.split_once(')')?.1,
                None if r.starts_with(' ') => r,
                None => return None,
            }
            .trim_start();
        }
        loop {
            let next = ["default ", "const ", "async ", "unsafe "]
                .iter()
                .find_map(|q| t.strip_prefix(q))
                .or_else(|| {
                    let r = t.strip_prefix("extern ")?.trim_start();
                    Some(r.strip_prefix("\"\"").unwrap_or(r))
                });
            match next {
                Some(r) => t = r.trim_start(),
                None => break,
            }
        }
        t.strip_prefix("fn ")
    }

    /// `code` with the test-only items blanked (each `#[cfg(test)]` or `#[test]` item, to its
    /// closing brace or `;`), line numbers kept.
    fn without_tests(code: &str) -> String {
        let lines: Vec<String> = code.lines().map(blank_strings).collect();
        let mut keep: Vec<bool> = vec![true; lines.len()];
        let mut i = 0;
        while i < lines.len() {
            let t = lines[i].trim();
            if t != "#[cfg(test)]" && t != "#[test]" {
                i += 1;
                continue;
            }
            let end = item_end(&lines, i).map_or(lines.len() - 1, |(j, _)| j);
            keep[i..=end].iter_mut().for_each(|k| *k = false);
            i = end + 1;
        }
        code.lines()
            .zip(keep)
            .map(|(l, k)| if k { l } else { "" })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The files that are test code as a whole: declared `#[cfg(test)] mod x;` by their
    /// parent (`src/quant/gptq/tests.rs`), and this file.
    fn test_files(mods: &BTreeMap<Vec<String>, Src>) -> BTreeSet<Vec<String>> {
        let mut out = BTreeSet::from([vec!["layering".to_string()]]);
        for (m, s) in mods {
            let lines: Vec<&str> = s.code.lines().map(str::trim).collect();
            for w in lines.windows(2) {
                let decl = w[1].strip_prefix("mod ").and_then(|r| r.strip_suffix(';'));
                if let (true, Some(name)) = (w[0] == "#[cfg(test)]", decl) {
                    let mut c = m.clone();
                    c.push(name.trim().to_string());
                    out.insert(c);
                }
            }
        }
        out
    }

    /// No function outside tests is longer than 150 lines, anywhere in `src/`.
    #[test]
    fn no_function_is_over_150_lines() {
        let mods = modules();
        let tests = test_files(&mods);
        let mut long = Vec::new();
        for (m, s) in &mods {
            if tests.contains(m) {
                continue;
            }
            for (name, n) in fn_lengths(&without_tests(&s.code)) {
                if n > 150 {
                    long.push(format!("src/{}: fn {name}: {n} lines", m.join("/")));
                }
            }
        }
        assert!(long.is_empty(), "functions over 150 lines: {long:#?}");
    }

    #[test]
    fn the_length_count_sees_every_fn_form_and_skips_tests() {
        let code = "pub(super) fn a() {\n}\nconst fn b() -> u8 {\n    1\n}\npub(crate) unsafe fn c() {\n}\npub(in crate::x) async fn d() {\n}\nextern \"C\" fn e() {\n}\npub const unsafe fn f() {\n}\n#[cfg(test)]\nmod tests {\n    fn g() {\n    }\n}\n#[test]\nfn h() {\n}\nfn fnord() {}\n";
        let all: Vec<String> = fn_lengths(code).into_iter().map(|(n, _)| n).collect();
        assert_eq!(all, ["a", "b", "c", "d", "e", "f", "g", "h", "fnord"]);
        let kept: Vec<String> = fn_lengths(&without_tests(code))
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(kept, ["a", "b", "c", "d", "e", "f", "fnord"]);
        let mut mods = BTreeMap::new();
        mods.insert(
            v(&["x"]),
            src_of("#[cfg(test)]\nmod tests;\nmod y;\n", true),
        );
        assert!(test_files(&mods).contains(&v(&["x", "tests"])));
        assert!(!test_files(&mods).contains(&v(&["x", "y"])));
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
    /// `output_args`, `deprecated`), the render helpers (`render`, re-exported by `cli/mod.rs`), and a verb's
    /// subcommand files (`Args`, `run`).
    #[test]
    fn the_cli_only_parses_and_renders() {
        let mods = modules();
        let mut long = Vec::new();
        let mut reach = Vec::new();
        for (m, s) in &mods {
            let code = &s.code;
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
                let shared = ["flags", "output_args", "deprecated", "render"]
                    .contains(&p[1].as_str())
                    || !mods.contains_key(&p[..2]);
                let dispatch = p.get(2).is_some_and(|i| i == "Args" || i == "run");
                if !shared && !dispatch {
                    reach.push(format!("src/{}.rs uses {}", m.join("/"), p.join("::")));
                }
            }
        }
        // Outside `cli/`, nothing names it (main.rs runs it).
        for (m, s) in &mods {
            let code = &s.code;
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
