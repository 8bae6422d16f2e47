//! The dead-letter outbox on PostgreSQL (see [`crate::OutboxLetter`]); each call one
//! statement. A letter is owed while `published_at` and `refused` are both unset; a published
//! one stays as a marker with its message dropped (migration 13).

use super::PostgresStore;
use async_trait::async_trait;

use crate::{OutboxCensus, OutboxLetter, OutboxStore, StoreError};
use bytes::Bytes;
use deadpool_postgres::Client;

pub(super) async fn take(
    client: &Client,
    pipeline: &str,
    limit: usize,
    max_bytes: usize,
) -> Result<Vec<OutboxLetter>, StoreError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let max_bytes = i64::try_from(max_bytes).unwrap_or(i64::MAX);
    let rows = client
        .query(
            "UPDATE sluice_dead_letter_outbox SET publishes = publishes + 1
             WHERE id IN (SELECT id FROM (
                              SELECT id, sum(octet_length(data)) OVER (ORDER BY id)
                                         - octet_length(data) AS before
                              FROM sluice_dead_letter_outbox
                              WHERE pipeline = $1 AND refused IS NULL AND published_at IS NULL
                              ORDER BY id LIMIT $2) page
                          WHERE before < $3 OR before = 0)
             RETURNING id, flow, dedup_key, message_id, publish_time_ms, attributes, data,
                       reason, error, attempts, publishes - 1",
            &[&pipeline, &limit, &max_bytes],
        )
        .await?;
    let mut letters = rows
        .iter()
        .map(|row| {
            Ok(OutboxLetter {
                id: row.try_get(0)?,
                flow: row.try_get(1)?,
                dedup_key: row.try_get(2)?,
                message_id: row.try_get(3)?,
                publish_time_ms: row.try_get(4)?,
                attributes_json: row.try_get(5)?,
                data: Bytes::from(row.try_get::<_, Vec<u8>>(6)?),
                reason: row.try_get(7)?,
                error: row.try_get(8)?,
                attempts: u32::try_from(row.try_get::<_, i32>(9)?).unwrap_or(0),
                earlier_publishes: u32::try_from(row.try_get::<_, i32>(10)?).unwrap_or(0),
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    letters.sort_by_key(|l| l.id);
    Ok(letters)
}

pub(super) async fn published(
    client: &Client,
    pipeline: &str,
    ids: &[i64],
) -> Result<(), StoreError> {
    client
        .execute(
            "UPDATE sluice_dead_letter_outbox
             SET published_at = now(), data = '', attributes = '{}', error = ''
             WHERE pipeline = $1 AND id = ANY($2) AND published_at IS NULL",
            &[&pipeline, &ids],
        )
        .await?;
    Ok(())
}

pub(super) async fn refused(
    client: &Client,
    pipeline: &str,
    id: i64,
    why: &str,
) -> Result<(), StoreError> {
    client
        .execute(
            "UPDATE sluice_dead_letter_outbox SET refused = $3
             WHERE pipeline = $1 AND id = $2 AND published_at IS NULL",
            &[&pipeline, &id, &why],
        )
        .await?;
    Ok(())
}

pub(super) async fn census(client: &Client, pipeline: &str) -> Result<OutboxCensus, StoreError> {
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE refused IS NULL AND published_at IS NULL),
                    count(*) FILTER (WHERE refused IS NOT NULL)
             FROM sluice_dead_letter_outbox WHERE pipeline = $1",
            &[&pipeline],
        )
        .await?;
    let count = |i: usize| -> Result<u64, StoreError> {
        Ok(u64::try_from(row.try_get::<_, i64>(i)?).unwrap_or(0))
    };
    Ok(OutboxCensus {
        waiting: count(0)?,
        refused: count(1)?,
    })
}

#[async_trait]
impl OutboxStore for PostgresStore {
    async fn take_outbox(
        &self,
        pipeline: &str,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<OutboxLetter>, StoreError> {
        let (client, _) = self.ready().await?;
        self::take(&client, pipeline, limit, max_bytes).await
    }

    async fn outbox_published(&self, pipeline: &str, ids: &[i64]) -> Result<(), StoreError> {
        let (client, _) = self.ready().await?;
        self::published(&client, pipeline, ids).await
    }

    async fn outbox_refused(&self, pipeline: &str, id: i64, why: &str) -> Result<(), StoreError> {
        let (client, _) = self.ready().await?;
        self::refused(&client, pipeline, id, why).await
    }

    async fn outbox_census(&self, pipeline: &str) -> Result<OutboxCensus, StoreError> {
        let (client, _) = self.ready().await?;
        self::census(&client, pipeline).await
    }
}
