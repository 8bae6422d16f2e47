//! `JsonlSink` against a real SQLite store: a file per committed batch holding only the records
//! the ledger let through, and the recovery of what a crash leaves behind (a temporary file of
//! a committed batch is published, one of a batch that never committed is deleted, one whose
//! writer still holds it is left alone).
#![allow(clippy::unwrap_used, missing_docs)]

use bytes::Bytes;
use sluice_dedup::DedupKey;
use sluice_engine::JsonlSink;
use sluice_store::{CommitBatch, CommitHook, Effect, Entry, Layout, MessageFields, SqliteStore};
use sluice_store::{FlowStore, LedgerStore};
use std::sync::Arc;

fn entry(key: &str, effect: Effect) -> Entry {
    Entry {
        key: DedupKey::new(key),
        message: MessageFields {
            message_id: format!("m-{key}"),
            publish_time_ms: 1_000,
            attributes_json: r#"{"k":"v"}"#.to_owned(),
            data: Bytes::from(key.as_bytes().to_vec()),
        },
        effect,
    }
}

fn row(key: &str) -> Entry {
    entry(key, Effect::row(7))
}

fn lines(files: &[std::path::PathBuf]) -> Vec<serde_json::Value> {
    files
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test]
async fn committed_batches_become_files_and_crash_leftovers_are_resolved() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("state.db")).unwrap();
    let flows = store
        .prepare(&Layout {
            pipeline: "p".into(),
            tables: vec!["out".into()],
            typed: Vec::new(),
            flows: vec!["live".into()],
        })
        .await
        .unwrap();
    let flow = &flows[0];
    let sink = JsonlSink::new(&dir.path().join("sink/events.jsonl"), "live");
    let commit = |entries: Vec<Entry>, hook: Arc<dyn CommitHook>| CommitBatch {
        flow: flow.clone(),
        table: Arc::from("p__out"),
        entries,
        now_ms: 5_000,
        expires_at_ms: 600_000_000_000_000,
        hook: Some(hook),
        watermark_progress: false,
        commit_by_ms: None,
        position: None,
        position_gate: None,
        work: None,
        publish_dead_letters: false,
        verdicts: Vec::new(),
        memory_duplicates: 0,
        typed: None,
    };

    // A normal batch: committed, then published.
    let entries = vec![
        row("a"),
        row("b"),
        entry(
            "bad",
            Effect::DeadLetter {
                reason: "bad_timestamp".into(),
                error: "x".into(),
                attempts: 1,
            },
        ),
    ];
    let first = Arc::new(sink.commit(&entries, 5_000));
    store.commit(commit(entries, first.clone())).await.unwrap();
    first.publish().unwrap();

    // A batch with a key the ledger already has: only the new record is in its file. It
    // commits, then the worker "crashes" before publishing: its temporary file stays.
    let entries = vec![row("a"), row("c")];
    let second = Arc::new(sink.commit(&entries, 5_001));
    let outcome = store.commit(commit(entries, second.clone())).await.unwrap();
    assert_eq!(outcome.written, [false, true]);

    // A batch whose transaction never committed: its hook wrote the file, nothing recorded.
    let entries = vec![row("d")];
    let never = sink.commit(&entries, 5_002);
    never.before_commit(&[true]).unwrap();

    let published_before = sink.files().unwrap();
    assert_eq!(published_before.len(), 1, "{published_before:?}");
    // While their writers hold them (commits under way), a recovery leaves them alone.
    assert_eq!(sink.recover(&store, flow).await.unwrap(), (0, 0));
    // The writers die: their locks go with them.
    second.release();
    never.release();
    let (published, deleted) = sink.recover(&store, flow).await.unwrap();
    assert_eq!((published, deleted), (1, 1));
    let files = sink.files().unwrap();
    assert_eq!(files.len(), 2);
    let records = lines(&files);
    let ids: Vec<&str> = records.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        ["a", "b", "c"],
        "each committed record once, dead letters in no file"
    );
    assert_eq!(records[0]["data"], "YQ==");
    assert_eq!(records[0]["event_time"], 7);
    assert_eq!(records[0]["attributes"]["k"], "v");
    let hidden: Vec<_> = std::fs::read_dir(sink.dir())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(hidden.is_empty(), "leftovers: {hidden:?}");

    // The writer that crashed never returns, but if it did, publishing again is harmless.
    second.publish().unwrap();
    assert_eq!(lines(&sink.files().unwrap()).len(), 3);
    // A reset removes the flow's files.
    assert_eq!(sink.clear().unwrap(), 2);
    assert!(sink.files().unwrap().is_empty());
}
