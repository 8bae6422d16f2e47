//! A flow's event-time watermark as its workers see it, and what they report toward it.
//!
//! * [`FlowWatermark::settled`] keeps, per publish-time bucket, the ids of the messages this
//!   worker settled (committed, dead-lettered, found a duplicate). [`crate::WatermarkTracker`]
//!   records them in the store's buckets, where the tracking reader compares them with what the
//!   tracking subscription delivered: a bucket is processed when every message tracked in it
//!   was settled. By id, so a redelivery settled again counts once.
//! * [`FlowWatermark::current`] is the flow's watermark, as the tracking reader last stored it
//!   (the same value on every replica, a little later on some). Batches carry it
//!   ([`crate::Batch::watermark_ms`]), commits count rows below it as late
//!   (`sluice_messages_late_total`), and the gauges show it.
//!
//! Guarantee: the watermark held here only moves forward ([`FlowWatermark::advance`] keeps the
//! larger value), so a replica that reads an older record never shows a watermark going back.

use sluice_store::{BucketMessage, MessageReport, PROGRESS_BUCKET_MS};
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
    settled: Mutex<Vec<BucketMessage>>,
}

impl Default for FlowWatermark {
    fn default() -> Self {
        Self {
            inner: Arc::new(Inner {
                watermark_ms: AtomicI64::new(NONE),
                settled: Mutex::new(Vec::new()),
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

    /// This worker settled these messages, each given by its publish time and message id (one
    /// lock for a whole batch).
    pub fn settled<'a>(&self, messages: impl IntoIterator<Item = (i64, &'a str)>) {
        let mut settled = self
            .inner
            .settled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        settled.extend(messages.into_iter().map(|(publish_ms, id)| BucketMessage {
            bucket_ms: bucket_of(publish_ms),
            message_id: id.to_owned(),
            report: MessageReport::Settled,
        }));
    }

    /// Takes the settled messages not reported yet (to be recorded in the store).
    pub fn take_settled(&self) -> Vec<BucketMessage> {
        std::mem::take(
            &mut *self
                .inner
                .settled
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// Gives back reports that could not be recorded, to go with the next ones.
    pub fn restore_settled(&self, reports: Vec<BucketMessage>) {
        self.inner
            .settled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(reports);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn moves_forward_only_and_keeps_settled_messages_by_bucket() {
        let w = FlowWatermark::new();
        assert_eq!(w.current(), None);
        w.advance(5_000);
        w.advance(4_000);
        assert_eq!(w.current(), Some(5_000));
        w.settled([(1_500, "a"), (1_999, "b"), (2_000, "c")]);
        let taken = w.take_settled();
        assert_eq!(
            taken
                .iter()
                .map(|m| (m.bucket_ms, m.message_id.as_str(), m.report))
                .collect::<Vec<_>>(),
            [
                (1_000, "a", MessageReport::Settled),
                (1_000, "b", MessageReport::Settled),
                (2_000, "c", MessageReport::Settled)
            ]
        );
        assert!(w.take_settled().is_empty());
        w.restore_settled(taken);
        w.settled([(1_000, "d")]);
        assert_eq!(w.take_settled().len(), 4);
    }
}
