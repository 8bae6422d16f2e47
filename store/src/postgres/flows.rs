//! PostgreSQL: a flow's lifecycle beyond commits — forgetting it (`reset FLOW`, `full-refresh`)
//! and asking which keys it has already written.

use super::{PostgresStore, ledger, ms, schema, typed};
use async_trait::async_trait;
use std::sync::Arc;

use crate::schema::{check_table, table_name};
use crate::{
    ClearClaim, FlowHandle, FlowStore, Layout, ResetRows, RowCursor, StoreError, StoredRow,
};
use deadpool_postgres::Client;

/// Forgets the flow in one transaction: its counters, completion, commit marks, watermark
/// buckets, watermark record and window emission mark (its next emission deletes the count rows
/// of its size and counts every window again from the rows left, see `windows.rs`), the rows
/// and dead letters `rows` says, and the ledger keys of exactly those: a key whose row or dead
/// letter is kept stays in the ledger, so its redelivery stays a duplicate. When every row goes
/// (`ResetRows::All`) the flow gets a new id instead, so its ledger keys (in every generation)
/// belong to no flow any more and leave with their partitions; otherwise the keys of the
/// deleted rows are deleted from every generation. With `claim`, only while its clearer holds
/// the pool update (the update's row held until the reset commits).
pub(super) async fn reset_flow(
    client: &mut Client,
    flow: &FlowHandle,
    table: Option<&str>,
    rows: ResetRows,
    claim: Option<&ClearClaim>,
) -> Result<(), StoreError> {
    let dead_letter = table_name(&flow.pipeline, "dead_letter")?;
    if let Some(table) = table {
        check_table(table)?;
    }
    let name: &str = &flow.name;
    let tx = client.transaction().await?;
    if let Some(claim) = claim {
        super::pool_updates::hold_claim(&tx, &flow.pipeline, claim).await?;
    }
    // The flow's row first, as an emission of its windows locks it first too (see
    // windows.rs): the two queue instead of deadlocking on its mark.
    tx.execute(
        "SELECT 1 FROM sluice_flows WHERE flow_id = $1 FOR UPDATE",
        &[&flow.id],
    )
    .await?;
    let mut targets = vec![(dead_letter.clone(), crate::typed::PLAIN_ENVELOPE)];
    if let Some(table) = table {
        targets.push((table.to_owned(), typed::envelope(&tx, table).await?));
    }
    let mut states = crate::RESET_CLEARS.to_vec();
    states.push("sluice_flow_counters");
    match (rows, targets.get(1)) {
        (
            ResetRows::PublishedSince {
                since_ms,
                hold_watermark: true,
            },
            Some((table, envelope)),
        ) => hold_watermark_for_replay(&tx, flow, table, envelope, since_ms).await?,
        _ => states.push("sluice_watermark_messages"),
    }
    for state in states {
        tx.execute(
            &format!("DELETE FROM {state} WHERE flow_id = $1"),
            &[&flow.id],
        )
        .await?;
    }
    match rows {
        ResetRows::Keep => {}
        ResetRows::All => {
            tx.execute(
                "UPDATE sluice_flows
                 SET flow_id = nextval(pg_get_serial_sequence('sluice_flows', 'flow_id'))
                 WHERE flow_id = $1",
                &[&flow.id],
            )
            .await?;
        }
        ResetRows::PublishedSince { since_ms: ms, .. } => {
            let select = |op: &str| {
                targets
                    .iter()
                    .map(|(t, e)| {
                        format!(
                            "SELECT {key} FROM \"{t}\"
                             WHERE {flow} = $2 AND {publish} {op} to_timestamp($3::int8 / 1000.0)",
                            key = e.dedup_key,
                            flow = e.flow,
                            publish = e.publish_time
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" UNION ")
            };
            tx.execute(
                &format!(
                    "DELETE FROM sluice_ledger WHERE flow_id = $1
                     AND key IN ({}) AND key NOT IN ({})",
                    select(">="),
                    select("<")
                ),
                &[&flow.id, &name, &ms],
            )
            .await?;
        }
    }
    // Table names are validated identifiers (checked above); values are bound.
    for (target, e) in &targets {
        match rows {
            ResetRows::Keep => {}
            ResetRows::All => {
                tx.execute(
                    &format!("DELETE FROM \"{target}\" WHERE {} = $1", e.flow),
                    &[&name],
                )
                .await?;
            }
            ResetRows::PublishedSince { since_ms: ms, .. } => {
                tx.execute(
                    &format!(
                        "DELETE FROM \"{target}\"
                         WHERE {} = $1 AND {} >= to_timestamp($2::int8 / 1000.0)",
                        e.flow, e.publish_time
                    ),
                    &[&name, &ms],
                )
                .await?;
            }
        }
    }
    tx.commit().await?;
    Ok(())
}

/// The watermark messages of a flow whose subscription replays what was published since
/// `since_ms` (see `ResetRows::PublishedSince`): of those recorded, only the ones tracked and not
/// settled in the whole buckets from `since_ms` on stay (the replay settles them); then every row
/// of `table` published since then, about to be deleted, is recorded tracked and not settled.
async fn hold_watermark_for_replay(
    tx: &deadpool_postgres::Transaction<'_>,
    flow: &FlowHandle,
    table: &str,
    e: &crate::typed::Envelope,
    since_ms: i64,
) -> Result<(), StoreError> {
    let name: &str = &flow.name;
    let bucket = crate::PROGRESS_BUCKET_MS;
    let first_whole_bucket = crate::progress::first_whole_bucket_from(since_ms);
    tx.execute(
        "DELETE FROM sluice_watermark_messages
         WHERE flow_id = $1 AND NOT (tracked AND NOT settled AND bucket_ms >= $2)",
        &[&flow.id, &first_whole_bucket],
    )
    .await?;
    // `table` is a validated identifier (checked by the caller); values are bound.
    let ms = |column: &str| format!("(extract(epoch FROM {column}) * 1000)::int8");
    tx.execute(
        &format!(
            "INSERT INTO sluice_watermark_messages
                 (flow_id, bucket_ms, message_id, tracked, settled, event_ms)
             SELECT $1, ({publish} / $4) * $4, {message_id}, true, false, {event}
             FROM \"{table}\"
             WHERE {flow} = $2 AND {publish_time} >= to_timestamp($3::int8 / 1000.0)
             ON CONFLICT (flow_id, bucket_ms, message_id) DO UPDATE SET
                 tracked = true, settled = false, event_ms = excluded.event_ms",
            publish = ms(e.publish_time),
            event = ms(e.event_time),
            message_id = e.message_id,
            flow = e.flow,
            publish_time = e.publish_time,
        ),
        &[&flow.id, &name, &since_ms, &bucket],
    )
    .await?;
    Ok(())
}

/// For each key, whether the flow has a row in `table` or a dead letter with it.
pub(super) async fn keys_present(
    client: &Client,
    flow: &FlowHandle,
    table: &str,
    keys: &[String],
) -> Result<Vec<bool>, StoreError> {
    check_table(table)?;
    let dead_letter = table_name(&flow.pipeline, "dead_letter")?;
    let name: &str = &flow.name;
    let e = typed::envelope(client, table).await?;
    let sql = format!(
        "SELECT {key} FROM \"{table}\" WHERE {flow} = $1 AND {key} = ANY($2)
         UNION
         SELECT dedup_key FROM \"{dead_letter}\" WHERE flow = $1 AND dedup_key = ANY($2)",
        key = e.dedup_key,
        flow = e.flow
    );
    let rows = client.query(&sql, &[&name, &keys]).await?;
    let present = rows
        .iter()
        .map(|row| row.try_get::<_, String>(0))
        .collect::<Result<std::collections::HashSet<_>, _>>()?;
    Ok(keys.iter().map(|k| present.contains(k)).collect())
}

/// A page of `table` after `after` (see `FlowStore::read_rows`).
pub(super) async fn read_rows(
    client: &Client,
    table: &str,
    after: Option<&RowCursor>,
    limit: usize,
) -> Result<Vec<StoredRow>, StoreError> {
    check_table(table)?;
    let start = after.cloned().unwrap_or_default();
    let sql = format!(
        "SELECT flow, dedup_key, message_id,
                (extract(epoch FROM publish_time) * 1000)::int8,
                (extract(epoch FROM event_time) * 1000)::int8,
                attributes::text, data
         FROM \"{table}\"
         WHERE (flow, dedup_key, message_id) > ($1, $2 COLLATE \"C\", $3)
         ORDER BY flow, dedup_key, message_id LIMIT $4"
    );
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = client
        .query(
            &sql,
            &[&start.flow, &start.dedup_key, &start.message_id, &limit],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(StoredRow {
                flow: row.try_get(0)?,
                dedup_key: row.try_get(1)?,
                message_id: row.try_get(2)?,
                publish_time_ms: row.try_get(3)?,
                event_time_ms: row.try_get(4)?,
                attributes_json: row.try_get(5)?,
                data: bytes::Bytes::from(row.try_get::<_, Vec<u8>>(6)?),
            })
        })
        .collect()
}

/// Whether the flow committed with this hook id.
/// The advisory lock class of commit attempts with a hook: a hook's transaction holds the
/// lock `(COMMIT_ATTEMPT_LOCK, hashtext(commit id))` until it ends, so whoever asks whether the
/// commit landed waits for it to be decided first.
pub(super) const COMMIT_ATTEMPT_LOCK: i32 = 0x736c_0002;

/// Whether the commit `commit_id` of `flow` landed. It first waits for the transaction of that
/// attempt to end (its advisory lock), so an answer given while its COMMIT is still running on
/// the server (a caller that gave up on it, a recovery racing a dying worker's commit) cannot be
/// "no" for a commit that then lands.
pub(super) async fn commit_recorded(
    client: &mut Client,
    flow: &FlowHandle,
    commit_id: &str,
) -> Result<bool, StoreError> {
    let tx = client.transaction().await?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        &[&COMMIT_ATTEMPT_LOCK, &commit_id],
    )
    .await?;
    let row = tx
        .query_one(
            "SELECT count(*) FROM sluice_commit_marks WHERE flow_id = $1 AND commit_id = $2",
            &[&flow.id, &commit_id],
        )
        .await?;
    tx.commit().await?;
    Ok(row.try_get::<_, i64>(0)? > 0)
}

#[async_trait]
impl FlowStore for PostgresStore {
    async fn prepare(&self, layout: &Layout) -> Result<Vec<FlowHandle>, StoreError> {
        self.forget_feed_relations();
        let (mut client, width) = self.ready().await?;
        let mut ddl = schema::dead_letter_ddl(&layout.pipeline)?;
        for target in &layout.tables {
            if target == "dead_letter" {
                return Err(StoreError::Config(
                    "a table target may not be named dead_letter".to_owned(),
                ));
            }
            let table = table_name(&layout.pipeline, target)?;
            match layout.typed.iter().find(|t| t.target == *target) {
                Some(typed) => ddl.push_str(&typed::ddl(&table, &typed.columns, &typed.keys)),
                None => ddl.push_str(&schema::target_ddl(&table)),
            }
        }
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&schema::DDL_LOCK])
            .await?;
        // A table that exists already is checked first: a typed table's changes are refused
        // before any DDL runs.
        for typed in &layout.typed {
            let table = table_name(&layout.pipeline, &typed.target)?;
            let exists: bool = tx
                .query_one(
                    "SELECT to_regclass($1) IS NOT NULL",
                    &[&format!("\"{table}\"")],
                )
                .await?
                .try_get(0)?;
            if exists {
                typed::evolve(&tx, &table, &typed.columns).await?;
                typed::keyed(&tx, &table, &typed.keys).await?;
            }
        }
        for target in &layout.tables {
            let table = table_name(&layout.pipeline, target)?;
            if relation_kind(&tx, &table).await? == Some('v') {
                return Err(crate::views::not_a_table(&table));
            }
            if !layout.typed.iter().any(|t| t.target == *target) {
                typed::refuse_if_typed(&tx, &table).await?;
            }
        }
        tx.batch_execute(&ddl).await?;
        for target in &layout.tables {
            if layout.typed.iter().any(|t| t.target == *target) {
                continue;
            }
            schema::upgrade_target(&tx, &table_name(&layout.pipeline, target)?).await?;
        }
        let mut handles = Vec::with_capacity(layout.flows.len());
        let pipeline: Arc<str> = Arc::from(layout.pipeline.as_str());
        for flow in &layout.flows {
            table_name(&layout.pipeline, flow)?;
            tx.execute(
                "INSERT INTO sluice_flows (pipeline, flow) VALUES ($1, $2)
                 ON CONFLICT (pipeline, flow) DO NOTHING",
                &[&layout.pipeline, flow],
            )
            .await?;
            let id: i64 = tx
                .query_one(
                    "SELECT flow_id FROM sluice_flows WHERE pipeline = $1 AND flow = $2",
                    &[&layout.pipeline, flow],
                )
                .await?
                .try_get(0)?;
            handles.push(FlowHandle {
                id,
                pipeline: pipeline.clone(),
                name: Arc::from(flow.as_str()),
            });
        }
        tx.commit().await?;
        ledger::create_ahead(&mut client, width, self.largest_window_ms()).await?;
        self.server_clock.measure(&client).await?;
        Ok(handles)
    }

    async fn create_views(&self, views: &[crate::TypedView]) -> Result<(), StoreError> {
        if views.is_empty() {
            return Ok(());
        }
        let (mut client, _) = self.ready().await?;
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&schema::DDL_LOCK])
            .await?;
        for view in views {
            if relation_kind(&tx, &view.name)
                .await?
                .is_some_and(|k| k != 'v')
            {
                return Err(crate::views::not_a_view(&view.name));
            }
            tx.batch_execute(&crate::views::ddl(view, crate::views::Dialect::Postgres)?)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn record_completion(&self, flow: &FlowHandle) -> Result<(), StoreError> {
        let (client, _) = self.ready().await?;
        client
            .execute(
                "INSERT INTO sluice_completions (flow_id, completed_at) VALUES ($1, now())
                 ON CONFLICT (flow_id) DO UPDATE SET completed_at = excluded.completed_at",
                &[&flow.id],
            )
            .await?;
        Ok(())
    }

    async fn completions(&self, pipeline: &str) -> Result<Vec<(String, i64)>, StoreError> {
        let (client, _) = self.ready().await?;
        let rows = client
            .query(
                concat!(
                    "SELECT f.flow, ",
                    ms!("c.completed_at"),
                    " FROM sluice_completions c JOIN sluice_flows f USING (flow_id)
                     WHERE f.pipeline = $1 ORDER BY f.flow"
                ),
                &[&pipeline],
            )
            .await?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect()
    }

    async fn reset_flow(
        &self,
        flow: &FlowHandle,
        table: Option<&str>,
        rows: ResetRows,
        claim: Option<&ClearClaim>,
    ) -> Result<(), StoreError> {
        let (mut client, _) = self.ready().await?;
        self::reset_flow(&mut client, flow, table, rows, claim).await
    }

    async fn clear_interval(
        &self,
        flow: &FlowHandle,
        table: &str,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<u64, StoreError> {
        let (mut client, _) = self.ready().await?;
        super::interval_rows::clear_interval(&mut client, flow, table, from_ms, to_ms).await
    }

    async fn read_rows(
        &self,
        table: &str,
        after: Option<&RowCursor>,
        limit: usize,
    ) -> Result<Vec<StoredRow>, StoreError> {
        let client = self.client().await?;
        self::read_rows(&client, table, after, limit).await
    }
}

/// What `name` is in the current schema: `r` a table, `v` a view, ...; `None`: nothing.
async fn relation_kind(
    client: &impl deadpool_postgres::GenericClient,
    name: &str,
) -> Result<Option<char>, StoreError> {
    let kind: Option<i8> = client
        .query_opt(
            "SELECT c.relkind FROM pg_class c
             WHERE c.oid = to_regclass(quote_ident($1))",
            &[&name],
        )
        .await?
        .map(|row| row.try_get(0))
        .transpose()?;
    Ok(kind.and_then(|k| u8::try_from(k).ok()).map(char::from))
}
