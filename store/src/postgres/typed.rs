//! Typed tables on PostgreSQL (see `crate::typed`): their DDL, bringing an existing table to
//! its declared columns, and telling a typed table from an envelope one. Their rows:
//! `typed_rows.rs`; expectations' verdicts: `typed_checks.rs`.

use crate::StoreError;
use crate::typed::{
    ColumnType, Envelope, ExistingColumn, PLAIN_ENVELOPE, TYPED_ENVELOPE, TYPED_MARK, TypedColumn,
    columns_to_add, refuse_evolution,
};

/// The column type as PostgreSQL spells it in DDL, and as `information_schema` reports it.
pub(crate) fn sql_type(ty: ColumnType) -> (&'static str, &'static str) {
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
/// table), then the declared ones; its `(flow, dedup key)` and feed-order indexes; with `keys`
/// (a table of the latest change per key, `changes.rs`), the tombstone column and the keys'
/// unique index (an existing table is first brought to its keys by [`keyed`]).
pub(crate) fn ddl(table: &str, columns: &[TypedColumn], keys: &[String]) -> String {
    let declared: Vec<String> = columns.iter().map(column_ddl).collect();
    let (tombstone, keyed) = if keys.is_empty() {
        (String::new(), String::new())
    } else {
        (
            "_sluice_deleted_at   TIMESTAMPTZ,\n            ".to_owned(),
            format!("\n        {}", crate::changes::keys_index(table, keys)),
        )
    };
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
            {tombstone}{}
        );
        CREATE INDEX IF NOT EXISTS \"{table}_flow_key\" ON \"{table}\" (_sluice_flow, _sluice_dedup_key);
        CREATE INDEX IF NOT EXISTS \"{table}_feed\" ON \"{table}\" (_sluice_writer_xid, _sluice_seq);{keyed}",
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
    let existing: Vec<ExistingColumn> = rows
        .iter()
        .map(|r| {
            Ok(ExistingColumn {
                name: r.try_get(0)?,
                ty: r.try_get(1)?,
                nullable: r.try_get(2)?,
            })
        })
        .collect::<Result<_, tokio_postgres::Error>>()?;
    let added = columns_to_add(table, columns, &existing, |ty| sql_type(ty).1)?;
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
            return Err(refuse_evolution(
                table,
                &format!(
                    "new column(s) {} are not nullable and the table has rows",
                    names.join(", ")
                ),
            ));
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

/// Brings an existing table to its `keys` (under the DDL lock, in the prepare transaction,
/// before the DDL that creates their index): refuses keys that changed or were taken out, or
/// that its rows repeat ([`crate::changes::check_keys`]); adds the tombstone column a table
/// gaining keys lacks (only then: `ALTER TABLE` locks the table).
pub(crate) async fn keyed(
    tx: &deadpool_postgres::Transaction<'_>,
    table: &str,
    keys: &[String],
) -> Result<(), StoreError> {
    let found: Vec<String> = tx
        .query(
            "SELECT a.attname::text
             FROM pg_index i
             JOIN pg_class c ON c.oid = i.indexrelid
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
             WHERE c.relname = $1 AND c.relnamespace = current_schema()::regnamespace
             ORDER BY array_position(i.indkey::int2[], a.attnum)",
            &[&format!("{table}_keys")],
        )
        .await?
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()?;
    if found.as_slice() == keys {
        return Ok(());
    }
    let duplicated = if found.is_empty() && !keys.is_empty() {
        tx.query_one(&crate::changes::duplicated_keys(table, keys), &[])
            .await?
            .try_get(0)?
    } else {
        false
    };
    crate::changes::check_keys(table, &found, keys, || Ok(duplicated))?;
    tx.batch_execute(&format!(
        "ALTER TABLE \"{table}\" ADD COLUMN IF NOT EXISTS _sluice_deleted_at TIMESTAMPTZ"
    ))
    .await?;
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
