//! Heartbeats and leases on SQLite (replicas on one host sharing a file); the semantics are
//! those of [`crate::pool`], with the host's clock.

use super::SqliteStore;
use super::now_ms;
use crate::{DrainStore, FlowHandle, MembershipStore};
use crate::{LeaseGrant, LeaseRecord, LeaseRequest, StoreError, WorkerBeat, WorkerRecord};
use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};
use std::time::Duration;

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

pub(crate) fn heartbeat(
    conn: &mut Connection,
    beat: &WorkerBeat,
    now_ms: i64,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO sluice_workers (pipeline, worker, host, pid, started_at, last_beat, schedule)
         VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6)
         ON CONFLICT (pipeline, worker) DO UPDATE SET last_beat = excluded.last_beat,
             schedule = excluded.schedule",
        params![
            beat.pipeline,
            beat.worker,
            beat.host,
            beat.pid,
            now_ms,
            beat.schedule
        ],
    )?;
    Ok(())
}

pub(crate) fn workers(
    conn: &mut Connection,
    pipeline: &str,
    within: Duration,
    now_ms: i64,
) -> Result<Vec<WorkerRecord>, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT worker, host, pid, started_at, last_beat, schedule FROM sluice_workers
         WHERE pipeline = ?1 AND last_beat >= ?2 ORDER BY worker",
    )?;
    let rows = statement.query_map(
        params![pipeline, now_ms.saturating_sub(millis(within))],
        |row| {
            Ok(WorkerRecord {
                worker: row.get(0)?,
                host: row.get(1)?,
                pid: row.get(2)?,
                started_at_ms: row.get(3)?,
                last_beat_ms: row.get(4)?,
                schedule: row.get(5)?,
            })
        },
    )?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub(crate) fn acquire_lease(
    conn: &mut Connection,
    request: &LeaseRequest,
    now_ms: i64,
) -> Result<LeaseGrant, StoreError> {
    let expires_at = now_ms.saturating_add(millis(request.ttl));
    // One statement: the row is written only if the lease is free, expired or already ours;
    // `acquired_at` moves only when the holder changes.
    let granted: Option<(i64, i64)> = conn
        .query_row(
            "INSERT INTO sluice_leases (pipeline, role, holder, acquired_at, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (pipeline, role) DO UPDATE SET
                 acquired_at = CASE WHEN sluice_leases.holder = excluded.holder
                     THEN sluice_leases.acquired_at ELSE excluded.acquired_at END,
                 holder = excluded.holder,
                 expires_at = excluded.expires_at
             WHERE sluice_leases.holder = excluded.holder OR sluice_leases.expires_at <= ?4
             RETURNING acquired_at, expires_at",
            params![
                request.pipeline,
                request.role,
                request.holder,
                now_ms,
                expires_at
            ],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?;
    if let Some((acquired_at, expires_at_ms)) = granted {
        return Ok(LeaseGrant::Held {
            taken: acquired_at == now_ms,
            expires_at_ms,
        });
    }
    let holder: String = conn.query_row(
        "SELECT holder FROM sluice_leases WHERE pipeline = ?1 AND role = ?2",
        params![request.pipeline, request.role],
        |row| row.get(0),
    )?;
    Ok(LeaseGrant::HeldBy(holder))
}

pub(crate) fn release_lease(
    conn: &mut Connection,
    pipeline: &str,
    role: &str,
    holder: &str,
) -> Result<(), StoreError> {
    conn.execute(
        "DELETE FROM sluice_leases WHERE pipeline = ?1 AND role = ?2 AND holder = ?3",
        params![pipeline, role, holder],
    )?;
    Ok(())
}

pub(crate) fn leases(
    conn: &mut Connection,
    pipeline: &str,
) -> Result<Vec<LeaseRecord>, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT role, holder, expires_at, acquired_at FROM sluice_leases
         WHERE pipeline = ?1 ORDER BY role",
    )?;
    let rows = statement.query_map(params![pipeline], |row| {
        Ok(LeaseRecord {
            role: row.get(0)?,
            holder: row.get(1)?,
            expires_at_ms: row.get(2)?,
            acquired_at_ms: row.get(3)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Upserts `worker`'s drain report on flow `flow_id` (see `drain.rs`).
pub(crate) fn report_drain(
    conn: &mut Connection,
    flow_id: i64,
    worker: &str,
    drained: bool,
    now_ms: i64,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO sluice_drains (flow_id, worker, drained, reported_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (flow_id, worker) DO UPDATE
         SET drained = excluded.drained, reported_at = excluded.reported_at",
        params![flow_id, worker, drained, now_ms],
    )?;
    Ok(())
}

/// Deletes `worker`'s drain report on flow `flow_id`.
pub(crate) fn withdraw_drain(
    conn: &mut Connection,
    flow_id: i64,
    worker: &str,
) -> Result<(), StoreError> {
    conn.execute(
        "DELETE FROM sluice_drains WHERE flow_id = ?1 AND worker = ?2",
        params![flow_id, worker],
    )?;
    Ok(())
}

/// Every drain report on `flow`, with the reader's latest heartbeat.
pub(crate) fn drain_census(
    conn: &mut Connection,
    flow: &crate::FlowHandle,
    now_ms: i64,
) -> Result<crate::DrainCensus, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT d.worker, d.drained, d.reported_at, w.last_beat FROM sluice_drains d
         LEFT JOIN sluice_workers w ON w.pipeline = ?2 AND w.worker = d.worker
         WHERE d.flow_id = ?1 ORDER BY d.worker",
    )?;
    let rows = statement.query_map(params![flow.id, &*flow.pipeline], |row| {
        Ok(crate::DrainReport {
            worker: row.get(0)?,
            drained: row.get(1)?,
            reported_at_ms: row.get(2)?,
            last_beat_ms: row.get(3)?,
        })
    })?;
    Ok(crate::DrainCensus {
        now_ms,
        reports: rows.collect::<Result<_, _>>()?,
    })
}

/// Forgets `worker`'s heartbeat (it left the pool).
pub(super) fn leave(conn: &mut Connection, pipeline: &str, worker: &str) -> Result<(), StoreError> {
    conn.execute(
        "DELETE FROM sluice_workers WHERE pipeline = ?1 AND worker = ?2",
        params![pipeline, worker],
    )?;
    Ok(())
}

#[async_trait]
impl MembershipStore for SqliteStore {
    async fn heartbeat(&self, beat: &WorkerBeat) -> Result<(), StoreError> {
        let beat = beat.clone();
        self.call(move |conn| heartbeat(conn, &beat, now_ms()))
            .await
    }

    async fn leave(&self, pipeline: &str, worker: &str) -> Result<(), StoreError> {
        let (pipeline, worker) = (pipeline.to_owned(), worker.to_owned());
        self.call(move |conn| leave(conn, &pipeline, &worker)).await
    }

    async fn workers(
        &self,
        pipeline: &str,
        within: Duration,
    ) -> Result<Vec<WorkerRecord>, StoreError> {
        let pipeline = pipeline.to_owned();
        self.call(move |conn| workers(conn, &pipeline, within, now_ms()))
            .await
    }

    async fn acquire_lease(&self, request: &LeaseRequest) -> Result<LeaseGrant, StoreError> {
        let request = request.clone();
        self.call(move |conn| acquire_lease(conn, &request, now_ms()))
            .await
    }

    async fn release_lease(
        &self,
        pipeline: &str,
        role: &str,
        holder: &str,
    ) -> Result<(), StoreError> {
        let (pipeline, role, holder) = (pipeline.to_owned(), role.to_owned(), holder.to_owned());
        self.call(move |conn| release_lease(conn, &pipeline, &role, &holder))
            .await
    }

    async fn leases(&self, pipeline: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let pipeline = pipeline.to_owned();
        self.call(move |conn| leases(conn, &pipeline)).await
    }
}

#[async_trait]
impl DrainStore for SqliteStore {
    async fn report_drain(
        &self,
        flow: &FlowHandle,
        worker: &str,
        drained: bool,
    ) -> Result<(), StoreError> {
        let (id, worker) = (flow.id, worker.to_owned());
        self.call(move |conn| report_drain(conn, id, &worker, drained, now_ms()))
            .await
    }

    async fn withdraw_drain(&self, flow: &FlowHandle, worker: &str) -> Result<(), StoreError> {
        let (id, worker) = (flow.id, worker.to_owned());
        self.call(move |conn| withdraw_drain(conn, id, &worker))
            .await
    }

    async fn drain_census(&self, flow: &FlowHandle) -> Result<crate::DrainCensus, StoreError> {
        let flow = flow.clone();
        self.call(move |conn| drain_census(conn, &flow, now_ms()))
            .await
    }
}
