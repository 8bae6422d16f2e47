//! Ack after commit, shown from the outside: while every commit fails, nothing is acked, leases
//! are kept past the subscription's ack deadline, and once sluice gives the messages back they
//! are all still deliverable to a plain client.
//!
//! The store here is a fault-injecting fake around a real SQLite file (every commit is
//! "unavailable", `sluice_store::testing::FaultStore`): a real SQLite file cannot be made
//! read-only for root, which these tests run as. Pub/Sub is the real emulator.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_engine::{
    BatchSettings, Budget, CommitThenAck, Counters, DedupSettings, FlowRun, KeySource,
    PubSubSource, RetrySettings, RunUntil, TableStage,
};
use sluice_store::testing::{CommitFault, FaultStore};
use sluice_store::{FlowHandle, SqliteStore, StoreError};
use sluice_tests::{PubSub, event};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const MESSAGES: usize = 50;

#[tokio::test(flavor = "multi_thread")]
async fn failing_commits_ack_nothing_and_messages_stay_deliverable() {
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("noack", 1).await;
    let published = pubsub
        .publish(
            &topic,
            (0..MESSAGES).map(|i| event(&format!("n{i}"))).collect(),
        )
        .await;

    // A fake around a real SQLite store: every commit fails as if the database were unreachable.
    let dir = tempfile::tempdir().unwrap();
    let commits = Arc::new(AtomicU64::new(0));
    let counted = commits.clone();
    let store = Arc::new(
        FaultStore::new(SqliteStore::open(&dir.path().join("s.db")).unwrap()).on_commit(
            move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
                CommitFault::Fail(StoreError::Unavailable(
                    "injected: database unreachable".into(),
                ))
            },
        ),
    );
    let counters = Counters::new("test", "ingest");
    let give_up = CancellationToken::new();
    let run = FlowRun {
        source: Box::new(PubSubSource::new(pubsub.config.clone(), &subs[0], 1).unwrap()),
        budget: Budget::new(1_000, 10 << 20),
        dedup: DedupSettings {
            key: KeySource::MessageId,
            window: Duration::from_secs(600),
        },
        batch: BatchSettings {
            max_messages: 100,
            max_delay: Duration::from_millis(20),
        },
        committer: CommitThenAck::new(
            store.clone(),
            FlowHandle {
                id: 1,
                pipeline: Arc::from("test"),
                name: Arc::from("ingest"),
            },
            Arc::from("test__events"),
            Arc::new(TableStage::default()),
            RetrySettings {
                max_attempts: 2,
                dedup_window: Duration::from_secs(600),
                commit_bound: None,
                give_up_after: None,
            },
            give_up.clone(),
        ),
        counters: counters.clone(),
        until: RunUntil::Drained,
        drain_agreement: None,
    };
    let drain = CancellationToken::new();
    let task = tokio::spawn(run.run(drain.clone()));

    // Hold the messages for 15 s, past the subscription's 10 s ack deadline.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let held = counters.snapshot();
    assert_eq!(held.acked, 0, "nothing may be acked while commits fail");
    assert_eq!(
        held.received, MESSAGES as u64,
        "leases were extended: no redelivery yet"
    );
    assert!(
        commits.load(Ordering::SeqCst) >= 3,
        "the commit was retried"
    );

    // A plain client opens its stream while sluice still holds the leases, then sluice gives
    // the messages back (shutdown with the store still down: nack, never ack).
    let plain = pubsub.plain_receiver(&subs[0], MESSAGES, Duration::from_secs(120));
    tokio::time::sleep(Duration::from_secs(2)).await;
    drain.cancel();
    give_up.cancel();
    task.await.unwrap().unwrap();
    let end = counters.snapshot();
    assert_eq!(end.acked, 0);
    assert_eq!(end.nacked, MESSAGES as u64);

    let redelivered = plain.await.unwrap();
    let expected: std::collections::HashSet<_> = published.into_iter().collect();
    assert_eq!(
        redelivered, expected,
        "every message is still deliverable after the failures"
    );
}
