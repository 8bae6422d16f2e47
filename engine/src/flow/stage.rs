//! The first fused stage: from deliveries to the effects a commit writes.

use crate::flow::decode::{PayloadDecoder, UNDECODABLE};
use crate::flow::delivery::Delivery;
use crate::flow::event_time::{EventTimeError, parse_event_time};
use async_trait::async_trait;
use sluice_store::Effect;
use std::sync::Arc;

/// A stage failed for a whole batch.
///
/// * [`StageError::rejected`] (the data is at fault): a batch of several is split into single
///   messages; a single uses one attempt per failure, and one that fails `max_attempts` times
///   is dead-lettered with reason `max_attempts`.
/// * [`StageError::unavailable`] (a remote stage is down or timed out): the whole batch is
///   retried with backoff, as long as it takes, charging no attempt; nothing is acked
///   meanwhile (like a store outage).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stage {}: {message}", if *.transient { "unavailable" } else { "failed" })]
pub struct StageError {
    /// What went wrong.
    pub message: String,
    /// Whether retrying the same batch later may work without any change to it.
    pub transient: bool,
}

impl StageError {
    /// The batch's data made the stage fail.
    pub fn rejected(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            transient: false,
        }
    }

    /// The stage could not be reached or did not answer in time.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            transient: true,
        }
    }
}

/// Maps each delivery of a batch to its effect. Per-message problems that retrying cannot fix
/// (a bad timestamp) are returned as [`Effect::DeadLetter`]; an `Err` is a failure worth a
/// retry (a remote stage down).
#[async_trait]
pub trait Stage: Send + Sync + 'static {
    /// One effect per delivery, in order.
    async fn stage(&self, deliveries: &[Delivery]) -> Result<Vec<Effect>, StageError>;
}

/// The stage of a `table` target: a row per message, with its event time from an attribute or
/// the publish time, and for a typed table its payload decoded into the flow's fields (a
/// payload that does not decode is a dead letter, `undecodable`, naming the field).
#[derive(Debug, Clone, Default)]
pub struct TableStage {
    /// `event_time.attribute`; `None`: the publish time.
    pub event_time_attribute: Option<String>,
    /// `on_bad_timestamp: publish_time` — use the publish time instead of dead-lettering.
    pub bad_timestamp_uses_publish_time: bool,
    /// A typed flow's decoder (`decode:`); `None`: envelope rows.
    pub fields: Option<Arc<dyn PayloadDecoder>>,
    /// `dedup.attribute`, named in the dead letter of a message without it.
    pub dedup_attribute: Option<String>,
}

impl TableStage {
    fn effect(&self, delivery: &Delivery) -> Effect {
        let effect = self.envelope_effect(delivery);
        match (&self.fields, effect) {
            (Some(fields), Effect::Row { event_time_ms, .. }) => {
                match fields.decode(&delivery.message) {
                    Ok(values) => Effect::Row {
                        event_time_ms,
                        values,
                    },
                    Err(why) => dead_letter(UNDECODABLE, why, delivery),
                }
            }
            (_, effect) => effect,
        }
    }

    fn envelope_effect(&self, delivery: &Delivery) -> Effect {
        if let Some(reason) = delivery.key_problem {
            let error = match &self.dedup_attribute {
                Some(attribute) => format!(
                    "no dedup attribute `{attribute}` in message {:?} (dedup.on_missing: \
                     dead_letter)",
                    delivery.message.message_id
                ),
                None => format!("no dedup key in {:?}", delivery.message.message_id),
            };
            return dead_letter(reason, error, delivery);
        }
        if let Some(problem) = &delivery.message.problem {
            return dead_letter(problem.reason, problem.error.clone(), delivery);
        }
        if let Some(event_time_ms) = delivery.message.event_time_ms {
            return Effect::row(event_time_ms);
        }
        let Some(name) = &self.event_time_attribute else {
            return Effect::row(delivery.message.publish_time_ms);
        };
        let parsed = match delivery.message.attributes.get(name) {
            None => Err(EventTimeError::Missing(name.clone())),
            Some(value) => parse_event_time(value).ok_or_else(|| EventTimeError::Unparseable {
                name: name.clone(),
                value: value.clone(),
            }),
        };
        match parsed {
            Ok(event_time_ms) => Effect::row(event_time_ms),
            Err(_) if self.bad_timestamp_uses_publish_time => {
                Effect::row(delivery.message.publish_time_ms)
            }
            Err(error) => dead_letter("bad_timestamp", error.to_string(), delivery),
        }
    }
}

fn dead_letter(reason: &str, error: String, delivery: &Delivery) -> Effect {
    Effect::DeadLetter {
        reason: reason.to_owned(),
        error,
        attempts: delivery.attempts + 1,
    }
}

#[async_trait]
impl Stage for TableStage {
    async fn stage(&self, deliveries: &[Delivery]) -> Result<Vec<Effect>, StageError> {
        if let Some(fields) = &self.fields {
            let messages: Vec<_> = deliveries.iter().map(|d| &d.message).collect();
            fields
                .prepare(&messages)
                .await
                .map_err(StageError::unavailable)?;
        }
        Ok(deliveries.iter().map(|d| self.effect(d)).collect())
    }
}
