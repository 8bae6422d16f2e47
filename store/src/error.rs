//! Store errors, classified by what the caller must do with the messages concerned.

/// Why a store operation failed. Every variant leaves the messages of the batch unacked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store cannot be reached or cannot write right now (connection refused, database
    /// locked, read-only file, disk full). The batch is retried with backoff, without counting
    /// an attempt against its messages: nothing is wrong with them.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store refused the batch's content (a constraint, a value it cannot hold). Each
    /// message concerned uses up one attempt; after `max_attempts` it is dead-lettered.
    #[error("store rejected the batch: {0}")]
    Rejected(String),
    /// The store URL or layout is wrong (bad identifier, unknown scheme). Not retried.
    #[error("store misconfigured: {0}")]
    Config(String),
    /// The store's worker has stopped (the process is shutting down).
    #[error("store closed")]
    Closed,
}

impl StoreError {
    /// Whether retrying the same batch later may succeed without changing it.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(error: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode as Code;
        match error.sqlite_error_code() {
            Some(
                Code::DatabaseBusy
                | Code::DatabaseLocked
                | Code::ReadOnly
                | Code::SystemIoFailure
                | Code::DiskFull
                | Code::CannotOpen
                | Code::FileLockingProtocolFailed
                | Code::OutOfMemory
                | Code::PermissionDenied
                | Code::DatabaseCorrupt
                | Code::NotADatabase,
            ) => StoreError::Unavailable(error.to_string()),
            _ => StoreError::Rejected(error.to_string()),
        }
    }
}
