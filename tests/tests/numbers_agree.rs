//! One figure, one definition: after a run with publisher duplicates, the rows, duplicates
//! (both tiers) and dead letters agree between the live status (control API), `/metrics`, the
//! worker's last log line of the flow, the store's status once the worker is gone, and the
//! store's tables; a live flow with no worker alive is not shown LIVE.
//!
//! Real: the emulator, a `sluice` process with its control API and `/metrics`, SQLite.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_bench::free_port;
use sluice_tests::{
    Db, PipelineOptions, PubSub, Workdir, Worker, events_with_duplicates, eventually,
    labelled_metric, sluice_command,
};
use std::time::Duration;

const EVENTS: usize = 600;
const DUPLICATES: usize = 150;

fn status(file: &str) -> serde_json::Value {
    let out = sluice_command(&["status", "-c", file, "--format", "json"], None);
    assert_eq!(out.code, 0, "{}", out.all());
    serde_json::from_str(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counts_agree_in_every_view_after_a_run_with_duplicates() {
    let dir = Workdir::new();
    let pubsub = PubSub::connect().await;
    let (topic, subscriptions) = pubsub.topic_with("numbers", 1).await;
    let (metrics, control) = (free_port().unwrap(), free_port().unwrap());
    let mut options = PipelineOptions::continuous(&subscriptions[0]);
    options.metrics_listen = Some(format!("127.0.0.1:{metrics}"));
    options.control = Some(format!("{{ listen: \"127.0.0.1:{control}\" }}"));
    let file = dir.pipeline("p.yaml", "numbers", &options);
    let file_arg = file.to_str().unwrap().to_owned();
    let worker = Worker::start(&file, "numbers");
    pubsub
        .publish(&topic, events_with_duplicates("n", EVENTS, DUPLICATES))
        .await;
    let db = Db(dir.db("numbers"));
    assert!(
        eventually(Duration::from_secs(120), || db.rows() == EVENTS as i64).await,
        "{} rows; {}",
        db.rows(),
        worker.logs()
    );
    // Every copy received, acked, and counted.
    let received = || {
        labelled_metric(metrics, "sluice_messages_received_total", "flow=\"ingest\"")
            .unwrap_or_default()
    };
    assert!(
        eventually(Duration::from_secs(60), || received()
            >= (EVENTS + DUPLICATES) as f64)
        .await,
        "received {}",
        received()
    );
    let duplicate = |layer: &str| {
        labelled_metric(
            metrics,
            "sluice_messages_duplicate_total",
            &format!("flow=\"ingest\",layer=\"{layer}\""),
        )
        .unwrap_or_default()
    };
    let from_metrics = duplicate("memory") + duplicate("store");
    assert_eq!(from_metrics, DUPLICATES as f64, "{}", worker.logs());

    let live = status(&file_arg);
    assert_eq!(live["source"], "control_api", "{live}");
    let flow = &live["flows"][0];
    assert_eq!(flow["rows"], EVENTS, "{live}");
    assert_eq!(
        flow["duplicates_memory"].as_u64().unwrap() + flow["duplicates_store"].as_u64().unwrap(),
        DUPLICATES as u64,
        "{live}"
    );

    let stderr = worker.stderr.clone();
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(60)).success());
    let logs = std::fs::read_to_string(stderr).unwrap();
    let finished = logs
        .lines()
        .find(|l| l.contains("flow finished") && l.contains("flow=ingest"))
        .unwrap_or_else(|| panic!("no `flow finished` line: {logs}"));
    assert!(
        finished.contains(&format!(" duplicates={DUPLICATES} ")),
        "the log counts both tiers: {finished}"
    );

    let stored = status(&file_arg);
    println!("live: {live}\nstored: {stored}\nlog: {finished}");
    assert_ne!(stored["source"], "control_api", "{stored}");
    let flow = &stored["flows"][0];
    assert_eq!(flow["rows"], EVENTS, "{stored}");
    assert_eq!(
        flow["duplicates"], DUPLICATES,
        "the store counts both tiers: {stored}"
    );
    assert_eq!(flow["dead_letters"], 0, "{stored}");
    assert_eq!(flow["state"], "NOT RUNNING", "no worker alive: {stored}");
    assert_eq!(db.rows(), EVENTS as i64);
}
