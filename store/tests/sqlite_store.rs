//! The store contract, on a real SQLite file.
#![allow(clippy::unwrap_used, missing_docs)]

use bytes::Bytes;
use sluice_dedup::DedupKey;
use sluice_store::{
    CommitBatch, Effect, Entry, FlowHandle, Layout, MessageFields, SqliteStore, Store, table_name,
};
use std::sync::Arc;

fn entry(key: &str, effect: Effect) -> Entry {
    Entry {
        key: DedupKey::new(key),
        message: MessageFields {
            message_id: format!("m-{key}"),
            publish_time_ms: 1_000,
            attributes_json: "{}".to_owned(),
            data: Bytes::from_static(b"payload"),
        },
        effect,
    }
}

fn row(key: &str) -> Entry {
    entry(key, Effect::Row { event_time_ms: 5 })
}

fn batch(flow: &FlowHandle, entries: Vec<Entry>, now_ms: i64) -> CommitBatch {
    CommitBatch {
        flow: flow.clone(),
        table: Arc::from(table_name("p", "events").unwrap()),
        entries,
        now_ms,
        expires_at_ms: now_ms + 600_000,
    }
}

async fn open() -> (tempfile::TempDir, SqliteStore, Vec<FlowHandle>) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("nested/state.db")).unwrap();
    let flows = store
        .prepare(&Layout {
            pipeline: "p".into(),
            tables: vec!["events".into()],
            flows: vec!["live".into(), "other".into()],
        })
        .await
        .unwrap();
    (dir, store, flows)
}

#[tokio::test]
async fn ledger_decides_duplicates_within_and_across_batches() {
    let (_dir, store, flows) = open().await;
    let out = store
        .commit(batch(&flows[0], vec![row("a"), row("b"), row("a")], 10))
        .await
        .unwrap();
    assert_eq!(out.written, vec![true, true, false]);
    let out = store
        .commit(batch(&flows[0], vec![row("b"), row("c")], 20))
        .await
        .unwrap();
    assert_eq!(out.written, vec![false, true]);
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 3);
    assert_eq!(store.key_census("p__events").await.unwrap(), (3, 0));
    let progress = store.flow_progress(&flows[0]).await.unwrap();
    assert_eq!(
        (progress.committed, progress.duplicates, progress.batches),
        (3, 2, 2)
    );
}

#[tokio::test]
async fn ledgers_are_per_flow() {
    let (_dir, store, flows) = open().await;
    store
        .commit(batch(&flows[0], vec![row("a")], 10))
        .await
        .unwrap();
    let out = store
        .commit(batch(&flows[1], vec![row("a")], 10))
        .await
        .unwrap();
    assert_eq!(out.written, vec![true]);
    assert_eq!(
        store.count_rows("p__events", Some("live")).await.unwrap(),
        1
    );
    assert_eq!(
        store.count_rows("p__events", Some("other")).await.unwrap(),
        1
    );
}

#[tokio::test]
async fn dead_letters_are_deduplicated_too() {
    let (dir, store, flows) = open().await;
    let dead = || {
        entry(
            "x",
            Effect::DeadLetter {
                reason: "bad_timestamp".into(),
                error: "nope".into(),
                attempts: 1,
            },
        )
    };
    assert_eq!(
        store
            .commit(batch(&flows[0], vec![dead()], 10))
            .await
            .unwrap()
            .written,
        vec![true]
    );
    assert_eq!(
        store
            .commit(batch(&flows[0], vec![dead()], 11))
            .await
            .unwrap()
            .written,
        vec![false]
    );
    assert_eq!(
        store.flow_progress(&flows[0]).await.unwrap().dead_lettered,
        1
    );
    drop(store);
    let conn = rusqlite::Connection::open(dir.path().join("nested/state.db")).unwrap();
    let reason: String = conn
        .query_row("SELECT reason FROM p__dead_letter", [], |r| r.get(0))
        .unwrap();
    assert_eq!(reason, "bad_timestamp");
}

#[tokio::test]
async fn expired_keys_are_taken_over_and_purged() {
    let (_dir, store, flows) = open().await;
    let mut first = batch(&flows[0], vec![row("a"), row("b")], 10);
    first.expires_at_ms = 100;
    store.commit(first).await.unwrap();
    // "a" expired at 100; at 200 it is new again, "b" purged below.
    let out = store
        .commit(batch(&flows[0], vec![row("a")], 200))
        .await
        .unwrap();
    assert_eq!(out.written, vec![true]);
    assert_eq!(store.purge_expired(200, 10).await.unwrap(), 1);
    let out = store
        .commit(batch(&flows[0], vec![row("b")], 300))
        .await
        .unwrap();
    assert_eq!(out.written, vec![true]);
}

#[tokio::test]
async fn state_survives_reopen() {
    let (dir, store, flows) = open().await;
    store
        .commit(batch(&flows[0], vec![row("a")], 10))
        .await
        .unwrap();
    drop(store);
    let store = SqliteStore::open(&dir.path().join("nested/state.db")).unwrap();
    let again = store
        .prepare(&Layout {
            pipeline: "p".into(),
            tables: vec!["events".into()],
            flows: vec!["live".into()],
        })
        .await
        .unwrap();
    assert_eq!(again[0].id, flows[0].id);
    let out = store
        .commit(batch(&again[0], vec![row("a")], 20))
        .await
        .unwrap();
    assert_eq!(out.written, vec![false]);
}

#[tokio::test]
async fn bad_identifiers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("s.db")).unwrap();
    let err = store
        .prepare(&Layout {
            pipeline: "p".into(),
            tables: vec!["x\"; drop".into()],
            flows: vec![],
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not a valid identifier"), "{err}");
}

#[tokio::test]
async fn large_batches_span_several_statements_and_stay_exact() {
    let (_dir, store, flows) = open().await;
    // 300 entries: k0..k249, then k0..k49 again (duplicates in later statements of the batch).
    let entries: Vec<_> = (0..250)
        .chain(0..50)
        .map(|i| row(&format!("k{i}")))
        .collect();
    let out = store.commit(batch(&flows[0], entries, 10)).await.unwrap();
    assert_eq!(out.written.iter().filter(|w| **w).count(), 250);
    assert!(out.written[..250].iter().all(|w| *w));
    assert!(out.written[250..].iter().all(|w| !*w));
    assert_eq!(store.key_census("p__events").await.unwrap(), (250, 0));
}
