//! The store's roles, one trait each: committing against the ledger, a pipeline's flows,
//! tables read as feeds, the pool's coordination, watermark progress, windows and the runs of
//! a triggered pipeline. [`Store`] is all of them (every
//! backend implements each); a caller takes the narrowest role it needs (`&dyn MembershipStore`,
//! `Arc<dyn LedgerStore>`), and an `Arc<dyn Store>` coerces to any of them.

use crate::{
    BucketCounts, BucketMessage, ClearClaim, CommitBatch, CommitOutcome, DrainCensus, FeedLag,
    FeedRow, FileCheckpoint, FlowHandle, FlowProgress, Layout, LeaseGrant, LeaseRecord,
    LeaseRequest, LedgerUpkeep, OutboxCensus, OutboxLetter, PoolUpdate, ReadPosition, ResetRows,
    RowCursor, RunEnd, RunRecord, RunStart, StoreError, StoredRow, WatermarkRecord, WindowEmission,
    WindowsEmitted, WorkerBeat, WorkerRecord,
};
use async_trait::async_trait;

/// Committing batches against the dedup ledger, and what the ledger can tell: the role of
/// every flow's committer and of bounded sources that skip what they wrote.
#[async_trait]
pub trait LedgerStore: Send + Sync + 'static {
    /// Commits one batch in one transaction; see the crate docs. The outcome lists, per entry
    /// and in order, whether its effect was written (`true`) or it was a duplicate (`false`).
    async fn commit(&self, batch: CommitBatch) -> Result<CommitOutcome, StoreError>;

    /// For a typed batch, per entry and per expectation of its query (in order), whether the
    /// entry's row violates it: its check is false (NULL passes, as in a SQL `CHECK`). Reads
    /// only, outside any commit. An entry that is not a row, or that the query's `where:`
    /// leaves out, gets no verdict (an empty list): it is no output row. A check that
    /// fails on a record is that record's [`StoreError::Record`], its column
    /// [`crate::expectation_column`]. A store that cannot evaluate expectations refuses a
    /// batch that has some.
    async fn violations(&self, batch: &CommitBatch) -> Result<Vec<Vec<bool>>, StoreError> {
        match &batch.typed {
            Some(query) if !query.expectations.is_empty() => Err(StoreError::Config(
                "this store does not evaluate expectations".to_owned(),
            )),
            _ => Ok(vec![Vec::new(); batch.entries.len()]),
        }
    }

    /// How many commits of one flow this store takes at once to advantage: SQLite has one
    /// writer (1); a server store overlaps round trips and fsyncs (several).
    fn commit_concurrency(&self) -> usize {
        1
    }

    /// For each of `keys`, whether `flow` has already committed an effect for it that is still
    /// in the store: a row in `table` or a dead letter. Unlike the ledger this has no window,
    /// so a bounded source (a file backfill) that is re-read after a crash skips what it wrote
    /// before, however long ago.
    async fn keys_present(
        &self,
        flow: &FlowHandle,
        table: &str,
        keys: &[String],
    ) -> Result<Vec<bool>, StoreError>;

    /// Whether a commit with this hook id ([`crate::CommitHook::id`]) of `flow` was committed.
    async fn commit_recorded(&self, flow: &FlowHandle, commit_id: &str)
    -> Result<bool, StoreError>;

    /// Committed, duplicate and dead-lettered counts of a flow.
    async fn flow_progress(&self, flow: &FlowHandle) -> Result<FlowProgress, StoreError>;

    /// The expectation counts of a typed flow (see [`CommitBatch::verdicts`]), by name; empty
    /// for a flow with none or a store that keeps none.
    async fn expectation_counts(
        &self,
        _flow: &FlowHandle,
    ) -> Result<Vec<crate::ExpectationCount>, StoreError> {
        Ok(Vec::new())
    }

    /// Keeps the dedup ledger small: SQLite deletes one chunk of expired keys (its writer also
    /// purges by itself between commits); PostgreSQL creates the next ledger generations ahead of time and
    /// drops whole generations no window can still need. Safe to call from several replicas at
    /// once; in a pool one replica does it, under the `ledger_upkeep` lease.
    async fn ledger_upkeep(&self) -> Result<LedgerUpkeep, StoreError>;
}

/// A pipeline's flows in the store: preparing their tables, their completion, resetting
/// them, and reading a target table page by page.
#[async_trait]
pub trait FlowStore: Send + Sync + 'static {
    /// Creates what `layout` needs (migrations, target tables, flow rows) if missing and returns
    /// one handle per flow, in `layout.flows` order. Idempotent.
    async fn prepare(&self, layout: &Layout) -> Result<Vec<FlowHandle>, StoreError>;

    /// Records that `flow`, a once flow, has drained its source completely. Every replica
    /// sharing the store sees it (see [`FlowStore::completions`]); recording twice is harmless.
    async fn record_completion(&self, flow: &FlowHandle) -> Result<(), StoreError>;

    /// The flows of `pipeline` recorded complete, with when (ms since epoch, store clock), in
    /// flow-name order. A restarted or newly started replica skips these once flows.
    async fn completions(&self, pipeline: &str) -> Result<Vec<(String, i64)>, StoreError>;

    /// Forgets what `flow` has done, in one transaction: its ledger keys, counters, completion,
    /// sink commit marks, watermark buckets, watermark and window emission mark (the next
    /// emission replaces the flow's count rows with counts of the rows it has then; see the
    /// `windows` module docs), and those of its rows in `table` (the full name of its target
    /// table, if it has one) and of its dead letters that `rows` says. Records its source gives
    /// again are then written once again; rows it cannot give again stay. Handles of the flow
    /// taken before are stale afterwards (PostgreSQL gives the flow a new id when every row
    /// goes, leaving its old ledger keys to expire with their partitions): prepare again. Callers make sure no
    /// worker is running the flow meanwhile (its memory tier would still remember keys). With
    /// `claim`, the reset happens only if that clearer still holds that pool update's claim
    /// (checked in the reset's transaction; `StoreError::ClaimLost` otherwise).
    async fn reset_flow(
        &self,
        flow: &FlowHandle,
        table: Option<&str>,
        rows: ResetRows,
        claim: Option<&ClearClaim>,
    ) -> Result<(), StoreError>;

    /// Deletes the rows `flow` wrote into `table` (a full table name) whose event time lies in
    /// `[from_ms, to_ms)`, and their ledger keys, in one transaction; returns how many rows
    /// went. A rerun of that interval (`sluice backfill --rerun`) then writes its records
    /// again. Dead letters, counters and the rest of the flow's state stay.
    async fn clear_interval(
        &self,
        flow: &FlowHandle,
        table: &str,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<u64, StoreError>;

    /// Creates `views` (each dropped first if it exists), in one transaction. A store that has
    /// no views refuses any.
    async fn create_views(&self, views: &[crate::TypedView]) -> Result<(), StoreError> {
        match views.first() {
            None => Ok(()),
            Some(view) => Err(StoreError::Config(format!(
                "this store cannot create view {}",
                view.name
            ))),
        }
    }

    /// Up to `limit` rows of `table` (a full target table name) after `after`, in the order
    /// `(flow, dedup_key, message_id)`: a `table` source pages through a target with it. Rows
    /// committed meanwhile appear if they sort after the cursor.
    async fn read_rows(
        &self,
        table: &str,
        after: Option<&RowCursor>,
        limit: usize,
    ) -> Result<Vec<StoredRow>, StoreError>;
}

/// The pool's members and leases: heartbeats, who is alive, and the leases that give one
/// worker a role at a time (ledger upkeep, a feed's reader, the scheduler, the tracker).
#[async_trait]
pub trait MembershipStore: Send + Sync + 'static {
    /// Records that `beat.worker` is alive (first call registers it).
    async fn heartbeat(&self, beat: &WorkerBeat) -> Result<(), StoreError>;

    /// Removes `worker` from the pool's list at a clean stop (a dead worker drops out of
    /// [`MembershipStore::workers`] when its heartbeats stop).
    async fn leave(&self, pipeline: &str, worker: &str) -> Result<(), StoreError>;

    /// Workers of `pipeline` heard of within `within` (by the store's clock).
    async fn workers(
        &self,
        pipeline: &str,
        within: std::time::Duration,
    ) -> Result<Vec<WorkerRecord>, StoreError>;

    /// Takes or renews a lease in one atomic step: granted only if it is free, expired or
    /// already `request.holder`'s, so it has at most one holder at any instant of the store's
    /// clock (see the [crate docs](crate#pool-coordination)).
    async fn acquire_lease(&self, request: &LeaseRequest) -> Result<LeaseGrant, StoreError>;

    /// Gives a lease up at once if `holder` holds it (a clean shutdown hands the role over
    /// without waiting for expiry).
    async fn release_lease(
        &self,
        pipeline: &str,
        role: &str,
        holder: &str,
    ) -> Result<(), StoreError>;

    /// The leases of `pipeline`, expired ones included.
    async fn leases(&self, pipeline: &str) -> Result<Vec<LeaseRecord>, StoreError>;
}

/// Pool updates: a reset or refresh asked of every replica, drained by each, cleared once by
/// the holder of its claim (see the `pool_updates` module docs).
#[async_trait]
pub trait PoolUpdateStore: Send + Sync + 'static {
    /// Records a request to update every replica of `pipeline` (see the `pool_updates` module
    /// docs); returns its number.
    async fn request_pool_update(
        &self,
        pipeline: &str,
        request: &str,
        requested_by: &str,
    ) -> Result<i64, StoreError>;

    /// Pool update `id` of `pipeline`; with no id, the oldest that has not ended.
    async fn pool_update(
        &self,
        pipeline: &str,
        id: Option<i64>,
    ) -> Result<Option<PoolUpdate>, StoreError>;

    /// The newest pool update of `pipeline`, ended or not.
    async fn latest_pool_update(&self, pipeline: &str) -> Result<Option<PoolUpdate>, StoreError>;

    /// Records that `worker` has stopped its flows for update `id`.
    async fn drained_for_pool_update(
        &self,
        pipeline: &str,
        id: i64,
        worker: &str,
    ) -> Result<(), StoreError>;

    /// Claims the clearing of update `id` for `worker`: `true` if it was pending, already
    /// `worker`'s, or claimed longer than `stale_after` ago; `false` otherwise.
    async fn claim_pool_update(
        &self,
        pipeline: &str,
        id: i64,
        worker: &str,
        stale_after: std::time::Duration,
    ) -> Result<bool, StoreError>;

    /// Ends update `id` (`done` or failed) with `message`, if `clearer` holds its claim;
    /// `false` otherwise (it has ended, or another took the claim over).
    async fn finish_pool_update(
        &self,
        pipeline: &str,
        id: i64,
        clearer: &str,
        done: bool,
        message: &str,
    ) -> Result<bool, StoreError>;
}

/// The drain reports of once flows: each reader's part, so that a flow drains only when every
/// replica reading it agrees (the worker's drain quorum).
#[async_trait]
pub trait DrainStore: Send + Sync + 'static {
    /// Records this worker's part in draining the once flow `flow` (see [`crate::DrainReport`]):
    /// reading (`drained: false`) or found its source empty holding nothing (`true`).
    async fn report_drain(
        &self,
        flow: &FlowHandle,
        worker: &str,
        drained: bool,
    ) -> Result<(), StoreError>;

    /// Removes this worker's drain report (it stopped cleanly, holding nothing).
    async fn withdraw_drain(&self, flow: &FlowHandle, worker: &str) -> Result<(), StoreError>;

    /// Every reader's drain report on `flow`, with its latest heartbeat, on the store's clock.
    async fn drain_census(&self, flow: &FlowHandle) -> Result<DrainCensus, StoreError>;
}

/// What the store keeps for event-time watermarks: per-bucket message reports and each
/// flow's forward-only watermark record.
#[async_trait]
pub trait ProgressStore: Send + Sync + 'static {
    /// Records `messages` toward `flow`'s watermark, in one transaction, once per message id
    /// and bucket: a message reported tracked (or settled) again, as a redelivery is, changes
    /// nothing. Reports of one message from the tracking reader and from the workers combine.
    async fn add_bucket_messages(
        &self,
        flow: &FlowHandle,
        messages: &[BucketMessage],
    ) -> Result<(), StoreError>;

    /// `flow`'s buckets starting at or after `from_ms` that hold a tracked message, in bucket
    /// order: how many distinct messages were tracked, how many of those were settled, and
    /// their smallest event time (see [`BucketCounts`]).
    async fn bucket_counts(
        &self,
        flow: &FlowHandle,
        from_ms: i64,
    ) -> Result<Vec<BucketCounts>, StoreError>;

    /// Forgets `flow`'s buckets starting before `before_ms`; returns how many message reports
    /// went.
    async fn prune_buckets(&self, flow: &FlowHandle, before_ms: i64) -> Result<u64, StoreError>;

    /// Moves `flow`'s watermark record forward: each field becomes the larger of the stored
    /// and the offered value (a first call stores the offer). Returns the record now stored.
    ///
    /// Fenced by `fenced_by` (a worker id): the offer is taken only if that worker holds the
    /// lease `watermark/<flow>` of the flow's pipeline, unexpired on the store's clock, checked
    /// in the same statement; otherwise nothing is written and `None` is returned. A tracking
    /// reader that lost its lease (paused past its expiry, say) can therefore never move the
    /// watermark on the strength of a stream another reader now shares. `None`: unfenced.
    async fn advance_watermark(
        &self,
        flow: &FlowHandle,
        offer: &WatermarkRecord,
        fenced_by: Option<&str>,
    ) -> Result<Option<WatermarkRecord>, StoreError>;

    /// The watermark records of `pipeline`'s flows that have one, in flow-name order.
    async fn watermarks(
        &self,
        pipeline: &str,
    ) -> Result<Vec<(String, WatermarkRecord)>, StoreError>;
}

/// `window` targets: counts tables and the emission of a flow's windows.
#[async_trait]
pub trait WindowStore: Send + Sync + 'static {
    /// Creates a `window` target's counts table if missing: `(window_start, window_end,
    /// group_key, count, emitted_at)`, primary key `(window_start, window_end, group_key)`;
    /// brings a counts table and marks of an older version up to date (rows kept). Idempotent;
    /// called before [`WindowStore::emit_windows`] into that table.
    async fn prepare_window_table(&self, windows_table: &str) -> Result<(), StoreError>;

    /// Emits `flow`'s windows that end at or before `emission.before_ms` and were not emitted
    /// yet, in one transaction (see [`WindowEmission`] and the `windows` module docs): counts
    /// per window and group of the base table's rows (`flow`'s, or all of them, as
    /// `emission.rows` says), and the flow's emission mark moved to the end of the last window
    /// emitted, recorded with the window size. Without a mark of this size (the first
    /// emission, the first after a reset or a size change) it first deletes the table's count
    /// rows of this size and starts at the window of the oldest row counted.
    async fn emit_windows(
        &self,
        flow: &FlowHandle,
        emission: &WindowEmission,
    ) -> Result<WindowsEmitted, StoreError>;
}

/// Target tables read as feeds by the flows downstream of them (see the `feed` module docs):
/// positions, planned ranges and pages.
#[async_trait]
pub trait FeedStore: Send + Sync + 'static {
    /// `flow`'s position in `table` (a full target table name); version 0 when none is
    /// recorded.
    async fn read_position(
        &self,
        flow: &FlowHandle,
        table: &str,
    ) -> Result<ReadPosition, StoreError>;

    /// Starts `flow`'s next range of `table`: from the end of `at`'s range (the beginning at
    /// version 0) to the table's commits now, with nothing of it committed. Refused with
    /// [`StoreError::Moved`] unless the stored position is still `at`'s version. Call it only
    /// once everything of `at`'s range is committed. Returns the position stored.
    async fn plan_range(
        &self,
        flow: &FlowHandle,
        table: &str,
        at: &ReadPosition,
    ) -> Result<ReadPosition, StoreError>;

    /// Up to `limit` rows of `at`'s range after `at.after`, in the range's order. The same
    /// position and limit always give the same rows.
    async fn read_range(
        &self,
        table: &str,
        at: &ReadPosition,
        limit: usize,
    ) -> Result<Vec<FeedRow>, StoreError>;

    /// The committed rows of `table` after `at` (in its range or after it).
    async fn feed_lag(&self, table: &str, at: &ReadPosition) -> Result<FeedLag, StoreError>;

    /// `flow`'s file checkpoint, if one was saved since its last reset.
    async fn file_checkpoint(
        &self,
        flow: &FlowHandle,
    ) -> Result<Option<FileCheckpoint>, StoreError>;

    /// Saves `flow`'s file checkpoint, replacing the one saved before.
    async fn save_file_checkpoint(
        &self,
        flow: &FlowHandle,
        at: &FileCheckpoint,
    ) -> Result<(), StoreError>;
}

/// The dead-letter outbox (see the `outbox` module docs): the role of the publisher of a
/// pipeline's `dead_letter.topic`.
#[async_trait]
pub trait OutboxStore: Send + Sync + 'static {
    /// Letters of `pipeline` waiting to be published, oldest first: at most `limit`, and no
    /// more once `max_bytes` of payload are reached (the first one always). The same
    /// statement counts a publish of each (before it happens), so a successor of a publisher
    /// that died knows which letters it may have published.
    async fn take_outbox(
        &self,
        pipeline: &str,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<OutboxLetter>, StoreError>;

    /// Marks letters Pub/Sub confirmed as published: taken no more, their message dropped,
    /// their record kept (the same record dead-lettered again owes no second letter).
    async fn outbox_published(&self, pipeline: &str, ids: &[i64]) -> Result<(), StoreError>;

    /// Keeps a letter the topic can never take, with the reason, and takes it no more.
    async fn outbox_refused(&self, pipeline: &str, id: i64, why: &str) -> Result<(), StoreError>;

    /// How many letters wait and how many were refused.
    async fn outbox_census(&self, pipeline: &str) -> Result<OutboxCensus, StoreError>;
}

/// The runs of a triggered pipeline (`sluice_runs`; see the `runs` module docs): the role of
/// the scheduler, `sluice runs` and `sluice status`.
#[async_trait]
pub trait RunStore: Send + Sync + 'static {
    /// Records that `run` starts now, running, and returns it. A fire recorded already
    /// (`run.trigger.is_fire()`, the same `fire_ms`) is not recorded again: a run of it that has
    /// not ended is handed to `run.worker` (its runner died or stopped) and returned, one that
    /// ended is returned as it is, and the caller does not run it again. While another
    /// worker's run (of another fire, or not a fire) is running and that worker is alive
    /// ([`RunStart::alive_within`]), nothing is recorded and that run is returned: the caller
    /// sees its `worker` is not `run.worker` and waits.
    async fn begin_run(&self, run: &RunStart) -> Result<RunRecord, StoreError>;

    /// Records how run `run_id` ended, with the store's clock, if it is still running and
    /// `worker` runs it; `false` otherwise (another replica took it over, or it ended): an
    /// ended run is never rewritten.
    async fn end_run(&self, run_id: i64, worker: &str, end: &RunEnd) -> Result<bool, StoreError>;

    /// The newest `limit` runs of `pipeline`, newest first.
    async fn runs(&self, pipeline: &str, limit: usize) -> Result<Vec<RunRecord>, StoreError>;

    /// The latest fire of `pipeline`'s schedule recorded (`schedule` or `catchup` runs).
    async fn last_fire(&self, pipeline: &str) -> Result<Option<i64>, StoreError>;
}

#[cfg(feature = "testing")]
/// Counting what a table holds, for tests (the `testing` feature).
#[async_trait]
pub trait Inspect: Send + Sync + 'static {
    /// Rows of a target table committed by `flow` (all flows when `None`).
    async fn count_rows(&self, table: &str, flow: Option<&str>) -> Result<u64, StoreError>;

    /// Distinct dedup keys in a target table and the number of keys that appear more than once.
    async fn key_census(&self, table: &str) -> Result<(u64, u64), StoreError>;

    /// The store's own tables (`sluice_*`; not a partitioned table's partitions) that have a
    /// column named `column`, sorted.
    async fn tables_with_column(&self, column: &str) -> Result<Vec<String>, StoreError>;
}

/// The durable store behind every flow: every role. Implementations are shared by all flows
/// of a worker (`Arc<dyn Store>`).
pub trait Store:
    LedgerStore
    + FlowStore
    + FeedStore
    + MembershipStore
    + PoolUpdateStore
    + DrainStore
    + ProgressStore
    + WindowStore
    + RunStore
    + OutboxStore
{
}

impl<T> Store for T where
    T: LedgerStore
        + FlowStore
        + FeedStore
        + MembershipStore
        + PoolUpdateStore
        + DrainStore
        + ProgressStore
        + WindowStore
        + RunStore
        + OutboxStore
        + ?Sized
{
}
