//! What bounded sources (JSONL files, a target table) share: delivering chunks of records
//! within the flow's budget, minus what the flow has already committed.
//!
//! # Guarantees
//!
//! * **Re-reading writes only what is missing.** With [`SkipCommitted`], each chunk is checked
//!   against the flow's rows and dead letters in the store
//!   ([`sluice_store::LedgerStore::keys_present`], which has no window) and what is there is
//!   skipped, so a bounded flow re-read after a crash, however much later, writes only what
//!   it had not; records in flight at the crash are caught by the dedup ledger like any
//!   redelivery. A store outage while asking is waited out with
//!   backoff (in a triggered run for at most its `give_up_after`, then the source fails);
//!   nothing is delivered unchecked.
//! * **No ack is needed.** A bounded record is found again by re-reading its source, so its ack
//!   handle does nothing; the flow's completion (recorded only when everything delivered was
//!   committed) is what says the source is done.
//! * A source that fails half-way says so in [`SourceProgress::failure`]; the flow is then
//!   failed, never complete.

use crate::backoff::Backoff;
use crate::flow::budget::Budget;
use crate::flow::delivery::{AckHandle, SourceMessage};
use crate::source::file_checkpoint::Checkpoints;
use crate::source::{Received, SourceHandle};
use async_trait::async_trait;
use sluice_store::LedgerStore;
use sluice_store::{FileCheckpoint, FlowHandle};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Records checked against the store and delivered together.
pub(crate) const CHUNK: usize = 500;

/// Where to look for what a flow already committed.
#[derive(Clone)]
pub struct SkipCommitted {
    /// The store the flow commits to.
    pub store: Arc<dyn LedgerStore>,
    /// The flow.
    pub flow: FlowHandle,
    /// Its target table (full name).
    pub table: Arc<str>,
}

/// How far a bounded source has got; shared with whoever draws a progress bar.
#[derive(Debug, Default)]
pub struct SourceProgress {
    /// Bytes to read, when known (files).
    pub bytes_total: AtomicU64,
    /// Bytes read so far (files).
    pub bytes_read: AtomicU64,
    /// Records delivered.
    pub delivered: AtomicU64,
    /// Records skipped because the flow had committed them before.
    pub skipped: AtomicU64,
    /// Records left out because their event time lies outside the run's data interval.
    pub outside_interval: AtomicU64,
    failure: Mutex<Option<String>>,
    /// The failure was a give-up (`give_up_after`): running the flow again at once is no use.
    gave_up: AtomicBool,
}

impl SourceProgress {
    /// Why reading stopped early, if it did: the flow must then be reported failed.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether the source failed because the store stayed unavailable for longer than the run
    /// was to wait (`give_up_after`).
    pub fn gave_up(&self) -> bool {
        self.gave_up.load(Ordering::Relaxed)
    }

    pub(crate) fn fail(&self, why: String) {
        tracing::error!(error = %why, "bounded source failed");
        self.failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_or_insert(why);
    }
}

/// Hands chunks of records to the batcher.
pub(crate) struct Deliverer {
    pub(crate) skip: Option<SkipCommitted>,
    pub(crate) progress: Arc<SourceProgress>,
    pub(crate) intake: mpsc::Sender<Received>,
    pub(crate) budget: Budget,
    pub(crate) stop: CancellationToken,
    /// How long the store's answers are waited for (`None`: for ever; a triggered run's
    /// `give_up_after`).
    pub(crate) patience: Option<Duration>,
}

impl Deliverer {
    /// A retry sequence for the store's answers, as patient as the run.
    pub(crate) fn backoff(&self) -> Backoff {
        Backoff::giving_up_after(self.patience)
    }

    /// Fails the source if `backoff` has run out of patience (`true`), after `error` while
    /// trying to `what`.
    pub(crate) fn gives_up(
        &self,
        backoff: &Backoff,
        what: &str,
        error: &dyn std::fmt::Display,
    ) -> bool {
        let Some(patience) = backoff.exhausted() else {
            return false;
        };
        self.progress.gave_up.store(true, Ordering::Relaxed);
        self.progress.fail(format!(
            "cannot {what}: the store stayed unavailable for {}s; the run gives up \
             (give_up_after): {error}",
            patience.as_secs()
        ));
        true
    }

    /// Delivers a chunk, minus what the flow already committed; `false` once stopped. With
    /// `track`, the chunk (ending at the checkpoint given) is registered there and its records
    /// settle it when acked.
    pub(crate) async fn deliver(
        &self,
        chunk: Vec<SourceMessage>,
        track: Option<(&Arc<Checkpoints>, FileCheckpoint)>,
    ) -> bool {
        let Some(present) = self.already_committed(&chunk).await else {
            return false;
        };
        let to_deliver = present.iter().filter(|p| !**p).count();
        let tracked =
            track.map(|(checkpoints, end)| (checkpoints, checkpoints.chunk(to_deliver, end)));
        let mut delivered = 0;
        for (message, present) in chunk.into_iter().zip(present) {
            if present {
                self.progress.skipped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if !self.deliver_one(message, tracked).await {
                if let Some((checkpoints, seq)) = tracked {
                    checkpoints.abandon(seq, to_deliver - delivered);
                }
                return false;
            }
            delivered += 1;
        }
        !self.stop.is_cancelled()
    }

    async fn deliver_one(
        &self,
        message: SourceMessage,
        tracked: Option<(&Arc<Checkpoints>, u64)>,
    ) -> bool {
        let permit = tokio::select! {
            _ = self.stop.cancelled() => return false,
            permit = self.budget.reserve_message() => permit,
        };
        let Some(permit) = permit else { return false };
        let permits = self.budget.reserve_bytes(permit, message.size()).await;
        let handle: Box<dyn AckHandle> = match tracked {
            Some((checkpoints, seq)) => checkpoints.ack_handle(seq),
            None => Box::new(NoAck),
        };
        if self
            .intake
            .send(Received::new(message, handle, permits))
            .await
            .is_err()
        {
            return false;
        }
        self.progress.delivered.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Which records of the chunk the flow has committed before, asking the store until it
    /// answers (an outage is waited out with backoff); `None` when stopped meanwhile.
    pub(crate) async fn already_committed(&self, chunk: &[SourceMessage]) -> Option<Vec<bool>> {
        let Some(skip) = &self.skip else {
            return Some(vec![false; chunk.len()]);
        };
        // As the batcher will key them (text the store cannot hold escaped).
        let keys: Vec<String> = chunk
            .iter()
            .map(|m| crate::flow::storable::storable(&m.message_id).into_owned())
            .collect();
        let mut backoff = self.backoff();
        loop {
            match skip
                .store
                .keys_present(&skip.flow, &skip.table, &keys)
                .await
            {
                Ok(present) => return Some(present),
                Err(error) => {
                    if self.gives_up(&backoff, "ask the store what the flow committed", &error) {
                        return None;
                    }
                    let delay = backoff.next_delay();
                    tracing::warn!(flow = %skip.flow.name, step = backoff.step(), %error,
                        "cannot ask the store what the flow committed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = self.stop.cancelled() => return None,
                    }
                }
            }
        }
    }
}

/// A running bounded source: one reading task.
pub(crate) struct Running {
    pub(crate) stop: CancellationToken,
    pub(crate) task: JoinHandle<()>,
    pub(crate) progress: Arc<SourceProgress>,
}

#[async_trait]
impl SourceHandle for Running {
    async fn close(self: Box<Self>) {
        self.stop.cancel();
        // A reading task that panicked closed the intake early, which looks like the end of
        // the source: it must fail the flow instead, never let it count as complete.
        if let Err(error) = self.task.await
            && error.is_panic()
        {
            self.progress
                .fail(format!("the source's reading task panicked: {error}"));
        }
    }
}

/// The ack handle of a bounded record (see the module docs).
struct NoAck;

impl AckHandle for NoAck {
    fn ack(self: Box<Self>) {}

    fn nack(self: Box<Self>) {}
}
