//! `schedule.on_update` (SPEC §7): `true` (a run when any table of another pipeline that a
//! flow reads got rows), or a condition over some of those tables, as Airflow's dataset
//! conditions: `{ any_of: [P.T, ...] }` or `{ all_of: [P.T, ...] }`. Checked here: exactly one
//! list, not empty, no name twice, and (against the flows) each name a table a flow of the
//! pipeline reads, so a condition can always become true.

use crate::errors::{Collector, ErrorCode};
use crate::model::{Pipeline, Source};
use crate::raw::{RawOnUpdate, RawUpdateCondition};
use crate::schedule::UpdateCondition;

const KEY: &str = "schedule.on_update";

/// Whether runs fire on updates, and on which tables' (errors pushed to `c`).
pub(crate) fn on_update(
    c: &mut Collector<'_>,
    raw: Option<RawOnUpdate>,
) -> (bool, UpdateCondition) {
    let (any_of, all_of) = match raw {
        None | Some(RawOnUpdate::Any(false)) => return (false, UpdateCondition::AnyRead),
        Some(RawOnUpdate::Any(true)) => return (true, UpdateCondition::AnyRead),
        Some(RawOnUpdate::Condition(RawUpdateCondition { any_of, all_of })) => (any_of, all_of),
    };
    let (key, tables, condition): (_, _, fn(Vec<String>) -> UpdateCondition) =
        match (any_of, all_of) {
            (Some(tables), None) => ("any_of", tables, UpdateCondition::AnyOf),
            (None, Some(tables)) => ("all_of", tables, UpdateCondition::AllOf),
            _ => {
                c.push(
                    ErrorCode::InvalidSchedule,
                    KEY,
                    "give `true`, or exactly one of `any_of` and `all_of` (a list of \
                     PIPELINE.TARGET tables the flows read)",
                );
                return (false, UpdateCondition::AnyRead);
            }
        };
    let at = format!("{KEY}.{key}");
    if tables.is_empty() {
        c.push(
            ErrorCode::InvalidSchedule,
            &at,
            format!("`{key}` names no table: list the PIPELINE.TARGET tables, or say `true`"),
        );
        return (false, UpdateCondition::AnyRead);
    }
    let mut seen = std::collections::HashSet::new();
    for (i, table) in tables.iter().enumerate() {
        if !seen.insert(table) {
            c.push(
                ErrorCode::InvalidSchedule,
                &format!("{at}[{i}]"),
                format!("`{table}` is listed twice"),
            );
        }
    }
    (true, condition(tables))
}

/// Each table a condition names is one a flow of `p` reads (`source: { table: P.T }`).
pub(crate) fn check_tables(p: &Pipeline, c: &mut Collector<'_>) {
    let Some(schedule) = &p.schedule else {
        return;
    };
    let (key, tables) = match &schedule.update_condition {
        UpdateCondition::AnyRead => return,
        UpdateCondition::AnyOf(tables) => ("any_of", tables),
        UpdateCondition::AllOf(tables) => ("all_of", tables),
    };
    let read: Vec<String> = p
        .flows
        .iter()
        .filter_map(|f| match &f.source {
            Source::PipelineTable { pipeline, target } => Some(format!("{pipeline}.{target}")),
            _ => None,
        })
        .collect();
    for (i, table) in tables.iter().enumerate() {
        if !read.contains(table) {
            c.push(
                ErrorCode::InvalidSchedule,
                &format!("{KEY}.{key}[{i}]"),
                format!(
                    "`{table}` is not a table a flow of this pipeline reads (they read: {})",
                    if read.is_empty() {
                        "none".to_owned()
                    } else {
                        read.join(", ")
                    }
                ),
            );
        }
    }
}
