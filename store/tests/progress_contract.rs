//! The watermark-progress role (`ProgressStore`): message reports per bucket, settled in the
//! commit's transaction, the fenced and forward-only watermark record, and what a reset forgets.
//! Each test runs on both backends (`contract/mod.rs`).
#![allow(clippy::unwrap_used, missing_docs)]

#[macro_use]
mod contract;
use contract::*;

fn bucket(bucket_ms: i64, tracked: u64, processed: u64, min_event_ms: Option<i64>) -> BucketCounts {
    BucketCounts {
        bucket_ms,
        tracked,
        processed,
        min_event_ms,
    }
}

/// The tracking reader's report of message `id`, published in bucket `bucket_ms`.
fn tracked(bucket_ms: i64, id: &str, event_ms: Option<i64>) -> BucketMessage {
    BucketMessage {
        bucket_ms,
        message_id: id.into(),
        report: MessageReport::Tracked { event_ms },
    }
}

/// A worker's report that it settled message `id`, published in bucket `bucket_ms`.
fn settled(bucket_ms: i64, id: &str) -> BucketMessage {
    BucketMessage {
        bucket_ms,
        message_id: id.into(),
        report: MessageReport::Settled,
    }
}

fn mark(watermark_ms: i64, horizon_ms: i64, updated_at_ms: i64) -> WatermarkRecord {
    WatermarkRecord {
        watermark_ms,
        horizon_ms,
        updated_at_ms,
    }
}

/// Reports from the tracking reader and from workers (other handles) combine per message id:
/// a bucket counts its distinct tracked messages and those of them settled, whatever the
/// order of the reports; a redelivery reported again, tracked or settled, counts once; a
/// settled message not tracked (yet) counts nowhere; the smallest event time is over tracked
/// messages. Pruning forgets buckets before a time, for one flow only.
async fn bucket_counts_count_each_message_once(postgres: bool) {
    let (place, tracker, flows) = open(postgres).await;
    let worker = place.open();
    let (live, other) = (&flows[0], &flows[1]);
    assert!(
        tracker
            .bucket_counts(live, i64::MIN)
            .await
            .unwrap()
            .is_empty()
    );
    tracker.add_bucket_messages(live, &[]).await.unwrap();

    // Settled before it is tracked, out of bucket order, one report twice in a call.
    worker
        .add_bucket_messages(
            live,
            &[
                settled(1_000, "b1"),
                settled(0, "a1"),
                settled(3_000, "d1"),
                settled(1_000, "b1"),
            ],
        )
        .await
        .unwrap();
    tracker
        .add_bucket_messages(
            live,
            &[
                tracked(2_000, "c1", Some(2_100)),
                tracked(0, "a1", Some(50)),
                tracked(0, "a2", Some(60)),
                tracked(1_000, "b1", Some(1_500)),
                tracked(1_000, "b2", None),
            ],
        )
        .await
        .unwrap();
    // A redelivery of a1 is settled again by another worker: it still counts once; b2 is
    // settled; the tracking reader is redelivered a2 and b1.
    place
        .open()
        .add_bucket_messages(live, &[settled(0, "a1"), settled(1_000, "b2")])
        .await
        .unwrap();
    tracker
        .add_bucket_messages(
            live,
            &[
                tracked(0, "a2", Some(60)),
                tracked(1_000, "b1", Some(1_500)),
            ],
        )
        .await
        .unwrap();
    tracker
        .add_bucket_messages(other, &[tracked(0, "a1", Some(1)), settled(0, "a1")])
        .await
        .unwrap();

    let all = vec![
        bucket(0, 2, 1, Some(50)),
        bucket(1_000, 2, 2, Some(1_500)),
        bucket(2_000, 1, 0, Some(2_100)),
    ];
    assert_eq!(worker.bucket_counts(live, i64::MIN).await.unwrap(), all);
    assert_eq!(tracker.bucket_counts(live, 0).await.unwrap(), all);
    assert_eq!(
        tracker.bucket_counts(live, 1_000).await.unwrap(),
        all[1..].to_vec()
    );
    assert_eq!(
        tracker.bucket_counts(live, 1_001).await.unwrap(),
        all[2..].to_vec()
    );
    assert!(tracker.bucket_counts(live, 2_001).await.unwrap().is_empty());
    // d1 is tracked at last: bucket 3 000 holds one message, settled.
    tracker
        .add_bucket_messages(live, &[tracked(3_000, "d1", Some(3_300))])
        .await
        .unwrap();
    assert_eq!(
        tracker.bucket_counts(live, 3_000).await.unwrap(),
        [bucket(3_000, 1, 1, Some(3_300))]
    );

    // Buckets 0 and 1 000: a1, a2, b1, b2 (each reported by both sides, one row each).
    assert_eq!(worker.prune_buckets(live, 2_000).await.unwrap(), 4);
    assert_eq!(worker.prune_buckets(live, 2_000).await.unwrap(), 0);
    assert_eq!(
        tracker.bucket_counts(live, i64::MIN).await.unwrap(),
        [
            bucket(2_000, 1, 0, Some(2_100)),
            bucket(3_000, 1, 1, Some(3_300))
        ]
    );
    // The other flow's bucket 0 is its own, and stays.
    assert_eq!(
        tracker.bucket_counts(other, i64::MIN).await.unwrap(),
        [bucket(0, 1, 1, Some(1))]
    );
}

/// A commit of a flow with a watermark records, in its own transaction, every entry's message
/// as settled in its publish-time bucket: rows, dead letters, a second message with a key
/// already in the batch, and duplicates of earlier commits alike (a redelivery committed again
/// counts once); a flow without one records nothing.
async fn a_commit_records_its_messages_settled(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    let (live, other) = (&flows[0], &flows[1]);
    let watermarked = |flow: &FlowHandle, entries| CommitBatch {
        watermark_progress: true,
        commit_by_ms: None,
        position: None,
        position_gate: None,
        work: None,
        publish_dead_letters: false,
        verdicts: Vec::new(),
        memory_duplicates: 0,
        typed: None,
        ..batch(flow, entries)
    };
    let mut late = row("c");
    late.message.publish_time_ms = 2_500;
    let mut repeat = row("a");
    repeat.message.message_id = "m-x".into();
    store
        .add_bucket_messages(
            live,
            &[
                tracked(1_000, "m-a", Some(5)),
                tracked(1_000, "m-b", None),
                tracked(1_000, "m-x", Some(5)),
                tracked(1_000, "m-y", Some(5)),
                tracked(2_000, "m-c", Some(5)),
            ],
        )
        .await
        .unwrap();
    store
        .commit(watermarked(live, vec![row("a"), dead("b"), repeat, late]))
        .await
        .unwrap();
    // A redelivery of a, committed again: a duplicate, settled again, still counted once.
    store
        .commit(watermarked(live, vec![row("a")]))
        .await
        .unwrap();
    assert_eq!(
        store.bucket_counts(live, i64::MIN).await.unwrap(),
        [bucket(1_000, 4, 3, Some(5)), bucket(2_000, 1, 1, Some(5))],
        "m-y is still in flight"
    );
    // Without a watermark, nothing is recorded.
    store
        .add_bucket_messages(other, &[tracked(1_000, "m-a", Some(5))])
        .await
        .unwrap();
    store.commit(batch(other, vec![row("a")])).await.unwrap();
    assert_eq!(
        store.bucket_counts(other, i64::MIN).await.unwrap(),
        [bucket(1_000, 1, 0, Some(5))]
    );
}

/// A fenced offer is taken only from the holder of the flow's `watermark/<flow>` lease, while
/// it holds it: never from another worker, nor after the holder released it, nor from a
/// holder of another flow's lease; an unfenced offer is always taken.
async fn a_fenced_watermark_needs_the_readers_lease(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    let (live, other) = (&flows[0], &flows[1]);
    let lease = |role: &str, holder: &str| LeaseRequest {
        pipeline: "p".into(),
        role: role.into(),
        holder: holder.into(),
        ttl: Duration::from_secs(30),
    };
    assert_eq!(
        store
            .advance_watermark(live, &mark(100, 100, 1), Some("w1"))
            .await
            .unwrap(),
        None,
        "nobody holds the lease"
    );
    assert!(matches!(
        store
            .acquire_lease(&lease("watermark/live", "w1"))
            .await
            .unwrap(),
        LeaseGrant::Held { .. }
    ));
    assert!(matches!(
        store
            .acquire_lease(&lease("watermark/other", "w2"))
            .await
            .unwrap(),
        LeaseGrant::Held { .. }
    ));
    assert_eq!(
        store
            .advance_watermark(live, &mark(100, 100, 1), Some("w2"))
            .await
            .unwrap(),
        None,
        "w2 holds another flow's lease"
    );
    assert_eq!(
        store
            .advance_watermark(live, &mark(100, 100, 1), Some("w1"))
            .await
            .unwrap(),
        Some(mark(100, 100, 1))
    );
    store
        .release_lease("p", "watermark/live", "w1")
        .await
        .unwrap();
    assert_eq!(
        store
            .advance_watermark(live, &mark(200, 200, 2), Some("w1"))
            .await
            .unwrap(),
        None,
        "released"
    );
    assert_eq!(
        store
            .advance_watermark(other, &mark(300, 300, 3), Some("w2"))
            .await
            .unwrap(),
        Some(mark(300, 300, 3))
    );
    assert_eq!(
        store
            .advance_watermark(live, &mark(200, 200, 2), None)
            .await
            .unwrap(),
        Some(mark(200, 200, 2))
    );
    let stored = store.watermarks("p").await.unwrap();
    assert_eq!(
        stored,
        [
            ("live".to_owned(), mark(200, 200, 2)),
            ("other".to_owned(), mark(300, 300, 3))
        ]
    );
}

/// A watermark record only moves forward, field by field; what `advance_watermark` returns is
/// what any handle then reads; `watermarks` lists the pipeline's flows that have a record, by
/// name, and no other pipeline's.
async fn watermarks_never_move_back(postgres: bool) {
    let (place, store, _) = open(postgres).await;
    let flows = store
        .prepare(&layout(&["live", "other", "beta", "alpha"]))
        .await
        .unwrap();
    let (live, beta, alpha) = (&flows[0], &flows[2], &flows[3]);
    let elsewhere = store
        .prepare(&Layout {
            pipeline: "q".into(),
            tables: vec![],
            typed: Vec::new(),
            flows: vec!["live".into()],
        })
        .await
        .unwrap();
    assert!(store.watermarks("p").await.unwrap().is_empty());

    assert_eq!(
        store
            .advance_watermark(live, &mark(100, 200, 10), None)
            .await
            .unwrap(),
        Some(mark(100, 200, 10))
    );
    // An older view cannot move the watermark back, but its larger horizon counts.
    let stored = store
        .advance_watermark(live, &mark(50, 300, 5), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored, mark(100, 300, 10));
    let again = place.open();
    assert_eq!(
        again
            .advance_watermark(live, &mark(100, 300, 10), None)
            .await
            .unwrap(),
        Some(stored)
    );
    assert_eq!(
        again.watermarks("p").await.unwrap(),
        [("live".to_owned(), stored)]
    );

    store
        .advance_watermark(beta, &mark(7, 8, 9), None)
        .await
        .unwrap();
    store
        .advance_watermark(alpha, &mark(1, 2, 3), None)
        .await
        .unwrap();
    store
        .advance_watermark(&elsewhere[0], &mark(5, 5, 5), None)
        .await
        .unwrap();
    let moved = store
        .advance_watermark(live, &mark(150, 250, 20), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(moved, mark(150, 300, 20));
    assert_eq!(
        again.watermarks("p").await.unwrap(),
        [
            ("alpha".to_owned(), mark(1, 2, 3)),
            ("beta".to_owned(), mark(7, 8, 9)),
            ("live".to_owned(), moved),
        ],
        "flows with a record, by name; `other` has none"
    );
    assert_eq!(
        again.watermarks("q").await.unwrap(),
        [("live".to_owned(), mark(5, 5, 5))]
    );
    assert!(again.watermarks("none").await.unwrap().is_empty());
}

/// `reset_flow` forgets the flow's buckets and watermark, so it starts from nothing (a smaller
/// watermark is stored as offered); the other flow's stay.
async fn reset_forgets_buckets_and_watermark(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    let (stale, other) = (&flows[0], &flows[1]);
    for flow in [stale, other] {
        store
            .add_bucket_messages(
                flow,
                &[
                    tracked(0, "a", Some(5)),
                    tracked(0, "b", Some(6)),
                    settled(0, "a"),
                    tracked(1_000, "c", None),
                    settled(1_000, "c"),
                ],
            )
            .await
            .unwrap();
        store
            .advance_watermark(flow, &mark(500, 600, 700), None)
            .await
            .unwrap();
    }

    store
        .reset_flow(stale, Some("p__events"), ResetRows::All, None)
        .await
        .unwrap();
    let flows = store.prepare(&layout(&["live", "other"])).await.unwrap();
    let live = &flows[0];

    assert!(
        store
            .bucket_counts(live, i64::MIN)
            .await
            .unwrap()
            .is_empty()
    );
    // Not even the handle taken before the reset finds them.
    assert!(
        store
            .bucket_counts(stale, i64::MIN)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.watermarks("p").await.unwrap(),
        [("other".to_owned(), mark(500, 600, 700))]
    );
    assert_eq!(
        store.bucket_counts(other, i64::MIN).await.unwrap(),
        [bucket(0, 2, 1, Some(5)), bucket(1_000, 1, 1, None)]
    );
    // A fresh start: the reset flow's first record is what it offers.
    assert_eq!(
        store
            .advance_watermark(live, &mark(10, 20, 30), None)
            .await
            .unwrap(),
        Some(mark(10, 20, 30))
    );
    store
        .add_bucket_messages(live, &[tracked(0, "a", Some(9))])
        .await
        .unwrap();
    assert_eq!(
        store.bucket_counts(live, i64::MIN).await.unwrap(),
        [bucket(0, 1, 0, Some(9))]
    );
}

/// A row of `key` published at `publish_ms` with event time `event_ms`.
fn row_at(key: &str, publish_ms: i64, event_ms: i64) -> Entry {
    let mut entry = entry(key, Effect::row(event_ms));
    entry.message.publish_time_ms = publish_ms;
    entry
}

/// A reset with a seek of a watermarked flow (`PublishedSince { hold_watermark: true }`)
/// records the rows it deletes as tracked and not settled, and keeps what was tracked and not
/// settled in the whole buckets after the seek time (both come back with the replay), so the
/// watermark holds at them until the replay settles them, whatever the tracking subscription
/// hands back first; everything else of the flow's progress goes. Without the hold nothing
/// stays (a flow without a watermark has no reader to prune it).
async fn a_reset_with_a_seek_holds_the_watermark_at_the_replay(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    let (live, plain) = (&flows[0], &flows[1]);
    for flow in [live, plain] {
        let mut commit = batch(
            flow,
            vec![row_at("old", 1_200, 900), row_at("new", 3_500, 3_100)],
        );
        commit.watermark_progress = true;
        store.commit(commit).await.unwrap();
        store
            .add_bucket_messages(
                flow,
                &[
                    tracked(1_000, "m-old", Some(900)),
                    tracked(3_000, "m-new", Some(3_100)),
                    // Published in the seek's own bucket, maybe before it: not replayed.
                    tracked(2_000, "m-unsure", Some(2_000)),
                    // In flight when the worker stopped: the replay brings it.
                    tracked(4_000, "m-flying", Some(4_200)),
                    // A duplicate settled without a row.
                    tracked(4_000, "m-dup", Some(4_100)),
                    settled(4_000, "m-dup"),
                ],
            )
            .await
            .unwrap();
        store
            .advance_watermark(flow, &mark(2_000, 3_000, 3_000), None)
            .await
            .unwrap();
    }
    store
        .reset_flow(
            live,
            Some("p__events"),
            ResetRows::PublishedSince {
                since_ms: 2_500,
                hold_watermark: true,
            },
            None,
        )
        .await
        .unwrap();
    store
        .reset_flow(
            plain,
            Some("p__events"),
            ResetRows::PublishedSince {
                since_ms: 2_500,
                hold_watermark: false,
            },
            None,
        )
        .await
        .unwrap();

    assert_eq!(
        store.bucket_counts(live, i64::MIN).await.unwrap(),
        [
            bucket(3_000, 1, 0, Some(3_100)),
            bucket(4_000, 1, 0, Some(4_200))
        ],
        "the deleted row and the message in flight hold the watermark"
    );
    assert!(
        store
            .bucket_counts(plain, i64::MIN)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.watermarks("p").await.unwrap().is_empty());
    // The replay settles them (the row committed again), and the buckets are processed.
    let mut replay = batch(live, vec![row_at("new", 3_500, 3_100)]);
    replay.watermark_progress = true;
    store.commit(replay).await.unwrap();
    store
        .add_bucket_messages(live, &[settled(4_000, "m-flying")])
        .await
        .unwrap();
    assert_eq!(
        store.bucket_counts(live, i64::MIN).await.unwrap(),
        [
            bucket(3_000, 1, 1, Some(3_100)),
            bucket(4_000, 1, 1, Some(4_200))
        ]
    );
}

on_both_backends!(
    a_reset_with_a_seek_holds_the_watermark_at_the_replay,
    bucket_counts_count_each_message_once,
    a_commit_records_its_messages_settled,
    a_fenced_watermark_needs_the_readers_lease,
    watermarks_never_move_back,
    reset_forgets_buckets_and_watermark,
);
