//! A triggered pipeline's runs on SQLite; the semantics are those of [`crate::runs`], with the
//! host's clock, read once the write lock is held: a begin that waited for it while another
//! process ended a run is recorded after that end.

use super::{SqliteStore, now_ms};
use crate::runs::{Begin, once_per_interval, rows_from_json, rows_to_json};
use crate::{RunEnd, RunRecord, RunStart, RunState, RunStore, RunTrigger, StoreError};
use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, params};

const COLUMNS: &str = "run_id, fire_ms, interval_start, interval_end, trigger, state, worker, \
                       started_at, ended_at, rows, error";

pub(crate) fn begin_run(conn: &mut Connection, run: &RunStart) -> Result<RunRecord, StoreError> {
    // A fire is recorded once (`fire_key`, unique per pipeline; NULL for other runs).
    let fire_key = run.trigger.is_fire().then_some(run.fire_ms);
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let now_ms = now_ms();
    let alive_since = now_ms - i64::try_from(run.alive_within.as_millis()).unwrap_or(i64::MAX);
    let mine = match (run.queued_as, fire_key) {
        (Some(id), _) => tx
            .query_row(
                &format!("SELECT {COLUMNS} FROM sluice_runs WHERE run_id = ?1"),
                params![id],
                record,
            )
            .optional()?,
        (None, Some(fire)) => tx
            .query_row(
                &format!("SELECT {COLUMNS} FROM sluice_runs WHERE pipeline = ?1 AND fire_key = ?2"),
                params![run.pipeline, fire],
                record,
            )
            .optional()?,
        (None, None) => None,
    };
    let mine_id = mine.as_ref().map(|m| m.run_id);
    // Another live worker's run going on (not this fire's), or queued before this one.
    let held_back: bool = tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM sluice_runs r
            WHERE r.pipeline = ?1 AND r.worker <> ?2 AND r.run_id IS NOT ?5
              AND ((r.state = 'running' AND COALESCE(r.fire_key <> ?3, 1))
                   OR (r.state = 'queued' AND r.run_id < COALESCE(?5, 9223372036854775807)))
              AND EXISTS (SELECT 1 FROM sluice_workers w WHERE w.pipeline = r.pipeline
                          AND w.worker = r.worker AND w.last_beat >= ?4))",
        params![run.pipeline, run.worker, fire_key, alive_since, mine_id],
        |row| row.get(0),
    )?;
    // Another run completed this run's interval, or (a timetable without intervals) this
    // fire (the partial indexes answer).
    // (One query each, so that each uses its index.)
    let interval_done = once_per_interval(run.trigger)
        && match run.interval {
            Some((start, end)) => tx.query_row(
                "SELECT EXISTS (SELECT 1 FROM sluice_runs
                    WHERE pipeline = ?1 AND interval_start = ?2 AND interval_end = ?3
                      AND state = 'completed' AND run_id IS NOT ?4)",
                params![run.pipeline, start, end, mine_id],
                |row| row.get(0),
            )?,
            None => tx.query_row(
                "SELECT EXISTS (SELECT 1 FROM sluice_runs
                    WHERE pipeline = ?1 AND fire_ms = ?2 AND state = 'completed'
                      AND run_id IS NOT ?3 AND interval_start IS NULL
                      AND trigger IN ('schedule', 'catchup', 'backfill'))",
                params![run.pipeline, run.fire_ms, mine_id],
                |row| row.get(0),
            )?,
        };
    let decision = Begin::decide(mine.as_ref().map(|m| m.state), held_back, interval_done);
    let record = match decision {
        Begin::Ended => return mine.ok_or(StoreError::Config("no run to return".into())),
        Begin::Done if mine_id.is_some() => tx.query_row(
            &format!(
                "UPDATE sluice_runs SET worker = ?2, state = 'completed', ended_at = ?3
                 WHERE run_id = ?1 RETURNING {COLUMNS}"
            ),
            params![mine_id, run.worker, now_ms],
            record,
        )?,
        Begin::Insert(_) | Begin::Done => tx.query_row(
            &format!(
                "INSERT INTO sluice_runs (pipeline, fire_key, fire_ms, interval_start, interval_end,
                                          trigger, state, worker, started_at, rows, ended_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?9, ?7, ?8, '{{}}', ?10)
                 RETURNING {COLUMNS}"
            ),
            params![
                run.pipeline,
                fire_key,
                run.fire_ms,
                run.interval.map(|i| i.0),
                run.interval.map(|i| i.1),
                run.trigger.name(),
                run.worker,
                now_ms,
                match decision {
                    Begin::Insert(state) => state.name(),
                    _ => RunState::Completed.name(),
                },
                matches!(decision, Begin::Done).then_some(now_ms),
            ],
            record,
        )?,
        Begin::Take(state) => tx.query_row(
            &format!(
                "UPDATE sluice_runs SET worker = ?2, state = ?3,
                     started_at = CASE WHEN state = 'queued' AND ?3 = 'running'
                                       THEN ?4 ELSE started_at END
                 WHERE run_id = ?1 RETURNING {COLUMNS}"
            ),
            params![mine_id, run.worker, state.name(), now_ms],
            record,
        )?,
    };
    tx.commit()?;
    Ok(record)
}

pub(crate) fn end_run(
    conn: &mut Connection,
    run_id: i64,
    worker: &str,
    end: &RunEnd,
) -> Result<bool, StoreError> {
    let ended = conn.execute(
        "UPDATE sluice_runs SET state = ?2, ended_at = ?3, rows = ?4, error = ?5
         WHERE run_id = ?1 AND state IN ('running', 'queued') AND worker = ?6",
        params![
            run_id,
            end.state.name(),
            now_ms(),
            rows_to_json(&end.rows),
            end.error,
            worker,
        ],
    )?;
    Ok(ended == 1)
}

pub(crate) fn runs(
    conn: &mut Connection,
    pipeline: &str,
    limit: usize,
) -> Result<Vec<RunRecord>, StoreError> {
    let mut statement = conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM sluice_runs WHERE pipeline = ?1 ORDER BY run_id DESC LIMIT ?2"
    ))?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = statement.query_map(params![pipeline, limit], record)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub(crate) fn last_fire(conn: &mut Connection, pipeline: &str) -> Result<Option<i64>, StoreError> {
    Ok(conn
        .query_row(
            "SELECT MAX(fire_key) FROM sluice_runs WHERE pipeline = ?1",
            params![pipeline],
            |row| row.get::<_, Option<i64>>(0),
        )
        .optional()?
        .flatten())
}

fn record(row: &Row<'_>) -> rusqlite::Result<RunRecord> {
    let interval = match (row.get::<_, Option<i64>>(2)?, row.get::<_, Option<i64>>(3)?) {
        (Some(start), Some(end)) => Some((start, end)),
        _ => None,
    };
    let trigger: String = row.get(4)?;
    let state: String = row.get(5)?;
    let unknown = |what: &str, name: String| {
        rusqlite::Error::FromSqlConversionFailure(
            0,
            rusqlite::types::Type::Text,
            format!("unknown run {what} {name:?}").into(),
        )
    };
    Ok(RunRecord {
        run_id: row.get(0)?,
        fire_ms: row.get(1)?,
        interval,
        trigger: RunTrigger::from_name(&trigger).ok_or_else(|| unknown("trigger", trigger))?,
        state: RunState::from_name(&state).ok_or_else(|| unknown("state", state))?,
        worker: row.get(6)?,
        started_at_ms: row.get(7)?,
        ended_at_ms: row.get(8)?,
        rows: rows_from_json(&row.get::<_, String>(9)?),
        error: row.get(10)?,
    })
}

#[async_trait]
impl RunStore for SqliteStore {
    async fn begin_run(&self, run: &RunStart) -> Result<RunRecord, StoreError> {
        let run = run.clone();
        self.call(move |conn| self::begin_run(conn, &run)).await
    }

    async fn end_run(&self, run_id: i64, worker: &str, end: &RunEnd) -> Result<bool, StoreError> {
        let (worker, end) = (worker.to_owned(), end.clone());
        self.call(move |conn| self::end_run(conn, run_id, &worker, &end))
            .await
    }

    async fn runs(&self, pipeline: &str, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        let pipeline = pipeline.to_owned();
        self.call(move |conn| self::runs(conn, &pipeline, limit))
            .await
    }

    async fn last_fire(&self, pipeline: &str) -> Result<Option<i64>, StoreError> {
        let pipeline = pipeline.to_owned();
        self.call(move |conn| self::last_fire(conn, &pipeline))
            .await
    }
}
