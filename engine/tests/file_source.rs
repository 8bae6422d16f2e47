//! The file source ([`sluice_engine::FileSource`]) on real files, read in a pool
//! through a real SQLite store (the flow's turn and its file checkpoint):
//!
//! * a line over `max_record_bytes` is one `record_too_large` problem keyed `FILE:LINE`, the read
//!   goes on after it, the checkpoint at the file's end is its length and line count, and reads
//!   resumed from checkpoints just before and just after the line give the same keys as a read
//!   from the start;
//! * a matched path that is not UTF-8 is refused before anything is read: its checkpoint and
//!   its dead letters' `FILE:LINE` keys name it as text, and a lossy name would compare wrong
//!   against the real one (the rest of its file skipped) or stand for two files.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_engine::{Budget, FileSource, FileTurn, MessageSource, ReaderTurn, SourceMessage};
use sluice_store::{FeedStore, FileCheckpoint, FlowHandle, FlowStore, Layout, SqliteStore};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// A SQLite store with pipeline `p`'s flow `backfill` into `events`.
struct Pool {
    _dir: tempfile::TempDir,
    store: Arc<SqliteStore>,
    flow: FlowHandle,
}

async fn pool() -> Pool {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("s.db")).unwrap());
    let flows = store
        .prepare(&Layout {
            pipeline: "p".into(),
            tables: vec!["events".into()],
            typed: Vec::new(),
            flows: vec!["backfill".into()],
        })
        .await
        .unwrap();
    Pool {
        _dir: dir,
        store,
        flow: flows[0].clone(),
    }
}

impl Pool {
    fn turn(&self) -> FileTurn {
        FileTurn {
            turn: ReaderTurn {
                pool: self.store.clone(),
                holder: "w1".into(),
            },
            feed: self.store.clone(),
            flow: self.flow.clone(),
        }
    }
}

/// Every message `source` delivers (each acked), in order; `Err` if it refuses to start.
async fn read_all(source: FileSource) -> Result<Vec<SourceMessage>, String> {
    let (intake, mut received) = tokio::sync::mpsc::channel(1024);
    let handle = Box::new(source)
        .start(
            intake,
            Budget::new(1_000_000, 1 << 40),
            CancellationToken::new(),
        )
        .await
        .map_err(|e| e.to_string())?;
    let mut messages = Vec::new();
    while let Some(one) = received.recv().await {
        messages.push(one.message);
        one.handle.ack();
    }
    handle.close().await;
    Ok(messages)
}

/// The message ids `source` delivers, in order.
async fn read_ids(source: FileSource) -> Result<Vec<String>, String> {
    let messages = read_all(source).await?;
    Ok(messages.into_iter().map(|m| m.message_id).collect())
}

fn records(ids: std::ops::Range<usize>) -> String {
    ids.map(|i| format!("{{\"id\":\"r{i}\"}}\n")).collect()
}

#[tokio::test]
async fn a_line_over_max_record_bytes_is_a_dead_letter_and_positions_stay_exact() {
    let pool = pool().await;
    let files = tempfile::tempdir().unwrap();
    let path = files.path().join("a.jsonl");
    let long = format!("{{\"id\":\"big\",\"data\":\"{}\"}}", "x".repeat(10_000));
    let before = records(0..3);
    let after = format!("{}\n{}", records(3..5), records(5..6));
    std::fs::write(&path, format!("{before}{long}\n{after}")).unwrap();
    let file_len = std::fs::metadata(&path).unwrap().len();
    let text = path.display().to_string();
    let key = format!("{text}:4");
    let source = || {
        FileSource::new(text.clone())
            .max_record_bytes(100)
            .in_pool(pool.turn())
    };

    let messages = read_all(source()).await.unwrap();
    let ids: Vec<&str> = messages.iter().map(|m| m.message_id.as_str()).collect();
    assert_eq!(ids, ["r0", "r1", "r2", key.as_str(), "r3", "r4", "r5"]);
    let problem = messages[3].problem.as_ref().unwrap();
    assert_eq!(problem.reason, "record_too_large");
    assert_eq!(
        problem.error,
        format!(
            "{key}: a line of {} bytes at byte {}, over max_record_bytes 100; its first 100 \
             bytes are the dead letter's data",
            long.len(),
            before.len()
        )
    );
    assert_eq!(&messages[3].data[..], &long.as_bytes()[..100]);
    // Settled to the end: the file's length and its lines, the blank one included.
    let end = pool
        .store
        .file_checkpoint(&pool.flow)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        end,
        FileCheckpoint {
            path: text.clone(),
            offset: i64::try_from(file_len).unwrap(),
            line: 8,
        }
    );

    // Read on from just before the line, then from just after it.
    for (offset, line, expected) in [
        (before.len(), 3, vec![key.as_str(), "r3", "r4", "r5"]),
        (before.len() + long.len() + 1, 4, vec!["r3", "r4", "r5"]),
    ] {
        let at = FileCheckpoint {
            path: text.clone(),
            offset: i64::try_from(offset).unwrap(),
            line,
        };
        pool.store
            .save_file_checkpoint(&pool.flow, &at)
            .await
            .unwrap();
        let ids = read_ids(source()).await.unwrap();
        assert_eq!(ids, expected, "from {at:?}");
        let end = pool
            .store
            .file_checkpoint(&pool.flow)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (end.offset, end.line),
            (i64::try_from(file_len).unwrap(), 8)
        );
    }
}

#[tokio::test]
async fn a_path_that_is_not_utf8_is_refused_before_anything_is_read() {
    use std::os::unix::ffi::OsStrExt;
    let pool = pool().await;
    let files = tempfile::tempdir().unwrap();
    // `caf\xE9` (Latin-1 "café"): invalid UTF-8, and below the replacement character's first
    // byte (0xEF), so its lossy text sorts after it.
    let latin1 = files.path().join(std::ffi::OsStr::from_bytes(b"caf\xE9"));
    std::fs::create_dir(&latin1).unwrap();
    std::fs::write(latin1.join("a.jsonl"), records(0..3)).unwrap();
    std::fs::write(latin1.join("b.jsonl"), records(3..5)).unwrap();
    // A reader read `a.jsonl`'s first line and saved its checkpoint as text.
    let first_line = records(0..1).len();
    pool.store
        .save_file_checkpoint(
            &pool.flow,
            &FileCheckpoint {
                path: latin1.join("a.jsonl").to_string_lossy().into_owned(),
                offset: i64::try_from(first_line).unwrap(),
                line: 1,
            },
        )
        .await
        .unwrap();
    let pattern = format!("{}/**/*.jsonl", files.path().display());

    match read_ids(FileSource::new(pattern).in_pool(pool.turn())).await {
        Err(error) => {
            assert!(error.contains("not UTF-8"), "{error}");
            assert!(error.contains(r"caf\xE9"), "{error}");
        }
        Ok(ids) => panic!(
            "a path that is not UTF-8 was read on from its checkpoint: delivered {ids:?}, \
             where r1..r4 come after the checkpoint"
        ),
    }
}
