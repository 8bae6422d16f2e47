//! Why a refresh (a reset, a full refresh, what a control request or a pool update clears)
//! could not be done, and the exit status that says it (SPEC §3).

use std::process::ExitCode;

/// Why a refresh could not be done.
#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    /// Bad request: unknown flow, bad time, nothing to seek (exit 2).
    #[error("{0}")]
    Invalid(String),
    /// The store or Pub/Sub refused or was unreachable, or workers are running (exit 1).
    #[error("{0}")]
    Failed(String),
}

impl RefreshError {
    /// The exit code of SPEC §3.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            RefreshError::Invalid(_) => ExitCode::from(2),
            RefreshError::Failed(_) => ExitCode::from(1),
        }
    }
}
