//! The moment a commit counts from: when its transaction commits, not when it began.
//!
//! # Why
//!
//! A commit whose transaction runs long (a library handler waiting for a lock, a sink's file
//! written in it, a table page waiting for the page before it) must still keep the two promises
//! of the commit bound (the engine's `flow/commit_bound.rs`): a delivery older than its
//! deadline is never committed, and a committed key is remembered for the whole window from the
//! moment it committed. Checked only when the transaction began, a transaction longer than the
//! window could commit a copy whose twin another replica took over meanwhile (the other replica
//! found the key expired, since its expiry was stamped at the start).
//!
//! # What the stores do
//!
//! Just before a transaction with work in it commits, the store *seals* it: on its own clock
//! (PostgreSQL: `clock_timestamp()`, the server's; SQLite: the host's), it refuses the whole
//! transaction if the batch's [`crate::CommitBatch::commit_by_ms`] has passed
//! ([`crate::StoreError::Stale`]: rolled back, the messages given back), and, if the
//! transaction has lasted more than [`RESTAMP_AFTER_MS`], moves the expiry of the keys it won
//! to the window from now. A one-statement commit (PostgreSQL's plain batches) checks its
//! deadline when the statement starts and runs for milliseconds; a transaction shorter than
//! [`RESTAMP_AFTER_MS`] keeps the expiry stamped at its start.
//!
//! # What it does not cover
//!
//! The window of a key committed by a transaction that lasted less than [`RESTAMP_AFTER_MS`]
//! is shorter by that transaction's length, at most [`RESTAMP_AFTER_MS`].

/// A transaction that lasted longer than this gets its keys' expiry stamped again, from its
/// end (see the module docs). Below it, the restamp would cost more than the window it gives
/// back.
pub const RESTAMP_AFTER_MS: i64 = 1_000;
