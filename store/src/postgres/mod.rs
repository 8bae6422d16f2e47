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
mod commit_order;
mod connect;
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
#[cfg(feature = "scratch")]
mod scratch;
mod typed;
mod typed_checks;
mod typed_feed;
mod typed_rows;
mod windows;

pub use connect::PostgresOptions;
#[cfg(feature = "scratch")]
pub use scratch::{DEFAULT_SCRATCH_SERVER, SCRATCH_SERVER_VAR, ScratchDatabase};

#[cfg(feature = "testing")]
use crate::Inspect;
use crate::StoreError;
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
    /// The largest dedup window seen in a commit, ms, also recorded in the database for the
    /// upkeep holder: generations are created that far ahead (plus a margin). Zero until the
    /// first commit, which creates what its window needs.
    largest_window_ms: AtomicI64,
    /// `url` without its password, for messages.
    display: String,
    /// The server's clock against ours, for commit deadlines.
    server_clock: clock::ServerClock,
    /// What the feed reads each table through (`typed_feed.rs`), by table: read from the
    /// catalog once per table, again after a prepare (which may add columns).
    feed_relations: std::sync::Mutex<std::collections::HashMap<String, Arc<str>>>,
    /// Whether a connection was had once: then a refused login or a missing database is an
    /// outage (a password being rotated, a database being restored) to wait out, not a
    /// misconfiguration to stop on.
    connected: std::sync::atomic::AtomicBool,
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
            feed_relations: std::sync::Mutex::default(),
            connected: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The URL, password redacted.
    pub fn display_url(&self) -> &str {
        &self.display
    }

    /// Whether the database holds a sluice store (its migrations table), without creating
    /// anything.
    pub async fn holds_a_store(&self) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one("SELECT to_regclass('sluice_migrations') IS NOT NULL", &[])
            .await?;
        Ok(row.try_get(0)?)
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

    /// A connection from the pool; an error getting one names the server (the URL, password
    /// redacted). A login refused or a database missing (`error.rs`) is a misconfiguration
    /// until a connection was had, and an outage after.
    async fn client(&self) -> Result<Client, StoreError> {
        match self.pool.get().await {
            Ok(client) => {
                self.connected.store(true, Ordering::Relaxed);
                Ok(client)
            }
            Err(error) => Err(match StoreError::from(error) {
                StoreError::Unavailable(why) => {
                    StoreError::Unavailable(format!("{why} (store {})", self.display))
                }
                StoreError::Config(why)
                    if self.connected.load(Ordering::Relaxed) && error::refused_login(&why) =>
                {
                    StoreError::Unavailable(format!("{why} (store {})", self.display))
                }
                StoreError::Config(why) => {
                    StoreError::Config(format!("{why} (store {})", self.display))
                }
                other => other,
            }),
        }
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

    /// What the feed reads `table` through, from the cache or the catalog.
    async fn feed_relation(&self, client: &Client, table: &str) -> Result<Arc<str>, StoreError> {
        let cached = self
            .feed_relations
            .lock()
            .map_err(|_| StoreError::Config("the feed relations' lock is poisoned".into()))?
            .get(table)
            .cloned();
        if let Some(relation) = cached {
            return Ok(relation);
        }
        // A table not created yet is read as itself, and not remembered.
        let Some(relation) = typed_feed::relation(client, table).await? else {
            return Ok(Arc::from(format!("\"{table}\"")));
        };
        let relation: Arc<str> = Arc::from(relation);
        if let Ok(mut relations) = self.feed_relations.lock() {
            relations.insert(table.to_owned(), relation.clone());
        }
        Ok(relation)
    }

    /// Forgets the feed relations read so far (a prepare may have changed a table's columns).
    fn forget_feed_relations(&self) {
        if let Ok(mut relations) = self.feed_relations.lock() {
            relations.clear();
        }
    }

    /// The largest dedup window this replica has committed with, ms.
    fn largest_window_ms(&self) -> i64 {
        self.largest_window_ms.load(Ordering::Relaxed)
    }
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

#[cfg(feature = "testing")]
#[async_trait::async_trait]
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

    async fn tables_with_column(&self, column: &str) -> Result<Vec<String>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT c.relname::text FROM pg_class c
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                 JOIN pg_attribute a ON a.attrelid = c.oid AND NOT a.attisdropped
                 WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
                   AND NOT c.relispartition AND a.attname = $1
                   AND c.relname LIKE 'sluice\\_%'
                 ORDER BY c.relname",
                &[&column],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()?)
    }
}
