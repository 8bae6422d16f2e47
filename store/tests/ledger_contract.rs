//! The ledger role (`LedgerStore`): duplicates decided within and across batches, per flow, for
//! dead letters too, expiry and takeover, reopen, identifiers, large and concurrent batches,
//! commit deadlines, and which keys a reset keeps.
//! Each test runs on both backends (`contract/mod.rs`).
#![allow(clippy::unwrap_used, missing_docs)]

#[macro_use]
mod contract;
use contract::*;

/// A row published at `publish_ms`.
fn row_published(key: &str, publish_ms: i64) -> Entry {
    let mut entry = row(key);
    entry.message.publish_time_ms = publish_ms;
    entry.message.message_id = format!("m-{key}-{publish_ms}");
    entry
}

/// The ledger keeps every key whose row is kept: a reset without a seek keeps all rows, so a
/// committed-but-unacked message redelivered after it is still a duplicate; a reset since T
/// forgets only the keys of the rows it deletes, so a publisher's copy published after T of a
/// key whose original (before T) is kept is still a duplicate, while the replayed messages
/// (published after T) land again, once.
async fn a_reset_keeps_the_ledger_keys_of_the_rows_it_keeps(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    store
        .commit(batch(
            &flows[0],
            vec![
                row_published("old", 1_000),
                row_published("new", 5_000),
                dead("bad"),
            ],
        ))
        .await
        .unwrap();
    store
        .reset_flow(&flows[0], Some("p__events"), ResetRows::Keep, None)
        .await
        .unwrap();
    let flows = store.prepare(&layout(&["live", "other"])).await.unwrap();
    let out = store
        .commit(batch(
            &flows[0],
            vec![
                row_published("old", 1_000),
                row_published("new", 5_000),
                dead("bad"),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(
        out.written,
        [false, false, false],
        "nothing was deleted: all kept keys"
    );
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 2);

    store
        .reset_flow(
            &flows[0],
            Some("p__events"),
            ResetRows::PublishedSince {
                since_ms: 3_000,
                hold_watermark: false,
            },
            None,
        )
        .await
        .unwrap();
    let flows = store.prepare(&layout(&["live", "other"])).await.unwrap();
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 1);
    let out = store
        .commit(batch(
            &flows[0],
            vec![
                // A publisher's copy of `old`, published after the seek point.
                row_published("old", 6_000),
                // The replay of `new`, whose row the reset deleted.
                row_published("new", 5_000),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(out.written, [false, true]);
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 2);
    assert_eq!(store.key_census("p__events").await.unwrap(), (2, 0));
}

/// A batch that reaches the store after its `commit_by_ms` is refused as `Stale` inside the
/// transaction and leaves nothing behind (no key, no row, no counter); one within it commits.
async fn a_batch_past_its_commit_deadline_writes_nothing(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    let late = CommitBatch {
        commit_by_ms: Some(now_ms() - 1_000),
        position: None,
        position_gate: None,
        work: None,
        publish_dead_letters: false,
        verdicts: Vec::new(),
        memory_duplicates: 0,
        typed: None,
        ..batch(&flows[0], vec![row("a"), dead("b")])
    };
    let refused = store.commit(late).await;
    assert!(matches!(refused, Err(StoreError::Stale)), "{refused:?}");
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 0);
    assert_eq!(store.flow_progress(&flows[0]).await.unwrap().batches, 0);
    let in_time = CommitBatch {
        commit_by_ms: Some(now_ms() + 60_000),
        position: None,
        position_gate: None,
        work: None,
        publish_dead_letters: false,
        verdicts: Vec::new(),
        memory_duplicates: 0,
        typed: None,
        ..batch(&flows[0], vec![row("a"), dead("b")])
    };
    let out = store.commit(in_time).await.unwrap();
    assert_eq!(
        out.written,
        vec![true, true],
        "the refused batch claimed no key"
    );
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 1);
}

async fn ledger_decides_duplicates_within_and_across_batches(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    let out = store
        .commit(batch(&flows[0], vec![row("a"), row("b"), row("a")]))
        .await
        .unwrap();
    assert_eq!(out.written, vec![true, true, false]);
    let out = store
        .commit(batch(&flows[0], vec![row("b"), row("c")]))
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

async fn ledgers_are_per_flow(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    store
        .commit(batch(&flows[0], vec![row("a")]))
        .await
        .unwrap();
    let out = store
        .commit(batch(&flows[1], vec![row("a")]))
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

async fn dead_letters_are_deduplicated_too(postgres: bool) {
    let (place, store, flows) = open(postgres).await;
    let out = store
        .commit(batch(&flows[0], vec![dead("x")]))
        .await
        .unwrap();
    assert_eq!(out.written, vec![true]);
    let out = store
        .commit(batch(&flows[0], vec![dead("x"), row("x")]))
        .await
        .unwrap();
    assert_eq!(out.written, vec![false, false]);
    let progress = store.flow_progress(&flows[0]).await.unwrap();
    assert_eq!((progress.dead_lettered, progress.committed), (1, 0));
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 0);
    assert_eq!(place.dead_letter_reasons().await, vec!["bad_timestamp"]);
}

async fn expired_keys_are_taken_over(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    let out = store
        .commit(batch_with_window(&flows[0], vec![row("a"), row("b")], 400))
        .await
        .unwrap();
    assert_eq!(out.written, vec![true, true]);
    // Inside the window: duplicates.
    let out = store
        .commit(batch_with_window(&flows[0], vec![row("a")], 400))
        .await
        .unwrap();
    assert_eq!(out.written, vec![false]);
    tokio::time::sleep(Duration::from_millis(600)).await;
    // The window has passed: "a" is new again; upkeep then leaves "b" new as well.
    let out = store
        .commit(batch_with_window(&flows[0], vec![row("a")], 400))
        .await
        .unwrap();
    assert_eq!(out.written, vec![true]);
    store.ledger_upkeep().await.unwrap();
    let out = store
        .commit(batch_with_window(&flows[0], vec![row("b")], 400))
        .await
        .unwrap();
    assert_eq!(out.written, vec![true]);
}

async fn state_survives_reopen(postgres: bool) {
    let (place, store, flows) = open(postgres).await;
    store
        .commit(batch(&flows[0], vec![row("a")]))
        .await
        .unwrap();
    drop(store);
    let store = place.open();
    let again = store.prepare(&layout(&["live"])).await.unwrap();
    assert_eq!(again[0].id, flows[0].id);
    let out = store
        .commit(batch(&again[0], vec![row("a")]))
        .await
        .unwrap();
    assert_eq!(out.written, vec![false]);
}

async fn bad_identifiers_are_refused(postgres: bool) {
    let place = Place::new(postgres).await;
    let err = place
        .open()
        .prepare(&Layout {
            pipeline: "p".into(),
            tables: vec!["x\"; drop".into()],
            typed: Vec::new(),
            flows: vec![],
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not a valid identifier"), "{err}");
}

async fn large_batches_stay_exact(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    // 300 entries: k0..k249, then k0..k49 again (duplicates later in the same batch).
    let entries: Vec<_> = (0..250)
        .chain(0..50)
        .map(|i| row(&format!("k{i}")))
        .collect();
    let out = store.commit(batch(&flows[0], entries)).await.unwrap();
    assert_eq!(out.written.iter().filter(|w| **w).count(), 250);
    assert!(out.written[..250].iter().all(|w| *w));
    assert!(out.written[250..].iter().all(|w| !*w));
    assert_eq!(store.key_census("p__events").await.unwrap(), (250, 0));
    let progress = store.flow_progress(&flows[0]).await.unwrap();
    assert_eq!((progress.committed, progress.duplicates), (250, 50));
}

/// Eight committers (separate store handles, as separate replicas would have) race on
/// overlapping keys: each key is written exactly once.
async fn concurrent_commits_of_one_key_write_it_once(postgres: bool) {
    let (place, first, flows) = open(postgres).await;
    let mut tasks = Vec::new();
    for committer in 0..8u64 {
        let store = if committer == 0 {
            first.clone()
        } else {
            place.open()
        };
        let flow = flows[0].clone();
        tasks.push(tokio::spawn(async move {
            let mut written = 0;
            for round in 0..10u64 {
                // Keys overlap heavily between committers and rounds.
                let entries = (0..50)
                    .map(|i| row(&format!("k{}", (i * 7 + round * 13 + committer * 29) % 200)))
                    .collect();
                let out = store.commit(batch(&flow, entries)).await.unwrap();
                written += out.written.iter().filter(|w| **w).count();
            }
            written
        }));
    }
    let mut written = 0;
    for task in tasks {
        written += task.await.unwrap();
    }
    let (distinct, repeated) = first.key_census("p__events").await.unwrap();
    assert_eq!(repeated, 0);
    assert_eq!(written as u64, distinct);
    assert_eq!(first.count_rows("p__events", None).await.unwrap(), distinct);
}

/// The duplicates a flow's progress counts are both tiers': those the ledger finds, plus those
/// the caller's memory tier dropped, given with a batch or alone (a commit without entries, at
/// the end of a flow), which writes nothing else.
async fn memory_tier_duplicates_are_counted_with_the_ledgers(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    let mut first = batch(&flows[0], vec![row("a"), row("b")]);
    first.memory_duplicates = 3;
    store.commit(first).await.unwrap();
    store
        .commit(batch(&flows[0], vec![row("a"), row("c")]))
        .await
        .unwrap();
    let mut alone = batch(&flows[0], Vec::new());
    alone.memory_duplicates = 4;
    store.commit(alone).await.unwrap();
    let progress = store.flow_progress(&flows[0]).await.unwrap();
    assert_eq!(
        (
            progress.committed,
            progress.duplicates,
            progress.dead_lettered
        ),
        (3, 1 + 3 + 4, 0)
    );
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 3);
}

on_both_backends!(
    memory_tier_duplicates_are_counted_with_the_ledgers,
    a_reset_keeps_the_ledger_keys_of_the_rows_it_keeps,
    a_batch_past_its_commit_deadline_writes_nothing,
    ledger_decides_duplicates_within_and_across_batches,
    ledgers_are_per_flow,
    dead_letters_are_deduplicated_too,
    expired_keys_are_taken_over,
    state_survives_reopen,
    bad_identifiers_are_refused,
    large_batches_stay_exact,
    concurrent_commits_of_one_key_write_it_once,
);
