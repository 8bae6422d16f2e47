//! `sluice reset FLOW --seek T --drop-unread` of a flow with a watermark (issue 19, hole 2):
//! the replay is tracked, so the watermark stays below it and no replayed row is late.
//!
//! A worker ingests 20 s of traffic (event times up to 5 s before publish, band 10 s) and
//! stops; the flow is reset with a seek to 5 s into the traffic; a new worker starts while
//! traffic goes on, and replays the last 15 s. Every row committed after a sample of the
//! watermark has an event time of at least that sample, `sluice_messages_late_total` stays 0,
//! and every event is there once. (Before the fix only the base subscription was seeked: the
//! new reader, tracking only what was published after the reset, let the watermark move with
//! the clock over the replay, and the replayed rows were late.)
//!
//! Real: the emulator (subscriptions that retain acked messages), `sluice` workers, SQLite.
//! The emulator holds a subscription's messages back for minutes after its streams closed
//! (ARCHITECTURE.md, "Pub/Sub client facts we build on"), so the replay comes slowly.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_bench::free_port;
use sluice_tests::watermarks::{
    WatermarkHistory, WatermarkedPipeline, publish_steadily, rows_behind,
};
use sluice_tests::{
    Db, PubSub, Workdir, Worker, emulator, eventually, flow_metric, now_ms, sluice_command, unique,
};
use std::path::Path;
use std::time::Duration;

fn watermark(db: &Db) -> i64 {
    db.query(
        "SELECT COALESCE(MAX(w.watermark_ms), 0) FROM sluice_watermarks w \
         JOIN sluice_flows f ON f.flow_id = w.flow_id WHERE f.flow = 'ingest'",
    )
}

fn pipeline(dir: &Path, metrics_port: u16, subscription: &str) -> std::path::PathBuf {
    let file = dir.join("p.yaml");
    let text = WatermarkedPipeline {
        store: format!("sqlite://{}", dir.join("db").display()),
        endpoint: emulator().endpoint(),
        metrics_port: Some(metrics_port),
        subscription,
        target: "{ name: events, kind: table }",
    }
    .yaml();
    std::fs::write(&file, text).unwrap();
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seek_replays_tracked_and_nothing_is_late() {
    let pubsub = PubSub::connect().await;
    let topic = unique("wmseek");
    pubsub.admin.create_topic(&topic).await.unwrap();
    let subscription = format!("{topic}-sub");
    pubsub
        .admin
        .create_replayable_subscription(&subscription, &topic, 10)
        .await
        .unwrap();
    let dir = Workdir::new();
    let db_path = dir.path().join("db");
    let db = Db(db_path.clone());
    let metrics_port = free_port().unwrap();
    let file = pipeline(dir.path(), metrics_port, &subscription);
    let first = Worker::start(&file, "before");
    pubsub
        .wait_until_exists(&format!("{subscription}-tracking"), Duration::from_secs(60))
        .await;
    let publisher = pubsub.admin.publisher(&topic).await.unwrap();
    let started = now_ms();
    let before = publish_steadily(&publisher, "a", 2, 200).await;
    assert!(
        eventually(Duration::from_secs(60), || db.rows() == before as i64).await,
        "rows {} of {before}; logs:\n{}",
        db.rows(),
        first.logs()
    );
    assert!(watermark(&db) > 0, "no watermark before the reset");
    first.terminate();
    assert!(first.wait(Duration::from_secs(30)).success());

    let seek = (started + 5_000).to_string();
    let out = sluice_command(
        &[
            "reset",
            "ingest",
            "-c",
            file.to_str().unwrap(),
            "--seek",
            &seek,
            "--drop-unread",
        ],
        None,
    );
    let said = out.all();
    assert_eq!(out.code, 0, "reset --seek failed: {said}");
    assert!(said.contains("-tracking seeked"), "{said}");
    let kept = db.rows();
    println!("{said}; {kept} rows kept of {before}");
    assert!(kept > 0 && kept < before as i64, "{kept}");
    assert_eq!(watermark(&db), 0, "the reset forgets the watermark");

    let second = Worker::start(&file, "after");
    let history = {
        let db = Db(db_path.clone());
        WatermarkHistory::start(Duration::from_millis(100), move || watermark(&db))
    };
    let after = publish_steadily(&publisher, "b", 1, 300).await;
    let total = (before + after) as i64;
    assert!(
        eventually(Duration::from_secs(400), || db.rows() == total).await,
        "rows {} of {total}; logs:\n{}",
        db.rows(),
        second.logs()
    );
    let samples = history.finish();
    assert_eq!(db.distinct_keys(), total, "each event once");
    let (behind, first_behind) = rows_behind(&samples, |when, w| {
        db.query(&format!(
            "SELECT COUNT(*) FROM test__events WHERE committed_at > {when} AND event_time < {w}"
        ))
    });
    let late = flow_metric(metrics_port, "sluice_messages_late_total", "ingest").unwrap();
    println!(
        "{total} events; {} samples after the reset; {late} counted late",
        samples.len()
    );
    assert_eq!(behind, 0, "replayed rows late: {first_behind:?}");
    assert_eq!(late, 0.0);
}
