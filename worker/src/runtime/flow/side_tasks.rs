//! A built flow's run with the tasks beside it, which this file alone starts and ends, in a
//! fixed order.
//!
//! Before the run: the sink's crash leftovers are resolved (a failure fails the attempt, nothing
//! started), then the watermark tracker starts (`watermarks.rs`), then the window emitter
//! (`windows.rs`; if it cannot start, the tracker is finished and the attempt fails), then the
//! announcer (the flow is STARTING until its source runs, then RUNNING) and the progress bar
//! of a file flow (`progress.rs`); a once flow on a subscription drains only when every
//! replica reading it agrees (`runtime/pool/drain_quorum.rs`).
//!
//! After the run: the announcer is stopped first (it never sets RUNNING after the end), then
//! the tracker finishes (its last counts stored), then the emitter (a last emission: every
//! window when a once flow drained all its input), and the bar is cleared last.

use crate::runtime::flow::board::FlowPhase;
use crate::runtime::flow::build::BuiltFlow;
use crate::runtime::flow::outcome::FlowState;
use crate::runtime::flow::run_context::RunContext;
use crate::runtime::flow::{progress, watermarks, windows};
use crate::runtime::pool::drain_quorum::StoreDrainQuorum;
use sluice_engine::{Counters, Ended, FlowEnd, FlowError};
use sluice_pipeline::{Flow, Source};
use sluice_store::FlowHandle;
use std::sync::Arc;

/// How a flow's run went.
pub struct Ran {
    /// How it ended.
    pub state: FlowState,
    /// Its counters, once it was built and its side tasks started.
    pub counters: Option<Counters>,
    /// Records of a bounded source not delivered because the flow had committed them before.
    pub skipped: u64,
    /// Whether a failure is worth another attempt: not a failed expectation, which the same
    /// records would fail again, nor a source that cannot start without an operator (a
    /// missing subscription, a refused identity, a triggered run's give-up).
    pub retry: bool,
}

/// Runs `built` (the run of `flow` of `ctx`'s update, stored under `handle`) with its side
/// tasks.
pub async fn run(ctx: &RunContext, flow: &Flow, handle: &FlowHandle, built: BuiltFlow) -> Ran {
    let failed = |why| Ran {
        state: FlowState::Failed(why),
        counters: None,
        skipped: 0,
        retry: true,
    };
    let counters = built.counters;
    if let Some(sink) = &built.sink
        && let Err(error) = sink.recover(&*ctx.store, handle).await
    {
        return failed(error);
    }
    let tracker = watermarks::start(
        &ctx.pipeline,
        flow,
        &counters,
        ctx.store.clone(),
        handle.clone(),
        &ctx.worker,
    );
    let emitter = match &tracker {
        None => Ok(None),
        Some(tracker) => {
            windows::start(
                &ctx.pipeline,
                flow,
                tracker.watermark(),
                ctx.store.clone(),
                handle.clone(),
            )
            .await
        }
    };
    let emitter = match emitter {
        Ok(emitter) => emitter,
        Err(error) => {
            if let Some(tracker) = tracker {
                tracker.finish().await;
            }
            return failed(error);
        }
    };
    // STARTING until the source runs (Pub/Sub answered), then RUNNING.
    ctx.board
        .set(&flow.name, FlowPhase::Starting, Some(&counters));
    let (started, source_up) = tokio::sync::oneshot::channel();
    let announce = {
        let (board, name) = (ctx.board.clone(), flow.name.clone());
        tokio::spawn(async move {
            if source_up.await.is_ok() {
                tracing::info!(flow = %name, "flow started");
                board.set(&name, FlowPhase::Running, None);
            }
        })
    };
    let _bar = built
        .progress
        .clone()
        .filter(|_| built.draw_progress)
        .and_then(|progress| progress::draw(&flow.name, progress));
    let mut run = built.run;
    // A once flow on a subscription drains only when every replica reading it agrees.
    if flow.once
        && let Source::PubSub(source) = &flow.source
    {
        run.drain_agreement = Some(Arc::new(StoreDrainQuorum::new(
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
    let gave_up = built.progress.as_ref().is_some_and(|p| p.gave_up());
    let retry = match &end {
        Err(FlowError::Expectation(_) | FlowError::GaveUp(_)) => false,
        Err(FlowError::Source(error)) => !error.is_permanent(),
        _ => !gave_up,
    };
    let state = match (end, failure) {
        (Err(error), _) => FlowState::Failed(error.to_string()),
        (Ok(_), Some(failure)) => FlowState::Failed(failure),
        (Ok(FlowEnd { report, ended }), None) => {
            // Duplicates as the summary and the store count them: both tiers'.
            let seen = counters.snapshot();
            tracing::info!(flow = %flow.name, rows = report.rows,
                duplicates = seen.duplicates_memory + seen.duplicates_store,
                duplicates_memory = seen.duplicates_memory, duplicates_store = seen.duplicates_store,
                dead_letters = report.dead_letters, ?ended, "flow finished");
            match ended {
                Ended::Drained => FlowState::Completed,
                Ended::Stopped => FlowState::Stopped,
            }
        }
    };
    Ran {
        state,
        counters: Some(counters),
        skipped,
        retry,
    }
}
