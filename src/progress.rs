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

/// A bar over items whose total is known only once the work starts (a calibration replay
/// opens its trace first): drawn from the first [`Deferred::set`], so a run that stops before
/// (an error) never shows a `0/0` bar.
pub struct Deferred {
    bar: std::sync::OnceLock<ProgressBar>,
    what: String,
    unit: String,
}

impl Deferred {
    pub fn new(what: &str, unit: &str) -> Deferred {
        Deferred {
            bar: std::sync::OnceLock::new(),
            what: what.into(),
            unit: unit.into(),
        }
    }
    /// `done` of `total` items.
    pub fn set(&self, done: u64, total: u64) {
        let pb = self
            .bar
            .get_or_init(|| items(total, &self.what, &self.unit));
        pb.set_length(total);
        pb.set_position(done);
    }
    /// Clear the bar, if it was drawn.
    pub fn finish_and_clear(&self) {
        if let Some(pb) = self.bar.get() {
            pb.finish_and_clear();
        }
    }
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
