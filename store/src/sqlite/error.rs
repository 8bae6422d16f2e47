//! SQLite errors, classified by what happens to the messages of the batch (see
//! [`StoreError`]).

use crate::StoreError;

impl From<rusqlite::Error> for StoreError {
    /// Only a refusal of the data itself (a constraint, a value too big or of the wrong type)
    /// is `Rejected`, which costs the messages attempts; every other failure (busy, locked,
    /// read-only, I/O, disk full, schema changed, a file that is not a database) leaves the data
    /// blameless and is retried as `Unavailable` (a file that is not a database is `Config`).
    fn from(error: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode as Code;
        match error.sqlite_error_code() {
            Some(Code::ConstraintViolation | Code::TooBig | Code::TypeMismatch) => {
                StoreError::Rejected(error.to_string())
            }
            Some(Code::NotADatabase | Code::DatabaseCorrupt) => {
                StoreError::Config(error.to_string())
            }
            _ if matches!(
                error,
                rusqlite::Error::ToSqlConversionFailure(_)
                    | rusqlite::Error::InvalidParameterCount(..)
            ) =>
            {
                StoreError::Rejected(error.to_string())
            }
            _ => StoreError::Unavailable(error.to_string()),
        }
    }
}
