//! One batch, one statement: the ledger claims, the target rows (unless the caller's own work
//! is the batch's effect) and dead letters of the keys that were new, and the flow's
//! counters, in a single `INSERT ... WITH` statement run in
//! autocommit mode. So a commit is one round trip (the statement is prepared once per
//! connection) and one transaction; see `ledger.rs` for why the claims decide duplicates.
//!
//! A pipeline that publishes its dead letters (`$19`, its name) also places each new dead letter
//! in the outbox (`crate::OutboxLetter`) in this statement, unless the outbox holds that
//! record's letter already (a reset re-read it: one letter per flow and dedup key).
//!
//! A typed table's rows go through the flow's query (its fields bound from `$20`); a flow with
//! expectations also counts the verdicts of its new keys here (bound after the fields; see
//! `expectation_counts.rs`), so the counts commit with the rows.
//!
//! For a flow with a watermark the same statement records every entry's message as settled in
//! its publish-time bucket (each once: one `INSERT ... ON CONFLICT` may not touch a row twice).
//!
//! A batch with a commit deadline (`$18`, on the server's clock) checks it against the same
//! `now()` that decides expiry: past it, every step is empty and the statement returns one
//! `NULL` row instead of keys, which the caller reports as `StoreError::Stale`.
//!
//! The claims go in two steps: `first` claims every key in the current generation; `later`
//! claims, in the following generations of the window, only the keys `first` won. So a
//! duplicate leaves no row behind that could stretch its key's window.

use crate::{CommitBatch, Effect};
use std::collections::HashMap;

/// Counter shards per flow: replicas committing one flow at once rarely pick the same row.
pub(crate) const COUNTER_SHARDS: i32 = 64;

/// The number of the first parameter after `$1..$19`: a typed table's field arrays, then its
/// expectations' verdicts.
pub(crate) const FIRST_FIELD: usize = 20;

/// Where a commit statement writes its rows.
pub(crate) enum Rows<'a> {
    /// Nowhere: the caller's own work is the batch's effect.
    None,
    /// An envelope table.
    Envelope(&'a str),
    /// A typed table, through the flow's query (its decoded fields bound from `$20`).
    Typed(&'a str, &'a crate::TypedQuery),
}

/// The statement for one target table, or for none when the caller's own work is the batch's
/// effect (spliced names are validated identifiers). It returns each key the ledger let
/// through, with the number of rows written.
pub(crate) fn statement(rows: Rows<'_>, dead_letter: &str) -> String {
    // Rows written: those the `rows` step wrote, or, for the caller's work, every new row.
    let written = match rows {
        Rows::None => {
            "(SELECT count(*) FROM input i JOIN fresh f ON f.key = i.key WHERE i.reason IS NULL)"
        }
        Rows::Envelope(_) | Rows::Typed(..) => "(SELECT count(*) FROM rows)",
    };
    // A typed flow's expectations: their verdicts bound after the field arrays.
    let verdicts = match rows {
        Rows::Typed(_, query) => {
            super::expectation_counts::step(query, FIRST_FIELD + query.fields.len())
                .map(|step| format!("verdicts AS (\n            {step}\n        ),"))
        }
        Rows::None | Rows::Envelope(_) => None,
    }
    .unwrap_or_default();
    let rows = match rows {
        Rows::Typed(table, query) => match &query.changes {
            // `rows` counts the changes kept; `applied` writes each key's greatest.
            Some(rule) => super::typed_rows::changes_steps(table, query, rule),
            None => rows_cte(&super::typed_rows::rows_step(table, query)),
        },
        Rows::Envelope(table) => rows_cte(&format!(
            "INSERT INTO \"{table}\" (dedup_key, message_id, publish_time, event_time, attributes,
                                    data, flow, committed_at)
            SELECT i.key, i.message_id, to_timestamp(i.publish_ms / 1000.0::float8),
                   to_timestamp(i.event_ms / 1000.0::float8), i.attributes::jsonb, i.data, $13,
                   now()
            FROM input i JOIN fresh f ON f.key = i.key
            WHERE i.reason IS NULL
            RETURNING 1"
        )),
        Rows::None => rows_cte("SELECT 1 WHERE false"),
    };
    format!(
        "WITH clock AS (
            SELECT (extract(epoch FROM now()) * 1000)::int8 AS now_ms
        ),
        in_time AS (
            SELECT ($18::int8 IS NULL OR now_ms <= $18::int8) AS ok FROM clock
        ),
        input AS (
            SELECT u.key COLLATE \"C\" AS key, u.message_id, u.publish_ms, u.event_ms,
                   u.attributes, u.data, u.reason, u.error, u.attempts, u._sluice_n
            FROM unnest($2::text[], $3::text[], $4::int8[], $5::int8[], $6::text[],
                        $7::bytea[], $8::text[], $9::text[], $10::int4[]) WITH ORDINALITY
                AS u(key, message_id, publish_ms, event_ms, attributes, data, reason, error,
                     attempts, _sluice_n)
            WHERE (SELECT ok FROM in_time)
        ),
        first AS (
            INSERT INTO sluice_ledger AS l (generation, flow_id, key, expires_at)
            SELECT c.now_ms / $12, $1, i.key, c.now_ms + $11
            FROM input i CROSS JOIN clock c
            ORDER BY i.key
            ON CONFLICT (generation, flow_id, key) DO UPDATE SET expires_at = excluded.expires_at
            WHERE l.expires_at <= excluded.expires_at - $11
            RETURNING l.key
        ),
        later AS (
            INSERT INTO sluice_ledger AS l (generation, flow_id, key, expires_at)
            SELECT g, $1, f.key, c.now_ms + $11
            FROM first f CROSS JOIN clock c
            CROSS JOIN LATERAL generate_series(c.now_ms / $12 + 1, (c.now_ms + $11) / $12) AS g
            ORDER BY f.key, g
            ON CONFLICT (generation, flow_id, key) DO UPDATE SET expires_at = excluded.expires_at
            WHERE l.expires_at <= excluded.expires_at - $11
            RETURNING l.key
        ),
        fresh AS (
            SELECT f.key
            FROM first f LEFT JOIN (SELECT key, count(*) AS n FROM later GROUP BY key) x
                ON x.key = f.key
            WHERE COALESCE(x.n, 0) = (SELECT (now_ms + $11) / $12 - now_ms / $12 FROM clock)
        ),
        {rows},
        {verdicts}
        dead AS (
            INSERT INTO \"{dead_letter}\" (flow, dedup_key, message_id, publish_time, attributes,
                                          data, reason, error, attempts, committed_at)
            SELECT $13, i.key, i.message_id, to_timestamp(i.publish_ms / 1000.0::float8),
                   i.attributes::jsonb, i.data, i.reason, i.error, i.attempts, now()
            FROM input i JOIN fresh f ON f.key = i.key
            WHERE i.reason IS NOT NULL
            RETURNING 1
        ),
        outbox AS (
            INSERT INTO sluice_dead_letter_outbox (pipeline, flow, dedup_key, message_id,
                                                   publish_time_ms, attributes, data, reason,
                                                   error, attempts, committed_at)
            SELECT $19::text, $13, i.key, i.message_id, i.publish_ms, i.attributes, i.data,
                   i.reason, i.error, i.attempts, now()
            FROM input i JOIN fresh f ON f.key = i.key
            WHERE i.reason IS NOT NULL AND $19::text IS NOT NULL
            ON CONFLICT (pipeline, flow, md5(dedup_key)) DO NOTHING
        ),
        counted AS (
            INSERT INTO sluice_flow_counters AS c (flow_id, shard, committed, duplicates,
                                                   dead_lettered, batches, last_commit_at)
            SELECT $1, $14,
                   {written},
                   $15 - (SELECT count(*) FROM fresh),
                   (SELECT count(*) FROM dead), 1, now()
            WHERE (SELECT ok FROM in_time)
            ON CONFLICT (flow_id, shard) DO UPDATE SET
                committed = c.committed + excluded.committed,
                duplicates = c.duplicates + excluded.duplicates,
                dead_lettered = c.dead_lettered + excluded.dead_lettered,
                batches = c.batches + 1,
                last_commit_at = excluded.last_commit_at
        ),
        progress AS (
            INSERT INTO sluice_watermark_messages AS m (flow_id, bucket_ms, message_id, tracked,
                                                       settled, event_ms)
            SELECT $1, p.bucket_ms, p.message_id, false, true, NULL::int8
            FROM unnest($16::int8[], $17::text[]) AS p(bucket_ms, message_id)
            WHERE (SELECT ok FROM in_time)
            ORDER BY p.bucket_ms, p.message_id
            ON CONFLICT (flow_id, bucket_ms, message_id) DO UPDATE SET settled = true
        )
        SELECT key, {written} FROM fresh
        UNION ALL SELECT NULL, 0 FROM in_time WHERE NOT ok"
    )
}

/// The statement's `rows` step: what it writes, returning a row for each row written.
fn rows_cte(step: &str) -> String {
    format!("rows AS (\n            {step}\n        )")
}

/// Seals a transaction with work in it just before it commits (see `commit_time.rs`): on the
/// server's clock (`clock_timestamp()`, the moment the statement runs, not the transaction's
/// start), returns `false` if the deadline `$1` (ms, or NULL) has passed, and otherwise, if the
/// transaction has lasted more than `$6` ms, stamps the expiry of the keys it won (`$4`) again
/// from now: a row per generation of the window from now, as a commit writes them.
pub(crate) const SEAL: &str = "
    WITH c AS (
        SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8 AS t,
               (extract(epoch FROM now()) * 1000)::int8 AS s
    ),
    ok AS (
        SELECT ($1::int8 IS NULL OR t <= $1::int8) AS ok, t, s FROM c
    ),
    restamp AS (
        INSERT INTO sluice_ledger AS l (generation, flow_id, key, expires_at)
        SELECT g, $2, k.key, ok.t + $3
        FROM ok CROSS JOIN unnest($4::text[]) AS k(key)
        CROSS JOIN LATERAL generate_series(ok.t / $5, (ok.t + $3) / $5) AS g
        WHERE ok.ok AND ok.t - ok.s > $6
        ORDER BY k.key, g
        ON CONFLICT (generation, flow_id, key) DO UPDATE SET expires_at = excluded.expires_at
    )
    SELECT ok FROM ok";

/// The statement's parameters for one batch: entries with a key already seen earlier in the
/// batch are left out (they are duplicates of that first entry).
pub(crate) struct Arguments<'a> {
    /// Index of the first entry of each distinct key, in batch order.
    pub(crate) firsts: Vec<usize>,
    keys: Vec<&'a str>,
    message_ids: Vec<&'a str>,
    publish_ms: Vec<i64>,
    event_ms: Vec<Option<i64>>,
    attributes: Vec<&'a str>,
    data: Vec<&'a [u8]>,
    reasons: Vec<Option<&'a str>>,
    errors: Vec<Option<&'a str>>,
    attempts: Vec<Option<i32>>,
    window_ms: i64,
    generation_ms: i64,
    shard: i32,
    total: i64,
    /// Settled messages toward the flow's watermark, distinct, sorted: buckets and ids.
    progress_buckets: Vec<i64>,
    progress_ids: Vec<&'a str>,
    /// The commit deadline on the server's clock, ms (`None`: none).
    commit_by_ms: Option<i64>,
    /// The pipeline, when its new dead letters go to the outbox too.
    outbox_pipeline: Option<&'a str>,
}

impl<'a> Arguments<'a> {
    /// `commit_by_server_ms` is the batch's deadline already on the server's clock.
    pub(crate) fn new(
        batch: &'a CommitBatch,
        generation_ms: i64,
        shard: i32,
        commit_by_server_ms: Option<i64>,
    ) -> Self {
        let mut seen: HashMap<&str, ()> = HashMap::with_capacity(batch.entries.len());
        let mut args = Arguments {
            firsts: Vec::with_capacity(batch.entries.len()),
            keys: Vec::new(),
            message_ids: Vec::new(),
            publish_ms: Vec::new(),
            event_ms: Vec::new(),
            attributes: Vec::new(),
            data: Vec::new(),
            reasons: Vec::new(),
            errors: Vec::new(),
            attempts: Vec::new(),
            window_ms: batch.expires_at_ms.saturating_sub(batch.now_ms).max(1),
            generation_ms,
            shard,
            // Entries plus what the memory tier dropped: the duplicates counted are this less
            // the new keys.
            total: i64::try_from(batch.entries.len() as u64 + batch.memory_duplicates)
                .unwrap_or(i64::MAX),
            progress_buckets: Vec::new(),
            progress_ids: Vec::new(),
            commit_by_ms: commit_by_server_ms,
            outbox_pipeline: batch.publish_dead_letters.then_some(&*batch.flow.pipeline),
        };
        if batch.watermark_progress {
            let settled: std::collections::BTreeSet<(i64, &str)> = batch
                .entries
                .iter()
                .map(|e| {
                    let bucket = e
                        .message
                        .publish_time_ms
                        .div_euclid(crate::PROGRESS_BUCKET_MS)
                        .saturating_mul(crate::PROGRESS_BUCKET_MS);
                    (bucket, e.message.message_id.as_str())
                })
                .collect();
            (args.progress_buckets, args.progress_ids) = settled.into_iter().unzip();
        }
        for (index, entry) in batch.entries.iter().enumerate() {
            if seen.insert(entry.key.as_str(), ()).is_some() {
                continue;
            }
            args.firsts.push(index);
            args.keys.push(entry.key.as_str());
            args.message_ids.push(&entry.message.message_id);
            args.publish_ms.push(entry.message.publish_time_ms);
            args.attributes.push(&entry.message.attributes_json);
            args.data.push(&entry.message.data);
            match &entry.effect {
                Effect::Row { event_time_ms, .. } => {
                    args.event_ms.push(Some(*event_time_ms));
                    args.reasons.push(None);
                    args.errors.push(None);
                    args.attempts.push(None);
                }
                Effect::DeadLetter {
                    reason,
                    error,
                    attempts,
                } => {
                    args.event_ms.push(None);
                    args.reasons.push(Some(reason));
                    args.errors.push(Some(error));
                    args.attempts
                        .push(Some(i32::try_from(*attempts).unwrap_or(i32::MAX)));
                }
            }
        }
        args
    }

    /// The window this batch's keys are kept for, ms.
    pub(crate) fn window_ms(&self) -> i64 {
        self.window_ms
    }

    /// The commit deadline on the server's clock, ms (`None`: none).
    pub(crate) fn commit_by_ms(&self) -> Option<i64> {
        self.commit_by_ms
    }

    /// Parameters `$1..$19` of [`statement`].
    pub(crate) fn params<'b>(
        &'b self,
        flow_id: &'b i64,
        flow: &'b &'b str,
    ) -> [&'b (dyn tokio_postgres::types::ToSql + Sync); 19] {
        [
            flow_id,
            &self.keys,
            &self.message_ids,
            &self.publish_ms,
            &self.event_ms,
            &self.attributes,
            &self.data,
            &self.reasons,
            &self.errors,
            &self.attempts,
            &self.window_ms,
            &self.generation_ms,
            flow,
            &self.shard,
            &self.total,
            &self.progress_buckets,
            &self.progress_ids,
            &self.commit_by_ms,
            &self.outbox_pipeline,
        ]
    }
}

/// Per entry: written (`true`) or duplicate, given the keys the statement reported fresh.
pub(crate) fn outcome(batch: &CommitBatch, firsts: &[usize], fresh: &[String]) -> Vec<bool> {
    let fresh: std::collections::HashSet<&str> = fresh.iter().map(String::as_str).collect();
    let mut written = vec![false; batch.entries.len()];
    for &index in firsts {
        written[index] = fresh.contains(batch.entries[index].key.as_str());
    }
    written
}
