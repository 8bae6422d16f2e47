//! Table names and the DDL of sluice's own tables.
//!
//! Identifiers come from the pipeline file and are validated there; they are checked again
//! here, because they are the only thing ever spliced into SQL (always double-quoted).

use crate::StoreError;

/// Whether `name` is a valid sluice identifier: `[a-z_][a-z0-9_]*`, 1..=48 bytes.
pub fn is_identifier(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
        && name.len() <= 48
}

/// The SQL table of a target: `<pipeline>__<target>`.
pub fn table_name(pipeline: &str, target: &str) -> Result<String, StoreError> {
    for part in [pipeline, target] {
        if !is_identifier(part) {
            return Err(StoreError::Config(format!(
                "{part:?} is not a valid identifier"
            )));
        }
    }
    Ok(format!("{pipeline}__{target}"))
}

/// The counts table of a `window` target: `<pipeline>__<target>__windows`.
pub fn window_table_name(pipeline: &str, target: &str) -> Result<String, StoreError> {
    table_name(pipeline, target)?;
    table_name(pipeline, &format!("{target}__windows"))
}

/// Checks that `table` is a target table name (`<pipeline>__<target>`, both identifiers), the
/// only form spliced into queries that take a table name from the caller.
pub(crate) fn check_table(table: &str) -> Result<(), StoreError> {
    match table.split_once("__") {
        Some((pipeline, target)) => table_name(pipeline, target).map(|_| ()),
        None => Err(StoreError::Config(format!(
            "{table:?} is not a target table"
        ))),
    }
}

/// sluice's own tables (idempotent).
pub(crate) const SQLITE_STATE_DDL: &str = "
CREATE TABLE IF NOT EXISTS sluice_flows (
    flow_id        INTEGER PRIMARY KEY,
    pipeline       TEXT NOT NULL,
    flow           TEXT NOT NULL,
    committed      INTEGER NOT NULL DEFAULT 0,
    duplicates     INTEGER NOT NULL DEFAULT 0,
    dead_lettered  INTEGER NOT NULL DEFAULT 0,
    batches        INTEGER NOT NULL DEFAULT 0,
    last_commit_at INTEGER,
    UNIQUE (pipeline, flow)
);
CREATE TABLE IF NOT EXISTS sluice_ledger (
    flow_id    INTEGER NOT NULL,
    key        TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (flow_id, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sluice_ledger_expiry ON sluice_ledger (expires_at);
CREATE TABLE IF NOT EXISTS sluice_commit_marks (
    flow_id      INTEGER NOT NULL,
    commit_id    TEXT NOT NULL,
    committed_at INTEGER NOT NULL,
    PRIMARY KEY (flow_id, commit_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sluice_completions (
    flow_id      INTEGER PRIMARY KEY,
    completed_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS sluice_drains (
    flow_id     INTEGER NOT NULL,
    worker      TEXT NOT NULL,
    drained     INTEGER NOT NULL,
    reported_at INTEGER NOT NULL,
    PRIMARY KEY (flow_id, worker)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sluice_workers (
    pipeline   TEXT NOT NULL,
    worker     TEXT NOT NULL,
    host       TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    started_at INTEGER NOT NULL,
    last_beat  INTEGER NOT NULL,
    PRIMARY KEY (pipeline, worker)
);
CREATE TABLE IF NOT EXISTS sluice_leases (
    pipeline    TEXT NOT NULL,
    role        TEXT NOT NULL,
    holder      TEXT NOT NULL,
    acquired_at INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    PRIMARY KEY (pipeline, role)
);
DROP TABLE IF EXISTS sluice_watermark_buckets;
CREATE TABLE IF NOT EXISTS sluice_watermark_messages (
    flow_id    INTEGER NOT NULL,
    bucket_ms  INTEGER NOT NULL,
    message_id TEXT NOT NULL,
    tracked    INTEGER NOT NULL,
    settled    INTEGER NOT NULL,
    event_ms   INTEGER,
    PRIMARY KEY (flow_id, bucket_ms, message_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sluice_watermarks (
    flow_id       INTEGER PRIMARY KEY,
    watermark_ms  INTEGER NOT NULL,
    horizon_ms    INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS sluice_window_marks (
    flow_id        INTEGER PRIMARY KEY,
    emitted_before INTEGER NOT NULL,
    size_ms        INTEGER
);
";

/// DDL of a target table and its `(flow, dedup_key)` index.
pub(crate) fn sqlite_target_ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS \"{table}\" (
            dedup_key    TEXT NOT NULL,
            message_id   TEXT NOT NULL,
            publish_time INTEGER NOT NULL,
            event_time   INTEGER NOT NULL,
            attributes   TEXT NOT NULL,
            data         BLOB NOT NULL,
            flow         TEXT NOT NULL,
            committed_at INTEGER NOT NULL
        );
        CREATE INDEX IF NOT EXISTS \"{table}_flow_key\" ON \"{table}\" (flow, dedup_key);"
    )
}

/// DDL of a pipeline's dead-letter table.
pub(crate) fn sqlite_dead_letter_ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS \"{table}\" (
            flow         TEXT NOT NULL,
            dedup_key    TEXT NOT NULL,
            message_id   TEXT NOT NULL,
            publish_time INTEGER NOT NULL,
            attributes   TEXT NOT NULL,
            data         BLOB NOT NULL,
            reason       TEXT NOT NULL,
            error        TEXT NOT NULL,
            attempts     INTEGER NOT NULL,
            committed_at INTEGER NOT NULL
        );
        CREATE INDEX IF NOT EXISTS \"{table}_flow_key\" ON \"{table}\" (flow, dedup_key);"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        assert!(is_identifier("orders"));
        assert!(is_identifier("_x1"));
        assert!(!is_identifier(""));
        assert!(!is_identifier("1x"));
        assert!(!is_identifier("Orders"));
        assert!(!is_identifier("a\"; drop table x; --"));
        assert!(!is_identifier(&"a".repeat(49)));
        assert!(table_name("p", "t").is_ok());
        assert!(table_name("p", "T").is_err());
    }
}
