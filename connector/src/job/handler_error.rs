//! The error a job's handler returns: [`HandlerError`], rejected (the data is at fault) or
//! transient (retry the same batch), and how database errors map onto it.
//!
//! Guarantee: a database error is rejected only when the database refused the data itself
//! (classified as the store classifies its own), so a message is never dead-lettered for the
//! database's trouble.

use sluice_store::WorkError;

/// A handler failed; the transaction is rolled back (the dedup keys too), nothing is acked.
///
/// ```
/// use sluice_connector::prelude::*;
///
/// let check = |tx: &rusqlite::Transaction<'_>, batch: &NewMessages<'_>| {
///     for message in batch.iter() {
///         let amount: i64 = std::str::from_utf8(message.data())
///             .ok()
///             .and_then(|text| text.parse().ok())
///             // This message is at fault: dead-lettered after its attempts, the rest commit.
///             .ok_or_else(|| HandlerError::rejected("the payload is not an amount"))?;
///         // A database error: `?` decides (a constraint is the data's fault, a lock is not).
///         tx.execute(
///             "INSERT INTO amounts (key, amount) VALUES (?1, ?2)",
///             (message.key(), amount),
///         )?;
///     }
///     Ok(())
/// };
/// # let _: &dyn SqliteHandler = &check;
/// ```
///
/// [`HandlerError::rejected`]: the data is at fault; a batch of several is retried one message
/// at a time to find the culprit, which is dead-lettered with this error after its
/// `max_attempts`. [`HandlerError::transient`]: the same batch is retried with backoff for as
/// long as it takes, nothing charged. `?` on a database error classifies it as the store
/// classifies its own: only a refusal of the data (PostgreSQL SQLSTATE classes 22 and 23;
/// SQLite's constraint, too-big and type-mismatch errors) is rejected; anything else (a lost
/// connection, a lock timeout, a serialization failure, a missing table, a full disk) is
/// transient, so a message is never dead-lettered for the database's trouble.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HandlerError {
    message: String,
    transient: bool,
}

impl HandlerError {
    /// The batch's data made the handler fail.
    ///
    /// ```
    /// # use sluice_connector::prelude::*;
    /// let error = HandlerError::rejected("no customer 42");
    /// assert!(!error.is_transient());
    /// ```
    pub fn rejected(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            transient: false,
        }
    }

    /// Retrying the same batch later may work.
    ///
    /// ```
    /// # use sluice_connector::prelude::*;
    /// assert!(HandlerError::transient("lock timeout").is_transient());
    /// ```
    pub fn transient(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            transient: true,
        }
    }

    /// Whether it is [`HandlerError::transient`].
    ///
    /// ```
    /// # use sluice_connector::prelude::*;
    /// assert!(!HandlerError::rejected("bad row").is_transient());
    /// ```
    pub fn is_transient(&self) -> bool {
        self.transient
    }
}

impl From<sluice_store::StoreError> for HandlerError {
    fn from(error: sluice_store::StoreError) -> Self {
        match error {
            sluice_store::StoreError::Rejected(message) => Self::rejected(message),
            other => Self::transient(other.to_string()),
        }
    }
}

impl From<rusqlite::Error> for HandlerError {
    fn from(error: rusqlite::Error) -> Self {
        sluice_store::StoreError::from(error).into()
    }
}

impl From<tokio_postgres::Error> for HandlerError {
    fn from(error: tokio_postgres::Error) -> Self {
        sluice_store::StoreError::from(error).into()
    }
}

impl From<HandlerError> for WorkError {
    fn from(error: HandlerError) -> Self {
        if error.transient {
            WorkError::transient(error.message)
        } else {
            WorkError::rejected(error.message)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// `?` on a database error blames the data only for a refusal of the data: a missing
    /// table, a busy database or a lost connection is retried, never dead-lettered.
    #[test]
    fn database_errors_blame_the_data_only_when_it_is_refused() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY)", [])
            .unwrap();
        conn.execute("INSERT INTO t VALUES ('a')", []).unwrap();
        let duplicate = conn.execute("INSERT INTO t VALUES ('a')", []).unwrap_err();
        assert!(!HandlerError::from(duplicate).is_transient());
        let missing = conn
            .execute("INSERT INTO nowhere VALUES (1)", [])
            .unwrap_err();
        assert!(HandlerError::from(missing).is_transient());
        assert!(
            HandlerError::from(sluice_store::StoreError::Unavailable("gone".into())).is_transient()
        );
    }
}
