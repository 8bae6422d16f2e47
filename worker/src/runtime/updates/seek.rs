//! `--seek TIME` (`sluice reset FLOW --seek`, `sluice full-refresh --seek`, the control API's
//! `ResetFlow`): which subscriptions a reset seeks, checked before anything is cleared, and the
//! seek itself, after the store was reset (`refresh.rs`).
//!
//! # Guarantees
//!
//! * `--seek TIME` is refused unless the subscription retains acked messages for long enough
//!   to replay everything since TIME, and so does the flow's tracking subscription (if it
//!   exists), which is seeked to TIME first so the replay is tracked; the seeks happen after
//!   the store reset, so a replayed message never meets a stale ledger or an old row. The
//!   reset of a flow with a watermark also records each row it deletes as tracked and not
//!   settled, so the watermark holds at the replay however Pub/Sub orders it on the tracking
//!   subscription (`ResetRows::PublishedSince`).
//! * **Nothing dropped unasked.** A seek to TIME also marks every message published before
//!   TIME as acknowledged, those no worker ever ingested too, and Pub/Sub does not tell how
//!   old its backlog is (only Cloud Monitoring does), so sluice cannot know whether any would
//!   be dropped: a seek is refused unless `--drop-unread` says that is meant. A seek time in
//!   the future is refused outright: it would acknowledge whatever is published until then.

use crate::runtime::flow::sinks;
use crate::runtime::updates::refresh_error::RefreshError;
use sluice_engine::pubsub::Admin;
use sluice_engine::{PubSubConfig, parse_event_time};
use sluice_pipeline::{Pipeline, Source};

/// A `--seek` request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Seek {
    /// RFC 3339 or ms since epoch.
    pub time: String,
    /// The user accepts that messages published before the time and never ingested are
    /// dropped (`--drop-unread`).
    pub drop_unread: bool,
}

/// Checks a full refresh's seek without doing anything: every Pub/Sub flow's subscription can
/// replay from its time.
pub async fn full_refresh_seeks(pipeline: &Pipeline, seek: &Seek) -> Result<(), RefreshError> {
    let all: Vec<String> = pipeline.flows.iter().map(|f| f.name.clone()).collect();
    seekable(
        pipeline,
        &all,
        Some(seek_time(&seek.time)?),
        seek.drop_unread,
    )
    .await?;
    Ok(())
}

/// A seek's time in ms since epoch: an RFC 3339 time or ms, not in the future (a seek marks
/// everything published before its time as acknowledged, so a time ahead would also drop what
/// is published from now until then, and the reset would delete no row to replay).
pub fn seek_time(time: &str) -> Result<i64, RefreshError> {
    let ms = parse_event_time(time).ok_or_else(|| {
        RefreshError::Invalid(format!(
            "--seek {time:?}: not an RFC 3339 time or ms since epoch"
        ))
    })?;
    let now = sluice_engine::now_ms();
    if ms > now {
        return Err(RefreshError::Invalid(format!(
            "--seek {time:?} is {} s in the future: a seek acknowledges every message published \
             before its time, so every message published until then would be dropped unread; \
             seek to a time in the past",
            (ms - now).unsigned_abs().div_ceil(1_000)
        )));
    }
    Ok(ms)
}

fn admin_config(pipeline: &Pipeline) -> PubSubConfig {
    PubSubConfig {
        project: pipeline.pubsub.project.clone(),
        endpoint: pipeline.pubsub.endpoint.clone(),
    }
}

/// The subscriptions of the named Pub/Sub flows to seek to `seek_ms`, after checking that each
/// can replay everything published since then (it retains acked messages, for long enough):
/// their rows published since then are deleted, so what cannot be replayed would be lost; and
/// that the user accepted dropping what was published before and never ingested
/// (`drop_unread`).
pub async fn seekable(
    pipeline: &Pipeline,
    names: &[String],
    seek_ms: Option<i64>,
    drop_unread: bool,
) -> Result<Vec<(String, i64)>, RefreshError> {
    let Some(ms) = seek_ms else {
        return Ok(Vec::new());
    };
    let mut subscriptions = Vec::new();
    let mut trackings = Vec::new();
    for flow in pipeline.flows.iter().filter(|f| names.contains(&f.name)) {
        let Source::PubSub(settings) = &flow.source else {
            continue;
        };
        if sinks::sink_of(pipeline, flow).is_some() {
            return Err(RefreshError::Invalid(format!(
                "--seek: flow `{}` writes a sink, whose files mix records published before and \
                 after the seek time; they cannot be split, so a sink flow cannot be seeked",
                flow.name
            )));
        }
        subscriptions.push(settings.subscription.clone());
        if let Some((tracking, _)) =
            crate::runtime::flow::watermarks::tracking_subscription(settings)
        {
            trackings.push(tracking);
        }
    }
    if subscriptions.is_empty() {
        return Ok(Vec::new());
    }
    let unreachable = |e: sluice_engine::SourceError| {
        RefreshError::Failed(format!("cannot ask Pub/Sub about the subscriptions: {e}"))
    };
    let admin = Admin::connect(&admin_config(pipeline))
        .await
        .map_err(unreachable)?;
    for subscription in &subscriptions {
        let window = admin
            .replay_window(subscription)
            .await
            .map_err(unreachable)?;
        let Some(window) = window else {
            return Err(RefreshError::Invalid(format!(
                "--seek: subscription {subscription} does not retain acked messages, so a seek \
                 cannot replay what was acked and those rows would be lost; set \
                 retain_acked_messages on it, or reset without --seek (rows are then kept)"
            )));
        };
        let oldest = sluice_engine::now_ms()
            .saturating_sub(i64::try_from(window.as_millis()).unwrap_or(i64::MAX));
        if ms < oldest {
            return Err(RefreshError::Invalid(format!(
                "--seek {ms}: subscription {subscription} retains messages for {}s only; \
                 seek to {oldest} ms or later",
                window.as_secs()
            )));
        }
        if !drop_unread {
            return Err(RefreshError::Invalid(format!(
                "--seek {ms}: a seek marks every message published before that time as \
                 acknowledged, also any that no worker ingested yet, and Pub/Sub does not say \
                 whether subscription {subscription} holds such messages; add --drop-unread to \
                 seek anyway, or seek to an earlier time (rows published since then are \
                 replayed, once)"
            )));
        }
    }
    // A tracking subscription is seeked with its flow's (first), or the replay would not be
    // tracked: the watermark would pass the replayed rows and close their windows without them.
    let mut seeks = Vec::new();
    for tracking in trackings {
        if !admin
            .subscription_exists(&tracking)
            .await
            .map_err(unreachable)?
        {
            continue; // created later, at the base subscription's backlog
        }
        let window = admin.replay_window(&tracking).await.map_err(unreachable)?;
        let oldest = window.map(|w| {
            sluice_engine::now_ms().saturating_sub(i64::try_from(w.as_millis()).unwrap_or(i64::MAX))
        });
        if oldest.is_none_or(|oldest| ms < oldest) {
            return Err(RefreshError::Invalid(format!(
                "--seek {ms}: tracking subscription {tracking} cannot replay from then (it does \
                 not retain acked messages for long enough), so the replay would not be \
                 tracked and the watermark would pass its rows; set retain_acked_messages and \
                 a retention as long as its flow's subscription's on it (sluice creates `auto` \
                 ones so), or delete it to have it made again"
            )));
        }
        seeks.push((tracking, ms));
    }
    seeks.extend(subscriptions.into_iter().map(|s| (s, ms)));
    Ok(seeks)
}

/// Seeks one subscription (after the store was reset).
pub async fn seek_subscription(
    pipeline: &Pipeline,
    subscription: &str,
    ms: i64,
) -> Result<(), RefreshError> {
    let failed = |e: sluice_engine::SourceError| {
        RefreshError::Failed(format!(
            "the store was reset, but seeking {subscription} failed: {e}; run the command \
             again with --seek"
        ))
    };
    let admin = Admin::connect(&admin_config(pipeline))
        .await
        .map_err(failed)?;
    admin.seek_to_time(subscription, ms).await.map_err(failed)
}

/// Checks a reset of `flow` with `seek` without doing it: the flow exists, and the seek (if
/// any) is a time its subscription can replay from. Returns the subscription to seek.
pub async fn reset_seeks(
    pipeline: &Pipeline,
    flow: &str,
    seek: Option<&Seek>,
) -> Result<Vec<(String, i64)>, RefreshError> {
    let Some(declared) = pipeline.flows.iter().find(|f| f.name == flow) else {
        let names: Vec<&str> = pipeline.flows.iter().map(|f| f.name.as_str()).collect();
        return Err(RefreshError::Invalid(format!(
            "no flow named `{flow}` (declared: {})",
            names.join(", ")
        )));
    };
    let seek_ms = match seek {
        None => None,
        Some(seek) => {
            if !matches!(declared.source, Source::PubSub(_)) {
                return Err(RefreshError::Invalid(format!(
                    "--seek: flow `{flow}` reads no Pub/Sub subscription"
                )));
            }
            Some(seek_time(&seek.time)?)
        }
    };
    let drop_unread = seek.is_some_and(|s| s.drop_unread);
    seekable(pipeline, &[flow.to_owned()], seek_ms, drop_unread).await
}
