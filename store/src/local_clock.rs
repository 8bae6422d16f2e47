//! This process's wall clock: the SQLite backend's only clock (every process sharing a file
//! reads its own), and the local side of the PostgreSQL server's clock offset.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, by the wall clock.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}
