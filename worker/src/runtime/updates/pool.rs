//! Updates of a running pool: `sluice reset`, `sluice full-refresh` and the control API's
//! `StartUpdate`/`ResetFlow` while other replicas of the pipeline run.
//!
//! # Guarantees
//!
//! * **Nothing is cleared under a running flow.** The request is recorded in the store
//!   (`sluice_pool_updates`); every replica stops its running update the way a drain does
//!   (what it received is committed and acked) and reports it stopped; the clear happens only
//!   once every live replica (heartbeat within [`ALIVE_WITHIN`]) has reported, checked again
//!   after the clearer claimed it, so no replica's memory can drop a record the store no longer
//!   holds. A replica counted gone (its heartbeats failed for [`ALIVE_WITHIN`]) has fenced
//!   itself 3 s before that: it withholds every ack and stops its flows, and starts them again
//!   with empty memory once it beats again (`runtime/pool/liveness.rs`, where the bound is proved).
//! * **One clearer, fenced by its claim.** Exactly one process clears (the store's claim,
//!   renewed while it clears; a claim left by a clearer that died is taken over after
//!   [`CLAIM_STALE_AFTER`], and the clear, which is idempotent, runs again). Each step of the
//!   clear checks the claim is still its clearer's (a reset in its transaction, a seek or a sink
//!   clear just before), and only the claim's holder ends the update: a clearer paused past
//!   its claim deletes and replays nothing once it wakes. What it clears is what the same
//!   request does to a stopped pool (`runtime/updates/refresh.rs`).
//! * **Everyone resumes from fresh state.** Once the update has ended every replica reads its
//!   flows again from the store and starts a new update with empty dedup caches. A replica
//!   that starts while an update is unfinished takes part in it before it runs any flow (it
//!   beats first, so a clearer that has not seen its report waits for it).
//! * **A request never hangs the pool.** The asker withdraws a request that not every live
//!   replica has reported stopped for within [`DRAIN_WAIT`] (any participant does after twice
//!   that, if the asker died); the replicas then resume with nothing cleared. A withdrawal
//!   claims the update first, so one being cleared is never withdrawn. The clearer renews its
//!   claim while it clears. One update at a time: two recorded at once go through oldest
//!   first (a replica waiting in the newer reports itself stopped for the older too).
//!
//! Every replica stops all its flows for an update, not only those it clears: a flow that is
//! not cleared resumes where it stood (its acked messages do not come back), so nothing of it
//! is replayed.

use crate::runtime::kit::env_duration::from_env;
use crate::runtime::pool::timing::ALIVE_WITHIN;
use crate::runtime::updates::refresh::{Clearing, UnderClaim};
use crate::runtime::updates::refresh_error::RefreshError;
use crate::runtime::updates::request::{self, UpdateKind};
use sluice_pipeline::Pipeline;
use sluice_store::{
    ClearClaim, MembershipStore, PoolUpdate, PoolUpdateState, PoolUpdateStore, StoreError,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a replica looks for a pool update, and a participant at its progress.
pub const POLL: Duration = Duration::from_secs(1);
/// A clearing claim older than this is taken over: its clearer died while clearing (unless
/// `SLUICE_POOL_UPDATE_CLAIM_STALE_AFTER` says otherwise, see [`Patience`]).
pub const CLAIM_STALE_AFTER: Duration = Duration::from_secs(60);
/// How long the asker waits for every live replica to stop its flows (unless
/// `SLUICE_POOL_UPDATE_DRAIN_WAIT` says otherwise, see [`Patience`]).
pub const DRAIN_WAIT: Duration = Duration::from_secs(300);
/// Neither wait may be set shorter than this: a claim renewed every tenth of its life, and a
/// drain that commits what it holds, need a few seconds.
pub const SHORTEST_PATIENCE: Duration = Duration::from_secs(5);

/// How long this process waits in pool updates: [`DRAIN_WAIT`] and [`CLAIM_STALE_AFTER`], or
/// what the environment says (`SLUICE_POOL_UPDATE_DRAIN_WAIT`,
/// `SLUICE_POOL_UPDATE_CLAIM_STALE_AFTER`: humane durations, at least
/// [`SHORTEST_PATIENCE`]; every process of a pool, the command line included, should be given
/// the same). A value that cannot be read is logged and the default used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Patience {
    /// How long the asker waits for every live replica to stop its flows before it withdraws
    /// the update (any participant withdraws it after twice this).
    pub drain_wait: Duration,
    /// A clearing claim not renewed for this long is taken over.
    pub claim_stale_after: Duration,
}

impl Patience {
    /// This process's, read from the environment once.
    pub fn get() -> Patience {
        static PATIENCE: std::sync::OnceLock<Patience> = std::sync::OnceLock::new();
        *PATIENCE.get_or_init(|| Patience {
            drain_wait: from_env(
                "SLUICE_POOL_UPDATE_DRAIN_WAIT",
                DRAIN_WAIT,
                SHORTEST_PATIENCE,
            ),
            claim_stale_after: from_env(
                "SLUICE_POOL_UPDATE_CLAIM_STALE_AFTER",
                CLAIM_STALE_AFTER,
                SHORTEST_PATIENCE,
            ),
        })
    }
}

/// Who takes part in an update, and how.
pub struct Part<'a> {
    /// The pipeline.
    pub pipeline: &'a Pipeline,
    /// Its store.
    pub store: &'a Arc<dyn sluice_store::Store>,
    /// This process: a worker id, or the command line's name.
    pub me: &'a str,
    /// A worker that has stopped its flows (reports it); `false` for the command line.
    pub stopped_flows: bool,
    /// The asker: withdraws the request after [`DRAIN_WAIT`].
    pub asker: bool,
}

/// Records a request for an update of the running pool; returns its number.
pub async fn request(
    pipeline: &Pipeline,
    store: &dyn PoolUpdateStore,
    kind: &UpdateKind,
    me: &str,
) -> Result<i64, RefreshError> {
    let request = serde_json::to_string(kind)
        .map_err(|e| RefreshError::Failed(format!("cannot record the request: {e}")))?;
    let id = store
        .request_pool_update(&pipeline.name, &request, me)
        .await
        .map_err(|e| RefreshError::Failed(format!("store: {e}")))?;
    tracing::info!(
        update = id,
        ?kind,
        "pool update requested: every replica stops its flows"
    );
    Ok(id)
}

/// Takes part in pool update `id` until it ends: reports this worker's flows stopped, clears
/// the update when every live replica has and this one holds the claim, and returns the
/// update's outcome.
pub async fn take_part(part: &Part<'_>, id: i64) -> Result<String, RefreshError> {
    let pipeline = &part.pipeline.name;
    let store = part.store;
    if part.stopped_flows {
        retry("report this worker's flows stopped", || {
            store.drained_for_pool_update(pipeline, id, part.me)
        })
        .await;
    }
    let started = Instant::now();
    let mut last_wait = String::new();
    loop {
        let update = retry("read the pool update", || {
            store.pool_update(pipeline, Some(id))
        })
        .await;
        let Some(update) = update else {
            return Err(RefreshError::Failed(format!("pool update {id} is gone")));
        };
        match update.state {
            PoolUpdateState::Done => return Ok(update.message.unwrap_or_default()),
            PoolUpdateState::Failed => {
                return Err(RefreshError::Failed(update.message.unwrap_or_default()));
            }
            PoolUpdateState::Pending | PoolUpdateState::Clearing { .. } => {}
        }
        if part.stopped_flows {
            report_older(part, id).await;
        }
        let waiting = still_running(store.as_ref(), &update).await;
        if waiting.is_empty() {
            if let Some(outcome) = clear_if_claimed(part, &update).await {
                return outcome;
            }
        } else {
            let wait = waiting.join(", ");
            if wait != last_wait {
                tracing::info!(update = id, waiting_for = %wait,
                    "pool update: waiting for replicas to stop their flows");
                last_wait = wait.clone();
            }
            // The asker gives up after DRAIN_WAIT; anyone after twice that (the asker died).
            let drain_wait = Patience::get().drain_wait;
            let patience = if part.asker {
                drain_wait
            } else {
                drain_wait * 2
            };
            if started.elapsed() > patience
                && let Some(withdrawn) = withdraw(part, id, &wait).await
            {
                return Err(withdrawn);
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Reports this worker's flows stopped for every unfinished update older than `id` too: two
/// requests recorded at once (neither asker saw the other's) then both go through, in order,
/// instead of each waiting for the replicas that wait in the other.
async fn report_older(part: &Part<'_>, id: i64) {
    let pipeline = &part.pipeline.name;
    if let Ok(Some(oldest)) = part.store.pool_update(pipeline, None).await
        && oldest.id < id
        && !oldest.drained.iter().any(|w| w == part.me)
    {
        tracing::info!(
            update = oldest.id,
            waiting = id,
            "an older pool update is unfinished; taking part in it first"
        );
        let _ = part
            .store
            .drained_for_pool_update(pipeline, oldest.id, part.me)
            .await;
    }
}

/// Withdraws update `id`, which the replicas of `waiting` did not stop their flows for: only
/// while it is pending, which claiming it first makes sure of (a clearer that has begun is
/// left to finish). The error to return, or `None` when it could not be withdrawn.
async fn withdraw(part: &Part<'_>, id: i64, waiting: &str) -> Option<RefreshError> {
    let pipeline = &part.pipeline.name;
    let claimed = part
        .store
        .claim_pool_update(pipeline, id, part.me, Patience::get().claim_stale_after)
        .await
        .ok()?;
    if !claimed {
        return None;
    }
    let why = format!(
        "pool update {id} withdrawn: {waiting} did not stop its flows within {} s; nothing \
         was cleared",
        Patience::get().drain_wait.as_secs()
    );
    retry("record the withdrawal", || {
        part.store
            .finish_pool_update(pipeline, id, part.me, false, &why)
    })
    .await;
    tracing::warn!(update = id, %why, "pool update withdrawn");
    Some(RefreshError::Failed(why))
}

/// Claims the update and clears it if every live replica stopped (checked again once
/// claimed); the outcome when this call ended it, `None` to keep waiting.
async fn clear_if_claimed(
    part: &Part<'_>,
    update: &PoolUpdate,
) -> Option<Result<String, RefreshError>> {
    let pipeline = &part.pipeline.name;
    let store = part.store;
    let claimed = store
        .claim_pool_update(
            pipeline,
            update.id,
            part.me,
            Patience::get().claim_stale_after,
        )
        .await
        .ok()?;
    if !claimed {
        return None;
    }
    // A replica that joined before the claim has beaten: it must have stopped too.
    let update = store.pool_update(pipeline, Some(update.id)).await.ok()??;
    if !still_running(store.as_ref(), &update).await.is_empty() {
        return None;
    }
    let outcome = match serde_json::from_str::<UpdateKind>(&update.request) {
        Ok(kind) => {
            tracing::info!(
                update = update.id,
                ?kind,
                "pool update: every replica stopped; clearing"
            );
            // The claim is renewed while the clear lasts: only a dead clearer's is taken over;
            // every step of the clear checks it still holds (a paused clearer's went stale).
            let keeper = keep_claim(part, update.id);
            let under = UnderClaim {
                claim: ClearClaim {
                    update: update.id,
                    clearer: part.me.to_owned(),
                },
                stale_after: Patience::get().claim_stale_after,
            };
            let clearing = Clearing {
                stopped: &update.drained,
                claim: Some(&under),
            };
            let mut cleared = request::clear(part.pipeline, &kind, clearing).await;
            // A deadlock with another session (a `sluice status` preparing the tables, say)
            // rolled the clear back whole: it is tried again.
            for _ in 1..CLEAR_ATTEMPTS {
                match &cleared {
                    Err(RefreshError::Failed(why)) if rolled_back_by_contention(why) => {
                        tracing::warn!(update = update.id, %why,
                            "pool update: the clear met a deadlock; clearing again");
                        tokio::time::sleep(POLL).await;
                        cleared = request::clear(part.pipeline, &kind, clearing).await;
                    }
                    _ => break,
                }
            }
            drop(keeper);
            cleared
        }
        Err(error) => Err(RefreshError::Invalid(format!(
            "pool update {}: unreadable request {:?}: {error}",
            update.id, update.request
        ))),
    };
    let (done, message) = match &outcome {
        Ok(message) => (true, message.clone()),
        Err(error) => (false, error.to_string()),
    };
    let recorded = retry("record the pool update's outcome", || {
        store.finish_pool_update(pipeline, update.id, part.me, done, &message)
    })
    .await;
    if !recorded {
        // Another process took the claim over (this one was paused past it): its outcome
        // stands; this one's clear stopped at its first fenced step.
        tracing::warn!(update = update.id, %message,
            "pool update: the claim was taken over; leaving the outcome to its new clearer");
        return None;
    }
    tracing::info!(update = update.id, done, %message, "pool update ended");
    Some(outcome)
}

/// How many times a clear is tried when a deadlock rolls it back.
const CLEAR_ATTEMPTS: usize = 5;

/// Whether a failed clear's error is PostgreSQL's deadlock (40P01) or serialization failure
/// (40001): its transaction was rolled back whole and may simply be run again. (The SQLSTATE
/// is in the store error's text, never localised.)
fn rolled_back_by_contention(why: &str) -> bool {
    why.contains("40P01") || why.contains("40001")
}

/// Renews this process's claim on update `id` every tenth of [`CLAIM_STALE_AFTER`] until the
/// guard is dropped.
fn keep_claim(part: &Part<'_>, id: i64) -> tokio_util::sync::DropGuard {
    let stop = tokio_util::sync::CancellationToken::new();
    let (store, pipeline, me) = (
        part.store.clone(),
        part.pipeline.name.clone(),
        part.me.to_owned(),
    );
    let stopped = stop.clone();
    let stale_after = Patience::get().claim_stale_after;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(stale_after / 10) => {}
                _ = stopped.cancelled() => return,
            }
            if let Err(error) = store
                .claim_pool_update(&pipeline, id, &me, stale_after)
                .await
            {
                tracing::debug!(%error, "cannot renew the pool update's claim; retrying");
            }
        }
    });
    stop.drop_guard()
}

/// The live replicas that have not reported their flows stopped for `update`.
async fn still_running(store: &dyn MembershipStore, update: &PoolUpdate) -> Vec<String> {
    let live = retry("read the pool's workers", || {
        store.workers(&update.pipeline, ALIVE_WITHIN)
    })
    .await;
    live.into_iter()
        .map(|w| w.worker)
        .filter(|w| !update.drained.contains(w))
        .collect()
}

/// Asks the store until it answers, waiting [`POLL`] between tries (an update waits for the
/// store like everything else; a worker that cannot reach it cannot run flows either).
async fn retry<T, F, Fut>(what: &str, mut ask: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut logged = false;
    loop {
        match ask().await {
            Ok(answer) => return answer,
            Err(error) => {
                if !logged {
                    tracing::warn!(%error, "pool update: cannot {what}; retrying");
                    logged = true;
                }
                tokio::time::sleep(POLL).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::rolled_back_by_contention;

    #[test]
    fn deadlocks_and_serialization_failures_are_cleared_again() {
        assert!(rolled_back_by_contention(
            "store: store unavailable: 40P01: deadlock detected"
        ));
        assert!(rolled_back_by_contention(
            "store: store unavailable: 40001: could not serialize access"
        ));
        assert!(!rolled_back_by_contention(
            "store: store unavailable: 57P01: terminating connection"
        ));
    }
}
