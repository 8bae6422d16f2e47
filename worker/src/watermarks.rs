//! Starting a Pub/Sub flow's watermark tracker beside the flow (`watermark:` in its source):
//! the tracking subscription is resolved (`auto`: `<subscription>-tracking`, created on the
//! base subscription's topic with its filter when missing) and a
//! [`sluice_connector::WatermarkTracker`] runs until the flow's run ends, then stores its last
//! counts. How the watermark is estimated, and what it guarantees: `sluice_connector`'s
//! `tracking` module and the `sluice_watermark` crate.

use sluice_connector::pubsub::Admin;
use sluice_connector::{Counters, FlowWatermark, PubSubConfig, TrackerSettings, WatermarkTracker};
use sluice_pipeline::{Flow, OnBadTimestamp, Pipeline, Source, TrackingSubscription};
use sluice_store::{FlowHandle, Store};
use std::sync::Arc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What a flow with a watermark needs to start its tracker.
#[derive(Debug, Clone)]
pub struct WatermarkPlan {
    config: PubSubConfig,
    base_subscription: String,
    tracking_subscription: String,
    create_if_missing: bool,
    settings: TrackerSettings,
    watermark: FlowWatermark,
}

impl WatermarkPlan {
    /// The flow's watermark (shared with its counters and batches).
    pub fn watermark(&self) -> &FlowWatermark {
        &self.watermark
    }
}

/// The plan of `flow`'s watermark, if its source asks for one; attaches the watermark to the
/// flow's `counters` (processed counts, late rows, gauges).
pub fn plan(pipeline: &Pipeline, flow: &Flow, counters: &Counters) -> Option<WatermarkPlan> {
    let Source::PubSub(source) = &flow.source else {
        return None;
    };
    let settings = source.watermark.as_ref()?;
    let (tracking_subscription, create_if_missing) = match &settings.tracking_subscription {
        TrackingSubscription::Auto => (format!("{}-tracking", source.subscription), true),
        TrackingSubscription::Named(name) => (name.clone(), false),
    };
    let watermark = FlowWatermark::new();
    counters.attach_watermark(watermark.clone());
    Some(WatermarkPlan {
        config: PubSubConfig {
            project: pipeline.pubsub.project.clone(),
            endpoint: pipeline.pubsub.endpoint.clone(),
        },
        base_subscription: source.subscription.clone(),
        tracking_subscription: tracking_subscription.clone(),
        create_if_missing,
        settings: TrackerSettings {
            tracking_subscription,
            event_time_attribute: source.event_time.as_ref().map(|e| e.attribute.clone()),
            bad_timestamp_uses_publish_time: source
                .event_time
                .as_ref()
                .is_some_and(|e| e.on_bad_timestamp == OnBadTimestamp::PublishTime),
            band_ms: i64::try_from(settings.band.as_millis()).unwrap_or(i64::MAX),
            worker: String::new(),
        },
        watermark,
    })
}

/// A running tracker.
pub struct RunningTracker {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl RunningTracker {
    /// Stops it after the flow's run ended (its last processed counts are stored first).
    pub async fn finish(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Resolves the tracking subscription and starts the tracker of `flow`.
pub async fn start(
    plan: WatermarkPlan,
    store: Arc<dyn Store>,
    flow: FlowHandle,
    worker: &str,
) -> Result<RunningTracker, String> {
    if plan.create_if_missing {
        let admin = Admin::connect(&plan.config)
            .await
            .map_err(|e| format!("cannot reach Pub/Sub for the tracking subscription: {e}"))?;
        let created = admin
            .ensure_tracking_subscription(&plan.base_subscription, &plan.tracking_subscription)
            .await
            .map_err(|e| {
                format!(
                    "cannot create the tracking subscription {}: {e}",
                    plan.tracking_subscription
                )
            })?;
        if created {
            tracing::info!(flow = %flow.name, subscription = %plan.tracking_subscription,
                "created the tracking subscription");
        }
    }
    let settings = TrackerSettings {
        worker: worker.to_owned(),
        ..plan.settings
    };
    let tracker = WatermarkTracker::new(store, flow, plan.config, settings, plan.watermark);
    let stop = CancellationToken::new();
    let task = tokio::spawn(tracker.run(stop.clone()));
    Ok(RunningTracker { stop, task })
}
