//! A rerun's first step (`sluice backfill --rerun`): before the run's flows start, the rows
//! each flow wrote into its table with an event time in the run's interval are deleted with
//! their ledger keys (`sluice_store::FlowStore::clear_interval`), so the run writes its
//! interval's records again, as they are now. The command refuses pipelines where that would
//! not replace what the interval wrote (`commands/backfill.rs`). A `once` flow is not run
//! again by a run (its completion stands), so its rows are left. A rerun that fails or stops
//! after this leaves the interval's rows missing until a `--rerun` of it completes.

use crate::runtime::kit::signals::Shutdown;
use crate::runtime::kit::store_retry::{self, Retry};
use crate::runtime::run_error::RunError;
use crate::runtime::updates::update_loop::Updates;
use sluice_pipeline::TargetKind;
use sluice_pipeline::timetable::DataInterval;
use sluice_store::table_name;

/// Deletes the rows of `interval` in every flow's table (see the module docs).
pub async fn clear(
    updates: &Updates<'_>,
    shutdown: &Shutdown,
    interval: DataInterval,
) -> Result<(), RunError> {
    let pipeline = updates.pipeline();
    for (flow, handle) in pipeline.flows.iter().zip(updates.handles()) {
        let writes_rows = !flow.once
            && pipeline
                .targets
                .iter()
                .any(|t| t.name == flow.target && matches!(t.kind, TargetKind::Table));
        if !writes_rows {
            continue;
        }
        let table = table_name(&pipeline.name, &flow.target).map_err(RunError::Store)?;
        let cleared = store_retry::until_stored_within(
            "clear the interval's rows",
            Retry::WhileUnavailable,
            &shutdown.drain,
            store_retry::run_patience(pipeline),
            || {
                updates
                    .store()
                    .clear_interval(handle, &table, interval.start_ms, interval.end_ms)
            },
        )
        .await
        .map_err(RunError::Store)?;
        tracing::info!(flow = %flow.name, rows = cleared, start_ms = interval.start_ms,
            end_ms = interval.end_ms, "rerun: the interval's rows deleted");
    }
    Ok(())
}
