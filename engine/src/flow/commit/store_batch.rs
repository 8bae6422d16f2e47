//! The store's work for one batch: its entries (a message and its effect each; a dead letter
//! the store refused kept without its payload), the ledger keys' expiry, the commit deadline,
//! and a sink's file work when the flow writes one.
//!
//! Guarantee: the commit deadline (`commit_by_ms`) is the oldest delivery's receipt plus the
//! commit bound, on the wall clock, so the store refuses the batch past it.

use super::CommitThenAck;
use crate::flow::batch::Batch;
use crate::flow::delivery::Delivery;
use crate::flow::query_cell::QueryCell;
use crate::flow::sink::SinkCommit;
use crate::time::{age, now_ms};
use sluice_store::{CommitBatch, Effect, Entry, MessageFields};
use std::sync::Arc;

impl CommitThenAck {
    /// The store's work for a batch, and a sink's file work when the flow writes a sink.
    pub(super) fn commit_batch(
        &self,
        batch: &Batch,
        effects: Vec<Effect>,
        work: Option<sluice_store::TransactionWork>,
    ) -> (CommitBatch, Option<Arc<SinkCommit>>) {
        let now = now_ms();
        let window = i64::try_from(self.retry.dedup_window.as_millis()).unwrap_or(i64::MAX);
        // Read after the batch was decoded: its values are a prefix of this query's fields.
        let typed = self.typed.as_ref().map(|cell| cell.current());
        let entries: Vec<Entry> = batch
            .deliveries()
            .iter()
            .zip(effects)
            .map(|(delivery, mut effect)| {
                if let (Some(query), Effect::Row { values, .. }) = (&typed, &mut effect) {
                    QueryCell::padded(query, values);
                }
                entry(delivery, effect)
            })
            .collect();
        let sink_commit = self
            .sink
            .as_ref()
            .map(|sink| Arc::new(sink.commit(&entries, now)));
        // The oldest delivery's receipt on the wall clock, plus the bound.
        let commit_by_ms = self.retry.commit_bound.and_then(|bound| {
            let oldest = batch.deliveries().iter().map(|d| d.received_at).min()?;
            let left = bound.checked_sub(age(oldest)).unwrap_or_default();
            Some(now.saturating_add(i64::try_from(left.as_millis()).unwrap_or(i64::MAX)))
        });
        let commit = CommitBatch {
            flow: self.flow.clone(),
            table: self.table.clone(),
            entries,
            now_ms: now,
            expires_at_ms: now.saturating_add(window),
            commit_by_ms,
            hook: sink_commit
                .clone()
                .map(|s| s as Arc<dyn sluice_store::CommitHook>),
            watermark_progress: batch.counters().watermark().is_some(),
            position: batch.position().cloned(),
            position_gate: batch.position_gate(),
            work,
            publish_dead_letters: self.publish_dead_letters,
            verdicts: Vec::new(),
            memory_duplicates: 0,
            typed,
        };
        (commit, sink_commit)
    }
}

fn entry(delivery: &Delivery, effect: Effect) -> Entry {
    let message = &delivery.message;
    if delivery.store_refused.is_some() {
        // What the store could not hold is left out: the dead letter keeps the message's
        // identity, its reason and the store's error.
        return Entry {
            key: delivery.key.clone(),
            message: MessageFields {
                message_id: message.message_id.chars().take(BARE_ID_CHARS).collect(),
                publish_time_ms: message.publish_time_ms,
                attributes_json: "{}".to_owned(),
                data: bytes::Bytes::new(),
            },
            effect,
        };
    }
    Entry {
        key: delivery.key.clone(),
        message: MessageFields {
            message_id: message.message_id.clone(),
            publish_time_ms: message.publish_time_ms,
            attributes_json: serde_json::to_string(&message.attributes)
                .unwrap_or_else(|_| "{}".to_owned()),
            data: message.data.clone(),
        },
        effect,
    }
}

/// A dead letter kept without its payload keeps this much of its message id (a file record's
/// id may be as long as its line).
const BARE_ID_CHARS: usize = 256;
