//! The SQLite backend: one writer thread owns the connection; callers talk to it over a bounded
//! channel, so commits are serialised without locks held across `.await`.
//!
//! Several processes may share one database file (WAL mode, `BEGIN IMMEDIATE`, a busy timeout):
//! the ledger's primary key still decides duplicates across them.

mod commit;
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
mod windows;

#[cfg(feature = "testing")]
use crate::Inspect;
use crate::local_clock::now_ms;
use crate::{
    BucketCounts, BucketMessage, ClearClaim, CommitBatch, CommitOutcome, FeedLag, FeedRow,
    FeedStore, FileCheckpoint, FlowHandle, FlowProgress, FlowStore, Layout, LedgerStore,
    LedgerUpkeep, OutboxCensus, OutboxLetter, OutboxStore, ProgressStore, ReadPosition, ResetRows,
    RowCursor, RunEnd, RunRecord, RunStart, RunStore, StoreError, StoredRow, WatermarkRecord,
    WindowEmission, WindowStore, WindowsEmitted,
};
use async_trait::async_trait;
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, sync_channel};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Requests queued for the writer thread; callers wait when it is this far behind.
const COMMAND_QUEUE: usize = 64;
/// How long a writer waits for another process's write lock before reporting the store busy.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the writer purges expired ledger keys when it has them.
const PURGE_INTERVAL: Duration = Duration::from_secs(1);
/// Expired keys deleted per purge step: small enough that a commit waits at most a few ms.
/// Steps repeat while they come back full and no command waits, so purging keeps up with any
/// rate the writer can commit.
const PURGE_CHUNK: usize = 5_000;

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

enum Command {
    Prepare(Layout, Reply<Vec<FlowHandle>>),
    Commit(Box<CommitBatch>, Reply<CommitOutcome>),
    FlowProgress(i64, Reply<FlowProgress>),
    /// Anything else that needs the connection (coordination, upkeep): rare, so boxed.
    Call(Box<dyn FnOnce(&mut Connection) + Send>),
}

/// The embedded store: a single SQLite file, created with its folder on first use.
pub struct SqliteStore {
    commands: SyncSender<Command>,
    path: PathBuf,
}

impl SqliteStore {
    /// Opens (or creates) the database at `path` and starts its writer thread.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                StoreError::Unavailable(format!("cannot create {}: {e}", dir.display()))
            })?;
        }
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // FULL: the WAL is synced at every commit, so a batch whose messages were acked survives
        // an operating-system crash too, not only a process crash. One fsync per batch.
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.execute_batch(schema::STATE_DDL)?;
        schema::upgrade_outbox(&mut conn)?;
        let (commands, receiver) = sync_channel(COMMAND_QUEUE);
        std::thread::Builder::new()
            .name("sluice-sqlite-writer".to_owned())
            .spawn(move || Writer { conn }.run(receiver))
            .map_err(|e| StoreError::Unavailable(format!("cannot start writer thread: {e}")))?;
        Ok(Self {
            commands,
            path: path.to_owned(),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `work` on the writer thread and returns its result.
    async fn call<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.ask(move |reply| {
            Command::Call(Box::new(move |conn| {
                // The caller may have gone away; then nobody wants the answer.
                let _ = reply.send(work(conn));
            }))
        })
        .await
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        let commands = self.commands.clone();
        let command = make(reply);
        // The queue is bounded: a full queue blocks, so send from the blocking pool.
        tokio::task::spawn_blocking(move || commands.send(command))
            .await
            .map_err(|_| StoreError::Closed)?
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

#[async_trait]
impl LedgerStore for SqliteStore {
    async fn commit(&self, batch: CommitBatch) -> Result<CommitOutcome, StoreError> {
        self.ask(|reply| Command::Commit(Box::new(batch), reply))
            .await
    }

    async fn keys_present(
        &self,
        flow: &FlowHandle,
        table: &str,
        keys: &[String],
    ) -> Result<Vec<bool>, StoreError> {
        let (flow, table, keys) = (flow.clone(), table.to_owned(), keys.to_vec());
        self.call(move |conn| flows::keys_present(conn, &flow, &table, &keys))
            .await
    }

    async fn commit_recorded(
        &self,
        flow: &FlowHandle,
        commit_id: &str,
    ) -> Result<bool, StoreError> {
        let (flow, id) = (flow.clone(), commit_id.to_owned());
        self.call(move |conn| flows::commit_recorded(conn, &flow, &id))
            .await
    }

    async fn flow_progress(&self, flow: &FlowHandle) -> Result<FlowProgress, StoreError> {
        let id = flow.id;
        self.ask(|reply| Command::FlowProgress(id, reply)).await
    }

    async fn ledger_upkeep(&self) -> Result<LedgerUpkeep, StoreError> {
        // One chunk per call: the writer purges by itself between commits, so a large backlog
        // is never removed in one go that would hold the writer.
        self.call(|conn| {
            Ok(LedgerUpkeep {
                keys_removed: ledger::purge(conn, now_ms(), PURGE_CHUNK)? as u64,
                ..LedgerUpkeep::default()
            })
        })
        .await
    }
}

#[async_trait]
impl FlowStore for SqliteStore {
    async fn prepare(&self, layout: &Layout) -> Result<Vec<FlowHandle>, StoreError> {
        let layout = layout.clone();
        self.ask(|reply| Command::Prepare(layout, reply)).await
    }

    async fn record_completion(&self, flow: &FlowHandle) -> Result<(), StoreError> {
        let id = flow.id;
        self.call(move |conn| flows::record_completion(conn, id, now_ms()))
            .await
    }

    async fn completions(&self, pipeline: &str) -> Result<Vec<(String, i64)>, StoreError> {
        let pipeline = pipeline.to_owned();
        self.call(move |conn| flows::completions(conn, &pipeline))
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
        self.call(move |conn| {
            flows::reset_flow(conn, &flow, table.as_deref(), rows, claim.as_ref())
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
        self.call(move |conn| flows::read_rows(conn, &table, after.as_ref(), limit))
            .await
    }
}

#[async_trait]
impl FeedStore for SqliteStore {
    async fn read_position(
        &self,
        flow: &FlowHandle,
        table: &str,
    ) -> Result<ReadPosition, StoreError> {
        let (flow, table) = (flow.clone(), table.to_owned());
        self.call(move |conn| feed::read_position(conn, &flow, &table))
            .await
    }

    async fn plan_range(
        &self,
        flow: &FlowHandle,
        table: &str,
        at: &ReadPosition,
    ) -> Result<ReadPosition, StoreError> {
        let (flow, table, at) = (flow.clone(), table.to_owned(), at.clone());
        self.call(move |conn| feed::plan_range(conn, &flow, &table, &at))
            .await
    }

    async fn read_range(
        &self,
        table: &str,
        at: &ReadPosition,
        limit: usize,
    ) -> Result<Vec<FeedRow>, StoreError> {
        let (table, at) = (table.to_owned(), at.clone());
        self.call(move |conn| feed::read_range(conn, &table, &at, limit))
            .await
    }

    async fn feed_lag(&self, table: &str, at: &ReadPosition) -> Result<FeedLag, StoreError> {
        let (table, at) = (table.to_owned(), at.clone());
        self.call(move |conn| feed::feed_lag(conn, &table, &at))
            .await
    }

    async fn file_checkpoint(
        &self,
        flow: &FlowHandle,
    ) -> Result<Option<FileCheckpoint>, StoreError> {
        let flow = flow.clone();
        self.call(move |conn| feed::file_checkpoint(conn, &flow))
            .await
    }

    async fn save_file_checkpoint(
        &self,
        flow: &FlowHandle,
        at: &FileCheckpoint,
    ) -> Result<(), StoreError> {
        let (flow, at) = (flow.clone(), at.clone());
        self.call(move |conn| feed::save_file_checkpoint(conn, &flow, &at))
            .await
    }
}

#[async_trait]
impl ProgressStore for SqliteStore {
    async fn add_bucket_messages(
        &self,
        flow: &FlowHandle,
        messages: &[BucketMessage],
    ) -> Result<(), StoreError> {
        if messages.is_empty() {
            return Ok(());
        }
        let (flow, messages) = (flow.clone(), messages.to_vec());
        self.call(move |conn| progress::add_bucket_messages(conn, &flow, &messages))
            .await
    }

    async fn bucket_counts(
        &self,
        flow: &FlowHandle,
        from_ms: i64,
    ) -> Result<Vec<BucketCounts>, StoreError> {
        let flow = flow.clone();
        self.call(move |conn| progress::bucket_counts(conn, &flow, from_ms))
            .await
    }

    async fn prune_buckets(&self, flow: &FlowHandle, before_ms: i64) -> Result<u64, StoreError> {
        let flow = flow.clone();
        self.call(move |conn| progress::prune_buckets(conn, &flow, before_ms))
            .await
    }

    async fn advance_watermark(
        &self,
        flow: &FlowHandle,
        offer: &WatermarkRecord,
        fenced_by: Option<&str>,
    ) -> Result<Option<WatermarkRecord>, StoreError> {
        let (flow, offer, fence) = (flow.clone(), *offer, fenced_by.map(str::to_owned));
        self.call(move |conn| {
            progress::advance_watermark(conn, &flow, &offer, fence.as_deref(), now_ms())
        })
        .await
    }

    async fn watermarks(
        &self,
        pipeline: &str,
    ) -> Result<Vec<(String, WatermarkRecord)>, StoreError> {
        let pipeline = pipeline.to_owned();
        self.call(move |conn| progress::watermarks(conn, &pipeline))
            .await
    }
}

#[async_trait]
impl OutboxStore for SqliteStore {
    async fn take_outbox(
        &self,
        pipeline: &str,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<OutboxLetter>, StoreError> {
        let pipeline = pipeline.to_owned();
        self.call(move |conn| outbox::take(conn, &pipeline, limit, max_bytes))
            .await
    }

    async fn outbox_published(&self, pipeline: &str, ids: &[i64]) -> Result<(), StoreError> {
        let (pipeline, ids) = (pipeline.to_owned(), ids.to_vec());
        self.call(move |conn| outbox::published(conn, &pipeline, &ids))
            .await
    }

    async fn outbox_refused(&self, pipeline: &str, id: i64, why: &str) -> Result<(), StoreError> {
        let (pipeline, why) = (pipeline.to_owned(), why.to_owned());
        self.call(move |conn| outbox::refused(conn, &pipeline, id, &why))
            .await
    }

    async fn outbox_census(&self, pipeline: &str) -> Result<OutboxCensus, StoreError> {
        let pipeline = pipeline.to_owned();
        self.call(move |conn| outbox::census(conn, &pipeline)).await
    }
}

#[async_trait]
impl RunStore for SqliteStore {
    async fn begin_run(&self, run: &RunStart) -> Result<RunRecord, StoreError> {
        let run = run.clone();
        self.call(move |conn| runs::begin_run(conn, &run, now_ms()))
            .await
    }

    async fn end_run(&self, run_id: i64, worker: &str, end: &RunEnd) -> Result<bool, StoreError> {
        let (worker, end) = (worker.to_owned(), end.clone());
        self.call(move |conn| runs::end_run(conn, run_id, &worker, &end, now_ms()))
            .await
    }

    async fn runs(&self, pipeline: &str, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        let pipeline = pipeline.to_owned();
        self.call(move |conn| runs::runs(conn, &pipeline, limit))
            .await
    }

    async fn last_fire(&self, pipeline: &str) -> Result<Option<i64>, StoreError> {
        let pipeline = pipeline.to_owned();
        self.call(move |conn| runs::last_fire(conn, &pipeline))
            .await
    }
}

#[async_trait]
impl WindowStore for SqliteStore {
    async fn prepare_window_table(&self, windows_table: &str) -> Result<(), StoreError> {
        let windows_table = windows_table.to_owned();
        self.call(move |conn| windows::prepare_window_table(conn, &windows_table))
            .await
    }

    async fn emit_windows(
        &self,
        flow: &FlowHandle,
        emission: &WindowEmission,
    ) -> Result<WindowsEmitted, StoreError> {
        let (flow, emission) = (flow.clone(), emission.clone());
        self.call(move |conn| windows::emit_windows(conn, &flow, &emission, now_ms()))
            .await
    }
}

#[cfg(feature = "testing")]
#[async_trait]
impl Inspect for SqliteStore {
    async fn count_rows(&self, table: &str, flow: Option<&str>) -> Result<u64, StoreError> {
        let (table, flow) = (table.to_owned(), flow.map(str::to_owned));
        self.call(move |conn| flows::count_rows(conn, &table, flow.as_deref()))
            .await
    }

    async fn key_census(&self, table: &str) -> Result<(u64, u64), StoreError> {
        let table = table.to_owned();
        self.call(move |conn| flows::key_census(conn, &table)).await
    }
}

struct Writer {
    conn: Connection,
}

impl Writer {
    fn run(mut self, commands: Receiver<Command>) {
        let mut last_purge = Instant::now();
        loop {
            match commands.recv_timeout(PURGE_INTERVAL) {
                Ok(command) => self.handle(command),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            if last_purge.elapsed() < PURGE_INTERVAL {
                continue;
            }
            last_purge = Instant::now();
            loop {
                match ledger::purge(&self.conn, now_ms(), PURGE_CHUNK) {
                    Ok(deleted) if deleted == PURGE_CHUNK => {}
                    Ok(_) => break,
                    Err(error) => {
                        tracing::debug!(%error, "ledger purge step failed; retried later");
                        break;
                    }
                }
                // Commits come first: stop purging as soon as one waits.
                match commands.try_recv() {
                    Ok(command) => {
                        self.handle(command);
                        break;
                    }
                    Err(TryRecvError::Empty) => {}
                    Err(TryRecvError::Disconnected) => return,
                }
            }
        }
    }

    fn handle(&mut self, command: Command) {
        // A caller that went away no longer wants the answer; ignoring the send error is right.
        match command {
            Command::Prepare(layout, reply) => {
                let _ = reply.send(self.prepare(&layout));
            }
            Command::Commit(batch, reply) => {
                let _ = reply.send(self.commit(&batch));
            }
            Command::FlowProgress(id, reply) => {
                let _ = reply.send(self.flow_progress(id));
            }
            Command::Call(work) => work(&mut self.conn),
        }
    }

    fn prepare(&mut self, layout: &Layout) -> Result<Vec<FlowHandle>, StoreError> {
        schema::prepare(&mut self.conn, layout)
    }

    fn commit(&mut self, batch: &CommitBatch) -> Result<CommitOutcome, StoreError> {
        commit::commit(&mut self.conn, batch)
    }

    fn flow_progress(&mut self, id: i64) -> Result<FlowProgress, StoreError> {
        flows::flow_progress(&self.conn, id)
    }
}
