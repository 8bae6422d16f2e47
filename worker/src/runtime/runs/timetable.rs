//! The runs of a pipeline, one after the other: a continuous pipeline's one update until a
//! signal; a triggered pipeline's one run, then exit (no `schedule:`), or a run at each fire of
//! its schedule until a signal (`schedule:`, SPEC §7, with the timetable semantics of
//! `sluice_pipeline::timetable`). Every run of a triggered pipeline is recorded in `sluice_runs`
//! with what fired it, its data interval, its state and the rows of each flow (`record.rs`,
//! `run_end.rs`). What runs next is decided by `next_run.rs`, from what is due (`due.rs`);
//! between runs the worker waits in `between_runs.rs`.
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
//!   [`KEEP_OPEN_WITHIN`](crate::runtime::runs::between_runs::KEEP_OPEN_WITHIN) reads the same
//!   streams in its next run (`KeptOpen`): what arrives between runs waits, leased, for it;
//!   what a closing stream held would otherwise come back only after its ack deadline, after a
//!   run that opened new streams may have ended idle.
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

use crate::runtime::flow::outcome::{FlowOutcome, FlowState};
use crate::runtime::kit::signals::Shutdown;
use crate::runtime::run_error::RunError;
use crate::runtime::runs::backfill::{self, BackfillRange};
use crate::runtime::runs::lease::SchedulerLease;
use crate::runtime::runs::next_run::{Next, NextRuns, Plan};
use crate::runtime::runs::record;
use crate::runtime::updates::update_loop::Updates;
use sluice_engine::KeptOpen;
use sluice_pipeline::timetable::Timetable;
use sluice_pipeline::{Mode, Source};
use sluice_store::RunTrigger;
use std::sync::Arc;

/// Runs the pipeline until its runs end: a continuous pipeline's one update until a signal, a
/// triggered pipeline's one run, its runs on its schedule until a signal, or (`backfill`) the
/// intervals of a range not run yet, until one fails. Returns the
/// outcomes of the last run, when it ended the worker's runs (nothing when a signal came
/// between runs).
pub async fn drive(
    updates: &mut Updates<'_>,
    shutdown: &Shutdown,
    backfill: Option<BackfillRange>,
) -> Result<Vec<FlowOutcome>, RunError> {
    let pipeline = updates.pipeline();
    let plan = match (&pipeline.schedule, pipeline.mode, backfill) {
        (Some(schedule), _, Some(range)) => {
            let timetable = Timetable::new(schedule).map_err(RunError::Invalid)?;
            Plan::Backfill {
                fires: backfill::fires_to_run(updates, &timetable, range, shutdown).await?,
                trigger: if range.rerun {
                    RunTrigger::Rerun
                } else {
                    RunTrigger::Backfill
                },
            }
        }
        (None, _, Some(_)) => {
            return Err(RunError::Invalid(
                "a backfill runs the intervals of a schedule: the pipeline has no `schedule:`"
                    .to_owned(),
            ));
        }
        (Some(schedule), _, None) => {
            let timetable = Timetable::new(schedule).map_err(RunError::Invalid)?;
            let kept = Arc::new(
                pipeline
                    .flows
                    .iter()
                    .filter(|f| matches!(f.source, Source::PubSub(_)))
                    .map(|f| (f.name.clone(), KeptOpen::new()))
                    .collect(),
            );
            let lease =
                SchedulerLease::start(updates.store().clone(), &pipeline.name, updates.worker());
            Plan::Scheduled {
                timetable,
                lease,
                kept,
            }
        }
        (None, Mode::Triggered, None) => Plan::Once,
        (None, Mode::Continuous, None) => Plan::Continuous,
    };
    let stop_at_failure = matches!(plan, Plan::Backfill { .. });
    if pipeline.mode == Mode::Triggered {
        crate::runtime::runs::run_end::register_counts(&pipeline.name);
    }
    let mut runs = NextRuns::new(plan, pipeline.schedule.as_ref());
    let mut outcomes = Vec::new();
    let mut interrupted = false;
    loop {
        match runs.next(updates, shutdown).await? {
            Next::Run(run) => {
                outcomes = record::run(updates, shutdown, run).await?;
                // No outcomes: not run (stopped while queued, or its interval found run).
                interrupted = outcomes.is_empty()
                    || outcomes
                        .iter()
                        .any(|o| matches!(o.state, FlowState::Stopped | FlowState::Skipped(_)));
                let failed = outcomes
                    .iter()
                    .any(|o| matches!(o.state, FlowState::Failed(_)));
                if stop_at_failure && failed {
                    tracing::error!("backfill: an interval failed; the later ones are not run");
                    break;
                }
            }
            Next::Stop {
                last_outcomes_stand,
            } => {
                if !last_outcomes_stand {
                    outcomes = Vec::new();
                }
                break;
            }
        }
    }
    let backfill_left = runs.backfill_left();
    runs.stop().await;
    // A backfill a signal stopped has intervals left: not a success.
    if let Some(left) = backfill_left.filter(|_| shutdown.drain.is_cancelled())
        && (left > 0 || interrupted)
    {
        return Err(RunError::Interrupted(format!(
            "backfill stopped by a signal before the end of its range: {left} interval(s) not \
             begun{}; `sluice backfill` again runs the intervals not completed",
            if interrupted {
                ", and the last one begun may not have completed"
            } else {
                ""
            }
        )));
    }
    Ok(outcomes)
}
