//! PostgreSQL: what the store keeps for event-time watermarks (see [`crate::progress`]) —
//! per-flow publish-time buckets of message reports that every replica adds to, and each
//! flow's forward-only watermark record.
//!
//! Every call is one statement, so one round trip and one transaction. Merges happen in the
//! statement (`m.tracked OR excluded.tracked`, `GREATEST`), so replicas report into the same
//! rows without reading them first. A flow's reset gives it a new id (see
//! `flows.rs`): its records are then reachable neither by id nor by name.

use super::PostgresStore;
use crate::{
    BucketCounts, BucketMessage, FlowHandle, MessageReport, ProgressStore, StoreError,
    WatermarkRecord,
};
use async_trait::async_trait;
use deadpool_postgres::Client;
use std::collections::BTreeMap;

/// `messages` with the reports of one message merged into one, in (bucket, message id) order.
/// One `INSERT ... ON CONFLICT` may not touch a row twice; and replicas that lock the same rows
/// in the same order cannot deadlock on them. Each value: (tracked, settled, event time).
fn merged(messages: &[BucketMessage]) -> BTreeMap<(i64, &str), (bool, bool, Option<i64>)> {
    let mut merged: BTreeMap<(i64, &str), (bool, bool, Option<i64>)> = BTreeMap::new();
    for message in messages {
        let entry = merged
            .entry((message.bucket_ms, message.message_id.as_str()))
            .or_default();
        match message.report {
            MessageReport::Tracked { event_ms } => {
                entry.0 = true;
                entry.2 = entry.2.or(event_ms);
            }
            MessageReport::Settled => entry.1 = true,
        }
    }
    merged
}

/// Records each message's report in one statement: a row per flow, bucket and message id,
/// whose flags only ever go from false to true.
pub(super) async fn add_bucket_messages(
    client: &Client,
    flow: &FlowHandle,
    messages: &[BucketMessage],
) -> Result<(), StoreError> {
    let merged = merged(messages);
    let buckets: Vec<i64> = merged.keys().map(|(bucket, _)| *bucket).collect();
    let ids: Vec<&str> = merged.keys().map(|(_, id)| *id).collect();
    let tracked: Vec<bool> = merged.values().map(|v| v.0).collect();
    let settled: Vec<bool> = merged.values().map(|v| v.1).collect();
    let event_ms: Vec<Option<i64>> = merged.values().map(|v| v.2).collect();
    let statement = client
        .prepare_cached(
            "INSERT INTO sluice_watermark_messages AS m
                 (flow_id, bucket_ms, message_id, tracked, settled, event_ms)
             SELECT $1, r.bucket_ms, r.message_id, r.tracked, r.settled, r.event_ms
             FROM unnest($2::int8[], $3::text[], $4::bool[], $5::bool[], $6::int8[])
                 AS r (bucket_ms, message_id, tracked, settled, event_ms)
             ORDER BY r.bucket_ms, r.message_id
             ON CONFLICT (flow_id, bucket_ms, message_id) DO UPDATE SET
                 tracked = m.tracked OR excluded.tracked,
                 settled = m.settled OR excluded.settled,
                 event_ms = COALESCE(m.event_ms, excluded.event_ms)",
        )
        .await?;
    client
        .execute(
            &statement,
            &[&flow.id, &buckets, &ids, &tracked, &settled, &event_ms],
        )
        .await?;
    Ok(())
}

/// The flow's buckets at or after `from_ms` that hold a tracked message, in bucket order.
pub(super) async fn bucket_counts(
    client: &Client,
    flow: &FlowHandle,
    from_ms: i64,
) -> Result<Vec<BucketCounts>, StoreError> {
    let rows = client
        .query(
            "SELECT bucket_ms, count(*) FILTER (WHERE tracked),
                    count(*) FILTER (WHERE tracked AND settled),
                    min(event_ms) FILTER (WHERE tracked)
             FROM sluice_watermark_messages
             WHERE flow_id = $1 AND bucket_ms >= $2
             GROUP BY bucket_ms HAVING bool_or(tracked) ORDER BY bucket_ms",
            &[&flow.id, &from_ms],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(BucketCounts {
                bucket_ms: row.try_get(0)?,
                tracked: u64::try_from(row.try_get::<_, i64>(1)?).unwrap_or_default(),
                processed: u64::try_from(row.try_get::<_, i64>(2)?).unwrap_or_default(),
                min_event_ms: row.try_get(3)?,
            })
        })
        .collect()
}

/// Forgets the flow's buckets before `before_ms`; returns how many message reports went.
pub(super) async fn prune_buckets(
    client: &Client,
    flow: &FlowHandle,
    before_ms: i64,
) -> Result<u64, StoreError> {
    Ok(client
        .execute(
            "DELETE FROM sluice_watermark_messages WHERE flow_id = $1 AND bucket_ms < $2",
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

#[async_trait]
impl ProgressStore for PostgresStore {
    async fn add_bucket_messages(
        &self,
        flow: &FlowHandle,
        messages: &[BucketMessage],
    ) -> Result<(), StoreError> {
        if messages.is_empty() {
            return Ok(());
        }
        let (client, _) = self.ready().await?;
        self::add_bucket_messages(&client, flow, messages).await
    }

    async fn bucket_counts(
        &self,
        flow: &FlowHandle,
        from_ms: i64,
    ) -> Result<Vec<BucketCounts>, StoreError> {
        let (client, _) = self.ready().await?;
        self::bucket_counts(&client, flow, from_ms).await
    }

    async fn prune_buckets(&self, flow: &FlowHandle, before_ms: i64) -> Result<u64, StoreError> {
        let (client, _) = self.ready().await?;
        self::prune_buckets(&client, flow, before_ms).await
    }

    async fn advance_watermark(
        &self,
        flow: &FlowHandle,
        offer: &WatermarkRecord,
        fenced_by: Option<&str>,
    ) -> Result<Option<WatermarkRecord>, StoreError> {
        let (client, _) = self.ready().await?;
        self::advance_watermark(&client, flow, offer, fenced_by).await
    }

    async fn watermarks(
        &self,
        pipeline: &str,
    ) -> Result<Vec<(String, WatermarkRecord)>, StoreError> {
        let (client, _) = self.ready().await?;
        self::watermarks(&client, pipeline).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_of_one_message_merge_in_bucket_and_id_order() {
        let report = |bucket_ms, id: &str, report| BucketMessage {
            bucket_ms,
            message_id: id.into(),
            report,
        };
        let tracked = |event_ms| MessageReport::Tracked { event_ms };
        let reports = [
            report(2_000, "b", MessageReport::Settled),
            report(1_000, "z", tracked(Some(1_700))),
            report(2_000, "a", tracked(None)),
            report(2_000, "b", tracked(Some(2_100))),
            report(2_000, "b", MessageReport::Settled),
            report(1_000, "z", tracked(Some(1_900))),
        ];
        let merged = merged(&reports);
        let merged: Vec<_> = merged.into_iter().collect();
        assert_eq!(
            merged,
            [
                ((1_000, "z"), (true, false, Some(1_700))),
                ((2_000, "a"), (true, false, None)),
                ((2_000, "b"), (true, true, Some(2_100))),
            ]
        );
    }
}
