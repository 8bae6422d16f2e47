//! Commit-then-ack on the in-process source and a real SQLite store, behind a fault-injecting
//! wrapper (`sluice_store::testing::FaultStore`, a fake around the real store, for faults SQLite
//! cannot be made to produce on demand: an outage that ends, a message the store keeps
//! rejecting, a commit that lands but whose reply is lost).
#![allow(clippy::unwrap_used, missing_docs)]

use async_trait::async_trait;
use sluice_engine::{
    BatchSettings, BatchSource, Budget, CommitReport, CommitThenAck, Counters, DedupSettings,
    Delivery, Ended, FlowError, FlowRun, FlowWatermark, InProcessSource, KeySource, RetrySettings,
    RunUntil, SourceHandle, Stage, StageError, TableStage,
};
use sluice_store::testing::{CommitFault, FaultStore};
use sluice_store::{
    CommitBatch, Effect, FlowHandle, FlowStore, Inspect, Layout, LedgerStore, SqliteStore,
    StoreError, table_name,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The faults injected into commits, decided by the rule of a [`FaultStore`] (a fake around the
/// real SQLite store).
#[derive(Default)]
struct Faults {
    /// Commits fail with `Unavailable` while set.
    unavailable: AtomicBool,
    /// Commits are never answered while set.
    silent: AtomicBool,
    /// A commit writing a row of this key is rejected.
    poison_key: Mutex<Option<String>>,
    failed_commits: AtomicU64,
    /// Commits still to lose the reply of: while above 0, a commit that the inner store carried
    /// out is answered with `Unavailable` all the same (and this is decremented).
    lost_replies: AtomicU64,
    /// Entries of the commits whose reply was lost.
    lost_entries: AtomicU64,
}

impl Faults {
    fn decide(&self, batch: &CommitBatch) -> CommitFault {
        if self.silent.load(Ordering::SeqCst) {
            return CommitFault::Silent;
        }
        if self.unavailable.load(Ordering::SeqCst) {
            self.failed_commits.fetch_add(1, Ordering::SeqCst);
            return CommitFault::Fail(StoreError::Unavailable("injected outage".into()));
        }
        let poison = self.poison_key.lock().unwrap().clone();
        if let Some(poison) = poison {
            let poisoned = batch
                .entries
                .iter()
                .any(|e| e.key.as_str() == poison && matches!(e.effect, Effect::Row { .. }));
            if poisoned {
                self.failed_commits.fetch_add(1, Ordering::SeqCst);
                return CommitFault::Fail(StoreError::Rejected("injected rejection".into()));
            }
        }
        let lose = self
            .lost_replies
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if lose {
            self.lost_entries
                .fetch_add(batch.entries.len() as u64, Ordering::SeqCst);
            return CommitFault::LoseReply(StoreError::Unavailable("reply lost".into()));
        }
        CommitFault::Pass
    }
}

/// Counts how often each key reaches the stage.
#[derive(Default)]
struct CountingStage {
    seen: Mutex<HashMap<String, u32>>,
}

#[async_trait]
impl Stage for CountingStage {
    async fn stage(&self, deliveries: &[Delivery]) -> Result<Vec<Effect>, StageError> {
        {
            let mut seen = self.seen.lock().unwrap();
            for d in deliveries {
                *seen.entry(d.key.as_str().to_owned()).or_default() += 1;
            }
        }
        TableStage::default().stage(deliveries).await
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    store: Arc<FaultStore<SqliteStore>>,
    faults: Arc<Faults>,
    flow: FlowHandle,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let inner = SqliteStore::open(&dir.path().join("s.db")).unwrap();
    let faults = Arc::new(Faults::default());
    let rule = faults.clone();
    let store = Arc::new(FaultStore::new(inner).on_commit(move |batch| rule.decide(batch)));
    let flow = store
        .prepare(&Layout {
            pipeline: "p".into(),
            tables: vec!["t".into()],
            typed: Vec::new(),
            flows: vec!["f".into()],
        })
        .await
        .unwrap()
        .remove(0);
    Setup {
        _dir: dir,
        store,
        faults,
        flow,
    }
}

fn run_of(
    setup: &Setup,
    source: InProcessSource,
    stage: Arc<dyn Stage>,
    give_up: CancellationToken,
    until: RunUntil,
) -> FlowRun {
    patient_run_of(setup, source, stage, give_up, until, None)
}

/// As [`run_of`], its commits retried for at most `give_up_after` while the store is down.
fn patient_run_of(
    setup: &Setup,
    source: InProcessSource,
    stage: Arc<dyn Stage>,
    give_up: CancellationToken,
    until: RunUntil,
    give_up_after: Option<Duration>,
) -> FlowRun {
    let counters = Counters::new("p", "f");
    FlowRun {
        source: Box::new(source),
        budget: Budget::new(2_000, 100 << 20),
        dedup: DedupSettings {
            key: KeySource::Attribute {
                name: "key".into(),
                dead_letter_if_missing: false,
            },
            window: Duration::from_secs(600),
        },
        batch: BatchSettings {
            max_messages: 500,
            max_delay: Duration::from_millis(5),
        },
        committer: CommitThenAck::new(
            setup.store.clone(),
            setup.flow.clone(),
            Arc::from(table_name("p", "t").unwrap()),
            stage,
            RetrySettings {
                max_attempts: 3,
                dedup_window: Duration::from_secs(600),
                commit_bound: None,
                give_up_after,
            },
            give_up,
        ),
        counters,
        until,
        drain_agreement: None,
    }
}

#[tokio::test]
async fn duplicates_land_once_and_everything_is_acked() {
    let setup = setup().await;
    // 10 000 messages, keys k0..k8999: every tenth message repeats an earlier key.
    let source = InProcessSource::generated(10_000, 100, |i| {
        if i % 10 == 9 {
            format!("k{}", i / 10)
        } else {
            format!("k{}", i - i / 10)
        }
    });
    let tally = source.tally();
    let stage = Arc::new(CountingStage::default());
    let end = run_of(
        &setup,
        source,
        stage.clone(),
        CancellationToken::new(),
        RunUntil::Idle(Duration::from_millis(300)),
    )
    .run(CancellationToken::new())
    .await
    .unwrap();
    assert_eq!(end.ended, Ended::Drained);
    let report: CommitReport = end.report;
    let table = table_name("p", "t").unwrap();
    assert_eq!(setup.store.count_rows(&table, None).await.unwrap(), 9_000);
    assert_eq!(setup.store.key_census(&table).await.unwrap(), (9_000, 0));
    assert_eq!(tally.acked.load(Ordering::SeqCst), 10_000);
    assert_eq!(tally.nacked.load(Ordering::SeqCst), 0);
    assert_eq!(tally.dropped.load(Ordering::SeqCst), 0);
    assert_eq!(report.rows, 9_000);
    // No key reached the stage twice: duplicates were caught in memory or parked.
    assert!(stage.seen.lock().unwrap().values().all(|&n| n == 1));
}

/// With a watermark, a duplicate found in memory is acked only once its settled report is
/// stored (issue 19: a report lost after its ack, in a crash, left its bucket unprocessed until
/// a timed release let the watermark pass whatever else was still committing there). Here no
/// tracker stores the reports until the test does, so the duplicates wait unacked.
#[tokio::test]
async fn with_a_watermark_duplicates_are_acked_only_once_reported() {
    let setup = setup().await;
    let source = InProcessSource::generated(1_000, 100, |i| format!("k{}", i % 900));
    let tally = source.tally();
    let run = run_of(
        &setup,
        source,
        Arc::new(CountingStage::default()),
        CancellationToken::new(),
        RunUntil::Idle(Duration::from_millis(300)),
    );
    let watermark = FlowWatermark::new();
    run.counters.attach_watermark(watermark.clone());
    let running = tokio::spawn(run.run(CancellationToken::new()));
    let table = table_name("p", "t").unwrap();
    for _ in 0..200 {
        if setup.store.count_rows(&table, None).await.unwrap() == 900 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(setup.store.count_rows(&table, None).await.unwrap(), 900);
    let acked_before = tally.acked.load(Ordering::SeqCst);
    let reports = watermark.take_settled();
    let waiting = 1_000 - acked_before;
    assert!(
        waiting > 0,
        "every duplicate was acked before its report was stored"
    );
    assert_eq!(
        reports.reports.len() as u64,
        waiting,
        "one report per unacked duplicate"
    );
    reports.stored();
    let end = running.await.unwrap().unwrap();
    assert_eq!(end.ended, Ended::Drained);
    assert_eq!(tally.acked.load(Ordering::SeqCst), 1_000);
    assert_eq!(tally.nacked.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn nothing_is_acked_while_the_store_is_down_and_all_lands_when_it_returns() {
    let setup = setup().await;
    setup.faults.unavailable.store(true, Ordering::SeqCst);
    let source = InProcessSource::generated(1_000, 10, |i| format!("k{i}"));
    let tally = source.tally();
    let drain = CancellationToken::new();
    let run = run_of(
        &setup,
        source,
        Arc::new(TableStage::default()),
        CancellationToken::new(),
        RunUntil::Drained,
    );
    let counters = run.counters.clone();
    let task = tokio::spawn(run.run(drain.clone()));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        setup.faults.failed_commits.load(Ordering::SeqCst) >= 2,
        "commits were retried"
    );
    // The system lag grows while the commits fail: the oldest message waits.
    let lag = counters.oldest_unacked_age();
    assert!(lag >= Duration::from_millis(1_000), "system lag {lag:?}");
    assert!(counters.snapshot().commit_errors >= 2);
    assert_eq!(
        tally.acked.load(Ordering::SeqCst),
        0,
        "nothing acked during the outage"
    );
    setup.faults.unavailable.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    drain.cancel();
    let end = task.await.unwrap().unwrap();
    assert_eq!(end.ended, Ended::Stopped);
    assert_eq!(tally.acked.load(Ordering::SeqCst), 1_000);
    assert_eq!(tally.dropped.load(Ordering::SeqCst), 0);
    assert_eq!(setup.store.count_rows("p__t", None).await.unwrap(), 1_000);
    assert_eq!(
        counters.oldest_unacked_age(),
        Duration::ZERO,
        "nothing left in flight"
    );
}

/// A commit that lands in the store but whose reply never arrives (the fake's `lost_replies`:
/// SQLite in process cannot commit and then fail to answer; over a network a store can). The
/// replies of the first 3 commits of 1 000 distinct messages are lost, so the committer sees
/// `Unavailable` and retries the same batch. Its retries find every key of it in the ledger: no
/// message lands twice (exactly one row per key), every message is acked once the store has
/// answered, none is nacked or dropped, and the store's counters show exactly the keys of the
/// lost commits as ledger duplicates: the batch was decided from the store, not from the lost
/// answer.
#[tokio::test]
async fn a_commit_whose_reply_is_lost_is_decided_from_the_store_on_retry() {
    const LOST: u64 = 3;
    let setup = setup().await;
    setup.faults.lost_replies.store(LOST, Ordering::SeqCst);
    let source = InProcessSource::generated(1_000, 10, |i| format!("k{i}"));
    let tally = source.tally();
    let run = run_of(
        &setup,
        source,
        Arc::new(TableStage::default()),
        CancellationToken::new(),
        RunUntil::Idle(Duration::from_millis(300)),
    );
    let counters = run.counters.clone();
    let end = run.run(CancellationToken::new()).await.unwrap();
    assert_eq!(end.ended, Ended::Drained);
    assert_eq!(
        setup.faults.lost_replies.load(Ordering::SeqCst),
        0,
        "the replies of {LOST} commits were lost"
    );
    let lost_entries = setup.faults.lost_entries.load(Ordering::SeqCst);
    assert!(lost_entries > 0);
    let table = table_name("p", "t").unwrap();
    assert_eq!(setup.store.count_rows(&table, None).await.unwrap(), 1_000);
    assert_eq!(setup.store.key_census(&table).await.unwrap(), (1_000, 0));
    assert_eq!(tally.acked.load(Ordering::SeqCst), 1_000);
    assert_eq!(tally.nacked.load(Ordering::SeqCst), 0);
    assert_eq!(tally.dropped.load(Ordering::SeqCst), 0);
    let snapshot = counters.snapshot();
    assert!(
        snapshot.commit_errors >= LOST,
        "each lost reply was a failed commit to the committer"
    );
    // The committer never saw the lost commit's rows as written: its answered retry found them
    // in the ledger, so it reports them as duplicates (and so do the flow's metrics).
    assert!(
        end.report.duplicates > 0 && snapshot.duplicates_store == end.report.duplicates,
        "the retry that was answered found its keys committed"
    );
    assert_eq!(end.report.rows + end.report.duplicates, 1_000);
    assert_eq!(snapshot.committed, end.report.rows);
    // Each lost commit was retried with the same entries, all found in the ledger (a retry
    // whose reply is lost too is both), and no other key repeats.
    let progress = setup.store.flow_progress(&setup.flow).await.unwrap();
    assert_eq!((progress.committed, progress.dead_lettered), (1_000, 0));
    assert!(progress.duplicates > 0);
    assert_eq!(
        progress.duplicates, lost_entries,
        "ledger duplicates against entries of the lost commits"
    );
}

/// Deliveries that waited through an outage longer than the commit bound are given back
/// (nacked), never committed, even though the store is back: a redelivery elsewhere may have
/// committed them already, and the ledger's window may not cover that any more.
#[tokio::test]
async fn deliveries_held_past_the_commit_bound_are_nacked_not_committed() {
    let setup = setup().await;
    setup.faults.unavailable.store(true, Ordering::SeqCst);
    let source = InProcessSource::generated(300, 10, |i| format!("k{i}"));
    let tally = source.tally();
    let drain = CancellationToken::new();
    let mut run = run_of(
        &setup,
        source,
        Arc::new(TableStage::default()),
        CancellationToken::new(),
        RunUntil::Drained,
    );
    run.committer = CommitThenAck::new(
        setup.store.clone(),
        setup.flow.clone(),
        Arc::from(table_name("p", "t").unwrap()),
        Arc::new(TableStage::default()),
        RetrySettings {
            max_attempts: 3,
            dedup_window: Duration::from_secs(600),
            commit_bound: Some(Duration::from_millis(800)),
            give_up_after: None,
        },
        CancellationToken::new(),
    );
    let counters = run.counters.clone();
    let task = tokio::spawn(run.run(drain.clone()));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    setup.faults.unavailable.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    drain.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(setup.store.count_rows("p__t", None).await.unwrap(), 0);
    assert_eq!(tally.acked.load(Ordering::SeqCst), 0);
    assert_eq!(tally.nacked.load(Ordering::SeqCst), 300);
    assert_eq!(counters.snapshot().stale, 300);
}

/// The memory tier never drops a message the ledger would take: a key the ledger found
/// duplicate (another replica committed it, with a 2 s window) is not remembered past the
/// ledger's own expiry, so a copy arriving after the window ended is committed.
#[tokio::test]
async fn a_ledger_duplicate_is_not_remembered_past_the_ledgers_window() {
    const WINDOW: Duration = Duration::from_secs(2);
    let setup = setup().await;
    let now = sluice_engine::now_ms();
    // Another replica committed `k` just now: the ledger keeps it until now + 2 s.
    let theirs = sluice_store::Entry {
        key: sluice_dedup::DedupKey::new("k"),
        message: sluice_store::MessageFields {
            message_id: "theirs".into(),
            publish_time_ms: now,
            attributes_json: "{}".into(),
            data: bytes::Bytes::new(),
        },
        effect: Effect::row(now),
    };
    setup
        .store
        .commit(CommitBatch {
            flow: setup.flow.clone(),
            table: Arc::from(table_name("p", "t").unwrap()),
            entries: vec![theirs],
            now_ms: now,
            expires_at_ms: now + 2_000,
            hook: None,
            watermark_progress: false,
            commit_by_ms: None,
            position: None,
            position_gate: None,
            work: None,
            publish_dead_letters: false,
            verdicts: Vec::new(),
            memory_duplicates: 0,
            typed: None,
        })
        .await
        .unwrap();
    // Copies of `k` at about 1.0 s (inside the ledger's window: a duplicate) and at 2.6 s
    // (after it: new to the ledger).
    let source = InProcessSource::generated(2, 10, |_| "k".to_owned()).with_gaps(vec![
        Duration::from_millis(1_000),
        Duration::from_millis(1_600),
    ]);
    let tally = source.tally();
    let mut run = run_of(
        &setup,
        source,
        Arc::new(TableStage::default()),
        CancellationToken::new(),
        RunUntil::Idle(Duration::from_millis(3_000)),
    );
    run.dedup.window = WINDOW;
    let counters = run.counters.clone();
    let end = run.run(CancellationToken::new()).await.unwrap();
    assert_eq!(end.ended, Ended::Drained);
    let snapshot = counters.snapshot();
    assert_eq!(
        (snapshot.duplicates_store, snapshot.duplicates_memory),
        (1, 0),
        "the first copy is the ledger's duplicate; memory drops nothing"
    );
    assert_eq!(
        setup.store.count_rows("p__t", None).await.unwrap(),
        2,
        "the copy after the window is committed"
    );
    assert_eq!(tally.acked.load(Ordering::SeqCst), 2);
}

/// A triggered run's `give_up_after`: an outage shorter than it is waited out and everything
/// lands; a store that stays down past it makes the flow end by itself, failed with
/// `FlowError::GaveUp` naming the setting, nothing acked, every message given back.
#[tokio::test]
async fn a_store_down_past_give_up_after_fails_the_flow_and_acks_nothing() {
    let patience = Some(Duration::from_millis(1_500));
    let setup = setup().await;
    setup.faults.unavailable.store(true, Ordering::SeqCst);
    let source = InProcessSource::generated(200, 10, |i| format!("short{i}"));
    let tally = source.tally();
    let stage = Arc::new(TableStage::default());
    let never = CancellationToken::new();
    let idle = RunUntil::Idle(Duration::from_millis(300));
    let run = patient_run_of(&setup, source, stage.clone(), never.clone(), idle, patience);
    let task = tokio::spawn(run.run(CancellationToken::new()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    setup.faults.unavailable.store(false, Ordering::SeqCst);
    let end = task.await.unwrap().unwrap();
    assert_eq!(end.ended, Ended::Drained, "a shorter outage is waited out");
    assert_eq!(tally.acked.load(Ordering::SeqCst), 200);

    setup.faults.unavailable.store(true, Ordering::SeqCst);
    let failed_before = setup.faults.failed_commits.load(Ordering::SeqCst);
    let source = InProcessSource::generated(300, 10, |i| format!("long{i}"));
    let tally = source.tally();
    let run = patient_run_of(&setup, source, stage, never, idle, patience);
    let began = std::time::Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(60), run.run(CancellationToken::new()))
        .await
        .expect("the flow ends by itself once its patience is spent");
    assert!(
        began.elapsed() >= Duration::from_millis(1_500),
        "gave up only once the patience was spent: {:?}",
        began.elapsed()
    );
    match ended {
        Err(FlowError::GaveUp(why)) => {
            assert!(
                why.contains("give_up_after") && why.contains("injected outage"),
                "{why}"
            );
        }
        other => panic!("expected a give-up, got {other:?}"),
    }
    assert!(
        setup.faults.failed_commits.load(Ordering::SeqCst) - failed_before >= 2,
        "the commit was retried before the run gave up"
    );
    assert_eq!(tally.acked.load(Ordering::SeqCst), 0, "nothing acked");
    assert_eq!(tally.dropped.load(Ordering::SeqCst), 0);
    assert_eq!(
        tally.nacked.load(Ordering::SeqCst),
        300,
        "every message given back"
    );
    assert_eq!(setup.store.count_rows("p__t", None).await.unwrap(), 200);
}

/// A store that never answers (a partition: no error, no reply) cannot hold a triggered run:
/// the commit counts as failed once `give_up_after` has passed, and the flow gives up, nothing
/// acked.
#[tokio::test]
async fn a_commit_without_an_answer_gives_up_after_give_up_after() {
    let patience = Duration::from_millis(1_000);
    let setup = setup().await;
    setup.faults.silent.store(true, Ordering::SeqCst);
    let source = InProcessSource::generated(50, 10, |i| format!("k{i}"));
    let tally = source.tally();
    let run = patient_run_of(
        &setup,
        source,
        Arc::new(TableStage::default()),
        CancellationToken::new(),
        RunUntil::Idle(Duration::from_millis(300)),
        Some(patience),
    );
    let began = std::time::Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(60), run.run(CancellationToken::new()))
        .await
        .expect("a silent store does not hold the run");
    assert!(began.elapsed() >= patience, "{:?}", began.elapsed());
    match ended {
        Err(FlowError::GaveUp(why)) => {
            assert!(why.contains("did not answer the commit within 1s"), "{why}");
        }
        other => panic!("expected a give-up, got {other:?}"),
    }
    assert_eq!(tally.acked.load(Ordering::SeqCst), 0);
    assert_eq!(tally.nacked.load(Ordering::SeqCst), 50);
}

#[tokio::test]
async fn giving_up_at_shutdown_nacks_instead_of_acking() {
    let setup = setup().await;
    setup.faults.unavailable.store(true, Ordering::SeqCst);
    let source = InProcessSource::generated(300, 10, |i| format!("k{i}"));
    let tally = source.tally();
    let (drain, give_up) = (CancellationToken::new(), CancellationToken::new());
    let run = run_of(
        &setup,
        source,
        Arc::new(TableStage::default()),
        give_up.clone(),
        RunUntil::Drained,
    );
    let task = tokio::spawn(run.run(drain.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    drain.cancel();
    give_up.cancel();
    let report = task.await.unwrap().unwrap().report;
    assert_eq!(tally.acked.load(Ordering::SeqCst), 0);
    assert_eq!(tally.nacked.load(Ordering::SeqCst), 300);
    assert_eq!(tally.dropped.load(Ordering::SeqCst), 0);
    assert_eq!(report.abandoned, 300);
    assert_eq!(setup.store.count_rows("p__t", None).await.unwrap(), 0);
}

#[tokio::test]
async fn a_message_the_store_keeps_rejecting_is_dead_lettered_and_the_rest_commit() {
    let setup = setup().await;
    *setup.faults.poison_key.lock().unwrap() = Some("k7".into());
    let source = InProcessSource::generated(50, 10, |i| format!("k{i}"));
    let tally = source.tally();
    let report = run_of(
        &setup,
        source,
        Arc::new(TableStage::default()),
        CancellationToken::new(),
        RunUntil::Idle(Duration::from_millis(300)),
    )
    .run(CancellationToken::new())
    .await
    .unwrap()
    .report;
    assert_eq!(report.rows, 49);
    assert_eq!(report.dead_letters, 1);
    assert_eq!(tally.acked.load(Ordering::SeqCst), 50);
    let progress = setup.store.flow_progress(&setup.flow).await.unwrap();
    assert_eq!((progress.committed, progress.dead_lettered), (49, 1));
}

#[tokio::test]
async fn bad_timestamps_are_dead_lettered_not_dropped() {
    let setup = setup().await;
    let source = InProcessSource::generated(20, 10, |i| format!("k{i}"));
    let tally = source.tally();
    // Every message lacks the `ts` attribute.
    let stage = Arc::new(TableStage {
        event_time_attribute: Some("ts".into()),
        bad_timestamp_uses_publish_time: false,
        fields: None,
        dedup_attribute: None,
    });
    let report = run_of(
        &setup,
        source,
        stage,
        CancellationToken::new(),
        RunUntil::Idle(Duration::from_millis(300)),
    )
    .run(CancellationToken::new())
    .await
    .unwrap()
    .report;
    assert_eq!((report.rows, report.dead_letters), (0, 20));
    assert_eq!(tally.acked.load(Ordering::SeqCst), 20);
}

/// A batcher over `source`, keyed by the `key` attribute, with batches of up to 1 000 messages
/// or `max_delay`; and the token that stops the source.
async fn batcher(
    source: InProcessSource,
    max_delay: Duration,
) -> (BatchSource, Box<dyn SourceHandle>, CancellationToken) {
    let stop = CancellationToken::new();
    let (batches, handle) = BatchSource::start(
        Box::new(source),
        Budget::new(100, 1 << 20),
        DedupSettings {
            key: KeySource::Attribute {
                name: "key".into(),
                dead_letter_if_missing: false,
            },
            window: Duration::from_secs(600),
        },
        BatchSettings {
            max_messages: 1_000,
            max_delay,
        },
        Counters::new("p", "f"),
        stop.clone(),
    )
    .await
    .unwrap();
    (batches, handle, stop)
}

#[tokio::test]
async fn a_batch_cancelled_while_it_fills_is_nacked_and_its_keys_released() {
    // Ten messages, then the source goes quiet: the batch waits for its 10 s delay.
    let source = InProcessSource::generated(10, 10, |i| format!("k{i}"));
    let tally = source.tally();
    let (mut batches, handle, stop) = batcher(source, Duration::from_secs(10)).await;
    let cancelled = tokio::time::timeout(Duration::from_millis(300), batches.next_batch()).await;
    assert!(cancelled.is_err(), "the batch was still filling");
    assert_eq!(
        batches.keys_in_flight(),
        0,
        "no key stays in flight after the cancellation"
    );
    assert_eq!(tally.nacked.load(Ordering::SeqCst), 10);
    assert_eq!(tally.dropped.load(Ordering::SeqCst), 0);
    stop.cancel();
    drop(batches);
    handle.close().await;
}

#[tokio::test]
async fn a_racing_redelivery_is_parked_and_acked_with_its_original() {
    // The same key twice in a row: the second arrives while the first is in flight.
    let source = InProcessSource::generated(2, 10, |_| "same".to_owned());
    let tally = source.tally();
    let (mut batches, handle, stop) = batcher(source, Duration::from_millis(200)).await;
    let batch = batches.next_batch().await.unwrap();
    assert_eq!(batch.len(), 1, "the redelivery is parked, not batched");
    assert_eq!(
        tally.acked.load(Ordering::SeqCst),
        0,
        "the parked one waits for its original"
    );
    assert_eq!(
        batch.settle_committed(),
        2,
        "the original and its parked redelivery"
    );
    assert_eq!(
        tally.acked.load(Ordering::SeqCst),
        2,
        "both acked after the commit"
    );
    assert_eq!(batches.keys_in_flight(), 0);
    stop.cancel();
    drop(batches);
    handle.close().await;
}

/// A `foreach_batch` closure (library use) sees every record once per committed batch, with the
/// batch id derived from its keys; while it reports itself unavailable, the same batch comes
/// again with the same id and no attempt is charged (nothing is dead-lettered), and nothing is
/// acked before it answers OK and the batch commits.
#[tokio::test]
async fn a_foreach_batch_closure_sees_each_batch_and_its_outages_retry_the_same_batch_id() {
    let setup = setup().await;
    let source = InProcessSource::generated(2_000, 10, |i| format!("k{i}"));
    let tally = source.tally();
    // (batch id, keys) per call.
    type Calls = Arc<Mutex<Vec<(String, Vec<String>)>>>;
    let calls: Calls = Arc::default();
    let outages = Arc::new(AtomicU64::new(4));
    let stage = {
        let (calls, outages) = (calls.clone(), outages.clone());
        sluice_engine::ForeachBatchStage::new("f", TableStage::default(), move |batch| {
            let keys: Vec<String> = batch.records.iter().map(|r| r.key.clone()).collect();
            calls.lock().unwrap().push((batch.batch_id.clone(), keys));
            let down = outages
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            async move {
                if down {
                    Err(StageError::unavailable("stage restarting"))
                } else {
                    Ok(())
                }
            }
        })
    };
    let end = run_of(
        &setup,
        source,
        Arc::new(stage),
        CancellationToken::new(),
        RunUntil::Idle(Duration::from_millis(500)),
    )
    .run(CancellationToken::new())
    .await
    .unwrap();
    assert_eq!(end.report.rows, 2_000);
    assert_eq!(end.report.dead_letters, 0, "an outage charges no attempt");
    assert_eq!(tally.acked.load(Ordering::SeqCst), 2_000);
    let calls = calls.lock().unwrap();
    // The first batch was refused four times, then accepted: five calls with one id and one
    // set of keys.
    let (first_id, first_keys) = &calls[0];
    assert!(
        calls[..5]
            .iter()
            .all(|(id, keys)| id == first_id && keys == first_keys)
    );
    for (id, keys) in calls.iter() {
        assert_eq!(
            id,
            &sluice_engine::batch_id(keys.iter().map(String::as_str))
        );
    }
    let mut accepted: Vec<&String> = calls[4..].iter().flat_map(|(_, keys)| keys).collect();
    accepted.sort();
    accepted.dedup();
    assert_eq!(accepted.len(), 2_000, "every record reached the closure");
    assert_eq!(
        calls[4..].iter().map(|(_, k)| k.len()).sum::<usize>(),
        2_000,
        "once per committed batch"
    );
}

/// Messages without the dedup attribute are counted (`sluice_dedup_key_missing_total`), and
/// with `on_missing: dead_letter` their dead letter names the attribute.
#[tokio::test]
async fn a_missing_dedup_attribute_is_counted_and_named() {
    let messages: Vec<sluice_engine::SourceMessage> = (0..10)
        .map(|i| {
            let mut attributes = std::collections::BTreeMap::new();
            if i % 3 != 0 {
                attributes.insert("key".to_owned(), format!("k{i}"));
            }
            sluice_engine::SourceMessage {
                message_id: format!("m{i}"),
                publish_time_ms: 1,
                attributes,
                data: bytes::Bytes::from_static(b"{}"),
                event_time_ms: None,
                problem: None,
            }
        })
        .collect();
    let counters = Counters::new("p", "missing");
    let stop = CancellationToken::new();
    let (mut batches, handle) = BatchSource::start(
        Box::new(InProcessSource::new(messages)),
        Budget::new(100, 1 << 20),
        DedupSettings {
            key: KeySource::Attribute {
                name: "key".into(),
                dead_letter_if_missing: true,
            },
            window: Duration::from_secs(600),
        },
        BatchSettings {
            max_messages: 10,
            max_delay: Duration::from_millis(200),
        },
        counters.clone(),
        stop.clone(),
    )
    .await
    .unwrap();
    let batch = batches.next_batch().await.unwrap();
    assert_eq!(batch.len(), 10);
    // m0, m3, m6 and m9 have no `key`.
    assert_eq!(counters.dedup_keys_missing(), 4);
    let stage = TableStage {
        dedup_attribute: Some("key".into()),
        ..TableStage::default()
    };
    let effects = stage.stage(batch.deliveries()).await.unwrap();
    let letters: Vec<&String> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::DeadLetter { reason, error, .. } => {
                assert_eq!(reason, "missing_dedup_attribute");
                Some(error)
            }
            _ => None,
        })
        .collect();
    assert_eq!(letters.len(), 4);
    assert!(
        letters
            .iter()
            .all(|e| e.starts_with("no dedup attribute `key` in message \"m")),
        "{letters:?}"
    );
    stop.cancel();
    drop(batches);
    handle.close().await;
}
