//! SQLite: what the store keeps for event-time watermarks (see [`crate::progress`]) — per-flow
//! publish-time buckets that reporters add to, and each flow's forward-only watermark record.
//!
//! Merges happen in the statements themselves (`tracked + excluded.tracked`, `MAX(...)`), so
//! several processes sharing the file can report into the same rows without reading first.

use crate::{BucketCounts, FlowHandle, StoreError, WatermarkRecord};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

/// A count as SQLite stores it; a count beyond `i64::MAX` is refused, not wrapped.
fn stored_count(count: u64) -> Result<i64, StoreError> {
    i64::try_from(count)
        .map_err(|_| StoreError::Rejected(format!("bucket count {count} is out of range")))
}

/// A stored count as reported (a stored count is never negative).
fn reported_count(count: i64) -> u64 {
    u64::try_from(count).unwrap_or_default()
}

/// Adds every entry of `counts` to its bucket, in one transaction. Entries for the same bucket
/// are applied one after the other, which merges them.
pub(crate) fn add_bucket_counts(
    conn: &mut Connection,
    flow: &FlowHandle,
    counts: &[BucketCounts],
) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        // SQLite's two-argument MIN is NULL if either side is: COALESCE keeps the side that
        // has a time when only one has.
        let mut statement = tx.prepare_cached(
            "INSERT INTO sluice_watermark_buckets
                 (flow_id, bucket_ms, tracked, processed, min_event_ms)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (flow_id, bucket_ms) DO UPDATE SET
                 tracked = tracked + excluded.tracked,
                 processed = processed + excluded.processed,
                 min_event_ms = COALESCE(MIN(min_event_ms, excluded.min_event_ms),
                                         min_event_ms, excluded.min_event_ms)",
        )?;
        for count in counts {
            statement.execute(params![
                flow.id,
                count.bucket_ms,
                stored_count(count.tracked)?,
                stored_count(count.processed)?,
                count.min_event_ms,
            ])?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// The flow's buckets at or after `from_ms`, in bucket order.
pub(crate) fn bucket_counts(
    conn: &mut Connection,
    flow: &FlowHandle,
    from_ms: i64,
) -> Result<Vec<BucketCounts>, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT bucket_ms, tracked, processed, min_event_ms FROM sluice_watermark_buckets
         WHERE flow_id = ?1 AND bucket_ms >= ?2 ORDER BY bucket_ms",
    )?;
    let rows = statement.query_map(params![flow.id, from_ms], |row| {
        Ok(BucketCounts {
            bucket_ms: row.get(0)?,
            tracked: reported_count(row.get(1)?),
            processed: reported_count(row.get(2)?),
            min_event_ms: row.get(3)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Deletes the flow's buckets before `before_ms`; returns how many went.
pub(crate) fn prune_buckets(
    conn: &mut Connection,
    flow: &FlowHandle,
    before_ms: i64,
) -> Result<u64, StoreError> {
    let deleted = conn.execute(
        "DELETE FROM sluice_watermark_buckets WHERE flow_id = ?1 AND bucket_ms < ?2",
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
