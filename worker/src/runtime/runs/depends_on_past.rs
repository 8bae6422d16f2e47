//! `schedule.depends_on_past` (Airflow's): a fire's run starts only once the run of the fire
//! before it completed. Before a fire's run begins, the runs recorded for the pipeline are
//! read: if the latest run of the latest earlier fire that has runs (a schedule's, catch-up's,
//! backfill's or rerun's) did not complete, the scheduler waits, looking again every
//! [`POLL`], until a run of it completes (`sluice backfill` of that interval, say) or a signal
//! comes. A fire with no earlier run recorded (the first) runs, as Airflow runs a task
//! instance without a previous one; a fire whose own run was begun already (taken over after
//! a worker died) goes on. Manual and update runs depend on nothing, but while a fire waits
//! the scheduler runs nothing else: they wait with it (the file refuses `on_update` with
//! `depends_on_past`), and the Pub/Sub sources kept open between runs are closed first.

use crate::runtime::flow::run_context::KeptSources;
use crate::runtime::kit::signals::Shutdown;
use crate::runtime::kit::store_retry::{self, Retry};
use crate::runtime::run_error::RunError;
use crate::runtime::runs::record::RunAsk;
use crate::runtime::updates::update_loop::Updates;
use sluice_store::{RunRecord, RunState, RunTrigger};
use std::time::Duration;

/// How often a waiting fire looks at the runs again.
pub const POLL: Duration = Duration::from_secs(2);
/// How many of the latest runs are read to find the fire before.
const RUNS_READ: usize = 1_000;

/// Whether `ask` may begin: at once without `depends_on_past`; else once the fire before it
/// completed (see the module docs). `false` when a signal came first.
pub async fn may_begin(
    updates: &Updates<'_>,
    shutdown: &Shutdown,
    ask: &RunAsk,
    kept: Option<&KeptSources>,
) -> Result<bool, RunError> {
    let pipeline = updates.pipeline();
    let depends = pipeline
        .schedule
        .as_ref()
        .is_some_and(|s| s.depends_on_past);
    if !depends || !ask.trigger.is_fire() {
        return Ok(true);
    }
    let mut said = false;
    loop {
        let runs = store_retry::until_stored_within(
            "read the runs",
            Retry::WhileUnavailable,
            &shutdown.drain,
            store_retry::run_patience(pipeline),
            || updates.store().runs(&pipeline.name, RUNS_READ),
        )
        .await
        .map_err(RunError::Store)?;
        let Some(waits_for) = unfinished_past(&runs, ask.fire_ms) else {
            return Ok(true);
        };
        if !said {
            tracing::warn!(
                fire_ms = ask.fire_ms,
                previous_fire_ms = waits_for,
                "depends_on_past: the run of the fire before this one did not complete; \
                 waiting for it (`sluice backfill` runs it again)"
            );
            said = true;
            // What they hold is given back rather than leased for as long as this waits.
            for source in kept.into_iter().flat_map(|kept| kept.values()) {
                source.close().await;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            () = shutdown.drain.cancelled() => return Ok(false),
        }
    }
}

/// The fire before `fire_ms` whose latest run did not complete, if it holds `fire_ms` back.
fn unfinished_past(runs: &[RunRecord], fire_ms: i64) -> Option<i64> {
    let of_the_timetable = |run: &&RunRecord| {
        run.trigger.is_fire() || matches!(run.trigger, RunTrigger::Backfill | RunTrigger::Rerun)
    };
    // Its own fire's run begun already: it goes on (a backfill of its interval does not count).
    if runs
        .iter()
        .any(|run| run.trigger.is_fire() && run.fire_ms == fire_ms)
    {
        return None;
    }
    let previous = runs
        .iter()
        .filter(of_the_timetable)
        .map(|run| run.fire_ms)
        .filter(|at| *at < fire_ms)
        .max()?;
    let latest = runs
        .iter()
        .filter(of_the_timetable)
        .filter(|run| run.fire_ms == previous)
        .max_by_key(|run| run.run_id)?;
    (latest.state != RunState::Completed).then_some(previous)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn run(fire_ms: i64, trigger: RunTrigger, state: RunState) -> RunRecord {
        RunRecord {
            run_id: fire_ms,
            fire_ms,
            interval: None,
            trigger,
            state,
            worker: "w".into(),
            started_at_ms: fire_ms,
            ended_at_ms: None,
            rows: Vec::new(),
            error: None,
        }
    }

    #[test]
    fn a_fire_waits_for_the_fire_before_it_to_complete() {
        use RunState::{Completed, Failed};
        use RunTrigger::{Backfill, Manual, Schedule};
        assert_eq!(unfinished_past(&[], 10), None, "the first fire runs");
        let failed = [run(5, Schedule, Failed), run(3, Schedule, Completed)];
        assert_eq!(unfinished_past(&failed, 10), Some(5));
        let mut backfill = run(5, Backfill, Completed);
        backfill.run_id = 6;
        let fixed = [run(5, Schedule, Failed), backfill];
        assert_eq!(unfinished_past(&fixed, 10), None, "a backfill completed it");
        let manual = [run(8, Manual, Failed), run(5, Schedule, Completed)];
        assert_eq!(
            unfinished_past(&manual, 10),
            None,
            "a manual run is no fire"
        );
        let begun = [
            run(10, Schedule, RunState::Running),
            run(5, Schedule, Failed),
        ];
        assert_eq!(unfinished_past(&begun, 10), None, "a begun fire goes on");
    }
}
