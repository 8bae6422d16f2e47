//! A triggered pipeline's runs on PostgreSQL; the semantics are those of [`crate::runs`], with
//! the database server's clock. Starts and ends are stamped with `clock_timestamp()`, not the
//! transaction's start (`now()`): a begin that waited for the run lock while another run ended
//! is then recorded after that end.

use super::{PostgresStore, ms};
use async_trait::async_trait;

use crate::runs::{Begin, once_per_interval, rows_from_json, rows_to_json};
use crate::{RunEnd, RunRecord, RunStart, RunState, RunStore, RunTrigger, StoreError};
use deadpool_postgres::Client;
use tokio_postgres::Row;

/// The advisory lock class under which one pipeline's run begins queue (with the pipeline's
/// name hashed as the second key).
const RUNS_LOCK: i32 = 0x736c_0003;

macro_rules! columns {
    () => {
        concat!(
            "run_id, fire_ms, interval_start, interval_end, trigger, state, worker, ",
            ms!("started_at"),
            ", ",
            ms!("ended_at"),
            ", rows, error"
        )
    };
}

pub(super) async fn begin_run(
    client: &mut Client,
    run: &RunStart,
) -> Result<RunRecord, StoreError> {
    // A fire is recorded once (`fire_key`, unique per pipeline; NULL for other runs).
    let fire_key = run.trigger.is_fire().then_some(run.fire_ms);
    let alive_ms = i64::try_from(run.alive_within.as_millis()).unwrap_or(i64::MAX);
    let tx = client.transaction().await?;
    // Begins of one pipeline's runs queue here, so two cannot both find the other absent.
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        &[&RUNS_LOCK, &run.pipeline],
    )
    .await?;
    let mine = match (run.queued_as, fire_key) {
        (Some(id), _) => {
            tx.query_opt(
                concat!("SELECT ", columns!(), " FROM sluice_runs WHERE run_id = $1"),
                &[&id],
            )
            .await?
        }
        (None, Some(fire)) => {
            tx.query_opt(
                concat!(
                    "SELECT ",
                    columns!(),
                    " FROM sluice_runs WHERE pipeline = $1 AND fire_key = $2"
                ),
                &[&run.pipeline, &fire],
            )
            .await?
        }
        (None, None) => None,
    }
    .map(|row| record(&row))
    .transpose()?;
    let mine_id = mine.as_ref().map(|m| m.run_id);
    // Another live worker's run going on (not this fire's), or queued before this one.
    let held_back = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM sluice_runs r
                WHERE r.pipeline = $1 AND r.worker <> $2 AND r.run_id IS DISTINCT FROM $5
                  AND ((r.state = 'running' AND COALESCE(r.fire_key <> $3, true))
                       OR (r.state = 'queued' AND r.run_id < COALESCE($5, 9223372036854775807)))
                  AND EXISTS (SELECT 1 FROM sluice_workers w WHERE w.pipeline = r.pipeline
                              AND w.worker = r.worker
                              AND w.last_beat > now() - make_interval(secs => $4::int8 / 1000.0)))",
            &[&run.pipeline, &run.worker, &fire_key, &alive_ms, &mine_id],
        )
        .await?
        .try_get::<_, bool>(0)?;
    // Another run completed this run's interval, or (a timetable without intervals) this
    // fire (the partial indexes answer).
    let done = match run.interval.filter(|_| once_per_interval(run.trigger)) {
        Some((start, end)) => Some(
            tx.query_one(
                "SELECT EXISTS (SELECT 1 FROM sluice_runs
                    WHERE pipeline = $1 AND interval_start = $2 AND interval_end = $3
                      AND state = 'completed' AND run_id IS DISTINCT FROM $4)",
                &[&run.pipeline, &start, &end, &mine_id],
            )
            .await?,
        ),
        None if once_per_interval(run.trigger) => Some(
            tx.query_one(
                "SELECT EXISTS (SELECT 1 FROM sluice_runs
                    WHERE pipeline = $1 AND fire_ms = $2 AND state = 'completed'
                      AND run_id IS DISTINCT FROM $3 AND interval_start IS NULL
                      AND trigger IN ('schedule', 'catchup', 'backfill'))",
                &[&run.pipeline, &run.fire_ms, &mine_id],
            )
            .await?,
        ),
        None => None,
    };
    let interval_done = match done {
        Some(row) => row.try_get::<_, bool>(0)?,
        None => false,
    };
    let decision = Begin::decide(mine.as_ref().map(|m| m.state), held_back, interval_done);
    let row = match decision {
        Begin::Ended => return mine.ok_or(StoreError::Config("no run to return".into())),
        Begin::Done if mine_id.is_some() => {
            tx.query_one(
                concat!(
                    "UPDATE sluice_runs SET worker = $2, state = 'completed',
                         ended_at = clock_timestamp()
                     WHERE run_id = $1 RETURNING ",
                    columns!()
                ),
                &[&mine_id, &run.worker],
            )
            .await?
        }
        Begin::Insert(_) | Begin::Done => {
            let (state, ended) = match decision {
                Begin::Insert(state) => (state, false),
                _ => (RunState::Completed, true),
            };
            tx.query_one(
                concat!(
                    "INSERT INTO sluice_runs (pipeline, fire_key, fire_ms, interval_start,
                                              interval_end, trigger, state, worker, rows,
                                              started_at, ended_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $8, $7, '{}', clock_timestamp(),
                             CASE WHEN $9 THEN clock_timestamp() END)
                     RETURNING ",
                    columns!()
                ),
                &[
                    &run.pipeline,
                    &fire_key,
                    &run.fire_ms,
                    &run.interval.map(|i| i.0),
                    &run.interval.map(|i| i.1),
                    &run.trigger.name(),
                    &run.worker,
                    &state.name(),
                    &ended,
                ],
            )
            .await?
        }
        Begin::Take(state) => {
            tx.query_one(
                concat!(
                    "UPDATE sluice_runs SET worker = $2, state = $3,
                         started_at = CASE WHEN state = 'queued' AND $3 = 'running'
                                           THEN clock_timestamp() ELSE started_at END
                     WHERE run_id = $1 RETURNING ",
                    columns!()
                ),
                &[&mine_id, &run.worker, &state.name()],
            )
            .await?
        }
    };
    tx.commit().await?;
    record(&row)
}

pub(super) async fn end_run(
    client: &Client,
    run_id: i64,
    worker: &str,
    end: &RunEnd,
) -> Result<bool, StoreError> {
    let ended = client
        .execute(
            "UPDATE sluice_runs SET state = $2, ended_at = clock_timestamp(), rows = $3, error = $4
             WHERE run_id = $1 AND state IN ('running', 'queued') AND worker = $5",
            &[
                &run_id,
                &end.state.name(),
                &rows_to_json(&end.rows),
                &end.error,
                &worker,
            ],
        )
        .await?;
    Ok(ended == 1)
}

pub(super) async fn runs(
    client: &Client,
    pipeline: &str,
    limit: usize,
) -> Result<Vec<RunRecord>, StoreError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = client
        .query(
            concat!(
                "SELECT ",
                columns!(),
                " FROM sluice_runs WHERE pipeline = $1 ORDER BY run_id DESC LIMIT $2"
            ),
            &[&pipeline, &limit],
        )
        .await?;
    rows.iter().map(record).collect()
}

pub(super) async fn last_fire(client: &Client, pipeline: &str) -> Result<Option<i64>, StoreError> {
    Ok(client
        .query_one(
            "SELECT MAX(fire_key) FROM sluice_runs WHERE pipeline = $1",
            &[&pipeline],
        )
        .await?
        .try_get(0)?)
}

fn record(row: &Row) -> Result<RunRecord, StoreError> {
    let interval = match (
        row.try_get::<_, Option<i64>>(2)?,
        row.try_get::<_, Option<i64>>(3)?,
    ) {
        (Some(start), Some(end)) => Some((start, end)),
        _ => None,
    };
    let trigger: String = row.try_get(4)?;
    let state: String = row.try_get(5)?;
    let unknown = |what: &str, name: &str| {
        StoreError::Rejected(format!("sluice_runs: unknown run {what} {name:?}"))
    };
    Ok(RunRecord {
        run_id: row.try_get(0)?,
        fire_ms: row.try_get(1)?,
        interval,
        trigger: RunTrigger::from_name(&trigger).ok_or_else(|| unknown("trigger", &trigger))?,
        state: RunState::from_name(&state).ok_or_else(|| unknown("state", &state))?,
        worker: row.try_get(6)?,
        started_at_ms: row.try_get(7)?,
        ended_at_ms: row.try_get(8)?,
        rows: rows_from_json(&row.try_get::<_, String>(9)?),
        error: row.try_get(10)?,
    })
}

#[async_trait]
impl RunStore for PostgresStore {
    async fn begin_run(&self, run: &RunStart) -> Result<RunRecord, StoreError> {
        let (mut client, _) = self.ready().await?;
        self::begin_run(&mut client, run).await
    }

    async fn end_run(&self, run_id: i64, worker: &str, end: &RunEnd) -> Result<bool, StoreError> {
        let (client, _) = self.ready().await?;
        self::end_run(&client, run_id, worker, end).await
    }

    async fn runs(&self, pipeline: &str, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        let (client, _) = self.ready().await?;
        self::runs(&client, pipeline, limit).await
    }

    async fn last_fire(&self, pipeline: &str) -> Result<Option<i64>, StoreError> {
        let (client, _) = self.ready().await?;
        self::last_fire(&client, pipeline).await
    }
}
