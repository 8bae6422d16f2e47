//! PostgreSQL errors, classified by what happens to the messages of the batch (see
//! [`StoreError`]).

use crate::StoreError;
use tokio_postgres::error::SqlState;

/// Whether `error` says a ledger row had no partition to go to (its generation was not created
/// yet, or was dropped while a statement with a stale clock ran): the caller creates the
/// generations and retries. Known by its SQLSTATE (23514) and the table the server names (the
/// partitioned `sluice_ledger`, with no constraint), never by the message, which the server
/// writes in its `lc_messages` language.
pub(crate) fn is_missing_generation(error: &tokio_postgres::Error) -> bool {
    error.as_db_error().is_some_and(|db| {
        names_missing_generation(db.code(), db.message(), db.table(), db.constraint())
    })
}

/// [`is_missing_generation`] on the fields of a server error (the message is not looked at).
fn names_missing_generation(
    code: &SqlState,
    _message: &str,
    table: Option<&str>,
    constraint: Option<&str>,
) -> bool {
    *code == SqlState::CHECK_VIOLATION && table == Some("sluice_ledger") && constraint.is_none()
}

/// Only a refusal of the data itself (data exceptions, integrity, and program limits a value
/// can exceed: SQLSTATE classes 22, 23 and 54, e.g. 54000 for an index entry too large) is
/// `Rejected`, which costs the messages attempts (a batch is split to find the message at
/// fault, which ends as a dead letter). Schema trouble (class 42: a table dropped
/// by hand, a missing privilege) and what no retry mends (a database that does not exist,
/// 3D000; a role that does not exist or a refused password, class 28) are `Config`, with what
/// to fix. Everything else (connection lost, server shutting
/// down, serialization failures and deadlocks, disk full, too many connections) leaves the data
/// blameless and is `Unavailable`: the batch is retried with backoff.
pub(crate) fn classify(error: tokio_postgres::Error) -> StoreError {
    let Some(db) = error.as_db_error() else {
        // The cause (connection refused, a name that does not resolve) is the error's source.
        let cause = std::error::Error::source(&error).map(|cause| format!(": {cause}"));
        return StoreError::Unavailable(format!("{error}{}", cause.unwrap_or_default()));
    };
    let text = format!("{}: {}", db.code().code(), db.message());
    if *db.code() == SqlState::INVALID_CATALOG_NAME {
        return StoreError::Config(format!(
            "{text}: create the database (CREATE DATABASE), or fix the store URL's database"
        ));
    }
    match &db.code().code()[..2] {
        "28" => StoreError::Config(format!(
            "{text}: the server refused this user; check the user and password of the store \
             URL (or SLUICE_STORE) and the server's pg_hba.conf"
        )),
        "22" | "23" | "54" if !is_missing_generation(&error) => StoreError::Rejected(text),
        "42" => StoreError::Config(text),
        _ => StoreError::Unavailable(text),
    }
}

/// Whether a `Config` error's text is a login refused (class 28) or a database missing
/// (3D000), as [`classify`] writes them: what a store reached before waits out.
pub(crate) fn refused_login(why: &str) -> bool {
    why.starts_with("3D000") || why.starts_with("28")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_generation_is_known_by_its_sqlstate_and_table_in_any_language() {
        // PostgreSQL's own wording, and its German translation (`lc_messages = de_DE`): the
        // SQLSTATE and the table the server names decide, not the text.
        for message in [
            "no partition of relation \"sluice_ledger\" found for row",
            "keine Partition von Relation »sluice_ledger« für Zeile gefunden",
        ] {
            assert!(
                names_missing_generation(
                    &SqlState::CHECK_VIOLATION,
                    message,
                    Some("sluice_ledger"),
                    None
                ),
                "{message}"
            );
        }
        // A real check constraint of a table, and another table's routing error, are not.
        assert!(!names_missing_generation(
            &SqlState::CHECK_VIOLATION,
            "new row for relation \"t\" violates check constraint \"c\"",
            Some("t"),
            Some("c")
        ));
        assert!(!names_missing_generation(
            &SqlState::CHECK_VIOLATION,
            "no partition of relation \"other\" found for row",
            Some("other"),
            None
        ));
        assert!(!names_missing_generation(
            &SqlState::UNIQUE_VIOLATION,
            "no partition of relation \"sluice_ledger\" found for row",
            Some("sluice_ledger"),
            None
        ));
    }
}
