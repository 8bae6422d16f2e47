//! The PostgreSQL backend: the shared store of a worker pool.
//!
//! Same contract as SQLite (see the crate docs), with these differences:
//! - every commit is one statement and one round trip (`commit.rs`); many commits run at once
//!   over a connection pool, from many processes and hosts;
//! - the ledger is partitioned by time and expires by dropping whole partitions (`ledger.rs`);
//! - times that decide something (ledger expiry, leases, heartbeats) come from the database
//!   server's clock, so replicas' clocks need not agree; a commit deadline given on the
//!   worker's clock is converted with a measured offset (`clock.rs`) and checked by the
//!   commit statement itself;
//! - migrations (`schema.rs`) run on first use, under an advisory lock.
//!
//! Opening a store does not connect: the first call that needs the database does, so a worker
//! whose database is down starts, logs, and retries like for any other outage.

mod clock;
mod commit;
mod connect;
mod error;
mod feed;
mod flows;
mod ledger;
mod outbox;
mod pool;
mod pool_updates;
mod progress;
mod runs;
mod schema;
#[cfg(feature = "scratch")]
mod scratch;
mod windows;

pub use connect::PostgresOptions;
#[cfg(feature = "scratch")]
pub use scratch::{DEFAULT_SCRATCH_SERVER, SCRATCH_SERVER_VAR, ScratchDatabase};

#[cfg(feature = "testing")]
use crate::Inspect;
use crate::schema::table_name;
use crate::{
    BucketCounts, BucketMessage, ClearClaim, CommitBatch, CommitOutcome, FeedLag, FeedRow,
    FeedStore, FileCheckpoint, FlowHandle, FlowProgress, FlowStore, Layout, LedgerStore,
    LedgerUpkeep, OutboxCensus, OutboxLetter, OutboxStore, ProgressStore, ReadPosition, ResetRows,
    RowCursor, RunEnd, RunRecord, RunStart, RunStore, StoreError, StoredRow, WatermarkRecord,
    WindowEmission, WindowStore, WindowsEmitted,
};
use async_trait::async_trait;
use deadpool_postgres::{Client, Pool};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;
use tokio::sync::OnceCell;

/// `x` (a `timestamptz` expression) as ms since the epoch.
macro_rules! ms {
    ($x:literal) => {
        concat!("(extract(epoch FROM ", $x, ") * 1000)::int8")
    };
}
pub(crate) use ms;

/// A PostgreSQL database shared by the replicas of a pool.
pub struct PostgresStore {
    pool: Pool,
    /// The heartbeats' own connection: commits holding every connection of `pool` never keep
    /// a beat waiting, so a busy worker is not taken for one cut off (the worker's self-fence
    /// is measured from its beats).
    beats: Pool,
    options: PostgresOptions,
    /// Ledger generation width, ms, as recorded in the database (known after migrations).
    generation_ms: OnceCell<i64>,
    /// The largest dedup window seen in a commit, ms: generations are created that far ahead
    /// (plus a margin). Zero until the first commit, which creates what its window needs.
    largest_window_ms: AtomicI64,
    /// `url` without its password, for messages.
    display: String,
    /// The server's clock against ours, for commit deadlines.
    server_clock: clock::ServerClock,
}

impl PostgresStore {
    /// A store for `url` (libpq URL plus sluice's parameters, see [`PostgresOptions`]). Does not
    /// connect yet.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        let (libpq, options) = connect::split_url(url)?;
        Ok(Self {
            pool: connect::pool(&libpq, &options)?,
            beats: connect::pool_of(&libpq, &options, 1)?,
            largest_window_ms: AtomicI64::new(0),
            options,
            generation_ms: OnceCell::new(),
            display: connect::redact(url),
            server_clock: clock::ServerClock::default(),
        })
    }

    /// The URL, password redacted.
    pub fn display_url(&self) -> &str {
        &self.display
    }

    /// Ledger generations currently attached (for tests and capacity figures).
    pub async fn ledger_generations(&self) -> Result<Vec<i64>, StoreError> {
        let client = self.client().await?;
        ledger::attached(&client).await
    }

    /// A server setting as sluice's own sessions see it (`SHOW name`), for checks and
    /// diagnostics. `name` must be an identifier (letters, digits, `_` and `.`).
    pub async fn session_setting(&self, name: &str) -> Result<String, StoreError> {
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        {
            return Err(StoreError::Config(format!(
                "{name:?} is not a setting name"
            )));
        }
        let client = self.client().await?;
        let row = client.query_one(&format!("SHOW {name}"), &[]).await?;
        Ok(row.try_get(0)?)
    }

    /// What the ledger occupies now, and the server's WAL position, for capacity figures.
    pub async fn footprint(&self) -> Result<Footprint, StoreError> {
        let (client, _) = self.ready().await?;
        let row = client
            .query_one(
                "SELECT (SELECT count(*) FROM sluice_ledger)::int8,
                        (SELECT COALESCE(sum(pg_total_relation_size(i.inhrelid)), 0)
                         FROM pg_inherits i WHERE i.inhparent = 'sluice_ledger'::regclass)::int8,
                        pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8",
                &[],
            )
            .await?;
        Ok(Footprint {
            ledger_rows: row.try_get(0)?,
            ledger_bytes: row.try_get(1)?,
            wal_position: row.try_get(2)?,
        })
    }

    async fn client(&self) -> Result<Client, StoreError> {
        Ok(self.pool.get().await?)
    }

    /// A connection to a migrated database, and the ledger generation width.
    async fn ready(&self) -> Result<(Client, i64), StoreError> {
        let mut client = self.client().await?;
        let width = *self
            .generation_ms
            .get_or_try_init(|| {
                schema::migrate(&mut client, millis(self.options.ledger_generation))
            })
            .await?;
        Ok((client, width))
    }

    fn horizon_ms(&self) -> i64 {
        self.largest_window_ms
            .load(Ordering::Relaxed)
            .saturating_add(ledger::AHEAD_MS)
    }

    /// A commit that must do more inside its transaction: run a hook (a sink's file) with its
    /// commit mark, and move a reading flow's position (last, after waiting for the page before
    /// it; refused, the whole transaction rolls back). One explicit transaction (a few more
    /// round trips than a plain commit), which holds a hook attempt's advisory lock until it
    /// ends (see `flows::commit_recorded`), sealed as it commits (`commit_time.rs`).
    ///
    /// A page waits for the page before it for at most [`PAGE_WAIT_IN_TRANSACTION`] with its
    /// transaction open; past that the transaction rolls back and the connection goes back to
    /// the pool ([`Committed::WaitForPage`]): pages in flight together never hold the pool's
    /// connections while the page they wait for needs one.
    async fn commit_in_transaction(
        &self,
        client: &mut Client,
        width: i64,
        batch: &CommitBatch,
        arguments: &commit::Arguments<'_>,
    ) -> Result<Committed, StoreError> {
        let mut attempts_left = 2;
        loop {
            attempts_left -= 1;
            let tx = client.transaction().await?;
            if let Some(hook) = &batch.hook {
                // Held until this transaction ends: `commit_recorded` waits for it.
                tx.execute(
                    "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                    &[&flows::COMMIT_ATTEMPT_LOCK, &hook.id()],
                )
                .await?;
            }
            let fresh = match self.run_commit(&tx, batch, arguments).await {
                Err(error) if error::is_missing_generation(&error) && attempts_left > 0 => {
                    drop(tx);
                    ledger::create_ahead(client, width, self.horizon_ms()).await?;
                    continue;
                }
                other => other?.ok_or(StoreError::Stale)?,
            };
            let mut written = commit::outcome(batch, &arguments.firsts, &fresh);
            // The caller's own writes for the new rows (a library job), in this transaction.
            match &batch.work {
                None => {}
                Some(crate::TransactionWork::Postgres(work)) => {
                    work.write(&tx, &crate::work::new_rows(batch, &written))
                        .await?;
                    // A statement of the work that failed (its error swallowed) aborted the
                    // transaction, and COMMIT would then roll it back without a word: refuse.
                    tx.batch_execute("SELECT 1").await?;
                }
                Some(crate::TransactionWork::Sqlite(_)) => {
                    return Err(StoreError::Config(
                        "work for a SQLite transaction given to a PostgreSQL store".to_owned(),
                    ));
                }
            }
            if let Some(hook) = &batch.hook {
                // The hook writes and syncs a file: off the async threads, which other commits
                // need meanwhile.
                let (work, id) = (hook.clone(), hook.id().to_owned());
                let done = tokio::task::spawn_blocking(move || {
                    work.before_commit(&written).map(|()| written)
                })
                .await
                .map_err(|e| format!("panicked: {e}"))
                .and_then(|result| result);
                written =
                    done.map_err(|e| StoreError::Unavailable(format!("commit hook {id}: {e}")))?;
                tx.execute(
                    "INSERT INTO sluice_commit_marks (flow_id, commit_id) VALUES ($1, $2)",
                    &[&batch.flow.id, &hook.id()],
                )
                .await?;
            }
            // Last, so that pages in flight together overlap their work and move the position
            // in order, each after the one before it committed.
            if let Some(advance) = &batch.position {
                if let Some(gate) = &batch.position_gate {
                    let version = advance.expected_version;
                    match tokio::time::timeout(PAGE_WAIT_IN_TRANSACTION, gate.wait(version)).await {
                        Ok(true) => {}
                        Ok(false) => return Err(StoreError::Moved),
                        Err(_) => return Ok(Committed::WaitForPage(gate.clone(), version)),
                    }
                }
                feed::advance(&tx, batch.flow.id, advance).await?;
            }
            match self.seal(&tx, width, batch, arguments, &written).await {
                Err(error) if error::is_missing_generation(&error) && attempts_left > 0 => {
                    drop(tx);
                    ledger::create_ahead(client, width, self.horizon_ms()).await?;
                    continue;
                }
                Err(error) => return Err(error.into()),
                Ok(false) => return Err(StoreError::Stale),
                Ok(true) => {}
            }
            tx.commit().await?;
            return Ok(Committed::Done(CommitOutcome { written }));
        }
    }

    /// One attempt at `batch`: committed, or rolled back to wait, without a connection, for
    /// the page before it.
    async fn commit_once(&self, batch: &CommitBatch) -> Result<Committed, StoreError> {
        let (mut client, width) = self.ready().await?;
        // Pages of a reading flow in flight together take different shards: a page waiting for
        // the one before it must not hold a counter row that one needs.
        let shard = match &batch.position {
            Some(advance) => i32::try_from(
                advance
                    .expected_version
                    .rem_euclid(commit::COUNTER_SHARDS.into()),
            )
            .unwrap_or_default(),
            None => rand::random_range(0..commit::COUNTER_SHARDS),
        };
        let deadline = self.server_deadline(&client, batch).await?;
        let arguments = commit::Arguments::new(batch, width, shard, deadline);
        self.largest_window_ms
            .fetch_max(arguments.window_ms(), Ordering::Relaxed);
        if batch.hook.is_some() || batch.position.is_some() || batch.work.is_some() {
            return self
                .commit_in_transaction(&mut client, width, batch, &arguments)
                .await;
        }
        let fresh = match self.run_commit(&client, batch, &arguments).await {
            Err(error) if error::is_missing_generation(&error) => {
                // The upkeep holder is late (or this is the first commit after a long pause):
                // create what is missing and try once more.
                ledger::create_ahead(&mut client, width, self.horizon_ms()).await?;
                self.run_commit(&client, batch, &arguments).await?
            }
            other => other?,
        }
        .ok_or(StoreError::Stale)?;
        Ok(Committed::Done(CommitOutcome {
            written: commit::outcome(batch, &arguments.firsts, &fresh),
        }))
    }

    /// Runs [`commit::SEAL`] in `tx`: `false` if the batch is past its deadline now.
    async fn seal(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        width: i64,
        batch: &CommitBatch,
        arguments: &commit::Arguments<'_>,
        written: &[bool],
    ) -> Result<bool, tokio_postgres::Error> {
        let won: Vec<&str> = batch
            .entries
            .iter()
            .zip(written)
            .filter(|(_, written)| **written)
            .map(|(entry, _)| entry.key.as_str())
            .collect();
        let statement = tx.prepare_cached(commit::SEAL).await?;
        let row = tx
            .query_one(
                &statement,
                &[
                    &arguments.commit_by_ms(),
                    &batch.flow.id,
                    &arguments.window_ms(),
                    &won,
                    &width,
                    &crate::RESTAMP_AFTER_MS,
                ],
            )
            .await?;
        row.try_get(0)
    }

    async fn run_commit(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        batch: &CommitBatch,
        arguments: &commit::Arguments<'_>,
    ) -> Result<Option<Vec<String>>, tokio_postgres::Error> {
        let dead_letter = format!("{}__dead_letter", batch.flow.pipeline);
        let statement = client
            .prepare_cached(&commit::statement(
                batch.work.is_none().then_some(&*batch.table),
                &dead_letter,
            ))
            .await?;
        let rows = client
            .query(
                &statement,
                &arguments.params(&batch.flow.id, &&*batch.flow.name),
            )
            .await?;
        // Keys won, or one NULL when the batch was past its deadline (nothing written).
        let keys: Vec<Option<String>> = rows
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()?;
        Ok(keys.into_iter().collect())
    }

    /// The batch's commit deadline on the server's clock, measuring the clock first if it
    /// never was.
    async fn server_deadline(
        &self,
        client: &Client,
        batch: &CommitBatch,
    ) -> Result<Option<i64>, StoreError> {
        let Some(local) = batch.commit_by_ms else {
            return Ok(None);
        };
        if !self.server_clock.is_measured() {
            self.server_clock.measure(client).await?;
        }
        Ok(Some(self.server_clock.to_server(local)))
    }
}

/// How long a page's transaction, its work done, waits for the page before it with its
/// connection held: longer than a page's commit takes while the store answers (tens of
/// milliseconds), far shorter than the pool's wait for a connection (`connect.rs`). Past it,
/// the page waits without a connection and runs its transaction again.
const PAGE_WAIT_IN_TRANSACTION: Duration = Duration::from_millis(500);

/// How one commit attempt ended.
enum Committed {
    /// Committed.
    Done(CommitOutcome),
    /// Rolled back with nothing written, to wait for the page before it (the gate, and the
    /// version it waits for) without holding a connection; then tried again.
    WaitForPage(Arc<dyn crate::PositionGate>, i64),
}

/// Sizes for capacity planning, from [`PostgresStore::footprint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// Rows in the ledger (each key is in one or more generations).
    pub ledger_rows: i64,
    /// Bytes of the ledger's partitions, indexes included.
    pub ledger_bytes: i64,
    /// The server's WAL position, bytes: the difference of two readings is the WAL written.
    pub wal_position: i64,
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[async_trait]
impl LedgerStore for PostgresStore {
    async fn commit(&self, batch: CommitBatch) -> Result<CommitOutcome, StoreError> {
        loop {
            match self.commit_once(&batch).await? {
                Committed::Done(outcome) => return Ok(outcome),
                Committed::WaitForPage(gate, version) => {
                    // The connection went back to the pool with the rolled-back transaction:
                    // the page before this one may need it to commit.
                    if !gate.wait(version).await {
                        return Err(StoreError::Moved);
                    }
                }
            }
        }
    }

    /// Half the pool: commits overlap their round trips and the server's fsyncs, and the
    /// other half of the pool stays free for the other flows and for coordination.
    fn commit_concurrency(&self) -> usize {
        (self.options.pool_size / 2).max(1)
    }

    async fn keys_present(
        &self,
        flow: &FlowHandle,
        table: &str,
        keys: &[String],
    ) -> Result<Vec<bool>, StoreError> {
        let (client, _) = self.ready().await?;
        flows::keys_present(&client, flow, table, keys).await
    }

    async fn commit_recorded(
        &self,
        flow: &FlowHandle,
        commit_id: &str,
    ) -> Result<bool, StoreError> {
        let (mut client, _) = self.ready().await?;
        flows::commit_recorded(&mut client, flow, commit_id).await
    }

    async fn flow_progress(&self, flow: &FlowHandle) -> Result<FlowProgress, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT COALESCE(sum(committed), 0)::int8, COALESCE(sum(duplicates), 0)::int8,
                        COALESCE(sum(dead_lettered), 0)::int8, COALESCE(sum(batches), 0)::int8
                 FROM sluice_flow_counters WHERE flow_id = $1",
                &[&flow.id],
            )
            .await?;
        let get = |i: usize| -> Result<u64, StoreError> {
            Ok(u64::try_from(row.try_get::<_, i64>(i)?).unwrap_or_default())
        };
        Ok(FlowProgress {
            committed: get(0)?,
            duplicates: get(1)?,
            dead_lettered: get(2)?,
            batches: get(3)?,
        })
    }

    async fn ledger_upkeep(&self) -> Result<LedgerUpkeep, StoreError> {
        let (mut client, width) = self.ready().await?;
        let generations_created =
            ledger::create_ahead(&mut client, width, self.horizon_ms()).await?;
        let generations_dropped = ledger::drop_expired(&mut client, width).await?;
        // Workers that stopped beating a day ago are history.
        client
            .execute(
                "DELETE FROM sluice_workers WHERE last_beat < now() - interval '1 day'",
                &[],
            )
            .await?;
        Ok(LedgerUpkeep {
            keys_removed: 0,
            generations_created,
            generations_dropped,
        })
    }
}

#[async_trait]
impl FlowStore for PostgresStore {
    async fn prepare(&self, layout: &Layout) -> Result<Vec<FlowHandle>, StoreError> {
        let (mut client, width) = self.ready().await?;
        let mut ddl = schema::dead_letter_ddl(&layout.pipeline)?;
        for target in &layout.tables {
            if target == "dead_letter" {
                return Err(StoreError::Config(
                    "a table target may not be named dead_letter".to_owned(),
                ));
            }
            ddl.push_str(&schema::target_ddl(&table_name(&layout.pipeline, target)?));
        }
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&schema::DDL_LOCK])
            .await?;
        tx.batch_execute(&ddl).await?;
        for target in &layout.tables {
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
        ledger::create_ahead(&mut client, width, self.horizon_ms()).await?;
        self.server_clock.measure(&client).await?;
        Ok(handles)
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
        flows::reset_flow(&mut client, flow, table, rows, claim).await
    }

    async fn read_rows(
        &self,
        table: &str,
        after: Option<&RowCursor>,
        limit: usize,
    ) -> Result<Vec<StoredRow>, StoreError> {
        let client = self.client().await?;
        flows::read_rows(&client, table, after, limit).await
    }
}

#[async_trait]
impl FeedStore for PostgresStore {
    async fn read_position(
        &self,
        flow: &FlowHandle,
        table: &str,
    ) -> Result<ReadPosition, StoreError> {
        let (client, _) = self.ready().await?;
        feed::read_position(&client, flow, table).await
    }

    async fn plan_range(
        &self,
        flow: &FlowHandle,
        table: &str,
        at: &ReadPosition,
    ) -> Result<ReadPosition, StoreError> {
        let (client, _) = self.ready().await?;
        feed::plan_range(&client, flow, table, at).await
    }

    async fn read_range(
        &self,
        table: &str,
        at: &ReadPosition,
        limit: usize,
    ) -> Result<Vec<FeedRow>, StoreError> {
        let (client, _) = self.ready().await?;
        feed::read_range(&client, table, at, limit).await
    }

    async fn feed_lag(&self, table: &str, at: &ReadPosition) -> Result<FeedLag, StoreError> {
        let (client, _) = self.ready().await?;
        feed::feed_lag(&client, table, at).await
    }

    async fn file_checkpoint(
        &self,
        flow: &FlowHandle,
    ) -> Result<Option<FileCheckpoint>, StoreError> {
        let (client, _) = self.ready().await?;
        feed::file_checkpoint(&client, flow).await
    }

    async fn save_file_checkpoint(
        &self,
        flow: &FlowHandle,
        at: &FileCheckpoint,
    ) -> Result<(), StoreError> {
        let (client, _) = self.ready().await?;
        feed::save_file_checkpoint(&client, flow, at).await
    }
}

#[async_trait]
impl OutboxStore for PostgresStore {
    async fn take_outbox(
        &self,
        pipeline: &str,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<OutboxLetter>, StoreError> {
        let (client, _) = self.ready().await?;
        outbox::take(&client, pipeline, limit, max_bytes).await
    }

    async fn outbox_published(&self, pipeline: &str, ids: &[i64]) -> Result<(), StoreError> {
        let (client, _) = self.ready().await?;
        outbox::published(&client, pipeline, ids).await
    }

    async fn outbox_refused(&self, pipeline: &str, id: i64, why: &str) -> Result<(), StoreError> {
        let (client, _) = self.ready().await?;
        outbox::refused(&client, pipeline, id, why).await
    }

    async fn outbox_census(&self, pipeline: &str) -> Result<OutboxCensus, StoreError> {
        let (client, _) = self.ready().await?;
        outbox::census(&client, pipeline).await
    }
}

#[async_trait]
impl RunStore for PostgresStore {
    async fn begin_run(&self, run: &RunStart) -> Result<RunRecord, StoreError> {
        let (mut client, _) = self.ready().await?;
        runs::begin_run(&mut client, run).await
    }

    async fn end_run(&self, run_id: i64, worker: &str, end: &RunEnd) -> Result<bool, StoreError> {
        let (client, _) = self.ready().await?;
        runs::end_run(&client, run_id, worker, end).await
    }

    async fn runs(&self, pipeline: &str, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        let (client, _) = self.ready().await?;
        runs::runs(&client, pipeline, limit).await
    }

    async fn last_fire(&self, pipeline: &str) -> Result<Option<i64>, StoreError> {
        let (client, _) = self.ready().await?;
        runs::last_fire(&client, pipeline).await
    }
}

#[async_trait]
impl ProgressStore for PostgresStore {
    async fn add_bucket_messages(
        &self,
        flow: &FlowHandle,
        messages: &[BucketMessage],
    ) -> Result<(), StoreError> {
        if messages.is_empty() {
            return Ok(());
        }
        let (client, _) = self.ready().await?;
        progress::add_bucket_messages(&client, flow, messages).await
    }

    async fn bucket_counts(
        &self,
        flow: &FlowHandle,
        from_ms: i64,
    ) -> Result<Vec<BucketCounts>, StoreError> {
        let (client, _) = self.ready().await?;
        progress::bucket_counts(&client, flow, from_ms).await
    }

    async fn prune_buckets(&self, flow: &FlowHandle, before_ms: i64) -> Result<u64, StoreError> {
        let (client, _) = self.ready().await?;
        progress::prune_buckets(&client, flow, before_ms).await
    }

    async fn advance_watermark(
        &self,
        flow: &FlowHandle,
        offer: &WatermarkRecord,
        fenced_by: Option<&str>,
    ) -> Result<Option<WatermarkRecord>, StoreError> {
        let (client, _) = self.ready().await?;
        progress::advance_watermark(&client, flow, offer, fenced_by).await
    }

    async fn watermarks(
        &self,
        pipeline: &str,
    ) -> Result<Vec<(String, WatermarkRecord)>, StoreError> {
        let (client, _) = self.ready().await?;
        progress::watermarks(&client, pipeline).await
    }
}

#[async_trait]
impl WindowStore for PostgresStore {
    async fn prepare_window_table(&self, windows_table: &str) -> Result<(), StoreError> {
        let (mut client, _) = self.ready().await?;
        windows::prepare_window_table(&mut client, windows_table).await
    }

    async fn emit_windows(
        &self,
        flow: &FlowHandle,
        emission: &WindowEmission,
    ) -> Result<WindowsEmitted, StoreError> {
        let (mut client, _) = self.ready().await?;
        windows::emit_windows(&mut client, flow, emission).await
    }
}

#[cfg(feature = "testing")]
#[async_trait]
impl Inspect for PostgresStore {
    async fn count_rows(&self, table: &str, flow: Option<&str>) -> Result<u64, StoreError> {
        crate::schema::check_table(table)?;
        let client = self.client().await?;
        let count: i64 = match flow {
            Some(flow) => client
                .query_one(
                    &format!("SELECT count(*) FROM \"{table}\" WHERE flow = $1"),
                    &[&flow],
                )
                .await?
                .try_get(0)?,
            None => client
                .query_one(&format!("SELECT count(*) FROM \"{table}\""), &[])
                .await?
                .try_get(0)?,
        };
        Ok(u64::try_from(count).unwrap_or_default())
    }

    async fn key_census(&self, table: &str) -> Result<(u64, u64), StoreError> {
        crate::schema::check_table(table)?;
        let client = self.client().await?;
        let row = client
            .query_one(
                &format!(
                    "SELECT count(*), count(*) FILTER (WHERE n > 1) FROM
                     (SELECT count(*) AS n FROM \"{table}\" GROUP BY flow, dedup_key) AS keys"
                ),
                &[],
            )
            .await?;
        let (distinct, repeated): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
        Ok((
            u64::try_from(distinct).unwrap_or_default(),
            u64::try_from(repeated).unwrap_or_default(),
        ))
    }
}
