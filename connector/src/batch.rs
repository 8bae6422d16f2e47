//! From received messages to deduplicated batches: keying, the memory tier, parking of racing
//! redeliveries, and batching by count and delay.

use crate::budget::Budget;
use crate::delivery::{Delivery, SourceMessage};
use crate::pubsub::SourceError;
use crate::source::{INTAKE_CAPACITY, MessageSource, Received, SourceHandle};
use crate::telemetry::Counters;
use sluice_dedup::{Admission, DedupKey, KeyHash, MemoryWindow, Settlement};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
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

/// What the batcher and the committer share: the memory tier and the parked redeliveries.
/// The `parked` lock is taken around every admission and settlement, so a redelivery can never
/// be parked after its original has settled (it would wait forever).
pub(crate) struct FlowDedup {
    window: MemoryWindow,
    parked: Mutex<HashMap<KeyHash, Vec<Delivery>>>,
    pub(crate) counters: Counters,
}

impl FlowDedup {
    fn lock(&self) -> MutexGuard<'_, HashMap<KeyHash, Vec<Delivery>>> {
        self.parked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Returns the delivery if it should be processed; parks or acks it otherwise.
    fn admit(&self, delivery: Delivery) -> Option<Delivery> {
        let mut parked = self.lock();
        match self.window.admit(delivery.hash) {
            Admission::New => Some(delivery),
            Admission::InFlight => {
                parked.entry(delivery.hash).or_default().push(delivery);
                None
            }
            Admission::Committed => {
                drop(parked);
                let received_at = delivery.ack();
                self.counters.duplicate_in_memory(1);
                self.counters.acked(1);
                self.counters
                    .ack_latency(received_at.elapsed().as_secs_f64());
                None
            }
        }
    }

    /// Ends a key's flight and hands back the redeliveries parked behind it.
    fn settle(&self, hash: KeyHash, how: Settlement) -> Vec<Delivery> {
        let mut parked = self.lock();
        self.window.settle(hash, how);
        parked.remove(&hash).unwrap_or_default()
    }

    fn parked_count(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }
}

/// Turns a source's intake into deduplicated [`Batch`]es of one flow.
pub struct BatchSource {
    intake: mpsc::Receiver<Received>,
    dedup: Arc<FlowDedup>,
    key: KeySource,
    batch: BatchSettings,
    next_id: u64,
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
                parked: Mutex::new(HashMap::new()),
                counters,
            }),
            key: dedup.key,
            batch: BatchSettings {
                max_messages: batch.max_messages.max(1),
                max_delay: batch.max_delay,
            },
            next_id: 0,
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
        let handle = source.start(intake_tx, budget, stop).await?;
        Ok((Self::new(intake, dedup, batch, counters), handle))
    }

    /// The next batch; `None` once the intake has closed (the source stopped) and is empty.
    pub async fn next_batch(&mut self) -> Option<Batch> {
        self.next_batch_within(None).await.ok().flatten()
    }

    /// As [`BatchSource::next_batch`], but gives up with `Err(Idle)` when no message at all
    /// arrived for `idle` and no redelivery is parked: the subscription has drained.
    pub async fn next_batch_or_idle(&mut self, idle: Duration) -> Result<Option<Batch>, Idle> {
        self.next_batch_within(Some(idle)).await
    }

    /// Keys currently held in memory (`sluice_dedup_cache_entries`).
    pub fn cache_entries(&self) -> u64 {
        self.dedup.window.entries()
    }

    async fn next_batch_within(&mut self, idle: Option<Duration>) -> Result<Option<Batch>, Idle> {
        let first = loop {
            let received = match idle {
                None => self.intake.recv().await,
                Some(idle) => match timeout(idle, self.intake.recv()).await {
                    Ok(received) => received,
                    Err(_) if self.dedup.parked_count() == 0 => return Err(Idle),
                    Err(_) => continue,
                },
            };
            let Some(received) = received else {
                return Ok(None);
            };
            if let Some(delivery) = self.admit(received) {
                break delivery;
            }
        };
        let deadline = Instant::now() + self.batch.max_delay;
        let mut deliveries = Vec::with_capacity(self.batch.max_messages.min(4096));
        deliveries.push(first);
        while deliveries.len() < self.batch.max_messages {
            let received = tokio::select! {
                biased;
                received = self.intake.recv() => received,
                _ = sleep_until(deadline) => break,
            };
            let Some(received) = received else { break };
            if let Some(delivery) = self.admit(received) {
                deliveries.push(delivery);
            }
        }
        self.next_id += 1;
        Ok(Some(Batch {
            id: self.next_id,
            deliveries,
            dedup: self.dedup.clone(),
        }))
    }

    fn admit(&self, received: Received) -> Option<Delivery> {
        self.dedup.counters.received(1);
        let (key, key_problem) = key_of(&self.key, &received.message);
        let delivery = Delivery {
            hash: key.hash(),
            key,
            key_problem,
            message: received.message,
            handle: received.handle,
            _permits: received.permits,
            received_at: received.received_at,
            attempts: 0,
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

    pub(crate) fn count_failed_attempt(&mut self) {
        for delivery in &mut self.deliveries {
            delivery.attempts += 1;
        }
    }

    /// Splits into one batch per delivery (to isolate a message that makes a batch fail).
    pub(crate) fn into_singles(mut self) -> Vec<Batch> {
        let id = self.id;
        std::mem::take(&mut self.deliveries)
            .into_iter()
            .map(|delivery| Batch {
                id,
                deliveries: vec![delivery],
                dedup: self.dedup.clone(),
            })
            .collect()
    }

    /// Call only after the batch's effects committed: acks every delivery and every
    /// redelivery parked behind one, and remembers the keys. `written[i]` tells whether
    /// delivery `i` wrote its effect (`false`: the store found it a duplicate).
    pub fn settle_committed(mut self, written: &[bool]) {
        let counters = self.dedup.counters.clone();
        let (mut acked, mut parked_duplicates) = (0u64, 0u64);
        for delivery in std::mem::take(&mut self.deliveries) {
            for parked in self.dedup.settle(delivery.hash, Settlement::Committed) {
                parked.ack();
                parked_duplicates += 1;
            }
            counters.ack_latency(delivery.ack().elapsed().as_secs_f64());
            acked += 1;
        }
        debug_assert!(written.len() == acked as usize || written.is_empty());
        counters.duplicate_in_memory(parked_duplicates);
        counters.acked(acked + parked_duplicates);
    }

    /// Gives every message back uncommitted (nack): Pub/Sub redelivers them promptly.
    pub fn abandon(mut self) {
        self.abandon_all();
    }

    fn abandon_all(&mut self) {
        let mut nacked = 0u64;
        for delivery in std::mem::take(&mut self.deliveries) {
            for parked in self.dedup.settle(delivery.hash, Settlement::Abandoned) {
                parked.nack();
                nacked += 1;
            }
            delivery.nack();
            nacked += 1;
        }
        self.dedup.counters.nacked(nacked);
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if !self.deliveries.is_empty() {
            self.abandon_all();
        }
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
