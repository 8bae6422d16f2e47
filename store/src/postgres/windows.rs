//! PostgreSQL: a `window` target's counts table and the emission of a flow's windows (see
//! [`crate::windows`]).
//!
//! An emission is one transaction that first locks the flow's row in `sluice_flows`: replicas
//! emitting the same flow queue there, each starting from the mark the one before moved, and a
//! reset (which changes that row) never interleaves with an emission. What it writes is what
//! SQLite's writes (`crate::sqlite::windows`): the count rows of its size cleared when it has
//! no mark of that size, then the counts, then the mark. Event times are taken in ms since the
//! epoch as `read_rows` gives them, so a row lands in the window its event time says;
//! `emitted_at` is the database server's clock.

use super::PostgresStore;
use async_trait::async_trait;

use crate::schema::check_table;
use crate::windows::{
    COUNTS_KEY, Plan, aggregate_inputs, aggregate_outputs, check_emission, mark_of_size, plan,
};
use crate::{
    FlowHandle, StoreError, WindowAggregate, WindowEmission, WindowGroup, WindowRows, WindowStore,
    WindowsEmitted,
};
use deadpool_postgres::Client;

/// Near the latest instant PostgreSQL's `timestamptz` holds (294276-12-31 23:59:59 UTC), ms:
/// a few hours before it, so that `to_timestamp` of it as `float8` seconds stays in range.
const LATEST_TIMESTAMPTZ_MS: i64 = 9_224_318_000_000_000;

/// Creates the counts table `windows_table` if missing, under the DDL lock (replicas preparing
/// at once would otherwise race on the catalog); a counts table of an older version, keyed by
/// `(window_start, group_key)`, is keyed by [`COUNTS_KEY`] instead, its rows kept.
pub(super) async fn prepare_window_table(
    client: &mut Client,
    windows_table: &str,
) -> Result<(), StoreError> {
    check_table(windows_table)?;
    let tx = client.transaction().await?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1)",
        &[&super::schema::DDL_LOCK],
    )
    .await?;
    // Groups compare bytewise, as on SQLite.
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS \"{windows_table}\" (
            window_start BIGINT NOT NULL,
            window_end   BIGINT NOT NULL,
            group_key    TEXT COLLATE \"C\" NOT NULL,
            count        BIGINT NOT NULL,
            emitted_at   BIGINT NOT NULL,
            PRIMARY KEY ({COUNTS_KEY})
        )"
    ))
    .await?;
    let key = tx
        .query_one(
            "SELECT conname::text, cardinality(conkey) FROM pg_constraint
             WHERE conrelid = to_regclass(quote_ident($1)) AND contype = 'p'",
            &[&windows_table],
        )
        .await?;
    let (key_name, key_columns): (String, i32) = (key.try_get(0)?, key.try_get(1)?);
    if key_columns == 2 {
        tx.batch_execute(&format!(
            "ALTER TABLE \"{windows_table}\" DROP CONSTRAINT \"{}\", ADD PRIMARY KEY ({COUNTS_KEY})",
            key_name.replace('"', "\"\"")
        ))
        .await?;
        tracing::info!(
            table = windows_table,
            "counts table keyed by window start and end"
        );
    }
    // Emissions read the flow's rows by event time: an index keeps that a range scan instead
    // of a scan of the whole base table every second. (The base table exists whenever a flow
    // runs: the layout is prepared first.)
    if let Some(base) = windows_table.strip_suffix("__windows") {
        check_table(base)?;
        create_index_if_table(&tx, base, "by_event_time", "flow, event_time").await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Creates the index `<table>__<suffix>` on `columns` if `table` exists and the index does
/// not; the caller holds the DDL lock.
async fn create_index_if_table(
    tx: &deadpool_postgres::Transaction<'_>,
    table: &str,
    suffix: &str,
    columns: &str,
) -> Result<(), StoreError> {
    let exists: bool = tx
        .query_one("SELECT to_regclass(quote_ident($1)) IS NOT NULL", &[&table])
        .await?
        .try_get(0)?;
    if exists {
        tx.batch_execute(&format!(
            "CREATE INDEX IF NOT EXISTS \"{table}__{suffix}\" ON \"{table}\" ({columns})"
        ))
        .await?;
    }
    Ok(())
}

/// Gives a table that windows count whole (`WindowRows::All`) its `(event_time)` index, once:
/// checked without a lock, created under the DDL lock in a transaction of its own.
async fn ensure_event_time_index(
    client: &mut Client,
    base: &str,
    event_time: &str,
) -> Result<(), StoreError> {
    let index = format!("{base}__by_event_time_only");
    let present: bool = client
        .query_one("SELECT to_regclass(quote_ident($1)) IS NOT NULL", &[&index])
        .await?
        .try_get(0)?;
    if present {
        return Ok(());
    }
    let tx = client.transaction().await?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1)",
        &[&super::schema::DDL_LOCK],
    )
    .await?;
    create_index_if_table(&tx, base, "by_event_time_only", event_time).await?;
    tx.commit().await?;
    Ok(())
}

/// Emits the flow's due windows in one transaction.
pub(super) async fn emit_windows(
    client: &mut Client,
    flow: &FlowHandle,
    emission: &WindowEmission,
) -> Result<WindowsEmitted, StoreError> {
    check_emission(emission)?;
    let (base, windows) = (&emission.base_table, &emission.windows_table);
    let name: &str = &flow.name;
    // A typed table's own columns have their `_sluice_` names.
    let e = super::typed::envelope(&*client, base).await?;
    if emission.rows == WindowRows::All {
        ensure_event_time_index(client, base, e.event_time).await?;
    }
    let tx = client.transaction().await?;
    let flow_row = tx
        .query_opt(
            "SELECT 1 FROM sluice_flows WHERE flow_id = $1 FOR UPDATE",
            &[&flow.id],
        )
        .await?;
    if flow_row.is_none() {
        // A reset gave the flow a new id: a mark written for this one would belong to no flow.
        return Err(StoreError::Config(format!(
            "flow {}/{name} has no id {} any more (it was reset): prepare it again",
            flow.pipeline, flow.id
        )));
    }
    let stored: Option<(i64, Option<i64>)> = tx
        .query_opt(
            "SELECT emitted_before, size_ms FROM sluice_window_marks WHERE flow_id = $1",
            &[&flow.id],
        )
        .await?
        .map(|row| Ok::<_, StoreError>((row.try_get(0)?, row.try_get(1)?)))
        .transpose()?;
    let newest_row_size: Option<i64> = match stored {
        Some((_, None)) => tx
            .query_opt(
                &format!(
                    "SELECT window_end - window_start FROM \"{windows}\"
                     ORDER BY window_start DESC LIMIT 1"
                ),
                &[],
            )
            .await?
            .map(|row| row.try_get(0))
            .transpose()?,
        _ => None,
    };
    let mark = mark_of_size(stored, emission.size_ms, newest_row_size);
    // No mark of this size: its count rows there were emitted before a reset or a size change,
    // from rows that may have gone or changed since. They are counted again.
    let cleared = match mark {
        Some(_) => 0,
        None => {
            tx.execute(
                &format!("DELETE FROM \"{windows}\" WHERE window_end - window_start = $1"),
                &[&emission.size_ms],
            )
            .await?
        }
    };
    // Which rows count: `$1` is the flow's name, or NULL for every row (a window over
    // another target's table).
    let of_flow: Option<&str> = match emission.rows {
        WindowRows::OfTheFlow => Some(name),
        WindowRows::All => None,
    };
    let oldest: Option<i64> = match mark {
        Some(_) => None,
        None => tx
            .query_one(
                &format!(
                    "SELECT (extract(epoch FROM min({event_time})) * 1000)::int8
                     FROM \"{base}\" WHERE $1::text IS NULL OR {flow} = $1",
                    event_time = e.event_time,
                    flow = e.flow
                ),
                &[&of_flow],
            )
            .await?
            .try_get(0)?,
    };
    let (start, end) = match plan(emission, mark, oldest)? {
        Plan::Emit { start, end } => (start, end),
        Plan::Nothing(emitted) => {
            // Nothing else written: without a deletion, dropping the transaction rolls it back.
            if cleared > 0 {
                tx.commit().await?;
            }
            return Ok(emitted);
        }
    };
    // The window start is the event time floored to a multiple of the size, without an
    // intermediate sum that could overflow. The range is given on `event_time` itself, as
    // commits write it (`to_timestamp(ms / 1000.0)`), so the index serves it. No row of these
    // windows is in the table (the mark, or the deletion above, says so): a plain insert, which
    // fails loudly rather than drop a count.
    ensure_aggregate_columns(&tx, windows, &emission.aggregates).await?;
    // `$3` is the attribute of the group, or the group of a row whose column is NULL (`''`).
    let (group, group_parameter) = match &emission.group {
        WindowGroup::Attribute(name) => ("COALESCE(attributes ->> $3::text, '')".to_owned(), name),
        WindowGroup::Column(column) => (
            format!("COALESCE(CAST(\"{column}\" AS text), $3::text)"),
            &String::new(),
        ),
    };
    let inputs = aggregate_inputs(&emission.aggregates);
    let (names, values) = aggregate_outputs(&emission.aggregates);
    let rows = tx
        .execute(
            &format!(
                "INSERT INTO \"{windows}\" (window_start, window_end, group_key, count, emitted_at{names})
                 SELECT e.window_start, e.window_start + $2, e.group_key, count(*),
                        (extract(epoch FROM now()) * 1000)::int8{values}
                 FROM (SELECT t.ms - t.ms % $2 - CASE WHEN t.ms % $2 < 0 THEN $2 ELSE 0 END
                                  AS window_start,
                              t.*
                       FROM (SELECT (extract(epoch FROM {event_time}) * 1000)::int8 AS ms,
                                    {group} AS group_key{inputs}
                             FROM \"{base}\"
                             WHERE ($1::text IS NULL OR {flow} = $1)
                               AND {event_time} >= to_timestamp($4::int8 / 1000.0::float8)
                               AND {event_time} < to_timestamp($5::int8 / 1000.0::float8)) AS t
                       WHERE t.ms >= $4 AND t.ms < $5) AS e
                 GROUP BY e.window_start, e.group_key",
                event_time = e.event_time,
                flow = e.flow,
            ),
            &[
                &of_flow,
                &emission.size_ms,
                group_parameter,
                &start,
                // No row lies past the latest time `timestamptz` holds (such an event time is
                // refused at commit), and `to_timestamp` refuses a bound beyond it: "every
                // window" (`i64::MAX`) ends there.
                &end.min(LATEST_TIMESTAMPTZ_MS),
            ],
        )
        .await?;
    // Under the flow's row lock `end` is past the mark read above, or that was of another size.
    tx.execute(
        "INSERT INTO sluice_window_marks (flow_id, emitted_before, size_ms) VALUES ($1, $2, $3)
         ON CONFLICT (flow_id) DO UPDATE SET
             emitted_before = excluded.emitted_before, size_ms = excluded.size_ms",
        &[&flow.id, &end, &emission.size_ms],
    )
    .await?;
    tx.commit().await?;
    Ok(WindowsEmitted {
        rows,
        emitted_before_ms: end,
    })
}

/// Adds the aggregate columns the counts table lacks (its emissions are serialized by the
/// flow's row lock, which the caller holds).
async fn ensure_aggregate_columns(
    tx: &deadpool_postgres::Transaction<'_>,
    windows: &str,
    aggregates: &[WindowAggregate],
) -> Result<(), StoreError> {
    if aggregates.is_empty() {
        return Ok(());
    }
    let present: Vec<(String, String)> = tx
        .query(
            "SELECT column_name::text, data_type::text FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = $1",
            &[&windows],
        )
        .await?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect::<Result<_, tokio_postgres::Error>>()?;
    for aggregate in aggregates {
        let (declared, catalog) = super::typed::sql_type(aggregate.ty);
        match present.iter().find(|(name, _)| *name == aggregate.name) {
            Some((_, found)) if found == catalog => {}
            Some((_, found)) => {
                return Err(crate::windows::changed_aggregate(windows, aggregate, found));
            }
            None => {
                tx.batch_execute(&format!(
                    "ALTER TABLE \"{windows}\" ADD COLUMN IF NOT EXISTS \"{}\" {declared}",
                    aggregate.name
                ))
                .await?;
            }
        }
    }
    Ok(())
}

#[async_trait]
impl WindowStore for PostgresStore {
    async fn prepare_window_table(&self, windows_table: &str) -> Result<(), StoreError> {
        let (mut client, _) = self.ready().await?;
        self::prepare_window_table(&mut client, windows_table).await
    }

    async fn emit_windows(
        &self,
        flow: &FlowHandle,
        emission: &WindowEmission,
    ) -> Result<WindowsEmitted, StoreError> {
        let (mut client, _) = self.ready().await?;
        self::emit_windows(&mut client, flow, emission).await
    }
}
