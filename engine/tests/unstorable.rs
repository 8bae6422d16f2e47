//! Messages holding what the store cannot hold (U+0000 in a key, a record id or an attribute:
//! PostgreSQL's `text` and `jsonb` refuse it) become dead letters with a readable reason, and
//! the rest of the flow commits: never a stall.
//!
//! Real parts: PostgreSQL on 127.0.0.1:5432 (a fresh database), a JSONL file, and the
//! in-process source for Pub/Sub-shaped messages (attributes are what the emulator would give).
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_engine::{
    BatchSettings, Budget, CommitThenAck, Counters, DedupSettings, FileSource, FlowRun,
    InProcessSource, KeySource, RetrySettings, RunUntil, SkipCommitted, SourceMessage, TableStage,
};
use sluice_store::{FlowHandle, Layout, PostgresStore, ScratchDatabase, Store, table_name};
use sluice_store::{FlowStore, Inspect};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Longer than any of these runs takes when nothing stalls.
const RUN_LIMIT: Duration = Duration::from_secs(60);

async fn prepared(store: &PostgresStore, flow: &str) -> FlowHandle {
    store
        .prepare(&Layout {
            pipeline: "p".into(),
            tables: vec!["events".into()],
            typed: Vec::new(),
            flows: vec![flow.into()],
        })
        .await
        .unwrap()
        .remove(0)
}

fn run_of(
    store: Arc<dyn Store>,
    flow: FlowHandle,
    source: Box<dyn sluice_engine::MessageSource>,
    key: KeySource,
    until: RunUntil,
) -> FlowRun {
    let counters = Counters::new("p", &flow.name);
    FlowRun {
        source,
        budget: Budget::new(1_000, 1 << 20),
        dedup: DedupSettings {
            key,
            window: Duration::from_secs(600),
        },
        batch: BatchSettings {
            max_messages: 100,
            max_delay: Duration::from_millis(5),
        },
        committer: CommitThenAck::new(
            store,
            flow,
            Arc::from(table_name("p", "events").unwrap()),
            Arc::new(TableStage::default()),
            RetrySettings {
                max_attempts: 2,
                dedup_window: Duration::from_secs(600),
                commit_bound: None,
                give_up_after: None,
            },
            CancellationToken::new(),
        ),
        counters,
        until,
        drain_agreement: None,
    }
}

async fn reasons(db: &ScratchDatabase, flow: &str) -> Vec<(String, String, String)> {
    let (client, connection) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .query(
            "SELECT dedup_key, reason, attributes::text FROM p__dead_letter WHERE flow = $1
             ORDER BY dedup_key",
            &[&flow],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

#[tokio::test]
async fn a_file_backfill_with_a_nul_id_dead_letters_it_and_commits_the_rest() {
    let db = ScratchDatabase::create().await.unwrap();
    let store = Arc::new(PostgresStore::open(db.url()).unwrap());
    let flow = prepared(&store, "backfill").await;
    let dir = tempfile::tempdir().unwrap();
    let mut lines: Vec<String> = (0..200)
        .map(|i| format!(r#"{{"id":"r{i}","data":{{"n":{i}}}}}"#))
        .collect();
    lines.insert(100, r#"{"id":"bad\u0000id","data":{}}"#.to_owned());
    std::fs::write(dir.path().join("h.jsonl"), lines.join("\n") + "\n").unwrap();
    let skip = SkipCommitted {
        store: store.clone(),
        flow: flow.clone(),
        table: Arc::from(table_name("p", "events").unwrap()),
    };
    let source = FileSource::new(format!("{}/*.jsonl", dir.path().display())).skip_committed(skip);
    let run = run_of(
        store.clone(),
        flow,
        Box::new(source),
        KeySource::MessageId,
        RunUntil::Exhausted,
    );
    let end = tokio::time::timeout(RUN_LIMIT, run.run(CancellationToken::new())).await;
    assert!(end.is_ok(), "the backfill stalled");
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 200);
    let dead = reasons(&db, "backfill").await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].0, r"bad\u0000id", "the key is stored escaped");
    assert_eq!(dead[0].1, "unstorable");
}

#[tokio::test]
async fn nul_in_a_dedup_attribute_or_any_attribute_is_a_dead_letter_not_a_stall() {
    let db = ScratchDatabase::create().await.unwrap();
    let store = Arc::new(PostgresStore::open(db.url()).unwrap());
    let flow = prepared(&store, "live").await;
    let message = |id: &str, attributes: &[(&str, &str)]| SourceMessage {
        message_id: id.to_owned(),
        publish_time_ms: 1_000,
        attributes: attributes
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
        data: bytes::Bytes::from_static(b"{}"),
        event_time_ms: None,
        problem: None,
    };
    let mut messages: Vec<SourceMessage> = (0..50)
        .map(|i| message(&format!("m{i}"), &[("event_id", &format!("e{i}"))]))
        .collect();
    messages.push(message("nul-key", &[("event_id", "e\0x")]));
    messages.push(message(
        "nul-attribute",
        &[("event_id", "e99"), ("note", "a\0b")],
    ));
    let run = run_of(
        store.clone(),
        flow,
        Box::new(InProcessSource::new(messages)),
        KeySource::Attribute {
            name: "event_id".into(),
            dead_letter_if_missing: false,
        },
        RunUntil::Idle(Duration::from_secs(2)),
    );
    let end = tokio::time::timeout(RUN_LIMIT, run.run(CancellationToken::new())).await;
    assert!(end.is_ok(), "the flow stalled");
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 50);
    let dead = reasons(&db, "live").await;
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert!(
        dead.iter().all(|(_, reason, _)| reason == "unstorable"),
        "{dead:?}"
    );
    assert_eq!(dead[0].0, r"e99");
    assert!(dead[0].2.contains(r"a\\u0000b"), "escaped: {}", dead[0].2);
    assert_eq!(dead[1].0, r"e\u0000x");
}

/// A record id longer than PostgreSQL indexes (about 2.7 KB, SQLSTATE 54000 on the ledger's
/// key) is a dead letter under the key's digest, and a re-read finds it there: the backfill
/// completes, nothing retried for ever. (Before the fix the whole batch was retried for ever
/// as "store unavailable".)
#[tokio::test]
async fn a_file_backfill_with_an_id_too_long_to_index_dead_letters_it_and_commits_the_rest() {
    let db = ScratchDatabase::create().await.unwrap();
    let store = Arc::new(PostgresStore::open(db.url()).unwrap());
    let flow = prepared(&store, "backfill").await;
    let dir = tempfile::tempdir().unwrap();
    let long_id: String = (0..4_000)
        .map(|_| {
            let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            char::from(alphabet[rand::random_range(0..alphabet.len())])
        })
        .collect();
    let mut lines: Vec<String> = (0..200)
        .map(|i| format!(r#"{{"id":"r{i}","data":{{"n":{i}}}}}"#))
        .collect();
    lines.insert(100, format!(r#"{{"id":"{long_id}","data":{{}}}}"#));
    std::fs::write(dir.path().join("h.jsonl"), lines.join("\n") + "\n").unwrap();
    for pass in 0..2 {
        let skip = SkipCommitted {
            store: store.clone(),
            flow: flow.clone(),
            table: Arc::from(table_name("p", "events").unwrap()),
        };
        let source =
            FileSource::new(format!("{}/*.jsonl", dir.path().display())).skip_committed(skip);
        let run = run_of(
            store.clone(),
            flow.clone(),
            Box::new(source),
            KeySource::MessageId,
            RunUntil::Exhausted,
        );
        let end = tokio::time::timeout(RUN_LIMIT, run.run(CancellationToken::new())).await;
        assert!(end.is_ok(), "pass {pass}: the backfill stalled");
        assert_eq!(store.count_rows("p__events", None).await.unwrap(), 200);
        let dead = reasons(&db, "backfill").await;
        assert_eq!(
            dead.len(),
            1,
            "pass {pass}: one dead letter, found again: {dead:?}"
        );
        assert!(dead[0].0.starts_with("sluice-key-digest:"), "{}", dead[0].0);
        assert_eq!(dead[0].1, "unstorable");
    }
}

/// A value the store refuses where a check before the commit could not know it (an event
/// time past PostgreSQL's timestamps, SQLSTATE 22008) makes its batch split, its record a
/// dead letter after its attempts, and the rest commit.
#[tokio::test]
async fn a_value_the_store_refuses_is_a_dead_letter_not_a_stall() {
    let db = ScratchDatabase::create().await.unwrap();
    let store = Arc::new(PostgresStore::open(db.url()).unwrap());
    let flow = prepared(&store, "backfill").await;
    let dir = tempfile::tempdir().unwrap();
    let mut lines: Vec<String> = (0..50)
        .map(|i| format!(r#"{{"id":"r{i}","data":{{"n":{i}}},"event_time":1700000000000}}"#))
        .collect();
    // Year 318 857: a valid number of ms, beyond PostgreSQL's timestamp range.
    lines.insert(
        25,
        r#"{"id":"far","data":{},"event_time":10000000000000000}"#.to_owned(),
    );
    std::fs::write(dir.path().join("h.jsonl"), lines.join("\n") + "\n").unwrap();
    let source = FileSource::new(format!("{}/*.jsonl", dir.path().display()));
    let run = run_of(
        store.clone(),
        flow,
        Box::new(source),
        KeySource::MessageId,
        RunUntil::Exhausted,
    );
    let end = tokio::time::timeout(RUN_LIMIT, run.run(CancellationToken::new())).await;
    assert!(end.is_ok(), "the backfill stalled");
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 50);
    let dead = reasons(&db, "backfill").await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].0, "far");
}
