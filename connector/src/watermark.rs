//! A flow's event-time watermark as its workers see it, and what they report toward it.
//!
//! * [`FlowWatermark::processed`] counts, per publish-time bucket, the messages this worker
//!   settled (committed, dead-lettered, found a duplicate). [`crate::WatermarkTracker`] adds
//!   them to the store's buckets, where the tracking reader compares them with what the
//!   tracking subscription delivered: a bucket is processed when its counts meet.
//! * [`FlowWatermark::current`] is the flow's watermark, as the tracking reader last stored it
//!   (the same value on every replica, a little later on some). Batches carry it
//!   ([`crate::Batch::watermark_ms`]), commits count rows below it as late
//!   (`sluice_messages_late_total`), and the gauges show it.
//!
//! Guarantee: the watermark held here only moves forward ([`FlowWatermark::advance`] keeps the
//! larger value), so a replica that reads an older record never shows a watermark going back.

use sluice_store::{BucketCounts, PROGRESS_BUCKET_MS};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// No watermark yet.
const NONE: i64 = i64::MIN;

/// One flow's watermark and its processed counts; cheap to clone.
#[derive(Debug, Clone)]
pub struct FlowWatermark {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    watermark_ms: AtomicI64,
    processed: Mutex<BTreeMap<i64, u64>>,
}

impl Default for FlowWatermark {
    fn default() -> Self {
        Self {
            inner: Arc::new(Inner {
                watermark_ms: AtomicI64::new(NONE),
                processed: Mutex::new(BTreeMap::new()),
            }),
        }
    }
}

/// The start of the progress bucket holding `publish_ms`.
pub fn bucket_of(publish_ms: i64) -> i64 {
    publish_ms.div_euclid(PROGRESS_BUCKET_MS) * PROGRESS_BUCKET_MS
}

impl FlowWatermark {
    /// A flow with no watermark yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The watermark, ms since epoch; `None` until the tracking reader gave one.
    pub fn current(&self) -> Option<i64> {
        Some(self.inner.watermark_ms.load(Ordering::Acquire)).filter(|ms| *ms != NONE)
    }

    /// Moves the watermark to `watermark_ms` if that is later; never back.
    pub fn advance(&self, watermark_ms: i64) {
        self.inner
            .watermark_ms
            .fetch_max(watermark_ms, Ordering::AcqRel);
    }

    /// This worker settled one message published at `publish_ms`.
    pub fn processed(&self, publish_ms: i64) {
        self.processed_all([publish_ms]);
    }

    /// This worker settled messages published at these times (one lock for a whole batch).
    pub fn processed_all(&self, publish_ms: impl IntoIterator<Item = i64>) {
        let mut processed = self
            .inner
            .processed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for publish_ms in publish_ms {
            *processed.entry(bucket_of(publish_ms)).or_default() += 1;
        }
    }

    /// Takes the counts not reported yet (to be added to the store).
    pub fn take_processed(&self) -> Vec<BucketCounts> {
        let taken = std::mem::take(
            &mut *self
                .inner
                .processed
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        taken
            .into_iter()
            .map(|(bucket_ms, processed)| BucketCounts {
                bucket_ms,
                processed,
                ..BucketCounts::default()
            })
            .collect()
    }

    /// Gives back counts whose report failed, to be reported with the next ones.
    pub fn restore_processed(&self, counts: &[BucketCounts]) {
        let mut processed = self
            .inner
            .processed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for count in counts {
            *processed.entry(count.bucket_ms).or_default() += count.processed;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn moves_forward_only_and_counts_by_bucket() {
        let w = FlowWatermark::new();
        assert_eq!(w.current(), None);
        w.advance(5_000);
        w.advance(4_000);
        assert_eq!(w.current(), Some(5_000));
        w.processed(1_500);
        w.processed(1_999);
        w.processed(2_000);
        let taken = w.take_processed();
        assert_eq!(
            taken
                .iter()
                .map(|c| (c.bucket_ms, c.processed))
                .collect::<Vec<_>>(),
            [(1_000, 2), (2_000, 1)]
        );
        assert!(w.take_processed().is_empty());
        w.restore_processed(&taken);
        w.processed(1_000);
        assert_eq!(w.take_processed()[0].processed, 3);
    }
}
