//! The tracking subscription of a flow with a watermark: created (`tracking_subscription:
//! auto`) at a snapshot of its base subscription, so what already waits there is tracked too,
//! and checked against its base (the same topic; the base's filter plus the probes).
//!
//! Guarantees: no reader reads a new tracking subscription before it was moved to its base's
//! backlog, whichever replica made it and wherever one stopped; a tracking subscription that
//! would see other messages than its base is refused, never read.

use super::admin::{Admin, is_not_found, is_refusal, rpc};
use super::probe::PROBE_ATTRIBUTE;
use crate::source::SourceError;
use google_cloud_gax::error::rpc::Code;

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

impl Admin {
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
}

/// The filter of a tracking subscription for a base subscription with `base_filter`: the same
/// messages, and the tracking reader's probes ([`PROBE_ATTRIBUTE`]) whatever the base
/// filter says (no filter: no filter).
pub fn tracking_filter(base_filter: &str) -> String {
    if base_filter.trim().is_empty() {
        String::new()
    } else {
        format!("({base_filter}) OR attributes:{PROBE_ATTRIBUTE}")
    }
}
