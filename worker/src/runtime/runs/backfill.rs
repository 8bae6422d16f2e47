//! `sluice backfill`: the intervals of a range run one after the other, oldest first, each a
//! run recorded `backfill` with its interval. Intervals not ended yet (their fire still to
//! come) are left to the schedule. The intervals that already have a completed run
//! (of any trigger) are left out, read here once and decided again as each run begins
//! (`sluice_store::RunStore::begin_run`: an interval is run once, so a backfill and a scheduler
//! catching up the same range never both run one). Guarantees: a backfill's runs never
//! overlap another run of the pipeline, in a pool too (each waits, recorded `queued`, for the
//! runs of live workers before it, `record.rs`); a backfill stops at the first interval that
//! fails (after its `retries`), so a later one never runs before it; a signal before the end
//! of its range is an error (`RunError::Interrupted`, exit 1); run again, it picks up the
//! intervals not completed. With `--rerun` every ended interval of the range runs again,
//! recorded `rerun`, each after its rows were cleared (`record.rs`); such a run is run whether
//! or not another run completed its interval.

use crate::runtime::kit::signals::Shutdown;
use crate::runtime::kit::store_retry::{self, Retry};
use crate::runtime::run_error::RunError;
use crate::runtime::updates::update_loop::Updates;
use sluice_engine::now_ms;
use sluice_pipeline::timetable::{Fire, Timetable};
use sluice_store::RunState;
use std::collections::{HashSet, VecDeque};

/// The most intervals one backfill runs.
pub const MOST_INTERVALS: usize = 100_000;

/// A backfill's range, `[from, to)` ms since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackfillRange {
    /// Inclusive start.
    pub from_ms: i64,
    /// Exclusive end.
    pub to_ms: i64,
    /// `--rerun`: completed intervals too, each cleared first (`record.rs`).
    pub rerun: bool,
}

/// The fires of `range` to run, oldest first: those due by now without a completed run (with
/// `rerun`, every one due by now).
pub async fn fires_to_run(
    updates: &Updates<'_>,
    timetable: &Timetable,
    range: BackfillRange,
    shutdown: &Shutdown,
) -> Result<VecDeque<Fire>, RunError> {
    let fires = timetable.fires_within(range.from_ms, range.to_ms, MOST_INTERVALS + 1);
    if fires.len() > MOST_INTERVALS {
        return Err(RunError::Invalid(format!(
            "the range holds more than {MOST_INTERVALS} intervals: backfill it in parts"
        )));
    }
    let pipeline = &updates.pipeline().name;
    let runs = store_retry::until_stored_within(
        "read the runs",
        Retry::WhileUnavailable,
        &shutdown.drain,
        updates.pipeline().give_up_after,
        || updates.store().runs(pipeline, MOST_INTERVALS * 4),
    )
    .await
    .map_err(RunError::Store)?;
    let done: HashSet<i64> = runs
        .iter()
        .filter(|run| run.state == RunState::Completed)
        .map(|run| run.fire_ms)
        .collect();
    let total = fires.len();
    // An interval not ended yet is the scheduler's: run now, it would read part of its data
    // and count as run.
    let now = now_ms();
    let (due, not_due): (Vec<Fire>, Vec<Fire>) = fires.into_iter().partition(|f| f.at_ms <= now);
    if let Some(first) = not_due.first() {
        tracing::warn!(
            not_due = not_due.len(),
            first_fire_ms = first.at_ms,
            "backfill: intervals that have not ended are left to the schedule"
        );
    }
    let to_run: VecDeque<Fire> = due
        .into_iter()
        .filter(|fire| range.rerun || !done.contains(&fire.at_ms))
        .collect();
    tracing::info!(
        intervals = total,
        to_run = to_run.len(),
        already_run = total - not_due.len() - to_run.len(),
        not_due = not_due.len(),
        "backfill: the range's intervals"
    );
    Ok(to_run)
}
