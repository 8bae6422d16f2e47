//! The order in which a run's flows start, and what happens when one fails (SPEC §6).
//!
//! # Guarantees
//!
//! * **A flow starts only after every predecessor completed successfully**: every flow it
//!   `depends_on`, and every flow writing a table it reads (a data edge; in continuous mode
//!   only once-writers, since a live writer never completes). Success is `COMPLETED` in this
//!   run or `IDLE` (a once flow recorded complete earlier, not re-read).
//! * **Failures do not cascade into work.** A flow that fails (cannot be built, its source
//!   cannot start, a file cannot be read) is retried after 1 s, 2 s and 4 s; when the retries
//!   are spent it is `FAILED` and every flow after it is `SKIPPED`, never started.
//! * **Independent flows run in parallel.** Bounded work (once flows, and every flow of a
//!   triggered run) runs at most [`MAX_PARALLEL_BOUNDED`] at a time; the live flows of a
//!   continuous pipeline all run, since none of them ever ends.
//! * **Completion is persistent.** A once flow that drains records its completion in the store
//!   before its dependents are released, so a restart (of this replica or any other) finds it
//!   `IDLE` and resumes at the first flow not completed. A once flow on a subscription drains
//!   only when every replica reading it agrees and a crashed reader's messages have had the
//!   time to come back (`drain_quorum.rs`).

use crate::control::FlowBoard;
use crate::flows;
use crate::signals::Shutdown;
use sluice_connector::{Backoff, Counters, Ended, FlowEnd, Snapshot};
use sluice_pipeline::{Flow, Mode, Pipeline, Source};
use sluice_store::{FlowHandle, Store};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, watch};

/// Once flows (and flows of a triggered run) running at once, at most.
pub const MAX_PARALLEL_BOUNDED: usize = 4;

/// Delays before each retry of a failed flow; when they are spent the flow is FAILED.
pub const RETRY_DELAYS: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
];

/// How one flow ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlowState {
    /// Ran to its end: drained (idle for `drain_idle`, or its files read) in a triggered run or
    /// as a once flow.
    Completed,
    /// Stopped by a signal (the normal end of a continuous flow); what it received is committed
    /// and acked.
    Stopped,
    /// A once flow recorded complete in the store (by this worker earlier or by another
    /// replica): not run again. Counts as success for its dependents.
    Idle,
    /// Did not start: a predecessor failed, or the run was stopped first.
    Skipped(String),
    /// Could not run, retries included.
    Failed(String),
}

impl FlowState {
    /// The state's name as SPEC §6 and `sluice_flow_state{state}` spell it.
    pub fn name(&self) -> &'static str {
        match self {
            FlowState::Completed => "COMPLETED",
            FlowState::Stopped => "STOPPED",
            FlowState::Idle => "IDLE",
            FlowState::Skipped(_) => "SKIPPED",
            FlowState::Failed(_) => "FAILED",
        }
    }

    /// Whether dependents may start after it.
    pub fn succeeded(&self) -> bool {
        matches!(self, FlowState::Completed | FlowState::Idle)
    }
}

/// One flow's result.
#[derive(Debug, Clone)]
pub struct FlowOutcome {
    /// Flow name.
    pub name: String,
    /// How it ended.
    pub state: FlowState,
    /// Its counters at the end (of its last attempt).
    pub counters: Snapshot,
    /// Records of a bounded source (files, a table) not delivered because the flow had
    /// committed them before (a re-read after a crash, a repeated id, a table read again).
    pub skipped: u64,
}

/// What every flow of a run shares.
#[derive(Clone)]
pub struct RunContext {
    /// The pipeline.
    pub pipeline: Pipeline,
    /// The store.
    pub store: Arc<dyn Store>,
    /// Signals.
    pub shutdown: Shutdown,
    /// Live states for the control API and `sluice_flow_state`.
    pub board: FlowBoard,
    /// Slots of bounded work.
    pub slots: Arc<Semaphore>,
    /// This worker's id in the pool (lease holder name).
    pub worker: String,
}

/// Runs one flow once its predecessors have succeeded, with retries; announces its end on
/// `done` (`Some(success)`).
pub async fn run_flow(
    ctx: &RunContext,
    flow: &Flow,
    handle: FlowHandle,
    predecessors: Vec<(String, watch::Receiver<Option<bool>>)>,
) -> FlowOutcome {
    let outcome = |state| FlowOutcome {
        name: flow.name.clone(),
        state,
        counters: Snapshot::default(),
        skipped: 0,
    };
    for (name, mut rx) in predecessors {
        let succeeded = tokio::select! {
            result = rx.wait_for(Option::is_some) => result.ok().and_then(|v| *v).unwrap_or(false),
            _ = ctx.shutdown.drain.cancelled() => false,
        };
        if !succeeded {
            if ctx.shutdown.drain.is_cancelled() {
                return outcome(FlowState::Skipped("stopped before start".into()));
            }
            let why = format!("predecessor {name} did not complete");
            tracing::info!(flow = %flow.name, predecessor = %name, "flow skipped");
            return outcome(FlowState::Skipped(why));
        }
    }
    let bounded = flow.once || ctx.pipeline.mode == Mode::Triggered;
    let _slot = if bounded {
        tokio::select! {
            slot = ctx.slots.clone().acquire_owned() => slot.ok(),
            _ = ctx.shutdown.drain.cancelled() => None,
        }
    } else {
        None
    };
    let mut retries = RETRY_DELAYS.iter();
    loop {
        if ctx.shutdown.drain.is_cancelled() {
            return outcome(FlowState::Skipped("stopped before start".into()));
        }
        ctx.board.set(&flow.name, "STARTING", None);
        let attempt = attempt(ctx, flow, handle.clone()).await;
        let FlowState::Failed(why) = &attempt.state else {
            return attempt;
        };
        let Some(delay) = retries.next() else {
            tracing::error!(flow = %flow.name, error = %why, "flow failed; retries spent");
            return attempt;
        };
        tracing::warn!(flow = %flow.name, error = %why, retry_in_s = delay.as_secs(),
            "flow failed; retrying");
        tokio::select! {
            _ = tokio::time::sleep(*delay) => {}
            _ = ctx.shutdown.drain.cancelled() => return attempt,
        }
    }
}

/// Resolves a sink flow's crash leftovers when the flow itself does not run (IDLE); a failure
/// is logged and left to the next start.
pub async fn recover_sink(ctx: &RunContext, flow: &Flow, handle: &FlowHandle) {
    if let Some(sink) = flows::sink_of(&ctx.pipeline, flow)
        && let Err(error) = sink.recover(&*ctx.store, handle).await
    {
        tracing::warn!(flow = %flow.name, %error, "cannot resolve sink files left by a crash");
    }
}

/// One attempt at running a flow.
async fn attempt(ctx: &RunContext, flow: &Flow, handle: FlowHandle) -> FlowOutcome {
    let outcome = |state, counters: Option<&Counters>| FlowOutcome {
        name: flow.name.clone(),
        state,
        counters: counters.map(Counters::snapshot).unwrap_or_default(),
        skipped: 0,
    };
    if let Some(plan) = crate::windows::table_plan(&ctx.pipeline, flow) {
        return window_over_table(ctx, flow, handle, plan).await;
    }
    let built = match flows::build(
        &ctx.pipeline,
        flow,
        ctx.store.clone(),
        handle.clone(),
        ctx.shutdown.give_up.clone(),
    ) {
        Ok(built) => built,
        Err(error) => return outcome(FlowState::Failed(error), None),
    };
    let counters = built.counters;
    if let Some(sink) = &built.sink
        && let Err(error) = sink.recover(&*ctx.store, &handle).await
    {
        return outcome(FlowState::Failed(error), None);
    }
    let tracker = built
        .watermark
        .map(|plan| crate::watermarks::start(plan, ctx.store.clone(), handle.clone(), &ctx.worker));
    let emitter = match built.windows {
        None => None,
        Some(plan) => match crate::windows::start(plan, ctx.store.clone(), handle.clone()).await {
            Ok(emitter) => Some(emitter),
            Err(error) => {
                if let Some(tracker) = tracker {
                    tracker.finish().await;
                }
                return outcome(FlowState::Failed(error), None);
            }
        },
    };
    // STARTING until the source runs (Pub/Sub answered), then RUNNING.
    ctx.board.set(&flow.name, "STARTING", Some(&counters));
    let (started, source_up) = tokio::sync::oneshot::channel();
    let announce = {
        let (board, name) = (ctx.board.clone(), flow.name.clone());
        tokio::spawn(async move {
            if source_up.await.is_ok() {
                tracing::info!(flow = %name, "flow started");
                board.set(&name, "RUNNING", None);
            }
        })
    };
    let _bar = built
        .progress
        .clone()
        .filter(|_| built.draw_progress)
        .and_then(|progress| crate::progress::draw(&flow.name, progress));
    let mut run = built.run;
    // A once flow on a subscription drains only when every replica reading it agrees.
    if flow.once
        && let Source::PubSub(source) = &flow.source
    {
        run.drain_agreement = Some(Arc::new(crate::drain_quorum::StoreDrainQuorum::new(
            ctx.store.clone(),
            handle.clone(),
            &ctx.worker,
            source.drain_idle,
        )));
    }
    let end = run
        .run_notifying(ctx.shutdown.drain.clone(), Some(started))
        .await;
    // It has run (and set RUNNING) if the source started; it must not set it after the end.
    announce.abort();
    let _ = announce.await;
    if let Some(tracker) = tracker {
        tracker.finish().await;
    }
    if let Some(emitter) = emitter {
        let input_ended = flow.once
            && matches!(
                &end,
                Ok(FlowEnd {
                    ended: Ended::Drained,
                    ..
                })
            )
            && built.progress.as_ref().and_then(|p| p.failure()).is_none();
        emitter.finish(input_ended).await;
    }
    let failure = built.progress.as_ref().and_then(|p| p.failure());
    let skipped = built
        .progress
        .as_ref()
        .map_or(0, |p| p.skipped.load(std::sync::atomic::Ordering::Relaxed));
    let outcome = |state, counters: Option<&Counters>| FlowOutcome {
        skipped,
        ..outcome(state, counters)
    };
    match (end, failure) {
        (Err(error), _) => outcome(FlowState::Failed(error.to_string()), Some(&counters)),
        (Ok(_), Some(failure)) => outcome(FlowState::Failed(failure), Some(&counters)),
        (Ok(FlowEnd { report, ended }), None) => {
            tracing::info!(flow = %flow.name, rows = report.rows, duplicates = report.duplicates,
                dead_letters = report.dead_letters, ?ended, "flow finished");
            let state = match ended {
                Ended::Drained => FlowState::Completed,
                Ended::Stopped => FlowState::Stopped,
            };
            if flow.once && state == FlowState::Completed {
                record_completion(&*ctx.store, &handle, &ctx.shutdown).await;
            }
            outcome(state, Some(&counters))
        }
    }
}

/// One attempt at a window over a `table` source (`windows::follow_table`): RUNNING once its
/// counts table exists; COMPLETED after its one emission, or STOPPED by a signal.
async fn window_over_table(
    ctx: &RunContext,
    flow: &Flow,
    handle: FlowHandle,
    plan: crate::windows::TableWindowPlan,
) -> FlowOutcome {
    let counters = Counters::new(&ctx.pipeline.name, &flow.name);
    ctx.board.set(&flow.name, "STARTING", Some(&counters));
    let (board, name) = (ctx.board.clone(), flow.name.clone());
    let ended = crate::windows::follow_table(
        plan,
        ctx.store.clone(),
        handle.clone(),
        &counters,
        ctx.shutdown.drain.clone(),
        move || {
            tracing::info!(flow = %name, "flow started");
            board.set(&name, "RUNNING", None);
        },
    )
    .await;
    let state = match ended {
        Ok(true) => {
            tracing::info!(flow = %flow.name, "windows emitted; flow finished");
            if flow.once {
                record_completion(&*ctx.store, &handle, &ctx.shutdown).await;
            }
            FlowState::Completed
        }
        Ok(false) => FlowState::Stopped,
        Err(error) => FlowState::Failed(error),
    };
    FlowOutcome {
        name: flow.name.clone(),
        state,
        counters: counters.snapshot(),
        skipped: 0,
    }
}

/// Records a once flow's completion, retrying while the store is unavailable, until it is
/// recorded or the run is stopped (then the flow simply runs again next time: what it
/// committed is skipped or deduplicated, so it ends at once).
async fn record_completion(store: &dyn Store, flow: &FlowHandle, shutdown: &Shutdown) {
    let mut backoff = Backoff::default();
    loop {
        match store.record_completion(flow).await {
            Ok(()) => return,
            Err(error) => {
                let delay = backoff.next_delay();
                tracing::warn!(flow = %flow.name, step = backoff.step(), %error,
                    "cannot record the flow's completion; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.drain.cancelled() => return,
                }
            }
        }
    }
}
