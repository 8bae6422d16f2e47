//! No pool-wide stall from pages waiting for each other: a chain of three table-reading flows
//! on one worker with the default pool of eight connections (`ingest` Pub/Sub -> `bronze`,
//! `refine` -> `silver`, `upgrade` -> `gold`, `out` -> a foreach_batch stage that answers
//! within 0–200 ms), its PostgreSQL link blackholed for 3 s and then cut (every connection
//! reset, so everything retries at once) twenty times while the events flow. Each reading flow commits several pages at once, each page waiting for the one before
//! it; a page that waited with its transaction open would hold a connection the page before it
//! needs, and three flows' waiters could hold them all.
//!
//! What must hold: the export moves again after every blackhole, and every record lands once
//! in every table and reaches the stage (a record the stage gets again comes in the same
//! batch).
//!
//! Real parts: the Pub/Sub emulator, PostgreSQL on 127.0.0.1:5432 (a fresh database), one
//! `sluice` worker, a real gRPC stage server. A fake in addition: the TCP fault proxy between
//! the worker and PostgreSQL, the only way to make the server go silent for one client.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::stage_server::stage_server;
use sluice_tests::{
    FaultProxy, FlowYaml, PgDb, PipelineYaml, PubSub, Workdir, Worker, event, eventually,
    publish_in_chunks, stop_all,
};
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

const EVENTS: usize = 20_000;
const BLACKHOLES: usize = 20;
const BLACKHOLE: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread")]
async fn three_reading_flows_under_store_blackholes_move_on_and_land_each_record_once() {
    let (stage, recorder) = stage_server().await;
    recorder.answer_within(Duration::from_millis(200));
    let database = sluice_store::ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let proxy = FaultProxy::start("127.0.0.1:5432".parse().unwrap());
    let store = database
        .url()
        .replace("127.0.0.1:5432", &proxy.addr().to_string());
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("gates", 1).await;
    let dir = Workdir::new();
    let file = PipelineYaml::new("test")
        .store(&store)
        .pubsub_emulator()
        .target_table("bronze")
        .target_table("silver")
        .target_table("gold")
        .target(
            "export",
            "foreach_batch",
            &format!("{{ endpoint: \"http://{stage}\" }}"),
        )
        .flow(FlowYaml::pubsub("ingest", "bronze", &subs[0]).dedup_attribute("event_id"))
        .flow(FlowYaml::table("refine", "silver", "bronze"))
        .flow(FlowYaml::table("upgrade", "gold", "silver"))
        .flow(FlowYaml::table("out", "export", "gold"))
        .write(dir.path(), "p.yaml");
    let worker = Worker::start(&file, "w");
    let publisher = publish_in_chunks(
        &topic,
        (0..EVENTS).map(|i| event(&format!("e{i}"))).collect(),
        500,
        Duration::from_millis(1_500),
    )
    .await;
    let exported = || db.query("SELECT count(*) FROM test__export");
    assert!(
        eventually(Duration::from_secs(120), || exported() > 0).await,
        "nothing exported: {}",
        worker.logs()
    );

    // Each blackhole, then the export must move again within a minute.
    let mut stalls = Vec::new();
    for round in 0..BLACKHOLES {
        proxy.blackhole();
        tokio::time::sleep(BLACKHOLE).await;
        // Every connection dropped at once: each committer, reader and heartbeat retries
        // together, the moment pages waiting for each other race for the pool.
        proxy.reset();
        let before = exported();
        if before >= EVENTS as i64 {
            break;
        }
        let healed = Instant::now();
        let moved = eventually(Duration::from_secs(60), || exported() > before).await;
        assert!(
            moved,
            "round {round}: the export stayed at {before} for a minute after the store came \
             back; idle-in-transaction sessions: {}; logs:\n{}",
            db.query(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND state = 'idle in transaction'"
            ),
            worker.logs()
        );
        stalls.push(healed.elapsed());
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    publisher.await.unwrap();
    println!("the export moved again after each blackhole within {stalls:?}");
    assert!(
        eventually(Duration::from_secs(300), || exported() >= EVENTS as i64).await,
        "{} of {EVENTS} exported; logs:\n{}",
        exported(),
        worker.logs()
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    let logs = stop_all(vec![worker]).join("\n");
    assert!(
        logs.contains("store unavailable"),
        "the blackholes reached the commits: {logs}"
    );
    for table in ["test__bronze", "test__silver", "test__gold", "test__export"] {
        assert_eq!(
            db.query(&format!("SELECT count(*) FROM {table}")),
            EVENTS as i64,
            "{table}: a row per record"
        );
        assert_eq!(
            db.query(&format!("SELECT count(DISTINCT dedup_key) FROM {table}")),
            EVENTS as i64,
            "{table}: each record once"
        );
    }
    let mut batches: HashMap<String, BTreeSet<String>> = HashMap::new();
    let mut batch_of: HashMap<String, String> = HashMap::new();
    for call in recorder.calls().iter().filter(|c| c.flow == "out") {
        let keys: BTreeSet<String> = call.keys.iter().cloned().collect();
        if let Some(before) = batches.get(&call.batch_id) {
            assert_eq!(
                before, &keys,
                "batch {} came with other records",
                call.batch_id
            );
        }
        batches.insert(call.batch_id.clone(), keys.clone());
        for key in keys {
            let first = batch_of.entry(key.clone()).or_insert(call.batch_id.clone());
            assert_eq!(first, &call.batch_id, "record {key} came in two batches");
        }
    }
    assert_eq!(batch_of.len(), EVENTS, "every record reached the stage");
}
