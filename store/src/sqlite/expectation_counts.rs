//! Expectation counts on SQLite (see [`crate::CommitBatch::verdicts`]): added in the commit's
//! transaction for the entries whose key is new, read for `sluice status`.

use crate::{CommitBatch, ExpectationCount, StoreError};
use rusqlite::{Connection, Transaction, params};

/// Adds the batch's verdicts of the entries `written` (new keys) to the flow's counts.
pub(super) fn add(
    tx: &Transaction<'_>,
    batch: &CommitBatch,
    written: &[bool],
) -> Result<(), StoreError> {
    let Some(query) = batch.typed.as_deref() else {
        return Ok(());
    };
    for (j, (name, _)) in query.expectations.iter().enumerate() {
        let (mut passed, mut violated) = (0i64, 0i64);
        for verdict in batch
            .verdicts
            .iter()
            .zip(written)
            .filter(|(_, new)| **new)
            .map(|(verdict, _)| verdict)
        {
            match verdict.get(j) {
                Some(true) => violated += 1,
                Some(false) => passed += 1,
                None => {}
            }
        }
        if passed + violated == 0 {
            continue;
        }
        tx.prepare_cached(
            "INSERT INTO sluice_expectation_counts (flow_id, expectation, passed, violated)
             VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (flow_id, expectation) DO UPDATE SET
                 passed = passed + excluded.passed, violated = violated + excluded.violated",
        )?
        .execute(params![batch.flow.id, name, passed, violated])?;
    }
    Ok(())
}

/// The flow's counts, by expectation name.
pub(super) fn read(conn: &Connection, flow_id: i64) -> Result<Vec<ExpectationCount>, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT expectation, passed, violated FROM sluice_expectation_counts
         WHERE flow_id = ?1 ORDER BY expectation",
    )?;
    let rows = statement.query_map([flow_id], |row| {
        Ok(ExpectationCount {
            expectation: row.get(0)?,
            passed: u64::try_from(row.get::<_, i64>(1)?).unwrap_or_default(),
            violated: u64::try_from(row.get::<_, i64>(2)?).unwrap_or_default(),
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}
