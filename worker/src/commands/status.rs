//! `sluice status -c FILE`: what the store says about a pipeline: each flow's committed counts,
//! watermark and completion, how far a flow reading a table is behind it (rows and the age of
//! the oldest unread one), the workers alive and who holds each lease. Read from the store, so it works
//! whether or not a worker runs. When the file sets `control.listen` and a worker answers there,
//! its live view is shown instead (flow states, counters since it started, late rows, system
//! lag, watermark age, when each flow's run started). A triggered pipeline's last and next run
//! follow, from the store, and so do the dead letters waiting for `dead_letter.topic` and a
//! pool update in progress (what it asks, who asked,
//! which replicas have stopped their flows for it and which are still running), and each
//! expectation's passed and violated records.

use super::status_live::{Report, ask_worker};
use super::text::{rfc3339, table};
use crate::runtime::flow::build;
use crate::runtime::pool::timing::{ALIVE_WITHIN, BEAT_INTERVAL, LEASE_TTL};
use crate::runtime::updates::prepare;
use clap::ValueEnum;
use sluice_engine::{TRACKER_LEASE_TTL, TRACKER_TICK, TURN_TTL};
use sluice_store::Store;
use std::path::Path;
use std::process::ExitCode;

/// One flow's line.
#[derive(Debug, serde::Serialize)]
struct FlowLine {
    flow: String,
    once: bool,
    state: &'static str,
    rows: u64,
    duplicates: u64,
    dead_letters: u64,
    commits: u64,
    completed_at_ms: Option<i64>,
    watermark_ms: Option<i64>,
    watermark_age_seconds: Option<f64>,
    /// For a flow reading a table: committed rows of the table it has not committed yet.
    rows_behind: Option<u64>,
    /// ...and the age of the oldest of them (0 when none).
    feed_lag_seconds: Option<f64>,
}

/// Output format of `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusFormat {
    /// Tables.
    Text,
    /// A JSON document.
    Json,
}

/// `sluice status`.
pub async fn status(config: &Path, format: StatusFormat) -> ExitCode {
    let pipeline = match super::load_or_exit(config) {
        Ok(pipeline) => pipeline,
        Err(exit) => return exit,
    };
    let token = match super::control_token(&pipeline) {
        Ok(token) => token,
        Err(exit) => return exit,
    };
    // A running worker answers first; the store is read (never created) for the rest, or for
    // everything when no worker answers.
    let live = ask_worker(&pipeline, token).await;
    let store = match (sluice_store::open_existing(&pipeline.store).await, live) {
        (Ok(store), live) => (store, live),
        (Err(error), Some(live)) => {
            eprintln!("sluice status: the store cannot be read ({error}); the worker's view only");
            print_report(&live, format);
            return ExitCode::SUCCESS;
        }
        (Err(error), None) => {
            eprintln!("sluice status: {error}");
            return ExitCode::from(1);
        }
    };
    let (store, live) = store;
    let store = &*store;
    let mut report = match live {
        Some(live) => live,
        None => match gather(&pipeline, store).await {
            Ok(report) => report,
            Err(error) => {
                eprintln!("sluice status: {error}");
                return ExitCode::from(1);
            }
        },
    };
    match runs_summary(&pipeline, store).await {
        Ok(Some((text, json))) => {
            report.text.push('\n');
            report.text.push_str(&text);
            report.json["runs"] = json;
        }
        Ok(None) => {}
        Err(error) => {
            eprintln!("sluice status: runs: {error}");
            return ExitCode::from(1);
        }
    }
    match super::expectations::summary(&pipeline, store).await {
        Ok(Some((text, json))) => {
            report.text.push('\n');
            report.text.push_str(&text);
            report.json["expectations"] = json;
        }
        Ok(None) => {}
        Err(error) => eprintln!("sluice status: cannot read the expectation counts: {error}"),
    }
    match pool_update_summary(&pipeline, store).await {
        Ok(Some((text, json))) => {
            report.text.push('\n');
            report.text.push_str(&text);
            report.json["pool_update"] = json;
        }
        Ok(None) => {}
        // A store no worker of this version prepared yet has no pool updates to show.
        Err(error) => eprintln!("sluice status: cannot read pool updates: {error}"),
    }
    match dead_letter_topic_summary(&pipeline, store).await {
        Ok(Some((text, json))) => {
            report.text.push('\n');
            report.text.push_str(&text);
            report.json["dead_letter_topic"] = json;
        }
        Ok(None) => {}
        Err(error) => eprintln!("sluice status: cannot read the dead-letter outbox: {error}"),
    }
    print_report(&report, format);
    ExitCode::SUCCESS
}

fn print_report(report: &Report, format: StatusFormat) {
    match format {
        StatusFormat::Json => println!("{}", report.json),
        StatusFormat::Text => print!("{}", report.text),
    }
}

/// A triggered pipeline's last and next run, from the store.
async fn runs_summary(
    pipeline: &sluice_pipeline::Pipeline,
    store: &dyn Store,
) -> Result<Option<(String, serde_json::Value)>, sluice_store::StoreError> {
    if pipeline.mode != sluice_pipeline::Mode::Triggered {
        return Ok(None);
    }
    super::runs::summary(pipeline, store).await
}

/// With `dead_letter.topic`: the letters waiting to be published there and those refused.
async fn dead_letter_topic_summary(
    pipeline: &sluice_pipeline::Pipeline,
    store: &dyn Store,
) -> Result<Option<(String, serde_json::Value)>, sluice_store::StoreError> {
    let Some(topic) = &pipeline.dead_letter_topic else {
        return Ok(None);
    };
    let census = store.outbox_census(&pipeline.name).await?;
    let text = format!(
        "dead-letter topic {topic}: {} waiting to be published, {} refused (over Pub/Sub's \
         limits; in the dead-letter table)\n",
        census.waiting, census.refused
    );
    let json = serde_json::json!({
        "topic": topic,
        "waiting": census.waiting,
        "refused": census.refused,
    });
    Ok(Some((text, json)))
}

/// The pool update in progress, if any: text and JSON.
async fn pool_update_summary(
    pipeline: &sluice_pipeline::Pipeline,
    store: &dyn Store,
) -> Result<Option<(String, serde_json::Value)>, sluice_store::StoreError> {
    let Some(update) = store.pool_update(&pipeline.name, None).await? else {
        return Ok(None);
    };
    let running: Vec<String> = store
        .workers(&pipeline.name, ALIVE_WITHIN)
        .await?
        .into_iter()
        .map(|w| w.worker)
        .filter(|w| !update.drained.contains(w))
        .collect();
    let clearer = match &update.state {
        sluice_store::PoolUpdateState::Clearing { by, .. } => Some(by.clone()),
        _ => None,
    };
    let text = format!(
        "pool update {} in progress ({}): {}\n  asked by {} at {}\n  flows stopped: {}\n  \
         still running: {}{}\n",
        update.id,
        update.state.name(),
        update.request,
        update.requested_by,
        rfc3339(update.requested_at_ms),
        list(&update.drained),
        list(&running),
        clearer
            .as_ref()
            .map(|by| format!("\n  clearing: {by}"))
            .unwrap_or_default(),
    );
    let json = serde_json::json!({
        "id": update.id,
        "state": update.state.name(),
        "request": serde_json::from_str::<serde_json::Value>(&update.request)
            .unwrap_or(serde_json::Value::String(update.request.clone())),
        "requested_by": update.requested_by,
        "requested_at_ms": update.requested_at_ms,
        "stopped": update.drained,
        "running": running,
        "clearing": clearer,
    });
    Ok(Some((text, json)))
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

async fn gather(
    pipeline: &sluice_pipeline::Pipeline,
    store: &dyn Store,
) -> Result<Report, sluice_store::StoreError> {
    // Idempotent: creates nothing that a run would not create.
    let handles = store.prepare(&prepare::layout(pipeline)).await?;
    let completions: std::collections::HashMap<String, i64> = store
        .completions(&pipeline.name)
        .await?
        .into_iter()
        .collect();
    let watermarks: std::collections::HashMap<String, sluice_store::WatermarkRecord> = store
        .watermarks(&pipeline.name)
        .await?
        .into_iter()
        .collect();
    let now = sluice_engine::now_ms();
    let workers = store.workers(&pipeline.name, ALIVE_WITHIN).await?;
    let mut lines = Vec::new();
    for (flow, handle) in pipeline.flows.iter().zip(&handles) {
        let watermark_ms = watermarks.get(&flow.name).map(|w| w.watermark_ms);
        let progress = store.flow_progress(handle).await?;
        let completed_at_ms = completions.get(&flow.name).copied();
        // A window flow computes its windows from the table; it keeps no read position.
        let windows = pipeline.targets.iter().any(|t| {
            t.name == flow.target && matches!(t.kind, sluice_pipeline::TargetKind::Window { .. })
        });
        let feed = match build::read_table(pipeline, flow).filter(|_| !windows) {
            Some(table) => {
                let at = store.read_position(handle, &table).await?;
                Some(store.feed_lag(&table, &at).await?)
            }
            None => None,
        };
        lines.push(FlowLine {
            flow: flow.name.clone(),
            once: flow.once,
            state: match (flow.once, completed_at_ms) {
                (true, Some(_)) => "COMPLETED",
                (true, None) => "NOT COMPLETED",
                // Live only while a worker runs it.
                (false, _) if workers.is_empty() => "NOT RUNNING",
                (false, _) => "LIVE",
            },
            rows: progress.committed,
            duplicates: progress.duplicates,
            dead_letters: progress.dead_lettered,
            commits: progress.batches,
            completed_at_ms,
            watermark_ms,
            watermark_age_seconds: watermark_ms.map(|w| (now - w).max(0) as f64 / 1000.0),
            rows_behind: feed.map(|lag| lag.rows_behind),
            feed_lag_seconds: feed.map(|lag| {
                lag.oldest_unread_ms
                    .map_or(0.0, |oldest| (now - oldest).max(0) as f64 / 1000.0)
            }),
        });
    }
    let leases = store.leases(&pipeline.name).await?;
    let json = serde_json::json!({
        "pipeline": pipeline.name,
        "flows": lines,
        "workers": workers.iter().map(|w| serde_json::json!({
            "worker": w.worker, "host": w.host, "pid": w.pid,
            "started_at_ms": w.started_at_ms, "last_beat_ms": w.last_beat_ms,
        })).collect::<Vec<_>>(),
        "leases": leases.iter().map(|l| serde_json::json!({
            "role": l.role, "holder": l.holder, "expires_at_ms": l.expires_at_ms,
        })).collect::<Vec<_>>(),
    });
    Ok(Report {
        text: text(&pipeline.name, &lines, &workers, &leases),
        json,
    })
}

fn text(
    pipeline: &str,
    lines: &[FlowLine],
    workers: &[sluice_store::WorkerRecord],
    leases: &[sluice_store::LeaseRecord],
) -> String {
    let mut out = format!(
        "pipeline {pipeline}: {} worker(s) alive (heartbeat within {}s)\n\n",
        workers.len(),
        ALIVE_WITHIN.as_secs()
    );
    let headers = [
        "FLOW",
        "STATE",
        "ROWS",
        "DUPLICATES",
        "DEAD LETTERS",
        "COMMITS",
        "WATERMARK",
        "WATERMARK AGE",
        "BEHIND",
        "FEED LAG",
        "COMPLETED AT",
    ];
    let rows: Vec<Vec<String>> = lines
        .iter()
        .map(|l| {
            vec![
                l.flow.clone(),
                l.state.to_owned(),
                l.rows.to_string(),
                l.duplicates.to_string(),
                l.dead_letters.to_string(),
                l.commits.to_string(),
                l.watermark_ms
                    .map(rfc3339)
                    .unwrap_or_else(|| "-".to_owned()),
                l.watermark_age_seconds
                    .map(|age| format!("{age:.1}s"))
                    .unwrap_or_else(|| "-".to_owned()),
                l.rows_behind
                    .map(|rows| rows.to_string())
                    .unwrap_or_else(|| "-".to_owned()),
                l.feed_lag_seconds
                    .map(|age| format!("{age:.1}s"))
                    .unwrap_or_else(|| "-".to_owned()),
                l.completed_at_ms
                    .map(rfc3339)
                    .unwrap_or_else(|| "-".to_owned()),
            ]
        })
        .collect();
    out.push_str(&table(&headers, &rows));
    out.push_str(
        "(ROWS, DUPLICATES of both tiers, DEAD LETTERS and COMMITS: every worker's, since the \
         flow first ran or was last reset; a reset leaves the rows it keeps in the table)\n",
    );
    if !workers.is_empty() {
        out.push('\n');
        for worker in workers {
            out.push_str(&format!(
                "worker {} (host {}, pid {}), last heartbeat {}\n",
                worker.worker,
                worker.host,
                worker.pid,
                rfc3339(worker.last_beat_ms)
            ));
        }
    }
    for lease in leases {
        // The tracking reader renews its lease at every tracker tick, the others at every beat.
        let (renewed, lasts) = if lease.role.starts_with("watermark/") {
            (TRACKER_TICK, TRACKER_LEASE_TTL)
        } else if lease.role.starts_with("feed/") {
            (TURN_TTL / 4, TURN_TTL)
        } else {
            (BEAT_INTERVAL, LEASE_TTL)
        };
        out.push_str(&format!(
            "lease {}: {} until {} (renewed every {}s, lasts {}s)\n",
            lease.role,
            lease.holder,
            rfc3339(lease.expires_at_ms),
            renewed.as_secs_f64(),
            lasts.as_secs()
        ));
    }
    out
}
