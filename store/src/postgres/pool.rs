//! PostgreSQL: the worker pool's coordination rows — heartbeats, drain reports of once flows
//! and leases — each call one statement on the server's clock (`now()`), so workers on
//! different hosts agree on who is alive and who holds what.

use super::PostgresStore;
use super::ms;
use crate::{
    DrainCensus, DrainReport, FlowHandle, LeaseGrant, LeaseRecord, LeaseRequest, StoreError,
    WorkerBeat, WorkerRecord,
};
use crate::{DrainStore, MembershipStore};
use async_trait::async_trait;
use deadpool_postgres::Client;
use std::time::Duration;

/// Records that `beat.worker` is alive now (by the server's clock).
pub(super) async fn heartbeat(client: &Client, beat: &WorkerBeat) -> Result<(), StoreError> {
    let pid = i32::try_from(beat.pid).unwrap_or(i32::MAX);
    client
        .execute(
            "INSERT INTO sluice_workers
                 (pipeline, worker, host, pid, started_at, last_beat, schedule)
             VALUES ($1, $2, $3, $4, now(), now(), $5)
             ON CONFLICT (pipeline, worker) DO UPDATE SET last_beat = now(),
                 schedule = excluded.schedule",
            &[
                &beat.pipeline,
                &beat.worker,
                &beat.host,
                &pid,
                &beat.schedule,
            ],
        )
        .await?;
    Ok(())
}

/// Records whether `worker` has drained `flow` (an input-ended once flow), now.
pub(super) async fn report_drain(
    client: &Client,
    flow: &FlowHandle,
    worker: &str,
    drained: bool,
) -> Result<(), StoreError> {
    client
        .execute(
            "INSERT INTO sluice_drains (flow_id, worker, drained, reported_at)
             VALUES ($1, $2, $3, now())
             ON CONFLICT (flow_id, worker) DO UPDATE
             SET drained = excluded.drained, reported_at = excluded.reported_at",
            &[&flow.id, &worker, &drained],
        )
        .await?;
    Ok(())
}

/// Forgets `worker`'s drain report of `flow`.
pub(super) async fn withdraw_drain(
    client: &Client,
    flow: &FlowHandle,
    worker: &str,
) -> Result<(), StoreError> {
    client
        .execute(
            "DELETE FROM sluice_drains WHERE flow_id = $1 AND worker = $2",
            &[&flow.id, &worker],
        )
        .await?;
    Ok(())
}

/// Every worker's drain report of `flow`, with its last heartbeat and the server's clock.
pub(super) async fn drain_census(
    client: &Client,
    flow: &FlowHandle,
) -> Result<DrainCensus, StoreError> {
    let pipeline: &str = &flow.pipeline;
    let rows = client
        .query(
            concat!(
                "SELECT d.worker, d.drained, ",
                ms!("d.reported_at"),
                ", ",
                ms!("w.last_beat"),
                ", ",
                ms!("now()"),
                " FROM sluice_drains d
                 LEFT JOIN sluice_workers w ON w.pipeline = $2 AND w.worker = d.worker
                 WHERE d.flow_id = $1 ORDER BY d.worker"
            ),
            &[&flow.id, &pipeline],
        )
        .await?;
    let mut census = DrainCensus::default();
    for row in &rows {
        census.now_ms = row.try_get(4)?;
        census.reports.push(DrainReport {
            worker: row.try_get(0)?,
            drained: row.try_get(1)?,
            reported_at_ms: row.try_get(2)?,
            last_beat_ms: row.try_get(3)?,
        });
    }
    if rows.is_empty() {
        census.now_ms = client
            .query_one(concat!("SELECT ", ms!("now()")), &[])
            .await?
            .try_get(0)?;
    }
    Ok(census)
}

/// Forgets `worker`'s heartbeat (it left the pool).
pub(super) async fn leave(client: &Client, pipeline: &str, worker: &str) -> Result<(), StoreError> {
    client
        .execute(
            "DELETE FROM sluice_workers WHERE pipeline = $1 AND worker = $2",
            &[&pipeline, &worker],
        )
        .await?;
    Ok(())
}

/// The workers of `pipeline` that beat within `within`, by name.
pub(super) async fn workers(
    client: &Client,
    pipeline: &str,
    within: Duration,
) -> Result<Vec<WorkerRecord>, StoreError> {
    let rows = client
        .query(
            concat!(
                "SELECT worker, host, pid, ",
                ms!("started_at"),
                ", ",
                ms!("last_beat"),
                ", schedule FROM sluice_workers
                 WHERE pipeline = $1 AND last_beat >= now() - make_interval(secs => $2)
                 ORDER BY worker"
            ),
            &[&pipeline, &within.as_secs_f64()],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(WorkerRecord {
                worker: row.try_get(0)?,
                host: row.try_get(1)?,
                pid: u32::try_from(row.try_get::<_, i32>(2)?).unwrap_or_default(),
                started_at_ms: row.try_get(3)?,
                last_beat_ms: row.try_get(4)?,
                schedule: row.try_get(5)?,
            })
        })
        .collect()
}

/// Takes or renews the lease `request` names, unless another holder's is still valid.
pub(super) async fn acquire_lease(
    client: &Client,
    request: &LeaseRequest,
) -> Result<LeaseGrant, StoreError> {
    // One statement, so one snapshot and one clock (`now()`): the row is written only if
    // the lease is free, expired or already the asker's.
    let granted = client
        .query_opt(
            concat!(
                "INSERT INTO sluice_leases AS l (pipeline, role, holder, acquired_at, expires_at)
                 VALUES ($1, $2, $3, now(), now() + make_interval(secs => $4))
                 ON CONFLICT (pipeline, role) DO UPDATE SET
                     acquired_at = CASE WHEN l.holder = excluded.holder
                         THEN l.acquired_at ELSE excluded.acquired_at END,
                     holder = excluded.holder,
                     expires_at = excluded.expires_at
                 WHERE l.holder = excluded.holder OR l.expires_at <= now()
                 RETURNING l.acquired_at = now(), ",
                ms!("l.expires_at")
            ),
            &[
                &request.pipeline,
                &request.role,
                &request.holder,
                &request.ttl.as_secs_f64(),
            ],
        )
        .await?;
    if let Some(row) = granted {
        return Ok(LeaseGrant::Held {
            taken: row.try_get(0)?,
            expires_at_ms: row.try_get(1)?,
        });
    }
    let holder: String = client
        .query_one(
            "SELECT holder FROM sluice_leases WHERE pipeline = $1 AND role = $2",
            &[&request.pipeline, &request.role],
        )
        .await?
        .try_get(0)?;
    Ok(LeaseGrant::HeldBy(holder))
}

/// Gives up `holder`'s lease on `role` (nothing if another holds it).
pub(super) async fn release_lease(
    client: &Client,
    pipeline: &str,
    role: &str,
    holder: &str,
) -> Result<(), StoreError> {
    client
        .execute(
            "DELETE FROM sluice_leases WHERE pipeline = $1 AND role = $2 AND holder = $3",
            &[&pipeline, &role, &holder],
        )
        .await?;
    Ok(())
}

/// Every lease of `pipeline`, by role.
pub(super) async fn leases(
    client: &Client,
    pipeline: &str,
) -> Result<Vec<LeaseRecord>, StoreError> {
    let rows = client
        .query(
            concat!(
                "SELECT role, holder, ",
                ms!("expires_at"),
                ", ",
                ms!("acquired_at"),
                " FROM sluice_leases WHERE pipeline = $1 ORDER BY role"
            ),
            &[&pipeline],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(LeaseRecord {
                role: row.try_get(0)?,
                holder: row.try_get(1)?,
                expires_at_ms: row.try_get(2)?,
                acquired_at_ms: row.try_get(3)?,
            })
        })
        .collect()
}

#[async_trait]
impl MembershipStore for PostgresStore {
    async fn heartbeat(&self, beat: &WorkerBeat) -> Result<(), StoreError> {
        if self.generation_ms.get().is_none() {
            // Not migrated yet in this process: once, through the main pool.
            drop(self.ready().await?);
        }
        let client = self.beats.get().await?;
        heartbeat(&client, beat).await?;
        // Each beat also renews the clock offset that commit deadlines are converted with.
        self.server_clock.measure(&client).await?;
        Ok(())
    }

    async fn leave(&self, pipeline: &str, worker: &str) -> Result<(), StoreError> {
        let (client, _) = self.ready().await?;
        leave(&client, pipeline, worker).await
    }

    async fn workers(
        &self,
        pipeline: &str,
        within: Duration,
    ) -> Result<Vec<WorkerRecord>, StoreError> {
        let (client, _) = self.ready().await?;
        workers(&client, pipeline, within).await
    }

    async fn acquire_lease(&self, request: &LeaseRequest) -> Result<LeaseGrant, StoreError> {
        let (client, _) = self.ready().await?;
        acquire_lease(&client, request).await
    }

    async fn release_lease(
        &self,
        pipeline: &str,
        role: &str,
        holder: &str,
    ) -> Result<(), StoreError> {
        let (client, _) = self.ready().await?;
        release_lease(&client, pipeline, role, holder).await
    }

    async fn leases(&self, pipeline: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let (client, _) = self.ready().await?;
        leases(&client, pipeline).await
    }
}

#[async_trait]
impl DrainStore for PostgresStore {
    async fn report_drain(
        &self,
        flow: &FlowHandle,
        worker: &str,
        drained: bool,
    ) -> Result<(), StoreError> {
        let (client, _) = self.ready().await?;
        report_drain(&client, flow, worker, drained).await
    }

    async fn withdraw_drain(&self, flow: &FlowHandle, worker: &str) -> Result<(), StoreError> {
        let (client, _) = self.ready().await?;
        withdraw_drain(&client, flow, worker).await
    }

    async fn drain_census(&self, flow: &FlowHandle) -> Result<crate::DrainCensus, StoreError> {
        let (client, _) = self.ready().await?;
        drain_census(&client, flow).await
    }
}
