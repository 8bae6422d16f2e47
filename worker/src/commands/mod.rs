//! The commands of the `sluice` binary, one file each; each prints its own output (and owns
//! its output format) and returns the exit code: 0 success, 1 runtime failure, 2 invalid input.

pub mod bench;
pub mod demo;
pub mod graph;
pub mod refresh;
pub mod run;
pub mod runs;
pub mod status;
pub mod text;
pub mod validate;

use sluice_pipeline::Pipeline;
use std::path::Path;
use std::process::ExitCode;

/// Loads the pipeline file, or prints every error (file, path, line, message) and gives the
/// exit code 2 to return.
pub fn load_or_exit(path: &Path) -> Result<Pipeline, ExitCode> {
    sluice_pipeline::load(path).map_err(exit_invalid)
}

/// As [`load_or_exit`], with the checks of what this version runs (`NOT_BUILT` errors).
pub fn load_for_run_or_exit(path: &Path) -> Result<Pipeline, ExitCode> {
    sluice_pipeline::load_for_run(path).map_err(exit_invalid)
}

fn exit_invalid(errors: sluice_pipeline::ConfigErrors) -> ExitCode {
    eprintln!("{errors}");
    ExitCode::from(2)
}
