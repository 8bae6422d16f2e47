//! A worker paused (SIGSTOP, as a long stall or a partition would) while it holds uncommitted
//! messages, past a short dedup window, while a second replica commits their redeliveries; then
//! resumed (SIGCONT). The paused worker's copies are older than the window when it wakes: none
//! may commit, since the ledger no longer remembers the other replica's keys.
//!
//! Real parts: the Pub/Sub emulator, two `sluice` processes, PostgreSQL on 127.0.0.1:5432 (a
//! fresh database). The holder keeps its messages uncommitted by batching them for 30 s; the
//! test proves it held them (its metrics: all received, none committed) before it stops it.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_bench::free_port;
use sluice_store::ScratchDatabase;
use sluice_tests::{
    PgDb, PipelineOptions, PubSub, Workdir, Worker, event, eventually, flow_metric, stop_all,
};
use std::process::Command;
use std::time::{Duration, Instant};

const MESSAGES: usize = 2_000;
/// The dedup window of both replicas.
const WINDOW: &str = "15s";
/// How long the holder sleeps after the other replica committed everything: past the window.
const PAST_THE_WINDOW: Duration = Duration::from_secs(25);

fn signal(worker: &Worker, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &worker.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_paused_past_the_dedup_window_commits_none_of_its_stale_copies() {
    let database = ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let pubsub = PubSub::connect().await;
    let (topic, mut subscriptions) = pubsub.topic_with("pause", 1).await;
    let subscription = subscriptions.remove(0);
    let dir = Workdir::new();
    let holder_port = free_port().unwrap();
    let dedup: &'static str =
        Box::leak(format!("{{ by: message_id, window: {WINDOW} }}").into_boxed_str());
    let holder_file = dir.pipeline(
        "holder.yaml",
        "unused",
        &PipelineOptions {
            store: Some(database.url().to_owned()),
            dedup,
            // One batch that closes 30 s after its first message: held, uncommitted.
            batch: "{ max_messages: 5000, max_delay: 30s }",
            streams: 1,
            metrics_listen: Some(format!("127.0.0.1:{holder_port}")),
            ..PipelineOptions::continuous(&subscription)
        },
    );
    let other_file = dir.pipeline(
        "other.yaml",
        "unused",
        &PipelineOptions {
            store: Some(database.url().to_owned()),
            dedup,
            ..PipelineOptions::continuous(&subscription)
        },
    );

    let holder = Worker::start(&holder_file, "holder");
    let metric = |name: &str| flow_metric(holder_port, name, "ingest").unwrap_or(-1.0);
    assert!(
        eventually(Duration::from_secs(60), || metric(
            "sluice_messages_received_total"
        ) >= 0.0)
        .await,
        "the holder never served metrics: {}",
        holder.logs()
    );
    let messages = (0..MESSAGES).map(|i| event(&format!("e{i}"))).collect();
    pubsub.publish(&topic, messages).await;
    let held = eventually(Duration::from_secs(20), || {
        metric("sluice_messages_received_total") >= MESSAGES as f64
    })
    .await;
    assert!(
        held,
        "the holder received {}",
        metric("sluice_messages_received_total")
    );
    assert_eq!(
        metric("sluice_messages_committed_total"),
        0.0,
        "the holder committed nothing before its pause"
    );
    signal(&holder, "-STOP");
    let stopped = Instant::now();

    // The holder's leases lapse; the other replica gets the redeliveries and commits them.
    let other = Worker::start(&other_file, "other");
    let committed = eventually(Duration::from_secs(180), || db.rows() >= MESSAGES as i64).await;
    assert!(
        committed,
        "the other replica committed {} rows:\n{}",
        db.rows(),
        other.logs()
    );
    let other_done = stopped.elapsed();
    tokio::time::sleep(PAST_THE_WINDOW).await;

    signal(&holder, "-CONT");
    let paused_for = stopped.elapsed();
    // The holder's batch closes at once (its 30 s passed); whatever it does with it, its
    // in-flight count falls to zero once the batch is settled.
    let settled = eventually(Duration::from_secs(90), || {
        metric("sluice_inflight_messages") == 0.0
    })
    .await;
    assert!(
        settled,
        "the holder never settled its batch:\n{}",
        holder.logs()
    );
    // Room for anything it might still commit, and for redeliveries of what it gave back.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let holder_committed = metric("sluice_messages_committed_total");
    let holder_stale = metric("sluice_messages_stale_total");
    let rows = db.rows();
    let logs = stop_all(vec![holder, other]);
    println!(
        "paused {paused_for:?}; the other replica had committed every message {other_done:?} \
         after the pause began; the holder committed {holder_committed} after it woke and \
         gave back {holder_stale} as stale; {rows} rows for {MESSAGES} keys"
    );
    assert!(
        holder_stale >= MESSAGES as f64,
        "the holder gave back its whole batch as stale ({holder_stale})"
    );
    assert_eq!(
        rows, MESSAGES as i64,
        "exactly one row per key; holder's log:\n{}",
        logs[0]
    );
    db.assert_exactly_once(MESSAGES);
}
