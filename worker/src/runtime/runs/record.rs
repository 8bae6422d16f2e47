//! One run of a triggered pipeline, recorded in `sluice_runs`: begun (a fire once, see
//! `sluice_store::RunStore`), run as an update, ended with its state and each flow's rows,
//! and counted (`sluice_runs_total{state}`).

use crate::runtime::flow::build::RunScope;
use crate::runtime::flow::executor::{FlowOutcome, FlowState};
use crate::runtime::kit::signals::Shutdown;
use crate::runtime::kit::store_retry::{self, Retry};
use crate::runtime::pool::timing::ALIVE_WITHIN;
use crate::runtime::run_error::RunError;
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

/// How a run went.
pub enum Ran {
    /// It ran (to its end, or until a stop): the flows' outcomes.
    Ran(Vec<FlowOutcome>),
    /// Its fire is recorded ended already (another replica ran it): not run again.
    EndedBefore,
}

/// Runs `ask` as an update of `updates` and records it. `kept` are the sources the scheduler
/// keeps open between runs. With `lease` (a fire's run), losing the scheduler lease drains the
/// run, which then stays running for the next holder to finish; a run a signal stops does
/// too. A manual or update run a signal stops is recorded `stopped`.
pub async fn run(
    updates: &mut Updates<'_>,
    shutdown: &Shutdown,
    ask: RunAsk,
    scope: RunScope,
    lease: Option<watch::Receiver<bool>>,
) -> Result<Ran, RunError> {
    let start = RunStart {
        pipeline: updates.pipeline().name.clone(),
        fire_ms: ask.fire_ms,
        interval: ask.interval.map(|i| (i.start_ms, i.end_ms)),
        trigger: ask.trigger,
        worker: updates.worker().to_owned(),
        alive_within: ALIVE_WITHIN,
        queued_as: None,
    };
    let Some(record) = begin_alone(&**updates.store(), &start, shutdown).await? else {
        return Ok(Ran::EndedBefore);
    };
    if record.state != RunState::Running {
        tracing::info!(
            run = record.run_id,
            fire_ms = ask.fire_ms,
            state = record.state.name(),
            "fire run already; not run again"
        );
        return Ok(Ran::EndedBefore);
    }
    tracing::info!(run = record.run_id, fire_ms = ask.fire_ms, trigger = ask.trigger.name(),
        interval = ?ask.interval, "run starts");
    let this_run = Shutdown {
        drain: shutdown.drain.child_token(),
        give_up: shutdown.give_up.child_token(),
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
    let outcomes = updates.run(&this_run, scope).await;
    if let Some(lost) = lost {
        lost.abort();
    }
    let outcomes = outcomes?;
    let state = if !this_run.drain.is_cancelled() {
        Some(ended_state(&outcomes))
    } else if ask.trigger.is_fire() {
        tracing::info!(
            run = record.run_id,
            "run stopped before its end; the next scheduler finishes it"
        );
        None
    } else {
        Some(RunState::Stopped)
    };
    if let Some(state) = state
        && end(
            &**updates.store(),
            &record,
            updates.worker(),
            state,
            &outcomes,
            shutdown,
        )
        .await
    {
        metrics::counter!("sluice_runs_total", "pipeline" => updates.pipeline().name.clone(),
            "state" => state.name())
        .increment(1);
    }
    Ok(Ran::Ran(outcomes))
}

/// Records a run's start once no other live worker's run goes on or was queued before it
/// (one run at a time in a pool, in the order asked: a manual run asked of another replica,
/// say); meanwhile the run is recorded `queued` and looked at again every [`OTHER_RUN_POLL`].
/// `None` if a signal came first (a queued run is then recorded stopped).
async fn begin_alone(
    store: &dyn Store,
    start: &RunStart,
    shutdown: &Shutdown,
) -> Result<Option<RunRecord>, RunError> {
    let mut start = start.clone();
    loop {
        let record = begin(store, &start, shutdown).await?;
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

/// Records how a run ended, with the rows of each flow and why flows failed; `false` when it
/// was not recorded (the store did not answer before the drain gave up, or the run is another
/// replica's now).
async fn end(
    store: &dyn Store,
    record: &RunRecord,
    worker: &str,
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
        || store.end_run(record.run_id, worker, &run_end),
    )
    .await;
    match recorded {
        Ok(true) => {
            tracing::info!(run = record.run_id, state = state.name(), "run ended");
            true
        }
        Ok(false) => {
            tracing::warn!(
                run = record.run_id,
                "the run is another worker's now; its end is theirs to record"
            );
            false
        }
        Err(error) => {
            tracing::warn!(run = record.run_id, %error, "could not record the run's end");
            false
        }
    }
}
