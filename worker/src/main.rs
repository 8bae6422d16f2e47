//! `sluice`: the worker binary. Parses the command line, sets up logging and a Tokio runtime,
//! and hands over to the command. Exit codes: 0 success, 1 runtime failure, 2 invalid input.

mod cli;
mod commands;
mod logging;
mod runtime;
mod serve;

use clap::Parser;

/// mimalloc instead of the system allocator: the hot path allocates per message (keys,
/// attributes, rows), and glibc's malloc and free were about a fifth of the instructions of
/// `sluice bench throughput --capacity-only` under callgrind.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    logging::init(cli.log_format, cli.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("sluice: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    let outcome = runtime.block_on(cli::dispatch(cli.command));
    // Background tasks (client lease loops) end with the runtime; do not wait on them.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    outcome
}
