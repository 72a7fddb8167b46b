//! The `kquant` binary: parse → run → exit code (0 ok, 1 verify gate failed, 2 error).

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

fn main() -> ExitCode {
    // When the reader of stdout or stderr goes away (`kquant quantize … 2>&1 | head -1`) the run
    // goes on and ends with its own status: its output is relayed and dropped, never a SIGPIPE
    // death that leaves a partial output (io::stdio). First, before any thread exists.
    let relay = kquant::io::stdio::install();
    // Remove partial outputs on SIGINT/SIGTERM/SIGHUP; name the input that shrank on SIGBUS.
    kquant::io::interrupt::install();
    let parsed = kquant::cli::Cli::command().try_get_matches().and_then(|m| {
        // Every path the command line names is a read the outputs are held against
        // (io::reads), before the command opens anything.
        kquant::io::reads::note_args(&m);
        kquant::cli::Cli::from_arg_matches(&m).map(|cli| (cli, m))
    });
    let code = match parsed {
        // An output that is, holds or sits inside a path the command reads is refused before
        // the command does any work (io::reads).
        Ok((cli, m)) => {
            match kquant::io::output::check_output_args(&m).and_then(|_| kquant::cli::run(cli)) {
                Ok(code) => code,
                Err(e) => {
                    kquant::cli::render_error(&e);
                    ExitCode::from(2)
                }
            }
        }
        Err(e) => kquant::cli::render_clap_error(e),
    };
    relay.finish();
    code
}
