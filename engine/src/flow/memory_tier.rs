//! The memory tier of one flow, which the batcher and the committer share: the keys in flight
//! and committed lately, the redeliveries parked behind keys in flight, and the acks of what it
//! settles.
//!
//! Guarantee: a duplicate found here is acked only as a settled message is: at once, or, for a
//! flow with a watermark, once its settled report is stored, so a crash in between leaves it to
//! be redelivered and reported again.

use crate::flow::delivery::Delivery;
use crate::telemetry::Counters;
use sluice_dedup::{Admission, MemoryWindow};

/// What the batcher and the committer share: the memory tier (with the redeliveries parked behind
/// keys in flight) and the flow's counters.
pub(crate) struct FlowDedup {
    pub(crate) window: MemoryWindow<Delivery>,
    pub(crate) counters: Counters,
}

impl FlowDedup {
    /// An empty tier remembering committed keys for `window`, counting on `counters`.
    pub(crate) fn new(window: std::time::Duration, counters: Counters) -> Self {
        Self {
            window: MemoryWindow::new(window),
            counters,
        }
    }

    /// Returns the delivery if it should be processed; parks or acks (a duplicate) otherwise.
    pub(crate) fn admit(&self, delivery: Delivery) -> Option<Delivery> {
        match self.window.admit(delivery.hash, delivery) {
            Admission::New(delivery) => Some(delivery),
            Admission::Parked => None,
            Admission::Committed(duplicate) => {
                self.counters.duplicate_in_memory(1);
                ack_after_report(&self.counters, [duplicate]);
                None
            }
        }
    }
}

/// Acks `deliveries`, counted; for a flow with a watermark, only once their settled reports
/// are stored (the tracker's next tick), so a crash in between leaves them to be redelivered
/// and reported again.
pub(crate) fn ack_after_report<I>(counters: &Counters, deliveries: I)
where
    I: IntoIterator<Item = Delivery>,
    I::IntoIter: ExactSizeIterator,
{
    let deliveries = deliveries.into_iter();
    if deliveries.len() == 0 {
        return;
    }
    let Some(watermark) = counters.watermark() else {
        return ack_now(counters, deliveries);
    };
    // Only a flow with a watermark keeps them (until its reports are stored).
    let deliveries: Vec<Delivery> = deliveries.collect();
    watermark.settled(
        deliveries
            .iter()
            .map(|d| (d.message.publish_time_ms, d.message.message_id.as_str())),
    );
    let counters = counters.clone();
    watermark.after_settled(Box::new(move || ack_now(&counters, deliveries)));
}

/// Acks `deliveries` now, counted.
pub(crate) fn ack_now<I>(counters: &Counters, deliveries: I)
where
    I: IntoIterator<Item = Delivery>,
    I::IntoIter: ExactSizeIterator,
{
    let deliveries = deliveries.into_iter();
    counters.acked(deliveries.len() as u64);
    for delivery in deliveries {
        counters.ack_latency(delivery.ack().elapsed().as_secs_f64());
    }
}
