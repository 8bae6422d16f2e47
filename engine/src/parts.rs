//! One Pub/Sub flow's settings and the parts they make: the library's jobs and the worker's
//! Pub/Sub flows are assembled here, so both get the same defaults ([`crate::defaults`]) and
//! the same wiring (the client's max lease and pause threshold from the dedup window, the
//! commit bound, the subscription's start-up warnings).

use crate::defaults;
use crate::flow::batcher::{BatchSettings, DedupSettings, KeySource};
use crate::flow::budget::Budget;
use crate::flow::commit::RetrySettings;
use crate::flow::commit_bound::{commit_bound, pause_threshold};
use crate::flow::stage::TableStage;
use crate::source::SourceError;
use crate::source::pubsub::{FlowIntent, PubSubConfig, PubSubSource};

/// A Pub/Sub flow's settings, each with its default ([`PubSubFlow::new`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PubSubFlow {
    /// Where Pub/Sub is.
    pub pubsub: PubSubConfig,
    /// The subscription (short name or full path).
    pub subscription: String,
    /// Streaming-pull streams (default [`defaults::STREAMS`]).
    pub streams: usize,
    /// The dedup key and window (default: message id, [`defaults::DEDUP_WINDOW`]).
    pub dedup: DedupSettings,
    /// Event times from this attribute (default: the publish time).
    pub event_time_attribute: Option<String>,
    /// A bad event-time attribute takes the publish time instead of a dead letter.
    pub bad_timestamp_uses_publish_time: bool,
    /// Batch bounds (default [`defaults::BATCH_MAX_MESSAGES`], [`defaults::BATCH_MAX_DELAY`]).
    pub batch: BatchSettings,
    /// Messages and bytes held between receipt and ack (default
    /// [`defaults::MAX_OUTSTANDING_MESSAGES`], [`defaults::MAX_OUTSTANDING_BYTES`]).
    pub max_outstanding: (usize, u64),
    /// Attempts before a failing message is dead-lettered (default [`defaults::MAX_ATTEMPTS`]).
    pub max_attempts: u32,
    /// What the flow does with its messages, for the warnings at start.
    pub intent: FlowIntent,
}

impl PubSubFlow {
    /// A flow reading `subscription` with every default.
    pub fn new(subscription: impl Into<String>) -> Self {
        Self {
            pubsub: PubSubConfig::default(),
            subscription: subscription.into(),
            streams: defaults::STREAMS,
            dedup: DedupSettings {
                key: KeySource::MessageId,
                window: defaults::DEDUP_WINDOW,
            },
            event_time_attribute: None,
            bad_timestamp_uses_publish_time: false,
            batch: BatchSettings {
                max_messages: defaults::BATCH_MAX_MESSAGES,
                max_delay: defaults::BATCH_MAX_DELAY,
            },
            max_outstanding: (
                defaults::MAX_OUTSTANDING_MESSAGES,
                defaults::MAX_OUTSTANDING_BYTES,
            ),
            max_attempts: defaults::MAX_ATTEMPTS,
            intent: FlowIntent::default(),
        }
    }

    /// The parts a flow of these settings reads and commits with.
    ///
    /// # Errors
    /// The subscription's name is not one ([`SourceError::Name`]).
    pub fn parts(&self) -> Result<FlowParts, SourceError> {
        let window = self.dedup.window;
        let intent = FlowIntent {
            dedup_by_message_id: matches!(self.dedup.key, KeySource::MessageId),
            ..self.intent
        };
        let source = PubSubSource::new(self.pubsub.clone(), &self.subscription, self.streams)?
            .with_max_lease(window)
            .with_pause_threshold(pause_threshold(window))
            .with_intent(intent);
        Ok(FlowParts {
            source,
            budget: Budget::new(self.max_outstanding.0, self.max_outstanding.1),
            dedup: self.dedup.clone(),
            batch: self.batch,
            stage: TableStage {
                event_time_attribute: self.event_time_attribute.clone(),
                bad_timestamp_uses_publish_time: self.bad_timestamp_uses_publish_time,
                fields: None,
                dedup_attribute: match &self.dedup.key {
                    KeySource::Attribute { name, .. } => Some(name.clone()),
                    KeySource::MessageId => None,
                },
            },
            retry: RetrySettings {
                max_attempts: self.max_attempts,
                dedup_window: window,
                commit_bound: Some(commit_bound(window)),
                give_up_after: None,
            },
        })
    }
}

/// The pieces of a Pub/Sub flow ([`PubSubFlow::parts`]).
#[non_exhaustive]
pub struct FlowParts {
    /// The subscription's source.
    pub source: PubSubSource,
    /// Its flow-control bound.
    pub budget: Budget,
    /// Its dedup key and window.
    pub dedup: DedupSettings,
    /// Its batch bounds.
    pub batch: BatchSettings,
    /// Its first stage (event times, dead letters for what cannot be keyed or timed).
    pub stage: TableStage,
    /// Its retries and commit bound.
    pub retry: RetrySettings,
}
