//! A failed run of a scheduled pipeline runs again (`schedule.retries`, after `retry_delay`
//! each time), as the same run with the same interval, before it is recorded failed. Each
//! attempt runs every flow again: what the earlier attempts committed is skipped or
//! deduplicated, so a retry writes only what is missing; the run's recorded rows are the last
//! attempt's. A signal during the wait ends the retries, and the run is then ended as a
//! stopped run is (a fire's stays `running` for the next scheduler, which retries afresh).
//! The wait answers no control request (one asked meanwhile waits for it).

use crate::runtime::flow::outcome::{FlowOutcome, FlowState};
use crate::runtime::flow::run_context::RunScope;
use crate::runtime::kit::signals::Shutdown;
use crate::runtime::run_error::RunError;
use crate::runtime::updates::update_loop::Updates;

/// Runs the flows of one run (`this_run`), again after each failure while retries are left.
pub async fn run_with_retries(
    updates: &mut Updates<'_>,
    this_run: &Shutdown,
    scope: RunScope,
) -> Result<Vec<FlowOutcome>, RunError> {
    let (retries, delay) = updates
        .pipeline()
        .schedule
        .as_ref()
        .map_or((0, std::time::Duration::ZERO), |s| {
            (s.retries, s.retry_delay)
        });
    let mut attempt = 0;
    loop {
        let outcomes = updates.run(this_run, scope.clone()).await?;
        let failed: Vec<&str> = outcomes
            .iter()
            .filter(|o| matches!(o.state, FlowState::Failed(_)))
            .map(|o| o.name.as_str())
            .collect();
        if failed.is_empty() || attempt >= retries || this_run.drain.is_cancelled() {
            return Ok(outcomes);
        }
        attempt += 1;
        tracing::warn!(attempt, retries, retry_in_s = delay.as_secs(), failed = ?failed,
            "the run failed; running it again (schedule.retries)");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = this_run.drain.cancelled() => return Ok(outcomes),
        }
    }
}
