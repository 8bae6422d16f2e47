//! Forgetting what flows have done, so that they run again from nothing: what `sluice
//! full-refresh`, `sluice reset FLOW [--seek TIME]`, `run --full-refresh / --refresh FLOW,...`
//! and the control API's updates do.
//!
//! # Guarantees
//!
//! * **Each record once after a refresh.** Resetting a flow deletes, in one transaction, its
//!   counters, completion and commit marks, the rows and dead letters its source will give
//!   again, and the ledger keys of exactly those: all of them for file and table flows (re-read
//!   in full); for a Pub/Sub flow, those published since `--seek TIME`, and none without a seek
//!   (acked messages do not come back). A key whose row is kept stays in the ledger, so a
//!   committed message whose ack was lost, or a publisher's later copy of a kept record, is
//!   still a duplicate when it comes. Rows other flows wrote to the same table stay. A sink
//!   flow's files go when all its rows go (a sink flow reading Pub/Sub cannot be seeked).
//! * **Only what was asked, and what reads it.** `reset FLOW` touches that flow, and, when the
//!   reset deletes rows that its source then writes again (a file or table flow, or a seek),
//!   the flows that read its table, directly or further down: their rows, ledgers and read
//!   positions go, so they read the table again from its start and hold each record once.
//!   Upstream once flows stay drained (IDLE) and are not re-read. `full-refresh` resets every
//!   flow, so the next run starts the chain from the beginning, in `depends_on` order.
//! * **Never under a running worker.** A worker keeps recent keys in memory; resetting beneath
//!   it could let it drop a record the store no longer holds. The clear refuses while any
//!   worker of the pipeline has beaten within the last 15 s, except those that stopped their
//!   flows for it (the asking worker, a pool update's replicas: `runtime/updates/pool.rs`).
//! * `--seek TIME` and what it may drop: `seek.rs`.
//! * **A clear made for a pool update stops when its claim is lost** (`Clearing::claim`):
//!   each reset checks the claim in its transaction, each seek and sink clear renews it first,
//!   so a clearer paused past its claim deletes and replays nothing once it wakes.

use crate::runtime::flow::sinks;
use crate::runtime::pool::timing::ALIVE_WITHIN;
use crate::runtime::updates::prepare;
use crate::runtime::updates::refresh_error::RefreshError;
use crate::runtime::updates::seek::{self, Seek};
use sluice_pipeline::{Pipeline, Source};
use sluice_store::{ClearClaim, PoolUpdateStore, ResetRows, Store};
use std::sync::Arc;

/// What a clear is made beside: the workers that stopped their flows for it, and the pool
/// update's claim it is made under.
#[derive(Debug, Clone, Copy, Default)]
pub struct Clearing<'a> {
    /// Workers that have stopped their flows for the clear (the one asking through its
    /// control API, the replicas of a pool update): their heartbeats are not "a worker
    /// running".
    pub stopped: &'a [String],
    /// The pool update's claim (`None`: no pool update). Every reset is made only while the
    /// claim holds (checked in its transaction), every seek and sink clear after renewing it,
    /// so a clearer that lost its claim (paused past it) deletes and replays nothing more.
    pub claim: Option<&'a UnderClaim>,
}

/// A pool update's claim, and how long before it goes stale.
#[derive(Debug, Clone)]
pub struct UnderClaim {
    /// The update and its clearer.
    pub claim: ClearClaim,
    /// A claim older than this may be taken over (`updates::pool::CLAIM_STALE_AFTER`).
    pub stale_after: std::time::Duration,
}

impl Clearing<'_> {
    /// Renews the claim, if there is one: an error if another process holds it now (or the
    /// update ended), before something that no transaction can fence (a seek, a file removal).
    async fn confirm(
        &self,
        pipeline: &str,
        store: &dyn PoolUpdateStore,
    ) -> Result<(), RefreshError> {
        let Some(under) = self.claim else {
            return Ok(());
        };
        let held = store
            .claim_pool_update(
                pipeline,
                under.claim.update,
                &under.claim.clearer,
                under.stale_after,
            )
            .await
            .map_err(|e| RefreshError::Failed(format!("store: {e}")))?;
        if held {
            Ok(())
        } else {
            Err(RefreshError::Failed(format!(
                "pool update {} is no longer being cleared by {}: stopped",
                under.claim.update, under.claim.clearer
            )))
        }
    }
}

/// Resets every flow and, with `seek`, seeks every Pub/Sub flow's subscription, beside
/// `clearing`.
pub async fn full_refresh(
    pipeline: &Pipeline,
    seek: Option<&Seek>,
    clearing: Clearing<'_>,
) -> Result<String, RefreshError> {
    let seek_ms = seek.map(|s| seek::seek_time(&s.time)).transpose()?;
    let drop_unread = seek.is_some_and(|s| s.drop_unread);
    let all: Vec<String> = pipeline.flows.iter().map(|f| f.name.clone()).collect();
    let seeks = seek::seekable(pipeline, &all, seek_ms, drop_unread).await?;
    let store = refresh(pipeline, &all, seek_ms, clearing).await?.1;
    let mut done = format!(
        "full refresh of {}: {} flows cleared; the next run starts the chain from the beginning",
        pipeline.name,
        all.len()
    );
    for (subscription, ms) in seeks {
        clearing.confirm(&pipeline.name, &*store).await?;
        seek::seek_subscription(pipeline, &subscription, ms).await?;
        done.push_str(&format!("; {subscription} seeked to {ms} ms"));
    }
    Ok(done)
}

/// Resets one flow and, with `seek`, seeks its subscription, beside `clearing`.
pub async fn reset(
    pipeline: &Pipeline,
    flow: &str,
    seek: Option<&Seek>,
    clearing: Clearing<'_>,
) -> Result<String, RefreshError> {
    let seeks = seek::reset_seeks(pipeline, flow, seek).await?;
    let seek_ms = seeks.first().map(|(_, ms)| *ms);
    let (downstream, store) = refresh(pipeline, &[flow.to_owned()], seek_ms, clearing).await?;
    let mut done = format!("flow {flow} reset");
    if !downstream.is_empty() {
        done.push_str(&format!(
            "; with the flows that read its table, which read it again from its start: {}",
            downstream.join(", ")
        ));
    }
    for (subscription, ms) in seeks {
        clearing.confirm(&pipeline.name, &*store).await?;
        seek::seek_subscription(pipeline, &subscription, ms).await?;
        done.push_str(&format!("; {subscription} seeked to {ms} ms"));
    }
    Ok(done)
}

/// The flows that read, directly or through other tables, the table `flow` writes, in file
/// order (validation rules out cycles).
pub fn downstream_of(pipeline: &Pipeline, flow: &str) -> Vec<String> {
    let mut tables: Vec<&str> = pipeline
        .flows
        .iter()
        .filter(|f| f.name == flow)
        .map(|f| f.target.as_str())
        .collect();
    let mut found: Vec<String> = Vec::new();
    while let Some(table) = tables.pop() {
        for reader in &pipeline.flows {
            let reads = matches!(&reader.source, Source::Table { target } if target == table);
            if reads && reader.name != flow && !found.contains(&reader.name) {
                found.push(reader.name.clone());
                tables.push(&reader.target);
            }
        }
    }
    pipeline
        .flows
        .iter()
        .filter(|f| found.contains(&f.name))
        .map(|f| f.name.clone())
        .collect()
}

/// What a reset of `flow` deletes: the rows its source gives again.
fn rows_reset(flow: &sluice_pipeline::Flow, seek_ms: Option<i64>) -> ResetRows {
    match (&flow.source, seek_ms) {
        (Source::PubSub(source), Some(ms)) => ResetRows::PublishedSince {
            since_ms: ms,
            hold_watermark: source.watermark.is_some(),
        },
        (Source::PubSub(_), None) => ResetRows::Keep,
        _ => ResetRows::All,
    }
}

/// Resets the named flows (their store state) after checking no worker is running (those of
/// `clearing.stopped`, which have stopped their flows for it, aside), each reset under
/// `clearing.claim` if there is one. Rows go where the source gives them again: all of a file
/// or table flow's; of a Pub/Sub flow, those published since `seek_ms` (none without a seek).
/// A named flow whose rows go takes the flows downstream of its table with it (their rows would
/// come again as new commits): returns those not named, and the store.
pub async fn refresh(
    pipeline: &Pipeline,
    names: &[String],
    seek_ms: Option<i64>,
    clearing: Clearing<'_>,
) -> Result<(Vec<String>, Arc<dyn Store>), RefreshError> {
    for name in names {
        if !pipeline.flows.iter().any(|f| &f.name == name) {
            return Err(RefreshError::Invalid(format!("no flow named `{name}`")));
        }
    }
    let mut downstream: Vec<String> = Vec::new();
    for flow in pipeline.flows.iter().filter(|f| names.contains(&f.name)) {
        if rows_reset(flow, seek_ms) != ResetRows::Keep {
            for reader in downstream_of(pipeline, &flow.name) {
                if !names.contains(&reader) && !downstream.contains(&reader) {
                    downstream.push(reader);
                }
            }
        }
    }
    let names: Vec<String> = names.iter().chain(&downstream).cloned().collect();
    let failed = |e: sluice_store::StoreError| RefreshError::Failed(format!("store: {e}"));
    let store: Arc<dyn Store> = sluice_store::open(&pipeline.store).map_err(failed)?;
    let handles = store
        .prepare(&prepare::layout(pipeline))
        .await
        .map_err(failed)?;
    let running: Vec<_> = store
        .workers(&pipeline.name, ALIVE_WITHIN)
        .await
        .map_err(failed)?
        .into_iter()
        .filter(|w| !clearing.stopped.contains(&w.worker))
        .collect();
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
            let table = prepare::target_table(pipeline, flow);
            let rows = rows_reset(flow, seek_ms);
            let claim = clearing.claim.map(|under| &under.claim);
            store
                .reset_flow(handle, table.as_deref(), rows, claim)
                .await
                .map_err(failed)?;
            if let Some(sink) = sinks::sink_of(pipeline, flow).filter(|_| rows == ResetRows::All) {
                clearing.confirm(&pipeline.name, &*store).await?;
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
    Ok((downstream, store))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::downstream_of;
    use std::path::Path;

    #[test]
    fn a_reset_reaches_every_flow_down_the_tables() {
        let file = "pipeline: p\nstore: sqlite://s.db\n\
            targets:\n  - { name: bronze, kind: table }\n  - { name: silver, kind: table }\n  - { name: gold, kind: table }\n  - { name: side, kind: table }\n\
            flows:\n  - { name: gold_up, target: gold, source: { table: silver } }\n  - { name: ingest, target: bronze, source: { pubsub: { subscription: s } } }\n  - { name: refine, target: silver, source: { table: bronze } }\n  - { name: other, target: side, source: { pubsub: { subscription: t } } }\n";
        let pipeline = sluice_pipeline::parse_for_run(file, Path::new("p.yaml")).unwrap();
        assert_eq!(downstream_of(&pipeline, "ingest"), ["gold_up", "refine"]);
        assert_eq!(downstream_of(&pipeline, "refine"), ["gold_up"]);
        assert!(downstream_of(&pipeline, "gold_up").is_empty());
        assert!(downstream_of(&pipeline, "other").is_empty());
    }
}
