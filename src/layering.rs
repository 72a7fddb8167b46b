//! The module graph stays acyclic: a test that reads every source file under `src/`, takes the
//! `crate::<module>` paths each top-level module uses (comments left out), and fails on a cycle,
//! naming it. docs/architecture.md draws the resulting layers.

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
}
