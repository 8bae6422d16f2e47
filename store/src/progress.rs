//! What the store keeps for event-time watermarks: per publish-time bucket, how many messages
//! of a flow the tracking subscription saw (and their smallest event time) and how many the
//! flow's workers processed; and each flow's current watermark.
//!
//! Counts are added, never set, so any number of workers (and one tracking reader) report into
//! the same bucket without coordination; a bucket's smallest event time merges by minimum. A
//! watermark record only moves forward: [`crate::Store::advance_watermark`] keeps the larger of
//! the stored and the offered value for each field, so two holders of the watermark role for a
//! moment, or a restarted one with an older view, can never move it back.

/// Width of a publish-time bucket, ms: workers and the tracking reader count in the same
/// buckets.
pub const PROGRESS_BUCKET_MS: i64 = 1_000;

/// One publish-time bucket of a flow, as reported (an increment) or as stored (the totals).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BucketCounts {
    /// Start of the bucket: publish time in ms since epoch, a multiple of the bucket width.
    pub bucket_ms: i64,
    /// Messages the tracking subscription delivered in this bucket.
    pub tracked: u64,
    /// Messages the flow's workers settled in this bucket: committed, dead-lettered or found
    /// a duplicate.
    pub processed: u64,
    /// The smallest event time among the tracked messages (`None`: none tracked).
    pub min_event_ms: Option<i64>,
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
