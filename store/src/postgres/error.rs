//! PostgreSQL errors, classified by what happens to the messages of the batch (see
//! [`StoreError`]).

use crate::StoreError;
use tokio_postgres::error::SqlState;

/// Whether `error` says a ledger row had no partition to go to (its generation was not created
/// yet, or was dropped while a statement with a stale clock ran): the caller creates the
/// generations and retries.
pub(crate) fn is_missing_generation(error: &tokio_postgres::Error) -> bool {
    error.as_db_error().is_some_and(|db| {
        *db.code() == SqlState::CHECK_VIOLATION && db.message().starts_with("no partition of")
    })
}

/// Only a refusal of the data itself (integrity or data exceptions, SQLSTATE classes 22 and 23)
/// is `Rejected`, which costs the messages attempts. Schema trouble (class 42: a table dropped
/// by hand, a missing privilege) is `Config`. Everything else (connection lost, server shutting
/// down, serialization failures and deadlocks, disk full, too many connections) leaves the data
/// blameless and is `Unavailable`: the batch is retried with backoff.
pub(crate) fn classify(error: tokio_postgres::Error) -> StoreError {
    let Some(db) = error.as_db_error() else {
        return StoreError::Unavailable(error.to_string());
    };
    let text = format!("{}: {}", db.code().code(), db.message());
    match &db.code().code()[..2] {
        "22" | "23" if !is_missing_generation(&error) => StoreError::Rejected(text),
        "42" => StoreError::Config(text),
        _ => StoreError::Unavailable(text),
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(error: tokio_postgres::Error) -> Self {
        classify(error)
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    /// No connection could be had (server down, pool exhausted, timed out): `Unavailable`.
    fn from(error: deadpool_postgres::PoolError) -> Self {
        match error {
            deadpool_postgres::PoolError::Backend(error) => classify(error),
            other => StoreError::Unavailable(format!("no database connection: {other}")),
        }
    }
}
