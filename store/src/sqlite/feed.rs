//! Feeds on SQLite (see the crate's `feed` module): a point of a table's history is its
//! `sluice_table_seqs` counter, a range `(from, to]` of `seq`.

use super::SqliteStore;
use crate::FeedStore;
use crate::schema::check_table;
use crate::{
    FILE_SOURCE, FeedLag, FeedRow, FileCheckpoint, FlowHandle, PositionAdvance, ReadPosition,
    StoreError, StoredRow,
};
use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

/// A point as stored: the counter value, 0 for the beginning.
fn point(text: &str) -> Result<i64, StoreError> {
    if text.is_empty() {
        return Ok(0);
    }
    text.parse()
        .map_err(|_| StoreError::Config(format!("{text:?} is not a SQLite feed point")))
}

/// The first `seq` not yet committed by a reader at `at`: rows after it are unread.
fn unread_after(at: &ReadPosition) -> Result<i64, StoreError> {
    Ok(match at.after {
        Some((seq, _)) => seq,
        None => point(&at.range_from)?,
    })
}

pub(crate) fn read_position(
    conn: &Connection,
    flow: &FlowHandle,
    table: &str,
) -> Result<ReadPosition, StoreError> {
    let stored = conn
        .query_row(
            "SELECT version, range_from, range_to, after_a, after_b FROM sluice_read_positions
             WHERE flow_id = ?1 AND source = ?2",
            params![flow.id, table],
            |row| {
                let after: (Option<i64>, Option<i64>) = (row.get(3)?, row.get(4)?);
                Ok(ReadPosition {
                    version: row.get(0)?,
                    range_from: row.get(1)?,
                    range_to: row.get(2)?,
                    after: after.0.zip(after.1),
                })
            },
        )
        .optional()?;
    Ok(stored.unwrap_or_default())
}

pub(crate) fn plan_range(
    conn: &mut Connection,
    flow: &FlowHandle,
    table: &str,
    at: &ReadPosition,
) -> Result<ReadPosition, StoreError> {
    check_table(table)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let end: i64 = tx
        .query_row(
            "SELECT last FROM sluice_table_seqs WHERE table_name = ?1",
            params![table],
            |row| row.get(0),
        )
        .optional()?
        .unwrap_or(0);
    let to = end.to_string();
    let changed = if at.version == 0 {
        tx.execute(
            "INSERT INTO sluice_read_positions (flow_id, source, version, range_from, range_to)
             VALUES (?1, ?2, 1, '', ?3) ON CONFLICT (flow_id, source) DO NOTHING",
            params![flow.id, table, to],
        )?
    } else {
        tx.execute(
            "UPDATE sluice_read_positions SET version = version + 1, range_from = range_to,
                 range_to = ?3, after_a = NULL, after_b = NULL
             WHERE flow_id = ?1 AND source = ?2 AND version = ?4",
            params![flow.id, table, to, at.version],
        )?
    };
    if changed == 0 {
        return Err(StoreError::Moved);
    }
    let planned = read_position(&tx, flow, table)?;
    tx.commit()?;
    Ok(planned)
}

pub(crate) fn read_range(
    conn: &Connection,
    table: &str,
    at: &ReadPosition,
    limit: usize,
) -> Result<Vec<FeedRow>, StoreError> {
    check_table(table)?;
    let relation = super::typed_feed::relation(conn, table)?;
    let sql = format!(
        "SELECT flow, dedup_key, message_id, publish_time, event_time, attributes, data, seq,
                committed_at
         FROM {relation} WHERE seq > ?1 AND seq <= ?2 ORDER BY seq LIMIT ?3"
    );
    let mut statement = conn.prepare_cached(&sql)?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = statement.query_map(
        params![unread_after(at)?, point(&at.range_to)?, limit],
        |row| {
            Ok(FeedRow {
                row: StoredRow {
                    flow: row.get(0)?,
                    dedup_key: row.get(1)?,
                    message_id: row.get(2)?,
                    publish_time_ms: row.get(3)?,
                    event_time_ms: row.get(4)?,
                    attributes_json: row.get(5)?,
                    data: bytes::Bytes::from(row.get::<_, Vec<u8>>(6)?),
                },
                cursor: (row.get(7)?, 0),
                committed_at_ms: row.get(8)?,
            })
        },
    )?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub(crate) fn feed_lag(
    conn: &Connection,
    table: &str,
    at: &ReadPosition,
) -> Result<FeedLag, StoreError> {
    check_table(table)?;
    let relation = super::typed_feed::relation(conn, table)?;
    let (rows, oldest): (i64, Option<i64>) = conn.query_row(
        &format!("SELECT COUNT(*), MIN(committed_at) FROM {relation} WHERE seq > ?1"),
        params![unread_after(at)?],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    Ok(FeedLag {
        rows_behind: u64::try_from(rows).unwrap_or(0),
        oldest_unread_ms: oldest,
    })
}

/// Records a committed page inside the batch's transaction (see `PositionAdvance`).
pub(crate) fn advance(
    tx: &Transaction<'_>,
    flow_id: i64,
    advance: &PositionAdvance,
) -> Result<(), StoreError> {
    let changed = match advance.after {
        Some((a, b)) => tx.execute(
            "UPDATE sluice_read_positions SET version = version + 1, after_a = ?3, after_b = ?4
             WHERE flow_id = ?1 AND source = ?2 AND version = ?5",
            params![flow_id, &*advance.table, a, b, advance.expected_version],
        )?,
        // The write lock is held: nobody moves it before this transaction ends.
        None => tx.query_row(
            "SELECT COUNT(*) FROM sluice_read_positions
             WHERE flow_id = ?1 AND source = ?2 AND version = ?3",
            params![flow_id, &*advance.table, advance.expected_version],
            |row| row.get::<_, usize>(0),
        )?,
    };
    if changed == 0 {
        return Err(StoreError::Moved);
    }
    Ok(())
}

pub(crate) fn file_checkpoint(
    conn: &Connection,
    flow: &FlowHandle,
) -> Result<Option<FileCheckpoint>, StoreError> {
    Ok(conn
        .query_row(
            "SELECT range_from, after_a, after_b FROM sluice_read_positions
             WHERE flow_id = ?1 AND source = ?2",
            params![flow.id, FILE_SOURCE],
            |row| {
                Ok(FileCheckpoint {
                    path: row.get(0)?,
                    offset: row.get::<_, Option<i64>>(1)?.unwrap_or_default(),
                    line: row.get::<_, Option<i64>>(2)?.unwrap_or_default(),
                })
            },
        )
        .optional()?)
}

pub(crate) fn save_file_checkpoint(
    conn: &Connection,
    flow: &FlowHandle,
    at: &FileCheckpoint,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO sluice_read_positions
             (flow_id, source, version, range_from, range_to, after_a, after_b)
         VALUES (?1, ?2, 1, ?3, '', ?4, ?5)
         ON CONFLICT (flow_id, source) DO UPDATE SET version = version + 1,
             range_from = excluded.range_from, after_a = excluded.after_a,
             after_b = excluded.after_b",
        params![flow.id, FILE_SOURCE, at.path, at.offset, at.line],
    )?;
    Ok(())
}

#[async_trait]
impl FeedStore for SqliteStore {
    async fn read_position(
        &self,
        flow: &FlowHandle,
        table: &str,
    ) -> Result<ReadPosition, StoreError> {
        let (flow, table) = (flow.clone(), table.to_owned());
        self.call(move |conn| self::read_position(conn, &flow, &table))
            .await
    }

    async fn plan_range(
        &self,
        flow: &FlowHandle,
        table: &str,
        at: &ReadPosition,
    ) -> Result<ReadPosition, StoreError> {
        let (flow, table, at) = (flow.clone(), table.to_owned(), at.clone());
        self.call(move |conn| self::plan_range(conn, &flow, &table, &at))
            .await
    }

    async fn read_range(
        &self,
        table: &str,
        at: &ReadPosition,
        limit: usize,
    ) -> Result<Vec<FeedRow>, StoreError> {
        let (table, at) = (table.to_owned(), at.clone());
        self.call(move |conn| self::read_range(conn, &table, &at, limit))
            .await
    }

    async fn feed_lag(&self, table: &str, at: &ReadPosition) -> Result<FeedLag, StoreError> {
        let (table, at) = (table.to_owned(), at.clone());
        self.call(move |conn| self::feed_lag(conn, &table, &at))
            .await
    }

    async fn file_checkpoint(
        &self,
        flow: &FlowHandle,
    ) -> Result<Option<FileCheckpoint>, StoreError> {
        let flow = flow.clone();
        self.call(move |conn| self::file_checkpoint(conn, &flow))
            .await
    }

    async fn save_file_checkpoint(
        &self,
        flow: &FlowHandle,
        at: &FileCheckpoint,
    ) -> Result<(), StoreError> {
        let (flow, at) = (flow.clone(), at.clone());
        self.call(move |conn| self::save_file_checkpoint(conn, &flow, &at))
            .await
    }
}
