//! From received messages to deduplicated batches: keying, admission to the memory tier
//! (parking racing redeliveries, acking duplicates), and batching by count and delay, or page
//! by page for a paged source.
//!
//! Guarantees: a batch closes at `max_messages` or `max_delay` after its first message,
//! whichever comes first; a paged source's batch is one whole page; dropping
//! [`BatchSource::next_batch`] mid-way nacks what it gathered and releases the keys.

use crate::flow::batch::Batch;
use crate::flow::budget::Budget;
use crate::flow::delivery::{Delivery, SourceMessage};
use crate::flow::memory_tier::FlowDedup;
use crate::flow::storable::make_storable;
use crate::source::SourceError;
use crate::source::{INTAKE_CAPACITY, MessageSource, Received, SourceHandle};
use crate::telemetry::Counters;
use sluice_dedup::DedupKey;
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
            dedup: Arc::new(FlowDedup::new(dedup.window, counters)),
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
        let mut batch = Batch::new(self.next_id + 1, self.dedup.clone());
        if self.paged {
            return self.next_page(batch, idle).await;
        }
        while batch.is_empty() {
            let Some(received) = self.receive(idle).await? else {
                return Ok(None);
            };
            if let Some(delivery) = self.admit(received) {
                batch.reserve(self.batch.max_messages.min(4096));
                batch.push(delivery);
            }
        }
        let deadline = sleep_until(Instant::now() + self.batch.max_delay);
        tokio::pin!(deadline);
        while batch.len() < self.batch.max_messages {
            let received = tokio::select! {
                biased;
                received = self.intake.recv() => received,
                _ = &mut deadline => break,
            };
            let Some(received) = received else { break };
            if let Some(delivery) = self.admit(received) {
                batch.push(delivery);
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
                batch.end_page(page);
                self.next_id += 1;
                return Ok(Some(batch));
            }
            if let Some(delivery) = self.admit(received) {
                batch.push(delivery);
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
        if let KeySource::Attribute {
            name,
            dead_letter_if_missing,
        } = &self.key
            && !message.attributes.contains_key(name)
        {
            self.dedup
                .counters
                .dedup_key_missing(name, *dead_letter_if_missing);
        }
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
            query_failed: None,
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
