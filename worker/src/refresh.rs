//! `sluice full-refresh`, `sluice reset FLOW [--seek TIME]` and `run --full-refresh /
//! --refresh FLOW,...`: forgetting what flows have done, so that they run again from nothing.
//!
//! # Guarantees
//!
//! * **Each record once after a refresh.** Resetting a flow deletes, in one transaction, its
//!   ledger keys, counters, completion, dead letters and its rows in its target table; rows
//!   other flows wrote to the same table stay. A sink flow's files go too (after the store). Re-reading its source then writes each record
//!   once again.
//! * **Only what was asked.** `reset FLOW` touches that flow alone: upstream once flows stay
//!   drained (IDLE) and are not re-read. `full-refresh` resets every flow, so the next run
//!   starts the chain from the beginning, in `depends_on` order.
//! * **Never under a running worker.** A worker keeps recent keys in memory; resetting beneath
//!   it could let it drop a record the store no longer holds. These commands refuse while any
//!   worker of the pipeline has beaten within the last 15 s.
//! * `--seek TIME` repositions the flow's Pub/Sub subscription after the store is reset (so a
//!   replayed message never meets a stale ledger or an old row): messages published since
//!   TIME are delivered again (acked ones too, if the subscription retains acked messages).

use crate::flows;
use crate::membership::ALIVE_WITHIN;
use sluice_connector::pubsub::Admin;
use sluice_connector::{PubSubConfig, parse_event_time};
use sluice_pipeline::{Pipeline, Source};
use sluice_store::{Layout, Store};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

/// Why a refresh could not be done.
#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    /// Bad request: unknown flow, bad time, nothing to seek (exit 2).
    #[error("{0}")]
    Invalid(String),
    /// The store or Pub/Sub refused or was unreachable, or workers are running (exit 1).
    #[error("{0}")]
    Failed(String),
}

impl RefreshError {
    /// The exit code of SPEC §3.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            RefreshError::Invalid(_) => ExitCode::from(2),
            RefreshError::Failed(_) => ExitCode::from(1),
        }
    }
}

/// `sluice full-refresh -c FILE [--seek TIME]`.
pub async fn full_refresh_file(path: &Path, seek: Option<&str>) -> ExitCode {
    let pipeline = match sluice_pipeline::load(path) {
        Ok(pipeline) => pipeline,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::from(2);
        }
    };
    report(path, full_refresh(&pipeline, seek).await)
}

/// Resets every flow and, with `seek`, seeks every Pub/Sub flow's subscription.
pub async fn full_refresh(pipeline: &Pipeline, seek: Option<&str>) -> Result<String, RefreshError> {
    let seek_ms = seek.map(seek_time).transpose()?;
    let all: Vec<String> = pipeline.flows.iter().map(|f| f.name.clone()).collect();
    refresh(pipeline, &all).await?;
    let mut done = format!(
        "full refresh of {}: {} flows cleared (completion, ledger, rows, dead letters); \
         the next run starts the chain from the beginning",
        pipeline.name,
        all.len()
    );
    if let Some(ms) = seek_ms {
        for flow in &pipeline.flows {
            if let Source::PubSub(settings) = &flow.source {
                seek_subscription(pipeline, &settings.subscription, ms).await?;
                done.push_str(&format!("; {} seeked to {ms} ms", settings.subscription));
            }
        }
    }
    Ok(done)
}

fn seek_time(time: &str) -> Result<i64, RefreshError> {
    parse_event_time(time).ok_or_else(|| {
        RefreshError::Invalid(format!(
            "--seek {time:?}: not an RFC 3339 time or ms since epoch"
        ))
    })
}

/// Seeks one subscription (after the store was reset).
async fn seek_subscription(
    pipeline: &Pipeline,
    subscription: &str,
    ms: i64,
) -> Result<(), RefreshError> {
    let config = PubSubConfig {
        project: pipeline.pubsub.project.clone(),
        endpoint: pipeline.pubsub.endpoint.clone(),
    };
    let failed = |e: sluice_connector::pubsub::SourceError| {
        RefreshError::Failed(format!(
            "the store was reset, but seeking {subscription} failed: {e}; run the command \
             again with --seek"
        ))
    };
    let admin = Admin::connect(&config).await.map_err(failed)?;
    admin.seek_to_time(subscription, ms).await.map_err(failed)
}

/// `sluice reset FLOW -c FILE [--seek TIME]`.
pub async fn reset_file(path: &Path, flow: &str, seek: Option<&str>) -> ExitCode {
    let pipeline = match sluice_pipeline::load(path) {
        Ok(pipeline) => pipeline,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::from(2);
        }
    };
    report(path, reset(&pipeline, flow, seek).await)
}

fn report(path: &Path, result: Result<String, RefreshError>) -> ExitCode {
    match result {
        Ok(done) => {
            println!("{done}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{}: {error}", path.display());
            error.exit_code()
        }
    }
}

/// Resets one flow and, with `seek`, seeks its subscription.
pub async fn reset(
    pipeline: &Pipeline,
    flow: &str,
    seek: Option<&str>,
) -> Result<String, RefreshError> {
    let Some(declared) = pipeline.flows.iter().find(|f| f.name == flow) else {
        let names: Vec<&str> = pipeline.flows.iter().map(|f| f.name.as_str()).collect();
        return Err(RefreshError::Invalid(format!(
            "no flow named `{flow}` (declared: {})",
            names.join(", ")
        )));
    };
    let seek = match seek {
        None => None,
        Some(time) => {
            let Source::PubSub(settings) = &declared.source else {
                return Err(RefreshError::Invalid(format!(
                    "--seek: flow `{flow}` reads no Pub/Sub subscription"
                )));
            };
            Some((settings.subscription.clone(), seek_time(time)?))
        }
    };
    refresh(pipeline, &[flow.to_owned()]).await?;
    let mut done = format!("flow {flow} reset (ledger, counters, completion, rows, dead letters)");
    if let Some((subscription, ms)) = seek {
        seek_subscription(pipeline, &subscription, ms).await?;
        done.push_str(&format!("; {subscription} seeked to {ms} ms"));
    }
    Ok(done)
}

/// Resets the named flows (their store state) after checking no worker is running.
pub async fn refresh(pipeline: &Pipeline, names: &[String]) -> Result<(), RefreshError> {
    for name in names {
        if !pipeline.flows.iter().any(|f| &f.name == name) {
            return Err(RefreshError::Invalid(format!("no flow named `{name}`")));
        }
    }
    let failed = |e: sluice_store::StoreError| RefreshError::Failed(format!("store: {e}"));
    let store: Arc<dyn Store> = sluice_store::open(&pipeline.store).map_err(failed)?;
    let layout = Layout {
        pipeline: pipeline.name.clone(),
        tables: flows::table_targets(pipeline),
        flows: pipeline.flows.iter().map(|f| f.name.clone()).collect(),
    };
    let handles = store.prepare(&layout).await.map_err(failed)?;
    let running = store
        .workers(&pipeline.name, ALIVE_WITHIN)
        .await
        .map_err(failed)?;
    if !running.is_empty() {
        let names: Vec<&str> = running.iter().map(|w| w.worker.as_str()).collect();
        return Err(RefreshError::Failed(format!(
            "{} worker(s) of pipeline {} are running ({}); stop them first",
            running.len(),
            pipeline.name,
            names.join(", ")
        )));
    }
    for (flow, handle) in pipeline.flows.iter().zip(&handles) {
        if names.contains(&flow.name) {
            let table = flows::target_table(pipeline, flow);
            store
                .reset_flow(handle, table.as_deref())
                .await
                .map_err(failed)?;
            if let Some(sink) = flows::sink_of(pipeline, flow) {
                let removed = sink.clear().map_err(|e| {
                    RefreshError::Failed(format!(
                        "flow {} was reset, but its sink files in {} could not be removed: {e}",
                        flow.name,
                        sink.dir().display()
                    ))
                })?;
                tracing::info!(flow = %flow.name, removed, "sink files removed");
            }
            tracing::info!(flow = %flow.name, "flow reset");
        }
    }
    Ok(())
}
