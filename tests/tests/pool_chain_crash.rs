//! A continuous chain in a pool under SIGKILL: three worker processes on one PostgreSQL store
//! run `ingest` (Pub/Sub -> `bronze`), `refine` (follows `bronze` -> `silver`) and `out`
//! (follows `silver` -> a foreach_batch gRPC stage in this test), while 50 000 distinct events
//! and 5 000 publisher duplicates are published and replicas are SIGKILLed and restarted.
//!
//! What must hold: every record exactly once in `bronze`, `silver` and the export's table; the
//! stage receives every record, and a record it receives again (a page replayed after a kill
//! between the stage's answer and the commit) comes with the same batch id and the same
//! records as before.
//!
//! Where the kills landed, shown rather than assumed: every other kill is aimed at the holder
//! of a `feed/<flow>` lease (read from the store just before), so the reading of a table
//! changes hands; the test records each lease's holders over time and requires both feeds to
//! have been read by at least two workers.
//!
//! Real parts: the Pub/Sub emulator, PostgreSQL on 127.0.0.1:5432 (a fresh database, dropped
//! at the end), a real gRPC server. Emulator stall (see ARCHITECTURE.md): a killed worker's
//! messages come back after their stream's ack deadline, so the timeouts leave room for that.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::stage_server::stage_server;
use sluice_tests::{
    FlowYaml, PgDb, PipelineYaml, PubSub, Workdir, Worker, events_with_duplicates, eventually,
    publish_in_chunks, stop_all,
};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

const DISTINCT: usize = 50_000;
const DUPLICATES: usize = 5_000;
const KILLS: usize = 6;
const FEEDS: [&str; 2] = ["feed/refine", "feed/out"];

#[tokio::test(flavor = "multi_thread")]
async fn a_chain_in_a_pool_under_sigkill_lands_every_record_once_at_every_stage() {
    let (stage, recorder) = stage_server().await;
    let database = sluice_store::ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("chain-pool", 1).await;
    let dir = Workdir::new();
    // A small connection pool: this test runs beside the `postgres-workers` group.
    let store_url = format!("{}?pool_size=4", database.url());
    let file = PipelineYaml::new("test")
        .store(&store_url)
        .pubsub_emulator()
        .target_table("bronze")
        .target_table("silver")
        .target(
            "export",
            "foreach_batch",
            &format!("{{ endpoint: \"http://{stage}\" }}"),
        )
        .flow(FlowYaml::pubsub("ingest", "bronze", &subs[0]).dedup_attribute("event_id"))
        .flow(FlowYaml::table("refine", "silver", "bronze"))
        .flow(FlowYaml::table("out", "export", "silver"))
        .write(dir.path(), "p.yaml");

    let mut workers: Vec<Worker> = (0..3)
        .map(|i| Worker::start(&file, &format!("w{i}-0")))
        .collect();
    let messages = events_with_duplicates("c", DISTINCT, DUPLICATES);
    let publisher = publish_in_chunks(&topic, messages, 5_000, Duration::from_millis(500)).await;
    let holder = |role: &str| {
        db.text(&format!(
            "SELECT holder FROM sluice_leases WHERE pipeline = 'test' AND role = '{role}'
               AND expires_at > now()"
        ))
    };
    let mut holders: HashMap<&str, HashSet<String>> = HashMap::new();
    let note_holders = |holders: &mut HashMap<&str, HashSet<String>>| {
        for role in FEEDS {
            let now = holder(role);
            if !now.is_empty() {
                holders.entry(role).or_default().insert(now);
            }
        }
    };
    for kill in 1..=KILLS {
        tokio::time::sleep(Duration::from_millis(rand::random_range(3_000..6_000))).await;
        note_holders(&mut holders);
        // Every other kill is aimed at the holder of a feed's lease.
        let aimed = (kill % 2 == 0).then(|| holder(FEEDS[kill / 2 % 2]));
        // A worker's id is `<host>-<pid>-<random>`.
        let victim = aimed
            .and_then(|id| {
                let pid: u32 = id.rsplit('-').nth(1)?.parse().ok()?;
                workers.iter().position(|w| w.pid() == pid)
            })
            .unwrap_or_else(|| rand::random_range(0..workers.len()));
        let name = format!("w{victim}-{kill}");
        let restarted = Worker::start(&file, &name);
        std::mem::replace(&mut workers[victim], restarted).kill9();
    }
    publisher.await.unwrap();

    let exported = || db.query("SELECT count(*) FROM test__export");
    let landed = eventually(Duration::from_secs(600), || {
        note_holders(&mut holders);
        exported() >= DISTINCT as i64
    })
    .await;
    assert!(
        landed,
        "only {} of {DISTINCT} exported; holders {holders:?}; logs of every worker:\n{}",
        exported(),
        workers
            .iter()
            .map(|w| w.logs())
            .collect::<Vec<_>>()
            .join("\n----\n")
    );
    // A killed holder's feed lease changes hands within its time to live; with the emulator
    // fast, the export can finish before that, so the holders are looked at a while longer.
    eventually(Duration::from_secs(60), || {
        note_holders(&mut holders);
        FEEDS
            .iter()
            .all(|role| holders.get(role).is_some_and(|seen| seen.len() >= 2))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    stop_all(workers);

    for table in ["test__bronze", "test__silver", "test__export"] {
        assert_eq!(
            db.query(&format!("SELECT count(*) FROM {table}")),
            DISTINCT as i64,
            "{table}: a row per record"
        );
        assert_eq!(
            db.query(&format!("SELECT count(DISTINCT dedup_key) FROM {table}")),
            DISTINCT as i64,
            "{table}: each record once"
        );
    }
    assert_eq!(db.query("SELECT count(*) FROM test__dead_letter"), 0);

    // The stage: every record, and a record received again only in the same batch.
    let calls = recorder.calls();
    let mut batches: HashMap<String, BTreeSet<String>> = HashMap::new();
    let mut batch_of: HashMap<String, String> = HashMap::new();
    let mut resent = 0usize;
    for call in calls.iter().filter(|c| c.flow == "out") {
        let keys: BTreeSet<String> = call.keys.iter().cloned().collect();
        assert_eq!(keys.len(), call.keys.len(), "a record twice in one batch");
        match batches.get(&call.batch_id) {
            Some(before) => {
                assert_eq!(
                    before, &keys,
                    "batch {} came with other records",
                    call.batch_id
                );
                resent += 1;
            }
            None => {
                batches.insert(call.batch_id.clone(), keys.clone());
            }
        }
        for key in keys {
            let first = batch_of.entry(key.clone()).or_insert(call.batch_id.clone());
            assert_eq!(first, &call.batch_id, "record {key} came in two batches");
        }
    }
    assert_eq!(batch_of.len(), DISTINCT, "every record reached the stage");
    for role in FEEDS {
        let seen = holders.get(role).cloned().unwrap_or_default();
        println!("{role} was read by {seen:?}");
        assert!(
            seen.len() >= 2,
            "{role} never changed hands, so no kill hit its reader: {seen:?}"
        );
    }
    println!("batches resent after a kill: {resent}");
}
