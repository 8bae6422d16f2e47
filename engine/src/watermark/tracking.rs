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
//!   shows how long, and a warning is logged past [`STALL_ALERT`](super::stall::STALL_ALERT). Messages the flow can no
//!   longer read (seeked past with `--drop-unread`, forwarded by a Pub/Sub dead-letter policy,
//!   expired) hold it until the flow is reset.
//! * **The horizon** needs positive evidence of a live tracking stream: the reader publishes a
//!   probe (attribute [`PROBE_ATTRIBUTE`](crate::source::pubsub::PROBE_ATTRIBUTE), empty data) to the topic every [`TICK`], and only
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
//!   `sluice_tracking_clock_offset_seconds` and logged past [`CLOCK_OFFSET_ALERT_MS`](super::reading::CLOCK_OFFSET_ALERT_MS).
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
//!   moves no watermark for [`HOLD_AFTER_START`](super::reading::HOLD_AFTER_START). What
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
//!
//! The reader's stream is `reading.rs`, its probes `probes.rs`, the stall alert `stall.rs`;
//! this file holds the lease, runs the ticks and stores the estimate.

use super::reading::{READ_RETRY, Reading};
use super::stall::first_unprocessed;
use super::tracker_settings::TrackerSettings;
use crate::source::pubsub::PubSubConfig;
use crate::time::now_ms;
use crate::watermark::{FlowWatermark, bucket_of};
use sluice_store::{FlowHandle, LeaseGrant, LeaseRequest, Store, StoreError, WatermarkRecord};
use sluice_watermark::TrackingHistogram;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a tracker reports, renews and estimates.
pub const TICK: Duration = Duration::from_millis(500);
/// How long the tracking-reader lease lasts without renewal.
pub const LEASE_TTL: Duration = Duration::from_secs(15);

/// One worker's tracker of one flow's watermark.
pub struct WatermarkTracker {
    store: Arc<dyn Store>,
    flow: FlowHandle,
    pubsub: PubSubConfig,
    settings: TrackerSettings,
    watermark: FlowWatermark,
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
            let _ = reading.store_tracked(&*self.store, &self.flow).await;
            reading.stop().await;
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
                reading.stop().await;
            }
            return self.follow().await;
        }
        if reading.is_none() {
            let stored_horizon = self.stored_record().await?.map(|r| r.horizon_ms);
            let started = Reading::start(
                &self.flow,
                &self.pubsub,
                &self.settings,
                stop,
                stored_horizon,
            )
            .await;
            match started {
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
        current.take_deliveries(&self.flow, &self.settings);
        current.store_tracked(&*self.store, &self.flow).await?;
        if current.reopened() {
            // Starting again publishes a probe and seeks back to the stored horizon, so what
            // the broken stream held comes back before the horizon moves on.
            tracing::warn!(flow = %self.flow.name,
                "the tracking stream was reopened; reading it again from the stored horizon");
            if let Some(broken) = reading.take() {
                broken.stop().await;
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
        reading.stall.observe(&self.flow, &buckets, now);
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
}
