//! Topic and subscription administration and bulk publishing, for the demo, the benchmarks and
//! the tests (and for users who want sluice to create what it reads).

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
    config: PubSubConfig,
    topics: TopicAdmin,
    subscriptions: SubscriptionAdmin,
}

/// Admin calls retry transient errors for about this long, then report them.
const ADMIN_RETRY_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

fn admin_retry_policy() -> impl RetryPolicy {
    Aip194Strict.with_time_limit(ADMIN_RETRY_LIMIT)
}

fn rpc(error: impl std::fmt::Display) -> SourceError {
    SourceError::Rpc(error.to_string())
}

fn is_not_found(error: &google_cloud_gax::error::Error) -> bool {
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
fn is_refusal(error: &google_cloud_gax::error::Error) -> bool {
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

/// Logs what [`Admin::ensure_tracking_subscription`] did for `flow`: nothing for a tracking
/// subscription that was there already.
pub fn log_tracking_start(flow: &str, tracking: &str, start: &TrackingStart) {
    match start {
        TrackingStart::Existing => {}
        TrackingStart::FromBacklog => tracing::info!(
            flow,
            subscription = tracking,
            "the tracking subscription starts at the base subscription's backlog"
        ),
        TrackingStart::FromNow(reason) => tracing::warn!(
            flow,
            subscription = tracking,
            reason,
            "the tracking subscription does not start at the base subscription's backlog \
             (Pub/Sub refused its snapshot): messages waiting there now are not tracked, and \
             the watermark may pass them"
        ),
    }
}

/// What [`Admin::seek_to_start`] found.
enum SeekToStart {
    /// No start snapshot: the subscription was started already (or never had one).
    NoSnapshot,
    /// Seeked to the start snapshot.
    Seeked,
    /// Pub/Sub refused to read or seek to the snapshot (the reason).
    Refused(String),
}

/// How [`Admin::ensure_tracking_subscription`] left a tracking subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrackingStart {
    /// It existed and was started already (by an earlier run or another replica).
    Existing,
    /// It starts at the base subscription's backlog: what the base subscription had not acked
    /// when it was created is tracked, and everything published since.
    FromBacklog,
    /// It was created, but the base subscription's snapshot was refused (the reason): what
    /// waits in the base subscription is not tracked, only what is published from now on.
    FromNow(String),
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

    /// Makes sure `tracking` exists (`tracking_subscription: auto`): if missing, creates it on
    /// the topic of `base`, with the same filter (and the probes, [`tracking_filter`]), so it
    /// sees the same messages, and starts it at
    /// `base`'s backlog, so messages already waiting in `base` are tracked too:
    ///
    /// 1. a snapshot of `base` is taken (`<tracking>-start`): it keeps what `base` has not acked
    ///    and everything published after it;
    /// 2. the tracking subscription is created;
    /// 3. it is seeked to the snapshot, which is then deleted.
    ///
    /// Replicas may run this at once, and one may stop anywhere: whoever finds the tracking
    /// subscription together with its start snapshot (made before the subscription, deleted
    /// only after a seek) seeks it before going on, so no reader reads it before it was moved
    /// to `base`'s backlog. A seek repeated by another replica only delivers tracked messages
    /// again, which progress records once. If the snapshot cannot be taken (Pub/Sub refuses
    /// it, e.g. when `base`'s oldest message expires within the hour, or the caller may not
    /// create snapshots) or the seek is refused, the subscription is created anyway and tracks
    /// from now on ([`TrackingStart::FromNow`]).
    pub async fn ensure_tracking_subscription(
        &self,
        base: &str,
        tracking: &str,
    ) -> Result<TrackingStart, SourceError> {
        let snapshot = self.start_snapshot_path(tracking)?;
        if self.subscription_exists(tracking).await? {
            return Ok(match self.seek_to_start(tracking, &snapshot).await? {
                SeekToStart::NoSnapshot => TrackingStart::Existing,
                SeekToStart::Seeked => TrackingStart::FromBacklog,
                SeekToStart::Refused(reason) => TrackingStart::FromNow(reason),
            });
        }
        let found = self
            .subscriptions
            .get_subscription()
            .set_subscription(self.config.subscription_path(base)?)
            .send()
            .await
            .map_err(rpc)?;
        let snapshotted = self
            .subscriptions
            .create_snapshot()
            .set_name(&snapshot)
            .set_subscription(self.config.subscription_path(base)?)
            .send()
            .await;
        let refused = match snapshotted {
            Ok(_) => None,
            Err(e) if e.status().is_some_and(|s| s.code == Code::AlreadyExists) => None,
            Err(e) if is_refusal(&e) => Some(e.to_string()),
            Err(e) => return Err(rpc(e)),
        };
        let created = self
            .subscriptions
            .create_subscription()
            .set_name(self.config.subscription_path(tracking)?)
            .set_topic(found.topic)
            .set_filter(tracking_filter(&found.filter))
            .set_ack_deadline_seconds(found.ack_deadline_seconds.max(10))
            // Keeps messages as long as `base` does (unacked ones too: a tracking reader down
            // longer than a shorter retention would lose what the base still holds, and the
            // watermark would pass it), and keeps acked ones, so a reader that starts seeks it
            // back to the stored horizon and `reset --seek` replays both alike.
            .set_retain_acked_messages(true)
            .set_or_clear_message_retention_duration(found.message_retention_duration)
            .send()
            .await;
        match created {
            Ok(_) => {}
            // Another replica created it meanwhile.
            Err(e) if e.status().is_some_and(|s| s.code == Code::AlreadyExists) => {}
            Err(e) => return Err(rpc(e)),
        }
        if let Some(reason) = refused {
            return Ok(TrackingStart::FromNow(reason));
        }
        Ok(match self.seek_to_start(tracking, &snapshot).await? {
            // Another replica seeked it meanwhile, or this one did.
            SeekToStart::NoSnapshot | SeekToStart::Seeked => TrackingStart::FromBacklog,
            SeekToStart::Refused(reason) => TrackingStart::FromNow(reason),
        })
    }

    /// `projects/P/snapshots/<tracking>-start`: the snapshot a new tracking subscription starts
    /// from.
    fn start_snapshot_path(&self, tracking: &str) -> Result<String, SourceError> {
        let path = self.config.subscription_path(tracking)?;
        Ok(format!(
            "{}-start",
            path.replacen("/subscriptions/", "/snapshots/", 1)
        ))
    }

    /// Seeks `tracking` to its start snapshot and deletes the snapshot, if the snapshot is
    /// still there. A snapshot that cannot be deleted (refused) is left to expire; the next
    /// start seeks to it again, which only delivers tracked messages again.
    async fn seek_to_start(
        &self,
        tracking: &str,
        snapshot: &str,
    ) -> Result<SeekToStart, SourceError> {
        let found = self
            .subscriptions
            .get_snapshot()
            .set_snapshot(snapshot)
            .send()
            .await;
        match found {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => return Ok(SeekToStart::NoSnapshot),
            Err(e) if is_refusal(&e) => return Ok(SeekToStart::Refused(e.to_string())),
            Err(e) => return Err(rpc(e)),
        }
        let seeked = self
            .subscriptions
            .seek()
            .set_subscription(self.config.subscription_path(tracking)?)
            .set_snapshot(snapshot)
            .send()
            .await;
        match seeked {
            Ok(_) => {}
            // Another replica seeked and deleted it meanwhile.
            Err(e) if is_not_found(&e) => return Ok(SeekToStart::NoSnapshot),
            Err(e) if is_refusal(&e) => return Ok(SeekToStart::Refused(e.to_string())),
            Err(e) => return Err(rpc(e)),
        }
        let deleted = self
            .subscriptions
            .delete_snapshot()
            .set_snapshot(snapshot)
            .send()
            .await;
        match deleted {
            Ok(_) => Ok(SeekToStart::Seeked),
            Err(e) if is_not_found(&e) || is_refusal(&e) => Ok(SeekToStart::Seeked),
            Err(e) => Err(rpc(e)),
        }
    }

    /// The topic `tracking` reads, after checking that it sees what `base` sees: the same
    /// topic, and the filter [`tracking_filter`] makes of `base`'s (its messages and the
    /// probes). A tracking subscription on another topic, or with another filter, would count
    /// messages the flow never reads (the watermark would hold for ever), miss messages it
    /// reads (it would run ahead of them) or drop the probes: refused ([`SourceError::Name`]).
    pub async fn tracking_topic(&self, base: &str, tracking: &str) -> Result<String, SourceError> {
        let (base_path, tracking_path) = (
            self.config.subscription_path(base)?,
            self.config.subscription_path(tracking)?,
        );
        if base_path == tracking_path {
            return Err(SourceError::Name(format!(
                "the tracking subscription {tracking_path} is the flow's own subscription"
            )));
        }
        let get = |path: String| {
            self.subscriptions
                .get_subscription()
                .set_subscription(path)
                .send()
        };
        let base_found = get(base_path.clone()).await.map_err(rpc)?;
        let tracking_found = get(tracking_path.clone()).await.map_err(rpc)?;
        if base_found.topic != tracking_found.topic {
            return Err(SourceError::Name(format!(
                "the tracking subscription {tracking_path} reads topic {}, but the flow's \
                 subscription {base_path} reads {}: it must be on the same topic",
                tracking_found.topic, base_found.topic
            )));
        }
        let expected = tracking_filter(&base_found.filter);
        if tracking_found.filter != expected {
            return Err(SourceError::Name(format!(
                "the tracking subscription {tracking_path} has filter {:?}, but the flow's \
                 subscription {base_path} has {:?}: it must have the filter {expected:?} (the \
                 same messages, and the reader's probes); a filter cannot be changed, so delete \
                 it (an `auto` one is made again) or create it with that filter",
                tracking_found.filter, base_found.filter
            )));
        }
        Ok(base_found.topic)
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

/// The filter of a tracking subscription for a base subscription with `base_filter`: the same
/// messages, and the tracking reader's probes ([`super::PROBE_ATTRIBUTE`]) whatever the base
/// filter says (no filter: no filter).
pub fn tracking_filter(base_filter: &str) -> String {
    if base_filter.trim().is_empty() {
        String::new()
    } else {
        format!("({base_filter}) OR attributes:{}", super::PROBE_ATTRIBUTE)
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
