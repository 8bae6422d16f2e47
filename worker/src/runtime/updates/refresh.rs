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
//! * `--seek TIME` is refused unless the subscription retains acked messages for long enough
//!   to replay everything since TIME, and so does the flow's tracking subscription (if it
//!   exists), which is seeked to TIME first so the replay is tracked; the seeks happen after
//!   the store reset, so a replayed message never meets a stale ledger or an old row. The
//!   reset of a flow with a watermark also records each row it deletes as tracked and not
//!   settled, so the watermark holds at the replay however Pub/Sub orders it on the tracking
//!   subscription (`ResetRows::PublishedSince`).
//! * **Nothing dropped unasked.** A seek to TIME also marks every message published before
//!   TIME as acknowledged, those no worker ever ingested too, and Pub/Sub does not tell how
//!   old its backlog is (only Cloud Monitoring does), so sluice cannot know whether any would
//!   be dropped: a seek is refused unless `--drop-unread` says that is meant. A seek time in
//!   the future is refused outright: it would acknowledge whatever is published until then.
//! * **A clear made for a pool update stops when its claim is lost** (`Clearing::claim`):
//!   each reset checks the claim in its transaction, each seek and sink clear renews it first,
//!   so a clearer paused past its claim deletes and replays nothing once it wakes.

use crate::runtime::flow::sinks;
use crate::runtime::pool::timing::ALIVE_WITHIN;
use crate::runtime::updates::prepare;
use sluice_engine::pubsub::Admin;
use sluice_engine::{PubSubConfig, parse_event_time};
use sluice_pipeline::{Pipeline, Source};
use sluice_store::{ClearClaim, PoolUpdateStore, ResetRows, Store};
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

/// A `--seek` request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Seek {
    /// RFC 3339 or ms since epoch.
    pub time: String,
    /// The user accepts that messages published before the time and never ingested are
    /// dropped (`--drop-unread`).
    pub drop_unread: bool,
}

/// Resets every flow and, with `seek`, seeks every Pub/Sub flow's subscription, beside
/// `clearing`.
pub async fn full_refresh(
    pipeline: &Pipeline,
    seek: Option<&Seek>,
    clearing: Clearing<'_>,
) -> Result<String, RefreshError> {
    let seek_ms = seek.map(|s| seek_time(&s.time)).transpose()?;
    let drop_unread = seek.is_some_and(|s| s.drop_unread);
    let all: Vec<String> = pipeline.flows.iter().map(|f| f.name.clone()).collect();
    let seeks = seekable(pipeline, &all, seek_ms, drop_unread).await?;
    let store = refresh(pipeline, &all, seek_ms, clearing).await?.1;
    let mut done = format!(
        "full refresh of {}: {} flows cleared; the next run starts the chain from the beginning",
        pipeline.name,
        all.len()
    );
    for (subscription, ms) in seeks {
        clearing.confirm(&pipeline.name, &*store).await?;
        seek_subscription(pipeline, &subscription, ms).await?;
        done.push_str(&format!("; {subscription} seeked to {ms} ms"));
    }
    Ok(done)
}

/// Checks a full refresh's seek without doing anything: every Pub/Sub flow's subscription can
/// replay from its time.
pub async fn full_refresh_seeks(pipeline: &Pipeline, seek: &Seek) -> Result<(), RefreshError> {
    let all: Vec<String> = pipeline.flows.iter().map(|f| f.name.clone()).collect();
    seekable(
        pipeline,
        &all,
        Some(seek_time(&seek.time)?),
        seek.drop_unread,
    )
    .await?;
    Ok(())
}

/// A seek's time in ms since epoch: an RFC 3339 time or ms, not in the future (a seek marks
/// everything published before its time as acknowledged, so a time ahead would also drop what
/// is published from now until then, and the reset would delete no row to replay).
fn seek_time(time: &str) -> Result<i64, RefreshError> {
    let ms = parse_event_time(time).ok_or_else(|| {
        RefreshError::Invalid(format!(
            "--seek {time:?}: not an RFC 3339 time or ms since epoch"
        ))
    })?;
    let now = sluice_engine::now_ms();
    if ms > now {
        return Err(RefreshError::Invalid(format!(
            "--seek {time:?} is {} s in the future: a seek acknowledges every message published \
             before its time, so every message published until then would be dropped unread; \
             seek to a time in the past",
            (ms - now).unsigned_abs().div_ceil(1_000)
        )));
    }
    Ok(ms)
}

fn admin_config(pipeline: &Pipeline) -> PubSubConfig {
    PubSubConfig {
        project: pipeline.pubsub.project.clone(),
        endpoint: pipeline.pubsub.endpoint.clone(),
    }
}

/// The subscriptions of the named Pub/Sub flows to seek to `seek_ms`, after checking that each
/// can replay everything published since then (it retains acked messages, for long enough):
/// their rows published since then are deleted, so what cannot be replayed would be lost; and
/// that the user accepted dropping what was published before and never ingested
/// (`drop_unread`).
async fn seekable(
    pipeline: &Pipeline,
    names: &[String],
    seek_ms: Option<i64>,
    drop_unread: bool,
) -> Result<Vec<(String, i64)>, RefreshError> {
    let Some(ms) = seek_ms else {
        return Ok(Vec::new());
    };
    let mut subscriptions = Vec::new();
    let mut trackings = Vec::new();
    for flow in pipeline.flows.iter().filter(|f| names.contains(&f.name)) {
        let Source::PubSub(settings) = &flow.source else {
            continue;
        };
        if sinks::sink_of(pipeline, flow).is_some() {
            return Err(RefreshError::Invalid(format!(
                "--seek: flow `{}` writes a sink, whose files mix records published before and \
                 after the seek time; they cannot be split, so a sink flow cannot be seeked",
                flow.name
            )));
        }
        subscriptions.push(settings.subscription.clone());
        if let Some((tracking, _)) =
            crate::runtime::flow::watermarks::tracking_subscription(settings)
        {
            trackings.push(tracking);
        }
    }
    if subscriptions.is_empty() {
        return Ok(Vec::new());
    }
    let unreachable = |e: sluice_engine::SourceError| {
        RefreshError::Failed(format!("cannot ask Pub/Sub about the subscriptions: {e}"))
    };
    let admin = Admin::connect(&admin_config(pipeline))
        .await
        .map_err(unreachable)?;
    for subscription in &subscriptions {
        let window = admin
            .replay_window(subscription)
            .await
            .map_err(unreachable)?;
        let Some(window) = window else {
            return Err(RefreshError::Invalid(format!(
                "--seek: subscription {subscription} does not retain acked messages, so a seek \
                 cannot replay what was acked and those rows would be lost; set \
                 retain_acked_messages on it, or reset without --seek (rows are then kept)"
            )));
        };
        let oldest = sluice_engine::now_ms()
            .saturating_sub(i64::try_from(window.as_millis()).unwrap_or(i64::MAX));
        if ms < oldest {
            return Err(RefreshError::Invalid(format!(
                "--seek {ms}: subscription {subscription} retains messages for {}s only; \
                 seek to {oldest} ms or later",
                window.as_secs()
            )));
        }
        if !drop_unread {
            return Err(RefreshError::Invalid(format!(
                "--seek {ms}: a seek marks every message published before that time as \
                 acknowledged, also any that no worker ingested yet, and Pub/Sub does not say \
                 whether subscription {subscription} holds such messages; add --drop-unread to \
                 seek anyway, or seek to an earlier time (rows published since then are \
                 replayed, once)"
            )));
        }
    }
    // A tracking subscription is seeked with its flow's (first), or the replay would not be
    // tracked: the watermark would pass the replayed rows and close their windows without them.
    let mut seeks = Vec::new();
    for tracking in trackings {
        if !admin
            .subscription_exists(&tracking)
            .await
            .map_err(unreachable)?
        {
            continue; // created later, at the base subscription's backlog
        }
        let window = admin.replay_window(&tracking).await.map_err(unreachable)?;
        let oldest = window.map(|w| {
            sluice_engine::now_ms().saturating_sub(i64::try_from(w.as_millis()).unwrap_or(i64::MAX))
        });
        if oldest.is_none_or(|oldest| ms < oldest) {
            return Err(RefreshError::Invalid(format!(
                "--seek {ms}: tracking subscription {tracking} cannot replay from then (it does \
                 not retain acked messages for long enough), so the replay would not be \
                 tracked and the watermark would pass its rows; set retain_acked_messages and \
                 a retention as long as its flow's subscription's on it (sluice creates `auto` \
                 ones so), or delete it to have it made again"
            )));
        }
        seeks.push((tracking, ms));
    }
    seeks.extend(subscriptions.into_iter().map(|s| (s, ms)));
    Ok(seeks)
}

/// Seeks one subscription (after the store was reset).
async fn seek_subscription(
    pipeline: &Pipeline,
    subscription: &str,
    ms: i64,
) -> Result<(), RefreshError> {
    let failed = |e: sluice_engine::SourceError| {
        RefreshError::Failed(format!(
            "the store was reset, but seeking {subscription} failed: {e}; run the command \
             again with --seek"
        ))
    };
    let admin = Admin::connect(&admin_config(pipeline))
        .await
        .map_err(failed)?;
    admin.seek_to_time(subscription, ms).await.map_err(failed)
}

/// Resets one flow and, with `seek`, seeks its subscription, beside `clearing`.
pub async fn reset(
    pipeline: &Pipeline,
    flow: &str,
    seek: Option<&Seek>,
    clearing: Clearing<'_>,
) -> Result<String, RefreshError> {
    let seeks = reset_seeks(pipeline, flow, seek).await?;
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
        seek_subscription(pipeline, &subscription, ms).await?;
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

/// Checks a reset of `flow` with `seek` without doing it: the flow exists, and the seek (if
/// any) is a time its subscription can replay from. Returns the subscription to seek.
pub async fn reset_seeks(
    pipeline: &Pipeline,
    flow: &str,
    seek: Option<&Seek>,
) -> Result<Vec<(String, i64)>, RefreshError> {
    let Some(declared) = pipeline.flows.iter().find(|f| f.name == flow) else {
        let names: Vec<&str> = pipeline.flows.iter().map(|f| f.name.as_str()).collect();
        return Err(RefreshError::Invalid(format!(
            "no flow named `{flow}` (declared: {})",
            names.join(", ")
        )));
    };
    let seek_ms = match seek {
        None => None,
        Some(seek) => {
            if !matches!(declared.source, Source::PubSub(_)) {
                return Err(RefreshError::Invalid(format!(
                    "--seek: flow `{flow}` reads no Pub/Sub subscription"
                )));
            }
            Some(seek_time(&seek.time)?)
        }
    };
    let drop_unread = seek.is_some_and(|s| s.drop_unread);
    seekable(pipeline, &[flow.to_owned()], seek_ms, drop_unread).await
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
