//! The dead-letter outbox on SQLite (see [`crate::OutboxLetter`]). A letter is owed while
//! `published_at` and `refused` are both unset; a published one stays as a marker with its
//! message dropped (see `schema.rs`, `upgrade_outbox`).

use super::SqliteStore;
use crate::OutboxStore;
use crate::{OutboxCensus, OutboxLetter, StoreError};
use async_trait::async_trait;
use bytes::Bytes;
use rusqlite::{Connection, TransactionBehavior, params};

/// Places one new dead letter in the outbox, inside the commit's transaction, unless the outbox
/// holds that record's letter already (a reset re-read it: one letter per flow and dedup key).
pub(super) fn insert(
    tx: &rusqlite::Transaction<'_>,
    pipeline: &str,
    flow: &str,
    entry: &crate::Entry,
    (reason, error, attempts): (&str, &str, u32),
    now_ms: i64,
) -> Result<(), StoreError> {
    let m = &entry.message;
    tx.prepare_cached(
        "INSERT INTO sluice_dead_letter_outbox (pipeline, flow, dedup_key, message_id,
         publish_time_ms, attributes, data, reason, error, attempts, committed_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
         ON CONFLICT (pipeline, flow, dedup_key) DO NOTHING",
    )?
    .execute(params![
        pipeline,
        flow,
        entry.key.as_str(),
        m.message_id,
        m.publish_time_ms,
        m.attributes_json,
        &m.data[..],
        reason,
        error,
        attempts,
        now_ms
    ])?;
    Ok(())
}

pub(super) fn take(
    conn: &mut Connection,
    pipeline: &str,
    limit: usize,
    max_bytes: usize,
) -> Result<Vec<OutboxLetter>, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let letters = {
        let mut statement = tx.prepare_cached(
            "UPDATE sluice_dead_letter_outbox SET publishes = publishes + 1
             WHERE id IN (SELECT id FROM (
                              SELECT id, sum(length(data)) OVER (ORDER BY id)
                                         - length(data) AS before
                              FROM sluice_dead_letter_outbox
                              WHERE pipeline = ?1 AND refused IS NULL AND published_at IS NULL
                              ORDER BY id LIMIT ?2)
                          WHERE before < ?3 OR before = 0)
             RETURNING id, flow, dedup_key, message_id, publish_time_ms, attributes, data,
                       reason, error, attempts, publishes - 1",
        )?;
        let rows = statement.query_map(
            params![
                pipeline,
                i64::try_from(limit).unwrap_or(i64::MAX),
                i64::try_from(max_bytes).unwrap_or(i64::MAX)
            ],
            |row| {
                Ok(OutboxLetter {
                    id: row.get(0)?,
                    flow: row.get(1)?,
                    dedup_key: row.get(2)?,
                    message_id: row.get(3)?,
                    publish_time_ms: row.get(4)?,
                    attributes_json: row.get(5)?,
                    data: Bytes::from(row.get::<_, Vec<u8>>(6)?),
                    reason: row.get(7)?,
                    error: row.get(8)?,
                    attempts: row.get(9)?,
                    earlier_publishes: row.get(10)?,
                })
            },
        )?;
        rows.collect::<Result<Vec<_>, _>>()?
    };
    tx.commit()?;
    let mut letters = letters;
    letters.sort_by_key(|l| l.id);
    Ok(letters)
}

pub(super) fn published(
    conn: &mut Connection,
    pipeline: &str,
    ids: &[i64],
) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut statement = tx.prepare_cached(
            "UPDATE sluice_dead_letter_outbox
             SET published_at = ?3, data = X'', attributes = '{}', error = ''
             WHERE pipeline = ?1 AND id = ?2 AND published_at IS NULL",
        )?;
        let now_ms = crate::local_clock::now_ms();
        for id in ids {
            statement.execute(params![pipeline, id, now_ms])?;
        }
    }
    tx.commit()?;
    Ok(())
}

pub(super) fn refused(
    conn: &mut Connection,
    pipeline: &str,
    id: i64,
    why: &str,
) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE sluice_dead_letter_outbox SET refused = ?3
         WHERE pipeline = ?1 AND id = ?2 AND published_at IS NULL",
        params![pipeline, id, why],
    )?;
    Ok(())
}

pub(super) fn census(conn: &mut Connection, pipeline: &str) -> Result<OutboxCensus, StoreError> {
    let (waiting, refused): (i64, i64) = conn.query_row(
        "SELECT COALESCE(SUM(refused IS NULL AND published_at IS NULL), 0),
                COALESCE(SUM(refused IS NOT NULL), 0)
         FROM sluice_dead_letter_outbox WHERE pipeline = ?1",
        params![pipeline],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    Ok(OutboxCensus {
        waiting: u64::try_from(waiting).unwrap_or(0),
        refused: u64::try_from(refused).unwrap_or(0),
    })
}

#[async_trait]
impl OutboxStore for SqliteStore {
    async fn take_outbox(
        &self,
        pipeline: &str,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<OutboxLetter>, StoreError> {
        let pipeline = pipeline.to_owned();
        self.call(move |conn| self::take(conn, &pipeline, limit, max_bytes))
            .await
    }

    async fn outbox_published(&self, pipeline: &str, ids: &[i64]) -> Result<(), StoreError> {
        let (pipeline, ids) = (pipeline.to_owned(), ids.to_vec());
        self.call(move |conn| self::published(conn, &pipeline, &ids))
            .await
    }

    async fn outbox_refused(&self, pipeline: &str, id: i64, why: &str) -> Result<(), StoreError> {
        let (pipeline, why) = (pipeline.to_owned(), why.to_owned());
        self.call(move |conn| self::refused(conn, &pipeline, id, &why))
            .await
    }

    async fn outbox_census(&self, pipeline: &str) -> Result<OutboxCensus, StoreError> {
        let pipeline = pipeline.to_owned();
        self.call(move |conn| self::census(conn, &pipeline)).await
    }
}
