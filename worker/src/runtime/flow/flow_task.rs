//! One flow's part in an update (the executor, `executor.rs`, runs one such task per flow):
//! IDLE when it is a once flow recorded complete earlier, else started once its predecessors
//! succeeded, in a slot of bounded work, and attempted (`attempt.rs`) with retries (SPEC §6).
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

use crate::runtime::flow::attempt;
use crate::runtime::flow::board::FlowPhase;
use crate::runtime::flow::outcome::{FlowOutcome, FlowState};
use crate::runtime::flow::run_context::RunContext;
use crate::runtime::flow::sinks;
use sluice_engine::{JsonlSink, Snapshot};
use sluice_pipeline::{Flow, Mode};
use sluice_store::FlowHandle;
use std::time::Duration;
use tokio::sync::watch;

/// Delays before each retry of a failed flow; when they are spent the flow is FAILED.
pub const RETRY_DELAYS: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
];

/// Runs `flow` of `ctx`'s update to its end: IDLE when `already_complete` (a once flow recorded
/// complete earlier), else once its `predecessors` (their names, and their ends:
/// `Some(success)`) have succeeded, with retries.
pub async fn run(
    ctx: &RunContext,
    flow: &Flow,
    handle: FlowHandle,
    predecessors: Vec<(String, watch::Receiver<Option<bool>>)>,
    already_complete: bool,
) -> FlowOutcome {
    let outcome = |state| FlowOutcome {
        name: flow.name.clone(),
        state,
        counters: Snapshot::default(),
        skipped: 0,
    };
    let sink = sinks::sink_target(&ctx.pipeline, flow);
    if already_complete {
        tracing::info!(flow = %flow.name, "once flow completed earlier; not re-read");
        // A sink file its last run left behind is still published; a failure is logged and
        // left to the next start.
        if let Some(path) = sink
            && let Err(error) = JsonlSink::new(path, &flow.name)
                .recover(&*ctx.store, &handle)
                .await
        {
            tracing::warn!(flow = %flow.name, %error, "cannot resolve sink files left by a crash");
        }
        return outcome(FlowState::Idle);
    }
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
        ctx.board.set(&flow.name, FlowPhase::Starting, None);
        let (attempt, retry) = attempt::run(ctx, flow, handle.clone(), sink).await;
        let FlowState::Failed(why) = &attempt.state else {
            return attempt;
        };
        if !retry {
            tracing::error!(flow = %flow.name, error = %why,
                "flow failed; not retried (it would fail the same way)");
            return attempt;
        }
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
