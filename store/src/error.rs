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
    /// The store URL or layout is wrong (bad identifier, unknown scheme, a file that is not a
    /// database). Fatal at startup; during a run, commits are retried like `Unavailable`.
    #[error("store misconfigured: {0}")]
    Config(String),
    /// The store's worker has stopped (the process is shutting down). Retried like
    /// `Unavailable` until the caller gives up.
    #[error("store closed")]
    Closed,
    /// The batch reached the store after its [`crate::CommitBatch::commit_by_ms`] (the worker
    /// was paused, or the batch waited too long): nothing was written. Its messages are given
    /// back (nacked), never committed: the ledger may no longer remember a copy that another
    /// replica committed meanwhile.
    #[error("too late to commit: the batch is past its commit deadline")]
    Stale,
    /// A clear made under a pool update's claim found the claim gone (another process took it
    /// over, or the update ended): nothing was deleted. The clearer stops clearing.
    #[error("the pool update's claim was lost: {0}")]
    ClaimLost(String),
    /// A reading flow's position is no longer the version the change named (another replica
    /// moved it, or the flow was reset): nothing was written. The reader reloads its position.
    #[error("the read position moved: another reader or a reset changed it")]
    Moved,
    /// One record of the batch cannot be written as its typed table's query gives it (a cast
    /// its value does not fit, a NULL in a column that is not nullable): nothing was written.
    /// The caller dead-letters that record and commits the rest; retrying it would fail the
    /// same way.
    #[error("record {index}: column {column}: {error}")]
    Record {
        /// The entry's index in the batch.
        index: usize,
        /// The column (or `where`) whose expression failed.
        column: String,
        /// The store's message.
        error: String,
    },
}

impl StoreError {
    /// The `kind` label of `sluice_commit_errors_total` for a commit that failed with this
    /// error. The match is exhaustive here, in the enum's own crate, so a new variant must be
    /// given its label (the enum is `#[non_exhaustive]` to other crates, whose matches need a
    /// wildcard that would label it silently).
    pub fn commit_error_kind(&self) -> &'static str {
        match self {
            StoreError::Unavailable(_) | StoreError::Closed => "unavailable",
            StoreError::Rejected(_) => "rejected",
            StoreError::Config(_) => "config",
            StoreError::Stale => "stale",
            StoreError::ClaimLost(_) => "claim_lost",
            StoreError::Moved => "moved",
            StoreError::Record { .. } => "record",
        }
    }

    /// Whether retrying the same batch later may succeed without changing it (everything but a
    /// refusal of the data or a misconfiguration).
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::Closed)
    }
}
