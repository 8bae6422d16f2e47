//! Feeds on PostgreSQL (see the crate's `feed` module): a point of a table's history is a
//! snapshot (`pg_current_snapshot()`), and a range holds the rows whose writer transaction
//! (`writer_xid`) is visible in its end and not in its start, so a transaction that commits
//! after one with a larger id is still read, in the range of its own commit.

use super::PostgresStore;
use async_trait::async_trait;

use crate::schema::check_table;
use crate::{
    FILE_SOURCE, FeedLag, FeedRow, FeedStore, FileCheckpoint, FlowHandle, PositionAdvance,
    ReadPosition, StoreError, StoredRow,
};
use deadpool_postgres::{Client, GenericClient};

const RETURNING: &str = "RETURNING version, range_from, range_to, after_a, after_b";

fn position(row: &tokio_postgres::Row) -> Result<ReadPosition, tokio_postgres::Error> {
    let after: (Option<i64>, Option<i64>) = (row.try_get(3)?, row.try_get(4)?);
    Ok(ReadPosition {
        version: row.try_get(0)?,
        range_from: row.try_get(1)?,
        range_to: row.try_get(2)?,
        after: after.0.zip(after.1),
    })
}

pub(super) async fn read_position(
    client: &Client,
    flow: &FlowHandle,
    table: &str,
) -> Result<ReadPosition, StoreError> {
    let row = client
        .query_opt(
            "SELECT version, range_from, range_to, after_a, after_b FROM sluice_read_positions
             WHERE flow_id = $1 AND source = $2",
            &[&flow.id, &table],
        )
        .await?;
    Ok(row.as_ref().map(position).transpose()?.unwrap_or_default())
}

pub(super) async fn plan_range(
    client: &Client,
    flow: &FlowHandle,
    table: &str,
    at: &ReadPosition,
) -> Result<ReadPosition, StoreError> {
    check_table(table)?;
    let row = if at.version == 0 {
        client
            .query_opt(
                &format!(
                    "INSERT INTO sluice_read_positions (flow_id, source, version, range_from,
                         range_to)
                     VALUES ($1, $2, 1, '', pg_current_snapshot()::text)
                     ON CONFLICT (flow_id, source) DO NOTHING {RETURNING}"
                ),
                &[&flow.id, &table],
            )
            .await?
    } else {
        client
            .query_opt(
                &format!(
                    "UPDATE sluice_read_positions SET version = version + 1,
                         range_from = range_to, range_to = pg_current_snapshot()::text,
                         after_a = NULL, after_b = NULL, updated_at = now()
                     WHERE flow_id = $1 AND source = $2 AND version = $3 {RETURNING}"
                ),
                &[&flow.id, &table, &at.version],
            )
            .await?
    };
    match row {
        Some(row) => Ok(position(&row)?),
        None => Err(StoreError::Moved),
    }
}

/// The rows of `at`'s range that it has not committed: writer visible in the range's end,
/// not in its start (none at the beginning), after the cursor.
fn unread_in_range(at: &ReadPosition) -> &'static str {
    if at.range_from.is_empty() {
        "pg_visible_in_snapshot(writer_xid, $2::text::pg_snapshot)
         AND writer_xid < pg_snapshot_xmax($2::text::pg_snapshot)
         AND (writer_xid, seq) > ($3::text::xid8, $4::int8)
         AND $1::text = ''"
    } else {
        "writer_xid >= pg_snapshot_xmin($1::text::pg_snapshot)
         AND writer_xid < pg_snapshot_xmax($2::text::pg_snapshot)
         AND NOT pg_visible_in_snapshot(writer_xid, $1::text::pg_snapshot)
         AND pg_visible_in_snapshot(writer_xid, $2::text::pg_snapshot)
         AND (writer_xid, seq) > ($3::text::xid8, $4::int8)"
    }
}

fn cursor_text(at: &ReadPosition) -> (String, i64) {
    let (xid, seq) = at.after.unwrap_or((0, 0));
    (xid.to_string(), seq)
}

pub(super) async fn read_range(
    client: &Client,
    table: &str,
    relation: &str,
    at: &ReadPosition,
    limit: usize,
) -> Result<Vec<FeedRow>, StoreError> {
    check_table(table)?;
    if at.range_to.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "SELECT writer_xid::text, seq, flow, dedup_key, message_id,
                (extract(epoch FROM publish_time) * 1000)::int8,
                (extract(epoch FROM event_time) * 1000)::int8,
                attributes::text, data, (extract(epoch FROM committed_at) * 1000)::int8
         FROM {relation}
         WHERE {}
         ORDER BY writer_xid, seq LIMIT $5",
        unread_in_range(at)
    );
    let (xid, seq) = cursor_text(at);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = client
        .query(&sql, &[&at.range_from, &at.range_to, &xid, &seq, &limit])
        .await?;
    rows.iter()
        .map(|row| {
            let xid: String = row.try_get(0)?;
            let xid = xid
                .parse()
                .map_err(|_| StoreError::Rejected(format!("writer_xid {xid:?}")))?;
            Ok(FeedRow {
                cursor: (xid, row.try_get(1)?),
                row: StoredRow {
                    flow: row.try_get(2)?,
                    dedup_key: row.try_get(3)?,
                    message_id: row.try_get(4)?,
                    publish_time_ms: row.try_get(5)?,
                    event_time_ms: row.try_get(6)?,
                    attributes_json: row.try_get(7)?,
                    data: bytes::Bytes::from(row.try_get::<_, Vec<u8>>(8)?),
                },
                committed_at_ms: row.try_get(9)?,
            })
        })
        .collect()
}

pub(super) async fn feed_lag(
    client: &Client,
    table: &str,
    relation: &str,
    at: &ReadPosition,
) -> Result<FeedLag, StoreError> {
    check_table(table)?;
    let counted = "SELECT count(*), (extract(epoch FROM min(committed_at)) * 1000)::int8";
    let row = if at.range_to.is_empty() {
        client
            .query_one(&format!("{counted} FROM {relation}"), &[])
            .await?
    } else {
        // In the range after the cursor, or not in the range's end yet.
        let after_start = if at.range_from.is_empty() {
            "$1::text = ''"
        } else {
            "writer_xid >= pg_snapshot_xmin($1::text::pg_snapshot)
             AND NOT pg_visible_in_snapshot(writer_xid, $1::text::pg_snapshot)"
        };
        let (xid, seq) = cursor_text(at);
        client
            .query_one(
                &format!(
                    "{counted} FROM {relation} WHERE {after_start}
                     AND (NOT pg_visible_in_snapshot(writer_xid, $2::text::pg_snapshot)
                          OR writer_xid >= pg_snapshot_xmax($2::text::pg_snapshot)
                          OR (writer_xid, seq) > ($3::text::xid8, $4::int8))"
                ),
                &[&at.range_from, &at.range_to, &xid, &seq],
            )
            .await?
    };
    let rows: i64 = row.try_get(0)?;
    Ok(FeedLag {
        rows_behind: u64::try_from(rows).unwrap_or(0),
        oldest_unread_ms: row.try_get(1)?,
    })
}

/// Records a committed page inside the batch's transaction (see `PositionAdvance`).
pub(super) async fn advance(
    tx: &impl GenericClient,
    flow_id: i64,
    advance: &PositionAdvance,
) -> Result<(), StoreError> {
    let table: &str = &advance.table;
    let changed = match advance.after {
        Some((a, b)) => {
            tx.execute(
                "UPDATE sluice_read_positions SET version = version + 1, after_a = $3,
                     after_b = $4, updated_at = now()
                 WHERE flow_id = $1 AND source = $2 AND version = $5",
                &[&flow_id, &table, &a, &b, &advance.expected_version],
            )
            .await?
        }
        // Locked until this transaction ends: nobody moves it meanwhile.
        None => {
            tx.execute(
                "SELECT 1 FROM sluice_read_positions
                 WHERE flow_id = $1 AND source = $2 AND version = $3 FOR UPDATE",
                &[&flow_id, &table, &advance.expected_version],
            )
            .await?
        }
    };
    if changed == 0 {
        return Err(StoreError::Moved);
    }
    Ok(())
}

pub(super) async fn file_checkpoint(
    client: &Client,
    flow: &FlowHandle,
) -> Result<Option<FileCheckpoint>, StoreError> {
    let row = client
        .query_opt(
            "SELECT range_from, after_a, after_b FROM sluice_read_positions
             WHERE flow_id = $1 AND source = $2",
            &[&flow.id, &FILE_SOURCE],
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(FileCheckpoint {
        path: row.try_get(0)?,
        offset: row.try_get::<_, Option<i64>>(1)?.unwrap_or_default(),
        line: row.try_get::<_, Option<i64>>(2)?.unwrap_or_default(),
    }))
}

pub(super) async fn save_file_checkpoint(
    client: &Client,
    flow: &FlowHandle,
    at: &FileCheckpoint,
) -> Result<(), StoreError> {
    client
        .execute(
            "INSERT INTO sluice_read_positions
                 (flow_id, source, version, range_from, range_to, after_a, after_b)
             VALUES ($1, $2, 1, $3, '', $4, $5)
             ON CONFLICT (flow_id, source) DO UPDATE SET
                 version = sluice_read_positions.version + 1,
                 range_from = excluded.range_from, after_a = excluded.after_a,
                 after_b = excluded.after_b, updated_at = now()",
            &[&flow.id, &FILE_SOURCE, &at.path, &at.offset, &at.line],
        )
        .await?;
    Ok(())
}

#[async_trait]
impl FeedStore for PostgresStore {
    async fn read_position(
        &self,
        flow: &FlowHandle,
        table: &str,
    ) -> Result<ReadPosition, StoreError> {
        let (client, _) = self.ready().await?;
        self::read_position(&client, flow, table).await
    }

    async fn plan_range(
        &self,
        flow: &FlowHandle,
        table: &str,
        at: &ReadPosition,
    ) -> Result<ReadPosition, StoreError> {
        let (client, _) = self.ready().await?;
        self::plan_range(&client, flow, table, at).await
    }

    async fn read_range(
        &self,
        table: &str,
        at: &ReadPosition,
        limit: usize,
    ) -> Result<Vec<FeedRow>, StoreError> {
        let (client, _) = self.ready().await?;
        let relation = self.feed_relation(&client, table).await?;
        self::read_range(&client, table, &relation, at, limit).await
    }

    async fn feed_lag(&self, table: &str, at: &ReadPosition) -> Result<FeedLag, StoreError> {
        let (client, _) = self.ready().await?;
        let relation = self.feed_relation(&client, table).await?;
        self::feed_lag(&client, table, &relation, at).await
    }

    async fn file_checkpoint(
        &self,
        flow: &FlowHandle,
    ) -> Result<Option<FileCheckpoint>, StoreError> {
        let (client, _) = self.ready().await?;
        self::file_checkpoint(&client, flow).await
    }

    async fn save_file_checkpoint(
        &self,
        flow: &FlowHandle,
        at: &FileCheckpoint,
    ) -> Result<(), StoreError> {
        let (client, _) = self.ready().await?;
        self::save_file_checkpoint(&client, flow, at).await
    }
}
