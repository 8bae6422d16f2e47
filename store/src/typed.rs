//! Typed tables: a table target with declared columns, filled by its flow's query.
//!
//! Guarantees, on both stores:
//! - A typed table holds the user's columns and sluice's own, whose names start with
//!   `_sluice_` ([`TYPED_ENVELOPE`]), so the two can never collide (the pipeline file refuses a
//!   user column with that prefix).
//! - Its rows are written in the commit's transaction, as `INSERT ... SELECT` of the flow's
//!   expressions over the batch's new records ([`TypedQuery`]): the store evaluates `select:`
//!   and `where:`; a record `where:` leaves out writes no row and is counted
//!   ([`crate::CommitOutcome::filtered`]), its ledger key recorded all the same.
//! - A record whose expression fails (a cast the value does not fit, a NULL in a column that is
//!   not nullable) fails the statement; the store then finds which record and which column, and
//!   says so ([`crate::StoreError::Record`]); nothing of the batch is written.
//! - At prepare, a declared column the table lacks is added if it is nullable; a column whose
//!   type differs from the declaration, or a new column that is not nullable on a table that
//!   has rows, is refused ([`crate::StoreError::Config`]) and nothing is changed.

use crate::StoreError;
use bytes::Bytes;

/// A column's type (the pipeline file's nine words).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColumnType {
    /// `text`.
    Text,
    /// `integer`: 64-bit.
    Integer,
    /// `double`: 64-bit float.
    Double,
    /// `numeric`: PostgreSQL `NUMERIC`; SQLite's `NUMERIC` affinity.
    Numeric,
    /// `boolean`.
    Boolean,
    /// `timestamp`: an instant, millisecond precision (SQLite: ISO 8601 text in UTC).
    Timestamp,
    /// `date` (SQLite: `YYYY-MM-DD` text).
    Date,
    /// `json` (PostgreSQL `JSONB`; SQLite: JSON text).
    Json,
    /// `bytes`.
    Bytes,
}

/// A declared column of a typed table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypedColumn {
    /// A validated identifier without the `_sluice_` prefix.
    pub name: String,
    /// Its type.
    pub ty: ColumnType,
    /// Whether it may be NULL.
    pub nullable: bool,
}

/// A typed table target of a layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypedTable {
    /// The target's name (the table is `<pipeline>__<target>`).
    pub target: String,
    /// Its declared columns.
    pub columns: Vec<TypedColumn>,
    /// Its key columns: a table of the latest change per key, with a unique index on them and
    /// `_sluice_deleted_at` (see `changes.rs`); empty for an append table.
    pub keys: Vec<String>,
}

/// An expression written out for each store (checked by the pipeline file's validation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sql {
    /// For PostgreSQL.
    pub postgres: String,
    /// For SQLite.
    pub sqlite: String,
}

/// What a flow writes into its typed table: the decoded fields each record carries (in the
/// order of [`crate::Effect::Row`]'s values), then each filled column's expression over them
/// and the envelope (`_sluice_message_id`, `_sluice_publish_time`, `_sluice_event_time`,
/// `_sluice_attributes`, `_sluice_data`), and the `where:` condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypedQuery {
    /// The decoded fields, in the order each row's values come.
    pub fields: Vec<(String, ColumnType)>,
    /// The columns filled, each with its expression, in the table's column order.
    pub select: Vec<(TypedColumn, Sql)>,
    /// `where:`.
    pub filter: Option<Sql>,
    /// `expect:`: each expectation's name and check over the output (the target's columns as
    /// `select` fills them, and the envelope), evaluated before the commit
    /// ([`crate::LedgerStore::violations`]).
    pub expectations: Vec<(String, Sql)>,
    /// Columns added to the query while the flow runs (its table follows the topic's Pub/Sub
    /// schema, and a new revision added fields), nullable: the commit's transaction first
    /// adds those the table lacks, so the transaction that first needs a column adds it.
    /// Empty for a query the table was prepared with.
    pub grown: Vec<TypedColumn>,
    /// An update flow's rule: each change is applied to its key's row (`changes.rs`) instead
    /// of appended.
    pub changes: Option<crate::ChangeRule>,
}

/// The flow's output over a relation `s` that has the envelope, the decoded fields and a row
/// number (`row`): the row number, whether `where` keeps the row (`_sluice_kept`), the
/// envelope, and each filled column under its name. `sql` picks a store's text of an
/// expression. The relation expectations are checked on.
pub(crate) fn output_columns(query: &TypedQuery, row: &str, sql: impl Fn(&Sql) -> &str) -> String {
    let kept = query
        .filter
        .as_ref()
        .map_or_else(|| "TRUE".to_owned(), |f| format!("({}) IS TRUE", sql(f)));
    let mut out = format!(
        "{row} AS _sluice_row, {kept} AS _sluice_kept, _sluice_message_id, _sluice_publish_time,
         _sluice_event_time, _sluice_attributes, _sluice_data"
    );
    for (column, expression) in &query.select {
        out.push_str(&format!(", {} AS \"{}\"", sql(expression), column.name));
    }
    out
}

/// The column a failing expectation check is reported under ([`crate::StoreError::Record`]).
pub fn expectation_column(name: &str) -> String {
    format!("expect:{name}")
}

/// One decoded value.
#[derive(Debug, Clone, PartialEq)]
pub enum TypedValue {
    /// Absent or null.
    Null,
    /// Text.
    Text(String),
    /// An integer.
    Integer(i64),
    /// A float.
    Double(f64),
    /// A decimal, as its digits (`-12.30`).
    Numeric(String),
    /// A boolean.
    Boolean(bool),
    /// An instant, ms since the Unix epoch.
    Timestamp(i64),
    /// A date, `YYYY-MM-DD`.
    Date(String),
    /// JSON text.
    Json(String),
    /// Bytes.
    Bytes(Bytes),
}

/// The names of sluice's own columns in a target table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Envelope {
    pub(crate) flow: &'static str,
    pub(crate) dedup_key: &'static str,
    pub(crate) message_id: &'static str,
    pub(crate) publish_time: &'static str,
    pub(crate) event_time: &'static str,
}

/// Sluice's envelope table.
pub(crate) const PLAIN_ENVELOPE: Envelope = Envelope {
    flow: "flow",
    dedup_key: "dedup_key",
    message_id: "message_id",
    publish_time: "publish_time",
    event_time: "event_time",
};

/// A typed table's own columns.
pub(crate) const TYPED_ENVELOPE: Envelope = Envelope {
    flow: "_sluice_flow",
    dedup_key: "_sluice_dedup_key",
    message_id: "_sluice_message_id",
    publish_time: "_sluice_publish_time",
    event_time: "_sluice_event_time",
};

/// A table of the latest change per key cannot be read as a feed yet (its updated rows would
/// be missed or read again, its tombstones read as rows).
pub(crate) fn refuse_feed_of_keyed(table: &str) -> StoreError {
    StoreError::Config(format!(
        "table {table} holds the latest change per key (`keys:`); a flow following its \
         changes is not built yet"
    ))
}

/// What sluice's own columns of a typed table start with.
pub(crate) const RESERVED: &str = "_sluice_";

/// A type's word in the pipeline file.
pub(crate) fn keyword(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::Text => "text",
        ColumnType::Integer => "integer",
        ColumnType::Double => "double",
        ColumnType::Numeric => "numeric",
        ColumnType::Boolean => "boolean",
        ColumnType::Timestamp => "timestamp",
        ColumnType::Date => "date",
        ColumnType::Json => "json",
        ColumnType::Bytes => "bytes",
    }
}

/// A column of an existing table, as its catalog reports it.
pub(crate) struct ExistingColumn {
    /// Its name.
    pub(crate) name: String,
    /// Its type as the catalog spells it.
    pub(crate) ty: String,
    /// Whether it may be NULL.
    pub(crate) nullable: bool,
}

/// Refusing a change to an existing typed table, saying nothing was changed.
pub(crate) fn refuse_evolution(table: &str, why: &str) -> StoreError {
    StoreError::Config(format!(
        "typed table {table}: {why}; nothing was changed (drop or rename the table, or declare \
         the column as it is)"
    ))
}

/// What bringing an existing typed table to `columns` asks, the same on both stores: the
/// declared columns it lacks, or a refusal (an envelope table of that name, a column whose type
/// — as `catalog_type` spells a declared one — or nullability differs, an undeclared column that
/// is not nullable). Whether a missing column may be added is each store's to say.
pub(crate) fn columns_to_add<'a>(
    table: &str,
    columns: &'a [TypedColumn],
    existing: &[ExistingColumn],
    catalog_type: impl Fn(ColumnType) -> &'static str,
) -> Result<Vec<&'a TypedColumn>, StoreError> {
    if !existing.iter().any(|c| c.name == TYPED_MARK) {
        return Err(refuse_evolution(
            table,
            "it exists as sluice's envelope table (no `columns:`)",
        ));
    }
    let says = |nullable: bool| if nullable { "nullable" } else { "not nullable" };
    let mut added = Vec::new();
    for column in columns {
        match existing.iter().find(|c| c.name == column.name) {
            Some(found) if !found.ty.eq_ignore_ascii_case(catalog_type(column.ty)) => {
                return Err(refuse_evolution(
                    table,
                    &format!(
                        "column `{}` is {} in the table and declared {}",
                        column.name,
                        found.ty,
                        keyword(column.ty)
                    ),
                ));
            }
            Some(found) if found.nullable != column.nullable => {
                return Err(refuse_evolution(
                    table,
                    &format!(
                        "column `{}` is {} in the table and declared {}",
                        column.name,
                        says(found.nullable),
                        says(column.nullable)
                    ),
                ));
            }
            Some(_) => {}
            None => added.push(column),
        }
    }
    if let Some(undeclared) = existing.iter().find(|c| {
        !c.nullable && !c.name.starts_with(RESERVED) && !columns.iter().any(|d| d.name == c.name)
    }) {
        return Err(refuse_evolution(
            table,
            &format!(
                "column `{}` is in the table, not nullable, and no longer declared",
                undeclared.name
            ),
        ));
    }
    Ok(added)
}

/// The column that tells a typed table from an envelope table.
pub(crate) const TYPED_MARK: &str = "_sluice_flow";

/// Milliseconds since the epoch as `YYYY-MM-DDTHH:MM:SS.sssZ` (SQLite's form of a timestamp:
/// fixed width, so text order is time order). `None` outside years 0000–9999.
pub(crate) fn iso_millis(ms: i64) -> Option<String> {
    let instant = jiff::Timestamp::from_millisecond(ms).ok()?;
    let text = instant.strftime("%Y-%m-%dT%H:%M:%S.%3fZ").to_string();
    (text.len() == 24).then_some(text)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn iso_millis_is_fixed_width_utc() {
        assert_eq!(iso_millis(0).as_deref(), Some("1970-01-01T00:00:00.000Z"));
        assert_eq!(
            iso_millis(1_796_406_921_169).as_deref(),
            Some("2026-12-04T17:55:21.169Z")
        );
        assert_eq!(iso_millis(-1).as_deref(), Some("1969-12-31T23:59:59.999Z"));
        assert_eq!(
            iso_millis(951_782_400_000).as_deref(),
            Some("2000-02-29T00:00:00.000Z")
        );
    }
}
