//! The committer's timing on tokio's paused clock: the retry backoff around a store that cannot
//! commit, the commit bound past which a held delivery is given back uncommitted, and the
//! window after a lane's give-back within which later parts of the lane are given back too.
//! The clock is paused, so each test states instants exactly and takes no real time.
//!
//! The store here is a fake ([`FlakyStore`]): it stands for a store that is unreachable (every
//! commit answered [`StoreError::Unavailable`]) for a given number of attempts, then commits
//! everything. The stage of the lane test is a fake too ([`RejectsPoison`]): it stands for a
//! stage that refuses one message's data.

use crate::backoff::{INITIAL_BACKOFF, MAX_BACKOFF};
use crate::flow::batch::Batch;
use crate::flow::batcher::{BatchSettings, BatchSource, DedupSettings, KeySource};
use crate::flow::budget::Budget;
use crate::flow::commit::{CommitThenAck, RetrySettings};
use crate::flow::commit_lanes::{self, REGIVE_GRACE};
use crate::flow::delivery::{AckHandle, Delivery, SourceMessage};
use crate::flow::stage::{Stage, StageError, TableStage};
use crate::source::Received;
use crate::telemetry::Counters;
use async_trait::async_trait;
use sluice_store::{
    CommitBatch, CommitOutcome, Effect, FlowHandle, FlowProgress, LedgerStore, LedgerUpkeep,
    StoreError,
};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;

/// A fake store: unreachable for its first `failures` commits, then it writes every entry.
/// Records when each commit was asked for (paused clock) and the keys it wrote.
struct FlakyStore {
    failures: usize,
    attempts: Mutex<Vec<Instant>>,
    written: Mutex<Vec<String>>,
}

impl FlakyStore {
    fn new(failures: usize) -> Arc<Self> {
        Arc::new(Self {
            failures,
            attempts: Mutex::new(Vec::new()),
            written: Mutex::new(Vec::new()),
        })
    }

    fn attempts(&self) -> Vec<Instant> {
        self.attempts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn written(&self) -> Vec<String> {
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[async_trait]
impl LedgerStore for FlakyStore {
    async fn commit(&self, batch: CommitBatch) -> Result<CommitOutcome, StoreError> {
        let attempt = {
            let mut attempts = self.attempts.lock().unwrap_or_else(PoisonError::into_inner);
            attempts.push(Instant::now());
            attempts.len()
        };
        if attempt <= self.failures {
            return Err(StoreError::Unavailable("the fake store is down".to_owned()));
        }
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        written.extend(batch.entries.iter().map(|e| e.key.as_str().to_owned()));
        Ok(CommitOutcome {
            written: vec![true; batch.entries.len()],
            filtered: 0,
        })
    }

    async fn keys_present(
        &self,
        _flow: &FlowHandle,
        _table: &str,
        keys: &[String],
    ) -> Result<Vec<bool>, StoreError> {
        Ok(vec![false; keys.len()])
    }

    async fn commit_recorded(&self, _flow: &FlowHandle, _id: &str) -> Result<bool, StoreError> {
        Ok(false)
    }

    async fn flow_progress(&self, _flow: &FlowHandle) -> Result<FlowProgress, StoreError> {
        Ok(FlowProgress::default())
    }

    async fn ledger_upkeep(&self) -> Result<LedgerUpkeep, StoreError> {
        Ok(LedgerUpkeep::default())
    }
}

/// A fake stage: a row for every message but `poison`, whose data it refuses.
struct RejectsPoison;

#[async_trait]
impl Stage for RejectsPoison {
    async fn stage(&self, deliveries: &[Delivery]) -> Result<Vec<Effect>, StageError> {
        if deliveries.iter().any(|d| d.message.message_id == "poison") {
            return Err(StageError::rejected("the fake stage refuses poison"));
        }
        TableStage::default().stage(deliveries).await
    }
}

/// Records what became of each message: `(id, "ack" | "nack")`.
#[derive(Clone, Default)]
struct Fates(Arc<Mutex<Vec<(String, &'static str)>>>);

impl Fates {
    fn of(&self, fate: &str) -> Vec<String> {
        let fates = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        fates
            .iter()
            .filter(|(_, f)| *f == fate)
            .map(|(id, _)| id.clone())
            .collect()
    }
}

struct Handle {
    id: String,
    fates: Fates,
}

impl AckHandle for Handle {
    fn ack(self: Box<Self>) {
        let mut fates = self.fates.0.lock().unwrap_or_else(PoisonError::into_inner);
        fates.push((self.id, "ack"));
    }

    fn nack(self: Box<Self>) {
        let mut fates = self.fates.0.lock().unwrap_or_else(PoisonError::into_inner);
        fates.push((self.id, "nack"));
    }
}

/// A batcher of one-message batches, and the committer under test.
struct Rig {
    intake: mpsc::Sender<Received>,
    batcher: BatchSource,
    budget: Budget,
    fates: Fates,
}

impl Rig {
    fn new() -> Self {
        let (intake, receiver) = mpsc::channel(16);
        let batcher = BatchSource::new(
            receiver,
            DedupSettings {
                key: KeySource::MessageId,
                window: Duration::from_secs(600),
            },
            BatchSettings {
                max_messages: 1,
                max_delay: Duration::ZERO,
            },
            Counters::new("test", "commit_timing"),
        );
        Self {
            intake,
            batcher,
            budget: Budget::new(100, 1 << 20),
            fates: Fates::default(),
        }
    }

    /// A batch of the message `id`, received now (on the paused clock).
    async fn batch(&mut self, id: &str) -> Batch {
        let permit = self.budget.reserve_message().await.expect("budget open");
        let permits = self.budget.reserve_bytes(permit, 1).await;
        let message = SourceMessage {
            message_id: id.to_owned(),
            publish_time_ms: 1_000,
            attributes: Default::default(),
            data: bytes::Bytes::from_static(b"x"),
            event_time_ms: None,
            problem: None,
        };
        let handle = Box::new(Handle {
            id: id.to_owned(),
            fates: self.fates.clone(),
        });
        let sent = self.intake.send(Received::new(message, handle, permits));
        assert!(sent.await.is_ok(), "the batcher is gone");
        self.batcher.next_batch().await.expect("a batch")
    }
}

fn committer_on(
    store: Arc<FlakyStore>,
    stage: Arc<dyn Stage>,
    commit_bound: Option<Duration>,
) -> CommitThenAck {
    let flow = FlowHandle {
        id: 1,
        pipeline: "test".into(),
        name: "commit_timing".into(),
    };
    let retry = RetrySettings {
        max_attempts: 5,
        dedup_window: Duration::from_secs(600),
        commit_bound,
        give_up_after: None,
    };
    CommitThenAck::new(
        store,
        flow,
        "test__target".into(),
        stage,
        retry,
        CancellationToken::new(),
    )
}

/// While the store cannot commit, the same batch is retried after delays that double from
/// [`INITIAL_BACKOFF`] (each drawn in the upper half of its step, full jitter) up to
/// [`MAX_BACKOFF`]; nothing is acked until the commit lands.
#[tokio::test(start_paused = true)]
async fn a_commit_the_store_refuses_is_retried_with_doubling_delays() {
    let mut rig = Rig::new();
    let store = FlakyStore::new(9);
    let committer = committer_on(store.clone(), Arc::new(TableStage::default()), None);
    let batch = rig.batch("m").await;
    let start = Instant::now();
    let report = committer.process(batch).await;
    assert_eq!((report.rows, report.acked), (1, 1));
    assert_eq!(rig.fates.of("ack"), ["m"]);
    let attempts = store.attempts();
    assert_eq!(attempts.len(), 10, "nine failures, then the commit");
    assert_eq!(attempts[0], start, "the first attempt waits for nothing");
    let mut ceiling = INITIAL_BACKOFF;
    for (step, pair) in attempts.windows(2).enumerate() {
        let waited = pair[1] - pair[0];
        assert!(
            ceiling / 2 <= waited && waited <= ceiling,
            "retry {} waited {waited:?}, not within [{:?}, {ceiling:?}]",
            step + 1,
            ceiling / 2
        );
        ceiling = (ceiling * 2).min(MAX_BACKOFF);
    }
}

/// A delivery held past the commit bound while the store cannot commit is given back
/// (nacked), never committed: the committer's last attempt falls within the bound, and the
/// give-back comes at the first check after it, one backoff delay later at most.
#[tokio::test(start_paused = true)]
async fn a_delivery_held_past_the_commit_bound_is_given_back() {
    let bound = Duration::from_secs(12);
    let mut rig = Rig::new();
    let store = FlakyStore::new(usize::MAX);
    let committer = committer_on(store.clone(), Arc::new(TableStage::default()), Some(bound));
    let batch = rig.batch("m").await;
    let received = Instant::now();
    let report = timeout(Duration::from_secs(120), committer.process(batch))
        .await
        .expect("given back within the bound and one backoff delay");
    let given_back = received.elapsed();
    assert_eq!((report.rows, report.abandoned), (0, 1));
    assert_eq!(rig.fates.of("nack"), ["m"]);
    assert!(rig.fates.of("ack").is_empty(), "nothing acked");
    let last = store.attempts().last().copied().expect("attempts");
    assert!(last - received <= bound, "an attempt past the bound");
    assert!(
        given_back > bound,
        "given back after {given_back:?}, before the bound"
    );
    assert!(
        given_back - (last - received) <= MAX_BACKOFF,
        "given back {given_back:?} after receipt, long after the last attempt"
    );
}

/// After a lane gives a part back (a message handed back to Pub/Sub), the lane gives back
/// every later part holding a message received up to [`REGIVE_GRACE`] after that moment, and
/// commits what was received later. The flow has been running a while first, so the paused
/// clock is well past the real one when the give-back happens.
#[tokio::test(start_paused = true)]
async fn a_lane_gives_back_what_it_received_within_the_grace_after_a_give_back() {
    let mut rig = Rig::new();
    let store = FlakyStore::new(0);
    let committer = committer_on(store.clone(), Arc::new(RejectsPoison), None).hand_poison_back();
    let (lanes, mut tasks) = commit_lanes::start(Arc::new(committer), 1, true, 1);
    sleep(Duration::from_secs(30)).await;
    let poison = rig.batch("poison").await;
    assert!(lanes.send(poison).await);
    // The lane gives the poison back at once (no time passes while it does).
    sleep(REGIVE_GRACE / 2).await;
    assert_eq!(rig.fates.of("nack"), ["poison"]);
    let within = rig.batch("within").await;
    assert!(lanes.send(within).await);
    sleep(REGIVE_GRACE / 2 + Duration::from_millis(1)).await;
    let after = rig.batch("after").await;
    assert!(lanes.send(after).await);
    drop(lanes);
    let report = tasks
        .join_next()
        .await
        .expect("the lane")
        .expect("the lane ran");
    assert_eq!((report.rows, report.abandoned), (1, 2));
    assert_eq!(rig.fates.of("nack"), ["poison", "within"]);
    assert_eq!(rig.fates.of("ack"), ["after"]);
    assert_eq!(store.written(), ["after"]);
}
