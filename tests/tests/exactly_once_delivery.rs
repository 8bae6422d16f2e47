//! A subscription with exactly-once delivery: sluice acks each message after its commit with a
//! confirmed ack; Pub/Sub confirms them all (`sluice_ack_failures_total` stays 0 for every
//! reason), nothing comes back, and every event lands once (publisher duplicates by attribute
//! included). The start logs the subscription's settings.
//!
//! Real parts: the Pub/Sub emulator (it implements exactly-once subscriptions and confirmed
//! acks), a `sluice` process, SQLite. Not provoked here: an ack Pub/Sub refuses to confirm (the
//! lease expired first) — the emulator gives no way to; that path only counts and logs, and its
//! redelivery meets the ledger like any other (`crash.rs`).
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_bench::free_port;
use sluice_engine::pubsub::SubscriptionSettings;
use sluice_tests::{
    Db, FlowYaml, PipelineYaml, PubSub, Workdir, Worker, events_with_duplicates, eventually,
    flow_metric,
};
use std::time::Duration;

/// The sum of a metric's series on `/metrics` of `port`.
fn metric_sum(port: u16, name: &str) -> Option<f64> {
    let text = sluice_tests::metrics_text(port);
    let values: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

#[tokio::test(flavor = "multi_thread")]
async fn confirmed_acks_on_an_exactly_once_subscription() {
    let pubsub = PubSub::connect().await;
    let (topic, subscription) = pubsub
        .topic_with_subscription(
            "eod",
            SubscriptionSettings {
                exactly_once_delivery: true,
                ..SubscriptionSettings::default()
            },
        )
        .await;
    let dir = Workdir::new();
    let db = dir.db("eod.db");
    let port = free_port().unwrap();
    let file = PipelineYaml::new("test")
        .mode("continuous")
        .sqlite(&db)
        .pubsub_emulator()
        .metrics(&format!("127.0.0.1:{port}"))
        .target_table("events")
        .flow(FlowYaml::pubsub("ingest", "events", &subscription).dedup_attribute("event_id"))
        .write(dir.path(), "p.yaml");
    let worker = Worker::start(&file, "eod");
    let messages = events_with_duplicates("e", 2_000, 200);
    let published = messages.len();
    pubsub.publish(&topic, messages).await;
    let store = Db(db);
    assert!(
        eventually(Duration::from_secs(120), || store.rows() == 2_000).await,
        "{} rows; {}",
        store.rows(),
        worker.logs()
    );
    // Acks are confirmed in the background; then nothing more arrives.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let received = flow_metric(port, "sluice_messages_received_total", "ingest").unwrap();
    let failures = metric_sum(port, "sluice_ack_failures_total");
    // Labelled like the flow's other metrics.
    let lease_expired = sluice_tests::labelled_metric(
        port,
        "sluice_ack_failures_total",
        "pipeline=\"test\",flow=\"ingest\",subscription=",
    );
    let logs = worker.logs();
    drop(worker);
    assert_eq!(failures, Some(0.0), "every ack confirmed: {logs}");
    assert_eq!(lease_expired, Some(0.0), "labelled by pipeline and flow");
    assert_eq!(received, published as f64, "nothing redelivered: {logs}");
    assert_eq!(store.distinct_keys(), 2_000);
    assert_eq!(store.dead_letters(), 0);
    assert!(
        logs.contains("exactly-once delivery on")
            && logs.contains("acks after commit are confirmed"),
        "{logs}"
    );
}
