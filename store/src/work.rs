//! A caller's own writes inside a commit's transaction: what makes a library job's effects
//! exactly once, not only sluice's rows.
//!
//! A [`crate::CommitBatch`] with [`crate::CommitBatch::work`] runs that work in the batch's
//! transaction, after the ledger has said which entries are new and before the transaction
//! commits, on the transaction itself (`rusqlite::Transaction` on SQLite's writer thread,
//! `tokio_postgres::Transaction` on PostgreSQL). The work is the batch's effect: no target rows
//! are written (dead letters and the flow's counters are). So the work's writes, the ledger
//! keys of the entries they stand for and the batch's dead letters commit together or not at
//! all: a crash anywhere leaves none of them, and the redelivery finds the keys new again; a
//! commit that landed makes the redelivery a duplicate, which the work never sees.
//!
//! The work is given the indices of the entries it writes for: those the ledger found new and
//! whose effect is a row (never a duplicate, never a dead letter). A [`WorkError`] rolls the
//! whole transaction back: [`WorkError::transient`] as an unavailable store (the batch is
//! retried as it is), otherwise as a refused batch (the committer looks for the message at
//! fault and, after its attempts, dead-letters it with the work's error).

use async_trait::async_trait;
use std::sync::Arc;

/// Why the work failed; the transaction is rolled back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
#[non_exhaustive]
pub struct WorkError {
    /// What went wrong.
    pub message: String,
    /// Whether retrying the same batch later may work without any change to it (a lock
    /// timeout, a serialization failure); otherwise the data is at fault.
    pub transient: bool,
}

impl WorkError {
    /// The batch's data made the work fail.
    pub fn rejected(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            transient: false,
        }
    }

    /// The work could not be done now; the same batch may succeed later.
    pub fn transient(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            transient: true,
        }
    }
}

/// Work on a SQLite store's transaction (on its writer thread: keep it short).
pub trait SqliteWork: Send + Sync {
    /// Writes the effects of the entries at `new` (indices into the batch's entries).
    fn write(&self, tx: &rusqlite::Transaction<'_>, new: &[usize]) -> Result<(), WorkError>;
}

/// Work on a PostgreSQL store's transaction.
#[async_trait]
pub trait PostgresWork: Send + Sync {
    /// Writes the effects of the entries at `new` (indices into the batch's entries).
    async fn write(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        new: &[usize],
    ) -> Result<(), WorkError>;
}

/// A caller's work for one backend; a store refuses work for the other one
/// ([`crate::StoreError::Config`]).
#[derive(Clone)]
pub enum TransactionWork {
    /// For a SQLite store.
    Sqlite(Arc<dyn SqliteWork>),
    /// For a PostgreSQL store.
    Postgres(Arc<dyn PostgresWork>),
}

impl std::fmt::Debug for TransactionWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Sqlite(_) => "TransactionWork::Sqlite",
            Self::Postgres(_) => "TransactionWork::Postgres",
        })
    }
}

/// The indices the work writes for: new entries whose effect is a row.
pub(crate) fn new_rows(batch: &crate::CommitBatch, written: &[bool]) -> Vec<usize> {
    batch
        .entries
        .iter()
        .zip(written)
        .enumerate()
        .filter(|(_, (entry, new))| **new && matches!(entry.effect, crate::Effect::Row { .. }))
        .map(|(i, _)| i)
        .collect()
}

/// A work error as the committer sees it.
impl From<WorkError> for crate::StoreError {
    fn from(error: WorkError) -> Self {
        if error.transient {
            crate::StoreError::Unavailable(format!("transaction work: {}", error.message))
        } else {
            crate::StoreError::Rejected(format!("transaction work: {}", error.message))
        }
    }
}
