//! The runs of a triggered pipeline: one run, then exit (no `schedule:`), or a run at each
//! fire of its schedule until a signal (`schedule:`, SPEC §7, with the timetable semantics of
//! `sluice_pipeline::timetable`). Every run is recorded in `sluice_runs` with what fired it,
//! its data interval, its state and the rows of each flow (`record.rs`).
//!
//! # Guarantees
//!
//! * **Runs never overlap.** A worker runs one update at a time. A fire that comes while a run
//!   goes on is delayed (`sluice_schedule_fires_delayed_total`): when the run ends, the latest
//!   such fire runs at once (at most one is pending), or with `catchup: true` every one of
//!   them, in order. A fire that came while no worker of the pipeline was alive was *missed*:
//!   skipped, or run as `catchup`/`semantics` say. The schedule counts as served since the
//!   oldest worker alive started (any of them takes the lease within its bound).
//! * **One replica runs each fire.** Only the holder of the pipeline's `scheduler` lease
//!   (`lease.rs`) runs fires, and a fire is recorded once
//!   ([`sluice_store::RunStore::begin_run`]): a replica that takes the lease over from one that
//!   died mid-run finishes that same run (same id, same interval) before anything else, and
//!   never starts an ended fire again. A holder that loses its lease (paused past it) drains
//!   its run and leaves it to the new holder (the two may overlap for a moment, which the
//!   dedup ledger makes harmless; only the new holder can record the run's end).
//! * **Streams kept open between close runs.** A Pub/Sub flow whose next fire comes within
//!   [`KEEP_OPEN_WITHIN`] reads the same streams in its next run (`KeptOpen`): what arrives
//!   between runs waits, leased, for it; what a closing stream held would otherwise come back
//!   only after its ack deadline, after a run that opened new streams may have ended idle.
//!   They close when this worker stops running the schedule, before what a control request
//!   clears, and when the next fire is further off.
//! * **A restart continues the schedule** from the last fire recorded. A run a signal stopped
//!   stays `running` and is finished by the next scheduler.
//! * **The worker stays up between runs**, serving `/healthz`, `/metrics` and the control API
//!   (a `StartUpdate` then runs at once, recorded `manual`); SIGTERM between runs exits at
//!   once, with status 0 (the runs' outcomes are in `sluice_runs`).
//! * **Runs on updates** (`on_update: true`): while it waits for a fire, the scheduler also
//!   runs when a table of another pipeline that a flow reads has rows that flow has not read,
//!   at most once per `min_interval` (`table_updates.rs`), recorded `update`, with no data
//!   interval.

use crate::runtime::flow::build::RunScope;
use crate::runtime::flow::executor::FlowOutcome;
use crate::runtime::kit::signals::Shutdown;
use crate::runtime::kit::store_retry::{self, Retry};
use crate::runtime::pool::timing::ALIVE_WITHIN;
use crate::runtime::run_error::RunError;
use crate::runtime::runs::lease::SchedulerLease;
use crate::runtime::runs::record::{self, Ran, RunAsk};
use crate::runtime::runs::table_updates::TableUpdates;
use crate::runtime::updates::update_loop::{Updates, Waited};
use sluice_engine::KeptOpen;
use sluice_pipeline::timetable::{DataInterval, Fire, FireKind, NextRun, Timetable};
use sluice_pipeline::{Pipeline, Schedule, Source};
use sluice_store::{RunEnd, RunRecord, RunState, RunTrigger};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// A Pub/Sub flow's streams stay open between runs when the next fire comes within this long:
/// a run that opens new streams right after the last closed can find the subscription idle
/// while Pub/Sub still holds back what was handed to the closed ones (see
/// `sluice_engine::KeptOpen`); for fires further apart they close, and what they hold goes
/// back to Pub/Sub.
pub const KEEP_OPEN_WITHIN: Duration = Duration::from_secs(60);
/// Fires counted as delayed behind one run, at most (an every-second schedule behind a long
/// run would otherwise be counted one fire at a time).
const DELAYED_COUNT_CAP: u64 = 1_000;
/// Runs looked at for one a runner left unfinished.
const UNFINISHED_LOOKBACK: usize = 50;

/// Runs a triggered pipeline without a schedule once, recorded as a `manual` run.
pub async fn run_once(
    updates: &mut Updates<'_>,
    shutdown: &Shutdown,
) -> Result<Vec<FlowOutcome>, RunError> {
    let ask = RunAsk {
        fire_ms: now_ms(),
        interval: None,
        trigger: RunTrigger::Manual,
    };
    match record::run(updates, shutdown, ask, RunScope::default(), None).await? {
        Ran::Ran(outcomes) => Ok(outcomes),
        Ran::EndedBefore => Ok(Vec::new()),
    }
}

/// What ended the wait for the next fire.
enum Woke {
    /// The fire's time came.
    Fire,
    /// A table of another pipeline that a flow reads grew (`on_update`).
    TableUpdate,
    /// The scheduler lease was lost, or a signal came.
    Neither,
}

/// Runs a pipeline on its schedule until a signal. Returns the outcomes of the run a signal
/// stopped, if it came during one (nothing when it came between runs).
pub async fn drive(
    updates: &mut Updates<'_>,
    schedule: &Schedule,
    shutdown: &Shutdown,
) -> Result<Vec<FlowOutcome>, RunError> {
    let timetable = Timetable::new(schedule).map_err(RunError::Invalid)?;
    let pipeline = updates.pipeline().name.clone();
    let lease = SchedulerLease::start(updates.store().clone(), &pipeline, updates.worker());
    let kept = kept_sources(updates.pipeline());
    let mut outcomes = Vec::new();
    // When the last run started (this worker's clock): `on_update` runs wait `min_interval`.
    let mut last_started: Option<i64> = None;
    loop {
        if shutdown.drain.is_cancelled() {
            break;
        }
        outcomes = Vec::new();
        if !lease.held() {
            next_fire_gauge(&pipeline, None);
            // Another replica runs the schedule: what these streams would take is its.
            close_all(&kept).await;
            let mut holding = lease.watch();
            let wait = async move {
                let _ = holding.wait_for(|held| *held).await;
            };
            if let Waited::Requested = wait_between_runs(updates, shutdown, wait, ()).await? {
                last_started = Some(now_ms());
                outcomes = manual_run(updates, shutdown, &kept).await?;
            }
            continue;
        }
        if let Some(unfinished) = unfinished_run(updates, shutdown).await? {
            last_started = Some(now_ms());
            if let Some(ran) = finish(updates, shutdown, &lease, &kept, unfinished).await? {
                outcomes = ran;
            }
            continue;
        }
        let (last_fire, up_since, newest_start) = schedule_state(updates, shutdown).await?;
        last_started = last_started.or(newest_start);
        let next = timetable.next_run(last_fire, now_ms(), up_since);
        close_if_idle_long(&kept, &next).await;
        let fire = match next {
            NextRun::Now(fire) => fire,
            NextRun::At(_) | NextRun::Never => {
                let at_ms = match next {
                    NextRun::At(at_ms) => Some(at_ms),
                    _ => None,
                };
                next_fire_gauge(&pipeline, at_ms);
                let table_updates = TableUpdates::new(
                    updates.pipeline(),
                    updates.handles(),
                    updates.store().clone(),
                );
                let mut holding = lease.watch();
                let until_fire = async move {
                    let fire = async {
                        match at_ms {
                            Some(at_ms) => sleep_until_ms(at_ms).await,
                            None => std::future::pending().await,
                        }
                    };
                    let grown = async {
                        match &table_updates {
                            Some(watch) => watch.changed(last_started).await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        () = fire => Woke::Fire,
                        () = grown => Woke::TableUpdate,
                        // The lease lost while waiting: the next holder runs the fire.
                        _ = holding.wait_for(|held| !*held) => Woke::Neither,
                    }
                };
                let woke =
                    match wait_between_runs(updates, shutdown, until_fire, Woke::Neither).await? {
                        Waited::Came(woke) => woke,
                        Waited::Requested => {
                            last_started = Some(now_ms());
                            outcomes = manual_run(updates, shutdown, &kept).await?;
                            continue;
                        }
                    };
                if shutdown.drain.is_cancelled() || !lease.held() {
                    continue;
                }
                match (woke, at_ms) {
                    (Woke::Fire, Some(at_ms)) => Fire {
                        at_ms,
                        interval: timetable.interval_of(at_ms),
                        kind: FireKind::Schedule,
                    },
                    (Woke::TableUpdate, _) => {
                        next_fire_gauge(&pipeline, None);
                        let started = now_ms();
                        last_started = Some(started);
                        let ask = RunAsk {
                            fire_ms: started,
                            interval: None,
                            trigger: RunTrigger::Update,
                        };
                        outcomes =
                            ran(
                                record::run(updates, shutdown, ask, scope(&kept, None), None)
                                    .await?,
                            );
                        count_delayed(&timetable, &pipeline, started);
                        continue;
                    }
                    _ => continue,
                }
            }
        };
        next_fire_gauge(&pipeline, None);
        let started = now_ms();
        last_started = Some(started);
        let ask = RunAsk {
            fire_ms: fire.at_ms,
            interval: fire.interval,
            trigger: match fire.kind {
                FireKind::Schedule => RunTrigger::Schedule,
                FireKind::Catchup => RunTrigger::Catchup,
            },
        };
        let scope = scope(&kept, fire.interval);
        outcomes = ran(record::run(updates, shutdown, ask, scope, Some(lease.watch())).await?);
        count_delayed(&timetable, &pipeline, started);
    }
    close_all(&kept).await;
    lease.stop().await;
    Ok(outcomes)
}

/// The outcomes of a run (none for a fire another replica ran).
fn ran(ran: Ran) -> Vec<FlowOutcome> {
    match ran {
        Ran::Ran(outcomes) => outcomes,
        Ran::EndedBefore => Vec::new(),
    }
}

/// A run's scope: its interval and the kept sources.
fn scope(kept: &Kept, interval: Option<DataInterval>) -> RunScope {
    RunScope {
        interval,
        kept: Some(kept.clone()),
        // Each update of the run takes its own fence (`Updates::run`).
        acks: None,
    }
}

/// A run asked for through the control API between fires (what it clears is cleared): the
/// kept streams' messages predate the clearing, so they are given back first.
async fn manual_run(
    updates: &mut Updates<'_>,
    shutdown: &Shutdown,
    kept: &Kept,
) -> Result<Vec<FlowOutcome>, RunError> {
    close_all(kept).await;
    let ask = RunAsk {
        fire_ms: now_ms(),
        interval: None,
        trigger: RunTrigger::Manual,
    };
    Ok(ran(record::run(
        updates,
        shutdown,
        ask,
        scope(kept, None),
        None,
    )
    .await?))
}

/// Finishes a run its runner left `running`: a fire's run as this worker's (same id and
/// interval); a manual or update run nobody will ask for again is recorded failed.
async fn finish(
    updates: &mut Updates<'_>,
    shutdown: &Shutdown,
    lease: &SchedulerLease,
    kept: &Kept,
    unfinished: RunRecord,
) -> Result<Option<Vec<FlowOutcome>>, RunError> {
    if !unfinished.trigger.is_fire() {
        let ended = RunEnd {
            state: RunState::Failed,
            rows: Vec::new(),
            error: Some(format!(
                "worker {} stopped before the run ended",
                unfinished.worker
            )),
        };
        store_retry::until_stored(
            "record the run's end",
            Retry::WhileUnavailable,
            &shutdown.drain,
            || {
                updates
                    .store()
                    .end_run(unfinished.run_id, &unfinished.worker, &ended)
            },
        )
        .await
        .map_err(RunError::Store)?;
        return Ok(None);
    }
    tracing::info!(run = unfinished.run_id, fire_ms = unfinished.fire_ms,
        from = %unfinished.worker, "finishing a run its runner did not end");
    let interval = unfinished
        .interval
        .map(|(start_ms, end_ms)| DataInterval { start_ms, end_ms });
    let ask = RunAsk {
        fire_ms: unfinished.fire_ms,
        interval,
        trigger: unfinished.trigger,
    };
    let ran = record::run(
        updates,
        shutdown,
        ask,
        scope(kept, interval),
        Some(lease.watch()),
    )
    .await?;
    Ok(Some(self::ran(ran)))
}

/// The oldest run its runner left `running`, if any: a manual or update run of a live worker
/// (another replica runs it now) is not left behind; the next run's start waits for it
/// (`record.rs`).
async fn unfinished_run(
    updates: &Updates<'_>,
    shutdown: &Shutdown,
) -> Result<Option<RunRecord>, RunError> {
    let pipeline = &updates.pipeline().name;
    let (runs, alive) = store_retry::until_stored(
        "read the runs",
        Retry::WhileUnavailable,
        &shutdown.drain,
        || async {
            let runs = updates.store().runs(pipeline, UNFINISHED_LOOKBACK).await?;
            let alive = updates.store().workers(pipeline, ALIVE_WITHIN).await?;
            Ok((runs, alive))
        },
    )
    .await
    .map_err(RunError::Store)?;
    // A fire's run is this scheduler's to finish (its runner lost the lease); a manual or
    // update run of a live worker is that worker's.
    let running_elsewhere = |run: &RunRecord| {
        !run.trigger.is_fire()
            && run.worker != updates.worker()
            && alive.iter().any(|w| w.worker == run.worker)
    };
    let unfinished = |run: &RunRecord| matches!(run.state, RunState::Running | RunState::Queued);
    Ok(runs
        .into_iter()
        .filter(|run| unfinished(run) && !running_elsewhere(run))
        .min_by_key(|run| run.run_id))
}

/// The last fire recorded, since when the schedule has been served (the start of the oldest
/// worker alive; this worker's start at the latest) and when the newest run started.
async fn schedule_state(
    updates: &Updates<'_>,
    shutdown: &Shutdown,
) -> Result<(Option<i64>, i64, Option<i64>), RunError> {
    let pipeline = &updates.pipeline().name;
    store_retry::until_stored(
        "read the schedule's state",
        Retry::WhileUnavailable,
        &shutdown.drain,
        || async {
            let last_fire = updates.store().last_fire(pipeline).await?;
            let alive = updates.store().workers(pipeline, ALIVE_WITHIN).await?;
            let up_since = alive
                .iter()
                .map(|w| w.started_at_ms)
                .min()
                .unwrap_or_else(now_ms);
            let newest = updates.store().runs(pipeline, 1).await?;
            Ok((last_fire, up_since, newest.first().map(|r| r.started_at_ms)))
        },
    )
    .await
    .map_err(RunError::Store)
}

/// Counts the fires that came during a run that started at `started` (delayed behind it).
fn count_delayed(timetable: &Timetable, pipeline: &str, started: i64) {
    let delayed = timetable.fires_between(started, now_ms(), DELAYED_COUNT_CAP);
    if delayed > 0 {
        metrics::counter!("sluice_schedule_fires_delayed_total",
            "pipeline" => pipeline.to_owned())
        .increment(delayed);
        tracing::info!(
            delayed,
            "fires came while the run went on; they were delayed"
        );
    }
}

/// `sluice_schedule_next_fire_timestamp_seconds`: the fire this worker waits for (0 while it
/// waits for none: running, or not the scheduler).
fn next_fire_gauge(pipeline: &str, at_ms: Option<i64>) {
    metrics::gauge!("sluice_schedule_next_fire_timestamp_seconds",
        "pipeline" => pipeline.to_owned())
    .set(at_ms.map_or(0.0, |ms| ms as f64 / 1000.0));
}

/// Waits for `until` while serving control requests (see [`Updates::serve_requests_until`]);
/// a signal ends the wait too, as if `until` came with `on_signal`.
async fn wait_between_runs<T>(
    updates: &mut Updates<'_>,
    shutdown: &Shutdown,
    until: impl std::future::Future<Output = T>,
    on_signal: T,
) -> Result<Waited<T>, RunError> {
    updates.ready_between_runs(shutdown);
    let drain = shutdown.drain.clone();
    let until = async move {
        tokio::select! {
            came = until => came,
            () = drain.cancelled() => on_signal,
        }
    };
    updates.serve_requests_until(shutdown, until).await
}

/// The Pub/Sub flows' sources, kept open across runs while fires come soon after each other.
type Kept = Arc<HashMap<String, KeptOpen>>;

fn kept_sources(pipeline: &Pipeline) -> Kept {
    Arc::new(
        pipeline
            .flows
            .iter()
            .filter(|f| matches!(f.source, Source::PubSub(_)))
            .map(|f| (f.name.clone(), KeptOpen::new()))
            .collect(),
    )
}

/// Closes the kept sources unless the next run comes within [`KEEP_OPEN_WITHIN`]: what they
/// hold is given back to Pub/Sub rather than held for long.
async fn close_if_idle_long(kept: &Kept, next: &NextRun) {
    let soon = match next {
        NextRun::Now(_) => true,
        NextRun::At(at_ms) => {
            at_ms.saturating_sub(now_ms())
                <= i64::try_from(KEEP_OPEN_WITHIN.as_millis()).unwrap_or(i64::MAX)
        }
        NextRun::Never => false,
    };
    if !soon {
        close_all(kept).await;
    }
}

/// Closes every kept source (what they hold is nacked).
async fn close_all(kept: &Kept) {
    for source in kept.values() {
        source.close().await;
    }
}

/// Sleeps until the wall-clock instant `at_ms` (re-reading the clock, so a clock step or a
/// suspended machine does not make it oversleep by much).
async fn sleep_until_ms(at_ms: i64) {
    loop {
        let left = at_ms.saturating_sub(now_ms());
        if left <= 0 {
            return;
        }
        let step = Duration::from_millis(u64::try_from(left).unwrap_or(0).min(1_000));
        tokio::time::sleep(step).await;
    }
}

fn now_ms() -> i64 {
    sluice_engine::now_ms()
}
