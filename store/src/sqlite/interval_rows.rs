//! A rerun's clearing of one interval (`sluice backfill --rerun`, `RunStore` of the worker's
//! runs): the rows a flow wrote into its table whose event time lies in `[from, to)`, and
//! their ledger keys, deleted in one transaction, so the interval's records are written again
//! by the run that follows. Dead letters (which keep no event time), counters and everything
//! else of the flow stay.

use super::typed;
use crate::schema::check_table;
use crate::{FlowHandle, StoreError};
use rusqlite::{Connection, TransactionBehavior, params};

/// Deletes the rows of `flow` in `table` with an event time in `[from_ms, to_ms)` and their
/// ledger keys; returns how many rows went.
pub(super) fn clear_interval(
    conn: &mut Connection,
    flow: &FlowHandle,
    table: &str,
    from_ms: i64,
    to_ms: i64,
) -> Result<u64, StoreError> {
    check_table(table)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let e = typed::envelope(&tx, table)?;
    // `table` is a validated identifier (checked above); values are bound.
    let within = format!(
        "FROM \"{table}\" WHERE {flow} = ?1 AND {event} >= ?2 AND {event} < ?3",
        flow = e.flow,
        event = e.event_time
    );
    tx.execute(
        &format!(
            "DELETE FROM sluice_ledger WHERE flow_id = ?4 AND key IN (SELECT {} {within})",
            e.dedup_key
        ),
        params![&*flow.name, from_ms, to_ms, flow.id],
    )?;
    let rows = tx.execute(
        &format!("DELETE {within}"),
        params![&*flow.name, from_ms, to_ms],
    )?;
    tx.commit()?;
    Ok(rows as u64)
}
