//! Exactly-once ingestion by the `sluice` worker on the real emulator and a real SQLite store:
//! publisher duplicates, and a SIGTERM drain.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::{
    Db, PipelineOptions, PubSub, Workdir, Worker, events_with_duplicates, eventually,
};
use std::time::Duration;

const DISTINCT: usize = 3_000;
const REPUBLISHED: usize = 400;

/// N distinct events plus M re-publishes (new message ids, same `event_id`): deduplicating by
/// attribute gives N rows; by message id, N + M rows. Two subscriptions on one topic, one worker
/// (triggered, drains until idle) per subscription.
#[tokio::test(flavor = "multi_thread")]
async fn publisher_duplicates_collapse_by_attribute_not_by_message_id() {
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("dups", 2).await;
    pubsub
        .publish(&topic, events_with_duplicates("e", DISTINCT, REPUBLISHED))
        .await;

    let dir = Workdir::new();
    let by_attribute = dir.pipeline("attr.yaml", "attr", &PipelineOptions::triggered(&subs[0]));
    let by_message_id = dir.pipeline(
        "mid.yaml",
        "mid",
        &PipelineOptions {
            dedup: "{ by: message_id }",
            ..PipelineOptions::triggered(&subs[1])
        },
    );
    let a = Worker::start(&by_attribute, "attr");
    let m = Worker::start(&by_message_id, "mid");
    let a_out = a.stdout.clone();
    assert!(
        a.wait(Duration::from_secs(120)).success(),
        "{}",
        std::fs::read_to_string(&a_out).unwrap()
    );
    assert!(m.wait(Duration::from_secs(120)).success());

    let attr = Db(dir.db("attr"));
    assert_eq!(attr.rows(), DISTINCT as i64);
    assert_eq!(attr.distinct_keys(), DISTINCT as i64);
    let mid = Db(dir.db("mid"));
    assert_eq!(mid.rows(), (DISTINCT + REPUBLISHED) as i64);
    let summary = std::fs::read_to_string(&a_out).unwrap();
    assert!(summary.contains(&format!("rows {DISTINCT}")), "{summary}");
}

/// SIGTERM while messages flow: the worker stops pulling, commits and acks what it holds, and
/// exits 0. A second replica, started before the drain so its streams are open when the first
/// one's close (as a pool's replicas would be), takes the rest. Everything
/// lands once, and the second replica's ledger never sees a message the first one committed:
/// the first acked all it committed.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_commits_acks_and_exits_zero() {
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("drain", 1).await;
    let dir = Workdir::new();
    let file = dir.pipeline("p.yaml", "db", &PipelineOptions::continuous(&subs[0]));
    let db = Db(dir.db("db"));
    let first = Worker::start(&file, "first");

    // Publish 6 000 distinct events over about three seconds.
    let publisher = {
        let pubsub = PubSub::connect().await;
        let topic = topic.clone();
        tokio::spawn(async move {
            for chunk in 0..30 {
                let events = (0..200)
                    .map(|i| sluice_tests::event(&format!("d{}", chunk * 200 + i)))
                    .collect();
                pubsub.publish(&topic, events).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    assert!(
        eventually(Duration::from_secs(60), || db.rows() > 500).await,
        "{}",
        first.logs()
    );
    let second = Worker::start(&file, "second");
    tokio::time::sleep(Duration::from_secs(3)).await;
    first.terminate();
    let first_logs = first.stderr.clone();
    let first_out = first.stdout.clone();
    let status = first.wait(Duration::from_secs(60));
    assert_eq!(
        status.code(),
        Some(0),
        "{}",
        std::fs::read_to_string(&first_logs).unwrap()
    );
    assert!(
        std::fs::read_to_string(&first_out)
            .unwrap()
            .contains("STOPPED")
    );
    publisher.await.unwrap();

    let all_landed = eventually(Duration::from_secs(300), || db.rows() >= 6_000).await;
    second.terminate();
    let second_out = second.stdout.clone();
    assert!(second.wait(Duration::from_secs(60)).success());
    assert!(all_landed, "rows {}", db.rows());
    assert_eq!(db.rows(), 6_000);
    assert_eq!(db.distinct_keys(), 6_000);
    let summary = std::fs::read_to_string(&second_out).unwrap();
    assert!(
        summary.contains("store 0)"),
        "second replica saw committed messages again: {summary}"
    );
}
