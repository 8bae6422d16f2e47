//! A received message and the handle that acks or nacks it.

use crate::flow::budget::Permits;
use bytes::Bytes;
use sluice_dedup::{DedupKey, KeyHash};
use std::collections::BTreeMap;
use std::time::Instant;

/// A message as a source delivers it, independent of the client library.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceMessage {
    /// Pub/Sub message id.
    pub message_id: String,
    /// Publish time, ms since epoch.
    pub publish_time_ms: i64,
    /// Attributes, sorted by name.
    pub attributes: BTreeMap<String, String>,
    /// Payload.
    pub data: Bytes,
    /// Event time the source itself knows (a file record's `event_time`), ms since epoch; it
    /// wins over an `event_time.attribute`. `None` for Pub/Sub messages.
    pub event_time_ms: Option<i64>,
    /// Why the source could not decode this message (an undecodable file line); such a message
    /// becomes a dead letter with this reason, under its own key, and is never lost.
    pub problem: Option<SourceProblem>,
}

/// A problem a source found with one message, carried to the stage, which dead-letters it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceProblem {
    /// Short machine-readable reason (`undecodable`, `missing_id`, `bad_timestamp`,
    /// `record_too_large`).
    pub reason: &'static str,
    /// For people.
    pub error: String,
}

impl SourceMessage {
    /// Bytes the message occupies for flow control (payload plus attributes).
    pub fn size(&self) -> usize {
        self.data.len()
            + self
                .attributes
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
    }
}

/// Settles one received message with its source. Dropping a handle without calling either
/// method must nack it (the Pub/Sub client does so).
pub trait AckHandle: Send + Sync + 'static {
    /// Acknowledge: the message's effect is committed. Best effort; a lost ack means a
    /// redelivery, which the ledger absorbs.
    fn ack(self: Box<Self>);
    /// Give the message back for prompt redelivery.
    fn nack(self: Box<Self>);
}

/// A message on its way through sluice, holding its ack handle and its share of the budget.
pub struct Delivery {
    /// The message.
    pub message: SourceMessage,
    /// Its dedup key.
    pub key: DedupKey,
    pub(crate) hash: KeyHash,
    /// `Some(reason)` if the key could not be taken as configured (`missing_dedup_attribute`);
    /// the stage turns such a message into a dead letter.
    pub key_problem: Option<&'static str>,
    pub(crate) handle: Box<dyn AckHandle>,
    pub(crate) _permits: Permits,
    /// When sluice received it.
    pub received_at: Instant,
    /// Stage or commit attempts that failed for this message alone so far.
    pub attempts: u32,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
    /// Its Pub/Sub ordering key, if it has one.
    pub ordering_key: Option<std::sync::Arc<str>>,
    /// Why the store refused this message's dead letter as it was (a value it cannot hold):
    /// the dead letter is then kept without the message's data and attributes.
    pub store_refused: Option<String>,
    /// Why its typed table's query failed on it (the column and the store's message): it is
    /// then a dead letter (`expression:<column>`), at once, since it would fail again.
    pub query_failed: Option<(String, String)>,
}

impl Delivery {
    pub(crate) fn ack(self) -> Instant {
        self.handle.ack();
        self.received_at
    }

    pub(crate) fn nack(self) {
        self.handle.nack();
    }
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("message_id", &self.message.message_id)
            .field("key", &self.key)
            .field("attempts", &self.attempts)
            .finish_non_exhaustive()
    }
}
