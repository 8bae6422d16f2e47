//! A triggered pipeline's runs on PostgreSQL; the semantics are those of [`crate::runs`], with
//! the database server's clock.

use super::ms;
use crate::runs::{rows_from_json, rows_to_json};
use crate::{RunEnd, RunRecord, RunStart, RunState, RunTrigger, StoreError};
use deadpool_postgres::Client;
use tokio_postgres::Row;

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

pub(super) async fn begin_run(client: &Client, run: &RunStart) -> Result<RunRecord, StoreError> {
    // A fire is recorded once (`fire_key`, unique per pipeline; NULL for other runs): a run of
    // it not ended is handed to the asker, an ended one left as it is.
    let fire_key = run.trigger.is_fire().then_some(run.fire_ms);
    let row = client
        .query_one(
            concat!(
                "INSERT INTO sluice_runs (pipeline, fire_key, fire_ms, interval_start,
                                          interval_end, trigger, state, worker, rows)
                 VALUES ($1, $2, $3, $4, $5, $6, 'running', $7, '{}')
                 ON CONFLICT (pipeline, fire_key) DO UPDATE SET
                     worker = CASE WHEN sluice_runs.state = 'running'
                         THEN excluded.worker ELSE sluice_runs.worker END
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
            ],
        )
        .await?;
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
            "UPDATE sluice_runs SET state = $2, ended_at = now(), rows = $3, error = $4
             WHERE run_id = $1 AND state = 'running' AND worker = $5",
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
