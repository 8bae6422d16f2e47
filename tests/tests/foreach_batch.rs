//! `foreach_batch` targets end to end: a real gRPC Stage server (tonic, in this test) behind a
//! `sluice` worker reading the emulator.
//!
//! * Every record reaches the Stage once per committed batch, each call's `batch_id` is the one
//!   derived from its keys, and the target's table holds each record once.
//! * A crash between the Stage's answer and the commit: the store is held locked (a write
//!   transaction of this test on the SQLite file: the commit waits), the worker is SIGKILLed
//!   after the Stage answered, the lock released, a new worker started: the Stage receives the
//!   same batch id with the same records again, and the table holds each record once.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::stage_server::{StageCall, stage_server};
use sluice_tests::{
    Db, FlowYaml, PipelineYaml, PubSub, Workdir, Worker, event, events_with_duplicates, eventually,
};
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

fn pipeline(
    dir: &Path,
    db: &Path,
    stage: SocketAddr,
    subscription: &str,
    max_messages: usize,
    max_delay: &str,
) -> std::path::PathBuf {
    let stage = format!("{{ endpoint: \"http://{stage}\" }}");
    PipelineYaml::new("test")
        .sqlite(db)
        .pubsub_emulator()
        .target("enrich", "foreach_batch", &stage)
        .flow(
            FlowYaml::pubsub("live", "enrich", subscription)
                .dedup_attribute("event_id")
                .batch(max_messages, max_delay)
                .streams(1),
        )
        .write(dir, "p.yaml")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_reaches_the_stage_once_per_committed_batch() {
    let (stage, recorder) = stage_server().await;
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("foreach", 1).await;
    let dir = Workdir::new();
    let db = dir.db("foreach");
    let file = pipeline(dir.path(), &db, stage, &subs[0], 200, "20ms");
    let worker = Worker::start(&file, "worker");
    pubsub
        .publish(&topic, events_with_duplicates("e", 2_000, 200))
        .await;
    let store = Db(db);
    let rows = || store.query("SELECT COUNT(*) FROM test__enrich");
    let done = eventually(Duration::from_secs(120), || rows() == 2_000).await;
    assert!(done, "rows {}; logs:\n{}", rows(), worker.logs());
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(60)).success());

    assert_eq!(
        store.query("SELECT COUNT(DISTINCT dedup_key) FROM test__enrich"),
        2_000
    );
    let calls = recorder.calls();
    let mut times_seen: HashMap<String, usize> = HashMap::new();
    for call in &calls {
        assert_eq!(call.flow, "live");
        assert_eq!(
            call.batch_id,
            sluice_engine::batch_id(call.keys.iter().map(String::as_str)),
            "the batch id is the one derived from its keys"
        );
        for key in &call.keys {
            *times_seen.entry(key.clone()).or_default() += 1;
        }
    }
    assert_eq!(times_seen.len(), 2_000, "every record reached the stage");
    let repeated: Vec<_> = times_seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "records sent twice with no failure: {repeated:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_stage_answer_and_the_commit_resends_the_same_batch_id() {
    let (stage, recorder) = stage_server().await;
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("foreach-crash", 1).await;
    let dir = Workdir::new();
    let db = dir.db("crash");
    // Exactly one batch of 50: it closes when its 50th message arrives, after the crash too.
    let file = pipeline(dir.path(), &db, stage, &subs[0], 50, "30s");
    let worker = Worker::start(&file, "first");
    let started = eventually(Duration::from_secs(60), || {
        worker.logs().contains("flow started")
    })
    .await;
    assert!(started, "{}", worker.logs());

    // Hold the store's write lock: the worker's commit waits behind it.
    let lock = rusqlite::Connection::open(&db).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    pubsub
        .publish(&topic, (0..50).map(|i| event(&format!("c{i}"))).collect())
        .await;
    let answered = eventually(Duration::from_secs(60), || !recorder.calls().is_empty()).await;
    assert!(
        answered,
        "the stage was never called; logs:\n{}",
        worker.logs()
    );
    let first = recorder.calls()[0].clone();
    assert_eq!(first.keys.len(), 50, "{first:?}");
    // The stage answered; the commit is stuck behind the lock. Crash now.
    worker.kill9();
    lock.execute_batch("ROLLBACK").unwrap();
    drop(lock);
    let store = Db(db.clone());
    assert_eq!(
        store.query("SELECT COUNT(*) FROM test__enrich"),
        0,
        "nothing was committed"
    );
    let calls_before = recorder.calls().len();

    let worker = Worker::start(&file, "second");
    let rows = || store.query("SELECT COUNT(*) FROM test__enrich");
    let done = eventually(Duration::from_secs(180), || rows() == 50).await;
    assert!(done, "rows {}; logs:\n{}", rows(), worker.logs());
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(60)).success());

    let calls = recorder.calls();
    let after: Vec<&StageCall> = calls[calls_before..].iter().collect();
    assert!(!after.is_empty(), "the batch was not sent again");
    let first_keys: BTreeSet<&String> = first.keys.iter().collect();
    for call in &after {
        assert_eq!(
            call.batch_id, first.batch_id,
            "a different batch id after the crash: {call:?}"
        );
        assert_eq!(call.keys.iter().collect::<BTreeSet<_>>(), first_keys);
    }
    assert_eq!(
        store.query("SELECT COUNT(DISTINCT dedup_key) FROM test__enrich"),
        50
    );
}

/// A scheduled run's data interval reaches the Stage: a `foreach_batch` target fed by a file
/// flow on a `data_interval` schedule (`every: 2s`, caught up from a `start_date` 10 s back)
/// gets, with each batch, the interval of the run it belongs to, and every record of the
/// batch has its event time in it. Every record of the file reaches the Stage once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_runs_interval_reaches_the_stage_with_its_records() {
    let (stage, recorder) = stage_server().await;
    let dir = Workdir::new();
    let db = dir.db("intervals");
    let start = (sluice_tests::now_ms() - 10_000) / 1_000 * 1_000;
    let events: Vec<i64> = (0..100).map(|i| start + i * 100).collect();
    let glob = dir.events_file(&events);
    let start_date = jiff::Timestamp::from_millisecond(start).unwrap();
    let file = PipelineYaml::new("test")
        .mode("triggered")
        .sqlite(&db)
        .schedule(&format!(
            "{{ every: 2s, semantics: data_interval, catchup: true, start_date: \"{start_date}\" }}"
        ))
        .target(
            "enrich",
            "foreach_batch",
            &format!("{{ endpoint: \"http://{stage}\" }}"),
        )
        .flow(FlowYaml::file("events", "enrich", &glob))
        .write(dir.path(), "p.yaml");
    let worker = Worker::start(&file, "worker");
    let store = Db(db);
    let rows = || store.query("SELECT COUNT(*) FROM test__enrich");
    let done = eventually(Duration::from_secs(120), || rows() == 100).await;
    assert!(done, "rows {}; logs:\n{}", rows(), worker.logs());
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(60)).success());

    let calls = recorder.calls();
    let mut keys = BTreeSet::new();
    for call in &calls {
        let (from, to) = call
            .interval
            .expect("each batch carries its run's interval");
        assert_eq!(to - from, 2_000, "{call:?}");
        assert!(
            call.event_times.iter().all(|t| from <= *t && *t < to),
            "a record outside its run's interval: {call:?}"
        );
        keys.extend(call.keys.iter().cloned());
    }
    assert_eq!(keys.len(), 100, "every record reached the stage");
    let intervals: BTreeSet<_> = calls.iter().filter_map(|c| c.interval).collect();
    assert!(
        intervals.len() >= 5,
        "runs of several intervals: {intervals:?}"
    );
}
