//! The front door for custom streaming jobs: [`Job::builder`], then a handler that writes into
//! your own tables inside the transaction that records the batch's dedup keys
//! ([`Job::run_postgres`], [`Job::run_sqlite`]), or batches you pull and commit yourself
//! ([`Job::stream`]). See the crate docs for the tutorial and complete examples.
//!
//! # Guarantees
//!
//! * **Your rows, exactly once.** A batch's new messages reach the handler with the store's open
//!   transaction; sluice adds their dedup keys and the batch's dead letters to that same
//!   transaction, commits it, and only then acks the messages. A crash anywhere before the
//!   commit leaves none of your writes and none of the keys; after it, the redelivered copies
//!   are duplicates your handler never sees. Within the dedup window (default 10 minutes), for
//!   every replica sharing the store.
//! * **The worker's behaviour.** The same committer as `sluice run`: a handler error rolls the
//!   transaction back and is retried with backoff; a batch of several is split to find the
//!   message at fault, which is dead-lettered (`<name>__dead_letter`, with the handler's error)
//!   after `max_attempts`; a transient error or an unreachable store is retried for as long as
//!   it takes, leases extended, nothing acked; a stop drains: nothing more is pulled, what was
//!   received is committed and acked.
//! * **Bounded memory**: at most the flow-control bounds are held between receipt and ack.
//!
//! The settings are `builder.rs` (with `dedup.rs`), the job and its runs `run.rs`, its errors
//! `error.rs`; a handler and what it sees are `handler.rs`, `message.rs` and `handler_error.rs`;
//! batches pulled one by one are `stream.rs`.

mod builder;
mod dedup;
mod error;
mod handler;
mod handler_error;
mod message;
mod run;
mod stream;

pub use builder::JobBuilder;
pub use dedup::Dedup;
pub use error::JobError;
pub use handler::{PostgresHandler, SqliteHandler, postgres_handler};
pub use handler_error::HandlerError;
pub use message::{Message, NewMessages};
pub use run::{Job, JobReport};
pub use stream::{JobBatch, JobStream};
