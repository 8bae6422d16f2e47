//! The runs of a triggered pipeline: one run, then exit (no `schedule:`), or a run at each
//! fire of its schedule until a signal (`schedule:`, SPEC §7, with the timetable semantics of
//! `sluice_pipeline::timetable`). Every run is recorded in `sluice_runs` with what fired it,
//! its data interval, its state and the rows of each flow.
//!
//! # Guarantees
//!
//! * **Runs never overlap.** A worker runs one update at a time. A fire that comes while a run
//!   goes on is delayed (`sluice_schedule_fires_delayed_total`): when the run ends, the latest
//!   such fire runs at once (at most one is pending), or with `catchup: true` every one of
//!   them, in order.
//! * **One replica runs each fire.** Only the holder of the pipeline's `scheduler` lease runs
//!   fires, and a fire is recorded once ([`sluice_store::RunStore::begin_run`]): a replica
//!   that takes the lease over from one that died mid-run finishes that same run (same id,
//!   same interval) before anything else, and never starts an ended fire again. A holder that
//!   loses its lease (paused past it) drains its run and leaves it to the new holder; the two
//!   may overlap for a moment, which the dedup ledger makes harmless.
//! * **Streams kept open between close runs.** A Pub/Sub flow whose next fire comes within
//!   [`KEEP_OPEN_WITHIN`] reads the same streams in its next run (`KeptOpen`): what arrives
//!   between runs waits, leased, for it; what a closing stream held would otherwise come back
//!   only after its ack deadline, after a run that opened new streams may have ended idle.
//! * **A restart continues the schedule** from the last fire recorded: fires missed while no
//!   worker ran are skipped or run as the timetable's rules say (`catchup`, `semantics`). A run
//!   a signal stopped stays `running` and is finished by the next scheduler.
//! * **The worker stays up between runs**, serving `/healthz`, `/metrics` and the control API
//!   (a `StartUpdate` then runs at once, recorded `manual`); SIGTERM between runs exits at
//!   once, with status 0.
//! * **Runs on updates** (`on_update: true`): while it waits for a fire, the scheduler also
//!   runs when a table of another pipeline that a flow reads has rows that flow has not read,
//!   at most once per `min_interval` (`table_updates.rs`), recorded `update`, with no data
//!   interval.

use crate::runtime::flows::RunScope;
use crate::runtime::membership::{BEAT_INTERVAL, LEASE_TTL};
use crate::runtime::scheduler::{FlowOutcome, FlowState};
use crate::runtime::signals::Shutdown;
use crate::runtime::store_retry::{self, Retry};
use crate::runtime::table_updates::TableUpdates;
use crate::runtime::update_loop::{RunError, Updates, Waited};
use sluice_connector::KeptOpen;
use sluice_pipeline::timetable::{DataInterval, Fire, FireKind, NextRun, Since, Timetable};
use sluice_pipeline::{Pipeline, Schedule, Source};
use sluice_store::{
    LeaseGrant, LeaseRequest, RunEnd, RunRecord, RunStart, RunState, RunTrigger, Store,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The lease role of the replica that runs a pipeline's fires.
pub const SCHEDULER: &str = "scheduler";
/// A Pub/Sub flow's streams stay open between runs when the next fire comes within this long:
/// a run that opens new streams right after the last closed can find the subscription idle
/// while Pub/Sub still holds back what was handed to the closed ones (see
/// `sluice_connector::KeptOpen`); for fires further apart they close, and what they hold goes
/// back to Pub/Sub.
pub const KEEP_OPEN_WITHIN: Duration = Duration::from_secs(60);
/// Delayed fires counted after one run, at most (a long outage of an every-second schedule
/// would otherwise be counted one fire at a time).
const DELAYED_COUNT_CAP: u64 = 100_000;

/// Runs a triggered pipeline without a schedule once, recorded as a `manual` run.
pub async fn run_once(
    updates: &mut Updates<'_>,
    shutdown: &Shutdown,
) -> Result<Vec<FlowOutcome>, RunError> {
    run_unscheduled(updates, shutdown, RunTrigger::Manual, &RunScope::default()).await
}

/// Runs the pipeline once, now, recorded with `trigger` (`manual`, `update`) and no interval.
async fn run_unscheduled(
    updates: &mut Updates<'_>,
    shutdown: &Shutdown,
    trigger: RunTrigger,
    scope: &RunScope,
) -> Result<Vec<FlowOutcome>, RunError> {
    let start = RunStart {
        pipeline: updates.pipeline.name.clone(),
        fire_ms: now_ms(),
        interval: None,
        trigger,
        worker: updates.worker.clone(),
    };
    let record = begin(&*updates.store, &start, shutdown).await?;
    let outcomes = updates.run(shutdown, scope.clone()).await?;
    let state = if shutdown.drain.is_cancelled() {
        RunState::Stopped
    } else {
        ended_state(&outcomes)
    };
    end(&*updates.store, &record, state, &outcomes, shutdown).await;
    Ok(outcomes)
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

/// Runs a pipeline on its schedule until a signal; returns the last run's outcomes.
pub async fn drive(
    updates: &mut Updates<'_>,
    schedule: &Schedule,
    shutdown: &Shutdown,
) -> Result<Vec<FlowOutcome>, RunError> {
    let timetable = Timetable::new(schedule).map_err(RunError::Invalid)?;
    let pipeline = updates.pipeline.name.clone();
    let lease = SchedulerLease::start(updates.store.clone(), &pipeline, &updates.worker);
    let gauges = Gauges::new(&pipeline);
    let kept = kept_sources(updates.pipeline);
    let scope = RunScope {
        interval: None,
        kept: Some(kept.clone()),
    };
    let mut outcomes = Vec::new();
    let mut since = Since::Downtime;
    // When the last run started (this worker's clock): `on_update` runs wait `min_interval`.
    let mut last_started: Option<i64> = None;
    loop {
        if shutdown.drain.is_cancelled() {
            break;
        }
        if !lease.held() {
            gauges.next_fire(None);
            let mut holding = lease.watch();
            let wait = async move {
                let _ = holding.wait_for(|held| *held).await;
            };
            if let Waited::Requested = wait_between_runs(updates, shutdown, wait, ()).await? {
                // What the kept streams hold predates what the request cleared.
                close_all(&kept).await;
                last_started = Some(now_ms());
                outcomes = run_unscheduled(updates, shutdown, RunTrigger::Manual, &scope).await?;
            }
            since = Since::Downtime;
            continue;
        }
        // A fire's run its runner did not end (it died, or stopped on a signal) is finished
        // first; another such run (manual, update) is recorded failed: nothing asks for it again.
        let newest = newest_run(updates, shutdown).await?;
        if last_started.is_none() {
            last_started = newest.as_ref().map(|r| r.started_at_ms);
        }
        if let Some(unfinished) = newest.filter(|r| r.state == RunState::Running) {
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
                    || updates.store.end_run(unfinished.run_id, &ended),
                )
                .await
                .map_err(RunError::Store)?;
                continue;
            }
            tracing::info!(run = unfinished.run_id, fire_ms = unfinished.fire_ms,
                from = %unfinished.worker, "finishing a run its runner did not end");
            let fire = Fire {
                at_ms: unfinished.fire_ms,
                interval: unfinished
                    .interval
                    .map(|(start_ms, end_ms)| DataInterval { start_ms, end_ms }),
                kind: FireKind::Schedule,
            };
            last_started = Some(now_ms());
            outcomes = run_fire(
                updates,
                &lease,
                &gauges,
                shutdown,
                fire,
                unfinished.trigger,
                &kept,
            )
            .await?
            .unwrap_or(outcomes);
            since = Since::Run;
            continue;
        }
        let last_fire = store_retry::until_stored(
            "read the last fire",
            Retry::WhileUnavailable,
            &shutdown.drain,
            || updates.store.last_fire(&pipeline),
        )
        .await
        .map_err(RunError::Store)?;
        let next = timetable.next_run(last_fire, now_ms(), since);
        close_if_idle_long(&kept, &next).await;
        let fire = match next {
            NextRun::Now(fire) => fire,
            NextRun::At(_) | NextRun::Never => {
                let at_ms = match next {
                    NextRun::At(at_ms) => Some(at_ms),
                    _ => None,
                };
                gauges.next_fire(at_ms);
                let table_updates =
                    TableUpdates::new(updates.pipeline, updates.handles(), updates.store.clone());
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
                let woke = match wait_between_runs(updates, shutdown, until_fire, Woke::Neither)
                    .await?
                {
                    Waited::Came(woke) => woke,
                    Waited::Requested => {
                        // What the kept streams hold predates what the request cleared.
                        close_all(&kept).await;
                        last_started = Some(now_ms());
                        outcomes =
                            run_unscheduled(updates, shutdown, RunTrigger::Manual, &scope).await?;
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
                        gauges.next_fire(None);
                        last_started = Some(now_ms());
                        outcomes =
                            run_unscheduled(updates, shutdown, RunTrigger::Update, &scope).await?;
                        continue;
                    }
                    _ => continue,
                }
            }
        };
        gauges.next_fire(None);
        let trigger = match fire.kind {
            FireKind::Schedule => RunTrigger::Schedule,
            FireKind::Catchup => RunTrigger::Catchup,
        };
        last_started = Some(now_ms());
        if let Some(ran) =
            run_fire(updates, &lease, &gauges, shutdown, fire, trigger, &kept).await?
        {
            outcomes = ran;
        }
        let delayed = timetable.fires_between(fire.at_ms, now_ms(), DELAYED_COUNT_CAP);
        if delayed > 0 {
            gauges.delayed(delayed);
            tracing::info!(
                delayed,
                "fires came while the run went on; they were delayed"
            );
        }
        since = Since::Run;
    }
    close_all(&kept).await;
    lease.stop().await;
    Ok(outcomes)
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

/// Runs one fire under `trigger`; `None` when its record says it ended already (another
/// replica ran it).
async fn run_fire(
    updates: &mut Updates<'_>,
    lease: &SchedulerLease,
    gauges: &Gauges,
    shutdown: &Shutdown,
    fire: Fire,
    trigger: RunTrigger,
    kept: &Kept,
) -> Result<Option<Vec<FlowOutcome>>, RunError> {
    let start = RunStart {
        pipeline: updates.pipeline.name.clone(),
        fire_ms: fire.at_ms,
        interval: fire.interval.map(|i| (i.start_ms, i.end_ms)),
        trigger,
        worker: updates.worker.clone(),
    };
    let record = begin(&*updates.store, &start, shutdown).await?;
    if record.state != RunState::Running {
        tracing::info!(
            run = record.run_id,
            fire_ms = fire.at_ms,
            state = record.state.name(),
            "fire run already; not run again"
        );
        return Ok(None);
    }
    tracing::info!(run = record.run_id, fire_ms = fire.at_ms, trigger = trigger.name(),
        interval = ?fire.interval, "run starts");
    // Drained by a signal, or when this worker loses the scheduler lease (the next holder
    // finishes the run).
    let this_run = Shutdown {
        drain: shutdown.drain.child_token(),
        give_up: shutdown.give_up.child_token(),
    };
    let lost = {
        let (mut holding, drain) = (lease.watch(), this_run.drain.clone());
        tokio::spawn(async move {
            if holding.wait_for(|held| !*held).await.is_ok() {
                tracing::warn!("lost the scheduler lease; draining the run for the next holder");
                drain.cancel();
            }
        })
    };
    let scope = RunScope {
        interval: fire.interval,
        kept: Some(kept.clone()),
    };
    let outcomes = updates.run(&this_run, scope).await;
    lost.abort();
    let outcomes = outcomes?;
    if this_run.drain.is_cancelled() {
        tracing::info!(
            run = record.run_id,
            "run stopped before its end; the next scheduler finishes it"
        );
    } else {
        let state = ended_state(&outcomes);
        if end(&*updates.store, &record, state, &outcomes, shutdown).await {
            gauges.ended(state);
        }
    }
    Ok(Some(outcomes))
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

/// The newest run of the pipeline, if any.
async fn newest_run(
    updates: &Updates<'_>,
    shutdown: &Shutdown,
) -> Result<Option<RunRecord>, RunError> {
    let newest = store_retry::until_stored(
        "read the runs",
        Retry::WhileUnavailable,
        &shutdown.drain,
        || updates.store.runs(&updates.pipeline.name, 1),
    )
    .await
    .map_err(RunError::Store)?;
    Ok(newest.into_iter().next())
}

/// Records a run's start (retrying while the store is unavailable).
async fn begin(
    store: &dyn Store,
    start: &RunStart,
    shutdown: &Shutdown,
) -> Result<RunRecord, RunError> {
    store_retry::until_stored(
        "record the run",
        Retry::WhileUnavailable,
        &shutdown.drain,
        || store.begin_run(start),
    )
    .await
    .map_err(RunError::Store)
}

/// How a run that was not stopped ended: failed when a flow failed.
fn ended_state(outcomes: &[FlowOutcome]) -> RunState {
    if outcomes
        .iter()
        .any(|o| matches!(o.state, FlowState::Failed(_)))
    {
        RunState::Failed
    } else {
        RunState::Completed
    }
}

/// Records how a run ended, with the rows of each flow and why flows failed; `false` when the
/// store could not be told before a signal (the run then stays running).
async fn end(
    store: &dyn Store,
    record: &RunRecord,
    state: RunState,
    outcomes: &[FlowOutcome],
    shutdown: &Shutdown,
) -> bool {
    let failed: Vec<String> = outcomes
        .iter()
        .filter_map(|o| match &o.state {
            FlowState::Failed(why) => Some(format!("{}: {why}", o.name)),
            _ => None,
        })
        .collect();
    let run_end = RunEnd {
        state,
        rows: outcomes
            .iter()
            .map(|o| (o.name.clone(), o.counters.committed))
            .collect(),
        error: (!failed.is_empty()).then(|| failed.join("; ")),
    };
    // Tried until the drain gives up: a stopped run's end is recorded while it drains too.
    let recorded = store_retry::until_stored(
        "record the run's end",
        Retry::WhileUnavailable,
        &shutdown.give_up,
        || store.end_run(record.run_id, &run_end),
    )
    .await;
    match recorded {
        Ok(()) => {
            tracing::info!(run = record.run_id, state = state.name(), "run ended");
            true
        }
        Err(error) => {
            tracing::warn!(run = record.run_id, %error, "could not record the run's end");
            false
        }
    }
}

/// The `scheduler` lease, taken and renewed every [`BEAT_INTERVAL`] in the background.
struct SchedulerLease {
    held: watch::Receiver<bool>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl SchedulerLease {
    fn start(store: Arc<dyn Store>, pipeline: &str, worker: &str) -> Self {
        let request = LeaseRequest {
            pipeline: pipeline.to_owned(),
            role: SCHEDULER.to_owned(),
            holder: worker.to_owned(),
            ttl: LEASE_TTL,
        };
        let (held_tx, held) = watch::channel(false);
        let stop = CancellationToken::new();
        let task = tokio::spawn(renew(store, request, held_tx, stop.clone()));
        Self { held, stop, task }
    }

    fn held(&self) -> bool {
        *self.held.borrow()
    }

    fn watch(&self) -> watch::Receiver<bool> {
        self.held.clone()
    }

    /// Stops renewing and hands the lease back at once.
    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Takes or renews the lease every beat until `stop`, publishing whether it is held; a store
/// that does not answer counts as not held (another replica may take it after its time).
async fn renew(
    store: Arc<dyn Store>,
    request: LeaseRequest,
    held: watch::Sender<bool>,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval(BEAT_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = stop.cancelled() => break,
        }
        let holding = match store.acquire_lease(&request).await {
            Ok(LeaseGrant::Held { taken, .. }) => {
                if taken {
                    tracing::info!("this worker runs the schedule (scheduler lease)");
                }
                true
            }
            Ok(LeaseGrant::HeldBy(_)) => false,
            Err(error) => {
                tracing::warn!(%error, "cannot renew the scheduler lease");
                false
            }
        };
        held.send_if_modified(|was| std::mem::replace(was, holding) != holding);
    }
    if *held.borrow() {
        let _ = store
            .release_lease(&request.pipeline, &request.role, &request.holder)
            .await;
    }
}

/// The schedule's metrics.
struct Gauges {
    pipeline: String,
}

impl Gauges {
    fn new(pipeline: &str) -> Self {
        Self {
            pipeline: pipeline.to_owned(),
        }
    }

    /// `sluice_schedule_next_fire_timestamp_seconds`: the fire this worker waits for (0 while
    /// it waits for nothing: running, or not the scheduler).
    fn next_fire(&self, at_ms: Option<i64>) {
        metrics::gauge!("sluice_schedule_next_fire_timestamp_seconds",
            "pipeline" => self.pipeline.clone())
        .set(at_ms.map_or(0.0, |ms| ms as f64 / 1000.0));
    }

    /// `sluice_schedule_fires_delayed_total`.
    fn delayed(&self, fires: u64) {
        metrics::counter!("sluice_schedule_fires_delayed_total",
            "pipeline" => self.pipeline.clone())
        .increment(fires);
    }

    /// `sluice_runs_total{state}`.
    fn ended(&self, state: RunState) {
        metrics::counter!("sluice_runs_total", "pipeline" => self.pipeline.clone(),
            "state" => state.name())
        .increment(1);
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
    sluice_connector::now_ms()
}
