//! `view` targets in the store: a named query over one typed table, created as a view
//! (`<pipeline>__<view>`) for people to query. Nothing is stored: a flow reading a view reads
//! its table with the view's query applied (the pipeline file rewrites it so), so the view
//! here serves readers outside sluice. On SQLite its casts are sluice's functions
//! (`sqlite/casts.rs`), registered on sluice's own connections only.

use crate::StoreError;
use crate::schema::check_table;
use crate::typed::{RESERVED, Sql, TypedColumn};

/// A view as the store creates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypedView {
    /// Its full name (`<pipeline>__<view>`).
    pub name: String,
    /// The full name of the typed table it reads.
    pub table: String,
    /// Its columns, each with the expression over the table that computes it.
    pub columns: Vec<(TypedColumn, Sql)>,
    /// Its condition: rows for which it is not true are not in the view.
    pub filter: Option<Sql>,
}

/// The store a view's DDL is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Postgres,
    Sqlite,
}

/// The statements that (re)create `view`: dropped if it exists (a view's columns may change
/// from one version of the file to the next), then created with its columns and the table's
/// own `_sluice_` columns. The caller has checked that the name is not a table's.
pub(crate) fn ddl(view: &TypedView, dialect: Dialect) -> Result<String, StoreError> {
    check_table(&view.name)?;
    check_table(&view.table)?;
    let pick = |sql: &Sql| match dialect {
        Dialect::Postgres => sql.postgres.clone(),
        Dialect::Sqlite => sql.sqlite.clone(),
    };
    let mut columns = Vec::new();
    for (column, sql) in &view.columns {
        if !crate::is_identifier(&column.name) || column.name.starts_with(RESERVED) {
            return Err(StoreError::Config(format!(
                "view column {:?} is not an identifier",
                column.name
            )));
        }
        columns.push(format!("{} AS \"{}\"", pick(sql), column.name));
    }
    let filter = view
        .filter
        .as_ref()
        .map_or_else(String::new, |f| format!(" WHERE ({}) IS TRUE", pick(f)));
    // The feed's order columns too, so another pipeline can read the view as a table.
    let order = match dialect {
        Dialect::Postgres => "_sluice_writer_xid, _sluice_seq",
        Dialect::Sqlite => "_sluice_seq",
    };
    Ok(format!(
        "DROP VIEW IF EXISTS \"{name}\";
         CREATE VIEW \"{name}\" AS
             SELECT {columns}, _sluice_dedup_key, _sluice_message_id, _sluice_publish_time,
                    _sluice_event_time, _sluice_flow, _sluice_committed_at, {order}
             FROM \"{table}\"{filter};",
        name = view.name,
        table = view.table,
        columns = columns.join(", "),
    ))
}

/// Refusing to create a table where a view of that name is (the target was a view).
pub(crate) fn not_a_table(name: &str) -> StoreError {
    StoreError::Config(format!(
        "{name} is a view (its target was a view); drop the view to make it a table"
    ))
}

/// Refusing to replace a table by a view of the same name (the target was a table).
pub(crate) fn not_a_view(name: &str) -> StoreError {
    StoreError::Config(format!(
        "{name} is a table (its target was a table); drop or rename the table to make it a view"
    ))
}
