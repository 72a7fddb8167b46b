//! The `kquant` binary: parse → run → exit code (0 ok, 1 verify gate failed, 2 error).

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = kquant::cli::Cli::parse();
    match kquant::cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            kquant::cli::render_error(&e);
            ExitCode::from(2)
        }
    }
}
