//! `auto` tracking subscriptions (`<subscription>-tracking`) are created when the worker
//! starts, before any flow runs: a live flow that waits for a backfill (`depends_on`) starts
//! its watermark tracker late (`watermarks.rs`), and a message published in between must
//! already be on the tracking subscription, or the watermark could pass it.

use sluice_engine::{Backoff, PubSubConfig};
use sluice_pipeline::{Pipeline, Source, TrackingSubscription};
use tokio_util::sync::CancellationToken;

/// How long one attempt at creating a tracking subscription may take.
const CREATE_ATTEMPT: std::time::Duration = std::time::Duration::from_secs(10);

/// Creates the `auto` tracking subscriptions of `pipeline`'s flows that are missing, in the
/// background, retrying with backoff until each exists or `drain` is cancelled. The tracking
/// reader creates its own too, so a failure here is only logged.
pub fn create_tracking_subscriptions(pipeline: &Pipeline, drain: CancellationToken) {
    let config = PubSubConfig {
        project: pipeline.pubsub.project.clone(),
        endpoint: pipeline.pubsub.endpoint.clone(),
    };
    for flow in &pipeline.flows {
        let Source::PubSub(source) = &flow.source else {
            continue;
        };
        let Some(TrackingSubscription::Auto) =
            source.watermark.as_ref().map(|w| &w.tracking_subscription)
        else {
            continue;
        };
        let base = source.subscription.clone();
        let tracking = format!("{base}-tracking");
        let (config, drain, name) = (config.clone(), drain.clone(), flow.name.clone());
        tokio::spawn(async move {
            let mut backoff = Backoff::default();
            loop {
                let attempt = tokio::time::timeout(CREATE_ATTEMPT, async {
                    sluice_engine::pubsub::Admin::connect(&config)
                        .await?
                        .ensure_tracking_subscription(&base, &tracking)
                        .await
                })
                .await;
                match attempt {
                    Ok(Ok(start)) => {
                        sluice_engine::pubsub::log_tracking_start(&name, &tracking, &start);
                        return;
                    }
                    Ok(Err(error)) => tracing::warn!(flow = %name, %error,
                        "cannot create the tracking subscription yet; retrying"),
                    Err(_) => tracing::warn!(flow = %name,
                        "Pub/Sub did not answer creating the tracking subscription; retrying"),
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                    _ = drain.cancelled() => return,
                }
            }
        });
    }
}
