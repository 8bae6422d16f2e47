//! Update flows on SQLite (see `crate::changes`): a keyed table's tombstone column and unique
//! index, and a batch's changes applied to it, each key's greatest change per statement.

use super::typed::{find_record_error, src_columns, src_values, with_src};
use crate::changes::{ChangeRule, Dialect};
use crate::typed::TypedQuery;
use crate::{CommitBatch, StoreError};
use rusqlite::types::{ToSql, Value};

/// Gives a keyed table its tombstone column (`_sluice_deleted_at`, ms) if it lacks it, and
/// its keys' unique index; refuses keys that changed or were taken out
/// ([`crate::changes::check_keys`]).
pub(super) fn keyed(
    tx: &rusqlite::Transaction<'_>,
    table: &str,
    keys: &[String],
) -> Result<(), StoreError> {
    let index = format!("{table}_keys");
    let mut statement = tx.prepare("SELECT name FROM pragma_index_info(?1) ORDER BY seqno")?;
    let found = statement
        .query_map([&index], |row| row.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    crate::changes::check_keys(table, &found, keys, || {
        Ok(
            tx.query_row(&crate::changes::duplicated_keys(table, keys), [], |row| {
                row.get(0)
            })?,
        )
    })?;
    if keys.is_empty() {
        return Ok(());
    }
    let has: bool = tx.query_row(
        "SELECT COUNT(*) > 0 FROM pragma_table_info(?1) WHERE name = '_sluice_deleted_at'",
        [table],
        |row| row.get(0),
    )?;
    if !has {
        tx.execute_batch(&format!(
            "ALTER TABLE \"{table}\" ADD COLUMN _sluice_deleted_at INTEGER"
        ))?;
    }
    tx.execute_batch(&crate::changes::keys_index(table, keys))?;
    Ok(())
}

/// Applies the changes at `indexes` of `batch` (numbered from `first_seq` for the feed) to
/// their keys' rows; returns how many `where:` kept (each committed, applied or older than its
/// key's row). A record whose query fails is reported as [`StoreError::Record`].
pub(super) fn apply(
    tx: &rusqlite::Transaction<'_>,
    batch: &CommitBatch,
    query: &TypedQuery,
    rule: &ChangeRule,
    indexes: &[usize],
    first_seq: i64,
) -> Result<u64, StoreError> {
    let per_row = src_columns(query).len();
    // Far below SQLite's variable limit (32 766).
    let rows_per_statement = (30_000 / per_row).clamp(1, 128);
    let changes = crate::changes::changes(
        query,
        rule,
        "SELECT * FROM src",
        ", s._sluice_publish_ms, s._sluice_event_ms, s._sluice_seq",
        Dialect::Sqlite,
    );
    let winners = crate::changes::winners(rule, "SELECT * FROM changes", Dialect::Sqlite);
    let mut envelope = crate::changes::WRITTEN.to_vec();
    envelope.push("_sluice_seq");
    let columns: String = query
        .select
        .iter()
        .map(|(c, _)| format!(", \"{}\"", c.name))
        .collect();
    let of_winner: String = query
        .select
        .iter()
        .map(|(c, _)| format!(", w.\"{}\"", c.name))
        .collect();
    let on_conflict = crate::changes::on_conflict(&batch.table, query, rule, &envelope);
    let mut kept = 0u64;
    let mut seq = first_seq;
    for chunk in indexes.chunks(rows_per_statement) {
        let with = format!("{}, changes AS ({changes})", with_src(query, chunk.len()));
        let mut bound: Vec<Value> = Vec::with_capacity(chunk.len() * per_row + 3);
        for &index in chunk {
            seq += 1;
            bound.extend(src_values(batch, index, seq, query.fields.len()));
        }
        let sources = bound.len();
        // The upsert's own three after the rows' values, which the count reads alone.
        bound.push(Value::Text(batch.flow.name.to_string()));
        bound.push(Value::Integer(batch.now_ms));
        bound.push(Value::Integer(batch.now_ms));
        let params: Vec<&dyn ToSql> = bound.iter().map(|v| v as &dyn ToSql).collect();
        let count = format!("{with} SELECT count(*) FROM changes");
        let counted = tx
            .prepare_cached(&count)?
            .query_row(&params[..sources], |row| row.get::<_, i64>(0));
        let applied = counted.and_then(|n| {
            let upsert = format!(
                "{with} INSERT INTO \"{}\" ({}{columns})
                 SELECT w._sluice_dedup_key, w._sluice_message_id, w._sluice_publish_ms,
                        w._sluice_event_ms, ?, ?, CASE WHEN w._sluice_delete THEN ? END,
                        w._sluice_seq{of_winner}
                 FROM ({winners}) w WHERE true
                 {on_conflict}",
                batch.table,
                envelope.join(", ")
            );
            tx.prepare_cached(&upsert)?.execute(params.as_slice())?;
            Ok(n)
        });
        match applied {
            Ok(n) => kept += u64::try_from(n).unwrap_or_default(),
            Err(error) => {
                return Err(
                    find_record_error(tx, batch, query, chunk)?.unwrap_or_else(|| error.into())
                );
            }
        }
    }
    Ok(kept)
}
