//! How a recorded run ended, as `sluice_runs` keeps it: its state (failed when a flow failed;
//! `stopped` for a manual or update run a signal stopped), each flow's rows and why flows
//! failed; counted in `sluice_runs_total{state}`. A fire's run a signal or the loss of the lease
//! stopped is not ended: it stays running for the next scheduler to finish.

use crate::runtime::flow::outcome::{FlowOutcome, FlowState};
use crate::runtime::kit::signals::Shutdown;
use crate::runtime::kit::store_retry::{self, Retry};
use sluice_store::{RunEnd, RunRecord, RunState, RunStore, RunTrigger};

/// A recorded run that has ended.
pub struct Ended<'a> {
    /// The pipeline.
    pub pipeline: &'a str,
    /// Its record.
    pub record: &'a RunRecord,
    /// Why it ran.
    pub trigger: RunTrigger,
    /// It was stopped (a signal, or the loss of the scheduler lease) before its end.
    pub stopped: bool,
    /// Its flows' outcomes.
    pub outcomes: &'a [FlowOutcome],
    /// How long the store is waited for (a triggered run's `give_up_after`; `None`: as long
    /// as the shutdown allows).
    pub give_up_after: Option<std::time::Duration>,
}

/// Records how the run ended as `worker`'s, retried until the drain gives up (a stopped run's
/// end is recorded while it drains too); logged, not returned, when it could not be (the store
/// did not answer, or the run is another replica's now).
pub async fn record(store: &dyn RunStore, worker: &str, ended: Ended<'_>, shutdown: &Shutdown) {
    let Ended {
        pipeline,
        record,
        trigger,
        stopped,
        outcomes,
        give_up_after,
    } = ended;
    let state = if !stopped {
        if outcomes
            .iter()
            .any(|o| matches!(o.state, FlowState::Failed(_)))
        {
            RunState::Failed
        } else {
            RunState::Completed
        }
    } else if trigger.is_fire() {
        tracing::info!(
            run = record.run_id,
            "run stopped before its end; the next scheduler finishes it"
        );
        return;
    } else {
        RunState::Stopped
    };
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
    let recorded = store_retry::until_stored_within(
        "record the run's end",
        Retry::WhileUnavailable,
        &shutdown.give_up,
        give_up_after,
        || store.end_run(record.run_id, worker, &run_end),
    )
    .await;
    match recorded {
        Ok(true) => {
            tracing::info!(run = record.run_id, state = state.name(), "run ended");
            count(pipeline, state);
        }
        Ok(false) => tracing::warn!(
            run = record.run_id,
            "the run is another worker's now; its end is theirs to record"
        ),
        Err(error) => {
            tracing::warn!(run = record.run_id, %error, "could not record the run's end");
        }
    }
}

/// Counts a run that ended `state` in `sluice_runs_total{pipeline, state}`.
pub fn count(pipeline: &str, state: RunState) {
    metrics::counter!("sluice_runs_total", "pipeline" => pipeline.to_owned(),
        "state" => state.name())
    .increment(1);
}

/// Shows `sluice_runs_total` at 0 for the ends an alert watches before any run ended, so that
/// the first failure is an increase (`SluiceRunFailed`).
pub fn register_counts(pipeline: &str) {
    for state in [RunState::Completed, RunState::Failed] {
        metrics::counter!("sluice_runs_total", "pipeline" => pipeline.to_owned(),
            "state" => state.name())
        .increment(0);
    }
}
