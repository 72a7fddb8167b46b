//! The small render helpers every verb shares: the command line as typed (for manifests),
//! byte and count figures for people, a `--json` document on stdout.

/// The command line as the user typed it, for manifests (an argument that is not UTF-8, such
/// as a path, is recorded with U+FFFD for its invalid bytes).
pub fn command_line() -> Vec<String> {
    std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// Print a `--json` document on stdout, pretty.
pub fn print_json(doc: &impl serde::Serialize) {
    println!("{}", serde_json::to_string_pretty(doc).expect("JSON"));
}

/// Human-readable byte count.
pub fn human_bytes(n: u64) -> String {
    const U: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1000.0 && i < U.len() - 1 {
        v /= 1000.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

/// Human-readable count (k, M, B).
pub fn human_count(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.2} k", n as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2} M", n as f64 / 1e6),
        _ => format!("{:.2} B", n as f64 / 1e9),
    }
}
