//! Update flows: a table target's `keys:` and a flow's `apply_changes:` (Lakeflow's AUTO CDC,
//! SCD type 1), checked against the target's columns and compiled over the flow's fields.
//!
//! A table with `keys:` holds one row per key, the latest change by `sequence_by`; every flow
//! writing it applies changes, and only such flows may. Keys and the sequence are columns that
//! are not nullable (a change without them is a dead letter naming the column, as any record
//! whose value does not fit). What the store does with them: `sluice_store::ChangeRule`.

use crate::errors::{Collector, ErrorCode};
use crate::expression::{self, Expression};
use crate::model::{Column, ColumnType, Flow, FlowQuery, Target, TargetKind};
use crate::raw::RawApplyChanges;

/// `flows[i].apply_changes`, compiled: how a change of the flow's query is applied to its
/// keyed target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyChanges {
    /// `sequence_by`: the target column ordering a key's changes; the greatest wins, whatever
    /// the order they arrive in (equal ones: the greater dedup key).
    pub sequence_by: String,
    /// `apply_as_deletes`: a condition over the flow's fields; a change for which it is true
    /// deletes its key (leaving a tombstone that older changes do not pass).
    pub deletes: Option<Expression>,
    /// `ignore_null_updates`: an update's NULL columns keep the row's values.
    pub ignore_null_updates: bool,
}

/// Types a sequence may have: those with an order.
const ORDERED: [ColumnType; 6] = [
    ColumnType::Integer,
    ColumnType::Double,
    ColumnType::Numeric,
    ColumnType::Timestamp,
    ColumnType::Date,
    ColumnType::Text,
];

/// The flows writing one keyed table order its changes by one column: a row written by one
/// flow is compared by the others on that column.
pub(crate) fn one_sequence_per_table(c: &mut Collector<'_>, flows: &[Flow]) {
    for (i, flow) in flows.iter().enumerate() {
        let Some(changes) = &flow.query.changes else {
            continue;
        };
        let first = flows[..i].iter().find_map(|earlier| {
            let theirs = earlier.query.changes.as_ref()?;
            (earlier.target == flow.target && theirs.sequence_by != changes.sequence_by)
                .then_some((earlier, theirs))
        });
        if let Some((earlier, theirs)) = first {
            c.push(
                ErrorCode::InvalidValue,
                &format!("flows[{i}].apply_changes.sequence_by"),
                format!(
                    "flow `{}` orders `{}`'s changes by `{}`; every flow writing a table of \
                     the latest change per key orders them by the same column",
                    earlier.name, flow.target, theirs.sequence_by
                ),
            );
        }
    }
}

/// `targets[i].keys`: columns of the table, not nullable, each once; `path` is `targets[i]`.
pub(crate) fn keys(
    c: &mut Collector<'_>,
    raw: Option<Vec<String>>,
    path: &str,
    kind: &TargetKind,
    columns: &[Column],
) -> Vec<String> {
    let Some(keys) = raw else {
        return Vec::new();
    };
    let at = format!("{path}.keys");
    if !matches!(kind, TargetKind::Table) || columns.is_empty() {
        c.push(
            ErrorCode::InvalidValue,
            &at,
            "`keys` belongs to a table target with `columns:` (a table of the latest change per \
             key)",
        );
        return Vec::new();
    }
    if keys.is_empty() {
        c.push(
            ErrorCode::InvalidValue,
            &at,
            "`keys` lists at least one column",
        );
    }
    for (j, key) in keys.iter().enumerate() {
        let key_at = format!("{at}[{j}]");
        match columns.iter().find(|column| column.name == *key) {
            None => c.push(
                ErrorCode::InvalidValue,
                &key_at,
                format!("`{key}` is not a column of this table"),
            ),
            Some(column) if column.nullable => c.push(
                ErrorCode::InvalidValue,
                &key_at,
                format!("key column `{key}` must not be nullable: declare `nullable: false`"),
            ),
            Some(_) => {}
        }
        if keys[..j].contains(key) {
            c.push(
                ErrorCode::DuplicateName,
                &key_at,
                format!("`{key}` is listed twice"),
            );
        }
    }
    keys
}

/// `flows[i].apply_changes` against the flow's `target`: required for a keyed target, refused
/// for any other; `path` is `flows[i]`.
pub(crate) fn apply_changes(
    c: &mut Collector<'_>,
    raw: Option<RawApplyChanges>,
    path: &str,
    query: &FlowQuery,
    target: Option<&Target>,
) -> Option<ApplyChanges> {
    let at = format!("{path}.apply_changes");
    let target = target?;
    let raw = match (raw, target.keys.is_empty()) {
        (None, true) => return None,
        (None, false) => {
            c.push(
                ErrorCode::MissingField,
                &at,
                format!(
                    "target `{}` has `keys:`, so a flow writing it applies changes: add \
                     `apply_changes: {{ sequence_by: COLUMN }}`",
                    target.name
                ),
            );
            return None;
        }
        (Some(_), true) => {
            c.push(
                ErrorCode::InvalidValue,
                &at,
                format!(
                    "`apply_changes` writes a table of the latest change per key: give target \
                     `{}` `keys:`",
                    target.name
                ),
            );
            return None;
        }
        (Some(raw), false) => raw,
    };
    if let Some(scd) = raw.stored_as_scd_type
        && scd != 1
    {
        c.push(
            ErrorCode::InvalidValue,
            &format!("{at}.stored_as_scd_type"),
            format!(
                "`{scd}`: SCD type 1 (the latest change per key) is the one built; type 2 \
                 (history rows) is not built yet"
            ),
        );
    }
    let sequence_at = format!("{at}.sequence_by");
    let sequence_by = crate::fields::required(c, raw.sequence_by, &sequence_at);
    if !sequence_by.is_empty() {
        match target.columns.iter().find(|col| col.name == sequence_by) {
            None => c.push(
                ErrorCode::InvalidValue,
                &sequence_at,
                format!("`{sequence_by}` is not a column of `{}`", target.name),
            ),
            Some(column) if column.nullable => c.push(
                ErrorCode::InvalidValue,
                &sequence_at,
                format!(
                    "sequence column `{sequence_by}` must not be nullable: declare \
                     `nullable: false` (a change without a sequence is a dead letter)"
                ),
            ),
            Some(column) if !ORDERED.contains(&column.ty) => c.push(
                ErrorCode::InvalidValue,
                &sequence_at,
                format!(
                    "sequence column `{sequence_by}` holds {} values, which have no order",
                    column.ty.keyword()
                ),
            ),
            Some(_) if target.keys.contains(&sequence_by) => c.push(
                ErrorCode::InvalidValue,
                &sequence_at,
                format!("`{sequence_by}` is a key; the sequence orders a key's changes"),
            ),
            Some(_) => {}
        }
    }
    let deletes = raw.apply_as_deletes.and_then(|text| {
        let deletes_at = format!("{at}.apply_as_deletes");
        // A tombstone keeps the key and the sequence; its other columns are NULL.
        for column in &target.columns {
            let kept = target.keys.contains(&column.name) || column.name == sequence_by;
            if !kept && !column.nullable {
                c.push(
                    ErrorCode::InvalidValue,
                    &deletes_at,
                    format!(
                        "a deleted key keeps a tombstone row with NULL in its other columns, \
                         so column `{}` of `{}` must be nullable",
                        column.name, target.name
                    ),
                );
            }
        }
        let mut fields: Vec<(String, ColumnType)> = query
            .fields
            .iter()
            .map(|f| (f.name.clone(), f.ty))
            .collect();
        fields.extend(crate::query::envelope_fields());
        match expression::compile(&text, &fields) {
            Ok(e) if matches!(e.ty, Some(ColumnType::Boolean) | None) => Some(e),
            Ok(_) => {
                c.push(
                    ErrorCode::InvalidExpression,
                    &deletes_at,
                    format!("`apply_as_deletes` is a condition; `{text}` is not"),
                );
                None
            }
            Err(why) => {
                c.push(ErrorCode::InvalidExpression, &deletes_at, why);
                None
            }
        }
    });
    let ignore_null_updates = raw.ignore_null_updates.unwrap_or(false);
    if ignore_null_updates {
        c.push(
            ErrorCode::InvalidValue,
            &format!("{at}.ignore_null_updates"),
            "`ignore_null_updates: true` is not built yet: applied a batch at a time, its result \
             would depend on how changes are batched",
        );
    }
    Some(ApplyChanges {
        sequence_by,
        deletes,
        ignore_null_updates,
    })
}
