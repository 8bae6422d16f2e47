//! One run, as the run loop (`timetable.rs`) makes it: a continuous pipeline's update, not
//! recorded; a triggered pipeline's run, recorded in `sluice_runs`: begun (a fire once, see
//! `sluice_store::RunStore`), its interval's rows cleared first for a rerun (`rerun.rs`), run
//! as an update, ended with its state and each flow's rows (`run_end.rs`); or a run a gone
//! worker left unfinished, recorded failed.

use crate::runtime::flow::outcome::FlowOutcome;
use crate::runtime::flow::run_context::{KeptSources, RunScope};
use crate::runtime::kit::signals::Shutdown;
use crate::runtime::kit::store_retry::{self, Retry};
use crate::runtime::pool::timing::ALIVE_WITHIN;
use crate::runtime::run_error::RunError;
use crate::runtime::runs::retries;
use crate::runtime::runs::run_end::{self, Ended};
use crate::runtime::updates::update_loop::Updates;
use sluice_store::{RunEnd, RunRecord, RunStart, RunState, RunTrigger, Store};
use tokio::sync::watch;

/// What a run is: its fire (for every trigger, when it was asked for), data interval and
/// trigger.
#[derive(Debug, Clone, Copy)]
pub struct RunAsk {
    /// The fire it runs, ms since the epoch.
    pub fire_ms: i64,
    /// Its data interval, `[start, end)` ms.
    pub interval: Option<sluice_pipeline::timetable::DataInterval>,
    /// Why it runs.
    pub trigger: RunTrigger,
}

/// A run to make.
pub enum Run {
    /// A continuous pipeline's update, until a signal: not recorded.
    Update,
    /// A triggered pipeline's run, recorded.
    Recorded {
        /// What it runs.
        ask: RunAsk,
        /// What it gives its flows (its interval, the sources kept open between runs).
        scope: RunScope,
        /// A fire's run: the scheduler lease, whose loss drains the run (which then stays
        /// running for the next holder to finish).
        lease: Option<watch::Receiver<bool>>,
        /// The kept sources are closed first (what they hold is given back): a run asked for
        /// between fires, after what it clears was cleared.
        give_back_kept: bool,
    },
    /// A manual or update run its runner (a worker gone) left unfinished: nobody will ask for
    /// it again, so it is recorded failed, not run.
    Abandoned(RunRecord),
}

/// Makes `run` with `updates`; returns the flows' outcomes (none for a fire another replica
/// ran, or a run not run). A fire's run a signal stops, or the loss of the lease, stays
/// running for the next scheduler to finish; a manual or update run a signal stops is
/// recorded `stopped` (`run_end.rs`).
pub async fn run(
    updates: &mut Updates<'_>,
    shutdown: &Shutdown,
    run: Run,
) -> Result<Vec<FlowOutcome>, RunError> {
    let (recorded, this_run, scope, lease) = match run {
        Run::Recorded {
            ask,
            scope,
            lease,
            give_back_kept,
        } => {
            // With `depends_on_past`, once the fire before it completed.
            if !super::depends_on_past::may_begin(updates, shutdown, &ask, scope.kept.as_ref())
                .await?
            {
                return Ok(Vec::new());
            }
            let kept = scope.kept.as_ref().filter(|_| give_back_kept);
            // Seen alive first: a run begun before this worker's first heartbeat landed would
            // not hold back another worker's begin (a backfill starting beside a pool ran an
            // interval at the same time as the pool's catch-up did).
            updates.wait_until_live(shutdown).await?;
            let Some(record) = begin(updates, shutdown, ask, kept).await? else {
                return Ok(Vec::new());
            };
            // A rerun replaces what its interval wrote: cleared once the run is this worker's.
            if let (RunTrigger::Rerun, Some(interval)) = (ask.trigger, ask.interval) {
                super::rerun::clear(updates, shutdown, interval).await?;
            }
            let this_run = Shutdown {
                drain: shutdown.drain.child_token(),
                give_up: shutdown.give_up.child_token(),
            };
            (Some((ask, record)), this_run, scope, lease)
        }
        Run::Update => (None, shutdown.clone(), RunScope::default(), None),
        Run::Abandoned(unfinished) => {
            let ended = RunEnd {
                state: RunState::Failed,
                rows: Vec::new(),
                error: Some(format!(
                    "worker {} stopped before the run ended",
                    unfinished.worker
                )),
            };
            let recorded = store_retry::until_stored_within(
                "record the run's end",
                Retry::WhileUnavailable,
                &shutdown.drain,
                store_retry::run_patience(updates.pipeline()),
                || {
                    updates
                        .store()
                        .end_run(unfinished.run_id, &unfinished.worker, &ended)
                },
            )
            .await
            .map_err(RunError::Store)?;
            // Several replicas may find it: the one whose end is recorded counts it.
            if recorded {
                tracing::warn!(run = unfinished.run_id, worker = %unfinished.worker,
                    "a run its worker left unfinished is recorded failed");
                run_end::count(&updates.pipeline().name, RunState::Failed);
            }
            return Ok(Vec::new());
        }
    };
    let lost = lease.map(|mut holding| {
        let drain = this_run.drain.clone();
        tokio::spawn(async move {
            if holding.wait_for(|held| !*held).await.is_ok() {
                tracing::warn!("lost the scheduler lease; draining the run for the next holder");
                drain.cancel();
            }
        })
    });
    let outcomes = if recorded.is_some() {
        retries::run_with_retries(updates, &this_run, scope).await
    } else {
        updates.run(&this_run, scope).await
    };
    if let Some(lost) = lost {
        lost.abort();
    }
    let outcomes = outcomes?;
    if let Some((ask, record)) = recorded {
        let ended = Ended {
            pipeline: &updates.pipeline().name,
            record: &record,
            trigger: ask.trigger,
            stopped: this_run.drain.is_cancelled(),
            outcomes: &outcomes,
            give_up_after: updates.pipeline().give_up_after,
        };
        run_end::record(&**updates.store(), updates.worker(), ended, shutdown).await;
    }
    Ok(outcomes)
}

/// Begins the run `ask` (after giving back what the `kept` sources hold, if asked): `None`
/// when it is not to run (a signal came first, or its fire ran already).
async fn begin(
    updates: &Updates<'_>,
    shutdown: &Shutdown,
    ask: RunAsk,
    kept: Option<&KeptSources>,
) -> Result<Option<RunRecord>, RunError> {
    for source in kept.into_iter().flat_map(|kept| kept.values()) {
        source.close().await;
    }
    let start = RunStart {
        pipeline: updates.pipeline().name.clone(),
        fire_ms: ask.fire_ms,
        interval: ask.interval.map(|i| (i.start_ms, i.end_ms)),
        trigger: ask.trigger,
        worker: updates.worker().to_owned(),
        alive_within: ALIVE_WITHIN,
        queued_as: None,
    };
    let patience = store_retry::run_patience(updates.pipeline());
    let Some(record) = begin_alone(&**updates.store(), &start, shutdown, patience).await? else {
        return Ok(None);
    };
    if !ask.trigger.is_fire() && matches!(record.state, RunState::Failed | RunState::Stopped) {
        // Queued, it was ended by another worker that counted this one gone (a pause past
        // the pool's `ALIVE_WITHIN`): nothing of it ran.
        return Err(RunError::Lost(format!(
            "run {} was recorded {} by another worker while it waited ({}); nothing of it ran",
            record.run_id,
            record.state.name(),
            record.error.as_deref().unwrap_or("no reason given")
        )));
    }
    if record.state != RunState::Running {
        tracing::info!(
            run = record.run_id,
            fire_ms = ask.fire_ms,
            state = record.state.name(),
            "its fire or interval was run already; not run again"
        );
        return Ok(None);
    }
    tracing::info!(run = record.run_id, fire_ms = ask.fire_ms, trigger = ask.trigger.name(),
        interval = ?ask.interval, "run starts");
    Ok(Some(record))
}

/// Records a run's start once no other live worker's run goes on or was queued before it
/// (one run at a time in a pool, in the order asked: a manual run asked of another replica,
/// say); meanwhile the run is recorded `queued` and looked at again every [`OTHER_RUN_POLL`].
/// `None` if a signal came first (a queued run is then recorded stopped).
async fn begin_alone(
    store: &dyn Store,
    start: &RunStart,
    shutdown: &Shutdown,
    give_up_after: Option<std::time::Duration>,
) -> Result<Option<RunRecord>, RunError> {
    let mut start = start.clone();
    loop {
        let record = begin_once(store, &start, shutdown, give_up_after).await?;
        if record.state != RunState::Queued {
            return Ok(Some(record));
        }
        if start.queued_as.is_none() {
            tracing::info!(
                run = record.run_id,
                trigger = record.trigger.name(),
                "another worker's run goes on; this one is queued and starts after it"
            );
            start.queued_as = Some(record.run_id);
        }
        tokio::select! {
            () = tokio::time::sleep(OTHER_RUN_POLL) => {}
            () = shutdown.drain.cancelled() => {
                let stopped = RunEnd {
                    state: RunState::Stopped,
                    rows: Vec::new(),
                    error: Some("stopped before it could start".to_owned()),
                };
                if let Err(error) = store.end_run(record.run_id, &start.worker, &stopped).await {
                    tracing::warn!(run = record.run_id, %error,
                        "could not record the queued run stopped; the scheduler ends it");
                }
                return Ok(None);
            }
        }
    }
}

/// How often a run held back by another worker's looks again.
const OTHER_RUN_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// Records a run's start (retrying while the store is unavailable).
async fn begin_once(
    store: &dyn Store,
    start: &RunStart,
    shutdown: &Shutdown,
    give_up_after: Option<std::time::Duration>,
) -> Result<RunRecord, RunError> {
    store_retry::until_stored_within(
        "record the run",
        Retry::WhileUnavailable,
        &shutdown.drain,
        give_up_after,
        || store.begin_run(start),
    )
    .await
    .map_err(RunError::Store)
}
