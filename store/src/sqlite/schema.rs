//! sluice's own tables on SQLite (created idempotently when a file is opened), the DDL of
//! target and dead-letter tables, and the preparation of a pipeline's tables and flows.

use crate::schema::table_name;
use crate::{FlowHandle, Layout, StoreError};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use std::sync::Arc;

/// sluice's own tables (idempotent).
pub(super) const STATE_DDL: &str = "
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
CREATE TABLE IF NOT EXISTS sluice_expectation_counts (
    flow_id     INTEGER NOT NULL,
    expectation TEXT NOT NULL,
    passed      INTEGER NOT NULL,
    violated    INTEGER NOT NULL,
    PRIMARY KEY (flow_id, expectation)
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
    schedule   TEXT,
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
CREATE TABLE IF NOT EXISTS sluice_table_seqs (
    table_name TEXT PRIMARY KEY,
    last       INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS sluice_read_positions (
    flow_id    INTEGER NOT NULL,
    source     TEXT NOT NULL,
    version    INTEGER NOT NULL,
    range_from TEXT NOT NULL,
    range_to   TEXT NOT NULL,
    after_a    INTEGER,
    after_b    INTEGER,
    PRIMARY KEY (flow_id, source)
);
CREATE TABLE IF NOT EXISTS sluice_pool_updates (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline     TEXT NOT NULL,
    request      TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    requested_at INTEGER NOT NULL,
    state        TEXT NOT NULL,
    clearer      TEXT,
    claimed_at   INTEGER,
    message      TEXT,
    finished_at  INTEGER
);
CREATE TABLE IF NOT EXISTS sluice_pool_update_drains (
    update_id INTEGER NOT NULL,
    worker    TEXT NOT NULL,
    PRIMARY KEY (update_id, worker)
);
CREATE TABLE IF NOT EXISTS sluice_runs (
    run_id         INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline       TEXT NOT NULL,
    fire_key       INTEGER,
    fire_ms        INTEGER NOT NULL,
    interval_start INTEGER,
    interval_end   INTEGER,
    trigger        TEXT NOT NULL,
    state          TEXT NOT NULL,
    worker         TEXT NOT NULL,
    started_at     INTEGER NOT NULL,
    ended_at       INTEGER,
    rows           TEXT NOT NULL,
    error          TEXT,
    UNIQUE (pipeline, fire_key)
);
CREATE INDEX IF NOT EXISTS sluice_runs_interval
    ON sluice_runs (pipeline, interval_start, interval_end) WHERE state = 'completed';
CREATE INDEX IF NOT EXISTS sluice_runs_completed_fire
    ON sluice_runs (pipeline, fire_ms) WHERE state = 'completed';
CREATE TABLE IF NOT EXISTS sluice_dead_letter_outbox (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline        TEXT NOT NULL,
    flow            TEXT NOT NULL,
    dedup_key       TEXT NOT NULL,
    message_id      TEXT NOT NULL,
    publish_time_ms INTEGER NOT NULL,
    attributes      TEXT NOT NULL,
    data            BLOB NOT NULL,
    reason          TEXT NOT NULL,
    error           TEXT NOT NULL,
    attempts        INTEGER NOT NULL,
    committed_at    INTEGER NOT NULL,
    publishes       INTEGER NOT NULL DEFAULT 0,
    refused         TEXT,
    published_at    INTEGER
);
CREATE TABLE IF NOT EXISTS sluice_window_marks (
    flow_id        INTEGER PRIMARY KEY,
    emitted_before INTEGER NOT NULL,
    size_ms        INTEGER
);
";

/// Gives `sluice_workers` of a file from before schedules were compared its `schedule`
/// column (after [`STATE_DDL`]; looked at first, so an up-to-date file takes no write lock).
pub(super) fn upgrade_workers(conn: &mut Connection) -> Result<(), StoreError> {
    let has_schedule: bool = conn.query_row(
        "SELECT COUNT(*) > 0 FROM pragma_table_info('sluice_workers') WHERE name = 'schedule'",
        [],
        |row| row.get(0),
    )?;
    if !has_schedule {
        // A second opener may have added it meanwhile: that is not an error.
        if let Err(error) =
            conn.execute_batch("ALTER TABLE sluice_workers ADD COLUMN schedule TEXT")
            && !error.to_string().contains("duplicate column")
        {
            return Err(error.into());
        }
    }
    Ok(())
}

/// Brings the dead-letter outbox up to one letter per record (pipeline, flow, dedup key), after
/// [`STATE_DDL`]: a file from before gets `published_at` (a published letter stays as a marker,
/// see `outbox.rs`) and loses the copies of a letter that resets added (the oldest kept); then
/// the unique index and the index of owed letters. Looked at first, so an up-to-date file
/// takes no write lock; done in one write transaction that looks again.
pub(super) fn upgrade_outbox(conn: &mut Connection) -> Result<(), StoreError> {
    if outbox_upgraded(conn)? {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let has_published_at: bool = tx.query_row(
        "SELECT COUNT(*) > 0 FROM pragma_table_info('sluice_dead_letter_outbox')
         WHERE name = 'published_at'",
        [],
        |row| row.get(0),
    )?;
    if !has_published_at {
        tx.execute_batch(
            "ALTER TABLE sluice_dead_letter_outbox ADD COLUMN published_at INTEGER;
             DROP INDEX IF EXISTS sluice_dead_letter_outbox_waiting;",
        )?;
    }
    if !has_index(&tx, "sluice_dead_letter_outbox_letter")? {
        tx.execute_batch(
            "DELETE FROM sluice_dead_letter_outbox WHERE id NOT IN (
                 SELECT min(id) FROM sluice_dead_letter_outbox GROUP BY pipeline, flow, dedup_key);
             CREATE UNIQUE INDEX sluice_dead_letter_outbox_letter
                 ON sluice_dead_letter_outbox (pipeline, flow, dedup_key);",
        )?;
    }
    tx.execute_batch(
        "CREATE INDEX IF NOT EXISTS sluice_dead_letter_outbox_owed
             ON sluice_dead_letter_outbox (pipeline, id)
             WHERE refused IS NULL AND published_at IS NULL;",
    )?;
    tx.commit()?;
    Ok(())
}

/// Whether the outbox has its unique and owed-letter indexes (and so `published_at`).
fn outbox_upgraded(conn: &Connection) -> Result<bool, StoreError> {
    Ok(has_index(conn, "sluice_dead_letter_outbox_letter")?
        && has_index(conn, "sluice_dead_letter_outbox_owed")?)
}

fn has_index(conn: &Connection, name: &str) -> Result<bool, StoreError> {
    Ok(conn.query_row(
        "SELECT COUNT(*) > 0 FROM sqlite_master WHERE type = 'index' AND name = ?1",
        params![name],
        |row| row.get(0),
    )?)
}

/// DDL of a target table. `seq` numbers its rows in commit order (see `feed.rs`).
pub(super) fn target_ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS \"{table}\" (
            dedup_key    TEXT NOT NULL,
            message_id   TEXT NOT NULL,
            publish_time INTEGER NOT NULL,
            event_time   INTEGER NOT NULL,
            attributes   TEXT NOT NULL,
            data         BLOB NOT NULL,
            flow         TEXT NOT NULL,
            committed_at INTEGER NOT NULL,
            seq          INTEGER
        );"
    )
}

/// A target table's indexes, `(flow, dedup_key)` and the feed order `seq`, and the trigger
/// that numbers a row inserted without `seq` (by a binary from before feeds sharing the file,
/// or by hand) inside its own transaction, so feeds read it too, in commit order.
fn target_indexes(table: &str) -> String {
    format!(
        "CREATE INDEX IF NOT EXISTS \"{table}_flow_key\" ON \"{table}\" (flow, dedup_key);
         CREATE INDEX IF NOT EXISTS \"{table}_seq\" ON \"{table}\" (seq);
         CREATE TRIGGER IF NOT EXISTS \"{table}_seq\" AFTER INSERT ON \"{table}\"
         WHEN NEW.seq IS NULL BEGIN
             UPDATE sluice_table_seqs SET last = last + 1 WHERE table_name = '{table}';
             UPDATE \"{table}\" SET seq = (SELECT last FROM sluice_table_seqs
                                            WHERE table_name = '{table}')
             WHERE rowid = NEW.rowid;
         END;"
    )
}

/// Brings a target table created before feeds up to date: its rows numbered in the order they
/// were inserted (SQLite commits one transaction at a time, and rowids grew with them), and
/// its counter started after them (never behind the table's rows).
fn upgrade_target(tx: &rusqlite::Transaction<'_>, table: &str) -> Result<(), StoreError> {
    let has_seq: bool = tx.query_row(
        "SELECT COUNT(*) > 0 FROM pragma_table_info(?1) WHERE name = 'seq'",
        params![table],
        |row| row.get(0),
    )?;
    if !has_seq {
        tx.execute_batch(&format!(
            "ALTER TABLE \"{table}\" ADD COLUMN seq INTEGER;
             UPDATE \"{table}\" SET seq = rowid;"
        ))?;
    }
    tx.execute(
        &format!(
            "INSERT INTO sluice_table_seqs (table_name, last)
             SELECT ?1, COALESCE(MAX(seq), 0) FROM \"{table}\" WHERE true
             ON CONFLICT (table_name) DO UPDATE SET last = max(last, excluded.last)"
        ),
        params![table],
    )?;
    Ok(())
}

/// DDL of a pipeline's dead-letter table.
pub(super) fn dead_letter_ddl(table: &str) -> String {
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

/// Creates the layout's target and dead-letter tables and registers its flows, in one write
/// transaction; returns a handle per flow, in the layout's order.
pub(super) fn prepare(
    conn: &mut Connection,
    layout: &Layout,
) -> Result<Vec<FlowHandle>, StoreError> {
    let dead_letter = table_name(&layout.pipeline, "dead_letter")?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    for target in &layout.tables {
        if target == "dead_letter" {
            return Err(StoreError::Config(
                "a table target may not be named dead_letter".to_owned(),
            ));
        }
        let table = table_name(&layout.pipeline, target)?;
        if object_type(&tx, &table)?.as_deref() == Some("view") {
            return Err(crate::views::not_a_table(&table));
        }
        if let Some(typed) = layout.typed.iter().find(|t| t.target == *target) {
            // An existing table is checked before any DDL: a refusal changes nothing.
            super::typed::evolve(&tx, &table, &typed.columns)?;
            tx.execute_batch(&super::typed::ddl(&table, &typed.columns))?;
            super::typed_changes::keyed(&tx, &table, &typed.keys)?;
            continue;
        }
        super::typed::refuse_if_typed(&tx, &table)?;
        tx.execute_batch(&target_ddl(&table))?;
        upgrade_target(&tx, &table)?;
        tx.execute_batch(&target_indexes(&table))?;
    }
    tx.execute_batch(&dead_letter_ddl(&dead_letter))?;
    let pipeline: Arc<str> = Arc::from(layout.pipeline.as_str());
    let mut handles = Vec::with_capacity(layout.flows.len());
    for flow in &layout.flows {
        table_name(&layout.pipeline, flow)?;
        tx.execute(
            "INSERT INTO sluice_flows (pipeline, flow) VALUES (?1, ?2)
             ON CONFLICT (pipeline, flow) DO NOTHING",
            params![layout.pipeline, flow],
        )?;
        let id: i64 = tx.query_row(
            "SELECT flow_id FROM sluice_flows WHERE pipeline = ?1 AND flow = ?2",
            params![layout.pipeline, flow],
            |row| row.get(0),
        )?;
        handles.push(FlowHandle {
            id,
            pipeline: pipeline.clone(),
            name: Arc::from(flow.as_str()),
        });
    }
    tx.commit()?;
    Ok(handles)
}

/// What `name` is in the file: `table`, `view`, `index`...; `None`: nothing.
pub(super) fn object_type(conn: &Connection, name: &str) -> Result<Option<String>, StoreError> {
    Ok(conn
        .query_row(
            "SELECT type FROM sqlite_master WHERE name = ?1",
            [name],
            |row| row.get(0),
        )
        .optional()?)
}
