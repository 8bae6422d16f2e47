//! The table source ([`sluice_engine::TableSource`]) on a real SQLite store, through a
//! fault-injecting wrapper (`sluice_store::testing::FaultStore`, a fake around the real store,
//! for faults SQLite cannot be made to produce on demand: a commit that lands but whose reply
//! is lost, a refused one):
//!
//! * catching up: every row of the table once, a batch per page, the position committed with
//!   the last page;
//! * a lost reply on a page's commit: the retry finds its position moved, the page is given
//!   back and the source reads on from the stored position, each row still once;
//! * following: rows committed while it runs are read as they come, until stopped;
//! * a page whose position change the store refuses (moved by another reader or a reset) is
//!   given back with those after it, and read again from the stored position.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_dedup::DedupKey;
use sluice_engine::{
    BatchSettings, Budget, CommitThenAck, Counters, DedupSettings, Ended, FlowRun, KeySource,
    RetrySettings, RunUntil, TableSource, TableStage,
};
use sluice_store::testing::{CommitFault, FaultStore};
use sluice_store::{
    CommitBatch, Effect, Entry, FeedStore, FlowHandle, FlowStore, Inspect, Layout, LedgerStore,
    MessageFields, SqliteStore, Store, StoreError,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const SOURCE: &str = "p__events";
const COPIES: &str = "p__copies";

struct Setup {
    _dir: tempfile::TempDir,
    store: Arc<FaultStore<SqliteStore>>,
    writer: FlowHandle,
    reader: FlowHandle,
}

async fn setup(rule: impl Fn(&CommitBatch) -> CommitFault + Send + Sync + 'static) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let inner = SqliteStore::open(&dir.path().join("s.db")).unwrap();
    let store = Arc::new(FaultStore::new(inner).on_commit(rule));
    let flows = store
        .prepare(&Layout {
            pipeline: "p".into(),
            tables: vec!["events".into(), "copies".into()],
            typed: Vec::new(),
            flows: vec!["writer".into(), "reader".into()],
        })
        .await
        .unwrap();
    Setup {
        _dir: dir,
        store,
        writer: flows[0].clone(),
        reader: flows[1].clone(),
    }
}

/// A row entry of key `key` (the message id too) for record `i`.
fn entry(key: String, i: usize) -> Entry {
    Entry {
        key: DedupKey::new(key.as_str()),
        message: MessageFields {
            message_id: key,
            publish_time_ms: 1_000,
            attributes_json: "{}".into(),
            data: bytes::Bytes::from(format!("row {i}")),
        },
        effect: Effect::row(5),
    }
}

/// Commits `entries` of `flow` into `table`, their ledger keys kept for `window_ms`.
async fn commit(
    setup: &Setup,
    flow: &FlowHandle,
    table: &str,
    entries: Vec<Entry>,
    window_ms: i64,
) {
    let now = sluice_engine::now_ms();
    setup
        .store
        .commit(CommitBatch {
            flow: flow.clone(),
            table: Arc::from(table),
            entries,
            now_ms: now,
            expires_at_ms: now + window_ms,
            commit_by_ms: None,
            hook: None,
            watermark_progress: false,
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
}

/// Commits rows `from..to` of the writer into the source table, 100 per batch.
async fn write(setup: &Setup, from: usize, to: usize) {
    let keys: Vec<usize> = (from..to).collect();
    for chunk in keys.chunks(100) {
        let entries = chunk
            .iter()
            .map(|i| entry(format!("k{i:05}"), *i))
            .collect();
        commit(setup, &setup.writer, SOURCE, entries, 600_000).await;
    }
}

/// A setup whose store answers the `nth` commit that moves a reading flow's position (from 0)
/// with `fault`, and every other commit as the real store.
async fn setup_failing_page(nth: u64, fault: fn() -> CommitFault) -> Setup {
    let page_commits = Arc::new(AtomicU64::new(0));
    setup(move |batch| {
        if batch.position.is_some() && page_commits.fetch_add(1, Ordering::SeqCst) == nth {
            return fault();
        }
        CommitFault::Pass
    })
    .await
}

fn run(setup: &Setup, source: TableSource, until: RunUntil) -> FlowRun {
    let store: Arc<dyn Store> = setup.store.clone();
    FlowRun {
        source: Box::new(source),
        budget: Budget::new(2_000, 100 << 20),
        dedup: DedupSettings {
            key: KeySource::MessageId,
            window: Duration::from_secs(600),
        },
        batch: BatchSettings {
            max_messages: 1_000,
            max_delay: Duration::from_millis(5),
        },
        committer: CommitThenAck::new(
            store,
            setup.reader.clone(),
            Arc::from(COPIES),
            Arc::new(TableStage::default()),
            RetrySettings {
                max_attempts: 5,
                dedup_window: Duration::from_secs(600),
                commit_bound: None,
                give_up_after: None,
            },
            CancellationToken::new(),
        ),
        counters: Counters::new("p", "reader"),
        until,
        drain_agreement: None,
    }
}

fn source(setup: &Setup) -> TableSource {
    let store: Arc<dyn Store> = setup.store.clone();
    TableSource::new(store, setup.reader.clone(), SOURCE)
}

async fn copies(setup: &Setup) -> (u64, u64) {
    let rows = setup
        .store
        .count_rows(COPIES, Some("reader"))
        .await
        .unwrap();
    let (distinct, repeated) = setup.store.key_census(COPIES).await.unwrap();
    assert_eq!(repeated, 0, "no key twice in the copies");
    (rows, distinct)
}

#[tokio::test]
async fn catching_up_reads_every_row_once_a_batch_per_page() {
    let setup = setup(|_| CommitFault::Pass).await;
    write(&setup, 0, 1_234).await;
    let end = run(&setup, source(&setup), RunUntil::Exhausted)
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(end.ended, Ended::Drained);
    assert_eq!(end.report.rows, 1_234);
    assert_eq!(copies(&setup).await, (1_234, 1_234));
    let position = setup
        .store
        .read_position(&setup.reader, SOURCE)
        .await
        .unwrap();
    // One plan, then three pages of 500 (the last short): version 1 + 3.
    assert_eq!(position.version, 4, "{position:?}");
    let progress = setup.store.flow_progress(&setup.reader).await.unwrap();
    assert_eq!(progress.batches, 3, "a batch per page");

    // Nothing new: a second run reads nothing; more rows: it reads those only.
    let again = run(&setup, source(&setup), RunUntil::Exhausted)
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(again.report.rows, 0);
    write(&setup, 1_234, 1_300).await;
    let more = run(&setup, source(&setup), RunUntil::Exhausted)
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(more.report.rows, 66);
    assert_eq!(
        more.report.duplicates, 0,
        "read from the position, not again"
    );
}

#[tokio::test]
async fn a_lost_reply_on_a_page_gives_it_back_and_reads_on() {
    let setup = setup_failing_page(1, || {
        CommitFault::LoseReply(StoreError::Unavailable("reply lost".into()))
    })
    .await;
    write(&setup, 0, 1_600).await;
    let end = run(&setup, source(&setup), RunUntil::Exhausted)
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(end.ended, Ended::Drained);
    assert_eq!(copies(&setup).await, (1_600, 1_600));
    // The retry of the page whose reply was lost found the position moved: given back.
    assert_eq!(end.report.abandoned, 500, "{:?}", end.report);
    assert_eq!(
        end.report.rows, 1_100,
        "that page's rows committed the first time"
    );
}

#[tokio::test]
async fn following_reads_rows_as_they_are_committed_until_stopped() {
    let setup = setup(|_| CommitFault::Pass).await;
    write(&setup, 0, 300).await;
    let stop = CancellationToken::new();
    let running = tokio::spawn(
        run(
            &setup,
            source(&setup).follow(Duration::from_millis(20)),
            RunUntil::Drained,
        )
        .run(stop.clone()),
    );
    for wave in 1..5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        write(&setup, wave * 300, wave * 300 + 300).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while copies(&setup).await.0 < 1_500 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    let end = running.await.unwrap().unwrap();
    assert_eq!(end.ended, Ended::Stopped);
    assert_eq!(copies(&setup).await, (1_500, 1_500));
    let lag = setup
        .store
        .feed_lag(
            SOURCE,
            &setup
                .store
                .read_position(&setup.reader, SOURCE)
                .await
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(lag.rows_behind, 0);
}

#[tokio::test]
async fn a_page_refused_because_the_position_moved_is_given_back_and_read_again() {
    // The store refuses the first page's position change, as it does when another replica
    // or a reset moved the position meanwhile.
    let setup = setup_failing_page(0, || CommitFault::Fail(StoreError::Moved)).await;
    write(&setup, 0, 1_000).await;
    let end = run(&setup, source(&setup), RunUntil::Exhausted)
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(end.ended, Ended::Drained);
    assert_eq!(copies(&setup).await, (1_000, 1_000));
    assert_eq!(end.report.rows, 1_000);
    assert!(end.report.abandoned >= 500, "{:?}", end.report);
}

#[tokio::test]
async fn a_reader_from_before_feeds_skips_what_it_copied_across_a_restart() {
    // The second page's commit is refused (position moved): the source starts its first range
    // again, and must still skip what the flow had copied before it had a position.
    let setup = setup_failing_page(1, || CommitFault::Fail(StoreError::Moved)).await;
    write(&setup, 0, 1_500).await;
    // What the reader copied before feeds existed: the first 700 rows, long ago (their ledger
    // keys expired: only the check against the target can catch them).
    let copied = (0..700)
        .map(|i| entry(format!("writer/k{i:05}"), i))
        .collect();
    commit(&setup, &setup.reader, COPIES, copied, 1).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let source = source(&setup).skip_committed(sluice_engine::SkipCommitted {
        store: setup.store.clone(),
        flow: setup.reader.clone(),
        table: Arc::from(COPIES),
    });
    let progress = source.progress();
    let end = run(&setup, source, RunUntil::Exhausted)
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(end.ended, Ended::Drained);
    assert_eq!(copies(&setup).await, (1_500, 1_500));
    assert!(
        progress.skipped.load(Ordering::Relaxed) >= 700,
        "skipped {}",
        progress.skipped.load(Ordering::Relaxed)
    );
}
