//! The `scheduler` lease of a scheduled pipeline: the one replica of a pool that holds it runs
//! the fires. Taken and renewed every [`BEAT_INTERVAL`] in the background; a renewal the store
//! does not answer keeps the lease counted as held until it would have expired
//! ([`LEASE_TTL`] after the last renewal), so a short store outage neither drains a run nor
//! makes the worker wait for the lease again; a clean stop hands it back at once.

use crate::runtime::pool::timing::{BEAT_INTERVAL, LEASE_TTL};
use sluice_store::{LeaseGrant, LeaseRequest, Store};
use std::sync::Arc;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The lease role of the replica that runs a pipeline's fires.
pub const SCHEDULER: &str = "scheduler";

/// The lease, renewed in the background while this worker runs the schedule.
pub struct SchedulerLease {
    held: watch::Receiver<bool>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl SchedulerLease {
    /// Starts competing for `pipeline`'s lease as `worker`.
    pub fn start(store: Arc<dyn Store>, pipeline: &str, worker: &str) -> Self {
        let request = LeaseRequest {
            pipeline: pipeline.to_owned(),
            role: SCHEDULER.to_owned(),
            holder: worker.to_owned(),
            ttl: LEASE_TTL,
        };
        let (held_tx, held) = watch::channel(false);
        let stop = CancellationToken::new();
        let task = tokio::spawn(renew(store, request, held_tx, stop.clone()));
        Self { held, stop, task }
    }

    /// Whether this worker holds it now.
    pub fn held(&self) -> bool {
        *self.held.borrow()
    }

    /// A receiver of whether it is held, to wait for a change.
    pub fn watch(&self) -> watch::Receiver<bool> {
        self.held.clone()
    }

    /// Stops renewing and hands the lease back at once.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Takes or renews the lease every beat until `stop`, publishing whether it is held.
async fn renew(
    store: Arc<dyn Store>,
    request: LeaseRequest,
    held: watch::Sender<bool>,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval(BEAT_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When the lease was last taken or renewed: it lasts LEASE_TTL from then.
    let mut renewed: Option<Instant> = None;
    let mut failing = false;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = stop.cancelled() => break,
        }
        let holding = match store.acquire_lease(&request).await {
            Ok(LeaseGrant::Held { taken, .. }) => {
                if taken {
                    tracing::info!("this worker runs the schedule (scheduler lease)");
                }
                failing = false;
                renewed = Some(Instant::now());
                true
            }
            Ok(LeaseGrant::HeldBy(_)) => {
                renewed = None;
                false
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(%error, "cannot renew the scheduler lease; retrying");
                }
                failing = true;
                renewed.is_some_and(|at| at.elapsed() < LEASE_TTL)
            }
        };
        held.send_if_modified(|was| std::mem::replace(was, holding) != holding);
    }
    if *held.borrow() {
        let _ = store
            .release_lease(&request.pipeline, &request.role, &request.holder)
            .await;
    }
}
