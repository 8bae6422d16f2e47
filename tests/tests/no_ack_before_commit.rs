//! Ack after commit, shown from the outside: while every commit fails, nothing is acked, leases
//! are kept past the subscription's ack deadline, and once sluice gives the messages back they
//! are all still deliverable to a plain client.
//!
//! The store here is a fault-injecting fake (every commit is "unavailable"): a real SQLite file
//! cannot be made read-only for root, which these tests run as. Pub/Sub is the real emulator.
#![allow(clippy::unwrap_used, missing_docs)]

use async_trait::async_trait;
use sluice_connector::{
    BatchSettings, Budget, CommitThenAck, Counters, DedupSettings, FlowRun, KeySource,
    PubSubSource, RetrySettings, RunUntil, TableStage,
};
use sluice_store::{
    CommitBatch, CommitOutcome, FlowHandle, FlowProgress, Layout, LeaseGrant, LeaseRecord,
    LeaseRequest, LedgerUpkeep, Store, StoreError, WorkerBeat, WorkerRecord,
};
use sluice_tests::{PubSub, event};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const MESSAGES: usize = 50;

/// Every commit fails as if the database were unreachable.
#[derive(Default)]
struct DownStore {
    commits: AtomicU64,
}

#[async_trait]
impl Store for DownStore {
    async fn prepare(&self, _: &Layout) -> Result<Vec<FlowHandle>, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn commit(&self, _: CommitBatch) -> Result<CommitOutcome, StoreError> {
        self.commits.fetch_add(1, Ordering::SeqCst);
        Err(StoreError::Unavailable(
            "injected: database unreachable".into(),
        ))
    }
    async fn count_rows(&self, _: &str, _: Option<&str>) -> Result<u64, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn key_census(&self, _: &str) -> Result<(u64, u64), StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn flow_progress(&self, _: &FlowHandle) -> Result<FlowProgress, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn record_completion(&self, _: &FlowHandle) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn completions(&self, _: &str) -> Result<Vec<(String, i64)>, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn reset_flow(
        &self,
        _: &FlowHandle,
        _: Option<&str>,
        _: sluice_store::ResetRows,
    ) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn commit_recorded(&self, _: &FlowHandle, _: &str) -> Result<bool, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn read_rows(
        &self,
        _: &str,
        _: Option<&sluice_store::RowCursor>,
        _: usize,
    ) -> Result<Vec<sluice_store::StoredRow>, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn keys_present(
        &self,
        _: &FlowHandle,
        _: &str,
        _: &[String],
    ) -> Result<Vec<bool>, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn ledger_upkeep(&self) -> Result<LedgerUpkeep, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn heartbeat(&self, _: &WorkerBeat) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn leave(&self, _: &str, _: &str) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn report_drain(&self, _: &FlowHandle, _: &str, _: bool) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn withdraw_drain(&self, _: &FlowHandle, _: &str) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn drain_census(&self, _: &FlowHandle) -> Result<sluice_store::DrainCensus, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn workers(&self, _: &str, _: Duration) -> Result<Vec<WorkerRecord>, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn acquire_lease(&self, _: &LeaseRequest) -> Result<LeaseGrant, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn release_lease(&self, _: &str, _: &str, _: &str) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn leases(&self, _: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn add_bucket_messages(
        &self,
        _: &FlowHandle,
        _: &[sluice_store::BucketMessage],
    ) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn bucket_counts(
        &self,
        _: &FlowHandle,
        _: i64,
    ) -> Result<Vec<sluice_store::BucketCounts>, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn prune_buckets(&self, _: &FlowHandle, _: i64) -> Result<u64, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn advance_watermark(
        &self,
        _: &FlowHandle,
        _: &sluice_store::WatermarkRecord,
        _: Option<&str>,
    ) -> Result<Option<sluice_store::WatermarkRecord>, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn watermarks(
        &self,
        _: &str,
    ) -> Result<Vec<(String, sluice_store::WatermarkRecord)>, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn prepare_window_table(&self, _: &str) -> Result<(), StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn emit_windows(
        &self,
        _: &FlowHandle,
        _: &sluice_store::WindowEmission,
    ) -> Result<sluice_store::WindowsEmitted, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
}

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

    let store = Arc::new(DownStore::default());
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
        store.commits.load(Ordering::SeqCst) >= 3,
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
