//! One batch, one SQLite transaction: ledger keys first (multi-row upsert with `RETURNING`, so
//! the ledger itself says which keys are new), then target rows for the new keys only (or the
//! caller's own work instead, `crate::TransactionWork`), then dead letters (and their outbox rows, for a pipeline that publishes them) and flow counters, and, for a flow with a watermark, its messages settled. Multi-row
//! statements amortise SQLite's per-statement cost, which dominates at these row sizes. A batch
//! past its `commit_by_ms` is refused (`StoreError::Stale`) once the write lock is held, and a
//! reading flow's batch whose position moved (`StoreError::Moved`) before anything is written.
//! Target rows are numbered in commit order (`seq`, see `feed.rs`). A typed query's columns
//! added while running (`TypedQuery::grown`) are added to the table first, in the same
//! transaction.

use crate::schema::table_name;
use crate::{CommitBatch, CommitOutcome, Effect, PROGRESS_BUCKET_MS, StoreError};
use rusqlite::types::ToSql;
use rusqlite::{Connection, TransactionBehavior, params};
use std::collections::HashMap;

/// Rows per multi-row statement: 8 parameters a row stays far below SQLite's variable limit
/// (32 766), and larger statements gain nothing measurable.
const ROWS_PER_STATEMENT: usize = 128;

/// `(?, ?, ?), (?, ?, ?), ...` for `rows` rows of `columns` columns.
fn placeholders(rows: usize, columns: usize) -> String {
    let row = format!("({})", vec!["?"; columns].join(", "));
    vec![row; rows].join(", ")
}

/// Commits `batch` in one transaction; see the module docs.
pub(crate) fn commit(
    conn: &mut Connection,
    batch: &CommitBatch,
) -> Result<CommitOutcome, StoreError> {
    let dead_letter = table_name(&batch.flow.pipeline, "dead_letter")?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Checked with the write lock held, on the host's clock (the caller's too): a batch that
    // arrives late is refused before anything is decided.
    if batch
        .commit_by_ms
        .is_some_and(|by| crate::local_clock::now_ms() > by)
    {
        return Err(StoreError::Stale);
    }
    if let Some(advance) = &batch.position {
        super::feed::advance(&tx, batch.flow.id, advance)?;
    }
    // Columns a new schema revision added while the flow runs: this transaction adds those
    // the table lacks before it writes with them.
    if let Some(query) = batch.typed.as_ref().filter(|q| !q.grown.is_empty()) {
        let columns: Vec<_> = query.select.iter().map(|(c, _)| c.clone()).collect();
        super::typed::evolve(&tx, &batch.table, &columns)?;
    }
    let entries = &batch.entries;
    let mut written = vec![false; entries.len()];

    // 1. Ledger. An expired key that was not purged yet counts as absent: it is taken over.
    for (chunk_index, chunk) in entries.chunks(ROWS_PER_STATEMENT).enumerate() {
        let sql = format!(
            "INSERT INTO sluice_ledger (flow_id, key, expires_at) VALUES {}
             ON CONFLICT (flow_id, key) DO UPDATE SET expires_at = excluded.expires_at
             WHERE sluice_ledger.expires_at <= ? RETURNING key",
            placeholders(chunk.len(), 3)
        );
        let keys: Vec<&str> = chunk.iter().map(|e| e.key.as_str()).collect();
        let mut values: Vec<&dyn ToSql> = Vec::with_capacity(chunk.len() * 3 + 1);
        for key in &keys {
            values.extend([&batch.flow.id as &dyn ToSql, key, &batch.expires_at_ms]);
        }
        values.push(&batch.now_ms);
        let mut statement = tx.prepare_cached(&sql)?;
        // Keys the ledger accepted, with how many entries of the chunk may claim each (one: a
        // key repeated within a chunk is new at most once, at its first entry).
        let mut accepted: HashMap<String, usize> = HashMap::new();
        for key in statement.query_map(values.as_slice(), |row| row.get::<_, String>(0))? {
            *accepted.entry(key?).or_default() += 1;
        }
        let offset = chunk_index * ROWS_PER_STATEMENT;
        for (i, entry) in chunk.iter().enumerate() {
            if let Some(left) = accepted
                .get_mut(entry.key.as_str())
                .filter(|left| **left > 0)
            {
                *left -= 1;
                written[offset + i] = true;
            }
        }
    }

    // 2. Target rows of the new keys (none when the caller's work is the effect).
    let new_rows: Vec<(usize, i64)> = entries
        .iter()
        .enumerate()
        .filter(|(i, _)| written[*i] && batch.work.is_none())
        .filter_map(|(i, e)| match e.effect {
            Effect::Row { event_time_ms, .. } => Some((i, event_time_ms)),
            Effect::DeadLetter { .. } => None,
        })
        .collect();
    // Numbered in commit order: this transaction is the only writer meanwhile.
    let mut seq = if new_rows.is_empty() {
        0
    } else {
        let count = new_rows.len() as i64;
        let last: i64 = tx.query_row(
            "INSERT INTO sluice_table_seqs (table_name, last) VALUES (?1, ?2)
             ON CONFLICT (table_name) DO UPDATE SET last = last + excluded.last RETURNING last",
            params![&*batch.table, count],
            |row| row.get(0),
        )?;
        last - count
    };
    // A typed table's rows go through the flow's query; `where:` may leave some out.
    let mut filtered = 0u64;
    if let Some(query) = &batch.typed {
        let indexes: Vec<usize> = new_rows.iter().map(|(i, _)| *i).collect();
        let rows = super::typed::insert_rows(&tx, batch, query, &indexes, seq)?;
        filtered = indexes.len() as u64 - rows;
    }
    let envelope_rows = if batch.typed.is_some() {
        &[][..]
    } else {
        &new_rows[..]
    };
    for chunk in envelope_rows.chunks(ROWS_PER_STATEMENT) {
        let sql = format!(
            "INSERT INTO \"{}\" (dedup_key, message_id, publish_time, event_time, attributes,
             data, flow, committed_at, seq) VALUES {}",
            batch.table,
            placeholders(chunk.len(), 9)
        );
        let flow: &str = &batch.flow.name;
        let keys: Vec<&str> = chunk
            .iter()
            .map(|(i, _)| entries[*i].key.as_str())
            .collect();
        let data: Vec<&[u8]> = chunk
            .iter()
            .map(|(i, _)| &entries[*i].message.data[..])
            .collect();
        let seqs: Vec<i64> = chunk
            .iter()
            .map(|_| {
                seq += 1;
                seq
            })
            .collect();
        let mut values: Vec<&dyn ToSql> = Vec::with_capacity(chunk.len() * 9);
        for ((((i, event_time_ms), key), data), seq) in
            chunk.iter().zip(&keys).zip(&data).zip(&seqs)
        {
            let m = &entries[*i].message;
            values.extend([
                key as &dyn ToSql,
                &m.message_id,
                &m.publish_time_ms,
                event_time_ms,
                &m.attributes_json,
                data,
                &flow,
                &batch.now_ms,
                seq,
            ]);
        }
        tx.prepare_cached(&sql)?.execute(values.as_slice())?;
    }

    // Expectations' verdicts of the new keys.
    super::expectation_counts::add(&tx, batch, &written)?;

    // 3. Dead letters of the new keys (rare: one statement each).
    let mut dead = 0i64;
    for (entry, _) in entries.iter().zip(&written).filter(|(_, new)| **new) {
        let Effect::DeadLetter {
            reason,
            error,
            attempts,
        } = &entry.effect
        else {
            continue;
        };
        let m = &entry.message;
        tx.prepare_cached(&format!(
            "INSERT INTO \"{dead_letter}\" (flow, dedup_key, message_id, publish_time,
             attributes, data, reason, error, attempts, committed_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
        ))?
        .execute(params![
            &*batch.flow.name,
            entry.key.as_str(),
            m.message_id,
            m.publish_time_ms,
            m.attributes_json,
            &m.data[..],
            reason,
            error,
            attempts,
            batch.now_ms
        ])?;
        if batch.publish_dead_letters {
            super::outbox::insert(
                &tx,
                &batch.flow.pipeline,
                &batch.flow.name,
                entry,
                (reason, error, *attempts),
                batch.now_ms,
            )?;
        }
        dead += 1;
    }

    // 3b. The caller's own writes for the new rows (a library job), in this transaction.
    match &batch.work {
        None => {}
        Some(crate::TransactionWork::Sqlite(work)) => {
            work.write(&tx, &crate::work::new_rows(batch, &written))?;
        }
        Some(crate::TransactionWork::Postgres(_)) => {
            return Err(StoreError::Config(
                "work for a PostgreSQL transaction given to a SQLite store".to_owned(),
            ));
        }
    }
    // 4. Flow counters.
    let new = written.iter().filter(|w| **w).count() as i64;
    let duplicates =
        entries.len() as i64 - new + i64::try_from(batch.memory_duplicates).unwrap_or(i64::MAX);
    tx.prepare_cached(
        "UPDATE sluice_flows SET committed = committed + ?1, duplicates = duplicates + ?2,
         dead_lettered = dead_lettered + ?3, batches = batches + 1, last_commit_at = ?4
         WHERE flow_id = ?5",
    )?
    .execute(params![
        new - dead - filtered as i64,
        duplicates,
        dead,
        batch.now_ms,
        batch.flow.id
    ])?;
    // 5. Progress toward the flow's watermark: every entry's message is settled.
    if batch.watermark_progress {
        for chunk in entries.chunks(ROWS_PER_STATEMENT) {
            let sql = format!(
                "INSERT INTO sluice_watermark_messages
                     (flow_id, bucket_ms, message_id, tracked, settled, event_ms)
                 VALUES {}
                 ON CONFLICT (flow_id, bucket_ms, message_id) DO UPDATE SET settled = 1",
                placeholders(chunk.len(), 6)
            );
            let buckets: Vec<i64> = chunk
                .iter()
                .map(|e| {
                    e.message
                        .publish_time_ms
                        .div_euclid(PROGRESS_BUCKET_MS)
                        .saturating_mul(PROGRESS_BUCKET_MS)
                })
                .collect();
            let (no, yes, none) = (0i64, 1i64, None::<i64>);
            let mut values: Vec<&dyn ToSql> = Vec::with_capacity(chunk.len() * 6);
            for (entry, bucket) in chunk.iter().zip(&buckets) {
                values.extend([
                    &batch.flow.id as &dyn ToSql,
                    bucket,
                    &entry.message.message_id,
                    &no,
                    &yes,
                    &none,
                ]);
            }
            tx.prepare_cached(&sql)?.execute(values.as_slice())?;
        }
    }
    // 6. Work outside the database that this transaction publishes (a sink's file).
    if let Some(hook) = &batch.hook {
        hook.before_commit(&written)
            .map_err(|e| StoreError::Unavailable(format!("commit hook {}: {e}", hook.id())))?;
        tx.prepare_cached(
            "INSERT INTO sluice_commit_marks (flow_id, commit_id, committed_at) VALUES (?1, ?2, ?3)",
        )?
        .execute(params![batch.flow.id, hook.id(), batch.now_ms])?;
    }
    seal(&tx, batch, &written)?;
    tx.commit()?;
    Ok(CommitOutcome { written, filtered })
}

/// The batch's deadline checked again as the transaction commits, and the expiry of the keys
/// it won stamped again from now if it lasted more than [`crate::RESTAMP_AFTER_MS`] (see
/// `commit_time.rs`). Returning an error rolls the whole transaction back.
fn seal(
    tx: &rusqlite::Transaction<'_>,
    batch: &CommitBatch,
    written: &[bool],
) -> Result<(), StoreError> {
    let now = crate::local_clock::now_ms();
    if batch.commit_by_ms.is_some_and(|by| now > by) {
        return Err(StoreError::Stale);
    }
    if now - batch.now_ms <= crate::RESTAMP_AFTER_MS {
        return Ok(());
    }
    let expires_at = now.saturating_add(batch.expires_at_ms - batch.now_ms);
    let mut restamp = tx.prepare_cached(
        "UPDATE sluice_ledger SET expires_at = ?1 WHERE flow_id = ?2 AND key = ?3",
    )?;
    for entry in batch
        .entries
        .iter()
        .zip(written)
        .filter(|(_, w)| **w)
        .map(|(e, _)| e)
    {
        restamp.execute(params![expires_at, batch.flow.id, entry.key.as_str()])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::placeholders;

    #[test]
    fn placeholders_shape() {
        assert_eq!(placeholders(2, 3), "(?, ?, ?), (?, ?, ?)");
        assert_eq!(placeholders(1, 1), "(?)");
    }
}
