//! A batch: messages of one flow processed and committed together, their keys in flight in the
//! memory tier until it is settled, and every way it ends (committed and acked, given back,
//! split into lanes or singles).
//!
//! Guarantee: nothing is acked without a settle after its commit
//! ([`Batch::settle_committed`]); a batch dropped unsettled gives every message back (nack) and
//! releases its keys.

use crate::flow::delivery::Delivery;
use crate::flow::memory_tier::{FlowDedup, ack_after_report, ack_now};
use crate::telemetry::Counters;
use crate::time::age;
use sluice_dedup::Settlement;
use std::sync::Arc;
use std::time::Duration;

/// Messages of one flow to be processed and committed together. Its deliveries' keys are in
/// flight in the memory tier until the batch is settled. Dropping an unsettled batch abandons
/// it (nacks every message), so nothing is ever acked without [`Batch::settle_committed`].
pub struct Batch {
    /// Sequence number of this batch within its source (1, 2, ...).
    pub id: u64,
    deliveries: Vec<Delivery>,
    dedup: Arc<FlowDedup>,
    /// Receive instant of the first (oldest) delivery while the batch is tracked for the
    /// system-lag gauge; taken when the batch settles.
    tracked_since: Option<std::time::Instant>,
    /// For a batch of a paged source: its page's position change (see `page.rs`).
    page: Option<crate::source::page::PageMark>,
    /// For a part of a page split into singles, other than the last: the version check its
    /// commit makes (the last part carries the mark and moves the position), and the gate.
    page_part: Option<(
        sluice_store::PositionAdvance,
        Arc<crate::source::page::PageTracker>,
    )>,
}

impl Batch {
    /// An empty batch numbered `id`, its keys to be held in `dedup`.
    pub(crate) fn new(id: u64, dedup: Arc<FlowDedup>) -> Self {
        Batch {
            id,
            deliveries: Vec::new(),
            dedup,
            tracked_since: None,
            page: None,
            page_part: None,
        }
    }

    /// Adds a delivery admitted to the memory tier; the first one starts the batch's
    /// system-lag tracking.
    pub(crate) fn push(&mut self, delivery: Delivery) {
        if self.deliveries.is_empty() {
            self.track(delivery.received_at);
        }
        self.deliveries.push(delivery);
    }

    /// Makes room for `additional` more deliveries.
    pub(crate) fn reserve(&mut self, additional: usize) {
        self.deliveries.reserve(additional);
    }

    /// Closes a paged source's batch with its page's position change (see `page.rs`).
    pub(crate) fn end_page(&mut self, mark: crate::source::page::PageMark) {
        self.page = Some(mark);
    }

    /// The batch's deliveries, in receive order.
    pub fn deliveries(&self) -> &[Delivery] {
        &self.deliveries
    }

    /// Number of deliveries.
    pub fn len(&self) -> usize {
        self.deliveries.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.deliveries.is_empty()
    }

    pub(crate) fn counters(&self) -> Counters {
        self.dedup.counters.clone()
    }

    /// The position change this batch commits, for a batch of a table source's page (a
    /// version check only for a part of a split page but its last).
    pub(crate) fn position(&self) -> Option<&sluice_store::PositionAdvance> {
        self.page
            .as_ref()
            .map(crate::source::page::PageMark::advance)
            .or(self.page_part.as_ref().map(|(advance, _)| advance))
    }

    /// What this batch's commit waits for before it moves the position (see `page.rs`).
    pub(crate) fn position_gate(&self) -> Option<Arc<dyn sluice_store::PositionGate>> {
        let gate = match (&self.page, &self.page_part) {
            (Some(page), _) => page.gate(),
            (None, Some((_, gate))) => gate.clone(),
            (None, None) => return None,
        };
        Some(gate)
    }

    /// The flow's event-time watermark now (ms since epoch), for flows that estimate one;
    /// `None` otherwise or until the tracking reader gave one. A message of this batch whose
    /// event time is below it is late (and counted so when committed).
    pub fn watermark_ms(&self) -> Option<i64> {
        self.dedup
            .counters
            .shown_watermark()
            .and_then(crate::FlowWatermark::current)
    }

    fn track(&mut self, since: std::time::Instant) {
        self.dedup.counters.track_unacked(since);
        self.tracked_since = Some(since);
    }

    fn untrack(&mut self) {
        if let Some(since) = self.tracked_since.take() {
            self.dedup.counters.untrack_unacked(since);
        }
    }

    /// The store refused the dead letter of this batch's message as it was (see
    /// [`Delivery::store_refused`]).
    pub(crate) fn refused_by_store(&mut self, why: &str) {
        for delivery in &mut self.deliveries {
            delivery.store_refused = Some(why.to_owned());
        }
    }

    /// The store found that delivery `index`'s typed query fails at `column` (see
    /// [`Delivery::query_failed`]).
    pub(crate) fn query_failed(&mut self, index: usize, column: &str, error: &str) {
        if let Some(delivery) = self.deliveries.get_mut(index) {
            delivery.query_failed = Some((column.to_owned(), error.to_owned()));
        }
    }

    /// Records a failed attempt of a single-message batch (batches of several are split
    /// first, so an innocent message is not charged for its neighbour).
    pub(crate) fn count_failed_attempt(&mut self, error: &str) {
        for delivery in &mut self.deliveries {
            delivery.attempts += 1;
            delivery.last_error = Some(error.to_owned());
        }
    }

    /// Gives back (nacks) the deliveries received longer than `bound` ago, with what is parked
    /// behind their keys, and keeps the rest; with `whole`, all of them once one is (a flow
    /// keeping ordering keys in order: what came after a given-back message must not commit
    /// before it comes again). Returns how many messages were given back.
    pub(crate) fn nack_older_than(&mut self, bound: Duration, whole: bool) -> u64 {
        if self.deliveries.iter().all(|d| age(d.received_at) <= bound) {
            return 0;
        }
        let (stale, fresh): (Vec<Delivery>, Vec<Delivery>) = std::mem::take(&mut self.deliveries)
            .into_iter()
            .partition(|d| whole || age(d.received_at) > bound);
        self.deliveries = fresh;
        self.untrack();
        if let Some(oldest) = self.deliveries.iter().map(|d| d.received_at).min() {
            self.track(oldest);
        }
        self.give_back_stale(stale)
    }

    /// Gives back every delivery of a batch the store found past its commit deadline; returns
    /// how many messages were given back.
    pub(crate) fn nack_stale_batch(mut self) -> u64 {
        self.untrack();
        let deliveries = std::mem::take(&mut self.deliveries);
        self.give_back_stale(deliveries)
    }

    fn give_back_stale(&self, stale: Vec<Delivery>) -> u64 {
        let nacked = self.give_back(stale);
        self.dedup.counters.stale(nacked);
        nacked
    }

    /// Nacks `deliveries` and what is parked behind their keys, and releases the keys; returns
    /// how many messages were nacked.
    fn give_back(&self, deliveries: Vec<Delivery>) -> u64 {
        let parked = self
            .dedup
            .window
            .settle(deliveries.iter().map(|d| (d.hash, Settlement::Abandoned)));
        let nacked = (deliveries.len() + parked.len()) as u64;
        for delivery in deliveries.into_iter().chain(parked) {
            delivery.nack();
        }
        self.dedup.counters.nacked(nacked);
        nacked
    }

    /// Splits into `lanes` batches (some empty), a delivery going to `lane_of(delivery)`,
    /// each keeping the receive order; for batches without a page (Pub/Sub).
    pub(crate) fn into_lanes(
        mut self,
        lanes: usize,
        lane_of: impl Fn(&Delivery) -> usize,
    ) -> Vec<Batch> {
        let id = self.id;
        self.untrack();
        let mut parts: Vec<Batch> = (0..lanes.max(1))
            .map(|_| Batch::new(id, self.dedup.clone()))
            .collect();
        let count = parts.len();
        for delivery in std::mem::take(&mut self.deliveries) {
            parts[lane_of(&delivery) % count].push(delivery);
        }
        parts
    }

    /// The receive instant of its oldest delivery.
    pub(crate) fn oldest_received(&self) -> Option<std::time::Instant> {
        self.deliveries.iter().map(|d| d.received_at).min()
    }

    /// Splits into one batch per delivery (to isolate a message that makes a batch fail).
    /// A page's position change goes with the last single, so it commits after the rest; the
    /// others check the position's version (a reader whose position moved commits none).
    pub(crate) fn into_singles(mut self) -> Vec<Batch> {
        let id = self.id;
        self.untrack();
        let part = self.page.as_ref().map(|page| {
            let check = sluice_store::PositionAdvance {
                after: None,
                ..page.advance().clone()
            };
            (check, page.gate())
        });
        let mut singles: Vec<Batch> = std::mem::take(&mut self.deliveries)
            .into_iter()
            .map(|delivery| {
                let mut single = Batch {
                    id,
                    deliveries: Vec::with_capacity(1),
                    dedup: self.dedup.clone(),
                    tracked_since: None,
                    page: None,
                    page_part: part.clone(),
                };
                single.track(delivery.received_at);
                single.deliveries.push(delivery);
                single
            })
            .collect();
        if let Some(last) = singles.last_mut().filter(|_| self.page.is_some()) {
            last.page = self.page.take();
            last.page_part = None;
        }
        singles
    }

    /// Call only after the batch's effects committed: acks every delivery and every
    /// redelivery parked behind one, and remembers the keys in the memory tier for the dedup
    /// window counted from each delivery's receipt (before the commit began, so never past the
    /// ledger's own expiry). Returns how many messages were acked (parked redeliveries
    /// included). When the store said which entries it found duplicate, prefer
    /// [`Batch::settle_outcome`].
    pub fn settle_committed(self) -> u64 {
        self.settle(None, false)
    }

    /// As [`Batch::settle_committed`], given the commit's outcome (`written[i]` for delivery
    /// `i`, as in `sluice_store::CommitOutcome`): a key the ledger found duplicate of a copy
    /// committed elsewhere is not remembered in memory, since its expiry is not known here.
    pub fn settle_outcome(self, written: &[bool]) -> u64 {
        self.settle(Some(written), false)
    }

    /// [`Batch::settle_outcome`] after a commit that recorded its messages settled toward the
    /// flow's watermark itself (`CommitBatch::watermark_progress`): only the parked
    /// redeliveries, which were not in it, are reported here.
    pub(crate) fn settle_recorded(self, written: &[bool]) -> u64 {
        self.settle(Some(written), true)
    }

    fn settle(mut self, written: Option<&[bool]>, commit_recorded_progress: bool) -> u64 {
        self.untrack();
        if let Some(page) = self.page.take() {
            page.committed();
        }
        let counters = self.dedup.counters.clone();
        let deliveries = std::mem::take(&mut self.deliveries);
        let parked = self
            .dedup
            .window
            .settle(deliveries.iter().enumerate().map(|(i, d)| {
                let how = match written.and_then(|w| w.get(i)) {
                    Some(false) => Settlement::Duplicate,
                    _ => Settlement::Committed {
                        since: d.received_at,
                    },
                };
                (d.hash, how)
            }));
        let (acked, parked_duplicates) = (deliveries.len() as u64, parked.len() as u64);
        counters.duplicate_in_memory(parked_duplicates);
        // What the commit recorded toward the watermark is acked now; the rest once its
        // reports are stored (a report lost with its ack would hold the watermark for ever).
        if commit_recorded_progress {
            ack_after_report(&counters, parked);
            ack_now(&counters, deliveries);
        } else {
            ack_after_report(&counters, deliveries);
            ack_after_report(&counters, parked);
        }
        acked + parked_duplicates
    }

    /// Gives every message back uncommitted (nack): Pub/Sub redelivers them promptly.
    pub fn abandon(mut self) {
        self.abandon_all();
    }

    fn abandon_all(&mut self) {
        self.untrack();
        let deliveries = std::mem::take(&mut self.deliveries);
        self.give_back(deliveries);
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if !self.deliveries.is_empty() {
            self.abandon_all();
        }
        self.untrack();
    }
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("id", &self.id)
            .field("len", &self.deliveries.len())
            .finish()
    }
}
