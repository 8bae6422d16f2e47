//! The file's defaults for a flow's source settings and a schedule, in one place: what a Pub/Sub
//! flow gets for a key the file leaves out, and what the worker gives a file or table flow,
//! which has no `pubsub:` section to take them from.

use std::time::Duration;

/// Default `dedup.window`.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(600);
/// Default `watermark.band`.
pub const WATERMARK_BAND: Duration = Duration::from_secs(10);
/// Default `drain_idle`.
pub const DRAIN_IDLE: Duration = Duration::from_secs(5);
/// Default `batch.max_delay`.
pub const BATCH_MAX_DELAY: Duration = Duration::from_millis(50);
/// Default `batch.max_messages`.
pub const BATCH_MAX_MESSAGES: usize = 1000;
/// Default `flow_control.max_outstanding_messages`.
pub const MAX_OUTSTANDING_MESSAGES: usize = 10_000;
/// Default `flow_control.max_outstanding_bytes` (100 MiB).
pub const MAX_OUTSTANDING_BYTES: u64 = 100 * 1024 * 1024;
/// Default `max_attempts`.
pub const MAX_ATTEMPTS: u32 = 5;
/// Default `streams`.
pub const STREAMS: usize = 16;
/// The most `streams` a flow may open.
pub const MAX_STREAMS: i64 = 64;
/// Default `source.file.max_record_bytes`: Pub/Sub's limit for one message (10 MB), so that a
/// file record is no larger than a record of a Pub/Sub flow.
pub const FILE_MAX_RECORD_BYTES: u64 = 10_000_000;
/// The largest `source.file.max_record_bytes`: 1 GB, the most either store keeps in one value
/// (PostgreSQL's limit for a field; SQLite's default `SQLITE_MAX_LENGTH`).
pub const FILE_MAX_RECORD_BYTES_CEILING: u64 = 1_000_000_000;
/// Default `give_up_after`: how long a triggered run waits for an unreachable store or
/// Pub/Sub before it fails.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(300);
/// Default `schedule.retry_delay`: how long a failed run waits before it runs again (Airflow's
/// default `retry_delay`).
pub const SCHEDULE_RETRY_DELAY: Duration = Duration::from_secs(300);
/// Default `schedule.timezone`.
pub const SCHEDULE_TIMEZONE: &str = "UTC";
/// Default `schedule.min_interval`: runs fired by updates of a table start at most this often.
pub const SCHEDULE_MIN_INTERVAL: Duration = Duration::from_secs(60);
