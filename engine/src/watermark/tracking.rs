//! The watermark of a Pub/Sub flow, kept by every worker of the flow and estimated by one.
//!
//! Every worker running the flow runs a [`WatermarkTracker`] beside it. Each of them, every
//! [`TICK`]:
//!
//! 1. records the ids of the messages it settled outside a commit ([`FlowWatermark`]:
//!    duplicates found in memory, redeliveries parked behind a key in flight) in the store's
//!    publish-time buckets (a commit records its own, in its transaction);
//! 2. competes for the flow's `watermark/<flow>` lease, so one worker of a pool is the
//!    *tracking reader*;
//! 3. takes the flow's watermark from the store into its [`FlowWatermark`] (batches, late
//!    counts, gauges).
//!
//! The tracking reader also reads the tracking subscription: it records each delivered message
//! as tracked in its publish-time bucket, with its event time, and **acks only once that is
//! stored** (so a crash can make it report a message twice, recorded once, never zero times).
//! Then it estimates: a bucket is *processed* when every message tracked in it was settled;
//! `unprocessed_from` is the first bucket that is not; the horizon comes from the tracking
//! stream's deliveries ([`sluice_watermark::DeliveryHorizon`]); and
//! [`sluice_watermark::SluiceEstimator`] gives the watermark, which the store only lets move
//! forward.
//!
//! # What this relies on, and its limits
//!
//! The estimator's guarantee (crate `sluice_watermark`) holds when the horizon is right and
//! processed counts never run ahead of the truth. Both sides report by message id
//! (`ProgressStore::add_bucket_messages`), so a redelivery (a lost ack, a lease that lapsed, a commit
//! whose answer was lost and whose reports were given back and made again) counts once, and a
//! bucket is processed exactly when every message tracked in it was settled. Known ways in
//! which they can still be wrong:
//!
//! * **Reports are never lost.** A commit records its messages settled in its own transaction
//!   (`CommitBatch::watermark_progress`); messages settled outside a commit (duplicates found
//!   in memory, redeliveries parked behind a key in flight) are acked only once their reports
//!   are stored ([`FlowWatermark::after_settled`]), so a worker killed in between leaves them to
//!   be redelivered and reported again. A bucket left unprocessed behind processed ones is
//!   therefore waited for, never released on a timer (its messages may be committing slowly:
//!   a stage returning UNAVAILABLE, a lock, a retried batch): `sluice_watermark_stalled_seconds`
//!   shows how long, and a warning is logged past [`STALL_ALERT`]. Messages the flow can no
//!   longer read (seeked past with `--drop-unread`, forwarded by a Pub/Sub dead-letter policy,
//!   expired) hold it until the flow is reset.
//! * **The horizon** needs positive evidence of a live tracking stream: the reader publishes a
//!   probe (attribute [`PROBE_ATTRIBUTE`], empty data) to the topic every [`TICK`], and only
//!   probes that come back through the tracking stream move the horizon
//!   ([`sluice_watermark::DeliveryHorizon`]); a stream that goes silent (an outage, a reopen,
//!   the emulator's stall after a stream closed) holds it, and a reopened stream is read
//!   again (what it held comes back only after its ack deadline). Every source acks, counts
//!   and drops probes (other subscribers of the topic see them, and may filter
//!   `NOT attributes:sluice-probe`); data that carries the attribute without being a probe is
//!   tracked as data and dead-lettered by its flow ([`crate::source::pubsub::is_probe`]); another
//!   reader's recent probes are nacked back to it. A
//!   filtered subscription's tracker needs the filter plus the probes
//!   ([`crate::source::pubsub::tracking_filter`]). The worker needs permission to publish to the topic;
//!   failures are logged and counted (`sluice_watermark_probe_failures_total{outcome}`). Only
//!   a publish Pub/Sub refused ([`crate::source::pubsub::publish_refused`]) ends the wait for its
//!   probe: one whose outcome is unknown may be stored and held back with a backlog, so it is
//!   waited for until it comes back or is given up (`sluice_watermark_probes_outstanding`
//!   shows the probes waited for). Times are Pub/Sub's publish times, so
//!   the reader's clock does not matter; its offset is shown as
//!   `sluice_tracking_clock_offset_seconds` and logged past [`CLOCK_OFFSET_ALERT_MS`].
//! * **Event times outside the band** are late by definition. What the reader has seen of them
//!   holds the watermark while their bucket is unprocessed (so a backlog with old event times
//!   holds it as far as it is tracked), but nothing holds the horizon for them, so a trickle of
//!   old events (offline devices) is counted late (`sluice_messages_late_total`) while the
//!   watermark moves on.
//! * **Lease handover.** The reader's watermark writes are fenced by its lease
//!   (`ProgressStore::advance_watermark` checks it in the same statement), so a reader paused past its
//!   lease's expiry writes nothing when it wakes. A reader that starts (a new holder, this
//!   worker after a restart, or after its stream was reopened) publishes a probe and then
//!   seeks the tracking subscription back to the stored horizon, so what an earlier reader was
//!   handed and did not store is delivered again at once, with that probe among it: the
//!   horizon waits for the probe, so fresh probes overtaking the replay carry nothing; and it
//!   moves no watermark for [`HOLD_AFTER_START`]. What
//!   comes back from before the stored horizon (or the pruned buckets) is tracked already and
//!   acked without a report.
//! * **A subscription older than its tracking subscription**: `auto` starts the tracking
//!   subscription at a snapshot of the base subscription
//!   ([`Admin::ensure_tracking_subscription`](crate::source::pubsub::Admin::ensure_tracking_subscription)),
//!   so on Pub/Sub what already waits in the base subscription is tracked too. A named tracking
//!   subscription, an `auto` one whose snapshot Pub/Sub refused (logged), and any on the
//!   emulator (it does not copy a backlog to another subscription through a snapshot) track only
//!   what is published after they exist: an older backlog looks processed.
//! * The reader drains its intake once per [`TICK`]; well above 2 000 msg/s deliveries queue,
//!   look late, and the watermark holds until the load falls.

use crate::flow::budget::Budget;
use crate::flow::event_time::parse_event_time;
use crate::source::pubsub::{
    PROBE_ATTRIBUTE, PubSubConfig, PubSubSource, is_probe, probe_message, publish_refused,
};
use crate::source::{INTAKE_CAPACITY, MessageSource, Received, SourceHandle};
use crate::time::now_ms;
use crate::watermark::{FlowWatermark, bucket_of};
use sluice_store::{
    BucketCounts, BucketMessage, FlowHandle, LeaseGrant, LeaseRequest, MessageReport, Store,
    StoreError, WatermarkRecord,
};
use sluice_watermark::{
    DEFAULT_QUIET_MS, DeliveryHorizon, PublishFailure, SluiceEstimator, TrackingHistogram,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How often a tracker reports, renews and estimates.
pub const TICK: Duration = Duration::from_millis(500);
/// How long the tracking-reader lease lasts without renewal.
pub const LEASE_TTL: Duration = Duration::from_secs(15);
/// An unprocessed bucket behind processed ones that waits this long is logged as stalled (it is
/// never released: see the module docs).
pub const STALL_ALERT: Duration = Duration::from_secs(600);
/// A reader whose clock is further than this off Pub/Sub's (as its probes measure it) is
/// logged: the watermark does not depend on it, but other time-keeping may.
pub const CLOCK_OFFSET_ALERT_MS: i64 = 5_000;
/// A reader that starts after another (or after a restart or a reopen) moves no watermark for
/// this long: what the earlier one was handed and did not store comes back after its lease
/// lapsed (10 s) even where the seek back does not bring it at once.
pub const HOLD_AFTER_START: Duration = Duration::from_secs(60);
/// Another reader's probe published less than this long ago (by this worker's clock, so with
/// room for skew) is given back for it rather than acked.
const FOREIGN_PROBE_MS: i64 = 120_000;
/// How long the reader waits for Pub/Sub to answer before it hands the lease over, and how
/// long it leaves the lease to others after that.
pub const READ_RETRY: Duration = Duration::from_secs(10);
/// Messages the tracking reader holds unacked, at most (they are acked each tick).
const TRACKING_BUDGET: usize = 20_000;

/// What one flow's tracker needs.
#[derive(Debug, Clone)]
pub struct TrackerSettings {
    /// The tracking subscription (short name or full path).
    pub tracking_subscription: String,
    /// `tracking_subscription: auto`: the base subscription, on whose topic (with whose
    /// filter) the tracking subscription is created when missing, before it is first read.
    pub create_from: Option<String>,
    /// `event_time.attribute`; `None`: the publish time.
    pub event_time_attribute: Option<String>,
    /// `on_bad_timestamp: publish_time`.
    pub bad_timestamp_uses_publish_time: bool,
    /// `watermark.band`, ms.
    pub band_ms: i64,
    /// The flow's own subscription, which the tracking subscription must mirror (same topic,
    /// same filter).
    pub base_subscription: String,
    /// This worker's id (the lease holder name).
    pub worker: String,
    /// Where the reader publishes its probes; `None`: the flow's Pub/Sub endpoint. (The
    /// worker takes it from `SLUICE_PROBE_ENDPOINT`, with which the tests fault the probe
    /// publisher alone.)
    pub probe_endpoint: Option<String>,
}

/// One worker's tracker of one flow's watermark.
pub struct WatermarkTracker {
    store: Arc<dyn Store>,
    flow: FlowHandle,
    pubsub: PubSubConfig,
    settings: TrackerSettings,
    watermark: FlowWatermark,
}

/// How a probe's publish ended: published, or how it failed (refused or unknown) and why.
type ProbeOutcome = Result<(), (PublishFailure, String)>;

/// The tracking reader's running state (only while this worker holds the lease).
struct Reading {
    source: Box<dyn SourceHandle>,
    stop: CancellationToken,
    intake: mpsc::Receiver<Received>,
    horizon: DeliveryHorizon,
    /// Delivered, reported in `pending`, not yet stored: acked once the reports are stored.
    held: Vec<Received>,
    pending: Vec<BucketMessage>,
    estimator: SluiceEstimator,
    /// Publishes a probe to the topic each tick (the horizon's evidence of a live stream).
    probes: google_cloud_pubsub::client::Publisher,
    /// This reading's probes carry `<prefix><sequence number>`.
    probe_prefix: String,
    next_probe: u64,
    /// Publish outcomes of the probes: (sequence number, published or how and why not).
    probe_outcomes: mpsc::UnboundedReceiver<(u64, ProbeOutcome)>,
    probe_outcomes_tx: mpsc::UnboundedSender<(u64, ProbeOutcome)>,
    /// Whether the last probe publish failed (logged once per episode), and the probes given
    /// up so far (logged as they grow).
    probe_failing: bool,
    probes_given_up: u64,
    /// Counts the stream's reopens: what was in flight on a broken stream comes back only
    /// after its ack deadline, so the reader starts again (and seeks) rather than go on.
    reopens: Arc<AtomicU64>,
    /// Buckets first seen unprocessed behind processed ones, and when (for the alert).
    stalled_since: HashMap<i64, i64>,
    /// Whether the last alert state was logged (stall, clock offset), to log once per episode.
    stall_logged: bool,
    offset_logged: bool,
    /// Every message published before this is tracked already: the horizon stored when the
    /// reader started (the seek's time), then the start of the buckets it pruned. A
    /// redelivery of one (a lost ack) is acked without a report, since its bucket may be
    /// pruned and a report would make it look unprocessed for ever.
    tracked_before: i64,
    /// Until then (reader's clock) the horizon does not move past the stored one: see
    /// [`HOLD_AFTER_START`].
    hold_until: i64,
    /// The horizon as of the last drain of the intake (computed at the same instant, so no
    /// message that arrived after the drain can lie before it uncounted).
    live_horizon: Option<i64>,
}

impl WatermarkTracker {
    /// A tracker of `flow` that publishes into `watermark`.
    pub fn new(
        store: Arc<dyn Store>,
        flow: FlowHandle,
        pubsub: PubSubConfig,
        settings: TrackerSettings,
        watermark: FlowWatermark,
    ) -> Self {
        Self {
            store,
            flow,
            pubsub,
            settings,
            watermark,
        }
    }

    /// Runs until `stop`; then reports the last settled messages, hands the lease back and
    /// closes the tracking stream.
    pub async fn run(self, stop: CancellationToken) {
        let lease = LeaseRequest {
            pipeline: self.flow.pipeline.to_string(),
            role: format!("watermark/{}", self.flow.name),
            holder: self.settings.worker.clone(),
            ttl: LEASE_TTL,
        };
        let mut reading: Option<Reading> = None;
        // After the reader could not start: leave the lease to others until then.
        let mut read_again_at = i64::MIN;
        let mut ticks = tokio::time::interval(TICK);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut store_down = false;
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = stop.cancelled() => break,
            }
            let result = self
                .tick(&lease, &mut reading, &mut read_again_at, &stop)
                .await;
            match result {
                Ok(()) if store_down => {
                    tracing::info!(flow = %self.flow.name, "watermark tracking resumed");
                    store_down = false;
                }
                Ok(()) => {}
                Err(error) if !store_down => {
                    tracing::warn!(flow = %self.flow.name, %error,
                        "watermark tracking failed; the watermark holds, retrying every tick");
                    store_down = true;
                }
                Err(_) => {}
            }
        }
        if let Err(error) = self.report_processed().await {
            tracing::warn!(flow = %self.flow.name, %error,
                "could not store the last settled messages; the watermark may hold");
        }
        if let Some(mut reading) = reading.take() {
            let _ = self.store_tracked(&mut reading).await;
            self.stop_reading(reading).await;
            let _ = self
                .store
                .release_lease(&lease.pipeline, &lease.role, &lease.holder)
                .await;
        }
    }

    async fn tick(
        &self,
        lease: &LeaseRequest,
        reading: &mut Option<Reading>,
        read_again_at: &mut i64,
        stop: &CancellationToken,
    ) -> Result<(), StoreError> {
        self.report_processed().await?;
        let holding = if now_ms() < *read_again_at {
            false
        } else {
            match self.store.acquire_lease(lease).await? {
                LeaseGrant::Held { taken, .. } => {
                    if taken {
                        tracing::info!(flow = %self.flow.name, "reading the tracking subscription");
                    }
                    true
                }
                LeaseGrant::HeldBy(_) => false,
            }
        };
        if !holding {
            if let Some(reading) = reading.take() {
                tracing::warn!(flow = %self.flow.name, "lost the tracking-reader lease");
                self.stop_reading(reading).await;
            }
            return self.follow().await;
        }
        if reading.is_none() {
            let stored_horizon = self.stored_record().await?.map(|r| r.horizon_ms);
            match self.start_reading(stop, stored_horizon).await {
                Ok(started) => *reading = Some(started),
                Err(error) => {
                    // Another worker may reach it: hand the lease over for a while.
                    tracing::warn!(flow = %self.flow.name, %error, retry_in_s = READ_RETRY.as_secs(),
                        "cannot read the tracking subscription; the watermark holds");
                    *read_again_at = now_ms() + i64::try_from(READ_RETRY.as_millis()).unwrap_or(0);
                    self.store
                        .release_lease(&lease.pipeline, &lease.role, &lease.holder)
                        .await?;
                    return self.follow().await;
                }
            }
        }
        let Some(current) = reading.as_mut() else {
            return Ok(());
        };
        self.take_deliveries(current);
        self.store_tracked(current).await?;
        if current.reopens.load(Ordering::Relaxed) > 0 {
            // Starting again publishes a probe and seeks back to the stored horizon, so what
            // the broken stream held comes back before the horizon moves on.
            tracing::warn!(flow = %self.flow.name,
                "the tracking stream was reopened; reading it again from the stored horizon");
            if let Some(broken) = reading.take() {
                self.stop_reading(broken).await;
            }
            return Ok(());
        }
        self.estimate(current).await
    }

    /// Records the messages this worker settled in the store (given back on failure), then
    /// acks those that waited for it.
    async fn report_processed(&self) -> Result<(), StoreError> {
        self.watermark.store_settled(&*self.store, &self.flow).await
    }

    /// The flow's stored watermark record, if any.
    async fn stored_record(&self) -> Result<Option<WatermarkRecord>, StoreError> {
        Ok(self
            .store
            .watermarks(&self.flow.pipeline)
            .await?
            .into_iter()
            .find(|(name, _)| *name == *self.flow.name)
            .map(|(_, record)| record))
    }

    /// Not the reader: takes the stored watermark.
    async fn follow(&self) -> Result<(), StoreError> {
        if let Some(record) = self.stored_record().await? {
            self.watermark.advance(record.watermark_ms);
        }
        Ok(())
    }

    /// Creates the tracking subscription if asked and missing, and opens its stream; gives up
    /// (to be retried) when Pub/Sub does not answer within [`READ_RETRY`] or `stop` comes.
    async fn start_reading(
        &self,
        stop: &CancellationToken,
        stored_horizon: Option<i64>,
    ) -> Result<Reading, crate::source::SourceError> {
        let no_answer =
            || crate::source::SourceError::Rpc(format!("no answer within {READ_RETRY:?}"));
        let tracking = &self.settings.tracking_subscription;
        let probe_prefix = format!("{}/{}/", self.settings.worker, now_ms());
        let mut horizon = DeliveryHorizon::new(DEFAULT_QUIET_MS);
        let mut next_probe = 0;
        let probes = tokio::time::timeout(READ_RETRY, async {
            let admin = crate::source::pubsub::Admin::connect(&self.pubsub).await?;
            if let Some(base) = &self.settings.create_from {
                let start = admin.ensure_tracking_subscription(base, tracking).await?;
                crate::source::pubsub::log_tracking_start(&self.flow.name, tracking, &start);
            }
            let topic = admin
                .tracking_topic(&self.settings.base_subscription, tracking)
                .await?;
            let probes = match &self.settings.probe_endpoint {
                None => admin.publisher(&topic).await?,
                Some(endpoint) => {
                    let config = PubSubConfig {
                        endpoint: Some(endpoint.clone()),
                        ..self.pubsub.clone()
                    };
                    crate::source::pubsub::Admin::connect(&config)
                        .await?
                        .publisher(&topic)
                        .await?
                }
            };
            // What an earlier reader (this worker before a restart, or one that died holding
            // the lease) was handed and did not store comes back now, not after its lease: a
            // seek to the stored horizon. A probe published just before it comes back with
            // that replay, and the horizon waits for it (fresh probes that overtake the replay
            // carry nothing until it is back).
            // A subscription that does not retain acked messages cannot be sought back (the
            // emulator drops even what is unacked): what an earlier reader held then comes back
            // after its ack deadline only.
            let replayable = match stored_horizon {
                Some(_) => admin.replay_window(tracking).await?.is_some(),
                None => false,
            };
            if stored_horizon.is_some() && !replayable {
                tracing::warn!(flow = %self.flow.name, subscription = %tracking,
                    "the tracking subscription does not retain acked messages, so it cannot be \
                     sought back to the stored horizon: what an earlier reader was handed comes \
                     back after its ack deadline, and the watermark may pass it meanwhile \
                     (set retain_acked_messages on it)");
            }
            if let Some(stored) = stored_horizon.filter(|_| replayable) {
                horizon.probe_sent(next_probe, now_ms());
                probes
                    .publish(probe_message(&probe_prefix, next_probe))
                    .await
                    .map_err(|e| crate::source::SourceError::Rpc(e.to_string()))?;
                next_probe += 1;
                admin.seek_to_time(tracking, stored).await?;
            }
            Ok::<_, crate::source::SourceError>(probes)
        })
        .await
        .map_err(|_| no_answer())??;
        let reopens = Arc::new(AtomicU64::new(0));
        let source = PubSubSource::new(self.pubsub.clone(), tracking, 1)?
            .delivering_probes()
            .counting_reopens(reopens.clone());
        let (intake_tx, intake) = mpsc::channel(INTAKE_CAPACITY);
        // The stream lives until the reader stops (or the tracker does).
        let stop = stop.child_token();
        let budget = Budget::new(TRACKING_BUDGET, u64::MAX / 2);
        let handle = tokio::time::timeout(
            READ_RETRY,
            Box::new(source).start(intake_tx, budget, stop.clone()),
        )
        .await
        .map_err(|_| no_answer())??;
        let (probe_outcomes_tx, probe_outcomes) = mpsc::unbounded_channel();
        for failure in [PublishFailure::Refused, PublishFailure::OutcomeUnknown] {
            self.probe_failures(failure).increment(0);
        }
        Ok(Reading {
            probe_prefix,
            next_probe,
            probe_failing: false,
            probes_given_up: 0,
            reopens,
            probe_outcomes,
            probe_outcomes_tx,
            tracked_before: stored_horizon.unwrap_or(i64::MIN),
            hold_until: match stored_horizon {
                Some(_) => now_ms() + i64::try_from(HOLD_AFTER_START.as_millis()).unwrap_or(0),
                None => i64::MIN,
            },
            source: handle,
            stop,
            intake,
            horizon,
            held: Vec::new(),
            pending: Vec::new(),
            estimator: SluiceEstimator::new(self.settings.band_ms),
            probes,
            stalled_since: HashMap::new(),
            stall_logged: false,
            offset_logged: false,
            live_horizon: None,
        })
    }

    async fn stop_reading(&self, reading: Reading) {
        let Reading {
            source,
            stop,
            intake,
            held,
            ..
        } = reading;
        stop.cancel();
        // Uncounted deliveries go back (nacked when dropped) to whoever reads next.
        drop(held);
        drop(intake);
        source.close().await;
    }

    /// Counts what the tracking stream delivered since the last tick, then publishes the next
    /// probe.
    fn take_deliveries(&self, reading: &mut Reading) {
        let now = now_ms();
        while let Ok((seq, published)) = reading.probe_outcomes.try_recv() {
            match published {
                Err((failure, error)) => {
                    if !reading.probe_failing {
                        tracing::warn!(flow = %self.flow.name, %error, ?failure,
                            "cannot publish watermark probes to the topic; the watermark holds \
                             until they go through, and waits for a probe whose outcome is \
                             unknown until it comes back (may the worker publish there?)");
                    }
                    reading.probe_failing = true;
                    self.probe_failures(failure).increment(1);
                    reading.horizon.probe_failed(seq, failure);
                }
                Ok(()) => reading.probe_failing = false,
            }
        }
        while let Ok(received) = reading.intake.try_recv() {
            let message = &received.message;
            // Data carrying the attribute without being a probe is tracked as data (its flow
            // dead-letters it, which settles it).
            if let Some(probe) = message
                .attributes
                .get(PROBE_ATTRIBUTE)
                .filter(|value| is_probe(value, &message.data))
            {
                let fate =
                    classify_probe(probe, &reading.probe_prefix, message.publish_time_ms, now);
                match fate {
                    Probe::Own(seq) => {
                        reading
                            .horizon
                            .probe_delivered(seq, message.publish_time_ms, now);
                        received.handle.ack();
                    }
                    Probe::Other { give_back } => {
                        reading.horizon.delivered(message.publish_time_ms, now);
                        if give_back {
                            received.handle.nack();
                        } else {
                            received.handle.ack();
                        }
                    }
                }
                continue;
            }
            if message.publish_time_ms < reading.tracked_before {
                // Tracked already; as a late delivery it still shows a backlog.
                reading.horizon.delivered(message.publish_time_ms, now);
                received.handle.ack();
                continue;
            }
            let bucket = bucket_of(message.publish_time_ms);
            // An event time outside the band holds the watermark only while its bucket is
            // unprocessed; nothing holds the horizon for it (it is late by definition).
            let event = self.event_time(message);
            reading.pending.push(BucketMessage {
                bucket_ms: bucket,
                message_id: message.message_id.clone(),
                report: MessageReport::Tracked { event_ms: event },
            });
            reading.horizon.delivered(message.publish_time_ms, now);
            reading.held.push(received);
        }
        reading.live_horizon = reading.horizon.horizon(now);
        metrics::gauge!("sluice_watermark_probes_outstanding", &self.labels())
            .set(reading.horizon.outstanding_probes() as f64);
        let given_up = reading.horizon.probes_given_up();
        if given_up > reading.probes_given_up {
            tracing::warn!(flow = %self.flow.name, given_up, "watermark probes did not come back \
                within 5 minutes and were given up (another reader took them, or a filter drops \
                them)");
            reading.probes_given_up = given_up;
        }
        self.publish_offset(reading);
        // The horizon waits for the probe until it comes back, Pub/Sub refuses it, or it is
        // given up (an unknown publish outcome does not end the wait).
        let seq = reading.next_probe;
        reading.next_probe += 1;
        reading.horizon.probe_sent(seq, now);
        let published = reading
            .probes
            .publish(probe_message(&reading.probe_prefix, seq));
        let outcomes = reading.probe_outcomes_tx.clone();
        tokio::spawn(async move {
            let published = published.await.map(|_| ()).map_err(|error| {
                let failure = if publish_refused(&error) {
                    PublishFailure::Refused
                } else {
                    PublishFailure::OutcomeUnknown
                };
                (failure, error.to_string())
            });
            let _ = outcomes.send((seq, published));
        });
    }

    /// Shows the reader's clock offset from Pub/Sub's (`sluice_tracking_clock_offset_seconds`)
    /// and logs it once when it passes [`CLOCK_OFFSET_ALERT_MS`].
    fn publish_offset(&self, reading: &mut Reading) {
        let Some(offset) = reading.horizon.clock_offset() else {
            return;
        };
        metrics::gauge!("sluice_tracking_clock_offset_seconds", &self.labels())
            .set(offset as f64 / 1000.0);
        let off = offset.abs() > CLOCK_OFFSET_ALERT_MS;
        if off && !reading.offset_logged {
            tracing::warn!(flow = %self.flow.name, offset_ms = offset,
                "this worker's clock is off Pub/Sub's (probe receipt − publish time); the \
                 watermark keeps to Pub/Sub's clock, but check the machine's time sync");
        }
        reading.offset_logged = off;
    }

    /// `sluice_watermark_probe_failures_total{outcome}`: probe publishes that failed, refused
    /// or with an unknown outcome.
    fn probe_failures(&self, failure: PublishFailure) -> metrics::Counter {
        let outcome = match failure {
            PublishFailure::Refused => "refused",
            PublishFailure::OutcomeUnknown => "unknown",
        };
        metrics::counter!("sluice_watermark_probe_failures_total",
            "pipeline" => self.flow.pipeline.to_string(),
            "flow" => self.flow.name.to_string(), "outcome" => outcome)
    }

    fn labels(&self) -> [(&'static str, String); 2] {
        [
            ("pipeline", self.flow.pipeline.to_string()),
            ("flow", self.flow.name.to_string()),
        ]
    }

    /// The event time the flow's stage will give the message; `None` for a message it will
    /// dead-letter (a bad timestamp), which never becomes a row and so is never late.
    fn event_time(&self, message: &crate::SourceMessage) -> Option<i64> {
        let Some(name) = &self.settings.event_time_attribute else {
            return Some(message.publish_time_ms);
        };
        match message
            .attributes
            .get(name)
            .and_then(|v| parse_event_time(v))
        {
            Some(ms) => Some(ms),
            None if self.settings.bad_timestamp_uses_publish_time => Some(message.publish_time_ms),
            None => None,
        }
    }

    /// Stores the tracked reports, then acks what they report.
    async fn store_tracked(&self, reading: &mut Reading) -> Result<(), StoreError> {
        if reading.pending.is_empty() {
            return Ok(());
        }
        self.store
            .add_bucket_messages(&self.flow, &reading.pending)
            .await?;
        reading.pending.clear();
        for received in reading.held.drain(..) {
            received.handle.ack();
        }
        Ok(())
    }

    /// Estimates from the stored counts and moves the stored watermark forward.
    async fn estimate(&self, reading: &mut Reading) -> Result<(), StoreError> {
        let now = now_ms();
        // No horizon (nothing delivered since the stream opened, or a backlog still being
        // drained): the watermark holds.
        let Some(live) = reading.live_horizon else {
            return Ok(());
        };
        // Started after another reader (or this one before a restart or a reopen): what it
        // held comes back on Pub/Sub's schedule, not ours; the horizon waits a while for it.
        if now < reading.hold_until {
            return Ok(());
        }
        let stored = self.stored_record().await?;
        let horizon = stored.map_or(live, |r| r.horizon_ms.max(live));
        let buckets = self.store.bucket_counts(&self.flow, i64::MIN).await?;
        let mut tracking = TrackingHistogram::new(sluice_store::PROGRESS_BUCKET_MS);
        tracking.advance_horizon(horizon);
        for bucket in &buckets {
            if let Some(min_event) = bucket.min_event_ms {
                tracking.add_bucket(bucket.bucket_ms, min_event, bucket.tracked);
            }
        }
        let unprocessed_from = first_unprocessed(&buckets);
        self.alert_stall(reading, &buckets, now);
        let base = sluice_watermark::BaseProgress { unprocessed_from };
        let Some(estimate) = reading.estimator.estimate(&tracking, &base) else {
            return Ok(());
        };
        let offer = WatermarkRecord {
            watermark_ms: estimate.watermark_ms,
            horizon_ms: horizon,
            updated_at_ms: now,
        };
        // Fenced: taken only while this worker still holds the reader's lease.
        let Some(record) = self
            .store
            .advance_watermark(&self.flow, &offer, Some(&self.settings.worker))
            .await?
        else {
            tracing::warn!(flow = %self.flow.name,
                "the tracking-reader lease expired before the watermark was stored; not stored");
            return Ok(());
        };
        self.watermark.advance(record.watermark_ms);
        // Buckets before the first unprocessed one (and before the horizon) are done.
        // Whole buckets only: the bucket holding the horizon may hold a settled message
        // published after it that is not tracked yet.
        let done_before = bucket_of(unprocessed_from.unwrap_or(horizon).min(horizon));
        if buckets.first().is_some_and(|b| b.bucket_ms < done_before) {
            self.store.prune_buckets(&self.flow, done_before).await?;
            reading.tracked_before = reading.tracked_before.max(done_before);
        }
        Ok(())
    }

    /// Shows how long the oldest bucket left unprocessed behind processed ones has waited
    /// (`sluice_watermark_stalled_seconds`, 0 when none) and logs it once past
    /// [`STALL_ALERT`]. The watermark holds at such a bucket: its messages may still be
    /// committing (a slow stage, a lock, a retried batch), and no evidence here tells that from
    /// a lost report.
    fn alert_stall(&self, reading: &mut Reading, buckets: &[BucketCounts], now: i64) {
        let stalled = stalled_buckets(buckets);
        reading
            .stalled_since
            .retain(|b, _| stalled.binary_search(b).is_ok());
        for bucket in &stalled {
            reading.stalled_since.entry(*bucket).or_insert(now);
        }
        let waited = reading
            .stalled_since
            .values()
            .map(|since| now.saturating_sub(*since))
            .max()
            .unwrap_or(0);
        metrics::gauge!("sluice_watermark_stalled_seconds", &self.labels())
            .set(waited as f64 / 1000.0);
        let alert = waited >= i64::try_from(STALL_ALERT.as_millis()).unwrap_or(i64::MAX);
        if alert && !reading.stall_logged {
            let oldest = stalled
                .first()
                .and_then(|b| buckets.iter().find(|c| c.bucket_ms == *b));
            tracing::warn!(flow = %self.flow.name, waited_s = waited / 1000,
                bucket_ms = oldest.map(|b| b.bucket_ms), tracked = oldest.map(|b| b.tracked),
                processed = oldest.map(|b| b.processed),
                "messages tracked in a watermark bucket are still not settled while later ones \
                 are; the watermark holds until they are (a stage or store that stays slow, or \
                 messages the flow can no longer read)");
        }
        reading.stall_logged = alert;
    }
}

/// The first bucket in which not every tracked message was settled: every message published
/// before it was processed. By publish time; `None` when every bucket is processed.
pub fn first_unprocessed(buckets: &[BucketCounts]) -> Option<i64> {
    buckets
        .iter()
        .filter(|b| b.processed < b.tracked)
        .map(|b| b.bucket_ms)
        .min()
}

/// The unprocessed buckets with a processed bucket after them, oldest first.
fn stalled_buckets(buckets: &[BucketCounts]) -> Vec<i64> {
    let Some(last_processed) = buckets
        .iter()
        .filter(|b| b.processed > 0)
        .map(|b| b.bucket_ms)
        .max()
    else {
        return Vec::new();
    };
    let mut stalled: Vec<i64> = buckets
        .iter()
        .filter(|b| b.processed < b.tracked && b.bucket_ms < last_processed)
        .map(|b| b.bucket_ms)
        .collect();
    stalled.sort_unstable();
    stalled
}

/// A probe the tracking reader was handed.
#[derive(Debug, PartialEq, Eq)]
enum Probe {
    /// One of this reading's, with its sequence number.
    Own(u64),
    /// Another reading's: given back (nacked) while it is fresh, since another reader may still
    /// wait for it; a stale one is acked.
    Other {
        /// Nack it rather than ack it.
        give_back: bool,
    },
}

/// What `probe` (the attribute's value) is to the reading whose probes start with
/// `probe_prefix` (`<worker>/<start>/`).
fn classify_probe(probe: &str, probe_prefix: &str, publish_ms: i64, now: i64) -> Probe {
    if let Some(seq) = probe
        .strip_prefix(probe_prefix)
        .and_then(|seq| seq.parse::<u64>().ok())
    {
        return Probe::Own(seq);
    }
    // This worker's earlier readings' probes (replayed by its own seek) are given back too:
    // they hold the horizon as a backlog while the emulator is still handing the replay back
    // (acking them let `watermark_seek.rs` see 141 late rows under load).
    Probe::Other {
        give_back: publish_ms >= now - FOREIGN_PROBE_MS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(bucket_ms: i64, tracked: u64, processed: u64) -> BucketCounts {
        BucketCounts {
            bucket_ms,
            tracked,
            processed,
            min_event_ms: Some(bucket_ms),
        }
    }

    /// An unprocessed bucket behind processed ones holds the watermark however long it waits
    /// (a timed release would skip it); it is reported as stalled.
    #[test]
    fn an_unprocessed_bucket_is_waited_for_and_reported_stalled() {
        let buckets = [
            bucket(1_000, 2, 2),
            bucket(2_000, 3, 1),
            bucket(3_000, 4, 4),
        ];
        assert_eq!(first_unprocessed(&buckets), Some(2_000));
        assert_eq!(stalled_buckets(&buckets), [2_000]);
        // The newest bucket still filling is not stalled: nothing after it is processed.
        let filling = [bucket(1_000, 2, 2), bucket(2_000, 3, 0)];
        assert_eq!(first_unprocessed(&filling), Some(2_000));
        assert!(stalled_buckets(&filling).is_empty());
        assert_eq!(first_unprocessed(&[bucket(1_000, 2, 2)]), None);
    }

    #[test]
    fn fresh_probes_of_other_readings_are_given_back_stale_ones_acked() {
        let (prefix, now) = ("w1/1000/", 1_000_000);
        assert_eq!(classify_probe("w1/1000/7", prefix, now, now), Probe::Own(7));
        assert_eq!(
            classify_probe("w2/900/3", prefix, now - 1_000, now),
            Probe::Other { give_back: true }
        );
        assert_eq!(
            classify_probe("w2/900/3", prefix, now - FOREIGN_PROBE_MS - 1, now),
            Probe::Other { give_back: false }
        );
    }
}
