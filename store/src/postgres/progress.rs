//! PostgreSQL: what the store keeps for event-time watermarks (see [`crate::progress`]) —
//! per-flow publish-time buckets that every replica adds to, and each flow's forward-only
//! watermark record.
//!
//! Every call is one statement, so one round trip and one transaction. Merges happen in the
//! statement (`b.tracked + excluded.tracked`, `LEAST`, `GREATEST`), so replicas report into
//! the same rows without reading them first. A flow's reset gives it a new id (see
//! `flows.rs`): its records are then reachable neither by id nor by name.

use crate::{BucketCounts, FlowHandle, StoreError, WatermarkRecord};
use deadpool_postgres::Client;
use std::collections::BTreeMap;

/// A count as PostgreSQL stores it (`BIGINT`); a count beyond `i64::MAX` is refused.
fn stored_count(count: u64) -> Result<i64, StoreError> {
    i64::try_from(count)
        .map_err(|_| StoreError::Rejected(format!("bucket count {count} is out of range")))
}

/// A stored count as reported (a stored count is never negative).
fn reported_count(count: i64) -> u64 {
    u64::try_from(count).unwrap_or_default()
}

/// `counts` with the entries of one bucket merged into one, in bucket order. One `INSERT ...
/// ON CONFLICT` may not touch a row twice; and replicas that lock the rows of the same buckets
/// in the same order cannot deadlock on them.
fn merged(counts: &[BucketCounts]) -> Vec<BucketCounts> {
    let mut buckets: BTreeMap<i64, BucketCounts> = BTreeMap::new();
    for count in counts {
        let merged = buckets.entry(count.bucket_ms).or_insert(BucketCounts {
            bucket_ms: count.bucket_ms,
            ..BucketCounts::default()
        });
        merged.tracked = merged.tracked.saturating_add(count.tracked);
        merged.processed = merged.processed.saturating_add(count.processed);
        merged.min_event_ms = match (merged.min_event_ms, count.min_event_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    buckets.into_values().collect()
}

/// Adds every entry of `counts` to its bucket in one statement.
pub(super) async fn add_bucket_counts(
    client: &Client,
    flow: &FlowHandle,
    counts: &[BucketCounts],
) -> Result<(), StoreError> {
    let counts = merged(counts);
    let buckets: Vec<i64> = counts.iter().map(|c| c.bucket_ms).collect();
    let tracked = counts
        .iter()
        .map(|c| stored_count(c.tracked))
        .collect::<Result<Vec<_>, _>>()?;
    let processed = counts
        .iter()
        .map(|c| stored_count(c.processed))
        .collect::<Result<Vec<_>, _>>()?;
    let min_event: Vec<Option<i64>> = counts.iter().map(|c| c.min_event_ms).collect();
    // LEAST ignores NULLs: a report without an event time keeps the stored one.
    let statement = client
        .prepare_cached(
            "INSERT INTO sluice_watermark_buckets AS b
                 (flow_id, bucket_ms, tracked, processed, min_event_ms)
             SELECT $1, c.bucket_ms, c.tracked, c.processed, c.min_event_ms
             FROM unnest($2::int8[], $3::int8[], $4::int8[], $5::int8[])
                 AS c (bucket_ms, tracked, processed, min_event_ms)
             ORDER BY c.bucket_ms
             ON CONFLICT (flow_id, bucket_ms) DO UPDATE SET
                 tracked = b.tracked + excluded.tracked,
                 processed = b.processed + excluded.processed,
                 min_event_ms = LEAST(b.min_event_ms, excluded.min_event_ms)",
        )
        .await?;
    client
        .execute(
            &statement,
            &[&flow.id, &buckets, &tracked, &processed, &min_event],
        )
        .await?;
    Ok(())
}

/// The flow's buckets at or after `from_ms`, in bucket order.
pub(super) async fn bucket_counts(
    client: &Client,
    flow: &FlowHandle,
    from_ms: i64,
) -> Result<Vec<BucketCounts>, StoreError> {
    let rows = client
        .query(
            "SELECT bucket_ms, tracked, processed, min_event_ms FROM sluice_watermark_buckets
             WHERE flow_id = $1 AND bucket_ms >= $2 ORDER BY bucket_ms",
            &[&flow.id, &from_ms],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(BucketCounts {
                bucket_ms: row.try_get(0)?,
                tracked: reported_count(row.try_get(1)?),
                processed: reported_count(row.try_get(2)?),
                min_event_ms: row.try_get(3)?,
            })
        })
        .collect()
}

/// Deletes the flow's buckets before `before_ms`; returns how many went.
pub(super) async fn prune_buckets(
    client: &Client,
    flow: &FlowHandle,
    before_ms: i64,
) -> Result<u64, StoreError> {
    Ok(client
        .execute(
            "DELETE FROM sluice_watermark_buckets WHERE flow_id = $1 AND bucket_ms < $2",
            &[&flow.id, &before_ms],
        )
        .await?)
}

/// Stores the larger of the stored and the offered value of each field, in one statement, and
/// returns the record now stored; with `fenced_by`, only while that worker holds the flow's
/// `watermark/<flow>` lease on the server's clock (else `None`, nothing written).
pub(super) async fn advance_watermark(
    client: &Client,
    flow: &FlowHandle,
    offer: &WatermarkRecord,
    fenced_by: Option<&str>,
) -> Result<Option<WatermarkRecord>, StoreError> {
    let role = format!("watermark/{}", flow.name);
    let pipeline: &str = &flow.pipeline;
    let row = client
        .query_opt(
            "INSERT INTO sluice_watermarks AS w (flow_id, watermark_ms, horizon_ms, updated_at_ms)
             SELECT $1, $2, $3, $4
             WHERE $5::text IS NULL OR EXISTS (
                 SELECT 1 FROM sluice_leases
                 WHERE pipeline = $6 AND role = $7 AND holder = $5 AND expires_at > now())
             ON CONFLICT (flow_id) DO UPDATE SET
                 watermark_ms = GREATEST(w.watermark_ms, excluded.watermark_ms),
                 horizon_ms = GREATEST(w.horizon_ms, excluded.horizon_ms),
                 updated_at_ms = GREATEST(w.updated_at_ms, excluded.updated_at_ms)
             RETURNING w.watermark_ms, w.horizon_ms, w.updated_at_ms",
            &[
                &flow.id,
                &offer.watermark_ms,
                &offer.horizon_ms,
                &offer.updated_at_ms,
                &fenced_by,
                &pipeline,
                &role,
            ],
        )
        .await?;
    row.map(|row| {
        Ok(WatermarkRecord {
            watermark_ms: row.try_get(0)?,
            horizon_ms: row.try_get(1)?,
            updated_at_ms: row.try_get(2)?,
        })
    })
    .transpose()
}

/// The watermark records of the pipeline's flows that have one, in flow-name order (bytewise,
/// as on SQLite). The join is on the flows' current ids, so a reset flow has none.
pub(super) async fn watermarks(
    client: &Client,
    pipeline: &str,
) -> Result<Vec<(String, WatermarkRecord)>, StoreError> {
    let rows = client
        .query(
            "SELECT f.flow, w.watermark_ms, w.horizon_ms, w.updated_at_ms
             FROM sluice_watermarks w JOIN sluice_flows f USING (flow_id)
             WHERE f.pipeline = $1 ORDER BY f.flow COLLATE \"C\"",
            &[&pipeline],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok((
                row.try_get(0)?,
                WatermarkRecord {
                    watermark_ms: row.try_get(1)?,
                    horizon_ms: row.try_get(2)?,
                    updated_at_ms: row.try_get(3)?,
                },
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_of_one_bucket_merge_in_bucket_order() {
        let count = |bucket_ms, tracked, processed, min_event_ms| BucketCounts {
            bucket_ms,
            tracked,
            processed,
            min_event_ms,
        };
        let merged = merged(&[
            count(2_000, 1, 0, Some(2_500)),
            count(1_000, 2, 1, None),
            count(2_000, 3, 4, Some(2_100)),
            count(1_000, 0, 1, Some(1_700)),
            count(2_000, 0, 1, None),
        ]);
        assert_eq!(
            merged,
            [
                count(1_000, 2, 2, Some(1_700)),
                count(2_000, 4, 5, Some(2_100)),
            ]
        );
    }
}
