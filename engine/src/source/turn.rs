//! A reader's turn in a pool: the lease `feed/<flow>` that makes one replica at a time read a
//! bounded or followed source for a flow (a table, a file backfill), and the same for other
//! one-holder work (`dead_letter_topic`, the dead-letter publisher).
//!
//! # Guarantees
//!
//! * At most one holder at any instant of the store's clock (the store's lease); a holder that
//!   dies loses it within [`TURN_TTL`], and one that stops cleanly gives it up at once.
//! * Holding it is advisory: a holder paused past its expiry may still be reading when another
//!   takes over. What the sources do with that is theirs to make safe (a table's position
//!   changes are fenced; a file's records are checked against the ledger), so the turn only
//!   keeps replicas from doing the same work, and [`Turn::lost`] tells its holder to stop.

use sluice_store::{FlowHandle, LeaseGrant, LeaseRequest, MembershipStore};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long a reader's turn (`feed/<flow>` lease) lasts unless renewed.
pub const TURN_TTL: Duration = Duration::from_secs(10);

/// The lease that makes one replica at a time read a source for a flow.
#[derive(Clone)]
pub struct ReaderTurn {
    /// The pool's store.
    pub pool: Arc<dyn MembershipStore>,
    /// This worker's id.
    pub holder: String,
}

impl ReaderTurn {
    fn request(&self, pipeline: &str, role: &str) -> LeaseRequest {
        LeaseRequest {
            pipeline: pipeline.to_owned(),
            role: role.to_owned(),
            holder: self.holder.clone(),
            ttl: TURN_TTL,
        }
    }

    /// Waits until this worker holds `flow`'s turn, then keeps renewing it in the background
    /// until the returned [`Turn`] is dropped; `None` once `stop` is cancelled. `what` names
    /// the source in the log lines.
    pub(crate) async fn take(
        &self,
        flow: &FlowHandle,
        what: &str,
        stop: &CancellationToken,
    ) -> Option<Turn> {
        let role = format!("feed/{}", flow.name);
        self.take_role(&flow.pipeline, &role, what, stop).await
    }

    /// [`ReaderTurn::take`] for any one-holder role of `pipeline` (`role` is the lease's name).
    pub(crate) async fn take_role(
        &self,
        pipeline: &str,
        role: &str,
        what: &str,
        stop: &CancellationToken,
    ) -> Option<Turn> {
        let request = self.request(pipeline, role);
        let mut waiting_logged = false;
        loop {
            match self.pool.acquire_lease(&request).await {
                Ok(LeaseGrant::Held { .. }) => {
                    tracing::info!(role, source = what, "this worker's turn");
                    return Some(Turn::keep(self.pool.clone(), request));
                }
                Ok(LeaseGrant::HeldBy(holder)) if !waiting_logged => {
                    waiting_logged = true;
                    tracing::info!(role, source = what, %holder,
                        "another worker holds this turn; waiting for it");
                }
                Ok(LeaseGrant::HeldBy(_)) => {}
                Err(error) => {
                    tracing::warn!(role, %error, "cannot ask for the turn; retrying");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(TURN_TTL / 4) => {}
                _ = stop.cancelled() => return None,
            }
        }
    }

    /// Gives `flow`'s turn up at once if this worker holds it (else it expires).
    pub(crate) async fn release(&self, flow: &FlowHandle) {
        self.release_role(&flow.pipeline, &format!("feed/{}", flow.name))
            .await;
    }

    /// Gives a role's turn up at once if this worker holds it (else it expires).
    pub(crate) async fn release_role(&self, pipeline: &str, role: &str) {
        let request = self.request(pipeline, role);
        if let Err(error) = self
            .pool
            .release_lease(&request.pipeline, &request.role, &request.holder)
            .await
        {
            tracing::debug!(%error, "cannot release the reader's turn; it expires");
        }
    }
}

/// A held turn, renewed every quarter of its life until dropped or until another worker holds
/// it; a renewal the store cannot answer is tried again at the next.
pub(crate) struct Turn {
    lost: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Turn {
    fn keep(pool: Arc<dyn MembershipStore>, request: LeaseRequest) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let flag = lost.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(TURN_TTL / 4).await;
                match pool.acquire_lease(&request).await {
                    Ok(LeaseGrant::Held { .. }) => {}
                    Ok(LeaseGrant::HeldBy(_)) => {
                        flag.store(true, Ordering::Release);
                        return;
                    }
                    Err(error) => {
                        tracing::debug!(%error, "cannot renew the reader's turn; retrying");
                    }
                }
            }
        });
        Self { lost, task }
    }

    /// Whether another worker holds the turn now.
    pub(crate) fn lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.task.abort();
    }
}
