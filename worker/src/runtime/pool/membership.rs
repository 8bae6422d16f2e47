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

use super::timing::{BEAT_INTERVAL, LEASE_TTL};
use crate::runtime::pool::liveness::Liveness;
use sluice_store::{
    LeaseGrant, LeaseRequest, LedgerStore, MembershipStore, StoreError, WorkerBeat,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The role that keeps the dedup ledger's generations.
pub const LEDGER_UPKEEP: &str = "ledger_upkeep";

/// How long one heartbeat may take before it counts as failed and is sent again: a beat sent
/// [`BEAT_INTERVAL`] after the last good one still renews the fence (`liveness.rs`, 12 s after
/// the last good beat was sent) if it is answered within this, however slow the store or
/// starved this process; a store that does not answer at all is asked again this often.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(6);
/// After a failed heartbeat the next is tried this soon, so that one failure alone does not fence
/// the worker (the fence lapses [`crate::runtime::pool::liveness::SELF_FENCE_AFTER`] after the last
/// good beat was sent).
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// The running membership task.
pub struct Membership {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Membership {
    /// Starts beating for `beat.worker` (each successful beat renews `liveness`) and competing
    /// for the pool's leases; the holder of the upkeep lease keeps `ledger`'s generations.
    pub fn start(
        store: Arc<dyn MembershipStore>,
        ledger: Arc<dyn LedgerStore>,
        beat: WorkerBeat,
        liveness: Liveness,
    ) -> Self {
        let stop = CancellationToken::new();
        tracing::info!(worker = %beat.worker, "joined the worker pool");
        let task = tokio::spawn(beat_loop(store, ledger, beat, liveness, stop.clone()));
        Self { stop, task }
    }

    /// Stops beating and releases the leases held, so another worker takes them at once.
    pub async fn stop(self) {
        self.stop.cancel();
        // The task only ends by this cancellation; a panic in it was logged by the runtime.
        let _ = self.task.await;
    }
}

async fn beat_loop(
    store: Arc<dyn MembershipStore>,
    ledger: Arc<dyn LedgerStore>,
    beat: WorkerBeat,
    liveness: Liveness,
    stop: CancellationToken,
) {
    let lease = LeaseRequest {
        pipeline: beat.pipeline.clone(),
        role: LEDGER_UPKEEP.to_owned(),
        holder: beat.worker.clone(),
        ttl: LEASE_TTL,
    };
    let mut holding = false;
    let mut store_down = false;
    // Upkeep may take long (dropping ledger generations): it runs beside the beats.
    let mut upkeep: Option<JoinHandle<()>> = None;
    loop {
        let sent = Instant::now();
        let beaten = match tokio::time::timeout(HEARTBEAT_TIMEOUT, store.heartbeat(&beat)).await {
            Ok(beaten) => beaten,
            Err(_) => Err(StoreError::Unavailable(format!(
                "no answer within {HEARTBEAT_TIMEOUT:?}"
            ))),
        };
        if beaten.is_ok() {
            liveness.renewed(sent);
        }
        let granted = match beaten {
            Ok(()) => {
                match tokio::time::timeout(HEARTBEAT_TIMEOUT, store.acquire_lease(&lease)).await {
                    Ok(granted) => granted,
                    Err(_) => Err(StoreError::Unavailable(format!(
                        "no answer within {HEARTBEAT_TIMEOUT:?}"
                    ))),
                }
            }
            Err(error) => Err(error),
        };
        let next = match granted {
            Ok(grant) => {
                if store_down {
                    tracing::info!("store reachable again; heartbeats resumed");
                    store_down = false;
                }
                holding = on_grant(&lease, grant, holding);
                if holding && upkeep.as_ref().is_none_or(JoinHandle::is_finished) {
                    upkeep = Some(tokio::spawn(keep_ledger(ledger.clone())));
                }
                BEAT_INTERVAL
            }
            Err(error) => {
                // One line per outage, not per beat; the lease lapses by itself if it lasts.
                if !store_down {
                    tracing::warn!(%error, "heartbeat failed; retrying");
                    store_down = true;
                }
                RETRY_AFTER_FAILURE
            }
        };
        tokio::select! {
            _ = tokio::time::sleep_until(sent + next) => {}
            _ = stop.cancelled() => break,
        }
    }
    if let Some(upkeep) = upkeep {
        upkeep.abort();
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

/// One round of ledger upkeep, by the lease's holder.
async fn keep_ledger(ledger: Arc<dyn LedgerStore>) {
    match ledger.ledger_upkeep().await {
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
}

/// Acts on a lease answer; returns whether this worker holds the lease now.
fn on_grant(lease: &LeaseRequest, grant: LeaseGrant, was_holding: bool) -> bool {
    match grant {
        LeaseGrant::Held { taken, .. } => {
            if taken {
                tracing::info!(role = %lease.role, worker = %lease.holder, "took the lease");
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::runtime::pool::liveness::{FENCE_MARGIN, SELF_FENCE_AFTER};
    use crate::runtime::pool::timing::ALIVE_WITHIN;
    use async_trait::async_trait;
    use sluice_store::{
        CommitBatch, CommitOutcome, FlowHandle, FlowProgress, LeaseRecord, LedgerUpkeep,
        StoreError, WorkerRecord,
    };
    use std::sync::Mutex;
    use tokio::time::{Instant, sleep};

    /// What membership asked of the store.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Call {
        Heartbeat(String),
        /// Holder, ttl, and whether the lease was granted.
        Acquire(String, Duration, bool),
        Upkeep,
        Leave(String),
        Release(String),
    }

    /// A fake store, not a real backend: it records membership's calls on tokio's clock and
    /// keeps the lease by `MembershipStore::acquire_lease`'s rule (free, expired or already the asker's)
    /// on tokio's clock too, so paused time moves it. SQLite's lease expiry reads the wall
    /// clock; the real stores' leases are tested in store/tests/pool_contract.rs and, moving
    /// between processes, in tests/tests/pool_lease.rs.
    struct FakeStore {
        origin: Instant,
        state: Mutex<State>,
    }

    #[derive(Default)]
    struct State {
        calls: Vec<(Duration, Call)>,
        /// Holder and expiry.
        lease: Option<(String, Instant)>,
        /// Heartbeats hang (a store behind a partition) until then.
        hang_until: Option<Instant>,
    }

    impl FakeStore {
        fn new() -> Arc<Self> {
            Arc::new(Self {
                origin: Instant::now(),
                state: Mutex::default(),
            })
        }

        fn record(&self, call: Call) {
            let at = self.origin.elapsed();
            self.state.lock().unwrap().calls.push((at, call));
        }

        /// When (since the store was made) calls matching `which` were made.
        fn times(&self, which: impl Fn(&Call) -> bool) -> Vec<Duration> {
            let state = self.state.lock().unwrap();
            state
                .calls
                .iter()
                .filter(|(_, call)| which(call))
                .map(|(at, _)| *at)
                .collect()
        }

        fn calls_after(&self, after: Duration) -> Vec<Call> {
            let state = self.state.lock().unwrap();
            state
                .calls
                .iter()
                .filter(|(at, _)| *at > after)
                .map(|(_, call)| call.clone())
                .collect()
        }
    }

    fn beat(worker: &str) -> WorkerBeat {
        WorkerBeat {
            pipeline: "p".into(),
            worker: worker.into(),
            host: "h".into(),
            pid: 1,
            schedule: None,
        }
    }

    fn granted_to(worker: &str) -> impl Fn(&Call) -> bool {
        move |call| matches!(call, Call::Acquire(holder, _, true) if holder == worker)
    }

    fn secs(list: &[u64]) -> Vec<Duration> {
        list.iter().map(|s| Duration::from_secs(*s)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_beats_and_renews_its_15_second_lease_every_5_seconds() {
        let store = FakeStore::new();
        let member = Membership::start(store.clone(), store.clone(), beat("a"), Liveness::new());
        sleep(Duration::from_secs(22)).await;
        let beats = secs(&[0, 5, 10, 15, 20]);
        assert_eq!(store.times(|c| c == &Call::Heartbeat("a".into())), beats);
        assert_eq!(
            store.times(|c| c == &Call::Acquire("a".into(), LEASE_TTL, true)),
            beats
        );
        // The holder keeps the ledger at every beat.
        assert_eq!(store.times(|c| c == &Call::Upkeep), beats);
        member.stop().await;
        assert_eq!(
            store.calls_after(Duration::from_secs(20)),
            vec![Call::Leave("a".into()), Call::Release("a".into())]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_worker_gets_the_lease_only_after_the_first_stops_beating() {
        let store = FakeStore::new();
        let first = Membership::start(store.clone(), store.clone(), beat("a"), Liveness::new());
        sleep(Duration::from_secs(1)).await;
        let _second = Membership::start(store.clone(), store.clone(), beat("b"), Liveness::new());
        sleep(Duration::from_millis(60_500)).await;
        // b asked at every beat and was refused while a kept beating.
        assert_eq!(
            store.times(|c| matches!(c, Call::Acquire(h, _, false) if h == "b")),
            secs(&[1, 6, 11, 16, 21, 26, 31, 36, 41, 46, 51, 56, 61])
        );
        assert!(store.times(granted_to("b")).is_empty());
        // Killed: no clean stop, so no release.
        first.task.abort();
        assert!(first.task.await.unwrap_err().is_cancelled());
        let killed_at = store.origin.elapsed();
        sleep(LEASE_TTL + BEAT_INTERVAL).await;
        let taken = store.times(granted_to("b"));
        assert!(
            taken
                .first()
                .is_some_and(|at| *at <= killed_at + LEASE_TTL + BEAT_INTERVAL),
            "b took the lease at {taken:?}, a was killed at {killed_at:?}"
        );
        assert!(
            !store
                .calls_after(Duration::ZERO)
                .iter()
                .any(|c| matches!(c, Call::Leave(_) | Call::Release(_)))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_clean_stop_hands_the_lease_over_at_the_next_beat() {
        let store = FakeStore::new();
        let first = Membership::start(store.clone(), store.clone(), beat("a"), Liveness::new());
        sleep(Duration::from_secs(1)).await;
        let _second = Membership::start(store.clone(), store.clone(), beat("b"), Liveness::new());
        sleep(Duration::from_millis(11_500)).await;
        first.stop().await;
        let stopped_at = store.origin.elapsed();
        sleep(BEAT_INTERVAL).await;
        let taken = store.times(granted_to("b"));
        assert!(
            taken
                .first()
                .is_some_and(|at| *at <= stopped_at + BEAT_INTERVAL),
            "b took the lease at {taken:?}, a stopped at {stopped_at:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_whose_beats_hang_fences_itself_before_the_pool_counts_it_gone() {
        let store = FakeStore::new();
        let liveness = Liveness::new();
        let _member = Membership::start(store.clone(), store.clone(), beat("a"), liveness.clone());
        sleep(Duration::from_millis(100)).await;
        assert!(liveness.is_live(), "the first beat makes it live");
        let gate = liveness.gate();
        // The store goes silent right after the beat of t = 5 s.
        sleep(Duration::from_millis(5_050)).await;
        store.state.lock().unwrap().hang_until = Some(Instant::now() + Duration::from_secs(30));
        let last_good_beat = Duration::from_secs(5);
        liveness.lapsed().await;
        let fenced_at = store.origin.elapsed();
        assert_eq!(fenced_at, last_good_beat + SELF_FENCE_AFTER);
        assert!(
            fenced_at + FENCE_MARGIN <= last_good_beat + ALIVE_WITHIN,
            "fenced {FENCE_MARGIN:?} before the pool may count it gone"
        );
        assert!(!sluice_engine::AckFence::acks_allowed(&gate));
        // A beat that hangs is given up after HEARTBEAT_TIMEOUT and tried again at once.
        let tries = store.times(|c| c == &Call::Heartbeat("a".into()));
        assert_eq!(tries[..4], secs(&[0, 5, 10, 16])[..]);
        // The store answers again: live, in a new epoch, so the old gate stays shut.
        liveness.restored().await;
        assert!(store.origin.elapsed() >= Duration::from_secs(35));
        assert!(!sluice_engine::AckFence::acks_allowed(&gate));
        assert!(sluice_engine::AckFence::acks_allowed(&liveness.gate()));
    }

    /// Fails the test if membership calls a method it should not need.
    fn unused<T>(method: &str) -> Result<T, StoreError> {
        panic!("membership called Store::{method}")
    }

    #[async_trait]
    impl sluice_store::LedgerStore for FakeStore {
        async fn commit(&self, _: CommitBatch) -> Result<CommitOutcome, StoreError> {
            unused("commit")
        }

        async fn keys_present(
            &self,
            _: &FlowHandle,
            _: &str,
            _: &[String],
        ) -> Result<Vec<bool>, StoreError> {
            unused("keys_present")
        }

        async fn commit_recorded(&self, _: &FlowHandle, _: &str) -> Result<bool, StoreError> {
            unused("commit_recorded")
        }

        async fn flow_progress(&self, _: &FlowHandle) -> Result<FlowProgress, StoreError> {
            unused("flow_progress")
        }

        async fn ledger_upkeep(&self) -> Result<LedgerUpkeep, StoreError> {
            self.record(Call::Upkeep);
            Ok(LedgerUpkeep::default())
        }
    }

    #[async_trait]
    impl sluice_store::MembershipStore for FakeStore {
        async fn heartbeat(&self, beat: &WorkerBeat) -> Result<(), StoreError> {
            self.record(Call::Heartbeat(beat.worker.clone()));
            let hang = self.state.lock().unwrap().hang_until;
            if let Some(until) = hang.filter(|until| Instant::now() < *until) {
                sleep(until - Instant::now() + Duration::from_secs(3600)).await;
            }
            Ok(())
        }

        async fn leave(&self, _pipeline: &str, worker: &str) -> Result<(), StoreError> {
            self.record(Call::Leave(worker.to_owned()));
            Ok(())
        }

        async fn workers(&self, _: &str, _: Duration) -> Result<Vec<WorkerRecord>, StoreError> {
            unused("workers")
        }

        async fn acquire_lease(&self, request: &LeaseRequest) -> Result<LeaseGrant, StoreError> {
            let now = Instant::now();
            let grant = {
                let mut state = self.state.lock().unwrap();
                let free = match &state.lease {
                    None => Some(true),
                    Some((holder, _)) if holder == &request.holder => Some(false),
                    Some((_, expires)) if *expires <= now => Some(true),
                    Some(_) => None,
                };
                match free {
                    Some(taken) => {
                        let expires = now + request.ttl;
                        state.lease = Some((request.holder.clone(), expires));
                        let expires_at_ms = (expires - self.origin).as_millis() as i64;
                        LeaseGrant::Held {
                            taken,
                            expires_at_ms,
                        }
                    }
                    None => {
                        let holder = state.lease.as_ref().map(|(h, _)| h.clone());
                        LeaseGrant::HeldBy(holder.unwrap_or_default())
                    }
                }
            };
            let granted = matches!(grant, LeaseGrant::Held { .. });
            self.record(Call::Acquire(request.holder.clone(), request.ttl, granted));
            Ok(grant)
        }

        async fn release_lease(
            &self,
            _pipeline: &str,
            _role: &str,
            holder: &str,
        ) -> Result<(), StoreError> {
            self.record(Call::Release(holder.to_owned()));
            let mut state = self.state.lock().unwrap();
            if state.lease.as_ref().is_some_and(|(h, _)| h == holder) {
                state.lease = None;
            }
            Ok(())
        }

        async fn leases(&self, _: &str) -> Result<Vec<LeaseRecord>, StoreError> {
            unused("leases")
        }
    }
}
