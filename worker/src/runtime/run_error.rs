//! Why a worker could not run its pipeline at all: an unusable setting, an endpoint that could
//! not start, or a store that could not be opened (each variant says its exit status).

use sluice_store::StoreError;

/// Why a run could not happen at all.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A setting the parser accepted is unusable (an address that is not one, a control API
    /// beyond loopback without its token file): invalid input, exit 2.
    #[error("{0}")]
    Invalid(String),
    /// The metrics or control endpoint could not be started (address in use): exit 1.
    #[error("{0}")]
    Endpoint(String),
    /// The store could not be opened or prepared, and retrying is pointless or was stopped.
    #[error("store: {0}")]
    Store(StoreError),
    /// A signal stopped `sluice backfill` before the end of its range: exit 1.
    #[error("{0}")]
    Interrupted(String),
    /// The run this worker waited to start was ended by another worker: exit 1.
    #[error("{0}")]
    Lost(String),
}
