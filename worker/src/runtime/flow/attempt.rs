//! One attempt at running a flow (`flow_task.rs` retries it): a window over a `table` source
//! follows its table (`windows.rs`: RUNNING once its counts table exists; COMPLETED after its
//! one emission, or STOPPED by a signal); any other flow is built (`build.rs`) and run with its
//! side tasks (`side_tasks.rs`). A once flow that completed records it.
//!
//! # Guarantees
//!
//! * **Completion is persistent.** A once flow that drains records its completion in the store
//!   before its dependents are released, so a restart (of this replica or any other) finds it
//!   `IDLE` and resumes at the first flow not completed. A once flow on a subscription drains
//!   only when every replica reading it agrees and a crashed reader's messages have had the
//!   time to come back (`runtime/pool/drain_quorum.rs`).

use crate::runtime::flow::board::FlowPhase;
use crate::runtime::flow::build;
use crate::runtime::flow::outcome::{FlowOutcome, FlowState};
use crate::runtime::flow::run_context::RunContext;
use crate::runtime::flow::side_tasks::{self, Ran};
use crate::runtime::flow::windows;
use crate::runtime::kit::store_retry::{self, Retry};
use sluice_engine::{Counters, JsonlSink};
use sluice_pipeline::Flow;
use sluice_store::FlowHandle;
use std::path::Path;
use std::sync::Arc;

/// One attempt at running `flow` of `ctx`'s update, writing to its `sink` target's files
/// when it has one; with whether a failure is worth another attempt.
pub async fn run(
    ctx: &RunContext,
    flow: &Flow,
    handle: FlowHandle,
    sink: Option<&Path>,
) -> (FlowOutcome, bool) {
    let Ran {
        mut state,
        counters,
        skipped,
        mut retry,
    } = if let Some(plan) = windows::table_plan(&ctx.pipeline, flow) {
        let counters = Counters::new(&ctx.pipeline.name, &flow.name);
        ctx.board
            .set(&flow.name, FlowPhase::Starting, Some(&counters));
        let (board, name) = (ctx.board.clone(), flow.name.clone());
        let ended = windows::follow_table(
            plan,
            ctx.store.clone(),
            handle.clone(),
            &counters,
            ctx.shutdown.drain.clone(),
            move || {
                tracing::info!(flow = %name, "flow started");
                board.set(&name, FlowPhase::Running, None);
            },
        )
        .await;
        let state = match ended {
            Ok(true) => {
                tracing::info!(flow = %flow.name, "windows emitted; flow finished");
                FlowState::Completed
            }
            Ok(false) => FlowState::Stopped,
            Err(error) => FlowState::Failed(error),
        };
        Ran {
            state,
            counters: Some(counters),
            skipped: 0,
            retry: true,
        }
    } else {
        let sink = sink.map(|path| Arc::new(JsonlSink::new(path, &flow.name)));
        match build::build(ctx, flow, handle.clone(), sink) {
            Ok(built) => side_tasks::run(ctx, flow, &handle, built).await,
            Err(error) => Ran {
                state: FlowState::Failed(error),
                counters: None,
                skipped: 0,
                retry: true,
            },
        }
    };
    if flow.once && state == FlowState::Completed {
        // Retried whatever the error until it is recorded or the run is stopped (then the
        // flow simply runs again next time: what it committed is skipped or deduplicated).
        let what = format!("record the completion of flow {}", handle.name);
        let recorded = store_retry::until_stored_within(
            &what,
            Retry::Always,
            &ctx.shutdown.drain,
            ctx.pipeline.give_up_after,
            || ctx.store.record_completion(&handle),
        )
        .await;
        match recorded {
            Err(error) if !ctx.shutdown.drain.is_cancelled() => {
                // Its dependents wait for a recorded completion: the run fails instead.
                tracing::error!(flow = %handle.name, %error,
                    "the flow's completion could not be recorded; it runs again next time");
                state = FlowState::Failed(format!("its completion could not be recorded: {error}"));
                retry = false;
            }
            Err(error) => tracing::warn!(flow = %handle.name, %error,
                "the flow's completion is not recorded (stopped first); it runs again next time"),
            Ok(_) => {}
        }
    }
    let outcome = FlowOutcome {
        name: flow.name.clone(),
        state,
        counters: counters
            .as_ref()
            .map(Counters::snapshot)
            .unwrap_or_default(),
        skipped,
    };
    (outcome, retry)
}
