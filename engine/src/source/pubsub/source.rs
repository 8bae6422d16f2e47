//! The streaming-pull source: several long-lived streams on one subscription, each a task that
//! takes a budget permit before it asks for the next message.
//!
//! Stream lifecycle (see the emulator notes on closing order): a stream task stops by dropping
//! its `MessageStream` (which closes the gRPC stream at once) while keeping its shutdown token;
//! the handlers it handed out stay valid (shutdown behaviour `WaitForProcessing`: the client keeps
//! extending their leases and still sends their acks), and [`SourceHandle::close`] awaits the
//! tokens after every handler has been settled.
//!
//! Watermark probes ([`super::is_probe`]) are acked, counted (`sluice_probes_dropped_total`)
//! and dropped as they arrive, unless the source delivers them
//! ([`PubSubSource::delivering_probes`], the tracking reader). Data that carries
//! [`PROBE_ATTRIBUTE`] without being a probe is delivered with a problem, and dead-lettered
//! (`reserved_attribute`, see `probe.rs`).
//!
//! Each stream's own flow control (what the client asks the service to push ahead) is set to
//! its share of the flow's budget, so the service never buffers more than the budget in the
//! client. A stream that lived through a pause of the process gives back what it reads after it
//! and is reopened (`pause.rs`).

use super::ack::{AckLabels, PendingAcks, PubSubAck, register_ack_failures};
use super::pause::{Epoch, PauseWatch};
use super::reachability::Reachability;
use super::running::RunningPubSub;
use super::settings::FlowIntent;
use super::{PROBE_ATTRIBUTE, PubSubConfig, is_probe, reserved_attribute_problem};
use crate::backoff::Backoff;
use crate::flow::ack_fence::AckFence;
use crate::flow::budget::Budget;
use crate::flow::delivery::SourceMessage;
use crate::source::SourceError;
use crate::source::{MessageSource, Received, SourceHandle};
use async_trait::async_trait;
use google_cloud_gax::error::rpc::Code;
use google_cloud_pubsub::client::Subscriber;
use google_cloud_pubsub::model::Message;
use google_cloud_pubsub::subscriber::ShutdownToken;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The client stops extending a held message's lease after this long, unless the source is given
/// its own ([`PubSubSource::with_max_lease`]; the worker gives the dedup window, past which a
/// delivery is given back uncommitted anyway, see `commit_bound.rs`).
const MAX_LEASE: Duration = Duration::from_secs(30 * 24 * 3600);
/// Stalls this long or longer are taken for pauses of the process unless the source is given its
/// own threshold ([`PubSubSource::with_pause_threshold`]).
const PAUSE_THRESHOLD: Duration = Duration::from_secs(30);
/// The client extends a held message's lease by up to this much at a time (the client's
/// minimum; it renews well before expiry). It is also the stream's ack deadline, which bounds
/// how long messages handed to a crashed worker's streams wait before redelivery: measured on
/// the emulator, a new stream after a close got the backlog ≈ 30 s later with 30 s here, where
/// the client's default of 60 s gave the 2–3 minute stalls.
const LEASE_EXTENSION: Duration = Duration::from_secs(10);

/// Streaming pull from one subscription through the official client.
#[derive(Debug, Clone)]
pub struct PubSubSource {
    config: PubSubConfig,
    subscription: String,
    streams: usize,
    max_lease: Duration,
    pause_threshold: Duration,
    deliver_probes: bool,
    reopens: Option<Arc<AtomicU64>>,
    intent: FlowIntent,
    fence: Option<Arc<dyn AckFence>>,
    give_up_after: Option<Duration>,
    /// The pipeline and flow that label its ack metrics.
    labels: (String, String),
}

impl PubSubSource {
    /// A source reading `subscription` (short name or full path) over `streams` streams.
    pub fn new(
        config: PubSubConfig,
        subscription: &str,
        streams: usize,
    ) -> Result<Self, SourceError> {
        Ok(Self {
            subscription: config.subscription_path(subscription)?,
            config,
            streams: streams.clamp(1, 64),
            max_lease: MAX_LEASE,
            pause_threshold: PAUSE_THRESHOLD,
            deliver_probes: false,
            reopens: None,
            intent: FlowIntent::default(),
            fence: None,
            give_up_after: None,
            labels: (String::new(), String::new()),
        })
    }

    /// Counts in `reopens` every time a stream is reopened (after an error, or a pause): for
    /// the tracking reader, whose evidence a reopen breaks.
    pub fn counting_reopens(mut self, reopens: Arc<AtomicU64>) -> Self {
        self.reopens = Some(reopens);
        self
    }

    /// Delivers watermark probes ([`PROBE_ATTRIBUTE`]) too, where other sources ack and drop
    /// them: for the tracking reader.
    pub fn delivering_probes(mut self) -> Self {
        self.deliver_probes = true;
        self
    }

    /// The client extends a held message's lease for at most this long (default 30 days).
    pub fn with_max_lease(mut self, max_lease: Duration) -> Self {
        self.max_lease = max_lease;
        self
    }

    /// A stall of the process this long or longer is taken for a pause: streams opened before
    /// it give back what they read after it and reopen (default 30 s; the worker uses
    /// `sluice_connector::pause_threshold` of the dedup window).
    pub fn with_pause_threshold(mut self, threshold: Duration) -> Self {
        self.pause_threshold = threshold;
        self
    }

    /// What the flow does with the messages, for the warnings at start (see
    /// [`FlowIntent`]).
    pub fn with_intent(mut self, intent: FlowIntent) -> Self {
        self.intent = intent;
        self
    }

    /// Acks only while `fence` allows them; a message it withholds the ack of is given back
    /// (see `ack_fence.rs`). Default: no fence.
    pub fn with_ack_fence(mut self, fence: Arc<dyn AckFence>) -> Self {
        self.fence = Some(fence);
        self
    }

    /// Stops waiting for an unreachable Pub/Sub once `limit` has passed since its first
    /// unanswered question, with [`SourceError::GaveUp`] (a triggered run's `give_up_after`):
    /// at start, and when a run that ends when idle asks whether the subscription is idle
    /// (see `reachability.rs`). Default: waits as long as it takes.
    pub fn giving_up_after(mut self, limit: Option<Duration>) -> Self {
        self.give_up_after = limit;
        self
    }

    /// Labels its ack metrics (`sluice_ack_failures_total`, `sluice_acks_withheld_total`) with
    /// `pipeline` and `flow`, as the flow's other metrics are (default: both empty).
    pub fn labelled(mut self, pipeline: &str, flow: &str) -> Self {
        self.labels = (pipeline.to_owned(), flow.to_owned());
        self
    }

    /// The subscription's full path.
    pub fn subscription(&self) -> &str {
        &self.subscription
    }

    async fn client(&self) -> Result<Subscriber, SourceError> {
        let mut builder = Subscriber::builder().with_grpc_subchannel_count(self.streams);
        if let Some(endpoint) = self.config.endpoint() {
            builder = builder.with_endpoint(endpoint);
        }
        if let Some(credentials) = self.config.credentials() {
            builder = builder.with_credentials(credentials);
        }
        builder
            .build()
            .await
            .map_err(|e| SourceError::Client(e.to_string()))
    }
}

#[async_trait]
impl MessageSource for PubSubSource {
    async fn start(
        self: Box<Self>,
        intake: mpsc::Sender<Received>,
        budget: Budget,
        stop: CancellationToken,
    ) -> Result<Box<dyn SourceHandle>, SourceError> {
        let mut reachability = Reachability::new(
            self.config.clone(),
            self.subscription.clone(),
            self.give_up_after,
        );
        let Some(found) = reachability.wait(&stop).await? else {
            return Ok(Box::new(RunningPubSub {
                stop,
                tokens: Arc::default(),
                tasks: JoinSet::new(),
                ordered: false,
                pending: Arc::default(),
                reachability,
            }));
        };
        super::settings::log_settings(&self.subscription, &found, &self.intent);
        let ordered = found.enable_message_ordering;
        let client = self.client().await?;
        let tokens = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = JoinSet::new();
        let (max_messages, max_bytes) = budget.limits();
        let flow_control = FlowControl {
            messages: i64::try_from(max_messages.div_ceil(self.streams)).unwrap_or(i64::MAX),
            bytes: i64::try_from(max_bytes.div_ceil(self.streams)).unwrap_or(i64::MAX),
        };
        let pauses = PauseWatch::start(self.pause_threshold);
        let ack_labels = Arc::new(AckLabels {
            pipeline: self.labels.0.clone(),
            flow: self.labels.1.clone(),
            subscription: self.subscription.clone(),
        });
        register_ack_failures(&ack_labels);
        if !self.deliver_probes {
            probes_dropped(&self.subscription).increment(0);
        }
        let pending = Arc::new(PendingAcks::default());
        for index in 0..self.streams {
            let stream = StreamTask {
                client: client.clone(),
                subscription: Arc::from(self.subscription.as_str()),
                intake: intake.clone(),
                budget: budget.clone(),
                stop: stop.clone(),
                tokens: tokens.clone(),
                index,
                flow_control,
                max_lease: self.max_lease,
                pauses: pauses.clone(),
                deliver_probes: self.deliver_probes,
                reopens: self.reopens.clone(),
                pending: pending.clone(),
                fence: self.fence.clone(),
                ack_labels: ack_labels.clone(),
            };
            tasks.spawn(stream.run());
        }
        Ok(Box::new(RunningPubSub {
            stop,
            tokens,
            tasks,
            ordered,
            pending,
            reachability,
        }))
    }
}

/// One stream's share of the flow's budget, as the client's own flow control.
#[derive(Debug, Clone, Copy)]
struct FlowControl {
    messages: i64,
    bytes: i64,
}

struct StreamTask {
    client: Subscriber,
    subscription: Arc<str>,
    intake: mpsc::Sender<Received>,
    budget: Budget,
    stop: CancellationToken,
    tokens: Arc<Mutex<Vec<ShutdownToken>>>,
    index: usize,
    flow_control: FlowControl,
    max_lease: Duration,
    pauses: PauseWatch,
    deliver_probes: bool,
    reopens: Option<Arc<AtomicU64>>,
    pending: Arc<PendingAcks>,
    fence: Option<Arc<dyn AckFence>>,
    ack_labels: Arc<AckLabels>,
}

impl StreamTask {
    fn count_reopen(&self) {
        if let Some(reopens) = &self.reopens {
            reopens.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn run(self) {
        let mut backoff = Backoff::default();
        'reopen: loop {
            let mut stream = self
                .client
                .subscribe(&*self.subscription)
                .set_max_lease_extension(LEASE_EXTENSION)
                .set_max_lease(self.max_lease)
                .set_max_outstanding_messages(self.flow_control.messages)
                .set_max_outstanding_bytes(self.flow_control.bytes)
                .build();
            let opened: Epoch = self.pauses.epoch();
            self.tokens
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(stream.shutdown_token());
            loop {
                let permit = tokio::select! {
                    _ = self.stop.cancelled() => return,
                    permit = self.budget.reserve_message() => permit,
                };
                let Some(permit) = permit else { return };
                let next = tokio::select! {
                    biased;
                    _ = self.stop.cancelled() => return,
                    next = stream.next() => next,
                };
                let error = match next {
                    Some(Ok((_, handler))) if self.pauses.paused_since(opened) => {
                        // Read after a pause: it may have waited in the socket all along.
                        handler.nack();
                        tracing::warn!(subscription = %self.subscription, stream = self.index,
                            "the process was paused; giving back what the stream held and \
                             reopening it");
                        drop(stream);
                        self.count_reopen();
                        continue 'reopen;
                    }
                    Some(Ok((message, handler)))
                        if !self.deliver_probes
                            && message
                                .attributes
                                .get(PROBE_ATTRIBUTE)
                                .is_some_and(|value| is_probe(value, &message.data)) =>
                    {
                        handler.ack(); // a watermark probe: not data
                        probes_dropped(&self.subscription).increment(1);
                        continue;
                    }
                    Some(Ok((message, handler))) => {
                        backoff = Backoff::default();
                        let ordering_key = (!message.ordering_key.is_empty())
                            .then(|| Arc::from(message.ordering_key.as_str()));
                        let delivery_attempt = handler.delivery_attempt();
                        let message = convert(message);
                        let permits = self.budget.reserve_bytes(permit, message.size()).await;
                        let handle = Box::new(PubSubAck {
                            handler,
                            labels: self.ack_labels.clone(),
                            pending: self.pending.clone(),
                            fence: self.fence.clone(),
                        });
                        if self
                            .intake
                            .send(
                                Received::new(message, handle, permits)
                                    .with_ordering_key(ordering_key)
                                    .with_delivery_attempt(delivery_attempt),
                            )
                            .await
                            .is_err()
                        {
                            return; // the batcher is gone; the handler was dropped: nacked
                        }
                        continue;
                    }
                    Some(Err(error)) => {
                        if error
                            .status()
                            .is_some_and(|s| s.code == Code::PermissionDenied)
                        {
                            // Kept retrying (a grant may take minutes to propagate), but said
                            // plainly each time.
                            tracing::error!(subscription = %self.subscription,
                                "Pub/Sub refused to stream this subscription: the worker's \
                                 identity needs pubsub.subscriptions.consume \
                                 (roles/pubsub.subscriber) on it");
                        }
                        error.to_string()
                    }
                    None => "stream ended".to_owned(),
                };
                let delay = backoff.next_delay();
                tracing::warn!(subscription = %self.subscription, stream = self.index,
                    step = backoff.step(), retry_in_ms = delay.as_millis() as u64, %error,
                    "Pub/Sub stream failed; reopening");
                drop(stream);
                self.count_reopen();
                tokio::select! {
                    _ = self.stop.cancelled() => return,
                    _ = tokio::time::sleep(delay) => continue 'reopen,
                }
            }
        }
    }
}

/// `sluice_probes_dropped_total{subscription}`: the watermark probes a data source dropped.
fn probes_dropped(subscription: &str) -> metrics::Counter {
    metrics::counter!("sluice_probes_dropped_total", "subscription" => subscription.to_owned())
}

/// The message as sources give it; data that carries [`PROBE_ATTRIBUTE`] without being a
/// probe gets its problem (the tracking reader, which is given probes too, ignores problems).
fn convert(message: Message) -> SourceMessage {
    let publish_time_ms = message
        .publish_time
        .map(|t| t.seconds() * 1000 + i64::from(t.nanos()) / 1_000_000)
        .unwrap_or_default();
    let problem = message
        .attributes
        .get(PROBE_ATTRIBUTE)
        .filter(|value| !is_probe(value, &message.data))
        .map(|value| reserved_attribute_problem(value));
    SourceMessage {
        message_id: message.message_id,
        publish_time_ms,
        attributes: message.attributes.into_iter().collect(),
        data: message.data,
        event_time_ms: None,
        problem,
    }
}
