//! The defaults of a flow's settings: what the library's `Job::builder` gives a job it is not
//! told otherwise, and what the pipeline file gives a Pub/Sub flow (its own defaults are
//! checked equal to these by the worker's tests), and file and table flows, which have no
//! `pubsub:` section to take them from.
//!
//! ```
//! use sluice_engine::defaults;
//! assert_eq!(defaults::DEDUP_WINDOW, std::time::Duration::from_secs(600));
//! assert_eq!(defaults::MAX_ATTEMPTS, 5);
//! ```

use std::time::Duration;

/// Dedup window.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(600);
/// Messages per batch, at most.
pub const BATCH_MAX_MESSAGES: usize = 1000;
/// How long a batch waits to fill.
pub const BATCH_MAX_DELAY: Duration = Duration::from_millis(50);
/// Messages held between receipt and ack, at most.
pub const MAX_OUTSTANDING_MESSAGES: usize = 10_000;
/// Bytes held between receipt and ack, at most (100 MiB).
pub const MAX_OUTSTANDING_BYTES: u64 = 100 * 1024 * 1024;
/// Attempts before a failing message is dead-lettered.
pub const MAX_ATTEMPTS: u32 = 5;
/// Streaming-pull streams.
pub const STREAMS: usize = 16;
/// How long a drain waits for the store before it gives up and nacks what is left.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(15);
/// How often a running job keeps its dedup ledger small.
pub const LEDGER_UPKEEP: Duration = Duration::from_secs(5);
