//! Self-fencing: a worker that cannot renew its membership stops acking, and stops its flows,
//! before the rest of the pool may count it gone.
//!
//! # Why
//!
//! A clear (a reset, a full refresh, a pool update's) deletes rows and their ledger keys once
//! every live worker has stopped its flows; a worker whose heartbeat is [`ALIVE_WITHIN`] old
//! counts as gone and is not waited for. A worker cut off from the store but not from Pub/Sub
//! (or paused, then resumed) would otherwise still hold keys in its memory tier that the store
//! no longer holds, and ack a replayed message as a duplicate of a row that was deleted: the
//! message would be lost.
//!
//! # The rule
//!
//! A heartbeat is recorded on the store's clock at some moment after it was sent, so a worker
//! whose last successful beat was *sent* at `s` is counted gone no earlier than
//! `s + ALIVE_WITHIN`. This worker allows acks only until `s + SELF_FENCE_AFTER`
//! ([`SELF_FENCE_AFTER`] = [`ALIVE_WITHIN`] − [`FENCE_MARGIN`]), checked at each ack
//! ([`Liveness::gate`]), so no ack of this worker is handed to Pub/Sub's client after the
//! moment the pool may have counted it gone, less the margin (which covers the client's ack
//! batching and the store's clock against this host's: seconds either way).
//!
//! A lapse is remembered: when the next beat succeeds, the fence's *epoch* moves if the lapse
//! happened (a beat completed more than [`SELF_FENCE_AFTER`] after the last successful one was
//! sent). A gate taken for one update allows acks only in the epoch it was taken in, so what
//! an update holds in memory never acks again after a lapse, even once the store answers; the
//! update loop stops the update at the lapse ([`Liveness::lapsed`]) and starts a new one, with
//! empty memory, once beats succeed again ([`Liveness::restored`]).
//!
//! # What it does not cover
//!
//! The moments are measured with the monotonic clock (`CLOCK_MONOTONIC`), which counts a
//! process stopped by a signal but not a virtual machine suspended as a whole: a host
//! suspended for longer than the margin with its heartbeat fresh could, on waking, ack once
//! before its beat loop notices. Commits of a fenced worker that were already in flight may
//! still land: a commit writes its ledger keys with its rows, so a replay after a clear finds
//! them and nothing is written twice.

use crate::runtime::pool::timing::ALIVE_WITHIN;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// What the margin between this worker's fence and the pool's "gone" absorbs: the Pub/Sub
/// client's ack batching (acks handed over before the fence are sent within a second), and the
/// store's clock against this host's (both measure seconds at the same rate; the store records
/// a beat after it was sent).
pub const FENCE_MARGIN: Duration = Duration::from_secs(3);
/// How long after its last successful heartbeat was sent a worker still acks.
pub const SELF_FENCE_AFTER: Duration = ALIVE_WITHIN.saturating_sub(FENCE_MARGIN);

/// This worker's standing in the pool, renewed by its heartbeats; clones share it.
#[derive(Debug, Clone)]
pub struct Liveness {
    state: Arc<Mutex<Standing>>,
    changed: watch::Sender<u64>,
}

#[derive(Debug, Clone, Copy)]
struct Standing {
    /// Acks are allowed until then (`None`: no beat has succeeded yet).
    until: Option<Instant>,
    /// When the last successful beat was sent.
    last_sent: Option<Instant>,
    /// Moves at every renewal after a lapse.
    epoch: u64,
}

impl Default for Liveness {
    fn default() -> Self {
        Self::new()
    }
}

impl Liveness {
    /// Not live yet: the first successful beat makes it so.
    pub fn new() -> Self {
        Self {
            state: Arc::new(Mutex::new(Standing {
                until: None,
                last_sent: None,
                epoch: 0,
            })),
            changed: watch::Sender::new(0),
        }
    }

    fn standing(&self) -> Standing {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A heartbeat sent at `sent` was recorded; it completed now. Renews the fence, moving its
    /// epoch if it had lapsed.
    pub fn renewed(&self, sent: Instant) {
        let now = Instant::now();
        let epoch = {
            let mut standing = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if standing.last_sent.is_some_and(|s| sent <= s) {
                return; // an older beat answered late: it renews nothing
            }
            let lapsed = standing.until.is_some_and(|until| now >= until);
            if lapsed {
                standing.epoch += 1;
            }
            standing.last_sent = Some(sent);
            standing.until = Some(sent + SELF_FENCE_AFTER);
            standing.epoch
        };
        self.changed.send_replace(epoch);
    }

    /// Whether acks are allowed now (a beat succeeded within [`SELF_FENCE_AFTER`]).
    pub fn is_live(&self) -> bool {
        self.standing()
            .until
            .is_some_and(|until| Instant::now() < until)
    }

    /// The gate of an update starting now: it allows acks while this worker is live and has
    /// not lapsed since.
    pub fn gate(&self) -> AckGate {
        AckGate {
            liveness: self.clone(),
            epoch: self.standing().epoch,
        }
    }

    /// Resolves once the fence has lapsed (at once if it has; also if no beat ever succeeded).
    pub async fn lapsed(&self) {
        loop {
            let Some(until) = self.standing().until else {
                return;
            };
            if Instant::now() >= until {
                return;
            }
            tokio::time::sleep_until(until).await;
        }
    }

    /// Resolves once this worker is live (a beat succeeded within [`SELF_FENCE_AFTER`]).
    pub async fn restored(&self) {
        let mut changes = self.changed.subscribe();
        while !self.is_live() {
            // A renewal always sends; if none comes the worker stays fenced.
            if changes.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// The ack gate of one update ([`Liveness::gate`]).
#[derive(Debug, Clone)]
pub struct AckGate {
    liveness: Liveness,
    epoch: u64,
}

impl AckGate {
    /// The fence epoch the gate was taken in.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl sluice_engine::AckFence for AckGate {
    fn acks_allowed(&self) -> bool {
        let standing = self.liveness.standing();
        standing.epoch == self.epoch && standing.until.is_some_and(|until| Instant::now() < until)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use sluice_engine::AckFence;
    use tokio::time::{advance, sleep};

    #[tokio::test(start_paused = true)]
    async fn no_ack_before_the_first_beat_and_none_past_the_fence() {
        let liveness = Liveness::new();
        let gate = liveness.gate();
        assert!(!gate.acks_allowed(), "no beat yet");
        let sent = Instant::now();
        advance(Duration::from_millis(20)).await;
        liveness.renewed(sent);
        assert!(gate.acks_allowed());
        advance(SELF_FENCE_AFTER - Duration::from_millis(21)).await;
        assert!(gate.acks_allowed(), "just before the fence");
        advance(Duration::from_millis(2)).await;
        assert!(
            !gate.acks_allowed(),
            "past the fence, measured from the beat's send"
        );
        assert!(!liveness.is_live());
    }

    #[tokio::test(start_paused = true)]
    async fn a_gate_taken_before_a_lapse_never_opens_again() {
        let liveness = Liveness::new();
        liveness.renewed(Instant::now());
        let before = liveness.gate();
        advance(SELF_FENCE_AFTER + Duration::from_secs(1)).await;
        assert!(!before.acks_allowed());
        liveness.renewed(Instant::now());
        assert!(liveness.is_live(), "beats succeed again");
        assert!(
            !before.acks_allowed(),
            "the old update's memory must not ack"
        );
        assert!(liveness.gate().acks_allowed(), "a new update acks");
    }

    #[tokio::test(start_paused = true)]
    async fn beats_in_time_keep_the_same_gate_open() {
        let liveness = Liveness::new();
        liveness.renewed(Instant::now());
        let gate = liveness.gate();
        for _ in 0..10 {
            advance(SELF_FENCE_AFTER / 2).await;
            liveness.renewed(Instant::now());
            assert!(gate.acks_allowed());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_beat_answered_after_the_fence_counts_as_a_lapse() {
        // Sent in time, answered late: the pool may have counted this worker gone meanwhile.
        let liveness = Liveness::new();
        liveness.renewed(Instant::now());
        let gate = liveness.gate();
        advance(SELF_FENCE_AFTER / 2).await;
        let sent = Instant::now();
        advance(SELF_FENCE_AFTER).await;
        liveness.renewed(sent);
        assert!(!gate.acks_allowed());
    }

    #[tokio::test(start_paused = true)]
    async fn lapsed_and_restored_resolve_at_their_moments() {
        let liveness = Liveness::new();
        liveness.renewed(Instant::now());
        let started = Instant::now();
        liveness.lapsed().await;
        assert_eq!(started.elapsed(), SELF_FENCE_AFTER);
        let renewing = {
            let liveness = liveness.clone();
            tokio::spawn(async move {
                sleep(Duration::from_secs(3)).await;
                liveness.renewed(Instant::now());
            })
        };
        liveness.restored().await;
        assert_eq!(started.elapsed(), SELF_FENCE_AFTER + Duration::from_secs(3));
        renewing.await.unwrap();
    }
}
