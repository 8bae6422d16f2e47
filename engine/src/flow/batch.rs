//! From received messages to deduplicated batches: keying, the memory tier, parking of racing
//! redeliveries, and batching by count and delay.

use crate::flow::budget::Budget;
use crate::flow::delivery::{Delivery, SourceMessage};
use crate::flow::storable::make_storable;
use crate::source::SourceError;
use crate::source::{INTAKE_CAPACITY, MessageSource, Received, SourceHandle};
use crate::telemetry::Counters;
use sluice_dedup::{Admission, DedupKey, MemoryWindow, Settlement};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

/// Where a message's dedup key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// The Pub/Sub message id.
    MessageId,
    /// An attribute; a message without it falls back to its message id, or, with
    /// `dead_letter_if_missing`, is dead-lettered (reason `missing_dedup_attribute`).
    Attribute {
        /// Attribute name.
        name: String,
        /// Dead-letter instead of falling back.
        dead_letter_if_missing: bool,
    },
}

/// Dedup settings of one flow.
#[derive(Debug, Clone)]
pub struct DedupSettings {
    /// Key source.
    pub key: KeySource,
    /// The dedup window (default 10 minutes).
    pub window: Duration,
}

/// Batch bounds of one flow.
#[derive(Debug, Clone, Copy)]
pub struct BatchSettings {
    /// A batch closes at this many messages.
    pub max_messages: usize,
    /// ...or this long after its first message arrived.
    pub max_delay: Duration,
}

/// What the batcher and the committer share: the memory tier (with the redeliveries parked behind
/// keys in flight) and the flow's counters.
pub(crate) struct FlowDedup {
    window: MemoryWindow<Delivery>,
    pub(crate) counters: Counters,
}

impl FlowDedup {
    /// Returns the delivery if it should be processed; parks or acks (a duplicate) otherwise.
    fn admit(&self, delivery: Delivery) -> Option<Delivery> {
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
fn ack_after_report<I>(counters: &Counters, deliveries: I)
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
fn ack_now<I>(counters: &Counters, deliveries: I)
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

/// Turns a source's intake into deduplicated [`Batch`]es of one flow.
pub struct BatchSource {
    intake: mpsc::Receiver<Received>,
    dedup: Arc<FlowDedup>,
    key: KeySource,
    batch: BatchSettings,
    next_id: u64,
    /// The source hands over pages ([`MessageSource::paged`]).
    paged: bool,
}

impl BatchSource {
    /// A batcher over `intake`.
    pub fn new(
        intake: mpsc::Receiver<Received>,
        dedup: DedupSettings,
        batch: BatchSettings,
        counters: Counters,
    ) -> Self {
        Self {
            intake,
            dedup: Arc::new(FlowDedup {
                window: MemoryWindow::new(dedup.window),
                counters,
            }),
            key: dedup.key,
            batch: BatchSettings {
                max_messages: batch.max_messages.max(1),
                max_delay: batch.max_delay,
            },
            next_id: 0,
            paged: false,
        }
    }

    /// Starts `source` within `budget` and returns a batcher over it, with the source's handle
    /// (close it after the last batch is settled). Cancelling `stop` stops the source asking
    /// for messages; [`BatchSource::next_batch`] returns `None` once what it had is batched.
    pub async fn start(
        source: Box<dyn MessageSource>,
        budget: Budget,
        dedup: DedupSettings,
        batch: BatchSettings,
        counters: Counters,
        stop: CancellationToken,
    ) -> Result<(Self, Box<dyn SourceHandle>), SourceError> {
        let (intake_tx, intake) = mpsc::channel(INTAKE_CAPACITY);
        let paged = source.paged();
        let handle = source.start(intake_tx, budget, stop).await?;
        let mut batcher = Self::new(intake, dedup, batch, counters);
        batcher.paged = paged;
        Ok((batcher, handle))
    }

    /// The next batch; `None` once the intake has closed (the source stopped) and is empty.
    /// Cancel-safe: if this future is dropped, the messages it had gathered are nacked and their
    /// keys released.
    pub async fn next_batch(&mut self) -> Option<Batch> {
        self.next_batch_within(None).await.ok().flatten()
    }

    /// As [`BatchSource::next_batch`], but gives up with `Err(Idle)` when no message at all
    /// arrived for `idle` and no key is in flight (every batch handed out has been settled):
    /// the subscription has drained.
    pub async fn next_batch_or_idle(&mut self, idle: Duration) -> Result<Option<Batch>, Idle> {
        self.next_batch_within(Some(idle)).await
    }

    /// Keys currently held in memory (`sluice_dedup_cache_entries`).
    pub fn cache_entries(&self) -> u64 {
        self.dedup.window.entries()
    }

    /// Keys admitted and not yet settled (committed or abandoned).
    pub fn keys_in_flight(&self) -> usize {
        self.dedup.window.in_flight()
    }

    /// Cancel-safe: the batch under construction is a [`Batch`] from its first delivery on, so
    /// dropping this future abandons (nacks) what it held and releases the keys.
    async fn next_batch_within(&mut self, idle: Option<Duration>) -> Result<Option<Batch>, Idle> {
        let mut batch = Batch {
            id: self.next_id + 1,
            deliveries: Vec::new(),
            dedup: self.dedup.clone(),
            tracked_since: None,
            page: None,
            page_part: None,
        };
        if self.paged {
            return self.next_page(batch, idle).await;
        }
        while batch.deliveries.is_empty() {
            let Some(received) = self.receive(idle).await? else {
                return Ok(None);
            };
            if let Some(delivery) = self.admit(received) {
                batch.deliveries.reserve(self.batch.max_messages.min(4096));
                batch.track(delivery.received_at);
                batch.deliveries.push(delivery);
            }
        }
        let deadline = sleep_until(Instant::now() + self.batch.max_delay);
        tokio::pin!(deadline);
        while batch.deliveries.len() < self.batch.max_messages {
            let received = tokio::select! {
                biased;
                received = self.intake.recv() => received,
                _ = &mut deadline => break,
            };
            let Some(received) = received else { break };
            if let Some(delivery) = self.admit(received) {
                batch.deliveries.push(delivery);
            }
        }
        self.next_id += 1;
        Ok(Some(batch))
    }

    /// A paged source's next batch: one whole page, up to the mark that follows its records,
    /// whatever the batch bounds say (the source keeps pages within the budget). A page cut
    /// short by the end of the intake is given back; so is a page whose every record was a
    /// duplicate in memory... except its mark, which still commits (an empty batch).
    async fn next_page(
        &mut self,
        mut batch: Batch,
        idle: Option<Duration>,
    ) -> Result<Option<Batch>, Idle> {
        loop {
            let Some(mut received) = self.receive(idle).await? else {
                return Ok(None);
            };
            // The mark comes on its own, after the page's records.
            if let Some(page) = received.page.take() {
                batch.page = Some(page);
                self.next_id += 1;
                return Ok(Some(batch));
            }
            if let Some(delivery) = self.admit(received) {
                if batch.deliveries.is_empty() {
                    batch.track(delivery.received_at);
                }
                batch.deliveries.push(delivery);
            }
        }
    }

    /// The next received message; `Ok(None)` once the intake closed; `Err(Idle)` when nothing
    /// arrived for `idle` and no key is in flight.
    async fn receive(&mut self, idle: Option<Duration>) -> Result<Option<Received>, Idle> {
        let Some(idle) = idle else {
            return Ok(self.intake.recv().await);
        };
        loop {
            match timeout(idle, self.intake.recv()).await {
                Ok(received) => return Ok(received),
                // Drained only when nothing is in flight either: a full budget held by
                // batches still committing also leaves the intake empty.
                Err(_) if self.dedup.window.in_flight() == 0 => return Err(Idle),
                Err(_) => continue,
            }
        }
    }

    fn admit(&self, received: Received) -> Option<Delivery> {
        self.dedup.counters.received(1);
        let mut message = received.message;
        let (mut key, key_problem) = key_of(&self.key, &message);
        if let Some(escaped) = make_storable(&mut message, key.as_str()) {
            key = DedupKey::new(escaped);
        }
        let delivery = Delivery {
            hash: key.hash(),
            key,
            key_problem,
            message,
            handle: received.handle,
            _permits: received.permits,
            received_at: received.received_at,
            attempts: received.earlier_attempts,
            last_error: None,
            ordering_key: received.ordering_key,
            store_refused: None,
        };
        self.dedup.admit(delivery)
    }
}

/// The subscription stayed empty for the idle time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Idle;

fn key_of(source: &KeySource, message: &SourceMessage) -> (DedupKey, Option<&'static str>) {
    match source {
        KeySource::MessageId => (DedupKey::new(message.message_id.as_str()), None),
        KeySource::Attribute {
            name,
            dead_letter_if_missing,
        } => match message.attributes.get(name) {
            Some(value) => (DedupKey::new(value.as_str()), None),
            None => (
                DedupKey::new(message.message_id.as_str()),
                dead_letter_if_missing.then_some("missing_dedup_attribute"),
            ),
        },
    }
}

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

    /// Records a failed attempt of a single-message batch (batches of several are split
    /// first, so an innocent message is not charged for its neighbour).
    /// The store refused the dead letter of this batch's message as it was (see
    /// [`Delivery::store_refused`]).
    pub(crate) fn refused_by_store(&mut self, why: &str) {
        for delivery in &mut self.deliveries {
            delivery.store_refused = Some(why.to_owned());
        }
    }

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
        if self
            .deliveries
            .iter()
            .all(|d| d.received_at.elapsed() <= bound)
        {
            return 0;
        }
        let (stale, fresh): (Vec<Delivery>, Vec<Delivery>) = std::mem::take(&mut self.deliveries)
            .into_iter()
            .partition(|d| whole || d.received_at.elapsed() > bound);
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
            .map(|_| Batch {
                id,
                deliveries: Vec::new(),
                dedup: self.dedup.clone(),
                tracked_since: None,
                page: None,
                page_part: None,
            })
            .collect();
        let count = parts.len();
        for delivery in std::mem::take(&mut self.deliveries) {
            let part = &mut parts[lane_of(&delivery) % count];
            if part.deliveries.is_empty() {
                part.track(delivery.received_at);
            }
            part.deliveries.push(delivery);
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
