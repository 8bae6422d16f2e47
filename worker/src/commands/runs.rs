//! `sluice runs -c FILE`: the history of a triggered pipeline's runs from the store (fire,
//! interval, trigger, state, rows per flow, duration), newest first; and the last and next run
//! that `sluice status` shows.

use super::text::{rfc3339, table};
use clap::ValueEnum;
use sluice_pipeline::Pipeline;
use sluice_pipeline::timetable::{NextRun, Timetable};
use sluice_store::{RunRecord, RunState, Store, StoreError};
use std::path::Path;
use std::process::ExitCode;

/// Output format of `runs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RunsFormat {
    /// A table.
    Text,
    /// A JSON document.
    Json,
}

/// `sluice runs`.
pub async fn runs(config: &Path, format: RunsFormat, limit: usize) -> ExitCode {
    let pipeline = match super::load_or_exit(config) {
        Ok(pipeline) => pipeline,
        Err(exit) => return exit,
    };
    let history = async {
        // Reads a store, never creates one.
        let store = sluice_store::open_existing(&pipeline.store).await?;
        store.runs(&pipeline.name, limit).await
    };
    match history.await {
        Ok(runs) => {
            match format {
                RunsFormat::Json => println!("{}", runs_json(&pipeline.name, &runs)),
                RunsFormat::Text => print!("{}", runs_text(&pipeline.name, &runs)),
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("sluice runs: {error}");
            ExitCode::from(1)
        }
    }
}

fn runs_text(pipeline: &str, runs: &[RunRecord]) -> String {
    if runs.is_empty() {
        return format!("pipeline {pipeline}: no runs recorded\n");
    }
    let headers = [
        "RUN", "FIRE", "INTERVAL", "TRIGGER", "STATE", "ROWS", "DURATION", "WORKER",
    ];
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                r.run_id.to_string(),
                rfc3339(r.fire_ms),
                r.interval.map_or_else(
                    || "-".to_owned(),
                    |(start, end)| format!("[{}, {})", rfc3339(start), rfc3339(end)),
                ),
                r.trigger.name().to_owned(),
                r.state.name().to_owned(),
                rows_text(r),
                r.ended_at_ms.map_or_else(
                    || "-".to_owned(),
                    |end| format!("{:.1}s", (end - r.started_at_ms).max(0) as f64 / 1000.0),
                ),
                r.worker.clone(),
            ]
        })
        .collect();
    let mut out = format!(
        "pipeline {pipeline}: {} run(s), newest first\n\n",
        runs.len()
    );
    out.push_str(&table(&headers, &rows));
    for run in runs.iter().filter(|r| r.error.is_some()) {
        out.push_str(&format!(
            "run {}: {}\n",
            run.run_id,
            run.error.as_deref().unwrap_or_default()
        ));
    }
    out
}

fn rows_text(run: &RunRecord) -> String {
    if run.rows.is_empty() {
        return "-".to_owned();
    }
    run.rows
        .iter()
        .map(|(flow, rows)| format!("{flow}={rows}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn runs_json(pipeline: &str, runs: &[RunRecord]) -> serde_json::Value {
    serde_json::json!({
        "pipeline": pipeline,
        "runs": runs.iter().map(run_json).collect::<Vec<_>>(),
    })
}

fn run_json(r: &RunRecord) -> serde_json::Value {
    serde_json::json!({
        "run_id": r.run_id,
        "fire_ms": r.fire_ms,
        "interval_start_ms": r.interval.map(|i| i.0),
        "interval_end_ms": r.interval.map(|i| i.1),
        "trigger": r.trigger.name(),
        "state": r.state.name(),
        "worker": r.worker,
        "started_at_ms": r.started_at_ms,
        "ended_at_ms": r.ended_at_ms,
        "duration_seconds": r.ended_at_ms.map(|end| (end - r.started_at_ms).max(0) as f64 / 1000.0),
        "rows": r.rows.iter().map(|(flow, rows)| (flow.clone(), serde_json::Value::from(*rows)))
            .collect::<serde_json::Map<_, _>>(),
        "error": r.error,
    })
}

/// The last run and the next one of a triggered pipeline, for `sluice status`: text lines and
/// JSON (`None` for a continuous pipeline).
pub async fn summary(
    pipeline: &Pipeline,
    store: &dyn Store,
) -> Result<Option<(String, serde_json::Value)>, StoreError> {
    if pipeline.mode != sluice_pipeline::Mode::Triggered {
        return Ok(None);
    }
    let last = store.runs(&pipeline.name, 1).await?.into_iter().next();
    let next = match &pipeline.schedule {
        None => "when `sluice run` starts (no schedule)".to_owned(),
        Some(_) if last.as_ref().is_some_and(|r| r.state == RunState::Running) => {
            "after the running one".to_owned()
        }
        Some(schedule) => match Timetable::new(schedule) {
            Err(error) => error,
            Ok(timetable) => {
                let last_fire = store.last_fire(&pipeline.name).await?;
                let now = sluice_engine::now_ms();
                // Served since the oldest worker alive started (none: as if one started now).
                let up_since = store
                    .workers(&pipeline.name, crate::runtime::pool::timing::ALIVE_WITHIN)
                    .await?
                    .iter()
                    .map(|w| w.started_at_ms)
                    .min()
                    .unwrap_or(now);
                match timetable.next_run(last_fire, now, up_since) {
                    NextRun::Now(fire) => format!("now (fire {})", rfc3339(fire.at_ms)),
                    NextRun::At(at) => rfc3339(at),
                    NextRun::Never => "never (the schedule fires no more)".to_owned(),
                }
            }
        },
    };
    let last_text = last.as_ref().map_or_else(
        || "none".to_owned(),
        |r| {
            format!(
                "run {} ({}, fire {}) {}, rows {}",
                r.run_id,
                r.trigger.name(),
                rfc3339(r.fire_ms),
                r.state.name(),
                rows_text(r)
            )
        },
    );
    let text = format!("last run: {last_text}\nnext run: {next}\n");
    let json = serde_json::json!({
        "last_run": last.as_ref().map(run_json),
        "next_run": next,
    });
    Ok(Some((text, json)))
}
