//! Update flows into a keyed typed table (SCD type 1): each change of a batch is applied to
//! its key's row in the commit's transaction, by one `INSERT ... ON CONFLICT DO UPDATE`
//! statement written here for both stores.
//!
//! Guarantees, on both stores:
//! - **The latest change per key wins, whatever the arrival order.** A key's row holds the
//!   change with the greatest `(sequence, dedup key)`; a change is applied only if its pair is
//!   greater than the row's, so an older change arriving later changes nothing, and equal
//!   sequences are decided by the dedup key (deterministic, not by arrival). Within a batch
//!   only each key's greatest change is written.
//! - **A delete leaves a tombstone.** A change `apply_as_deletes` matches keeps the key's row
//!   with `_sluice_deleted_at` set, its other columns NULL, and its sequence: an older upsert
//!   arriving after it does not bring the key back; a newer one does. Tombstones are kept (no
//!   collection yet).
//! - **Concurrent commits agree with a sequential replay.** The statement writes its rows in
//!   key order and the comparison is made on the row under its lock (the conflict's row
//!   version), so two replicas applying changes of one key end in the state of the greater
//!   change, and do not deadlock on each other's keys.
//! - `ignore_null_updates`: an update's NULL columns keep the row's values, as the row holds
//!   them when the batch is applied. Only each key's greatest change of a batch is applied, so
//!   with several updates of a key in one batch the result depends on the batching: the
//!   pipeline file refuses the setting until that is built.

use crate::StoreError;
use crate::typed::{Sql, TypedQuery};

/// How a flow's changes are applied to its keyed table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeRule {
    /// The table's key columns.
    pub keys: Vec<String>,
    /// The column ordering a key's changes.
    pub sequence_by: String,
    /// `apply_as_deletes`, over the flow's fields and envelope.
    pub deletes: Option<Sql>,
    /// `ignore_null_updates`.
    pub ignore_null_updates: bool,
}

/// The sluice columns an applied change writes (from the change, as they are), on both stores;
/// SQLite also writes `_sluice_seq`.
pub(crate) const WRITTEN: [&str; 7] = [
    "_sluice_dedup_key",
    "_sluice_message_id",
    "_sluice_publish_time",
    "_sluice_event_time",
    "_sluice_flow",
    "_sluice_committed_at",
    "_sluice_deleted_at",
];

/// The store a statement is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Postgres,
    Sqlite,
}

impl Dialect {
    fn of(self, sql: &Sql) -> &str {
        match self {
            Dialect::Postgres => &sql.postgres,
            Dialect::Sqlite => &sql.sqlite,
        }
    }
}

fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The changes of `src` (the relation with the envelope and the decoded fields) that `where:`
/// keeps: the envelope, each column under its name (NULL for a delete's columns other than
/// the key and the sequence), and whether it deletes (`_sluice_delete`). `extra` are more
/// columns of `src` carried along (SQLite's stored times and feed order).
pub(crate) fn changes(
    query: &TypedQuery,
    rule: &ChangeRule,
    src: &str,
    extra: &str,
    dialect: Dialect,
) -> String {
    let delete = rule.deletes.as_ref().map_or_else(
        || "FALSE".to_owned(),
        |d| format!("({}) IS TRUE", dialect.of(d)),
    );
    let mut columns = String::new();
    for (column, expression) in &query.select {
        let value = dialect.of(expression);
        let kept = rule.keys.contains(&column.name) || column.name == rule.sequence_by;
        if kept || rule.deletes.is_none() {
            columns.push_str(&format!(", {value} AS \"{}\"", column.name));
        } else {
            columns.push_str(&format!(
                ", CASE WHEN {delete} THEN NULL ELSE {value} END AS \"{}\"",
                column.name
            ));
        }
    }
    let filter = query.filter.as_ref().map_or_else(String::new, |f| {
        format!("WHERE ({}) IS TRUE", dialect.of(f))
    });
    // A change with NULL in a column that may not hold it (a key, the sequence, or another
    // column of an update) wins its key, so that its write fails and it is dead-lettered
    // whatever else its batch holds.
    let mut invalid: Vec<String> = Vec::new();
    for (column, expression) in &query.select {
        if column.nullable {
            continue;
        }
        let kept = rule.keys.contains(&column.name) || column.name == rule.sequence_by;
        let null = format!("({}) IS NULL", dialect.of(expression));
        invalid.push(if kept || rule.deletes.is_none() {
            null
        } else {
            format!("(NOT {delete} AND {null})")
        });
    }
    let invalid = if invalid.is_empty() {
        "FALSE".to_owned()
    } else {
        invalid.join(" OR ")
    };
    format!(
        "SELECT s._sluice_dedup_key, s._sluice_message_id{extra}{columns}, {delete} AS _sluice_delete,
                ({invalid}) AS _sluice_invalid
         FROM ({src}) s {filter}"
    )
}

/// Each key's greatest change among `changes` (a relation), in key order; a change that cannot
/// be written (`_sluice_invalid`) first.
pub(crate) fn winners(rule: &ChangeRule, changes: &str, dialect: Dialect) -> String {
    let keys = quoted(&rule.keys);
    let order = format!(
        "_sluice_invalid DESC, \"{}\" DESC, _sluice_dedup_key DESC",
        rule.sequence_by
    );
    match dialect {
        Dialect::Postgres => format!(
            "SELECT * FROM (SELECT DISTINCT ON ({keys}) * FROM ({changes}) c
                            ORDER BY {keys}, {order}) w
             ORDER BY {keys}"
        ),
        Dialect::Sqlite => format!(
            "SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY {keys} ORDER BY {order})
                                  AS _sluice_rank
                            FROM ({changes}) c) w
             WHERE _sluice_rank = 1 ORDER BY {keys}"
        ),
    }
}

/// The `ON CONFLICT` clause applying a winner to its key's row of `table`: the winner's
/// values (an update's NULLs kept from the row with `ignore_null_updates`), only if its
/// `(sequence, dedup key)` is greater than the row's. `envelope` are the envelope columns
/// written (taken from the winner as they are).
pub(crate) fn on_conflict(
    table: &str,
    query: &TypedQuery,
    rule: &ChangeRule,
    envelope: &[&str],
) -> String {
    let row = format!("\"{table}\"");
    let mut set: Vec<String> = envelope
        .iter()
        .map(|c| format!("{c} = excluded.{c}"))
        .collect();
    for (column, _) in &query.select {
        let name = &column.name;
        if rule.keys.contains(name) {
            continue;
        }
        let fixed = name == &rule.sequence_by || !rule.ignore_null_updates;
        set.push(if fixed {
            format!("\"{name}\" = excluded.\"{name}\"")
        } else {
            format!(
                "\"{name}\" = CASE WHEN excluded._sluice_deleted_at IS NULL
                     THEN COALESCE(excluded.\"{name}\", {row}.\"{name}\") END"
            )
        });
    }
    let sequence = &rule.sequence_by;
    format!(
        "ON CONFLICT ({}) DO UPDATE SET {}
         WHERE ({row}.\"{sequence}\", {row}._sluice_dedup_key)
             < (excluded.\"{sequence}\", excluded._sluice_dedup_key)",
        quoted(&rule.keys),
        set.join(", ")
    )
}

/// Whether an existing table's keys (`found`: its `<table>_keys` index's columns, empty for
/// none) may become `keys`, the same on both stores: they are the same, or an append table
/// gains keys its rows do not repeat (`duplicated`: whether some do). Keys that changed, or
/// were taken out, are refused, changing nothing.
pub(crate) fn check_keys(
    table: &str,
    found: &[String],
    keys: &[String],
    duplicated: impl FnOnce() -> Result<bool, StoreError>,
) -> Result<(), StoreError> {
    if found == keys {
        return Ok(());
    }
    if !found.is_empty() {
        return Err(crate::typed::refuse_evolution(
            table,
            &format!(
                "its keys are [{}] and the file says [{}]; a table's keys do not change",
                found.join(", "),
                keys.join(", ")
            ),
        ));
    }
    if duplicated()? {
        return Err(crate::typed::refuse_evolution(
            table,
            &format!(
                "some of its rows share their [{}]: it cannot become a table of one row per key",
                keys.join(", ")
            ),
        ));
    }
    Ok(())
}

/// SQL: whether two rows of `table` share their `keys`.
pub(crate) fn duplicated_keys(table: &str, keys: &[String]) -> String {
    format!(
        "SELECT EXISTS (SELECT 1 FROM \"{table}\" GROUP BY {} HAVING count(*) > 1)",
        quoted(keys)
    )
}

/// The unique index of a keyed table (none for an append table).
pub(crate) fn keys_index(table: &str, keys: &[String]) -> String {
    if keys.is_empty() {
        return String::new();
    }
    format!(
        "CREATE UNIQUE INDEX IF NOT EXISTS \"{table}_keys\" ON \"{table}\" ({});",
        quoted(keys)
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::typed::{ColumnType, TypedColumn};

    fn query() -> TypedQuery {
        let column = |name: &str, nullable| TypedColumn {
            name: name.to_owned(),
            ty: ColumnType::Integer,
            nullable,
        };
        let sql = |text: &str| Sql {
            postgres: text.to_owned(),
            sqlite: text.to_owned(),
        };
        TypedQuery {
            fields: Vec::new(),
            select: vec![
                (column("id", false), sql("\"id\"")),
                (column("seq", false), sql("\"seq\"")),
                (column("v", true), sql("\"v\"")),
            ],
            filter: None,
            expectations: Vec::new(),
            grown: Vec::new(),
            changes: None,
        }
    }

    fn rule(ignore_null_updates: bool) -> ChangeRule {
        ChangeRule {
            keys: vec!["id".to_owned()],
            sequence_by: "seq".to_owned(),
            deletes: Some(Sql {
                postgres: "op = 'D'".to_owned(),
                sqlite: "op = 'D'".to_owned(),
            }),
            ignore_null_updates,
        }
    }

    #[test]
    fn a_deletes_other_columns_are_null_and_keys_are_never_set() {
        let text = changes(&query(), &rule(false), "src", "", Dialect::Sqlite);
        assert!(text.contains("CASE WHEN (op = 'D') IS TRUE THEN NULL ELSE \"v\" END AS \"v\""));
        assert!(text.contains("\"id\" AS \"id\""));
        let clause = on_conflict("t", &query(), &rule(true), &["_sluice_flow"]);
        assert!(!clause.contains("\"id\" ="), "{clause}");
        assert!(
            clause.contains("COALESCE(excluded.\"v\", \"t\".\"v\")"),
            "{clause}"
        );
        assert!(clause.contains("\"seq\" = excluded.\"seq\""), "{clause}");
    }
}
