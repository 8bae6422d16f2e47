//! SQLite: a flow's lifecycle beyond commits — forgetting it (`reset FLOW`, `full-refresh`),
//! asking which keys it has already written, its completion, its counters and row counts.

use super::{Command, SqliteStore, now_ms};
use crate::schema::{check_table, table_name};
use crate::{
    ClearClaim, FlowHandle, FlowProgress, FlowStore, Layout, ResetRows, RowCursor, StoreError,
    StoredRow,
};
use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

/// Keys looked up per statement (well under SQLite's limit of bound parameters).
const PRESENCE_CHUNK: usize = 500;

/// Deletes the flow's counters, completion, commit marks, watermark buckets, watermark record
/// and window emission mark (its next emission deletes the count rows of its size and counts
/// every window again from the rows left, see `windows.rs`), the rows and dead letters `rows` says,
/// and the ledger keys of exactly those: a key whose row or dead letter is kept stays in the
/// ledger, so its redelivery (an unacked message, a publisher's copy) stays a duplicate. In one
/// transaction; with `claim`, only while its clearer holds the pool update (checked with the
/// write lock held).
pub(crate) fn reset_flow(
    conn: &mut Connection,
    flow: &FlowHandle,
    table: Option<&str>,
    rows: ResetRows,
    claim: Option<&ClearClaim>,
) -> Result<(), StoreError> {
    let dead_letter = table_name(&flow.pipeline, "dead_letter")?;
    if let Some(table) = table {
        check_table(table)?;
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    if let Some(claim) = claim {
        let held: bool = tx.query_row(
            "SELECT COUNT(*) > 0 FROM sluice_pool_updates
             WHERE pipeline = ?1 AND id = ?2 AND state = 'clearing' AND clearer = ?3",
            params![&*flow.pipeline, claim.update, claim.clearer],
            |row| row.get(0),
        )?;
        if !held {
            return Err(StoreError::ClaimLost(format!(
                "pool update {} is no longer being cleared by {}",
                claim.update, claim.clearer
            )));
        }
    }
    let mut targets = vec![(dead_letter.clone(), crate::typed::PLAIN_ENVELOPE)];
    if let Some(table) = table {
        targets.push((table.to_owned(), super::typed::envelope(&tx, table)?));
    }
    match rows {
        ResetRows::Keep => {}
        ResetRows::All => {
            tx.execute(
                "DELETE FROM sluice_ledger WHERE flow_id = ?1",
                params![flow.id],
            )?;
        }
        ResetRows::PublishedSince { since_ms: ms, .. } => {
            let select = |op: &str| {
                targets
                    .iter()
                    .map(|(t, e)| {
                        format!(
                            "SELECT {} FROM \"{t}\" WHERE {} = ?2 AND {} {op} ?3",
                            e.dedup_key, e.flow, e.publish_time
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" UNION ")
            };
            tx.execute(
                &format!(
                    "DELETE FROM sluice_ledger WHERE flow_id = ?1
                     AND key IN ({}) AND key NOT IN ({})",
                    select(">="),
                    select("<")
                ),
                params![flow.id, &*flow.name, ms],
            )?;
        }
    }
    let mut states = crate::RESET_CLEARS.to_vec();
    match (rows, targets.get(1)) {
        (
            ResetRows::PublishedSince {
                since_ms,
                hold_watermark: true,
            },
            Some((table, envelope)),
        ) => hold_watermark_for_replay(&tx, flow, table, envelope, since_ms)?,
        _ => states.push("sluice_watermark_messages"),
    }
    for state in states {
        tx.execute(
            &format!("DELETE FROM {state} WHERE flow_id = ?1"),
            params![flow.id],
        )?;
    }
    tx.execute(
        "UPDATE sluice_flows SET committed = 0, duplicates = 0, dead_lettered = 0, batches = 0,
             last_commit_at = NULL
         WHERE flow_id = ?1",
        params![flow.id],
    )?;
    // Table names are validated identifiers (checked above); values are bound.
    for (target, e) in &targets {
        match rows {
            ResetRows::Keep => {}
            ResetRows::All => {
                tx.execute(
                    &format!("DELETE FROM \"{target}\" WHERE {} = ?1", e.flow),
                    params![&*flow.name],
                )?;
            }
            ResetRows::PublishedSince { since_ms: ms, .. } => {
                tx.execute(
                    &format!(
                        "DELETE FROM \"{target}\" WHERE {} = ?1 AND {} >= ?2",
                        e.flow, e.publish_time
                    ),
                    params![&*flow.name, ms],
                )?;
            }
        }
    }
    tx.commit()?;
    Ok(())
}

/// The watermark messages of a flow whose subscription replays what was published since
/// `since_ms` (see `ResetRows::PublishedSince`): of those recorded, only the ones tracked and not
/// settled in the whole buckets from `since_ms` on stay (the replay settles them); then every row
/// of `table` published since then, about to be deleted, is recorded tracked and not settled.
fn hold_watermark_for_replay(
    tx: &rusqlite::Transaction<'_>,
    flow: &FlowHandle,
    table: &str,
    e: &crate::typed::Envelope,
    since_ms: i64,
) -> Result<(), StoreError> {
    let bucket = crate::PROGRESS_BUCKET_MS;
    let first_whole_bucket = crate::progress::first_whole_bucket_from(since_ms);
    tx.execute(
        "DELETE FROM sluice_watermark_messages
         WHERE flow_id = ?1 AND NOT (tracked = 1 AND settled = 0 AND bucket_ms >= ?2)",
        params![flow.id, first_whole_bucket],
    )?;
    // `table` is a validated identifier (checked by the caller); values are bound.
    tx.execute(
        &format!(
            "INSERT INTO sluice_watermark_messages
                 (flow_id, bucket_ms, message_id, tracked, settled, event_ms)
             SELECT ?1, ({publish} / ?4) * ?4, {message_id}, 1, 0, {event}
             FROM \"{table}\" WHERE {flow} = ?2 AND {publish} >= ?3
             ON CONFLICT (flow_id, bucket_ms, message_id) DO UPDATE SET
                 tracked = 1, settled = 0, event_ms = excluded.event_ms",
            publish = e.publish_time,
            message_id = e.message_id,
            event = e.event_time,
            flow = e.flow
        ),
        params![flow.id, &*flow.name, since_ms, bucket],
    )?;
    Ok(())
}

/// For each key, whether the flow has a row in `table` or a dead letter with it.
pub(crate) fn keys_present(
    conn: &mut Connection,
    flow: &FlowHandle,
    table: &str,
    keys: &[String],
) -> Result<Vec<bool>, StoreError> {
    check_table(table)?;
    let dead_letter = table_name(&flow.pipeline, "dead_letter")?;
    let mut present = std::collections::HashSet::new();
    let sources = [
        (table, super::typed::envelope(conn, table)?),
        (dead_letter.as_str(), crate::typed::PLAIN_ENVELOPE),
    ];
    for chunk in keys.chunks(PRESENCE_CHUNK) {
        let marks = vec!["?"; chunk.len()].join(", ");
        for (source, e) in &sources {
            let sql = format!(
                "SELECT DISTINCT {key} FROM \"{source}\" WHERE {flow} = ? AND {key} IN ({marks})",
                key = e.dedup_key,
                flow = e.flow
            );
            let mut statement = conn.prepare_cached(&sql)?;
            let values = std::iter::once(&*flow.name).chain(chunk.iter().map(String::as_str));
            let rows = statement.query_map(rusqlite::params_from_iter(values), |row| {
                row.get::<_, String>(0)
            })?;
            for key in rows {
                present.insert(key?);
            }
        }
    }
    Ok(keys.iter().map(|k| present.contains(k)).collect())
}

/// A page of `table` after `after` (see `FlowStore::read_rows`).
pub(crate) fn read_rows(
    conn: &mut Connection,
    table: &str,
    after: Option<&RowCursor>,
    limit: usize,
) -> Result<Vec<StoredRow>, StoreError> {
    check_table(table)?;
    let start = after.cloned().unwrap_or_default();
    // Row values compare in order; the empty cursor sorts before every row... except rows whose
    // flow is empty, which validated flow names never are.
    let sql = format!(
        "SELECT flow, dedup_key, message_id, publish_time, event_time, attributes, data
         FROM \"{table}\"
         WHERE (flow, dedup_key, message_id) > (?1, ?2, ?3)
         ORDER BY flow, dedup_key, message_id LIMIT ?4"
    );
    let mut statement = conn.prepare_cached(&sql)?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = statement.query_map(
        params![start.flow, start.dedup_key, start.message_id, limit],
        |row| {
            Ok(StoredRow {
                flow: row.get(0)?,
                dedup_key: row.get(1)?,
                message_id: row.get(2)?,
                publish_time_ms: row.get(3)?,
                event_time_ms: row.get(4)?,
                attributes_json: row.get(5)?,
                data: bytes::Bytes::from(row.get::<_, Vec<u8>>(6)?),
            })
        },
    )?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Whether the flow committed with this hook id.
pub(crate) fn commit_recorded(
    conn: &mut Connection,
    flow: &FlowHandle,
    commit_id: &str,
) -> Result<bool, StoreError> {
    let found: i64 = conn.query_row(
        "SELECT COUNT(*) FROM sluice_commit_marks WHERE flow_id = ?1 AND commit_id = ?2",
        params![flow.id, commit_id],
        |row| row.get(0),
    )?;
    Ok(found > 0)
}

/// Records that `flow_id` completed (a drained once flow) at `now_ms`.
pub(super) fn record_completion(
    conn: &mut Connection,
    flow_id: i64,
    now_ms: i64,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO sluice_completions (flow_id, completed_at) VALUES (?1, ?2)
         ON CONFLICT (flow_id) DO UPDATE SET completed_at = excluded.completed_at",
        params![flow_id, now_ms],
    )?;
    Ok(())
}

/// The completed flows of `pipeline` and when each completed, by flow name.
pub(super) fn completions(
    conn: &mut Connection,
    pipeline: &str,
) -> Result<Vec<(String, i64)>, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT f.flow, c.completed_at FROM sluice_completions c
         JOIN sluice_flows f ON f.flow_id = c.flow_id
         WHERE f.pipeline = ?1 ORDER BY f.flow",
    )?;
    let rows = statement.query_map(params![pipeline], |row| Ok((row.get(0)?, row.get(1)?)))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Rows of `table`, of `flow` only when given (tests).
#[cfg(feature = "testing")]
pub(super) fn count_rows(
    conn: &Connection,
    table: &str,
    flow: Option<&str>,
) -> Result<u64, StoreError> {
    check_table(table)?;
    let count: i64 = match flow {
        Some(flow) => conn.query_row(
            &format!("SELECT COUNT(*) FROM \"{table}\" WHERE flow = ?1"),
            params![flow],
            |row| row.get(0),
        )?,
        None => conn.query_row(&format!("SELECT COUNT(*) FROM \"{table}\""), [], |row| {
            row.get(0)
        })?,
    };
    Ok(u64::try_from(count).unwrap_or_default())
}

/// `(distinct keys, keys with more than one row)` of `table`, per flow (tests).
#[cfg(feature = "testing")]
pub(super) fn key_census(conn: &Connection, table: &str) -> Result<(u64, u64), StoreError> {
    check_table(table)?;
    let (distinct, repeated): (i64, i64) = conn.query_row(
        &format!(
            "SELECT COUNT(*), COALESCE(SUM(n > 1), 0) FROM
             (SELECT COUNT(*) AS n FROM \"{table}\" GROUP BY flow, dedup_key)"
        ),
        [],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    Ok((
        u64::try_from(distinct).unwrap_or_default(),
        u64::try_from(repeated).unwrap_or_default(),
    ))
}

/// The committed counters of the flow `id`.
pub(super) fn flow_progress(conn: &Connection, id: i64) -> Result<FlowProgress, StoreError> {
    let progress = conn
        .query_row(
            "SELECT committed, duplicates, dead_lettered, batches FROM sluice_flows
             WHERE flow_id = ?1",
            params![id],
            |row| {
                let get = |i: usize| -> rusqlite::Result<u64> {
                    Ok(u64::try_from(row.get::<_, i64>(i)?).unwrap_or_default())
                };
                Ok(FlowProgress {
                    committed: get(0)?,
                    duplicates: get(1)?,
                    dead_lettered: get(2)?,
                    batches: get(3)?,
                })
            },
        )
        .optional()?;
    progress.ok_or_else(|| StoreError::Config(format!("no flow with id {id}")))
}

#[async_trait]
impl FlowStore for SqliteStore {
    async fn prepare(&self, layout: &Layout) -> Result<Vec<FlowHandle>, StoreError> {
        let layout = layout.clone();
        self.ask(|reply| Command::Prepare(layout, reply)).await
    }

    async fn create_views(&self, views: &[crate::TypedView]) -> Result<(), StoreError> {
        if views.is_empty() {
            return Ok(());
        }
        let views = views.to_vec();
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            for view in &views {
                if super::schema::object_type(&tx, &view.name)?.is_some_and(|t| t != "view") {
                    return Err(crate::views::not_a_view(&view.name));
                }
                tx.execute_batch(&crate::views::ddl(view, crate::views::Dialect::Sqlite)?)?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn record_completion(&self, flow: &FlowHandle) -> Result<(), StoreError> {
        let id = flow.id;
        self.call(move |conn| self::record_completion(conn, id, now_ms()))
            .await
    }

    async fn completions(&self, pipeline: &str) -> Result<Vec<(String, i64)>, StoreError> {
        let pipeline = pipeline.to_owned();
        self.call(move |conn| self::completions(conn, &pipeline))
            .await
    }

    async fn reset_flow(
        &self,
        flow: &FlowHandle,
        table: Option<&str>,
        rows: ResetRows,
        claim: Option<&ClearClaim>,
    ) -> Result<(), StoreError> {
        let (flow, table, claim) = (flow.clone(), table.map(str::to_owned), claim.cloned());
        self.call(move |conn| self::reset_flow(conn, &flow, table.as_deref(), rows, claim.as_ref()))
            .await
    }

    async fn clear_interval(
        &self,
        flow: &FlowHandle,
        table: &str,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<u64, StoreError> {
        let (flow, table) = (flow.clone(), table.to_owned());
        self.call(move |conn| {
            super::interval_rows::clear_interval(conn, &flow, &table, from_ms, to_ms)
        })
        .await
    }

    async fn read_rows(
        &self,
        table: &str,
        after: Option<&RowCursor>,
        limit: usize,
    ) -> Result<Vec<StoredRow>, StoreError> {
        let (table, after) = (table.to_owned(), after.cloned());
        self.call(move |conn| self::read_rows(conn, &table, after.as_ref(), limit))
            .await
    }
}
