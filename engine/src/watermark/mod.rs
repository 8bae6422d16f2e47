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
//! * Messages settled outside a commit (duplicates found in memory, redeliveries parked behind
//!   a key in flight) are acked only once their reports are stored
//!   ([`FlowWatermark::after_settled`]): a worker killed in between leaves them unacked, so they
//!   come back and are reported again, and no bucket waits for ever for a report that was lost.
//!
//! Guarantee: the watermark held here only moves forward ([`FlowWatermark::advance`] keeps the
//! larger value), so a replica that reads an older record never shows a watermark going back.

mod probes;
mod reading;
mod stall;
pub(crate) mod tracker_settings;
pub(crate) mod tracking;

use sluice_store::{
    BucketMessage, FlowHandle, MessageReport, PROGRESS_BUCKET_MS, ProgressStore, StoreError,
};
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
    settled: Mutex<SettledReports>,
}

/// What runs once the reports before it are stored (an ack, and its counts).
pub type AfterReport = Box<dyn FnOnce() + Send>;

/// Settled messages not reported yet, and what waits for their reports.
#[derive(Default)]
pub struct SettledReports {
    /// The reports, to record in the store's buckets.
    pub reports: Vec<BucketMessage>,
    then: Vec<AfterReport>,
}

impl SettledReports {
    /// Whether there is nothing to report and nothing waiting.
    pub fn is_empty(&self) -> bool {
        self.reports.is_empty() && self.then.is_empty()
    }

    /// The reports are stored: runs what waited for them (acks).
    pub fn stored(self) {
        for then in self.then {
            then();
        }
    }

    fn extend(&mut self, other: SettledReports) {
        self.reports.extend(other.reports);
        self.then.extend(other.then);
    }
}

impl std::fmt::Debug for SettledReports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SettledReports")
            .field("reports", &self.reports.len())
            .field("waiting", &self.then.len())
            .finish()
    }
}

impl Default for FlowWatermark {
    fn default() -> Self {
        Self {
            inner: Arc::new(Inner {
                watermark_ms: AtomicI64::new(NONE),
                settled: Mutex::new(SettledReports::default()),
            }),
        }
    }
}

/// The labels of a flow's watermark gauges.
fn flow_labels(flow: &FlowHandle) -> [(&'static str, String); 2] {
    [
        ("pipeline", flow.pipeline.to_string()),
        ("flow", flow.name.to_string()),
    ]
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
        settled
            .reports
            .extend(messages.into_iter().map(|(publish_ms, id)| BucketMessage {
                bucket_ms: bucket_of(publish_ms),
                message_id: id.to_owned(),
                report: MessageReport::Settled,
            }));
    }

    /// Runs `then` (acks) once the reports given to [`FlowWatermark::settled`] before it are
    /// stored (at the latest with the next store of reports after them).
    pub fn after_settled(&self, then: AfterReport) {
        self.inner
            .settled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .then
            .push(then);
    }

    /// Takes the settled messages not reported yet (to be recorded in the store, then
    /// `SettledReports::stored`).
    pub fn take_settled(&self) -> SettledReports {
        std::mem::take(
            &mut *self
                .inner
                .settled
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// Gives back reports that could not be recorded, to go with the next ones.
    pub fn restore_settled(&self, reports: SettledReports) {
        self.inner
            .settled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(reports);
    }

    /// Records the settled messages not reported yet in `flow`'s buckets of `store`, then runs
    /// what waited for them (acks); on failure they are given back, to go with the next ones.
    /// A flow with a watermark needs this run regularly (its tracker does, every tick), or the
    /// messages settled outside a commit are never acked and hold their budget.
    pub async fn store_settled(
        &self,
        store: &dyn ProgressStore,
        flow: &FlowHandle,
    ) -> Result<(), StoreError> {
        let settled = self.take_settled();
        if settled.is_empty() {
            return Ok(());
        }
        if !settled.reports.is_empty()
            && let Err(error) = store.add_bucket_messages(flow, &settled.reports).await
        {
            self.restore_settled(settled);
            return Err(error);
        }
        settled.stored();
        Ok(())
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
                .reports
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
        let acked = Arc::new(AtomicI64::new(0));
        let counted = acked.clone();
        w.settled([(1_000, "d")]);
        w.after_settled(Box::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        }));
        let taken = w.take_settled();
        assert_eq!(taken.reports.len(), 4);
        assert_eq!(
            acked.load(Ordering::SeqCst),
            0,
            "not before the reports are stored"
        );
        taken.stored();
        assert_eq!(acked.load(Ordering::SeqCst), 1);
    }
}
