//! Pub/Sub for a test: topics and subscriptions on the run's emulator, publishing, and plain
//! clients (the official crate, not sluice) that read what a subscription holds.

use crate::{PROJECT, emulator, unique};
use bytes::Bytes;
use google_cloud_pubsub::client::Subscriber;
use google_cloud_pubsub::model::Message;
use sluice_engine::PubSubConfig;
use sluice_engine::pubsub::{Admin, publish_all};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// Pub/Sub access for a test.
pub struct PubSub {
    /// Endpoint and project.
    pub config: PubSubConfig,
    /// Admin clients.
    pub admin: Admin,
}

impl PubSub {
    /// Connects to the run's emulator.
    pub async fn connect() -> Self {
        let config = PubSubConfig {
            project: Some(PROJECT.to_owned()),
            endpoint: Some(emulator().endpoint()),
        };
        let admin = Admin::connect(&config).await.unwrap();
        Self { config, admin }
    }

    /// A fresh topic and `subscriptions` subscriptions on it (ack deadline 10 s).
    pub async fn topic_with(&self, prefix: &str, subscriptions: usize) -> (String, Vec<String>) {
        let topic = unique(prefix);
        self.admin.create_topic(&topic).await.unwrap();
        let mut subs = Vec::new();
        for i in 0..subscriptions {
            let name = format!("{topic}-sub{i}");
            self.admin
                .create_subscription(&name, &topic, 10)
                .await
                .unwrap();
            subs.push(name);
        }
        (topic, subs)
    }

    /// A fresh topic and one subscription `<topic>-sub` on it with `settings` (ordering,
    /// exactly-once delivery, a dead-letter policy: the ack deadline is 10 s unless set).
    pub async fn topic_with_subscription(
        &self,
        prefix: &str,
        settings: sluice_engine::pubsub::SubscriptionSettings,
    ) -> (String, String) {
        let topic = unique(prefix);
        self.admin.create_topic(&topic).await.unwrap();
        let subscription = format!("{topic}-sub");
        let settings = sluice_engine::pubsub::SubscriptionSettings {
            ack_deadline_seconds: if settings.ack_deadline_seconds == 0 {
                10
            } else {
                settings.ack_deadline_seconds
            },
            ..settings
        };
        self.admin
            .create_subscription_with(&subscription, &topic, &settings)
            .await
            .unwrap();
        (topic, subscription)
    }

    /// Waits until `subscription` exists (a worker creates `<subscription>-tracking` for
    /// `tracking_subscription: auto` as its flow starts); panics after `within`.
    pub async fn wait_until_exists(&self, subscription: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.admin.subscription_exists(subscription).await.unwrap() {
            assert!(Instant::now() < deadline, "{subscription} never appeared");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Publishes and waits; returns the message ids.
    pub async fn publish(&self, topic: &str, messages: Vec<Message>) -> Vec<String> {
        let publisher = self.admin.publisher(topic).await.unwrap();
        publish_all(&publisher, messages).await.unwrap()
    }

    /// A plain client (no sluice) that receives and acks up to `n` messages within `within`;
    /// returns the distinct message ids it got.
    pub fn plain_receiver(
        &self,
        subscription: &str,
        n: usize,
        within: Duration,
    ) -> tokio::task::JoinHandle<HashSet<String>> {
        self.plain_client(subscription, n, within, true)
    }

    /// As [`PubSub::plain_receiver`]; with `ack: false` the messages are given back (nacked)
    /// when its stream closes.
    pub fn plain_client(
        &self,
        subscription: &str,
        n: usize,
        within: Duration,
        ack: bool,
    ) -> tokio::task::JoinHandle<HashSet<String>> {
        self.plain_client_taking(subscription, n, within, ack, |m| m.message_id.clone())
    }

    /// As [`PubSub::plain_client`], keeping `take(message)` of each distinct message id.
    pub fn plain_client_taking<T: std::hash::Hash + Eq + Send + 'static>(
        &self,
        subscription: &str,
        n: usize,
        within: Duration,
        ack: bool,
        take: fn(&google_cloud_pubsub::model::Message) -> T,
    ) -> tokio::task::JoinHandle<HashSet<T>> {
        let (_never, stop) = tokio::sync::watch::channel(false);
        self.plain_client_until(subscription, n, within, ack, take, stop)
    }

    /// As [`PubSub::plain_client_taking`], ending early too once `stop` turns true.
    pub fn plain_client_until<T: std::hash::Hash + Eq + Send + 'static>(
        &self,
        subscription: &str,
        n: usize,
        within: Duration,
        ack: bool,
        take: fn(&google_cloud_pubsub::model::Message) -> T,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<HashSet<T>> {
        let (config, subscription) = (self.config.clone(), subscription.to_owned());
        tokio::spawn(async move {
            let mut stream = plain_stream(&config, &subscription).await;
            let token = stream.shutdown_token();
            let mut ids = HashSet::new();
            let mut taken = HashSet::new();
            let mut held = Vec::new();
            let deadline = tokio::time::Instant::now() + within;
            while ids.len() < n {
                let next = tokio::select! {
                    next = tokio::time::timeout_at(deadline, stream.next()) => next,
                    // A dropped sender never stops the read.
                    Ok(_) = stop.wait_for(|stop| *stop) => break,
                };
                match next {
                    Ok(Some(Ok((message, handler)))) => {
                        if ack {
                            handler.ack();
                        } else {
                            held.push(handler);
                        }
                        if ids.insert(message.message_id.clone()) {
                            taken.insert(take(&message));
                        }
                    }
                    _ => break,
                }
            }
            drop(held);
            drop(stream);
            token.shutdown().await;
            taken
        })
    }

    /// Every message delivered on `subscription` (acked), copies included, until `n` distinct
    /// message ids have come and then nothing more for `quiet`, or until `within` passed.
    pub async fn collect_all(
        &self,
        subscription: &str,
        n: usize,
        within: Duration,
        quiet: Duration,
    ) -> Vec<google_cloud_pubsub::model::Message> {
        let mut stream = plain_stream(&self.config, subscription).await;
        let token = stream.shutdown_token();
        let mut messages = Vec::new();
        let mut ids = HashSet::new();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let until = if ids.len() >= n {
                deadline.min(tokio::time::Instant::now() + quiet)
            } else {
                deadline
            };
            match tokio::time::timeout_at(until, stream.next()).await {
                Ok(Some(Ok((message, handler)))) => {
                    handler.ack();
                    ids.insert(message.message_id.clone());
                    messages.push(message);
                }
                _ => break,
            }
        }
        drop(stream);
        token.shutdown().await;
        messages
    }
}

/// One stream of the official client on the emulator's `subscription`, with the same lease
/// extension (and so stream ack deadline) as sluice's streams.
async fn plain_stream(
    config: &PubSubConfig,
    subscription: &str,
) -> google_cloud_pubsub::subscriber::MessageStream {
    let client = Subscriber::builder()
        .with_endpoint(config.endpoint().unwrap())
        .with_credentials(google_cloud_auth::credentials::anonymous::Builder::new().build())
        .build()
        .await
        .unwrap();
    client
        .subscribe(config.subscription_path(subscription).unwrap())
        .set_max_lease_extension(Duration::from_secs(10))
        .build()
}

/// A message keyed by the `event_id` attribute, with a small JSON payload.
pub fn event(event_id: &str) -> Message {
    Message::new()
        .set_data(Bytes::from(format!("{{\"event_id\":\"{event_id}\"}}")))
        .set_attributes([("event_id", event_id.to_owned())])
}

/// `n` distinct events `e0..` plus `dups` re-publishes of random earlier ones (new message ids,
/// same `event_id`), shuffled together.
pub fn events_with_duplicates(prefix: &str, n: usize, dups: usize) -> Vec<Message> {
    use rand::seq::SliceRandom;
    let mut messages: Vec<_> = (0..n).map(|i| event(&format!("{prefix}{i}"))).collect();
    for _ in 0..dups {
        let i = rand::random_range(0..n);
        messages.push(event(&format!("{prefix}{i}")));
    }
    messages.shuffle(&mut rand::rng());
    messages
}
