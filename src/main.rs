//! The `kquant` binary: parse → run → exit code (0 ok, 1 verify gate failed, 2 error).

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // When the reader of stdout or stderr goes away (`kquant quantize … 2>&1 | head -1`) the run
    // goes on and ends with its own status: its output is relayed and dropped, never a SIGPIPE
    // death that leaves a partial output (io::stdio). First, before any thread exists.
    let relay = kquant::io::stdio::install();
    // Remove partial outputs on SIGINT/SIGTERM/SIGHUP; name the input that shrank on SIGBUS.
    kquant::io::interrupt::install();
    let code = match kquant::cli::Cli::try_parse() {
        Ok(cli) => match kquant::cli::run(cli) {
            Ok(code) => code,
            Err(e) => {
                kquant::cli::render_error(&e);
                ExitCode::from(2)
            }
        },
        Err(e) => kquant::cli::render_clap_error(e),
    };
    relay.finish();
    code
}
