//! What a worker runs, one run after the other: a continuous pipeline's one update; a triggered
//! pipeline's one run, or one at each fire of its timetable (or of an `on_update` table it
//! reads), under the pool's `scheduler` lease, each recorded in `sluice_runs`. Runs never
//! overlap, and each fire runs once.

pub(crate) mod backfill;
mod between_runs;
mod depends_on_past;
mod due;
mod lease;
mod next_run;
mod record;
mod rerun;
mod retries;
mod run_end;
pub(crate) mod schedule_agreement;
mod table_updates;
pub(super) mod timetable;
