//! The `kquant` binary: parse → run → exit code (0 ok, 1 verify gate failed, 2 error).

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Behave like other Unix tools when the reader of stdout goes away (`kquant inspect | head`):
    // die quietly from SIGPIPE instead of panicking on a failed print.
    // SAFETY: called once at start-up, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // Remove partial outputs on SIGINT/SIGTERM/SIGHUP; name the input that shrank on SIGBUS.
    kquant::io::interrupt::install();
    let cli = match kquant::cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return kquant::cli::render_clap_error(e),
    };
    match kquant::cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            kquant::cli::render_error(&e);
            ExitCode::from(2)
        }
    }
}
