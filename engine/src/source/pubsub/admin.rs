//! Topic and subscription administration and bulk publishing, for the demo, the benchmarks and
//! the tests (and for users who want sluice to create what it reads). The tracking
//! subscription's own calls are in `tracking_subscription.rs`.
//!
//! Guarantee: admin calls retry transient errors for [`ADMIN_RETRY_LIMIT`], then report them;
//! a refusal of the worker's identity names the permissions it needs.

use super::PubSubConfig;
use crate::source::SourceError;
use google_cloud_gax::error::rpc::Code;
use google_cloud_gax::retry_policy::{Aip194Strict, RetryPolicy, RetryPolicyExt};
use google_cloud_pubsub::client::{Publisher, SubscriptionAdmin, TopicAdmin};
use google_cloud_pubsub::model::Message;

/// What a subscription [`Admin::create_subscription_with`] creates has (tests and the bench
/// make subscriptions with Pub/Sub's features; sluice itself creates only tracking ones).
#[derive(Debug, Clone, Default)]
pub struct SubscriptionSettings {
    /// Seconds a delivery may wait for its ack before Pub/Sub redelivers it.
    pub ack_deadline_seconds: i32,
    /// Keep acked messages (for seeks back in time).
    pub retain_acked_messages: bool,
    /// Exactly-once delivery: acks are confirmed.
    pub exactly_once_delivery: bool,
    /// Messages of one ordering key delivered in publish order.
    pub message_ordering: bool,
    /// A dead-letter policy: the topic and the delivery attempts before a message goes there.
    pub dead_letter: Option<(String, i32)>,
    /// A filter on attributes.
    pub filter: Option<String>,
}

/// Admin clients for one endpoint.
#[derive(Debug, Clone)]
pub struct Admin {
    pub(super) config: PubSubConfig,
    topics: TopicAdmin,
    pub(super) subscriptions: SubscriptionAdmin,
}

/// Admin calls retry transient errors for about this long, then report them.
const ADMIN_RETRY_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

fn admin_retry_policy() -> impl RetryPolicy {
    Aip194Strict.with_time_limit(ADMIN_RETRY_LIMIT)
}

pub(super) fn rpc(error: impl std::fmt::Display) -> SourceError {
    SourceError::Rpc(error.to_string())
}

pub(super) fn is_not_found(error: &google_cloud_gax::error::Error) -> bool {
    error.status().is_some_and(|s| s.code == Code::NotFound)
        || error.http_status_code() == Some(404)
}

/// Pub/Sub refused who is asking: no valid credentials, or a missing permission.
fn is_identity_refusal(error: &google_cloud_gax::error::Error) -> bool {
    error
        .status()
        .is_some_and(|s| matches!(s.code, Code::PermissionDenied | Code::Unauthenticated))
        || matches!(error.http_status_code(), Some(401 | 403))
}

/// Pub/Sub answered and said no (as opposed to not answering): retrying will not help.
pub(super) fn is_refusal(error: &google_cloud_gax::error::Error) -> bool {
    error.status().is_some_and(|s| {
        matches!(
            s.code,
            Code::FailedPrecondition
                | Code::PermissionDenied
                | Code::InvalidArgument
                | Code::Unimplemented
                | Code::ResourceExhausted
        )
    })
}

macro_rules! configure {
    ($builder:expr, $config:expr) => {{
        let mut builder = $builder;
        if let Some(endpoint) = $config.endpoint() {
            builder = builder.with_endpoint(endpoint);
        }
        if let Some(credentials) = $config.credentials() {
            builder = builder.with_credentials(credentials);
        }
        builder
    }};
}

impl Admin {
    /// Builds the admin clients.
    pub async fn connect(config: &PubSubConfig) -> Result<Self, SourceError> {
        let topics = configure!(TopicAdmin::builder(), config)
            .with_retry_policy(admin_retry_policy())
            .build()
            .await
            .map_err(|e| SourceError::Client(e.to_string()))?;
        let subscriptions = configure!(SubscriptionAdmin::builder(), config)
            .with_retry_policy(admin_retry_policy())
            .build()
            .await
            .map_err(|e| SourceError::Client(e.to_string()))?;
        Ok(Self {
            config: config.clone(),
            topics,
            subscriptions,
        })
    }

    /// The configuration these clients use.
    pub fn config(&self) -> &PubSubConfig {
        &self.config
    }

    /// Creates a topic (short name or path); returns its path.
    pub async fn create_topic(&self, topic: &str) -> Result<String, SourceError> {
        let path = self.config.topic_path(topic)?;
        self.topics
            .create_topic()
            .set_name(&path)
            .send()
            .await
            .map_err(rpc)?;
        Ok(path)
    }

    /// Creates a subscription on a topic with an ack deadline; returns its path.
    pub async fn create_subscription(
        &self,
        subscription: &str,
        topic: &str,
        ack_deadline_seconds: i32,
    ) -> Result<String, SourceError> {
        self.create(subscription, topic, ack_deadline_seconds, false)
            .await
    }

    /// Creates a subscription that keeps acked messages (7 days by default), so that it can be
    /// seeked back in time (`sluice reset FLOW --seek`); returns its path.
    pub async fn create_replayable_subscription(
        &self,
        subscription: &str,
        topic: &str,
        ack_deadline_seconds: i32,
    ) -> Result<String, SourceError> {
        self.create(subscription, topic, ack_deadline_seconds, true)
            .await
    }

    async fn create(
        &self,
        subscription: &str,
        topic: &str,
        ack_deadline_seconds: i32,
        retain_acked_messages: bool,
    ) -> Result<String, SourceError> {
        let settings = SubscriptionSettings {
            ack_deadline_seconds,
            retain_acked_messages,
            ..SubscriptionSettings::default()
        };
        self.create_subscription_with(subscription, topic, &settings)
            .await
    }

    /// Creates a subscription with the features of `settings`; returns its path.
    pub async fn create_subscription_with(
        &self,
        subscription: &str,
        topic: &str,
        settings: &SubscriptionSettings,
    ) -> Result<String, SourceError> {
        let path = self.config.subscription_path(subscription)?;
        let mut create = self
            .subscriptions
            .create_subscription()
            .set_name(&path)
            .set_topic(self.config.topic_path(topic)?)
            .set_ack_deadline_seconds(settings.ack_deadline_seconds)
            .set_retain_acked_messages(settings.retain_acked_messages)
            .set_enable_exactly_once_delivery(settings.exactly_once_delivery)
            .set_enable_message_ordering(settings.message_ordering);
        if let Some(filter) = &settings.filter {
            create = create.set_filter(filter);
        }
        if let Some((dead_letter_topic, max_delivery_attempts)) = &settings.dead_letter {
            create = create.set_dead_letter_policy(
                google_cloud_pubsub::model::DeadLetterPolicy::new()
                    .set_dead_letter_topic(self.config.topic_path(dead_letter_topic)?)
                    .set_max_delivery_attempts(*max_delivery_attempts),
            );
        }
        create.send().await.map_err(rpc)?;
        Ok(path)
    }

    /// Seeks a subscription to a time (ms since epoch): messages published since then are
    /// delivered again, acked ones too when the subscription retains them.
    pub async fn seek_to_time(&self, subscription: &str, time_ms: i64) -> Result<(), SourceError> {
        let time = google_cloud_wkt::Timestamp::new(
            time_ms.div_euclid(1000),
            (time_ms.rem_euclid(1000) * 1_000_000) as i32,
        )
        .map_err(|e| SourceError::Name(format!("cannot seek to {time_ms} ms: {e}")))?;
        self.subscriptions
            .seek()
            .set_subscription(self.config.subscription_path(subscription)?)
            .set_time(time)
            .send()
            .await
            .map_err(rpc)?;
        Ok(())
    }

    /// How far back a seek of this subscription can replay acked messages: `None` when it
    /// does not retain acked messages (a seek then replays only what is still unacked), else
    /// its message retention (7 days when unset).
    pub async fn replay_window(
        &self,
        subscription: &str,
    ) -> Result<Option<std::time::Duration>, SourceError> {
        let found = self
            .subscriptions
            .get_subscription()
            .set_subscription(self.config.subscription_path(subscription)?)
            .send()
            .await
            .map_err(rpc)?;
        if !found.retain_acked_messages {
            return Ok(None);
        }
        let retention = found
            .message_retention_duration
            .map(|d| std::time::Duration::from_secs(u64::try_from(d.seconds()).unwrap_or(0)))
            .filter(|d| !d.is_zero())
            .unwrap_or(std::time::Duration::from_secs(7 * 24 * 3600));
        Ok(Some(retention))
    }

    /// Whether a subscription exists. `Err` when Pub/Sub cannot be asked (unreachable).
    pub async fn subscription_exists(&self, subscription: &str) -> Result<bool, SourceError> {
        Ok(self.subscription(subscription).await?.is_some())
    }

    /// The subscription as Pub/Sub describes it (`None`: it does not exist); a refusal of the
    /// worker's identity names the permissions it needs.
    pub async fn subscription(
        &self,
        subscription: &str,
    ) -> Result<Option<google_cloud_pubsub::model::Subscription>, SourceError> {
        let result = self
            .subscriptions
            .get_subscription()
            .set_subscription(self.config.subscription_path(subscription)?)
            .send()
            .await;
        match result {
            Ok(found) => Ok(Some(found)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) if is_identity_refusal(&e) => Err(SourceError::Refused(format!(
                "Pub/Sub refused to read subscription {subscription}: {e}. The worker's \
                 identity needs pubsub.subscriptions.get (roles/pubsub.viewer) and \
                 pubsub.subscriptions.consume (roles/pubsub.subscriber) on it"
            ))),
            Err(e) => Err(rpc(e)),
        }
    }

    /// Whether a topic exists (`sluice check`); a refusal of the worker's identity names the
    /// permission it needs.
    pub async fn topic_exists(&self, topic: &str) -> Result<bool, SourceError> {
        let result = self
            .topics
            .get_topic()
            .set_topic(self.config.topic_path(topic)?)
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) if is_identity_refusal(&e) => Err(SourceError::Refused(format!(
                "Pub/Sub refused to read topic {topic}: {e}. The worker's identity needs \
                 pubsub.topics.get (roles/pubsub.viewer) on it"
            ))),
            Err(e) => Err(rpc(e)),
        }
    }

    /// A publisher for a topic, batching up to 1000 messages or 5 ms.
    pub async fn publisher(&self, topic: &str) -> Result<Publisher, SourceError> {
        let path = self.config.topic_path(topic)?;
        configure!(Publisher::builder(path), self.config)
            .set_message_count_threshold(1000u32)
            .set_delay_threshold(std::time::Duration::from_millis(5))
            .build()
            .await
            .map_err(|e| SourceError::Client(e.to_string()))
    }
}

/// Publishes every message and waits for all of them; returns their message ids in order.
/// Publishes are issued together and awaited afterwards (awaiting one at a time is ~100× slower).
pub async fn publish_all(
    publisher: &Publisher,
    messages: impl IntoIterator<Item = Message>,
) -> Result<Vec<String>, SourceError> {
    let pending: Vec<_> = messages.into_iter().map(|m| publisher.publish(m)).collect();
    let mut ids = Vec::with_capacity(pending.len());
    for result in futures::future::join_all(pending).await {
        ids.push(result.map_err(rpc)?);
    }
    Ok(ids)
}
