//! A rolling restart of a pool of three on PostgreSQL under load (what a new image's rollout
//! does): each replica in turn gets SIGTERM, drains and exits 0, and a new one takes its place
//! and serves /readyz before the next goes; every message lands exactly once.
//!
//! Real parts: the Pub/Sub emulator (traffic published throughout), six `sluice` processes
//! over the run, PostgreSQL on 127.0.0.1:5432 (a fresh database). The test shows each stop
//! landed under load: messages were still being published and committed around it.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_bench::free_port;
use sluice_tests::{
    FlowYaml, PipelineYaml, PostgresPipeline, Worker, event, eventually, http_status,
    publish_in_chunks, stop_all,
};
use std::time::Duration;

const MESSAGES: usize = 8_000;

#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_restart_under_load_loses_and_duplicates_nothing() {
    let pool = PostgresPipeline::create("rolling", "").await;
    let ports: Vec<u16> = (0..3).map(|_| free_port().unwrap()).collect();
    let files: Vec<_> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            PipelineYaml::new("test")
                .mode("continuous")
                .store(pool.database.url())
                .pubsub_emulator()
                .metrics(&format!("127.0.0.1:{port}"))
                .target_table("events")
                .flow(
                    FlowYaml::pubsub("ingest", "events", &pool.subscription)
                        .dedup_attribute("event_id"),
                )
                .write(pool.dir.path(), &format!("w{i}.yaml"))
        })
        .collect();
    let mut workers: Vec<Option<Worker>> = files
        .iter()
        .enumerate()
        .map(|(i, file)| Some(Worker::start(file, &format!("w{i}"))))
        .collect();
    for port in &ports {
        assert!(
            eventually(Duration::from_secs(60), || http_status(*port, "/readyz")
                == "200")
            .await,
            "a worker never became ready"
        );
    }
    // About 48 s of publishing, longer than three restarts take under load, so that each one
    // happens while messages still come.
    let publisher = publish_in_chunks(
        &pool.topic,
        (0..MESSAGES).map(|i| event(&format!("e{i}"))).collect(),
        50,
        Duration::from_millis(300),
    )
    .await;
    for i in 0..3 {
        tokio::time::sleep(Duration::from_secs(4)).await;
        let rows_before = pool.db.rows();
        let old = workers[i].take().unwrap();
        old.terminate();
        let logs = old.logs();
        assert!(old.wait(Duration::from_secs(60)).success(), "{logs}");
        let new = Worker::start(&files[i], &format!("w{i}-new"));
        assert!(
            eventually(Duration::from_secs(60), || http_status(ports[i], "/readyz")
                == "200")
            .await,
            "the replacement of w{i} never became ready: {}",
            new.logs()
        );
        workers[i] = Some(new);
        let rows_after = pool.db.rows();
        println!("restarted w{i}: rows {rows_before} before its stop, {rows_after} once replaced");
        assert!(
            rows_before > 0 && rows_after < MESSAGES as i64,
            "the restart of w{i} did not happen under load ({rows_before}, {rows_after} rows)"
        );
    }
    publisher.await.unwrap();
    assert!(
        eventually(Duration::from_secs(240), || pool.db.rows()
            >= MESSAGES as i64)
        .await,
        "{} of {MESSAGES} rows",
        pool.db.rows()
    );
    pool.db.assert_exactly_once(MESSAGES);
    stop_all(workers.into_iter().flatten().collect());
}
