//! Why a commit attempt failed, how its retry is logged, and why a committer stops its flow: an
//! expectation with `on_violation: fail`, or a triggered run's `give_up_after` spent waiting for
//! an unavailable store or stage. Once stopped, no batch begins its commit (one already
//! committing ends as it would have).

use super::CommitThenAck;
use crate::flow::batch::Batch;
use sluice_store::StoreError;
use std::time::Duration;

/// Why one attempt at a batch failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum Failure {
    #[error("{0}")]
    Stage(String),
    #[error("stage unavailable: {0}")]
    StageUnavailable(String),
    #[error(transparent)]
    Store(StoreError),
    /// The caller cancelled `give_up` (a shutdown's deadline) while the commit was pending.
    #[error("gave up waiting for the commit at shutdown")]
    GaveUp,
    /// The store did not answer the commit within the run's `give_up_after`.
    #[error("the store did not answer the commit within {}s", .0.as_secs())]
    Unanswered(Duration),
}

/// [`Failure::Unanswered`] once `patience` has passed; never without one.
pub(super) async fn unanswered_within(patience: Option<Duration>) -> Failure {
    match patience {
        Some(patience) => {
            tokio::time::sleep(patience).await;
            Failure::Unanswered(patience)
        }
        None => std::future::pending().await,
    }
}

/// Why a committer stopped its flow (set once).
#[derive(Debug, Clone)]
pub(crate) enum Stopped {
    /// A record violated an expectation with `on_violation: fail`.
    Expectation(String),
    /// The store or stage stayed unavailable for longer than `give_up_after`.
    GaveUp(String),
}

impl CommitThenAck {
    /// Stops the flow for `why` (the first reason given stands): its source is stopped and
    /// every batch from now on is given back unacked.
    pub(super) fn stop_the_flow(&self, why: Stopped) {
        let _ = self.failure.set(why);
        if let Some(stop) = &self.stop_flow {
            stop.cancel();
        }
    }

    /// Ends `batch`'s retries once the run's patience is spent: the flow stops (see
    /// [`Stopped::GaveUp`]) and the batch goes back unacked.
    pub(super) fn give_up_waiting(&self, batch: Batch, patience: Duration, failure: &Failure) {
        let what = match failure {
            Failure::StageUnavailable(_) => "the stage",
            _ => "the store",
        };
        let why = format!(
            "{what} stayed unavailable for {}s; the run gives up (give_up_after): {failure}",
            patience.as_secs()
        );
        tracing::error!(flow = %self.flow.name, batch = batch.id, %why,
            "giving up; the batch is not acked");
        self.stop_the_flow(Stopped::GaveUp(why));
        self.give_back_after_close(batch);
    }

    /// Logs the retry of `batch` after `failure`, `delay` from now.
    pub(super) fn log_retry(
        &self,
        batch: &Batch,
        failure: &Failure,
        message_at_fault: bool,
        step: u32,
        delay: Duration,
    ) {
        let retry_in_ms = delay.as_millis() as u64;
        if message_at_fault {
            tracing::warn!(flow = %self.flow.name, batch = batch.id,
                attempts = batch.deliveries()[0].attempts, error = %failure, retry_in_ms,
                "message failed; retrying");
        } else if matches!(failure, Failure::StageUnavailable(_)) {
            tracing::warn!(flow = %self.flow.name, batch = batch.id, step, retry_in_ms,
                error = %failure, "stage unavailable; retrying the batch (nothing acked)");
        } else {
            tracing::warn!(flow = %self.flow.name, batch = batch.id, step, retry_in_ms,
                error = %failure, "store unavailable; retrying the commit (nothing acked)");
        }
    }
}
