//! The dedup ledger on SQLite: a key is a row of `sluice_ledger` with its expiry; the commit's
//! insert decides duplicates (`commit.rs`), and expired keys leave in small delete steps that
//! the writer thread runs between commits.

use crate::StoreError;
use rusqlite::{Connection, params};

/// Deletes at most `limit` ledger keys that expired before `now_ms`; returns how many went.
pub(super) fn purge(conn: &Connection, now_ms: i64, limit: usize) -> Result<usize, StoreError> {
    let deleted = conn.execute(
        "DELETE FROM sluice_ledger WHERE (flow_id, key) IN
         (SELECT flow_id, key FROM sluice_ledger WHERE expires_at <= ?1 LIMIT ?2)",
        params![now_ms, i64::try_from(limit).unwrap_or(i64::MAX)],
    )?;
    Ok(deleted)
}
