//! The reserved attribute `sluice-probe` on the real emulator, with a `sluice` worker and
//! SQLite: a flow with a watermark, live traffic, and two messages that carry the attribute.
//!
//! * Data that carries it (a payload, a value that is not a probe's) is a dead letter with
//!   reason `reserved_attribute`, never silently dropped; the tracking reader tracks it as data,
//!   so its dead letter settles it and the watermark passes its event time.
//! * The tracking reader's probes reach the base subscription too: the flow acks and drops
//!   them (no row, no dead letter) and counts them in `sluice_probes_dropped_total{subscription}`.
//!   (What is shaped as a probe: `connector/src/pubsub/probe.rs`'s unit test. A probe-shaped
//!   message published here would be nacked back by the tracking reader as another reader's
//!   for 2 minutes, which holds the watermark meanwhile.)
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_bench::free_port;
use sluice_engine::pubsub::publish_all;
use sluice_tests::watermarks::{WatermarkedPipeline, publish_steadily, timed_event};
use sluice_tests::{Db, PubSub, Workdir, Worker, emulator, eventually, labelled_metric, now_ms};
use std::time::{Duration, Instant};

/// The flow's stored watermark (0: none yet).
fn watermark(db: &Db) -> i64 {
    db.query(
        "SELECT COALESCE(MAX(w.watermark_ms), 0) FROM sluice_watermarks w \
         JOIN sluice_flows f ON f.flow_id = w.flow_id WHERE f.flow = 'ingest'",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_carrying_the_probe_attribute_is_a_dead_letter_and_probes_are_counted() {
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("probeattr", 1).await;
    let dir = Workdir::new();
    let db_path = dir.path().join("db");
    let db = Db(db_path.clone());
    let metrics_port = free_port().unwrap();
    let file = dir.path().join("p.yaml");
    let yaml = WatermarkedPipeline {
        store: format!("sqlite://{}", db_path.display()),
        endpoint: emulator().endpoint(),
        metrics_port: Some(metrics_port),
        subscription: &subs[0],
        target: "{ name: events, kind: table }",
    }
    .yaml();
    std::fs::write(&file, yaml).unwrap();
    let started = Instant::now();
    let worker = Worker::start(&file, "probeattr");
    pubsub
        .wait_until_exists(&format!("{}-tracking", subs[0]), Duration::from_secs(60))
        .await;
    let publisher = pubsub.admin.publisher(&topic).await.unwrap();
    let mut live = publish_steadily(&publisher, "a", 2, 50).await;
    let misuse_ms = now_ms();
    let misuse = timed_event("misuse", misuse_ms).set_attributes([
        ("event_id", "misuse".to_owned()),
        ("ts", misuse_ms.to_string()),
        ("sluice-probe", "mine".to_owned()),
    ]);
    publish_all(&publisher, [misuse]).await.unwrap();
    live += publish_steadily(&publisher, "b", 2, 50).await;

    let reserved = "SELECT COUNT(*) FROM test__dead_letter WHERE reason = 'reserved_attribute' \
                    AND dedup_key = 'misuse'";
    assert!(
        eventually(Duration::from_secs(60), || db.rows() == live as i64
            && db.query(reserved) == 1)
        .await,
        "rows {} of {live}, reserved_attribute dead letters {} (all dead letters {}); logs:\n{}",
        db.rows(),
        db.query(reserved),
        db.dead_letters(),
        worker.logs()
    );
    assert_eq!(db.dead_letters(), 1, "only the misuse is a dead letter");
    let settled_s = started.elapsed().as_secs();
    // Settled by its dead letter, it does not hold the watermark.
    assert!(
        eventually(Duration::from_secs(120), || watermark(&db) > misuse_ms).await,
        "the watermark {} never passed the dead-lettered message ({misuse_ms}); logs:\n{}",
        watermark(&db),
        worker.logs()
    );
    let counted = labelled_metric(
        metrics_port,
        "sluice_messages_dead_lettered_total",
        "reason=\"reserved_attribute\"",
    );
    assert_eq!(counted, Some(1.0), "the dead letter counted by its reason");
    let dropped = labelled_metric(metrics_port, "sluice_probes_dropped_total", &subs[0]);
    println!(
        "{live} rows, 1 dead letter, all settled {settled_s} s after the worker started, the \
         watermark past the dead letter after {} s; sluice_probes_dropped_total {dropped:?}",
        started.elapsed().as_secs()
    );
    assert!(
        dropped.is_some_and(|n| n >= 1.0),
        "probes on the base subscription counted: {dropped:?}"
    );
}
