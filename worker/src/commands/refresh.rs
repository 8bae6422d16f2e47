//! `sluice full-refresh -c FILE [--seek TIME [--drop-unread]]` and `sluice reset FLOW -c FILE
//! [--seek TIME [--drop-unread]]`: the command-line front of `runtime/refresh.rs` (which states
//! the guarantees). Exit 0 when done, 2 for invalid input, 1 when the store or Pub/Sub refused.

pub use crate::runtime::refresh::Seek;
use crate::runtime::refresh::{RefreshError, full_refresh, reset};
use std::path::Path;
use std::process::ExitCode;

/// `sluice full-refresh -c FILE [--seek TIME [--drop-unread]]`.
pub async fn full_refresh_file(path: &Path, seek: Option<&Seek>) -> ExitCode {
    let pipeline = match super::load_or_exit(path) {
        Ok(pipeline) => super::with_adc_project(pipeline).await,
        Err(exit) => return exit,
    };
    report(path, full_refresh(&pipeline, seek, None).await)
}

/// `sluice reset FLOW -c FILE [--seek TIME [--drop-unread]]`.
pub async fn reset_file(path: &Path, flow: &str, seek: Option<&Seek>) -> ExitCode {
    let pipeline = match super::load_or_exit(path) {
        Ok(pipeline) => super::with_adc_project(pipeline).await,
        Err(exit) => return exit,
    };
    report(path, reset(&pipeline, flow, seek, None).await)
}

fn report(path: &Path, result: Result<String, RefreshError>) -> ExitCode {
    match result {
        Ok(done) => {
            println!("{done}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{}: {error}", path.display());
            error.exit_code()
        }
    }
}
