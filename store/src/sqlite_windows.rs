//! SQLite: a `window` target's counts table and the emission of a flow's windows (see
//! [`crate::windows`]).
//!
//! An emission is one `BEGIN IMMEDIATE` transaction: it reads the flow's mark
//! (`sluice_window_marks`), counts the flow's rows (or all rows, [`WindowRows::All`]) of the
//! windows between the mark and
//! `before_ms`, writes the counts (conflicts on `(window_start, group_key)` ignored) and moves
//! the mark. Another process sharing the file waits for the write lock, then starts from the
//! moved mark. The window arithmetic ([`plan`]) is the PostgreSQL backend's too.

use crate::schema::check_table;
use crate::{FlowHandle, StoreError, WindowEmission, WindowRows, WindowsEmitted};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

/// What one emission does, decided from the flow's mark (or its oldest row) and `before_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Count the windows starting in `[start, end)` (both multiples of the size), then move
    /// the mark to `end`.
    Emit {
        /// The first window not emitted yet.
        start: i64,
        /// The end of the last window that ends by `before_ms`.
        end: i64,
    },
    /// No window is due: write nothing and return this.
    Nothing(WindowsEmitted),
}

/// Checks what `emission` names and divides by, before anything is spliced into SQL.
pub(crate) fn check_emission(emission: &WindowEmission) -> Result<(), StoreError> {
    check_table(&emission.base_table)?;
    check_table(&emission.windows_table)?;
    if emission.size_ms <= 0 {
        return Err(StoreError::Config(format!(
            "window size {} ms is not positive",
            emission.size_ms
        )));
    }
    Ok(())
}

/// The start of the window holding `ms`: `ms` floored to a multiple of `size_ms` (towards
/// minus infinity, so for times before the epoch too). `size_ms` is positive.
pub(crate) fn window_start(ms: i64, size_ms: i64) -> Result<i64, StoreError> {
    ms.checked_sub(ms.rem_euclid(size_ms)).ok_or_else(|| {
        StoreError::Rejected(format!("{ms} ms has no window of {size_ms} ms in range"))
    })
}

/// What an emission does, given the flow's `mark` and, needed only without one, the event
/// time of its `oldest` row. A checked `emission` (see [`check_emission`]).
pub(crate) fn plan(
    emission: &WindowEmission,
    mark: Option<i64>,
    oldest: Option<i64>,
) -> Result<Plan, StoreError> {
    let start = match (mark, oldest) {
        (Some(mark), _) => mark,
        (None, Some(oldest)) => window_start(oldest, emission.size_ms)?,
        (None, None) => {
            return Ok(Plan::Nothing(WindowsEmitted {
                rows: 0,
                emitted_before_ms: 0,
            }));
        }
    };
    let end = window_start(emission.before_ms, emission.size_ms)?;
    if end <= start {
        return Ok(Plan::Nothing(WindowsEmitted {
            rows: 0,
            emitted_before_ms: start,
        }));
    }
    Ok(Plan::Emit { start, end })
}

/// Creates the counts table `windows_table` if missing.
pub(crate) fn prepare_window_table(
    conn: &mut Connection,
    windows_table: &str,
) -> Result<(), StoreError> {
    check_table(windows_table)?;
    conn.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS \"{windows_table}\" (
            window_start INTEGER NOT NULL,
            window_end   INTEGER NOT NULL,
            group_key    TEXT NOT NULL,
            count        INTEGER NOT NULL,
            emitted_at   INTEGER NOT NULL,
            PRIMARY KEY (window_start, group_key)
        ) WITHOUT ROWID;"
    ))?;
    // Emissions read the flow's rows by event time, inside the single writer's transaction:
    // an index keeps that a range scan instead of a scan of the whole base table.
    // (Only when the base table exists: it does whenever a flow runs, since the layout is
    // prepared first.)
    let base = windows_table.strip_suffix("__windows").filter(|base| {
        conn.query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [base],
            |_| Ok(()),
        )
        .is_ok()
    });
    if let Some(base) = base {
        check_table(base)?;
        conn.execute_batch(&format!(
            "CREATE INDEX IF NOT EXISTS \"{base}__by_event_time\" ON \"{base}\" (flow, event_time);"
        ))?;
    }
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
    let mark: Option<i64> = tx
        .query_row(
            "SELECT emitted_before FROM sluice_window_marks WHERE flow_id = ?1",
            params![flow.id],
            |row| row.get(0),
        )
        .optional()?;
    // Which rows count: `?1` is the flow's name, or NULL for every row. A window over another
    // target's table reads it by event time alone, so it gets an index of its own (created
    // once, inside this writer's transaction).
    let (flow_filter, of_flow) = match emission.rows {
        WindowRows::OfTheFlow => ("flow = ?1", Some(&*flow.name)),
        WindowRows::All => {
            tx.execute_batch(&format!(
                "CREATE INDEX IF NOT EXISTS \"{base}__by_event_time_only\" ON \"{base}\" (event_time);"
            ))?;
            ("?1 IS NULL", None)
        }
    };
    let oldest: Option<i64> = match mark {
        Some(_) => None,
        None => tx.query_row(
            &format!("SELECT MIN(event_time) FROM \"{base}\" WHERE {flow_filter}"),
            params![of_flow],
            |row| row.get(0),
        )?,
    };
    let (start, end) = match plan(emission, mark, oldest)? {
        Plan::Emit { start, end } => (start, end),
        // Nothing written: dropping the transaction rolls it back.
        Plan::Nothing(emitted) => return Ok(emitted),
    };
    // The window start is the event time floored to a multiple of the size, without an
    // intermediate sum that could overflow. The group is looked up by key with `json_each`,
    // not by a JSON path: SQLite before 3.45 has no escapes in path labels, so a name with `"`
    // could not be named by one. It is cast to text as PostgreSQL's `->>` gives it (a JSON
    // number 1 is "1"). `WHERE true` keeps the upsert's `ON` unambiguous.
    let rows = tx.execute(
        &format!(
            "INSERT INTO \"{windows}\" (window_start, window_end, group_key, count, emitted_at)
             SELECT window_start, window_start + ?2, group_key, COUNT(*), ?6
             FROM (SELECT event_time - event_time % ?2
                              - CASE WHEN event_time % ?2 < 0 THEN ?2 ELSE 0 END AS window_start,
                          CAST(COALESCE((SELECT a.value FROM json_each(attributes) AS a
                                         WHERE a.key = ?3), '') AS TEXT) AS group_key
                   FROM \"{base}\"
                   WHERE {flow_filter} AND event_time >= ?4 AND event_time < ?5)
             WHERE true
             GROUP BY window_start, group_key
             ON CONFLICT (window_start, group_key) DO NOTHING"
        ),
        params![
            of_flow,
            emission.size_ms,
            emission.group_attribute,
            start,
            end,
            now_ms,
        ],
    )?;
    tx.execute(
        "INSERT INTO sluice_window_marks (flow_id, emitted_before) VALUES (?1, ?2)
         ON CONFLICT (flow_id) DO UPDATE SET
             emitted_before = MAX(emitted_before, excluded.emitted_before)",
        params![flow.id, end],
    )?;
    tx.commit()?;
    Ok(WindowsEmitted {
        rows: u64::try_from(rows).unwrap_or(u64::MAX),
        emitted_before_ms: end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emission(size_ms: i64, before_ms: i64) -> WindowEmission {
        WindowEmission {
            base_table: "p__w".into(),
            windows_table: "p__w__windows".into(),
            size_ms,
            group_attribute: "g".into(),
            before_ms,
            rows: WindowRows::OfTheFlow,
        }
    }

    #[test]
    fn window_starts_floor_towards_minus_infinity() {
        assert_eq!(window_start(0, 10).ok(), Some(0));
        assert_eq!(window_start(19, 10).ok(), Some(10));
        assert_eq!(window_start(-1, 10).ok(), Some(-10));
        assert_eq!(window_start(-10, 10).ok(), Some(-10));
        assert_eq!(window_start(-11, 10).ok(), Some(-20));
        assert!(window_start(i64::MIN, 10).is_err());
    }

    #[test]
    fn plans_start_at_the_mark_or_the_oldest_rows_window() {
        let nothing = |emitted_before_ms| {
            Plan::Nothing(WindowsEmitted {
                rows: 0,
                emitted_before_ms,
            })
        };
        let e = emission(10, 35);
        assert_eq!(plan(&e, None, None).ok(), Some(nothing(0)));
        assert_eq!(
            plan(&e, None, Some(-3)).ok(),
            Some(Plan::Emit {
                start: -10,
                end: 30
            })
        );
        assert_eq!(
            plan(&e, Some(20), Some(-3)).ok(),
            Some(Plan::Emit { start: 20, end: 30 })
        );
        assert_eq!(plan(&e, Some(30), None).ok(), Some(nothing(30)));
        assert_eq!(plan(&e, None, Some(31)).ok(), Some(nothing(30)));
        assert!(check_emission(&emission(0, 35)).is_err());
        let mut spliced = emission(10, 35);
        spliced.windows_table = "p__w\"; DROP TABLE x; --".into();
        assert!(check_emission(&spliced).is_err());
    }

    /// The group is the attribute of exactly that name, whatever the name holds and however
    /// the JSON text escapes it; a path-like name is not a path.
    #[test]
    fn groups_are_attributes_named_exactly() {
        let mut conn = Connection::open_in_memory().expect("in-memory database");
        conn.execute_batch(crate::schema::SQLITE_STATE_DDL)
            .expect("state tables");
        conn.execute_batch(&crate::schema::sqlite_target_ddl("p__w"))
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
            by.group_attribute = name.to_owned();
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
