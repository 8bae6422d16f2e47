//! Pool updates on SQLite (see [`crate::PoolUpdate`]), on the host's clock.

use super::SqliteStore;
use super::now_ms;
use crate::PoolUpdateStore;
use crate::{PoolUpdate, PoolUpdateState, StoreError};
use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};
use std::time::Duration;

pub(crate) fn request(
    conn: &mut Connection,
    pipeline: &str,
    request: &str,
    requested_by: &str,
    now_ms: i64,
) -> Result<i64, StoreError> {
    conn.execute(
        "INSERT INTO sluice_pool_updates (pipeline, request, requested_by, requested_at, state)
         VALUES (?1, ?2, ?3, ?4, 'pending')",
        params![pipeline, request, requested_by, now_ms],
    )?;
    Ok(conn.last_insert_rowid())
}

/// Which update [`read`] reads.
pub(crate) enum Which {
    /// This one.
    Id(i64),
    /// The oldest unfinished.
    OldestOpen,
    /// The newest.
    Latest,
}

pub(crate) fn read(
    conn: &mut Connection,
    pipeline: &str,
    which: Which,
) -> Result<Option<PoolUpdate>, StoreError> {
    let (filter, order) = match which {
        Which::Id(_) => ("id = ?2", "id"),
        Which::OldestOpen => ("state IN ('pending', 'clearing') AND ?2 IS NULL", "id"),
        Which::Latest => ("?2 IS NULL", "id DESC"),
    };
    let id = match which {
        Which::Id(id) => Some(id),
        _ => None,
    };
    let row = conn
        .query_row(
            &format!(
                "SELECT id, request, requested_by, requested_at, state, clearer, claimed_at,
                     message
                 FROM sluice_pool_updates WHERE pipeline = ?1 AND {filter}
                 ORDER BY {order} LIMIT 1"
            ),
            params![pipeline, id],
            |row| {
                let state: String = row.get(4)?;
                let state = match state.as_str() {
                    "pending" => PoolUpdateState::Pending,
                    "clearing" => PoolUpdateState::Clearing {
                        by: row.get::<_, Option<String>>(5)?.unwrap_or_default(),
                        claimed_at_ms: row.get::<_, Option<i64>>(6)?.unwrap_or_default(),
                    },
                    "done" => PoolUpdateState::Done,
                    _ => PoolUpdateState::Failed,
                };
                Ok(PoolUpdate {
                    id: row.get(0)?,
                    pipeline: pipeline.to_owned(),
                    request: row.get(1)?,
                    requested_by: row.get(2)?,
                    requested_at_ms: row.get(3)?,
                    state,
                    message: row.get(7)?,
                    drained: Vec::new(),
                })
            },
        )
        .optional()?;
    let Some(mut update) = row else {
        return Ok(None);
    };
    let mut statement = conn.prepare_cached(
        "SELECT worker FROM sluice_pool_update_drains WHERE update_id = ?1 ORDER BY worker",
    )?;
    update.drained = statement
        .query_map(params![update.id], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(Some(update))
}

pub(crate) fn drained(conn: &mut Connection, id: i64, worker: &str) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO sluice_pool_update_drains (update_id, worker) VALUES (?1, ?2)
         ON CONFLICT DO NOTHING",
        params![id, worker],
    )?;
    Ok(())
}

pub(crate) fn claim(
    conn: &mut Connection,
    pipeline: &str,
    id: i64,
    worker: &str,
    stale_after: Duration,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let stale = now_ms.saturating_sub(i64::try_from(stale_after.as_millis()).unwrap_or(i64::MAX));
    let changed = conn.execute(
        "UPDATE sluice_pool_updates SET state = 'clearing', clearer = ?3, claimed_at = ?4
         WHERE pipeline = ?1 AND id = ?2
           AND (state = 'pending'
                OR (state = 'clearing' AND (clearer = ?3 OR claimed_at < ?5)))",
        params![pipeline, id, worker, now_ms, stale],
    )?;
    Ok(changed == 1)
}

pub(crate) fn finish(
    conn: &mut Connection,
    pipeline: &str,
    id: i64,
    clearer: &str,
    done: bool,
    message: &str,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let changed = conn.execute(
        "UPDATE sluice_pool_updates SET state = ?3, message = ?4, finished_at = ?5
         WHERE pipeline = ?1 AND id = ?2 AND state = 'clearing' AND clearer = ?6",
        params![
            pipeline,
            id,
            if done { "done" } else { "failed" },
            message,
            now_ms,
            clearer
        ],
    )?;
    Ok(changed == 1)
}

#[async_trait]
impl PoolUpdateStore for SqliteStore {
    async fn request_pool_update(
        &self,
        pipeline: &str,
        request: &str,
        requested_by: &str,
    ) -> Result<i64, StoreError> {
        let (pipeline, request, by) = (
            pipeline.to_owned(),
            request.to_owned(),
            requested_by.to_owned(),
        );
        self.call(move |conn| self::request(conn, &pipeline, &request, &by, now_ms()))
            .await
    }

    async fn pool_update(
        &self,
        pipeline: &str,
        id: Option<i64>,
    ) -> Result<Option<PoolUpdate>, StoreError> {
        let pipeline = pipeline.to_owned();
        let which = id.map_or(Which::OldestOpen, Which::Id);
        self.call(move |conn| read(conn, &pipeline, which)).await
    }

    async fn latest_pool_update(&self, pipeline: &str) -> Result<Option<PoolUpdate>, StoreError> {
        let pipeline = pipeline.to_owned();
        self.call(move |conn| read(conn, &pipeline, Which::Latest))
            .await
    }

    async fn drained_for_pool_update(
        &self,
        _pipeline: &str,
        id: i64,
        worker: &str,
    ) -> Result<(), StoreError> {
        let worker = worker.to_owned();
        self.call(move |conn| drained(conn, id, &worker)).await
    }

    async fn claim_pool_update(
        &self,
        pipeline: &str,
        id: i64,
        worker: &str,
        stale_after: Duration,
    ) -> Result<bool, StoreError> {
        let (pipeline, worker) = (pipeline.to_owned(), worker.to_owned());
        self.call(move |conn| claim(conn, &pipeline, id, &worker, stale_after, now_ms()))
            .await
    }

    async fn finish_pool_update(
        &self,
        pipeline: &str,
        id: i64,
        clearer: &str,
        done: bool,
        message: &str,
    ) -> Result<bool, StoreError> {
        let (pipeline, clearer, message) =
            (pipeline.to_owned(), clearer.to_owned(), message.to_owned());
        self.call(move |conn| finish(conn, &pipeline, id, &clearer, done, &message, now_ms()))
            .await
    }
}
