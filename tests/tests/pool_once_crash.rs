//! A once Pub/Sub flow (a backfill from a subscription) read by two replicas, one of which is
//! SIGKILLed while it holds uncommitted messages: the other must not record the flow complete
//! while those messages can still come back, and must ingest them.
//!
//! Real parts: the Pub/Sub emulator, two `sluice` processes, PostgreSQL on 127.0.0.1:5432 (a
//! fresh database). The holder keeps its messages uncommitted by batching them for 60 s; the
//! test proves it held them (its metrics: all received, none committed) before the kill.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_bench::free_port;
use sluice_store::ScratchDatabase;
use sluice_tests::{
    FlowYaml, PgDb, PipelineYaml, PubSub, Workdir, Worker, event, eventually, flow_metric,
};
use std::time::Duration;

const MESSAGES: usize = 500;
/// How long after the holder's death the other replica waits for what it held
/// (`SLUICE_REDELIVERY_WAIT`; 4 minutes by default): six times the stream ack deadline (10 s)
/// after which the test harness's emulator, with its stream fix, gives a killed stream's
/// messages back.
const REDELIVERY_WAIT: &str = "60s";

/// A continuous pipeline whose only flow, `ingest`, is a once flow on `subscription`. With a
/// `metrics_port` (the holder's) it batches for 60 s, so its messages stay uncommitted.
fn pipeline(
    dir: &Workdir,
    file: &str,
    store: &str,
    subscription: &str,
    metrics_port: Option<u16>,
) -> std::path::PathBuf {
    let (max_messages, max_delay) = match metrics_port {
        Some(_) => (5000, "60s"),
        None => (500, "20ms"),
    };
    let mut pipeline = PipelineYaml::new("test")
        .mode("continuous")
        .store(store)
        .pubsub_emulator();
    if let Some(port) = metrics_port {
        pipeline = pipeline.metrics(&format!("127.0.0.1:{port}"));
    }
    pipeline
        .target_table("events")
        .flow(
            FlowYaml::pubsub("ingest", "events", subscription)
                .once()
                .dedup_attribute("event_id")
                .drain_idle("3s")
                .streams(2)
                .batch(max_messages, max_delay),
        )
        .write(dir.path(), file)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_once_flow_is_not_complete_while_a_crashed_replicas_messages_can_come_back() {
    let database = ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let pubsub = PubSub::connect().await;
    let (topic, subscriptions) = pubsub.topic_with("once", 1).await;
    let dir = Workdir::new();
    let port = free_port().unwrap();
    let holder_file = pipeline(
        &dir,
        "holder.yaml",
        database.url(),
        &subscriptions[0],
        Some(port),
    );
    let other_file = pipeline(&dir, "other.yaml", database.url(), &subscriptions[0], None);

    let start = |file: &std::path::Path, name: &str| {
        let env = [(
            "SLUICE_REDELIVERY_WAIT".to_owned(),
            REDELIVERY_WAIT.to_owned(),
        )];
        Worker::spawn_with_env(
            &["run", "-c", file.to_str().unwrap()],
            &env,
            file.parent().unwrap(),
            name,
        )
    };
    let holder = start(&holder_file, "holder");
    let metric = |name: &str| flow_metric(port, name, "ingest").unwrap_or(-1.0);
    assert!(
        eventually(Duration::from_secs(60), || metric(
            "sluice_messages_received_total"
        ) >= 0.0)
        .await,
        "the holder never served metrics: {}",
        holder.logs()
    );
    pubsub
        .publish(
            &topic,
            (0..MESSAGES).map(|i| event(&format!("e{i}"))).collect(),
        )
        .await;
    assert!(
        eventually(Duration::from_secs(30), || {
            metric("sluice_messages_received_total") >= MESSAGES as f64
        })
        .await,
        "the holder received {}",
        metric("sluice_messages_received_total")
    );
    assert_eq!(
        metric("sluice_messages_committed_total"),
        0.0,
        "held, uncommitted"
    );

    // The other replica starts with everything held by the holder; then the holder dies.
    let other = start(&other_file, "other");
    tokio::time::sleep(Duration::from_secs(2)).await;
    holder.kill9();
    // The emulator gives a killed stream's messages back after their stream ack deadline.
    let landed = eventually(Duration::from_secs(300), || db.rows() >= MESSAGES as i64).await;
    let completions = db.query("SELECT count(*) FROM sluice_completions");
    assert!(
        landed,
        "{} of {MESSAGES} rows (completion recorded: {completions}); the crashed replica's \
         messages were never ingested; other's log:\n{}",
        db.rows(),
        other.logs()
    );
    // Then, once what the dead replica held cannot come back any more, the flow completes.
    let completed = eventually(Duration::from_secs(300), || {
        db.query("SELECT count(*) FROM sluice_completions") == 1
    })
    .await;
    let logs = other.logs();
    drop(other);
    assert!(completed, "never completed; other's log:\n{logs}");
    assert!(
        logs.contains("died while reading"),
        "the other replica waited for the dead one: {logs}"
    );
    db.assert_exactly_once(MESSAGES);
}
