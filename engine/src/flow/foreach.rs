//! `foreach_batch` targets: each micro-batch goes to user code *before* it is committed.
//!
//! In library use the user code is a Rust closure ([`ForeachBatchStage::new`]); the worker
//! wraps a gRPC `Stage` service in one (`proto/sluice/v1/stage.proto`).
//!
//! # Guarantees
//!
//! * **Called before the commit, acked after it.** The handler sees a batch's records, then the
//!   batch (its keys, and a row per record in the target's table as a record of what was
//!   handed over) is committed in one transaction, then acked. A batch whose handler fails is
//!   not committed and not acked.
//! * **At least once to the handler, with a stable batch id.** If the commit cannot happen
//!   (store down, worker killed), the records come again. The batch id is derived from the set
//!   of keys in the batch ([`batch_id`]), so every retry of the same batch carries the same id
//!   (retries after a store outage always do; after a crash, when the redelivered records are
//!   batched together again). A handler that remembers ids, or the record keys, is idempotent.
//! * **Bad records never reach the handler**: records the row stage dead-letters (a bad
//!   timestamp, a missing dedup key, an undecodable file line) go to the dead-letter table.
//! * The handler's error decides the retry: [`StageError::unavailable`] retries the batch as
//!   long as it takes; [`StageError::rejected`] splits the batch to find the culprit, which is
//!   dead-lettered after `max_attempts`.

use crate::flow::delivery::Delivery;
use crate::flow::stage::{Stage, StageError, TableStage};
use async_trait::async_trait;
use bytes::Bytes;
use futures::future::BoxFuture;
use sluice_dedup::DedupKey;
use sluice_store::Effect;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One record handed to a `foreach_batch` handler.
#[derive(Debug, Clone, PartialEq)]
pub struct StageRecord {
    /// Its dedup key.
    pub key: String,
    /// Pub/Sub message id (file records: the record id).
    pub message_id: String,
    /// Publish time, ms since epoch.
    pub publish_time_ms: i64,
    /// Event time, ms since epoch.
    pub event_time_ms: i64,
    /// Attributes.
    pub attributes: BTreeMap<String, String>,
    /// Payload.
    pub data: Bytes,
}

/// A batch handed to a `foreach_batch` handler.
#[derive(Debug, Clone, PartialEq)]
pub struct StagedBatch {
    /// The flow.
    pub flow: String,
    /// Stable id of the batch (see [`batch_id`]).
    pub batch_id: String,
    /// Its records, in receive order.
    pub records: Vec<StageRecord>,
}

/// The user code of a `foreach_batch` target.
pub type BatchHandler =
    Arc<dyn Fn(StagedBatch) -> BoxFuture<'static, Result<(), StageError>> + Send + Sync>;

/// The id of a batch with these keys: 32 hex digits of a 128-bit fingerprint of the sorted,
/// distinct keys. The same set of keys gives the same id, in any process.
pub fn batch_id<'a>(keys: impl IntoIterator<Item = &'a str>) -> String {
    let mut keys: Vec<&str> = keys.into_iter().collect();
    keys.sort_unstable();
    keys.dedup();
    // Length-prefixed, so that no two different sets join to the same text.
    let joined: String = keys.iter().map(|k| format!("{}:{k}", k.len())).collect();
    format!("{:032x}", DedupKey::new(joined).hash().0)
}

/// The stage of a `foreach_batch` target: rows as a `table` target would have them, and the
/// batch's good records to the handler first.
pub struct ForeachBatchStage {
    flow: String,
    rows: TableStage,
    handler: BatchHandler,
}

impl ForeachBatchStage {
    /// A stage calling `handler` for each batch of `flow`; `rows` decides event times and
    /// which records are dead letters.
    pub fn new<F, Fut>(flow: impl Into<String>, rows: TableStage, handler: F) -> Self
    where
        F: Fn(StagedBatch) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), StageError>> + Send + 'static,
    {
        Self {
            flow: flow.into(),
            rows,
            handler: Arc::new(move |batch| Box::pin(handler(batch))),
        }
    }
}

#[async_trait]
impl Stage for ForeachBatchStage {
    async fn stage(&self, deliveries: &[Delivery]) -> Result<Vec<Effect>, StageError> {
        let effects = self.rows.stage(deliveries).await?;
        let records: Vec<StageRecord> = deliveries
            .iter()
            .zip(&effects)
            .filter_map(|(delivery, effect)| match effect {
                Effect::Row { event_time_ms, .. } => Some(StageRecord {
                    key: delivery.key.as_str().to_owned(),
                    message_id: delivery.message.message_id.clone(),
                    publish_time_ms: delivery.message.publish_time_ms,
                    event_time_ms: *event_time_ms,
                    attributes: delivery.message.attributes.clone(),
                    data: delivery.message.data.clone(),
                }),
                Effect::DeadLetter { .. } => None,
            })
            .collect();
        if records.is_empty() {
            return Ok(effects);
        }
        let batch = StagedBatch {
            flow: self.flow.clone(),
            batch_id: batch_id(records.iter().map(|r| r.key.as_str())),
            records,
        };
        (self.handler)(batch).await?;
        Ok(effects)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_ids_depend_on_the_set_of_keys_only() {
        let a = batch_id(["k1", "k2", "k3"]);
        assert_eq!(a, batch_id(["k3", "k1", "k2", "k1"]));
        assert_ne!(a, batch_id(["k1", "k2"]));
        assert_ne!(batch_id(["1:a1:b"]), batch_id(["a", "b"]));
        assert_eq!(a.len(), 32);
    }
}
