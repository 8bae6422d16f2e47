//! Which watermark buckets are processed, and the alert for one left unprocessed behind
//! processed ones.
//!
//! A bucket is processed when every message tracked in it was settled. The watermark holds at
//! the first one that is not, however long it waits (a timed release could skip messages still
//! committing); [`StallWatch`] only shows and logs how long the oldest such bucket has waited.

use sluice_store::{BucketCounts, FlowHandle};
use std::collections::HashMap;
use std::time::Duration;

/// An unprocessed bucket behind processed ones that waits this long is logged as stalled (it is
/// never released: see `tracking.rs`).
pub const STALL_ALERT: Duration = Duration::from_secs(600);

/// The first bucket in which not every tracked message was settled: every message published
/// before it was processed. By publish time; `None` when every bucket is processed.
pub fn first_unprocessed(buckets: &[BucketCounts]) -> Option<i64> {
    buckets
        .iter()
        .filter(|b| b.processed < b.tracked)
        .map(|b| b.bucket_ms)
        .min()
}

/// The unprocessed buckets with a processed bucket after them, oldest first.
fn stalled_buckets(buckets: &[BucketCounts]) -> Vec<i64> {
    let Some(last_processed) = buckets
        .iter()
        .filter(|b| b.processed > 0)
        .map(|b| b.bucket_ms)
        .max()
    else {
        return Vec::new();
    };
    let mut stalled: Vec<i64> = buckets
        .iter()
        .filter(|b| b.processed < b.tracked && b.bucket_ms < last_processed)
        .map(|b| b.bucket_ms)
        .collect();
    stalled.sort_unstable();
    stalled
}

/// Since when each stalled bucket has waited, and whether the alert was logged (once per
/// episode).
#[derive(Debug, Default)]
pub struct StallWatch {
    /// Buckets first seen unprocessed behind processed ones, and when.
    stalled_since: HashMap<i64, i64>,
    logged: bool,
}

impl StallWatch {
    /// Shows how long the oldest bucket left unprocessed behind processed ones has waited
    /// (`sluice_watermark_stalled_seconds`, 0 when none) and logs it once past
    /// [`STALL_ALERT`]. The watermark holds at such a bucket: its messages may still be
    /// committing (a slow stage, a lock, a retried batch), and no evidence here tells that from
    /// a lost report.
    pub fn observe(&mut self, flow: &FlowHandle, buckets: &[BucketCounts], now: i64) {
        let stalled = stalled_buckets(buckets);
        self.stalled_since
            .retain(|b, _| stalled.binary_search(b).is_ok());
        for bucket in &stalled {
            self.stalled_since.entry(*bucket).or_insert(now);
        }
        let waited = self
            .stalled_since
            .values()
            .map(|since| now.saturating_sub(*since))
            .max()
            .unwrap_or(0);
        metrics::gauge!(
            "sluice_watermark_stalled_seconds",
            &super::flow_labels(flow)
        )
        .set(waited as f64 / 1000.0);
        let alert = waited >= i64::try_from(STALL_ALERT.as_millis()).unwrap_or(i64::MAX);
        if alert && !self.logged {
            let oldest = stalled
                .first()
                .and_then(|b| buckets.iter().find(|c| c.bucket_ms == *b));
            tracing::warn!(flow = %flow.name, waited_s = waited / 1000,
                bucket_ms = oldest.map(|b| b.bucket_ms), tracked = oldest.map(|b| b.tracked),
                processed = oldest.map(|b| b.processed),
                "messages tracked in a watermark bucket are still not settled while later ones \
                 are; the watermark holds until they are (a stage or store that stays slow, or \
                 messages the flow can no longer read)");
        }
        self.logged = alert;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(bucket_ms: i64, tracked: u64, processed: u64) -> BucketCounts {
        BucketCounts {
            bucket_ms,
            tracked,
            processed,
            min_event_ms: Some(bucket_ms),
        }
    }

    /// An unprocessed bucket behind processed ones holds the watermark however long it waits
    /// (a timed release would skip it); it is reported as stalled.
    #[test]
    fn an_unprocessed_bucket_is_waited_for_and_reported_stalled() {
        let buckets = [
            bucket(1_000, 2, 2),
            bucket(2_000, 3, 1),
            bucket(3_000, 4, 4),
        ];
        assert_eq!(first_unprocessed(&buckets), Some(2_000));
        assert_eq!(stalled_buckets(&buckets), [2_000]);
        // The newest bucket still filling is not stalled: nothing after it is processed.
        let filling = [bucket(1_000, 2, 2), bucket(2_000, 3, 0)];
        assert_eq!(first_unprocessed(&filling), Some(2_000));
        assert!(stalled_buckets(&filling).is_empty());
        assert_eq!(first_unprocessed(&[bucket(1_000, 2, 2)]), None);
    }
}
