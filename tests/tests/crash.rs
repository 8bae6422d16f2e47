//! Crashes: messages received but not committed come back and land once; SIGKILL at random
//! moments during a stream with publisher duplicates loses nothing and duplicates nothing, and
//! leaves nothing unacked.
//!
//! Emulator stall (see ARCHITECTURE.md): messages the emulator had handed to a killed worker's
//! streams come back only after their stream ack deadline, and streams opened right after a close
//! may wait as well. These tests keep a second replica whose streams were opened before any kill
//! and is never killed (an anchor), as a pool would have, and size their timeouts for the wait.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::{
    Db, PipelineOptions, PubSub, Workdir, Worker, event, events_with_duplicates, eventually,
};
use std::time::Duration;

/// A worker that receives messages and holds them (a batch that closes only after a minute)
/// is killed before it commits anything; the anchor replica gets the redeliveries and each
/// message lands once.
#[tokio::test(flavor = "multi_thread")]
async fn received_but_uncommitted_messages_come_back_after_a_crash_and_land_once() {
    const N: usize = 2_000;
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("redeliver", 1).await;
    let dir = Workdir::new();
    let holder = dir.pipeline(
        "hold.yaml",
        "db",
        &PipelineOptions {
            batch: "{ max_messages: 100000, max_delay: 60s }",
            ..PipelineOptions::continuous(&subs[0])
        },
    );
    let normal = dir.pipeline("normal.yaml", "db", &PipelineOptions::continuous(&subs[0]));
    let db = Db(dir.db("db"));

    let holding = Worker::start(&holder, "holder");
    tokio::time::sleep(Duration::from_secs(3)).await;
    pubsub
        .publish(&topic, (0..N).map(|i| event(&format!("r{i}"))).collect())
        .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let anchor = Worker::start(&normal, "anchor");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        db.rows(),
        0,
        "the holder committed nothing before the crash"
    );
    holding.kill9();

    let landed = eventually(Duration::from_secs(300), || db.rows() >= N as i64).await;
    anchor.terminate();
    let logs = anchor.logs();
    assert!(anchor.wait(Duration::from_secs(60)).success(), "{logs}");
    assert!(landed, "only {} of {N} rows", db.rows());
    assert_eq!(db.rows(), N as i64);
    assert_eq!(db.distinct_keys(), N as i64);
}

/// 20 000 distinct events plus 2 000 publisher duplicates, published over ~10 s, while one of
/// two replicas sharing a SQLite store is SIGKILLed five times at random moments and restarted
/// each time. At the end every distinct key has exactly one row, and once the workers have
/// drained and stopped, a plain client finds nothing left unacked on the subscription. A control
/// subscription, whose messages a plain client received and left unacked when its stream closed,
/// shows that the same check does find unacked messages when there are some.
#[tokio::test(flavor = "multi_thread")]
async fn sigkill_five_times_loses_nothing_and_duplicates_nothing() {
    const DISTINCT: usize = 20_000;
    const DUPLICATES: usize = 2_000;
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("crash", 1).await;
    let dir = Workdir::new();
    let file = dir.pipeline("p.yaml", "db", &PipelineOptions::continuous(&subs[0]));
    let db = Db(dir.db("db"));

    let messages = events_with_duplicates("c", DISTINCT, DUPLICATES);
    let chunks = messages.chunks(2_000).map(|c| c.to_vec());

    let anchor = Worker::start(&file, "anchor");
    let mut victim = Worker::start(&file, "victim-0");
    let publisher = {
        let pubsub = PubSub::connect().await;
        let topic = topic.clone();
        let chunks: Vec<_> = chunks.collect();
        tokio::spawn(async move {
            for chunk in chunks {
                pubsub.publish(&topic, chunk).await;
                tokio::time::sleep(Duration::from_millis(1_000)).await;
            }
        })
    };
    for kill in 1..=5 {
        let wait_ms = rand::random_range(1_000..4_000);
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        victim.kill9();
        victim = Worker::start(&file, &format!("victim-{kill}"));
    }
    publisher.await.unwrap();

    let landed = eventually(Duration::from_secs(600), || db.rows() >= DISTINCT as i64).await;
    assert!(
        landed,
        "only {} of {DISTINCT} rows; anchor logs:\n{}",
        db.rows(),
        anchor.logs()
    );
    // Let leases of the killed replicas lapse and their redeliveries be acked as duplicates.
    tokio::time::sleep(Duration::from_secs(30)).await;
    anchor.terminate();
    victim.terminate();
    assert!(anchor.wait(Duration::from_secs(60)).success());
    assert!(victim.wait(Duration::from_secs(60)).success());

    assert_eq!(
        db.rows(),
        DISTINCT as i64,
        "exactly one row per distinct key"
    );
    assert_eq!(db.distinct_keys(), DISTINCT as i64);
    assert_eq!(db.dead_letters(), 0);
    // Control, read beside the real check (each read lasts minutes): on a small control topic, a
    // plain client takes 500 of 1 000 messages and closes its stream without acking them. The
    // same check must find all 1 000, those 500 included.
    let control = async {
        let (control_topic, control_subs) = pubsub.topic_with("crash-control", 1).await;
        pubsub
            .publish(
                &control_topic,
                (0..1_000).map(|i| event(&format!("x{i}"))).collect(),
            )
            .await;
        let touched = pubsub
            .plain_client(&control_subs[0], 500, Duration::from_secs(30), false)
            .await
            .unwrap();
        let found = sluice_tests::unacked_messages(&pubsub, &control_subs[0], 1_000).await;
        (touched, found)
    };
    let (left, (touched, control)) = tokio::join!(
        sluice_tests::unacked_messages(&pubsub, &subs[0], 0),
        control
    );
    assert!(
        left.is_empty(),
        "{} messages left unacked on the subscription",
        left.len()
    );
    assert_eq!(touched.len(), 500);
    let missed = touched.difference(&control).count();
    assert_eq!(
        missed, 0,
        "the check missed {missed} messages a closed stream left unacked"
    );
    assert_eq!(control.len(), 1_000);
}
