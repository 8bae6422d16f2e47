//! `sluice status -c FILE`: what the store says about a pipeline: each flow's committed counts
//! and completion, the workers alive and who holds each lease. Read from the store, so it works
//! whether or not a worker runs (the control API, which will add live states, is not built yet).

use crate::cli::OutputFormat;
use crate::flows;
use crate::membership::{BEAT_INTERVAL, LEASE_TTL};
use sluice_store::Layout;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// Workers heard of within this long count as alive: three missed beats.
const ALIVE_WITHIN: Duration = Duration::from_secs(BEAT_INTERVAL.as_secs() * 3);

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
}

/// `sluice status`.
pub async fn status(config: &Path, format: OutputFormat) -> ExitCode {
    let pipeline = match sluice_pipeline::load(config) {
        Ok(pipeline) => pipeline,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::from(2);
        }
    };
    match gather(&pipeline).await {
        Ok(report) => {
            match format {
                OutputFormat::Json => println!("{}", report.json),
                OutputFormat::Text => print!("{}", report.text),
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("sluice status: {error}");
            ExitCode::from(1)
        }
    }
}

struct Report {
    text: String,
    json: serde_json::Value,
}

async fn gather(pipeline: &sluice_pipeline::Pipeline) -> Result<Report, sluice_store::StoreError> {
    let store = sluice_store::open(&pipeline.store)?;
    // Idempotent: creates nothing that a run would not create.
    let handles = store
        .prepare(&Layout {
            pipeline: pipeline.name.clone(),
            tables: flows::table_targets(pipeline),
            flows: pipeline.flows.iter().map(|f| f.name.clone()).collect(),
        })
        .await?;
    let completions: std::collections::HashMap<String, i64> = store
        .completions(&pipeline.name)
        .await?
        .into_iter()
        .collect();
    let mut lines = Vec::new();
    for (flow, handle) in pipeline.flows.iter().zip(&handles) {
        let progress = store.flow_progress(handle).await?;
        let completed_at_ms = completions.get(&flow.name).copied();
        lines.push(FlowLine {
            flow: flow.name.clone(),
            once: flow.once,
            state: match (flow.once, completed_at_ms) {
                (true, Some(_)) => "COMPLETED",
                (true, None) => "NOT COMPLETED",
                (false, _) => "LIVE",
            },
            rows: progress.committed,
            duplicates: progress.duplicates,
            dead_letters: progress.dead_lettered,
            commits: progress.batches,
            completed_at_ms,
        });
    }
    let workers = store.workers(&pipeline.name, ALIVE_WITHIN).await?;
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
        "COMPLETED AT",
    ];
    let rows: Vec<[String; 7]> = lines
        .iter()
        .map(|l| {
            [
                l.flow.clone(),
                l.state.to_owned(),
                l.rows.to_string(),
                l.duplicates.to_string(),
                l.dead_letters.to_string(),
                l.commits.to_string(),
                l.completed_at_ms
                    .map(rfc3339)
                    .unwrap_or_else(|| "-".to_owned()),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..headers.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].len())
                .chain([headers[i].len()])
                .max()
                .unwrap_or_default()
        })
        .collect();
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    out.push_str(&line(&headers.map(str::to_owned)));
    for row in &rows {
        out.push_str(&line(row));
    }
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
        out.push_str(&format!(
            "lease {}: {} until {} (renewed every {}s, lasts {}s)\n",
            lease.role,
            lease.holder,
            rfc3339(lease.expires_at_ms),
            BEAT_INTERVAL.as_secs(),
            LEASE_TTL.as_secs()
        ));
    }
    out
}

fn rfc3339(ms: i64) -> String {
    let time = std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or_default());
    humantime::format_rfc3339_seconds(time).to_string()
}
