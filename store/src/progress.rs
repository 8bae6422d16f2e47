//! What the store keeps for event-time watermarks: per publish-time bucket, the messages of a
//! flow the tracking subscription saw (with their event times) and those the flow's workers
//! settled, by message id; and each flow's current watermark.
//!
//! Reports are kept once per message id and bucket, with a flag for each side, so any number
//! of workers (and one tracking reader) report into the same bucket without coordination, and
//! a redelivery, reported again, changes nothing: a bucket counts as processed exactly when
//! every message the tracking subscription saw in it was settled.
//!
//! A watermark record only moves forward: [`crate::ProgressStore::advance_watermark`] keeps the larger
//! of the stored and the offered value for each field, so two holders of the watermark role
//! for a moment, or a restarted one with an older view, can never move it back.

/// Width of a publish-time bucket, ms: workers and the tracking reader count in the same
/// buckets.
pub const PROGRESS_BUCKET_MS: i64 = 1_000;

/// The start of the first bucket that holds no message published before `ms`.
pub(crate) fn first_whole_bucket_from(ms: i64) -> i64 {
    ms.div_euclid(PROGRESS_BUCKET_MS)
        .saturating_add(i64::from(ms.rem_euclid(PROGRESS_BUCKET_MS) != 0))
        .saturating_mul(PROGRESS_BUCKET_MS)
}

/// One publish-time bucket of a flow, as stored (see [`crate::ProgressStore::bucket_counts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BucketCounts {
    /// Start of the bucket: publish time in ms since epoch, a multiple of the bucket width.
    pub bucket_ms: i64,
    /// Distinct messages the tracking subscription delivered in this bucket.
    pub tracked: u64,
    /// Those of them the flow's workers settled: committed, dead-lettered or found a
    /// duplicate. A settled message the tracking subscription has not delivered (yet) is not
    /// counted.
    pub processed: u64,
    /// The smallest event time among the tracked messages (`None`: none with one).
    pub min_event_ms: Option<i64>,
}

/// What a report says of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageReport {
    /// The tracking subscription delivered it, with the event time the flow's stage will give
    /// it (`None`: one the flow will dead-letter, which never becomes a row).
    Tracked {
        /// Event time, ms since epoch.
        event_ms: Option<i64>,
    },
    /// A worker of the flow settled it: committed, dead-lettered or found a duplicate.
    Settled,
}

/// One message reported toward its flow's watermark, in its publish-time bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketMessage {
    /// Start of its publish-time bucket (a multiple of [`PROGRESS_BUCKET_MS`]).
    pub bucket_ms: i64,
    /// Its Pub/Sub message id.
    pub message_id: String,
    /// What is reported.
    pub report: MessageReport,
}

/// A flow's watermark as the store keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WatermarkRecord {
    /// The event-time watermark, ms since epoch.
    pub watermark_ms: i64,
    /// The tracking reader's horizon: every message published before it had been tracked.
    pub horizon_ms: i64,
    /// When it was last advanced, ms since epoch (the writer's clock).
    pub updated_at_ms: i64,
}

/// One expectation of a typed flow: its records, counted once each when committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectationCount {
    /// The expectation's name.
    pub expectation: String,
    /// Records that met it.
    pub passed: u64,
    /// Records that violated it.
    pub violated: u64,
}
