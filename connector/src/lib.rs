//! # Exactly once into your own tables
//!
//! `sluice-connector` reads a Google Cloud Pub/Sub subscription and hands each batch's *new*
//! messages (copies already settled are dropped, by message id or by an attribute, over a
//! window) to your handler together with the open transaction of your store. You write what the
//! messages do — an upsert, a counter, a row in your own schema — and return; sluice adds the
//! messages' dedup keys to that same transaction, commits it, and only then acks the messages.
//! So your writes happen exactly once per message within the dedup window, across crashes,
//! redeliveries, publisher retries and every replica sharing the store. No other Pub/Sub
//! connector puts your own effect into the transaction that decides duplicates.
//!
//! ## In ten lines
//!
//! ```no_run
//! use sluice_connector::prelude::*;
//!
//! # async fn job() -> Result<(), JobError> {
//! let job = Job::builder("projects/my-project/subscriptions/orders")
//!     .name("order_counts")
//!     .dedup(Dedup::by_attribute("order_id"))
//!     .store("sqlite://state/orders.db")
//!     .build()
//!     .await?;
//! job.run_sqlite(|tx: &rusqlite::Transaction<'_>, batch: &NewMessages<'_>| {
//!     for order in batch.iter() {
//!         tx.execute(
//!             "INSERT INTO per_region (region, n) VALUES (?1, 1)
//!              ON CONFLICT (region) DO UPDATE SET n = n + 1",
//!             [order.attribute("region").unwrap_or("")],
//!         )?;
//!     }
//!     Ok(())
//! })
//! .await?;
//! # Ok(()) }
//! ```
//!
//! ## The lifecycle of a job
//!
//! 1. [`Job::builder`] takes the subscription and the settings, each defaulting to what
//!    `sluice run` gives a Pub/Sub flow ([`defaults`]); [`JobBuilder::build`] opens the store
//!    (`sqlite://PATH` or `postgres://...`) and creates the job's ledger and dead-letter table
//!    there, under the job's name.
//! 2. [`Job::run_postgres`] / [`Job::run_sqlite`] pull the subscription over several
//!    streaming-pull streams, within the flow-control bounds, and form batches:
//!
//!    ```text
//!    received ──► keyed ──► admitted (memory tier) ──► batched ──► handler + keys ──► committed ──► acked
//!                                │                                                       │
//!                                ├─ in flight elsewhere: parked ─────────────────────────┴─► acked with its original
//!                                └─ committed recently: acked at once (a duplicate)
//!    ```
//!
//!    The handler sees each message at most once per commit attempt, only if its key is new to
//!    the ledger; a failed attempt rolls back all of it.
//! 3. Cancelling [`Job::stop_token`] drains the job: nothing more is pulled, what was received
//!    is committed and acked, and the run returns a [`JobReport`].
//!
//! [`Job::stream`] is the same with you in the loop: take a [`JobBatch`], look at it (its
//! [`JobBatch::watermark`], event times, attributes), then commit it with your writes
//! ([`JobBatch::commit_with_postgres`], [`JobBatch::commit_with_sqlite`]) or, when its effect
//! lives in another system, write there first with [`JobBatch::id`] as the idempotency key and
//! [`JobBatch::settle`] it.
//!
//! ## Guarantees
//!
//! * **Ack after commit.** A message is acked only after the transaction holding your writes
//!   and its dedup key committed. Until then the client keeps extending its lease.
//! * **Exactly once within the dedup window.** Your writes for a key are committed at most once
//!   within the window, on every replica sharing the store: the ledger's primary key decides,
//!   in your transaction. The memory tier only reports keys the store decided already.
//! * **Never past the window.** A delivery held longer than the window minus a margin (a
//!   fifth of it, at most a minute) is given back uncommitted, so a process paused past the
//!   window cannot commit a copy whose twin the ledger has forgotten.
//! * **Failures.** A handler error rolls the transaction back. [`HandlerError::transient`] (and
//!   an unreachable store) is retried with backoff for as long as it takes, nothing acked; any
//!   other error finds the message at fault (a batch of several is retried one by one), which
//!   after `max_attempts` goes to `<name>__dead_letter` with your error, then is acked.
//! * **Bounded memory.** At most the flow-control bounds are held between receipt and ack.
//!
//! ## Three complete jobs
//!
//! Each is in `examples/` and run by the project's tests against the Pub/Sub emulator.
//!
//! An upsert into your own PostgreSQL table (`examples/upsert_postgres.rs`), a count of events
//! per customer that a duplicate applied twice would show:
//!
//! ```no_run
//! use sluice_connector::prelude::*;
//!
//! struct CountPerCustomer;
//!
//! #[async_trait::async_trait]
//! impl PostgresHandler for CountPerCustomer {
//!     async fn handle(
//!         &self,
//!         tx: &tokio_postgres::Transaction<'_>,
//!         batch: &NewMessages<'_>,
//!     ) -> Result<(), HandlerError> {
//!         // One statement for the batch: its events counted per customer, then added.
//!         let mut per_customer = std::collections::BTreeMap::<&str, i64>::new();
//!         for event in batch.iter() {
//!             *per_customer
//!                 .entry(event.attribute("customer").unwrap_or("unknown"))
//!                 .or_default() += 1;
//!         }
//!         let (customers, counts): (Vec<&str>, Vec<i64>) = per_customer.into_iter().unzip();
//!         tx.execute(
//!             "INSERT INTO customer_events (customer, events)
//!              SELECT * FROM unnest($1::text[], $2::int8[])
//!              ON CONFLICT (customer) DO UPDATE SET events = customer_events.events + excluded.events",
//!             &[&customers, &counts],
//!         )
//!         .await?;
//!         Ok(())
//!     }
//! }
//!
//! # async fn job() -> Result<(), JobError> {
//! let job = Job::builder("projects/my-project/subscriptions/events")
//!     .name("customer_events")
//!     .dedup(Dedup::by_attribute("event_id"))
//!     .store("postgres://postgres@127.0.0.1/jobs")
//!     .build()
//!     .await?;
//! job.run_postgres(CountPerCustomer).await?;
//! # Ok(()) }
//! ```
//!
//! A per-key counter in SQLite (`examples/counter_sqlite.rs`): a closure is a handler.
//!
//! ```no_run
//! use sluice_connector::prelude::*;
//!
//! # async fn job() -> Result<(), JobError> {
//! let job = Job::builder("projects/my-project/subscriptions/events")
//!     .name("region_counts")
//!     .store("sqlite://state/counter.db")
//!     .build()
//!     .await?;
//! let report = job
//!     .run_sqlite(|tx: &rusqlite::Transaction<'_>, batch: &NewMessages<'_>| {
//!         for message in batch.iter() {
//!             tx.execute(
//!                 "INSERT INTO region_counts (region, n) VALUES (?1, 1)
//!                  ON CONFLICT (region) DO UPDATE SET n = n + 1",
//!                 [message.attribute("region").unwrap_or("")],
//!             )?;
//!         }
//!         Ok(())
//!     })
//!     .await?;
//! println!("{} messages counted", report.rows);
//! # Ok(()) }
//! ```
//!
//! Forwarding to another system with the batch id as its idempotency key
//! (`examples/forward.rs`): the batch is written there first, then settled. Each message
//! reaches that system at least once (a batch handed out again after a crash may be grouped
//! otherwise, under another id), so it should also drop repeats of a message's key.
//!
//! ```no_run
//! use sluice_connector::prelude::*;
//!
//! # async fn job() -> Result<(), JobError> {
//! let job = Job::builder("projects/my-project/subscriptions/events")
//!     .name("forward")
//!     .store("sqlite://state/forward.db")
//!     .build()
//!     .await?;
//! let mut stream = job.stream().await?;
//! while let Some(batch) = stream.next_batch().await {
//!     let body: Vec<u8> = batch.messages().flat_map(|m| m.data().to_vec()).collect();
//!     // The same messages batched together again carry the same id: the same file.
//!     std::fs::write(format!("out/{}.bin", batch.id()), body).ok();
//!     batch.settle().await;
//! }
//! stream.close().await;
//! # Ok(()) }
//! ```
//!
//! ## Below the front door
//!
//! The parts the front door and the `sluice` worker are made of (sources, the batcher with its
//! memory tier, stages, the committer, a flow's run, the watermark tracker) are the crate
//! `sluice-engine`, shared with the worker. They follow the binary, not this crate's semantic
//! version: build jobs on [`Job`].

mod job;

pub use job::{
    Dedup, HandlerError, Job, JobBatch, JobBuilder, JobError, JobReport, JobStream, Message,
    NewMessages, PostgresHandler, SqliteHandler, postgres_handler,
};
/// The SQLite driver a [`SqliteHandler`] is given a transaction of (the same version).
pub use rusqlite;
/// The defaults a job takes for what it is not told: those of a pipeline file's Pub/Sub source
/// (`sluice run`).
///
/// ```
/// use sluice_connector::defaults;
/// assert_eq!(defaults::DEDUP_WINDOW, std::time::Duration::from_secs(600));
/// assert_eq!(defaults::MAX_ATTEMPTS, 5);
/// ```
pub use sluice_engine::defaults;
pub use sluice_engine::{CommitReport, FlowError, PubSubConfig, SourceError};
/// Why the store refused or failed ([`JobError::Store`]).
pub use sluice_store::StoreError;
/// The PostgreSQL driver a [`PostgresHandler`] is given a transaction of (the same version).
pub use tokio_postgres;

/// What a job needs, in one import: `use sluice_connector::prelude::*;`.
pub mod prelude {
    pub use crate::job::{
        Dedup, HandlerError, Job, JobBatch, JobError, JobReport, JobStream, Message, NewMessages,
        PostgresHandler, SqliteHandler, postgres_handler,
    };
    pub use crate::{rusqlite, tokio_postgres};
    /// The attribute a [`PostgresHandler`] implementation carries.
    pub use async_trait::async_trait;
    pub use sluice_engine::PubSubConfig;
    /// What [`Job::stop_token`] gives.
    pub use tokio_util::sync::CancellationToken;
}
