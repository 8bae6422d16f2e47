//! SQLite: a `window` target's counts table and the emission of a flow's windows (see
//! [`crate::windows`]).
//!
//! An emission is one `BEGIN IMMEDIATE` transaction: it reads the flow's mark
//! (`sluice_window_marks`); without one of its window size it deletes the count rows of that
//! size first ([`mark_of_size`]); it counts the flow's rows (or all rows, [`WindowRows::All`])
//! of the windows between the mark and `before_ms`, writes the counts and moves the mark.
//! Another process sharing the file waits for the write lock, then starts from the moved mark.
//! The window arithmetic ([`plan`], [`mark_of_size`]) is shared with the PostgreSQL backend
//! (`crate::windows`).

use super::{SqliteStore, now_ms};
use crate::schema::check_table;
use crate::windows::{
    COUNTS_KEY, Plan, aggregate_inputs, aggregate_outputs, check_emission, mark_of_size, plan,
};
use crate::{
    FlowHandle, StoreError, WindowAggregate, WindowEmission, WindowGroup, WindowRows, WindowStore,
    WindowsEmitted,
};
use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

/// Creates the counts table `windows_table` if missing, and brings what older versions made
/// up to date: marks get their size column, a counts table keyed by `(window_start,
/// group_key)` is keyed by [`COUNTS_KEY`]. One write transaction, so processes sharing the file
/// prepare one after the other.
pub(crate) fn prepare_window_table(
    conn: &mut Connection,
    windows_table: &str,
) -> Result<(), StoreError> {
    check_table(windows_table)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let sized: i64 = tx.query_row(
        "SELECT count(*) FROM pragma_table_info('sluice_window_marks') WHERE name = 'size_ms'",
        [],
        |row| row.get(0),
    )?;
    if sized == 0 {
        tx.execute_batch("ALTER TABLE sluice_window_marks ADD COLUMN size_ms INTEGER")?;
    }
    tx.execute_batch(&counts_table_ddl(windows_table))?;
    // Part of the key since windows of two sizes may share a start; 0: not in the key.
    let end_in_key: i64 = tx.query_row(
        "SELECT pk FROM pragma_table_info(?1) WHERE name = 'window_end'",
        [windows_table],
        |row| row.get(0),
    )?;
    if end_in_key == 0 {
        rekey_counts_table(&tx, windows_table)?;
    }
    // Emissions read the flow's rows by event time, inside the single writer's transaction:
    // an index keeps that a range scan instead of a scan of the whole base table.
    // (Only when the base table exists: it does whenever a flow runs, since the layout is
    // prepared first.)
    let base = windows_table.strip_suffix("__windows").filter(|base| {
        tx.query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [base],
            |_| Ok(()),
        )
        .is_ok()
    });
    if let Some(base) = base {
        check_table(base)?;
        tx.execute_batch(&format!(
            "CREATE INDEX IF NOT EXISTS \"{base}__by_event_time\" ON \"{base}\" (flow, event_time);"
        ))?;
    }
    tx.commit()?;
    Ok(())
}

/// DDL of a counts table (a checked name).
fn counts_table_ddl(windows_table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS \"{windows_table}\" (
            window_start INTEGER NOT NULL,
            window_end   INTEGER NOT NULL,
            group_key    TEXT NOT NULL,
            count        INTEGER NOT NULL,
            emitted_at   INTEGER NOT NULL,
            PRIMARY KEY ({COUNTS_KEY})
        ) WITHOUT ROWID;"
    )
}

/// Rebuilds a counts table of an older version, keyed by `(window_start, group_key)`, with
/// [`COUNTS_KEY`], its rows kept (SQLite cannot change a primary key in place).
fn rekey_counts_table(tx: &Transaction<'_>, windows_table: &str) -> Result<(), StoreError> {
    let old = format!("{windows_table}__old_key");
    tx.execute_batch(&format!(
        "ALTER TABLE \"{windows_table}\" RENAME TO \"{old}\";
         {ddl}
         INSERT INTO \"{windows_table}\"
             SELECT window_start, window_end, group_key, count, emitted_at FROM \"{old}\";
         DROP TABLE \"{old}\";",
        ddl = counts_table_ddl(windows_table)
    ))?;
    tracing::info!(
        table = windows_table,
        "counts table keyed by window start and end"
    );
    Ok(())
}

/// Emits the flow's due windows in one transaction; `now_ms` is the `emitted_at` written.
pub(crate) fn emit_windows(
    conn: &mut Connection,
    flow: &FlowHandle,
    emission: &WindowEmission,
    now_ms: i64,
) -> Result<WindowsEmitted, StoreError> {
    check_emission(emission)?;
    let (base, windows) = (&emission.base_table, &emission.windows_table);
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // A typed table's own columns have their `_sluice_` names.
    let e = super::typed::envelope(&tx, base)?;
    let (event_time, flow_column) = (e.event_time, e.flow);
    let stored: Option<(i64, Option<i64>)> = tx
        .query_row(
            "SELECT emitted_before, size_ms FROM sluice_window_marks WHERE flow_id = ?1",
            params![flow.id],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?;
    let newest_row_size: Option<i64> = match stored {
        Some((_, None)) => tx
            .query_row(
                &format!(
                    "SELECT window_end - window_start FROM \"{windows}\"
                     ORDER BY window_start DESC LIMIT 1"
                ),
                [],
                |row| row.get(0),
            )
            .optional()?,
        _ => None,
    };
    let mark = mark_of_size(stored, emission.size_ms, newest_row_size);
    // No mark of this size: whatever count rows of it are there were emitted before a reset
    // or a size change, from rows that may have gone or changed since. They are counted again.
    let cleared = match mark {
        Some(_) => 0,
        None => tx.execute(
            &format!("DELETE FROM \"{windows}\" WHERE window_end - window_start = ?1"),
            params![emission.size_ms],
        )?,
    };
    // Which rows count: `?1` is the flow's name, or NULL for every row. A window over another
    // target's table reads it by event time alone, so it gets an index of its own (created
    // once, inside this writer's transaction).
    let (flow_filter, of_flow) = match emission.rows {
        WindowRows::OfTheFlow => (format!("{flow_column} = ?1"), Some(&*flow.name)),
        WindowRows::All => {
            tx.execute_batch(&format!(
                "CREATE INDEX IF NOT EXISTS \"{base}__by_event_time_only\" ON \"{base}\" ({event_time});"
            ))?;
            ("?1 IS NULL".to_owned(), None)
        }
    };
    let oldest: Option<i64> = match mark {
        Some(_) => None,
        None => tx.query_row(
            &format!("SELECT MIN({event_time}) FROM \"{base}\" WHERE {flow_filter}"),
            params![of_flow],
            |row| row.get(0),
        )?,
    };
    let (start, end) = match plan(emission, mark, oldest)? {
        Plan::Emit { start, end } => (start, end),
        Plan::Nothing(emitted) => {
            // Nothing else written: without a deletion, dropping the transaction rolls it back.
            if cleared > 0 {
                tx.commit()?;
            }
            return Ok(emitted);
        }
    };
    // The window start is the event time floored to a multiple of the size, without an
    // intermediate sum that could overflow. The group is looked up by key with `json_each`,
    // not by a JSON path: SQLite before 3.45 has no escapes in path labels, so a name with `"`
    // could not be named by one. It is cast to text as PostgreSQL's `->>` gives it (a JSON
    // number 1 is "1"). No row of these windows is in the table (the mark, or the deletion
    // above, says so): a plain insert, which fails loudly rather than drop a count.
    ensure_aggregate_columns(&tx, windows, &emission.aggregates)?;
    // `?3` is the attribute of the group, or the group of a row whose column is NULL (`''`).
    let (group, group_parameter) = match &emission.group {
        WindowGroup::Attribute(name) => (
            "CAST(COALESCE((SELECT a.value FROM json_each(attributes) AS a WHERE a.key = ?3), '')
                  AS TEXT)"
                .to_owned(),
            name.as_str(),
        ),
        WindowGroup::Column(column) => (format!("COALESCE(CAST(\"{column}\" AS TEXT), ?3)"), ""),
    };
    let inputs = aggregate_inputs(&emission.aggregates);
    let (names, values) = aggregate_outputs(&emission.aggregates);
    let rows = tx.execute(
        &format!(
            "INSERT INTO \"{windows}\" (window_start, window_end, group_key, count, emitted_at{names})
             SELECT window_start, window_start + ?2, group_key, COUNT(*), ?6{values}
             FROM (SELECT {event_time} - {event_time} % ?2
                              - CASE WHEN {event_time} % ?2 < 0 THEN ?2 ELSE 0 END AS window_start,
                          {group} AS group_key{inputs}
                   FROM \"{base}\"
                   WHERE {flow_filter} AND {event_time} >= ?4 AND {event_time} < ?5)
             GROUP BY window_start, group_key"
        ),
        params![
            of_flow,
            emission.size_ms,
            group_parameter,
            start,
            end,
            now_ms,
        ],
    )
    .map_err(overflow_is_final)?;
    // Under the write lock `end` is past the mark read above, or the mark was of another size.
    tx.execute(
        "INSERT INTO sluice_window_marks (flow_id, emitted_before, size_ms) VALUES (?1, ?2, ?3)
         ON CONFLICT (flow_id) DO UPDATE SET
             emitted_before = excluded.emitted_before, size_ms = excluded.size_ms",
        params![flow.id, end, emission.size_ms],
    )?;
    tx.commit()?;
    Ok(WindowsEmitted {
        rows: u64::try_from(rows).unwrap_or(u64::MAX),
        emitted_before_ms: end,
    })
}

/// Adds the aggregate columns the counts table lacks (inside the emission's write
/// transaction).
/// SQLite's `sum()` of integers fails past 64 bits, and would fail again at every retry: the
/// window flow fails, saying why, rather than stalls (PostgreSQL sums into numeric).
fn overflow_is_final(error: rusqlite::Error) -> StoreError {
    if error.to_string().contains("integer overflow") {
        StoreError::Config(format!(
            "a window's sum passes 64-bit integers, which SQLite cannot hold ({error}); \
             PostgreSQL keeps such sums as numeric"
        ))
    } else {
        error.into()
    }
}

fn ensure_aggregate_columns(
    tx: &Transaction<'_>,
    windows: &str,
    aggregates: &[WindowAggregate],
) -> Result<(), StoreError> {
    for aggregate in aggregates {
        let declared = super::typed::declared(aggregate.ty);
        let found: Option<String> = tx
            .query_row(
                "SELECT type FROM pragma_table_info(?1) WHERE name = ?2",
                [windows, aggregate.name.as_str()],
                |row| row.get(0),
            )
            .optional()?;
        match found {
            Some(found) if found == declared => {}
            Some(found) => {
                return Err(crate::windows::changed_aggregate(
                    windows, aggregate, &found,
                ));
            }
            None => tx.execute_batch(&format!(
                "ALTER TABLE \"{windows}\" ADD COLUMN \"{}\" {declared}",
                aggregate.name
            ))?,
        }
    }
    Ok(())
}

#[async_trait]
impl WindowStore for SqliteStore {
    async fn prepare_window_table(&self, windows_table: &str) -> Result<(), StoreError> {
        let windows_table = windows_table.to_owned();
        self.call(move |conn| self::prepare_window_table(conn, &windows_table))
            .await
    }

    async fn emit_windows(
        &self,
        flow: &FlowHandle,
        emission: &WindowEmission,
    ) -> Result<WindowsEmitted, StoreError> {
        let (flow, emission) = (flow.clone(), emission.clone());
        self.call(move |conn| self::emit_windows(conn, &flow, &emission, now_ms()))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::windows::tests::emission;

    /// A file of an older version: its marks table gets the size column (once, the mark kept).
    #[test]
    fn marks_of_an_older_version_get_a_size_column() {
        let mut conn = Connection::open_in_memory().expect("in-memory database");
        conn.execute_batch(
            "CREATE TABLE sluice_window_marks (
                 flow_id        INTEGER PRIMARY KEY,
                 emitted_before INTEGER NOT NULL
             );
             INSERT INTO sluice_window_marks VALUES (1, 20000);",
        )
        .expect("old marks");
        conn.execute_batch(crate::sqlite::schema::STATE_DDL)
            .expect("state tables");
        prepare_window_table(&mut conn, "p__w__windows").expect("prepared");
        prepare_window_table(&mut conn, "p__w__windows").expect("prepared again");
        let mark: (i64, Option<i64>) = conn
            .query_row(
                "SELECT emitted_before, size_ms FROM sluice_window_marks",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .expect("the mark");
        assert_eq!(mark, (20_000, None));
    }

    /// The group is the attribute of exactly that name, whatever the name holds and however
    /// the JSON text escapes it; a path-like name is not a path.
    #[test]
    fn groups_are_attributes_named_exactly() {
        let mut conn = Connection::open_in_memory().expect("in-memory database");
        conn.execute_batch(crate::sqlite::schema::STATE_DDL)
            .expect("state tables");
        conn.execute_batch(&crate::sqlite::schema::target_ddl("p__w"))
            .expect("target table");
        prepare_window_table(&mut conn, "p__w__windows").expect("counts table");
        let rows = [
            (1, r#"{"geo.region":"eu"}"#),
            (2, r#"{"geo":{"region":"no"},"geo[0]":"x"}"#),
            (3, r#"{"a\"b\\c":"odd","geo.region":"eu"}"#),
            (4, r#"{"\u0061\"b\\c":"odd","g":"1"}"#),
            (5, r#"{"a\"b\\c":7}"#),
        ];
        for (i, attributes) in rows {
            conn.execute(
                "INSERT INTO p__w (dedup_key, message_id, publish_time, event_time, attributes,
                                   data, flow, committed_at)
                 VALUES (?1, ?1, 0, ?2, ?3, x'', 'f', 0)",
                params![i.to_string(), i * 10_000, attributes],
            )
            .expect("a row");
        }
        let flow = FlowHandle {
            id: 1,
            pipeline: "p".into(),
            name: "f".into(),
        };
        let mut groups = |name: &str| -> Vec<(i64, String)> {
            conn.execute("DELETE FROM p__w__windows", [])
                .expect("cleared");
            conn.execute("DELETE FROM sluice_window_marks", [])
                .expect("cleared");
            let mut by = emission(10_000, 60_000);
            by.group = WindowGroup::Attribute(name.to_owned());
            emit_windows(&mut conn, &flow, &by, 0).expect("an emission");
            let mut statement = conn
                .prepare("SELECT window_start, group_key FROM p__w__windows ORDER BY 1")
                .expect("a query");
            statement
                .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
                .expect("rows")
                .collect::<Result<_, _>>()
                .expect("rows")
        };
        let named = |pairs: &[(i64, &str)]| -> Vec<(i64, String)> {
            pairs.iter().map(|(w, g)| (*w, g.to_string())).collect()
        };
        assert_eq!(
            groups("geo.region"),
            named(&[
                (10_000, "eu"),
                (20_000, ""),
                (30_000, "eu"),
                (40_000, ""),
                (50_000, "")
            ])
        );
        assert_eq!(
            groups("a\"b\\c"),
            named(&[
                (10_000, ""),
                (20_000, ""),
                (30_000, "odd"),
                (40_000, "odd"),
                (50_000, "7")
            ])
        );
        assert_eq!(
            groups("geo[0]"),
            named(&[
                (10_000, ""),
                (20_000, "x"),
                (30_000, ""),
                (40_000, ""),
                (50_000, "")
            ])
        );
    }
}
