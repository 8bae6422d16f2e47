//! Typed tables on SQLite (see `crate::typed`): their DDL, bringing an existing table to its
//! declared columns, writing a batch's new rows through the flow's query, and finding the
//! record and column a failed write stumbled on.
//!
//! The flow's expressions read a `src` relation (a `VALUES` list bound per statement): the
//! envelope, with times as ISO 8601 text like a typed timestamp, and the decoded fields, with
//! numbers bound as numbers so that comparisons are numeric. Casts in the expressions are
//! sluice's strict functions (`casts.rs`).

use crate::typed::{
    ColumnType, Envelope, ExistingColumn, PLAIN_ENVELOPE, TYPED_ENVELOPE, TYPED_MARK, TypedColumn,
    TypedQuery, TypedValue, columns_to_add, iso_millis, refuse_evolution,
};
use crate::{CommitBatch, Effect, StoreError};
use rusqlite::Connection;
use rusqlite::types::{ToSql, Value};

/// The declared type of a column: its affinity as SQLite derives it from the name, and a
/// name that tells the nine types apart when the table is read back.
pub(super) fn declared(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::Text => "TEXT",
        ColumnType::Integer => "INTEGER",
        ColumnType::Double => "DOUBLE",
        ColumnType::Numeric => "NUMERIC",
        ColumnType::Boolean => "BOOLEAN",
        ColumnType::Timestamp => "TIMESTAMP TEXT",
        ColumnType::Date => "DATE TEXT",
        ColumnType::Json => "JSON TEXT",
        ColumnType::Bytes => "BLOB",
    }
}

fn column_ddl(column: &TypedColumn) -> String {
    format!(
        "\"{}\" {}{}",
        column.name,
        declared(column.ty),
        if column.nullable { "" } else { " NOT NULL" }
    )
}

/// DDL of a typed table: sluice's columns (`_sluice_*`; times in ms, `seq` the feed order as
/// in an envelope table), then the declared ones; its indexes.
pub(super) fn ddl(table: &str, columns: &[TypedColumn]) -> String {
    let declared: Vec<String> = columns.iter().map(column_ddl).collect();
    format!(
        "CREATE TABLE IF NOT EXISTS \"{table}\" (
            _sluice_dedup_key    TEXT NOT NULL,
            _sluice_message_id   TEXT NOT NULL,
            _sluice_publish_time INTEGER NOT NULL,
            _sluice_event_time   INTEGER NOT NULL,
            _sluice_flow         TEXT NOT NULL,
            _sluice_committed_at INTEGER NOT NULL,
            _sluice_seq          INTEGER,
            {}
        );
        CREATE INDEX IF NOT EXISTS \"{table}_flow_key\" ON \"{table}\" (_sluice_flow, _sluice_dedup_key);
        CREATE INDEX IF NOT EXISTS \"{table}_seq\" ON \"{table}\" (_sluice_seq);",
        declared.join(",\n            ")
    )
}

/// The table's columns: name, declared type, nullable.
fn existing_columns(conn: &Connection, table: &str) -> Result<Vec<ExistingColumn>, StoreError> {
    let mut statement =
        conn.prepare("SELECT name, type, \"notnull\" = 0 FROM pragma_table_info(?1)")?;
    let rows = statement.query_map([table], |row| {
        Ok(ExistingColumn {
            name: row.get(0)?,
            ty: row.get(1)?,
            nullable: row.get(2)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Brings an existing typed table to its declared columns: see `crate::typed` (the same rules
/// as on PostgreSQL). Nothing is changed when something is refused.
pub(super) fn evolve(
    conn: &Connection,
    table: &str,
    columns: &[TypedColumn],
) -> Result<(), StoreError> {
    let existing = existing_columns(conn, table)?;
    if existing.is_empty() {
        return Ok(());
    }
    let added = columns_to_add(table, columns, &existing, declared)?;
    if let Some(column) = added.iter().find(|c| !c.nullable) {
        // SQLite cannot add a NOT NULL column without a default to any table.
        return Err(refuse_evolution(
            table,
            &format!(
                "new column `{}` is not nullable; a column added to an existing table must be",
                column.name
            ),
        ));
    }
    for column in added {
        conn.execute_batch(&format!(
            "ALTER TABLE \"{table}\" ADD COLUMN {}",
            column_ddl(column)
        ))?;
    }
    Ok(())
}

/// Sluice's column names in `table`.
pub(super) fn envelope(conn: &Connection, table: &str) -> Result<Envelope, StoreError> {
    let typed: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2)",
        [table, TYPED_MARK],
        |row| row.get(0),
    )?;
    Ok(if typed {
        TYPED_ENVELOPE
    } else {
        PLAIN_ENVELOPE
    })
}

/// Refuses to use a typed table as an envelope table (its `columns:` were taken out).
pub(super) fn refuse_if_typed(conn: &Connection, table: &str) -> Result<(), StoreError> {
    if envelope(conn, table)? == TYPED_ENVELOPE {
        return Err(StoreError::Config(format!(
            "table {table} has typed columns and its target declares none; declare its \
             `columns:` again (or drop or rename the table)"
        )));
    }
    Ok(())
}

/// A decoded value as SQLite binds it in `src`.
fn bind(value: &TypedValue) -> Value {
    match value {
        TypedValue::Null => Value::Null,
        TypedValue::Text(text) | TypedValue::Date(text) | TypedValue::Json(text) => {
            Value::Text(text.clone())
        }
        TypedValue::Integer(n) => Value::Integer(*n),
        TypedValue::Double(x) => Value::Real(*x),
        TypedValue::Numeric(digits) => match digits.parse::<i64>() {
            Ok(n) => Value::Integer(n),
            Err(_) => digits.parse::<f64>().map_or(Value::Null, Value::Real),
        },
        TypedValue::Boolean(b) => Value::Integer(i64::from(*b)),
        TypedValue::Timestamp(ms) => iso_millis(*ms).map_or(Value::Null, Value::Text),
        TypedValue::Bytes(bytes) => Value::Blob(bytes.to_vec()),
    }
}

/// `src`'s columns: the envelope as expressions read it, the stored times and feed order,
/// then the decoded fields.
pub(super) fn src_columns(query: &TypedQuery) -> Vec<String> {
    let mut columns: Vec<String> = [
        "_sluice_dedup_key",
        "_sluice_message_id",
        "_sluice_publish_time",
        "_sluice_event_time",
        "_sluice_attributes",
        "_sluice_data",
        "_sluice_publish_ms",
        "_sluice_event_ms",
        "_sluice_seq",
    ]
    .map(str::to_owned)
    .to_vec();
    columns.extend(query.fields.iter().map(|(name, _)| format!("\"{name}\"")));
    columns
}

/// One new row's `src` values; `seq` its feed number.
pub(super) fn src_values(batch: &CommitBatch, index: usize, seq: i64, fields: usize) -> Vec<Value> {
    let entry = &batch.entries[index];
    let (event_ms, values): (i64, &[TypedValue]) = match &entry.effect {
        Effect::Row {
            event_time_ms,
            values,
        } => (*event_time_ms, values),
        Effect::DeadLetter { .. } => (entry.message.publish_time_ms, &[]),
    };
    let m = &entry.message;
    let mut row = vec![
        Value::Text(entry.key.as_str().to_owned()),
        Value::Text(m.message_id.clone()),
        iso_millis(m.publish_time_ms).map_or(Value::Null, Value::Text),
        iso_millis(event_ms).map_or(Value::Null, Value::Text),
        Value::Text(m.attributes_json.clone()),
        Value::Blob(m.data.to_vec()),
        Value::Integer(m.publish_time_ms),
        Value::Integer(event_ms),
        Value::Integer(seq),
    ];
    row.extend((0..fields).map(|i| values.get(i).map_or(Value::Null, bind)));
    row
}

/// `WITH src(...) AS (VALUES ...)` for `rows` rows.
pub(super) fn with_src(query: &TypedQuery, rows: usize) -> String {
    let columns = src_columns(query);
    let row = format!("({})", vec!["?"; columns.len()].join(", "));
    format!(
        "WITH src({}) AS (VALUES {})",
        columns.join(", "),
        vec![row; rows].join(", ")
    )
}

/// Writes the new rows at `indexes` of `batch` (numbered from `first_seq`) through the flow's
/// query; returns how many rows were written (the rest `where:` left out). A record whose
/// query fails is found and reported as [`StoreError::Record`].
pub(super) fn insert_rows(
    tx: &rusqlite::Transaction<'_>,
    batch: &CommitBatch,
    query: &TypedQuery,
    indexes: &[usize],
    first_seq: i64,
) -> Result<u64, StoreError> {
    if let Some(rule) = &query.changes {
        return super::typed_changes::apply(tx, batch, query, rule, indexes, first_seq);
    }
    let per_row = src_columns(query).len();
    // Far below SQLite's variable limit (32 766).
    let rows_per_statement = (30_000 / per_row).clamp(1, 128);
    let columns: String = query
        .select
        .iter()
        .map(|(c, _)| format!(", \"{}\"", c.name))
        .collect();
    let values: String = query
        .select
        .iter()
        .map(|(_, sql)| format!(", {}", sql.sqlite))
        .collect();
    let filter = query
        .filter
        .as_ref()
        .map_or_else(String::new, |f| format!("WHERE ({}) IS TRUE", f.sqlite));
    let mut written = 0u64;
    let mut seq = first_seq;
    for chunk in indexes.chunks(rows_per_statement) {
        let sql = format!(
            "{} INSERT INTO \"{}\" (_sluice_dedup_key, _sluice_message_id, _sluice_publish_time,
                 _sluice_event_time, _sluice_flow, _sluice_committed_at, _sluice_seq{columns})
             SELECT _sluice_dedup_key, _sluice_message_id, _sluice_publish_ms, _sluice_event_ms,
                 ?, ?, _sluice_seq{values}
             FROM src {filter}",
            with_src(query, chunk.len()),
            batch.table
        );
        let mut bound: Vec<Value> = Vec::with_capacity(chunk.len() * per_row + 2);
        for &index in chunk {
            seq += 1;
            bound.extend(src_values(batch, index, seq, query.fields.len()));
        }
        bound.push(Value::Text(batch.flow.name.to_string()));
        bound.push(Value::Integer(batch.now_ms));
        let params: Vec<&dyn ToSql> = bound.iter().map(|v| v as &dyn ToSql).collect();
        match tx.prepare_cached(&sql)?.execute(params.as_slice()) {
            Ok(n) => written += n as u64,
            Err(error) => {
                return Err(
                    find_record_error(tx, batch, query, chunk)?.unwrap_or_else(|| error.into())
                );
            }
        }
    }
    Ok(written)
}

/// The first row of `indexes` whose query fails, and the column (or `where`) at fault, each
/// expression evaluated over that row alone.
pub(super) fn find_record_error(
    conn: &Connection,
    batch: &CommitBatch,
    query: &TypedQuery,
    indexes: &[usize],
) -> Result<Option<StoreError>, StoreError> {
    for &index in indexes {
        let row = src_values(batch, index, 0, query.fields.len());
        let params: Vec<&dyn ToSql> = row.iter().map(|v| v as &dyn ToSql).collect();
        let eval = |sql: &str, test: &str| {
            let text = format!("{} SELECT ({sql}) {test} FROM src", with_src(query, 1));
            conn.prepare(&text)
                .and_then(|mut s| s.query_row(params.as_slice(), |r| r.get::<_, bool>(0)))
        };
        let record = |column: &str, error: String| {
            Some(StoreError::Record {
                index,
                column: column.to_owned(),
                error,
            })
        };
        if let Some(filter) = &query.filter {
            match eval(&filter.sqlite, "IS TRUE") {
                Ok(true) => {}
                Ok(false) => continue,
                Err(error) => return Ok(record("where", error.to_string())),
            }
        }
        if let Some(deletes) = query.changes.as_ref().and_then(|c| c.deletes.as_ref())
            && let Err(error) = eval(&deletes.sqlite, "IS TRUE")
        {
            return Ok(record("apply_as_deletes", error.to_string()));
        }
        for (column, sql) in &query.select {
            match eval(&sql.sqlite, "IS NULL") {
                Ok(true) if !column.nullable => {
                    return Ok(record(
                        &column.name,
                        "NULL in a column that is not nullable".to_owned(),
                    ));
                }
                Ok(_) => {}
                Err(error) => return Ok(record(&column.name, error.to_string())),
            }
        }
    }
    Ok(None)
}

/// See [`crate::LedgerStore::violations`].
pub(super) fn violations(
    conn: &Connection,
    batch: &CommitBatch,
) -> Result<Vec<Vec<bool>>, StoreError> {
    let mut out = vec![Vec::new(); batch.entries.len()];
    let Some(query) = batch.typed.as_deref() else {
        return Ok(out);
    };
    let rows: Vec<usize> = batch
        .entries
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e.effect, Effect::Row { .. }))
        .map(|(i, _)| i)
        .collect();
    let per_row = src_columns(query).len();
    let rows_per_statement = (30_000 / per_row).clamp(1, 128);
    let checks: Vec<&str> = query
        .expectations
        .iter()
        .map(|(_, sql)| sql.sqlite.as_str())
        .collect();
    for chunk in rows.chunks(rows_per_statement) {
        match evaluate(conn, batch, query, chunk, &checks) {
            Ok(found) => {
                for (index, violated) in found {
                    out[index] = violated;
                }
            }
            Err(error) => {
                for &index in chunk {
                    for (name, sql) in &query.expectations {
                        if let Err(why) =
                            evaluate(conn, batch, query, &[index], &[sql.sqlite.as_str()])
                        {
                            return Err(StoreError::Record {
                                index,
                                column: crate::typed::expectation_column(name),
                                error: why.to_string(),
                            });
                        }
                    }
                }
                return Err(error.into());
            }
        }
    }
    Ok(out)
}

/// Whether each of `checks` is false on the output of the rows at `indexes` (by entry index)
/// that `where` keeps (the others: no verdict, an empty list).
fn evaluate(
    conn: &Connection,
    batch: &CommitBatch,
    query: &TypedQuery,
    indexes: &[usize],
    checks: &[&str],
) -> rusqlite::Result<Vec<(usize, Vec<bool>)>> {
    let tests: String = checks
        .iter()
        .map(|check| format!(", ({check}) IS FALSE"))
        .collect();
    let output = crate::typed::output_columns(query, "_sluice_seq", |e| &e.sqlite);
    let sql = format!(
        "{} SELECT o._sluice_row, o._sluice_kept{tests} FROM (SELECT {output} FROM src) o",
        with_src(query, indexes.len())
    );
    let mut bound: Vec<Value> = Vec::new();
    for &index in indexes {
        // The entry's index rides in `_sluice_seq`, which nothing else reads here.
        bound.extend(src_values(batch, index, index as i64, query.fields.len()));
    }
    let params: Vec<&dyn ToSql> = bound.iter().map(|v| v as &dyn ToSql).collect();
    let mut statement = conn.prepare(&sql)?;
    let found = statement.query_map(params.as_slice(), |row| {
        let index: i64 = row.get(0)?;
        let violated = if row.get::<_, bool>(1)? {
            (2..2 + checks.len())
                .map(|k| row.get::<_, bool>(k))
                .collect::<rusqlite::Result<Vec<bool>>>()?
        } else {
            Vec::new()
        };
        Ok((usize::try_from(index).unwrap_or(0), violated))
    })?;
    found.collect()
}
