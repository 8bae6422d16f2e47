//! Pool updates on PostgreSQL (see [`crate::PoolUpdate`]), each call one statement on the
//! server's clock.

use super::PostgresStore;
use super::ms;
use crate::PoolUpdateStore;
use crate::{PoolUpdate, PoolUpdateState, StoreError};
use async_trait::async_trait;
use deadpool_postgres::Client;
use std::time::Duration;

pub(super) async fn request(
    client: &Client,
    pipeline: &str,
    request: &str,
    requested_by: &str,
) -> Result<i64, StoreError> {
    let row = client
        .query_one(
            "INSERT INTO sluice_pool_updates (pipeline, request, requested_by, requested_at, state)
             VALUES ($1, $2, $3, now(), 'pending') RETURNING id",
            &[&pipeline, &request, &requested_by],
        )
        .await?;
    Ok(row.try_get(0)?)
}

/// Which update [`read`] reads.
pub(super) enum Which {
    /// This one.
    Id(i64),
    /// The oldest unfinished.
    OldestOpen,
    /// The newest.
    Latest,
}

pub(super) async fn read(
    client: &Client,
    pipeline: &str,
    which: Which,
) -> Result<Option<PoolUpdate>, StoreError> {
    const SELECT: &str = concat!(
        "SELECT id, request, requested_by, ",
        ms!("requested_at"),
        ", state, clearer, ",
        ms!("claimed_at"),
        ", message FROM sluice_pool_updates WHERE pipeline = $1"
    );
    let row = match which {
        Which::Id(id) => {
            client
                .query_opt(&format!("{SELECT} AND id = $2"), &[&pipeline, &id])
                .await?
        }
        Which::OldestOpen => {
            client
                .query_opt(
                    &format!("{SELECT} AND state IN ('pending', 'clearing') ORDER BY id LIMIT 1"),
                    &[&pipeline],
                )
                .await?
        }
        Which::Latest => {
            client
                .query_opt(&format!("{SELECT} ORDER BY id DESC LIMIT 1"), &[&pipeline])
                .await?
        }
    };
    let Some(row) = row else { return Ok(None) };
    let state: String = row.try_get(4)?;
    let state = match state.as_str() {
        "pending" => PoolUpdateState::Pending,
        "clearing" => PoolUpdateState::Clearing {
            by: row.try_get::<_, Option<String>>(5)?.unwrap_or_default(),
            claimed_at_ms: row.try_get::<_, Option<i64>>(6)?.unwrap_or_default(),
        },
        "done" => PoolUpdateState::Done,
        _ => PoolUpdateState::Failed,
    };
    let id: i64 = row.try_get(0)?;
    let drained = client
        .query(
            "SELECT worker FROM sluice_pool_update_drains WHERE update_id = $1 ORDER BY worker",
            &[&id],
        )
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?;
    Ok(Some(PoolUpdate {
        id,
        pipeline: pipeline.to_owned(),
        request: row.try_get(1)?,
        requested_by: row.try_get(2)?,
        requested_at_ms: row.try_get(3)?,
        state,
        message: row.try_get(7)?,
        drained,
    }))
}

pub(super) async fn drained(client: &Client, id: i64, worker: &str) -> Result<(), StoreError> {
    client
        .execute(
            "INSERT INTO sluice_pool_update_drains (update_id, worker) VALUES ($1, $2)
             ON CONFLICT DO NOTHING",
            &[&id, &worker],
        )
        .await?;
    Ok(())
}

pub(super) async fn claim(
    client: &Client,
    pipeline: &str,
    id: i64,
    worker: &str,
    stale_after: Duration,
) -> Result<bool, StoreError> {
    let stale_ms = i64::try_from(stale_after.as_millis()).unwrap_or(i64::MAX);
    let changed = client
        .execute(
            "UPDATE sluice_pool_updates SET state = 'clearing', clearer = $3, claimed_at = now()
             WHERE pipeline = $1 AND id = $2
               AND (state = 'pending'
                    OR (state = 'clearing' AND (clearer = $3
                        OR claimed_at < now() - make_interval(secs => $4::int8 / 1000.0))))",
            &[&pipeline, &id, &worker, &stale_ms],
        )
        .await?;
    Ok(changed == 1)
}

/// Holds update `claim.update` of `pipeline` against a takeover until `tx` ends, if `claim`'s
/// clearer still holds it; [`StoreError::ClaimLost`] otherwise.
pub(super) async fn hold_claim(
    tx: &deadpool_postgres::Transaction<'_>,
    pipeline: &str,
    claim: &crate::ClearClaim,
) -> Result<(), StoreError> {
    let held = tx
        .query_opt(
            "SELECT 1 FROM sluice_pool_updates
             WHERE pipeline = $1 AND id = $2 AND state = 'clearing' AND clearer = $3
             FOR SHARE",
            &[&pipeline, &claim.update, &claim.clearer],
        )
        .await?;
    match held {
        Some(_) => Ok(()),
        None => Err(StoreError::ClaimLost(format!(
            "pool update {} is no longer being cleared by {}",
            claim.update, claim.clearer
        ))),
    }
}

pub(super) async fn finish(
    client: &Client,
    pipeline: &str,
    id: i64,
    clearer: &str,
    done: bool,
    message: &str,
) -> Result<bool, StoreError> {
    let state = if done { "done" } else { "failed" };
    let changed = client
        .execute(
            "UPDATE sluice_pool_updates SET state = $3, message = $4, finished_at = now()
             WHERE pipeline = $1 AND id = $2 AND state = 'clearing' AND clearer = $5",
            &[&pipeline, &id, &state, &message, &clearer],
        )
        .await?;
    Ok(changed == 1)
}

#[async_trait]
impl PoolUpdateStore for PostgresStore {
    async fn request_pool_update(
        &self,
        pipeline: &str,
        request: &str,
        requested_by: &str,
    ) -> Result<i64, StoreError> {
        let (client, _) = self.ready().await?;
        self::request(&client, pipeline, request, requested_by).await
    }

    async fn pool_update(
        &self,
        pipeline: &str,
        id: Option<i64>,
    ) -> Result<Option<PoolUpdate>, StoreError> {
        let (client, _) = self.ready().await?;
        let which = id.map_or(Which::OldestOpen, Which::Id);
        read(&client, pipeline, which).await
    }

    async fn latest_pool_update(&self, pipeline: &str) -> Result<Option<PoolUpdate>, StoreError> {
        let (client, _) = self.ready().await?;
        read(&client, pipeline, Which::Latest).await
    }

    async fn drained_for_pool_update(
        &self,
        _pipeline: &str,
        id: i64,
        worker: &str,
    ) -> Result<(), StoreError> {
        let (client, _) = self.ready().await?;
        drained(&client, id, worker).await
    }

    async fn claim_pool_update(
        &self,
        pipeline: &str,
        id: i64,
        worker: &str,
        stale_after: Duration,
    ) -> Result<bool, StoreError> {
        let (client, _) = self.ready().await?;
        claim(&client, pipeline, id, worker, stale_after).await
    }

    async fn finish_pool_update(
        &self,
        pipeline: &str,
        id: i64,
        clearer: &str,
        done: bool,
        message: &str,
    ) -> Result<bool, StoreError> {
        let (client, _) = self.ready().await?;
        finish(&client, pipeline, id, clearer, done, message).await
    }
}
