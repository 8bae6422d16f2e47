//! Starting a Pub/Sub flow's watermark tracker beside the flow (`watermark:` in its source):
//! the tracking subscription is resolved (`auto`: `<subscription>-tracking`, which the tracking
//! reader creates on the base subscription's topic with its filter when missing, started at a
//! snapshot of the base subscription, before it first reads) and a
//! [`sluice_engine::WatermarkTracker`] runs until the flow's run ends, then stores its last
//! counts. Pub/Sub being unreachable never fails the flow: the reader
//! retries and the watermark holds meanwhile.
//!
//! `auto` tracking subscriptions are also created when the worker starts, before any flow
//! runs (`tracking_subscriptions.rs`).
//!
//! `SLUICE_PROBE_ENDPOINT` in the environment, when set, is where the tracking readers publish
//! their probes instead of `pubsub.endpoint` ([`PROBE_ENDPOINT_ENV`]).
//!
//! How the watermark is estimated, and what it guarantees: `sluice_connector`'s `tracking`
//! module and the `sluice_watermark` crate.

use sluice_engine::{Counters, FlowWatermark, PubSubConfig, TrackerSettings, WatermarkTracker};
use sluice_pipeline::{Flow, OnBadTimestamp, Pipeline, PubSubSource, Source, TrackingSubscription};
use sluice_store::{FlowHandle, Store};
use std::sync::Arc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The environment variable that sends the tracking readers' probes to another endpoint than
/// `pubsub.endpoint` (the tests put a fault proxy on the probe publisher alone with it).
pub const PROBE_ENDPOINT_ENV: &str = "SLUICE_PROBE_ENDPOINT";

/// What a flow with a watermark needs to start its tracker.
#[derive(Debug, Clone)]
struct WatermarkPlan {
    config: PubSubConfig,
    settings: TrackerSettings,
    watermark: FlowWatermark,
}

/// The tracking subscription of a Pub/Sub source with a watermark (`auto`:
/// `<subscription>-tracking`), and whether it is `auto`.
pub fn tracking_subscription(source: &PubSubSource) -> Option<(String, bool)> {
    let settings = source.watermark.as_ref()?;
    Some(match &settings.tracking_subscription {
        TrackingSubscription::Auto => (format!("{}-tracking", source.subscription), true),
        TrackingSubscription::Named(name) => (name.clone(), false),
    })
}

/// The plan of `flow`'s watermark, if its source asks for one; attaches the watermark to the
/// flow's `counters` (processed counts, late rows, gauges).
fn plan(pipeline: &Pipeline, flow: &Flow, counters: &Counters) -> Option<WatermarkPlan> {
    let Source::PubSub(source) = &flow.source else {
        return None;
    };
    let settings = source.watermark.as_ref()?;
    let (tracking_subscription, create_if_missing) = tracking_subscription(source)?;
    let watermark = FlowWatermark::new();
    counters.attach_watermark(watermark.clone());
    Some(WatermarkPlan {
        config: PubSubConfig {
            project: pipeline.pubsub.project.clone(),
            endpoint: pipeline.pubsub.endpoint.clone(),
        },
        settings: TrackerSettings {
            tracking_subscription,
            create_from: create_if_missing.then(|| source.subscription.clone()),
            event_time_attribute: source.event_time.as_ref().map(|e| e.attribute.clone()),
            bad_timestamp_uses_publish_time: source
                .event_time
                .as_ref()
                .is_some_and(|e| e.on_bad_timestamp == OnBadTimestamp::PublishTime),
            band_ms: i64::try_from(settings.band.as_millis()).unwrap_or(i64::MAX),
            base_subscription: source.subscription.clone(),
            worker: String::new(),
            probe_endpoint: std::env::var(PROBE_ENDPOINT_ENV)
                .ok()
                .filter(|e| !e.trim().is_empty()),
        },
        watermark,
    })
}

/// A running tracker.
pub struct RunningTracker {
    watermark: FlowWatermark,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl RunningTracker {
    /// The flow's watermark (shared with its counters and batches).
    pub fn watermark(&self) -> &FlowWatermark {
        &self.watermark
    }

    /// Stops it after the flow's run ended (its last processed counts are stored first).
    pub async fn finish(self) {
        self.stop.cancel();
        if let Err(error) = self.task.await {
            tracing::error!(%error, "the watermark tracker failed");
        }
    }
}

/// Starts the tracker of `flow` (stored under `handle`, run as `worker`) when its source asks
/// for a watermark, which is attached to its `counters` (processed counts, late rows, gauges).
pub fn start(
    pipeline: &Pipeline,
    flow: &Flow,
    counters: &Counters,
    store: Arc<dyn Store>,
    handle: FlowHandle,
    worker: &str,
) -> Option<RunningTracker> {
    let plan = plan(pipeline, flow, counters)?;
    let settings = TrackerSettings {
        worker: worker.to_owned(),
        ..plan.settings
    };
    let watermark = plan.watermark;
    let tracker = WatermarkTracker::new(store, handle, plan.config, settings, watermark.clone());
    let stop = CancellationToken::new();
    let task = tokio::spawn(tracker.run(stop.clone()));
    Some(RunningTracker {
        watermark,
        stop,
        task,
    })
}
