//! Progress bars on stderr (hidden when stderr is not a terminal), each with an ETA in the
//! unit of its work: bytes for reading and writing, items (`positions`, `requests`, `samples`)
//! for replays, measurements and captures.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar over `len` bytes, with the rate.
pub fn bytes(len: u64, what: &str) -> ProgressBar {
    bar(
        len,
        what,
        "{msg:>12} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
    )
}

/// A bar over `len` items named `unit` (`requests`).
pub fn items(len: u64, what: &str, unit: &str) -> ProgressBar {
    bar(
        len,
        what,
        &format!("{{msg:>12}} [{{bar:40}}] {{pos}}/{{len}} {unit} ({{eta}})"),
    )
}

fn bar(len: u64, what: &str, template: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template(template)
            .expect("template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}
