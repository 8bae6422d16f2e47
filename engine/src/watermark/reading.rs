//! The tracking reader's stream, while this worker holds the `watermark/<flow>` lease: opening
//! it (the tracking subscription created if asked, a probe published, the subscription sought
//! back to the stored horizon), counting what it delivered each tick, storing those reports,
//! and closing it.
//!
//! Guarantee: a delivered message is acked only once its report is stored
//! ([`Reading::store_tracked`]); what is not stored when the stream closes is nacked back to
//! whoever reads next.

use super::probes::{Probe, Probes};
use super::stall::StallWatch;
use super::tracker_settings::TrackerSettings;
use crate::flow::budget::Budget;
use crate::flow::event_time::parse_event_time;
use crate::source::pubsub::{
    Admin, PROBE_ATTRIBUTE, PubSubConfig, PubSubSource, is_probe, log_tracking_start, probe_message,
};
use crate::source::{INTAKE_CAPACITY, MessageSource, Received, SourceError, SourceHandle};
use crate::time::now_ms;
use crate::watermark::bucket_of;
use sluice_store::{BucketMessage, FlowHandle, MessageReport, Store, StoreError};
use sluice_watermark::{DEFAULT_QUIET_MS, DeliveryHorizon, SluiceEstimator};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A reader whose clock is further than this off Pub/Sub's (as its probes measure it) is
/// logged: the watermark does not depend on it, but other time-keeping may.
pub const CLOCK_OFFSET_ALERT_MS: i64 = 5_000;
/// A reader that starts after another (or after a restart or a reopen) moves no watermark for
/// this long: what the earlier one was handed and did not store comes back after its lease
/// lapsed (10 s) even where the seek back does not bring it at once.
pub const HOLD_AFTER_START: Duration = Duration::from_secs(60);
/// How long the reader waits for Pub/Sub to answer before it hands the lease over, and how
/// long it leaves the lease to others after that.
pub const READ_RETRY: Duration = Duration::from_secs(10);
/// Messages the tracking reader holds unacked, at most (they are acked each tick).
const TRACKING_BUDGET: usize = 20_000;

/// The tracking reader's running state (only while this worker holds the lease).
pub struct Reading {
    source: Box<dyn SourceHandle>,
    stop: CancellationToken,
    intake: mpsc::Receiver<Received>,
    horizon: DeliveryHorizon,
    /// Delivered, reported in `pending`, not yet stored: acked once the reports are stored.
    held: Vec<Received>,
    pending: Vec<BucketMessage>,
    /// Turns the stored counts into the watermark.
    pub estimator: SluiceEstimator,
    /// Published each tick; only those that come back move the horizon.
    probes: Probes,
    /// Counts the stream's reopens: what was in flight on a broken stream comes back only
    /// after its ack deadline, so the reader starts again (and seeks) rather than go on.
    reopens: Arc<AtomicU64>,
    /// Buckets left unprocessed behind processed ones, for the alert.
    pub stall: StallWatch,
    /// Whether the clock offset alert was logged, to log once per episode.
    offset_logged: bool,
    /// Every message published before this is tracked already: the horizon stored when the
    /// reader started (the seek's time), then the start of the buckets it pruned. A
    /// redelivery of one (a lost ack) is acked without a report, since its bucket may be
    /// pruned and a report would make it look unprocessed for ever.
    pub tracked_before: i64,
    /// Until then (reader's clock) the horizon does not move past the stored one: see
    /// [`HOLD_AFTER_START`].
    pub hold_until: i64,
    /// The horizon as of the last drain of the intake (computed at the same instant, so no
    /// message that arrived after the drain can lie before it uncounted).
    pub live_horizon: Option<i64>,
}

impl Reading {
    /// Creates the tracking subscription if asked and missing, and opens its stream; gives up
    /// (to be retried) when Pub/Sub does not answer within [`READ_RETRY`] or `stop` comes.
    pub async fn start(
        flow: &FlowHandle,
        pubsub: &PubSubConfig,
        settings: &TrackerSettings,
        stop: &CancellationToken,
        stored_horizon: Option<i64>,
    ) -> Result<Reading, SourceError> {
        let no_answer = || SourceError::Rpc(format!("no answer within {READ_RETRY:?}"));
        let tracking = &settings.tracking_subscription;
        let probe_prefix = format!("{}/{}/", settings.worker, now_ms());
        let mut horizon = DeliveryHorizon::new(DEFAULT_QUIET_MS);
        let mut next_probe = 0;
        let probes = tokio::time::timeout(READ_RETRY, async {
            let admin = Admin::connect(pubsub).await?;
            if let Some(base) = &settings.create_from {
                let start = admin.ensure_tracking_subscription(base, tracking).await?;
                log_tracking_start(&flow.name, tracking, &start);
            }
            let topic = admin
                .tracking_topic(&settings.base_subscription, tracking)
                .await?;
            let probes = match &settings.probe_endpoint {
                None => admin.publisher(&topic).await?,
                Some(endpoint) => {
                    let config = PubSubConfig {
                        endpoint: Some(endpoint.clone()),
                        ..pubsub.clone()
                    };
                    Admin::connect(&config).await?.publisher(&topic).await?
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
                tracing::warn!(flow = %flow.name, subscription = %tracking,
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
                    .map_err(|e| SourceError::Rpc(e.to_string()))?;
                next_probe += 1;
                admin.seek_to_time(tracking, stored).await?;
            }
            Ok::<_, SourceError>(probes)
        })
        .await
        .map_err(|_| no_answer())??;
        let reopens = Arc::new(AtomicU64::new(0));
        let source = PubSubSource::new(pubsub.clone(), tracking, 1)?
            .delivering_probes()
            .counting_reopens(reopens.clone())
            .labelled(&flow.pipeline, &flow.name);
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
        let probes = Probes::new(flow, probes, probe_prefix, next_probe);
        Ok(Reading {
            reopens,
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
            estimator: SluiceEstimator::new(settings.band_ms),
            probes,
            stall: StallWatch::default(),
            offset_logged: false,
            live_horizon: None,
        })
    }

    /// Closes the stream; deliveries not stored go back (nacked) to whoever reads next.
    pub async fn stop(self) {
        let Reading {
            source,
            stop,
            intake,
            held,
            ..
        } = self;
        stop.cancel();
        // Uncounted deliveries go back (nacked when dropped) to whoever reads next.
        drop(held);
        drop(intake);
        source.close().await;
    }

    /// Whether the stream was reopened since it started (the reader then starts again).
    pub fn reopened(&self) -> bool {
        self.reopens.load(Ordering::Relaxed) > 0
    }

    /// Counts what the tracking stream delivered since the last tick, then publishes the next
    /// probe.
    pub fn take_deliveries(&mut self, flow: &FlowHandle, settings: &TrackerSettings) {
        let now = now_ms();
        self.probes.take_outcomes(flow, &mut self.horizon);
        while let Ok(received) = self.intake.try_recv() {
            let message = &received.message;
            // Data carrying the attribute without being a probe is tracked as data (its flow
            // dead-letters it, which settles it).
            if let Some(probe) = message
                .attributes
                .get(PROBE_ATTRIBUTE)
                .filter(|value| is_probe(value, &message.data))
            {
                match self.probes.classify(probe, message.publish_time_ms, now) {
                    Probe::Own(seq) => {
                        self.horizon
                            .probe_delivered(seq, message.publish_time_ms, now);
                        received.handle.ack();
                    }
                    Probe::Other { give_back } => {
                        self.horizon.delivered(message.publish_time_ms, now);
                        if give_back {
                            received.handle.nack();
                        } else {
                            received.handle.ack();
                        }
                    }
                }
                continue;
            }
            if message.publish_time_ms < self.tracked_before {
                // Tracked already; as a late delivery it still shows a backlog.
                self.horizon.delivered(message.publish_time_ms, now);
                received.handle.ack();
                continue;
            }
            let bucket = bucket_of(message.publish_time_ms);
            // An event time outside the band holds the watermark only while its bucket is
            // unprocessed; nothing holds the horizon for it (it is late by definition).
            let event = event_time(settings, message);
            self.pending.push(BucketMessage {
                bucket_ms: bucket,
                message_id: message.message_id.clone(),
                report: MessageReport::Tracked { event_ms: event },
            });
            self.horizon.delivered(message.publish_time_ms, now);
            self.held.push(received);
        }
        self.live_horizon = self.horizon.horizon(now);
        metrics::gauge!(
            "sluice_watermark_probes_outstanding",
            &super::flow_labels(flow)
        )
        .set(self.horizon.outstanding_probes() as f64);
        self.probes.log_given_up(flow, &self.horizon);
        self.publish_offset(flow);
        self.probes.send(&mut self.horizon, now);
    }

    /// Shows the reader's clock offset from Pub/Sub's (`sluice_tracking_clock_offset_seconds`)
    /// and logs it once when it passes [`CLOCK_OFFSET_ALERT_MS`].
    fn publish_offset(&mut self, flow: &FlowHandle) {
        let Some(offset) = self.horizon.clock_offset() else {
            return;
        };
        metrics::gauge!(
            "sluice_tracking_clock_offset_seconds",
            &super::flow_labels(flow)
        )
        .set(offset as f64 / 1000.0);
        let off = offset.abs() > CLOCK_OFFSET_ALERT_MS;
        if off && !self.offset_logged {
            tracing::warn!(flow = %flow.name, offset_ms = offset,
                "this worker's clock is off Pub/Sub's (probe receipt − publish time); the \
                 watermark keeps to Pub/Sub's clock, but check the machine's time sync");
        }
        self.offset_logged = off;
    }

    /// Stores the tracked reports, then acks what they report.
    pub async fn store_tracked(
        &mut self,
        store: &dyn Store,
        flow: &FlowHandle,
    ) -> Result<(), StoreError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        store.add_bucket_messages(flow, &self.pending).await?;
        self.pending.clear();
        for received in self.held.drain(..) {
            received.handle.ack();
        }
        Ok(())
    }
}

/// The event time the flow's stage will give the message; `None` for a message it will
/// dead-letter (a bad timestamp), which never becomes a row and so is never late.
fn event_time(settings: &TrackerSettings, message: &crate::SourceMessage) -> Option<i64> {
    let Some(name) = &settings.event_time_attribute else {
        return Some(message.publish_time_ms);
    };
    match message
        .attributes
        .get(name)
        .and_then(|v| parse_event_time(v))
    {
        Some(ms) => Some(ms),
        None if settings.bad_timestamp_uses_publish_time => Some(message.publish_time_ms),
        None => None,
    }
}
