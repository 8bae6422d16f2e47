//! A started Pub/Sub source's handle: closing it lets confirmed acks already sent get their
//! answers (up to [`CLOSE_TIMEOUT`]) while the streams still run, then stops the streams and
//! waits, again bounded, for the client to flush the acks they hold. Whether the source is idle
//! is asked of Pub/Sub (`reachability.rs`).

use super::ack::PendingAcks;
use super::reachability::Reachability;
use crate::source::{IdleCheck, SourceHandle};
use async_trait::async_trait;
use google_cloud_pubsub::subscriber::ShutdownToken;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How long [`SourceHandle::close`] waits for the client to flush acks before giving up.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The streams of a running source.
pub(super) struct RunningPubSub {
    pub(super) stop: CancellationToken,
    pub(super) tokens: Arc<Mutex<Vec<ShutdownToken>>>,
    pub(super) tasks: JoinSet<()>,
    pub(super) ordered: bool,
    pub(super) pending: Arc<PendingAcks>,
    pub(super) reachability: Reachability,
}

#[async_trait]
impl SourceHandle for RunningPubSub {
    fn ordered(&self) -> bool {
        self.ordered
    }

    fn idle_check(&mut self) -> Option<Box<dyn IdleCheck>> {
        Some(Box::new(self.reachability.clone()))
    }

    async fn close(mut self: Box<Self>) {
        // Confirmed acks already sent get their answers while the streams still run.
        if tokio::time::timeout(CLOSE_TIMEOUT, self.pending.settled())
            .await
            .is_err()
        {
            tracing::warn!("confirmed acks still unanswered at close; they may come back");
        }
        self.stop.cancel();
        while self.tasks.join_next().await.is_some() {}
        let tokens =
            std::mem::take(&mut *self.tokens.lock().unwrap_or_else(PoisonError::into_inner));
        let all = futures::future::join_all(tokens.iter().map(ShutdownToken::shutdown));
        if tokio::time::timeout(CLOSE_TIMEOUT, all).await.is_err() {
            tracing::warn!("Pub/Sub streams did not finish flushing acks in time");
        }
    }
}
