//! SQLite: what the store keeps for event-time watermarks (see [`crate::progress`]) — per-flow
//! publish-time buckets of message reports, and each flow's forward-only watermark record.
//!
//! Merges happen in the statements themselves (`MAX(tracked, excluded.tracked)`), so several
//! processes sharing the file can report into the same rows without reading first.

use super::{SqliteStore, now_ms};
use crate::{
    BucketCounts, BucketMessage, FlowHandle, MessageReport, ProgressStore, StoreError,
    WatermarkRecord,
};
use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

/// Records each message's report, in one transaction: a row per flow, bucket and message id,
/// whose `tracked` and `settled` flags only ever go from 0 to 1.
pub(crate) fn add_bucket_messages(
    conn: &mut Connection,
    flow: &FlowHandle,
    messages: &[BucketMessage],
) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut statement = tx.prepare_cached(
            "INSERT INTO sluice_watermark_messages
                 (flow_id, bucket_ms, message_id, tracked, settled, event_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (flow_id, bucket_ms, message_id) DO UPDATE SET
                 tracked = MAX(tracked, excluded.tracked),
                 settled = MAX(settled, excluded.settled),
                 event_ms = COALESCE(event_ms, excluded.event_ms)",
        )?;
        for message in messages {
            let (tracked, settled, event_ms) = match message.report {
                MessageReport::Tracked { event_ms } => (1, 0, event_ms),
                MessageReport::Settled => (0, 1, None),
            };
            statement.execute(params![
                flow.id,
                message.bucket_ms,
                message.message_id,
                tracked,
                settled,
                event_ms,
            ])?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// The flow's buckets at or after `from_ms` that hold a tracked message, in bucket order.
pub(crate) fn bucket_counts(
    conn: &mut Connection,
    flow: &FlowHandle,
    from_ms: i64,
) -> Result<Vec<BucketCounts>, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT bucket_ms, SUM(tracked), SUM(tracked * settled),
                MIN(CASE WHEN tracked = 1 THEN event_ms END)
         FROM sluice_watermark_messages
         WHERE flow_id = ?1 AND bucket_ms >= ?2
         GROUP BY bucket_ms HAVING SUM(tracked) > 0 ORDER BY bucket_ms",
    )?;
    let rows = statement.query_map(params![flow.id, from_ms], |row| {
        Ok(BucketCounts {
            bucket_ms: row.get(0)?,
            tracked: u64::try_from(row.get::<_, i64>(1)?).unwrap_or_default(),
            processed: u64::try_from(row.get::<_, i64>(2)?).unwrap_or_default(),
            min_event_ms: row.get(3)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Forgets the flow's buckets before `before_ms`; returns how many message reports went.
pub(crate) fn prune_buckets(
    conn: &mut Connection,
    flow: &FlowHandle,
    before_ms: i64,
) -> Result<u64, StoreError> {
    let deleted = conn.execute(
        "DELETE FROM sluice_watermark_messages WHERE flow_id = ?1 AND bucket_ms < ?2",
        params![flow.id, before_ms],
    )?;
    Ok(u64::try_from(deleted).unwrap_or(u64::MAX))
}

/// Stores the larger of the stored and the offered value of each field, in one statement, and
/// returns the record now stored; with `fenced_by`, only while that worker holds the flow's
/// `watermark/<flow>` lease at `now_ms` (else `None`, nothing written).
pub(crate) fn advance_watermark(
    conn: &mut Connection,
    flow: &FlowHandle,
    offer: &WatermarkRecord,
    fenced_by: Option<&str>,
    now_ms: i64,
) -> Result<Option<WatermarkRecord>, StoreError> {
    let role = format!("watermark/{}", flow.name);
    // `WHERE` after a `SELECT` that feeds an upsert: SQLite needs it, and it is the fence.
    let stored = conn
        .query_row(
            "INSERT INTO sluice_watermarks (flow_id, watermark_ms, horizon_ms, updated_at_ms)
         SELECT ?1, ?2, ?3, ?4
         WHERE ?5 IS NULL OR EXISTS (
             SELECT 1 FROM sluice_leases
             WHERE pipeline = ?6 AND role = ?7 AND holder = ?5 AND expires_at > ?8)
         ON CONFLICT (flow_id) DO UPDATE SET
             watermark_ms = MAX(watermark_ms, excluded.watermark_ms),
             horizon_ms = MAX(horizon_ms, excluded.horizon_ms),
             updated_at_ms = MAX(updated_at_ms, excluded.updated_at_ms)
         RETURNING watermark_ms, horizon_ms, updated_at_ms",
            params![
                flow.id,
                offer.watermark_ms,
                offer.horizon_ms,
                offer.updated_at_ms,
                fenced_by,
                &*flow.pipeline,
                role,
                now_ms,
            ],
            |row| {
                Ok(WatermarkRecord {
                    watermark_ms: row.get(0)?,
                    horizon_ms: row.get(1)?,
                    updated_at_ms: row.get(2)?,
                })
            },
        )
        .optional()?;
    Ok(stored)
}

/// The watermark records of the pipeline's flows that have one, in flow-name order.
pub(crate) fn watermarks(
    conn: &mut Connection,
    pipeline: &str,
) -> Result<Vec<(String, WatermarkRecord)>, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT f.flow, w.watermark_ms, w.horizon_ms, w.updated_at_ms FROM sluice_watermarks w
         JOIN sluice_flows f ON f.flow_id = w.flow_id
         WHERE f.pipeline = ?1 ORDER BY f.flow",
    )?;
    let rows = statement.query_map(params![pipeline], |row| {
        Ok((
            row.get(0)?,
            WatermarkRecord {
                watermark_ms: row.get(1)?,
                horizon_ms: row.get(2)?,
                updated_at_ms: row.get(3)?,
            },
        ))
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

#[async_trait]
impl ProgressStore for SqliteStore {
    async fn add_bucket_messages(
        &self,
        flow: &FlowHandle,
        messages: &[BucketMessage],
    ) -> Result<(), StoreError> {
        if messages.is_empty() {
            return Ok(());
        }
        let (flow, messages) = (flow.clone(), messages.to_vec());
        self.call(move |conn| self::add_bucket_messages(conn, &flow, &messages))
            .await
    }

    async fn bucket_counts(
        &self,
        flow: &FlowHandle,
        from_ms: i64,
    ) -> Result<Vec<BucketCounts>, StoreError> {
        let flow = flow.clone();
        self.call(move |conn| self::bucket_counts(conn, &flow, from_ms))
            .await
    }

    async fn prune_buckets(&self, flow: &FlowHandle, before_ms: i64) -> Result<u64, StoreError> {
        let flow = flow.clone();
        self.call(move |conn| self::prune_buckets(conn, &flow, before_ms))
            .await
    }

    async fn advance_watermark(
        &self,
        flow: &FlowHandle,
        offer: &WatermarkRecord,
        fenced_by: Option<&str>,
    ) -> Result<Option<WatermarkRecord>, StoreError> {
        let (flow, offer, fence) = (flow.clone(), *offer, fenced_by.map(str::to_owned));
        self.call(move |conn| {
            self::advance_watermark(conn, &flow, &offer, fence.as_deref(), now_ms())
        })
        .await
    }

    async fn watermarks(
        &self,
        pipeline: &str,
    ) -> Result<Vec<(String, WatermarkRecord)>, StoreError> {
        let pipeline = pipeline.to_owned();
        self.call(move |conn| self::watermarks(conn, &pipeline))
            .await
    }
}
