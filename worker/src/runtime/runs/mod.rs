//! The runs of a triggered pipeline: one, or one at each fire of its timetable (or of an
//! `on_update` table it reads), under the pool's `scheduler` lease, each recorded in
//! `sluice_runs`. Runs never overlap, and each fire runs once.

mod lease;
mod record;
mod table_updates;
pub(super) mod timetable;
