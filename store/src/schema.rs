//! Table names, shared by both backends (each backend's DDL is its own `schema.rs`).
//!
//! Identifiers come from the pipeline file and are validated there; they are checked again
//! here, because they are the only thing ever spliced into SQL (always double-quoted).

use crate::StoreError;

/// Whether `name` is a valid sluice identifier: `[a-z_][a-z0-9_]*`, 1..=48 bytes.
pub fn is_identifier(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
        && name.len() <= 48
}

/// The SQL table of a target: `<pipeline>__<target>`.
pub fn table_name(pipeline: &str, target: &str) -> Result<String, StoreError> {
    for part in [pipeline, target] {
        if !is_identifier(part) {
            return Err(StoreError::Config(format!(
                "{part:?} is not a valid identifier"
            )));
        }
    }
    Ok(format!("{pipeline}__{target}"))
}

/// The counts table of a `window` target: `<pipeline>__<target>__windows`.
pub fn window_table_name(pipeline: &str, target: &str) -> Result<String, StoreError> {
    table_name(pipeline, target)?;
    table_name(pipeline, &format!("{target}__windows"))
}

/// Checks that `table` is a target table name (`<pipeline>__<target>`, both identifiers), the
/// only form spliced into queries that take a table name from the caller.
pub(crate) fn check_table(table: &str) -> Result<(), StoreError> {
    match table.split_once("__") {
        Some((pipeline, target)) => table_name(pipeline, target).map(|_| ()),
        None => Err(StoreError::Config(format!(
            "{table:?} is not a target table"
        ))),
    }
}

/// The tables that hold a flow's state under its `flow_id` and that a reset of the flow clears,
/// the same on both backends. Beside them a reset deletes the flow's ledger keys (by window and
/// flow) and its watermark's message reports (unless a seek's replay holds the watermark), and
/// its counters ([`RESET_CLEARS_APART`]), and keeps the flow's identity ([`RESET_KEEPS`]).
/// `store/tests/flows_contract.rs` checks the three lists against each backend's schema: a new
/// table with a `flow_id` must be put in one of them.
pub const RESET_CLEARS: [&str; 7] = [
    "sluice_completions",
    "sluice_expectation_counts",
    "sluice_drains",
    "sluice_commit_marks",
    "sluice_watermarks",
    "sluice_window_marks",
    "sluice_read_positions",
];

/// Per-flow tables a reset clears on terms of their own (see [`RESET_CLEARS`]): the ledger, the
/// watermark's message reports, and PostgreSQL's sharded commit counters (SQLite keeps them in
/// `sluice_flows`, set back to 0 there).
pub const RESET_CLEARS_APART: [&str; 3] = [
    "sluice_ledger",
    "sluice_watermark_messages",
    "sluice_flow_counters",
];

/// Per-flow tables a reset keeps: the flow's identity, which its handles hold.
pub const RESET_KEEPS: [&str; 1] = ["sluice_flows"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        assert!(is_identifier("orders"));
        assert!(is_identifier("_x1"));
        assert!(!is_identifier(""));
        assert!(!is_identifier("1x"));
        assert!(!is_identifier("Orders"));
        assert!(!is_identifier("a\"; drop table x; --"));
        assert!(!is_identifier(&"a".repeat(49)));
        assert!(table_name("p", "t").is_ok());
        assert!(table_name("p", "T").is_err());
    }
}
