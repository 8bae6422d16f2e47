//! A typed table's rows on PostgreSQL (see `crate::typed`): the commit statement's step that
//! writes them through the flow's query, the decoded fields bound as arrays, and finding the
//! record and column a failed statement stumbled on.

use crate::changes::{ChangeRule, Dialect};
use crate::typed::{ColumnType, TypedQuery, TypedValue};
use crate::{CommitBatch, Effect, StoreError};
use tokio_postgres::types::ToSql;

/// The decoded fields of a batch, one array per field over the statement's input rows (a NULL
/// where an entry is a dead letter), numbered from `$20`.
pub(crate) struct FieldArrays {
    arrays: Vec<Box<dyn ToSql + Sync + Send>>,
}

impl FieldArrays {
    /// The arrays for the entries at `firsts` (the statement's input rows, in order).
    pub(crate) fn new(batch: &CommitBatch, query: &TypedQuery, firsts: &[usize]) -> Self {
        let values = |i: usize| -> Vec<&TypedValue> {
            firsts
                .iter()
                .map(|&index| match &batch.entries[index].effect {
                    Effect::Row { values, .. } => values.get(i).unwrap_or(&TypedValue::Null),
                    Effect::DeadLetter { .. } => &TypedValue::Null,
                })
                .collect()
        };
        let arrays = query
            .fields
            .iter()
            .enumerate()
            .map(|(i, (_, ty))| array(*ty, &values(i)))
            .collect();
        Self { arrays }
    }

    /// The parameters after the statement's first 19.
    pub(crate) fn params(&self) -> impl Iterator<Item = &(dyn ToSql + Sync)> {
        self.arrays.iter().map(|a| &**a as &(dyn ToSql + Sync))
    }
}

/// One field's values as the array its parameter binds. A value of another type than the
/// field's (the decoder never makes one) is sent as NULL.
fn array(ty: ColumnType, values: &[&TypedValue]) -> Box<dyn ToSql + Sync + Send> {
    macro_rules! collect {
        ($variant:ident, $map:expr) => {
            Box::new(
                values
                    .iter()
                    .map(|v| match v {
                        TypedValue::$variant(x) => Some($map(x)),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
            )
        };
    }
    match ty {
        ColumnType::Text => collect!(Text, |x: &String| x.clone()),
        ColumnType::Integer => collect!(Integer, |x: &i64| *x),
        ColumnType::Double => collect!(Double, |x: &f64| *x),
        ColumnType::Numeric => collect!(Numeric, |x: &String| x.clone()),
        ColumnType::Boolean => collect!(Boolean, |x: &bool| *x),
        ColumnType::Timestamp => collect!(Timestamp, |x: &i64| *x),
        ColumnType::Date => collect!(Date, |x: &String| x.clone()),
        ColumnType::Json => collect!(Json, |x: &String| x.clone()),
        ColumnType::Bytes => collect!(Bytes, |x: &bytes::Bytes| x.to_vec()),
    }
}

/// The array type a field's parameter binds, and how a value of it reads as the field's type.
fn bound(ty: ColumnType, value: &str) -> (&'static str, String) {
    match ty {
        ColumnType::Text => ("text[]", value.to_owned()),
        ColumnType::Integer => ("int8[]", value.to_owned()),
        ColumnType::Double => ("float8[]", value.to_owned()),
        ColumnType::Numeric => ("text[]", format!("{value}::numeric")),
        ColumnType::Boolean => ("bool[]", value.to_owned()),
        ColumnType::Timestamp => ("int8[]", format!("to_timestamp({value} / 1000.0::float8)")),
        ColumnType::Date => ("text[]", format!("{value}::date")),
        ColumnType::Json => ("text[]", format!("{value}::jsonb")),
        ColumnType::Bytes => ("bytea[]", value.to_owned()),
    }
}

/// The relation the flow's expressions read: the envelope and the decoded fields of each new
/// row of the statement's `input` (joined with `fresh`, the keys the ledger let through).
pub(super) fn source_relation(query: &TypedQuery) -> String {
    let mut arrays = Vec::new();
    let mut names = Vec::new();
    let mut reads = Vec::new();
    for (i, (name, ty)) in query.fields.iter().enumerate() {
        let (array_type, read) = bound(*ty, &format!("v.\"{name}\""));
        arrays.push(format!("${}::{array_type}", super::commit::FIRST_FIELD + i));
        names.push(format!("\"{name}\""));
        reads.push(format!("{read} AS \"{name}\""));
    }
    let values = if arrays.is_empty() {
        String::new()
    } else {
        format!(
            "JOIN unnest({}) WITH ORDINALITY AS v({}, _sluice_n) ON v._sluice_n = i._sluice_n",
            arrays.join(", "),
            names.join(", ")
        )
    };
    let fields = if reads.is_empty() {
        String::new()
    } else {
        format!(", {}", reads.join(", "))
    };
    format!(
        "SELECT i._sluice_n AS _sluice_row, i.key AS _sluice_dedup_key, i.message_id AS _sluice_message_id,
                to_timestamp(i.publish_ms / 1000.0::float8) AS _sluice_publish_time,
                to_timestamp(i.event_ms / 1000.0::float8) AS _sluice_event_time,
                i.attributes::jsonb AS _sluice_attributes, i.data AS _sluice_data{fields}
         FROM input i JOIN fresh f ON f.key = i.key {values}
         WHERE i.reason IS NULL"
    )
}

/// The commit statement's `rows` step for a typed table: the new rows written through the
/// flow's query, each returning its key.
pub(crate) fn rows_step(table: &str, query: &TypedQuery) -> String {
    let columns: Vec<String> = query
        .select
        .iter()
        .map(|(c, _)| format!(", \"{}\"", c.name))
        .collect();
    let values: Vec<String> = query
        .select
        .iter()
        .map(|(_, sql)| format!(", {}", sql.postgres))
        .collect();
    let filter = query
        .filter
        .as_ref()
        .map_or_else(String::new, |f| format!("WHERE ({}) IS TRUE", f.postgres));
    format!(
        "INSERT INTO \"{table}\" (_sluice_dedup_key, _sluice_message_id, _sluice_publish_time,
                                _sluice_event_time, _sluice_flow, _sluice_committed_at{})
         SELECT s._sluice_dedup_key, s._sluice_message_id, s._sluice_publish_time,
                s._sluice_event_time, $13, now(){}
         FROM ({}) s
         {filter}
         RETURNING 1",
        columns.concat(),
        values.concat(),
        source_relation(query)
    )
}

/// The commit statement's `rows` step for an update flow (`crate::changes`): `rows` counts the
/// changes `where:` kept (each committed, applied or found older than its key's row), and a
/// step of its own after it, `applied`, writes each key's greatest change, in key order.
pub(crate) fn changes_steps(table: &str, query: &TypedQuery, rule: &ChangeRule) -> String {
    let changes = crate::changes::changes(
        query,
        rule,
        &source_relation(query),
        ", s._sluice_publish_time, s._sluice_event_time",
        Dialect::Postgres,
    );
    let winners = crate::changes::winners(rule, "SELECT * FROM changes", Dialect::Postgres);
    let columns: String = query
        .select
        .iter()
        .map(|(c, _)| format!(", \"{}\"", c.name))
        .collect();
    let envelope = crate::changes::WRITTEN;
    let on_conflict = crate::changes::on_conflict(table, query, rule, &envelope);
    format!(
        "changes AS (
            {changes}
        ),
        rows AS (
            SELECT 1 FROM changes
        ),
        applied AS (
            INSERT INTO \"{table}\" ({}{columns})
            SELECT w._sluice_dedup_key, w._sluice_message_id, w._sluice_publish_time,
                   w._sluice_event_time, $13, now(),
                   CASE WHEN w._sluice_delete THEN now() END{columns_of_w}
            FROM ({winners}) w
            {on_conflict}
        )",
        envelope.join(", "),
        columns_of_w = query
            .select
            .iter()
            .map(|(c, _)| format!(", w.\"{}\"", c.name))
            .collect::<String>(),
    )
}

/// Whether a failed commit statement of a typed table failed on a record's values: a data
/// exception (class 22: a cast, an overflow, a division by zero) or a NULL in a column that is
/// not nullable (23502).
pub(crate) fn is_record_error(error: &tokio_postgres::Error) -> bool {
    error.as_db_error().is_some_and(|db| {
        let code = db.code().code();
        code.starts_with("22") || code == "23502"
    })
}

/// Finds the first new row of `batch` whose query fails, and the column (or `where`) at fault,
/// by evaluating each expression over that row alone (reads only). `None` when none fails so
/// (the caller then reports the statement's own error).
pub(crate) async fn find_record_error(
    client: &impl deadpool_postgres::GenericClient,
    batch: &CommitBatch,
    query: &TypedQuery,
) -> Result<Option<StoreError>, StoreError> {
    for (index, entry) in batch.entries.iter().enumerate() {
        let Effect::Row { event_time_ms, .. } = &entry.effect else {
            continue;
        };
        let arrays = FieldArrays::new(batch, query, &[index]);
        // `input` and `fresh` as the statement has them, for this one row.
        let prefix = "WITH input AS (
                SELECT $2::text AS key, $3::text AS message_id, $4::int8 AS publish_ms,
                       $5::int8 AS event_ms, $6::text AS attributes, $7::bytea AS data,
                       NULL::text AS reason, 1::int8 AS _sluice_n),
             fresh AS (SELECT key FROM input)";
        let key = entry.key.as_str();
        let message = &entry.message;
        let data = message.data.as_ref();
        // $1 and $8..$19 are not read here (see `rewrite_unused`).
        let head: [&(dyn ToSql + Sync); 7] = [
            &None::<i64>,
            &key,
            &message.message_id,
            &message.publish_time_ms,
            event_time_ms,
            &message.attributes_json,
            &data,
        ];
        let padding: Vec<Option<String>> = vec![None; 12];
        let mut params: Vec<&(dyn ToSql + Sync)> = head.to_vec();
        params.extend(padding.iter().map(|p| p as &(dyn ToSql + Sync)));
        params.extend(arrays.params());
        let relation = source_relation(query);
        let eval = async |sql: &str, test: &str| -> Result<Result<bool, String>, StoreError> {
            let text = rewrite_unused(&format!(
                "{prefix} SELECT ({sql}) {test} FROM ({relation}) s"
            ));
            let statement = client.prepare(&text).await?;
            match client.query_one(&statement, &params).await {
                Ok(row) => Ok(Ok(row.try_get(0)?)),
                Err(error) if is_record_error(&error) => Ok(Err(error
                    .as_db_error()
                    .map_or_else(|| error.to_string(), |db| db.message().to_owned()))),
                Err(error) => Err(error.into()),
            }
        };
        let record = |column: &str, error: String| {
            Some(StoreError::Record {
                index,
                column: column.to_owned(),
                error,
            })
        };
        if let Some(filter) = &query.filter {
            match eval(&filter.postgres, "IS TRUE").await? {
                Ok(true) => {}
                Ok(false) => continue,
                Err(error) => return Ok(record("where", error)),
            }
        }
        if let Some(deletes) = query.changes.as_ref().and_then(|c| c.deletes.as_ref())
            && let Err(error) = eval(&deletes.postgres, "IS TRUE").await?
        {
            return Ok(record("apply_as_deletes", error));
        }
        for (column, sql) in &query.select {
            match eval(&sql.postgres, "IS NULL").await? {
                Ok(true) if !column.nullable => {
                    return Ok(record(
                        &column.name,
                        "NULL in a column that is not nullable".to_owned(),
                    ));
                }
                Ok(_) => {}
                Err(error) => return Ok(record(&column.name, error)),
            }
        }
    }
    Ok(None)
}

/// The diagnosis binds only `$2..$7` and the field arrays: `$1` and `$8..$19` become unused
/// placeholders, which PostgreSQL cannot type, so each is given a type no one reads.
pub(super) fn rewrite_unused(text: &str) -> String {
    let mut typed = String::from("WITH unused AS (SELECT $1::int8");
    for n in 8..=19 {
        typed.push_str(&format!(", ${n}::text"));
    }
    typed.push_str("), ");
    text.replacen("WITH ", &typed, 1)
}
