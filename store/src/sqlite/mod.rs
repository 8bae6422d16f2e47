//! The SQLite backend: one writer thread owns the connection; callers talk to it over a bounded
//! channel, so commits are serialised without locks held across `.await`.
//!
//! Several processes may share one database file (WAL mode, `BEGIN IMMEDIATE`, a busy timeout):
//! the ledger's primary key still decides duplicates across them.

mod casts;
mod commit;
mod error;
mod expectation_counts;
mod feed;
mod flows;
mod interval_rows;
mod ledger;
mod outbox;
mod pool;
mod pool_updates;
mod progress;
mod runs;
mod schema;
mod typed;
mod typed_changes;
mod typed_feed;
mod windows;

#[cfg(feature = "testing")]
use crate::Inspect;
use crate::local_clock::now_ms;
use crate::{CommitBatch, CommitOutcome, FlowHandle, FlowProgress, Layout, StoreError};
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
        casts::register(&conn)?;
        typed_feed::register(&conn)?;
        // `LIKE` as PostgreSQL's: case-sensitive (a typed flow's expressions).
        conn.pragma_update(None, "case_sensitive_like", true)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // FULL: the WAL is synced at every commit, so a batch whose messages were acked survives
        // an operating-system crash too, not only a process crash. One fsync per batch.
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.execute_batch(schema::STATE_DDL)?;
        schema::upgrade_outbox(&mut conn)?;
        schema::upgrade_workers(&mut conn)?;
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

#[cfg(feature = "testing")]
#[async_trait::async_trait]
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

    async fn tables_with_column(&self, column: &str) -> Result<Vec<String>, StoreError> {
        let column = column.to_owned();
        self.call(move |conn| {
            let mut statement = conn.prepare(
                "SELECT m.name FROM sqlite_master m, pragma_table_info(m.name) c
                 WHERE m.type = 'table' AND m.name LIKE 'sluice\\_%' ESCAPE '\\'
                   AND c.name = ?1
                 ORDER BY m.name",
            )?;
            let names = statement.query_map([&column], |row| row.get(0))?;
            Ok(names.collect::<Result<Vec<String>, _>>()?)
        })
        .await
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
