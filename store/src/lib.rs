//! Durable state of sluice: target tables, the dedup ledger, dead letters, flow progress and
//! completion, and the coordination of a worker pool.
//!
//! # Guarantees
//!
//! [`LedgerStore::commit`] applies one [`CommitBatch`] in **one transaction**: for each entry it inserts
//! the entry's dedup key into the ledger of its flow; only if the key was not there (or had
//! expired) does it write the entry's target row or dead-letter row. Flow progress is updated in
//! the same transaction. So for every key at most one effect is ever committed per flow within
//! the dedup window, whichever worker, process or restart commits it, as long as they share the
//! store. When `commit` returns `Ok`, the transaction is durable (SQLite in WAL mode with
//! `synchronous = FULL`; PostgreSQL with `synchronous_commit = on`, set for sluice's sessions
//! whatever the server's default), and only then are its messages acked.
//!
//! # Backends
//!
//! - [`SqliteStore`], the embedded default, created on first use. Several processes may share
//!   one file on one host (the ledger's primary key decides duplicates across them); expired
//!   ledger keys are purged in small chunks between commits.
//! - [`PostgresStore`], the shared store of a pool of replicas on any number of hosts: one
//!   statement per commit, a ledger partitioned by time and expired by dropping partitions,
//!   decisions on the database server's clock. Not a shared SQLite file on a network volume.
//!
//! The same contract tests run against both (`store/tests/*_contract.rs`, one file per role).
//!
//! # Pool coordination
//!
//! Replicas find each other through the store, with no other service: heartbeats
//! ([`MembershipStore::heartbeat`], [`MembershipStore::workers`]), leases for roles that must have one holder
//! ([`MembershipStore::acquire_lease`]; at most one holder at a time, moved when the holder stops renewing;
//! see [`LeaseRequest`]), and once-flow completion ([`FlowStore::record_completion`]) that every
//! replica reads at start.

mod changes;
mod commit_time;
mod drain;
mod error;
mod feed;
mod local_clock;
mod model;
mod outbox;
mod pool;
mod pool_updates;
mod postgres;
mod progress;
mod roles;
mod runs;
mod schema;
mod sqlite;
#[cfg(feature = "testing")]
pub mod testing;
mod typed;
mod url;
mod views;
mod windows;
mod work;

pub use changes::ChangeRule;
pub use commit_time::RESTAMP_AFTER_MS;
pub use drain::{DrainCensus, DrainReport};
pub use error::StoreError;
pub use feed::{
    FILE_SOURCE, FeedLag, FeedRow, FileCheckpoint, PositionAdvance, PositionGate, RangeCursor,
    ReadPosition,
};
pub use model::{
    CommitBatch, CommitHook, CommitOutcome, Effect, Entry, FlowHandle, FlowProgress, Layout,
    MessageFields, ResetRows, RowCursor, StoredRow,
};
pub use outbox::{OutboxCensus, OutboxLetter};
pub use pool::{LeaseGrant, LeaseRecord, LeaseRequest, LedgerUpkeep, WorkerBeat, WorkerRecord};
pub use pool_updates::{ClearClaim, PoolUpdate, PoolUpdateState};
/// Throwaway PostgreSQL databases, for tests and `sluice bench` (the `scratch` feature).
#[cfg(feature = "scratch")]
pub use postgres::{DEFAULT_SCRATCH_SERVER, SCRATCH_SERVER_VAR, ScratchDatabase};
pub use postgres::{Footprint, PostgresOptions, PostgresStore};
pub use progress::{
    BucketCounts, BucketMessage, ExpectationCount, MessageReport, PROGRESS_BUCKET_MS,
    WatermarkRecord,
};
#[cfg(feature = "testing")]
pub use roles::Inspect;
pub use roles::{
    DrainStore, FeedStore, FlowStore, LedgerStore, MembershipStore, OutboxStore, PoolUpdateStore,
    ProgressStore, RunStore, Store, WindowStore,
};
pub use runs::{RunEnd, RunRecord, RunStart, RunState, RunTrigger};
pub use schema::{
    RESET_CLEARS, RESET_CLEARS_APART, RESET_KEEPS, is_identifier, table_name, window_table_name,
};
pub use sqlite::SqliteStore;
pub use typed::{
    ColumnType, Sql, TypedColumn, TypedQuery, TypedTable, TypedValue, expectation_column,
};
pub use url::{StoreUrl, open, open_existing};
pub use views::TypedView;
pub use windows::{
    WindowAggregate, WindowEmission, WindowFunction, WindowGroup, WindowRows, WindowsEmitted,
};
pub use work::{PostgresWork, SqliteWork, TransactionWork, WorkError};
