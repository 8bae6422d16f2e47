//! A committed batch's sink file: published before the batch is acked, and, when the commit
//! reported an error after its transaction ran, decided from the store.
//!
//! Guarantee: a batch writing a sink is acked only once its file is published, or left under
//! its temporary name for the next start's recovery when the caller gives up; a file whose
//! commit did not land is discarded.

use super::CommitThenAck;
use crate::backoff::Backoff;
use crate::flow::sink::SinkCommit;
use std::sync::Arc;

impl CommitThenAck {
    /// Publishes a committed sink file before the batch is acked, retrying with backoff as
    /// long as it fails (a full disk, a permission taken away): the ack waits, as it does for
    /// a store outage. Only when the caller gives up (shutdown) is the file left under its
    /// temporary name for the next start's recovery, which publishes it (its commit is
    /// recorded); the batch is acked then, since its records are committed.
    pub(super) async fn publish(&self, sink: &SinkCommit) {
        let mut backoff = Backoff::default();
        loop {
            let error = match sink.publish() {
                Ok(()) => return,
                Err(error) => error,
            };
            if self.give_up.is_cancelled() {
                tracing::error!(flow = %self.flow.name, commit = sink.commit_id(), %error,
                    "cannot publish a committed sink file; the next start's recovery will");
                sink.release();
                return;
            }
            let delay = backoff.next_delay();
            tracing::warn!(flow = %self.flow.name, commit = sink.commit_id(), %error,
                step = backoff.step(), retry_in_ms = delay.as_millis() as u64,
                "cannot publish a committed sink file; retrying (nothing acked)");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.give_up.cancelled() => {}
            }
        }
    }

    /// Decides the sink attempts whose commit reported an error after their transaction ran:
    /// published if the store recorded them (the answer was lost, the commit landed),
    /// discarded if not; left to the next start's recovery if the store cannot say.
    pub(super) async fn resolve_uncertain(&self, uncertain: Vec<Arc<SinkCommit>>) {
        for sink in uncertain {
            match self
                .store
                .commit_recorded(&self.flow, sink.commit_id())
                .await
            {
                Ok(true) => self.publish(&sink).await,
                Ok(false) => sink.discard(),
                Err(error) => {
                    tracing::warn!(flow = %self.flow.name, commit = sink.commit_id(), %error,
                        "cannot tell whether a sink commit landed; the next start's recovery will");
                    sink.release();
                }
            }
        }
    }
}
