//! Pool membership: every worker beats its heartbeat into the store, and one worker at a time
//! holds each single-holder role through a lease there, so a pool needs no service beyond its
//! store.
//!
//! Today's role is `ledger_upkeep` (creating ledger generations ahead of time and dropping
//! expired ones, see `sluice_store`'s PostgreSQL ledger). The holder renews its lease at every
//! beat; when it dies, the lease runs out after [`LEASE_TTL`] and the next beat of another
//! worker takes it: the role moves within [`LEASE_TTL`] + [`BEAT_INTERVAL`] (20 s). A clean stop releases the lease at
//! once. The role is safe to run twice for a moment (upkeep is idempotent), so a paused holder
//! that wakes up after losing its lease does no harm.

use sluice_store::{LeaseGrant, LeaseRequest, Store, WorkerBeat};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How often a worker beats, renews its leases and, when it holds `ledger_upkeep`, does upkeep.
pub const BEAT_INTERVAL: Duration = Duration::from_secs(5);
/// How long a lease lasts without renewal: three beats, so one slow store call does not lose it.
pub const LEASE_TTL: Duration = Duration::from_secs(15);
/// Workers heard of within this long count as alive: three missed beats.
pub const ALIVE_WITHIN: Duration = Duration::from_secs(BEAT_INTERVAL.as_secs() * 3);
/// The role that keeps the dedup ledger's generations.
pub const LEDGER_UPKEEP: &str = "ledger_upkeep";

/// This worker's identity in the pool: `<host>-<pid>-<random>`, unique per process start.
pub fn identity(pipeline: &str) -> WorkerBeat {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let pid = std::process::id();
    WorkerBeat {
        pipeline: pipeline.to_owned(),
        worker: format!("{host}-{pid}-{:04x}", rand::random::<u16>()),
        host,
        pid,
    }
}

/// The running membership task.
pub struct Membership {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Membership {
    /// Starts beating for `beat.worker` and competing for the pool's leases.
    pub fn start(store: Arc<dyn Store>, beat: WorkerBeat) -> Self {
        let stop = CancellationToken::new();
        tracing::info!(worker = %beat.worker, "joined the worker pool");
        let task = tokio::spawn(beat_loop(store, beat, stop.clone()));
        Self { stop, task }
    }

    /// Stops beating and releases the leases held, so another worker takes them at once.
    pub async fn stop(self) {
        self.stop.cancel();
        // The task only ends by this cancellation; a panic in it was logged by the runtime.
        let _ = self.task.await;
    }
}

async fn beat_loop(store: Arc<dyn Store>, beat: WorkerBeat, stop: CancellationToken) {
    let lease = LeaseRequest {
        pipeline: beat.pipeline.clone(),
        role: LEDGER_UPKEEP.to_owned(),
        holder: beat.worker.clone(),
        ttl: LEASE_TTL,
    };
    let mut holding = false;
    let mut store_down = false;
    let mut ticks = tokio::time::interval(BEAT_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.cancelled() => break,
        }
        let beaten = store.heartbeat(&beat).await;
        let granted = match beaten {
            Ok(()) => store.acquire_lease(&lease).await,
            Err(error) => Err(error),
        };
        match granted {
            Ok(grant) => {
                if store_down {
                    tracing::info!("store reachable again; heartbeats resumed");
                    store_down = false;
                }
                holding = on_grant(&store, &lease, grant, holding).await;
            }
            Err(error) => {
                // One line per outage, not per beat; the lease lapses by itself if it lasts.
                if !store_down {
                    tracing::warn!(%error, "heartbeat failed; retrying every beat");
                    store_down = true;
                }
            }
        }
    }
    // A clean stop leaves the pool's list at once (a crash leaves it when beats stop).
    if let Err(error) = store.leave(&beat.pipeline, &beat.worker).await {
        tracing::debug!(%error, "could not leave the worker list; it ages out");
    }
    if holding {
        match store
            .release_lease(&lease.pipeline, &lease.role, &lease.holder)
            .await
        {
            Ok(()) => tracing::info!(role = LEDGER_UPKEEP, "released the lease"),
            Err(error) => tracing::warn!(%error, role = LEDGER_UPKEEP,
                "could not release the lease; it runs out by itself"),
        }
    }
}

/// Acts on a lease answer; returns whether this worker holds the lease now.
async fn on_grant(
    store: &Arc<dyn Store>,
    lease: &LeaseRequest,
    grant: LeaseGrant,
    was_holding: bool,
) -> bool {
    match grant {
        LeaseGrant::Held { taken, .. } => {
            if taken {
                tracing::info!(role = %lease.role, worker = %lease.holder, "took the lease");
            }
            match store.ledger_upkeep().await {
                Ok(upkeep) if upkeep.generations_created + upkeep.generations_dropped > 0 => {
                    tracing::info!(
                        created = upkeep.generations_created,
                        dropped = upkeep.generations_dropped,
                        "ledger generations kept"
                    );
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "ledger upkeep failed; retried next beat"),
            }
            true
        }
        LeaseGrant::HeldBy(holder) => {
            if was_holding {
                tracing::warn!(role = %lease.role, %holder, "lost the lease");
            }
            false
        }
    }
}
