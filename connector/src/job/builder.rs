//! A job's settings: [`JobBuilder`], each knob with the default `sluice run` gives a Pub/Sub
//! flow. Building it (opening the store) is in `run.rs`, with the job it makes.

use super::dedup::Dedup;
use sluice_engine::{BatchSettings, DedupSettings, PubSubConfig, PubSubFlow};
use std::time::Duration;

/// A job's settings, each with the default `sluice run` gives a Pub/Sub flow
/// ([`defaults`](sluice_engine::defaults)). Every knob, set:
///
/// ```no_run
/// # async fn job() -> Result<(), sluice_connector::JobError> {
/// use sluice_connector::prelude::*;
/// use std::time::Duration;
/// let job = Job::builder("projects/my-project/subscriptions/orders")
///     .name("orders_counts")
///     .pubsub(PubSubConfig::default())
///     .dedup(Dedup::by_attribute("order_id").window(Duration::from_secs(1800)))
///     .store("postgres://jobs@db.internal/jobs")
///     .event_time_attribute("ts")
///     .bad_timestamp_uses_publish_time()
///     .watermark(Duration::from_secs(30))
///     .batch(500, Duration::from_millis(20))
///     .flow_control(20_000, 256 * 1024 * 1024)
///     .max_attempts(3)
///     .streams(4)
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct JobBuilder {
    /// The flow's settings, each defaulting as a pipeline file's Pub/Sub flow does.
    pub(super) flow: PubSubFlow,
    pub(super) name: String,
    pub(super) dedup: Dedup,
    pub(super) store: Option<String>,
    pub(super) watermark_band: Option<Duration>,
}

impl JobBuilder {
    /// A job reading `subscription` (`projects/P/subscriptions/S`, or a short name with the
    /// project from [`PubSubConfig`]).
    pub fn new(subscription: impl Into<String>) -> Self {
        Self {
            flow: PubSubFlow::new(subscription),
            name: "job".to_owned(),
            dedup: Dedup::by_message_id(),
            store: None,
            watermark_band: None,
        }
    }

    /// The job's name (an identifier, default `job`): its ledger and dead letters are kept
    /// under it in the store, so two jobs sharing a store need two names.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Where Pub/Sub is (default: `PUBSUB_EMULATOR_HOST` if set, else the real service with
    /// Application Default Credentials; the project, when neither this config nor the
    /// environment names one, is the one those credentials name).
    pub fn pubsub(mut self, config: PubSubConfig) -> Self {
        self.flow.pubsub = config;
        self
    }

    /// How copies are recognised (default: by message id, 10 minutes).
    pub fn dedup(mut self, dedup: Dedup) -> Self {
        self.flow.dedup = DedupSettings {
            key: dedup.key.clone(),
            window: dedup.window,
        };
        self.dedup = dedup;
        self
    }

    /// The store: `sqlite://PATH` or `postgres://...` (default `sqlite://state/<name>.db`).
    pub fn store(mut self, url: impl Into<String>) -> Self {
        self.store = Some(url.into());
        self
    }

    /// Take event times from this attribute (ms since the epoch or RFC 3339; a bad one is
    /// dead-lettered); default: the publish time.
    pub fn event_time_attribute(mut self, name: impl Into<String>) -> Self {
        self.flow.event_time_attribute = Some(name.into());
        self
    }

    /// A message whose event-time attribute cannot be read takes its publish time instead of
    /// being dead-lettered (`on_bad_timestamp: publish_time`).
    pub fn bad_timestamp_uses_publish_time(mut self) -> Self {
        self.flow.bad_timestamp_uses_publish_time = true;
        self
    }

    /// Keep an event-time watermark, with this band (event times trail publish times by at
    /// most it), through the tracking subscription `<subscription>-tracking`, created if
    /// missing; [`NewMessages::watermark`](super::message::NewMessages::watermark) shows it.
    pub fn watermark(mut self, band: Duration) -> Self {
        self.watermark_band = Some(band);
        self
    }

    /// Batches of at most `max_messages`, waiting at most `max_delay` to fill (default 1000,
    /// 50 ms).
    pub fn batch(mut self, max_messages: usize, max_delay: Duration) -> Self {
        self.flow.batch = BatchSettings {
            max_messages: max_messages.max(1),
            max_delay,
        };
        self
    }

    /// Hold at most this many messages and bytes between receipt and ack (default 10 000,
    /// 100 MiB).
    pub fn flow_control(mut self, max_messages: usize, max_bytes: u64) -> Self {
        self.flow.max_outstanding = (max_messages.max(1), max_bytes.max(1));
        self
    }

    /// Dead-letter a message after this many failed attempts (default 5).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.flow.max_attempts = attempts.max(1);
        self
    }

    /// Streaming-pull streams (default 16).
    pub fn streams(mut self, streams: usize) -> Self {
        self.flow.streams = streams.max(1);
        self
    }

    /// The store URL this job uses.
    pub(super) fn store_url(&self) -> String {
        self.store
            .clone()
            .unwrap_or_else(|| format!("sqlite://state/{}.db", self.name))
    }
}
