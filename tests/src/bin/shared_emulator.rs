//! Starts one Pub/Sub emulator for a whole test run: prints its endpoint on the first line of
//! stdout, then keeps it until stdin closes (or this process is killed; the emulator's watchdog
//! then stops it). `scripts/test` runs it and hands the endpoint to every test process through
//! `SLUICE_TEST_PUBSUB`. It refuses to start the emulator without its stream fix
//! (`bench/src/emulator_fix.rs`), which the suite's waits assume.

use sluice_bench::Emulator;
use std::io::{Read, Write};
use std::process::ExitCode;

fn main() -> ExitCode {
    let emulator = match Emulator::start_fixed() {
        Ok(emulator) => emulator,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout();
    if writeln!(out, "{}", emulator.endpoint())
        .and_then(|()| out.flush())
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    // Held until the caller closes stdin.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(emulator);
    ExitCode::SUCCESS
}
