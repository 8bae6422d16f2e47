//! What a job's handler sees of a batch: its new messages ([`NewMessages`], each a
//! [`Message`]), taken from the batch and its staged effects before the transaction runs.
//!
//! Guarantee: a handler sees only the messages whose dedup key the ledger had not seen (never a
//! duplicate, never a dead letter), in receive order, each with the event time the flow's stage
//! gave it.

use sluice_engine::Batch;
use sluice_store::Effect;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One message of a batch, as a handler sees it.
///
/// ```
/// use sluice_connector::prelude::*;
/// use std::time::UNIX_EPOCH;
///
/// let store = |tx: &rusqlite::Transaction<'_>, batch: &NewMessages<'_>| {
///     for message in batch.iter() {
///         let event_ms = message
///             .event_time()
///             .duration_since(UNIX_EPOCH)
///             .map_or(0, |t| t.as_millis() as i64);
///         let attributes = message.attributes().len();
///         tx.execute(
///             "INSERT INTO events (key, pubsub_id, body, event_ms, region, attributes)
///              VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
///             (
///                 message.key(),
///                 message.id(),
///                 message.data(),
///                 event_ms,
///                 message.attribute("region"),
///                 attributes,
///             ),
///         )?;
///     }
///     Ok::<_, HandlerError>(())
/// };
/// # let _: &dyn SqliteHandler = &store;
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    key: &'a str,
    id: &'a str,
    data: &'a [u8],
    attributes: &'a BTreeMap<String, String>,
    publish_time_ms: i64,
    event_time_ms: i64,
}

impl<'a> Message<'a> {
    fn of_owned(owned: &'a Owned) -> Self {
        Self {
            key: &owned.key,
            id: &owned.id,
            data: &owned.data,
            attributes: &owned.attributes,
            publish_time_ms: owned.publish_time_ms,
            event_time_ms: owned.event_time_ms,
        }
    }

    /// A received message, its event time read from `event_time_attribute` when it has a
    /// readable one, else its publish time.
    pub(crate) fn of_delivery(
        delivery: &'a sluice_engine::Delivery,
        event_time_attribute: Option<&str>,
    ) -> Self {
        let message = &delivery.message;
        let event_time_ms = message
            .event_time_ms
            .or_else(|| {
                let value = message.attributes.get(event_time_attribute?)?;
                sluice_engine::parse_event_time(value)
            })
            .unwrap_or(message.publish_time_ms);
        Self {
            key: delivery.key.as_str(),
            id: &message.message_id,
            data: &message.data,
            attributes: &message.attributes,
            publish_time_ms: message.publish_time_ms,
            event_time_ms,
        }
    }

    /// Its dedup key (the message id, or the dedup attribute's value).
    pub fn key(&self) -> &'a str {
        self.key
    }

    /// Its Pub/Sub message id.
    pub fn id(&self) -> &'a str {
        self.id
    }

    /// Its payload.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// Its attributes.
    pub fn attributes(&self) -> &'a BTreeMap<String, String> {
        self.attributes
    }

    /// One attribute.
    pub fn attribute(&self, name: &str) -> Option<&'a str> {
        self.attributes.get(name).map(String::as_str)
    }

    /// When Pub/Sub received it.
    pub fn publish_time(&self) -> SystemTime {
        system_time(self.publish_time_ms)
    }

    /// Its event time: the job's event-time attribute, else its publish time.
    pub fn event_time(&self) -> SystemTime {
        system_time(self.event_time_ms)
    }
}

/// The new messages of a batch: those whose dedup key the ledger had not seen within the
/// window (never a duplicate, never one that is dead-lettered), in receive order.
///
/// ```
/// use sluice_connector::prelude::*;
///
/// let audit = |tx: &rusqlite::Transaction<'_>, batch: &NewMessages<'_>| {
///     let watermark_ms = batch
///         .watermark()
///         .and_then(|w| w.duration_since(std::time::UNIX_EPOCH).ok())
///         .map(|w| w.as_millis() as i64);
///     tx.execute(
///         "INSERT INTO batches (id, messages, watermark_ms) VALUES (?1, ?2, ?3)",
///         (batch.batch_id(), batch.len() as i64, watermark_ms),
///     )?;
///     Ok::<_, HandlerError>(())
/// };
/// # let _: &dyn SqliteHandler = &audit;
/// ```
#[derive(Debug)]
pub struct NewMessages<'a> {
    all: &'a [Owned],
    new: &'a [usize],
    batch_id: &'a str,
    watermark_ms: Option<i64>,
}

impl<'a> NewMessages<'a> {
    /// Them, in receive order.
    pub fn iter(&self) -> impl Iterator<Item = Message<'a>> + '_ {
        self.new.iter().map(|i| Message::of_owned(&self.all[*i]))
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.new.len()
    }

    /// Whether there are none (a handler is not called then).
    pub fn is_empty(&self) -> bool {
        self.new.is_empty()
    }

    /// The batch's id: the same for the same keys, so a batch given again after a crash (the
    /// same messages batched together again) has the same id.
    pub fn batch_id(&self) -> &'a str {
        self.batch_id
    }

    /// The flow's event-time watermark when the batch was formed (a job with a watermark).
    pub fn watermark(&self) -> Option<SystemTime> {
        self.watermark_ms.map(system_time)
    }
}

/// A message kept for the handler, owned (the work may run on another thread).
#[derive(Debug)]
pub(crate) struct Owned {
    key: String,
    id: String,
    data: bytes::Bytes,
    attributes: BTreeMap<String, String>,
    publish_time_ms: i64,
    event_time_ms: i64,
}

/// What a handler is given about one batch.
pub(crate) struct Snapshot {
    messages: Vec<Owned>,
    batch_id: String,
    watermark_ms: Option<i64>,
}

impl Snapshot {
    pub(crate) fn of(batch: &Batch, effects: &[Effect]) -> Self {
        let messages = batch
            .deliveries()
            .iter()
            .zip(effects)
            .map(|(delivery, effect)| Owned {
                key: delivery.key.as_str().to_owned(),
                id: delivery.message.message_id.clone(),
                data: delivery.message.data.clone(),
                attributes: delivery.message.attributes.clone(),
                publish_time_ms: delivery.message.publish_time_ms,
                event_time_ms: match effect {
                    Effect::Row { event_time_ms, .. } => *event_time_ms,
                    Effect::DeadLetter { .. } => delivery.message.publish_time_ms,
                },
            })
            .collect();
        Self {
            messages,
            batch_id: sluice_engine::batch_id(batch.deliveries().iter().map(|d| d.key.as_str())),
            watermark_ms: batch.watermark_ms(),
        }
    }

    pub(crate) fn view<'a>(&'a self, new: &'a [usize]) -> NewMessages<'a> {
        NewMessages {
            all: &self.messages,
            new,
            batch_id: &self.batch_id,
            watermark_ms: self.watermark_ms,
        }
    }
}

fn system_time(ms: i64) -> SystemTime {
    match u64::try_from(ms) {
        Ok(ms) => UNIX_EPOCH + Duration::from_millis(ms),
        Err(_) => UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs()),
    }
}
