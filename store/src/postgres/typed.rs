//! Typed tables on PostgreSQL (see `crate::typed`): their DDL, bringing an existing table to
//! its declared columns, the part of the commit statement that writes rows through the flow's
//! query, and finding the record and column a failed statement stumbled on.

use crate::typed::{
    ColumnType, Envelope, PLAIN_ENVELOPE, TYPED_ENVELOPE, TYPED_MARK, TypedColumn, TypedQuery,
    TypedValue,
};
use crate::{CommitBatch, Effect, StoreError};
use tokio_postgres::types::ToSql;

/// The column type as PostgreSQL spells it in DDL, and as `information_schema` reports it.
fn sql_type(ty: ColumnType) -> (&'static str, &'static str) {
    match ty {
        ColumnType::Text => ("TEXT", "text"),
        ColumnType::Integer => ("BIGINT", "bigint"),
        ColumnType::Double => ("DOUBLE PRECISION", "double precision"),
        ColumnType::Numeric => ("NUMERIC", "numeric"),
        ColumnType::Boolean => ("BOOLEAN", "boolean"),
        ColumnType::Timestamp => ("TIMESTAMPTZ", "timestamp with time zone"),
        ColumnType::Date => ("DATE", "date"),
        ColumnType::Json => ("JSONB", "jsonb"),
        ColumnType::Bytes => ("BYTEA", "bytea"),
    }
}

fn column_ddl(column: &TypedColumn) -> String {
    format!(
        "\"{}\" {}{}",
        column.name,
        sql_type(column.ty).0,
        if column.nullable { "" } else { " NOT NULL" }
    )
}

/// DDL of a typed table: sluice's columns (`_sluice_*`, the feed order as in an envelope
/// table), then the declared ones; its `(flow, dedup key)` and feed-order indexes.
pub(crate) fn ddl(table: &str, columns: &[TypedColumn]) -> String {
    let declared: Vec<String> = columns.iter().map(column_ddl).collect();
    format!(
        "CREATE TABLE IF NOT EXISTS \"{table}\" (
            _sluice_dedup_key    TEXT COLLATE \"C\" NOT NULL,
            _sluice_message_id   TEXT NOT NULL,
            _sluice_publish_time TIMESTAMPTZ NOT NULL,
            _sluice_event_time   TIMESTAMPTZ NOT NULL,
            _sluice_flow         TEXT NOT NULL,
            _sluice_committed_at TIMESTAMPTZ NOT NULL,
            _sluice_writer_xid   xid8 NOT NULL DEFAULT pg_current_xact_id(),
            _sluice_seq          BIGINT GENERATED ALWAYS AS IDENTITY,
            {}
        );
        CREATE INDEX IF NOT EXISTS \"{table}_flow_key\" ON \"{table}\" (_sluice_flow, _sluice_dedup_key);
        CREATE INDEX IF NOT EXISTS \"{table}_feed\" ON \"{table}\" (_sluice_writer_xid, _sluice_seq);",
        declared.join(",\n            ")
    )
}

/// Brings an existing typed table to its declared columns (under the DDL lock, in the prepare
/// transaction): adds the nullable ones it lacks; refuses, changing nothing, a column of
/// another type, a new column that is not nullable on a table with rows, an undeclared column
/// that is not nullable, and an envelope table of the same name.
pub(crate) async fn evolve(
    tx: &deadpool_postgres::Transaction<'_>,
    table: &str,
    columns: &[TypedColumn],
) -> Result<(), StoreError> {
    let rows = tx
        .query(
            "SELECT column_name::text, data_type::text, is_nullable = 'YES'
             FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = $1",
            &[&table],
        )
        .await?;
    let existing: Vec<(String, String, bool)> = rows
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
        .collect::<Result<_, tokio_postgres::Error>>()?;
    let refuse = |why: String| {
        StoreError::Config(format!(
            "typed table {table}: {why}; nothing was changed (drop or rename the table, or \
             declare the column as it is)"
        ))
    };
    if !existing
        .iter()
        .any(|(name, ..)| name == crate::typed::TYPED_MARK)
    {
        return Err(refuse(
            "it exists as sluice's envelope table (no `columns:`)".to_owned(),
        ));
    }
    let mut added = Vec::new();
    for column in columns {
        match existing.iter().find(|(name, ..)| *name == column.name) {
            Some((_, found, _)) if found != sql_type(column.ty).1 => {
                return Err(refuse(format!(
                    "column `{}` is {found} in the table and declared {}",
                    column.name,
                    column.ty_keyword()
                )));
            }
            Some((_, _, nullable)) if *nullable != column.nullable => {
                return Err(refuse(format!(
                    "column `{}` is {} in the table and declared {}",
                    column.name,
                    nullability(*nullable),
                    nullability(column.nullable)
                )));
            }
            Some(_) => {}
            None => added.push(column),
        }
    }
    for (name, _, nullable) in &existing {
        if !nullable
            && !name.starts_with(crate::typed::RESERVED)
            && !columns.iter().any(|c| c.name == *name)
        {
            return Err(refuse(format!(
                "column `{name}` is in the table, not nullable, and no longer declared"
            )));
        }
    }
    if added.iter().any(|c| !c.nullable) {
        let has_rows: bool = tx
            .query_one(&format!("SELECT EXISTS (SELECT 1 FROM \"{table}\")"), &[])
            .await?
            .try_get(0)?;
        if has_rows {
            let names: Vec<&str> = added
                .iter()
                .filter(|c| !c.nullable)
                .map(|c| c.name.as_str())
                .collect();
            return Err(refuse(format!(
                "new column(s) {} are not nullable and the table has rows",
                names.join(", ")
            )));
        }
    }
    for column in added {
        tx.batch_execute(&format!(
            "ALTER TABLE \"{table}\" ADD COLUMN IF NOT EXISTS {}",
            column_ddl(column)
        ))
        .await?;
    }
    Ok(())
}

/// Sluice's column names in `table`: a typed table's (`_sluice_*`) or an envelope table's.
pub(crate) async fn envelope(
    client: &impl deadpool_postgres::GenericClient,
    table: &str,
) -> Result<Envelope, StoreError> {
    let typed: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = $1 AND column_name = $2)",
            &[&table, &TYPED_MARK],
        )
        .await?
        .try_get(0)?;
    Ok(if typed {
        TYPED_ENVELOPE
    } else {
        PLAIN_ENVELOPE
    })
}

/// Refuses to use a typed table as an envelope table (its `columns:` were taken out of the
/// pipeline file): its rows would all be refused.
pub(crate) async fn refuse_if_typed(
    client: &impl deadpool_postgres::GenericClient,
    table: &str,
) -> Result<(), StoreError> {
    if envelope(client, table).await? == TYPED_ENVELOPE {
        return Err(StoreError::Config(format!(
            "table {table} has typed columns and its target declares none; declare its \
             `columns:` again (or drop or rename the table)"
        )));
    }
    Ok(())
}

/// How a column's nullability reads in a refusal.
pub(crate) fn nullability(nullable: bool) -> &'static str {
    if nullable { "nullable" } else { "not nullable" }
}

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
fn source_relation(query: &TypedQuery) -> String {
    let mut arrays = Vec::new();
    let mut names = Vec::new();
    let mut reads = Vec::new();
    for (i, (name, ty)) in query.fields.iter().enumerate() {
        let (array_type, read) = bound(*ty, &format!("v.\"{name}\""));
        arrays.push(format!("${}::{array_type}", 20 + i));
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
fn rewrite_unused(text: &str) -> String {
    let mut typed = String::from("WITH unused AS (SELECT $1::int8");
    for n in 8..=19 {
        typed.push_str(&format!(", ${n}::text"));
    }
    typed.push_str("), ");
    text.replacen("WITH ", &typed, 1)
}

impl TypedColumn {
    /// The type's word in the pipeline file.
    pub(crate) fn ty_keyword(&self) -> &'static str {
        crate::typed::keyword(self.ty)
    }
}

/// The rows of a batch as the statement's `input` (with `fresh` letting every key through), for
/// reads outside the commit: keys, ids, times, attributes and data bound as `$2..$7`.
const ROWS_AS_INPUT: &str = "WITH input AS (
        SELECT u.key, u.message_id, u.publish_ms, u.event_ms, u.attributes, u.data,
               NULL::text AS reason, u._sluice_n
        FROM unnest($2::text[], $3::text[], $4::int8[], $5::int8[], $6::text[], $7::bytea[])
            WITH ORDINALITY AS u(key, message_id, publish_ms, event_ms, attributes, data, _sluice_n)),
     fresh AS (SELECT DISTINCT key FROM input)";

/// See [`crate::LedgerStore::violations`].
pub(crate) async fn violations(
    client: &impl deadpool_postgres::GenericClient,
    batch: &CommitBatch,
) -> Result<Vec<Vec<bool>>, StoreError> {
    let mut out = vec![Vec::new(); batch.entries.len()];
    let Some(query) = batch.typed.as_deref() else {
        return Ok(out);
    };
    if query.expectations.is_empty() {
        return Ok(out);
    }
    let rows: Vec<usize> = batch
        .entries
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e.effect, Effect::Row { .. }))
        .map(|(i, _)| i)
        .collect();
    for &i in &rows {
        out[i] = vec![false; query.expectations.len()];
    }
    let checks: Vec<&str> = query
        .expectations
        .iter()
        .map(|(_, sql)| sql.postgres.as_str())
        .collect();
    match evaluate(client, batch, query, &rows, &checks).await {
        Ok(found) => {
            for (n, violated) in found {
                out[rows[n]] = violated;
            }
            Ok(out)
        }
        Err(EvalError::Store(error)) => Err(error),
        Err(EvalError::Record(error)) => {
            // Which record, and which check: each alone.
            for &index in &rows {
                for (name, sql) in &query.expectations {
                    if let Err(EvalError::Record(why)) =
                        evaluate(client, batch, query, &[index], &[sql.postgres.as_str()]).await
                    {
                        return Err(StoreError::Record {
                            index,
                            column: crate::typed::expectation_column(name),
                            error: why,
                        });
                    }
                }
            }
            Err(StoreError::Rejected(error))
        }
    }
}

enum EvalError {
    /// A record's values made an expression fail (the server's message).
    Record(String),
    Store(StoreError),
}

/// Whether each of `checks` is false, over the rows at `indexes`: per row (its position in
/// `indexes`), the results.
async fn evaluate(
    client: &impl deadpool_postgres::GenericClient,
    batch: &CommitBatch,
    query: &TypedQuery,
    indexes: &[usize],
    checks: &[&str],
) -> Result<Vec<(usize, Vec<bool>)>, EvalError> {
    let entries: Vec<&crate::Entry> = indexes.iter().map(|&i| &batch.entries[i]).collect();
    let keys: Vec<&str> = entries.iter().map(|e| e.key.as_str()).collect();
    let ids: Vec<&str> = entries
        .iter()
        .map(|e| e.message.message_id.as_str())
        .collect();
    let publish: Vec<i64> = entries.iter().map(|e| e.message.publish_time_ms).collect();
    let event: Vec<i64> = entries
        .iter()
        .map(|e| match e.effect {
            Effect::Row { event_time_ms, .. } => event_time_ms,
            Effect::DeadLetter { .. } => e.message.publish_time_ms,
        })
        .collect();
    let attributes: Vec<&str> = entries
        .iter()
        .map(|e| e.message.attributes_json.as_str())
        .collect();
    let data: Vec<&[u8]> = entries.iter().map(|e| e.message.data.as_ref()).collect();
    let arrays = FieldArrays::new(batch, query, indexes);
    let padding: Vec<Option<String>> = vec![None; 12];
    let none: Option<i64> = None;
    let mut params: Vec<&(dyn ToSql + Sync)> =
        vec![&none, &keys, &ids, &publish, &event, &attributes, &data];
    params.extend(padding.iter().map(|p| p as &(dyn ToSql + Sync)));
    params.extend(arrays.params());
    let tests: String = checks
        .iter()
        .map(|check| format!(", ({check}) IS FALSE"))
        .collect();
    let output = crate::typed::output_columns(query, "s._sluice_row", |e| &e.postgres);
    let text = rewrite_unused(&format!(
        "{ROWS_AS_INPUT} SELECT o._sluice_row, o._sluice_kept{tests}
         FROM (SELECT {output} FROM ({}) s) o",
        source_relation(query)
    ));
    let statement = client
        .prepare(&text)
        .await
        .map_err(|e| EvalError::Store(e.into()))?;
    let found = match client.query(&statement, &params).await {
        Ok(found) => found,
        Err(error) if is_record_error(&error) => {
            return Err(EvalError::Record(
                error
                    .as_db_error()
                    .map_or_else(|| error.to_string(), |db| db.message().to_owned()),
            ));
        }
        Err(error) => return Err(EvalError::Store(error.into())),
    };
    let count = checks.len();
    found
        .iter()
        .map(|row| {
            let n: i64 = row.try_get(0)?;
            let violated = if row.try_get::<_, bool>(1)? {
                (2..2 + count)
                    .map(|k| row.try_get::<_, bool>(k))
                    .collect::<Result<Vec<bool>, _>>()?
            } else {
                Vec::new()
            };
            Ok((usize::try_from(n - 1).unwrap_or(0), violated))
        })
        .collect::<Result<_, tokio_postgres::Error>>()
        .map_err(|e| EvalError::Store(e.into()))
}
