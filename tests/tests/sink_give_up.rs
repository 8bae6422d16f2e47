//! A `sink` flow on PostgreSQL that gives up at shutdown while its batch's COMMIT is still
//! running on the server: the committed records must end in a published file. The worker may
//! only decide "not committed" (and delete the file) once that transaction has ended.
//!
//! Real parts: the Pub/Sub emulator, a `sluice` process, PostgreSQL on 127.0.0.1:5432 (a fresh
//! database), files. The slow COMMIT is made with a deferred constraint trigger on
//! `sluice_commit_marks` that sleeps at commit time (a fault the server cannot be asked for
//! otherwise); the test proves its timing by the temporary file being there before the signal.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_store::FlowStore;
use sluice_store::{PostgresStore, ScratchDatabase};
use sluice_tests::{FlowYaml, PgDb, PipelineYaml, PubSub, Workdir, Worker, event, eventually};
use std::path::Path;
use std::time::Duration;

const MESSAGES: usize = 20;

fn files(dir: &Path, hidden: bool) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .filter(|name| name.starts_with('.') == hidden)
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_give_up_during_a_slow_commit_still_publishes_the_committed_file() {
    let database = ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    // Migrate first, then make every commit that records a sink mark sleep 22 s at COMMIT:
    // past the worker's 15 s drain give-up, before its hard exit 10 s later.
    let store = PostgresStore::open(database.url()).unwrap();
    store
        .prepare(&sluice_store::Layout {
            pipeline: "test".into(),
            tables: vec!["export".into()],
            typed: Vec::new(),
            flows: vec!["live".into()],
        })
        .await
        .unwrap();
    let (client, connection) = tokio_postgres::connect(database.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(
            "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN PERFORM pg_sleep(22); RETURN NULL; END $$;
             CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON sluice_commit_marks
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();",
        )
        .await
        .unwrap();

    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("sinkgiveup", 1).await;
    let dir = Workdir::new();
    let out = dir.path().join("out");
    let sink = format!(
        "{{ format: jsonl, path: \"{}/events.jsonl\" }}",
        out.display()
    );
    let file = PipelineYaml::new("test")
        .store(database.url())
        .pubsub_emulator()
        .target("export", "sink", &sink)
        .flow(
            FlowYaml::pubsub("live", "export", &subs[0])
                .dedup_attribute("event_id")
                .batch(100, "200ms")
                .streams(1),
        )
        .write(dir.path(), "p.yaml");
    let worker = Worker::start(&file, "w");
    pubsub
        .publish(
            &topic,
            (0..MESSAGES).map(|i| event(&format!("s{i}"))).collect(),
        )
        .await;
    // The batch's file is written inside the transaction: its COMMIT is now sleeping.
    let in_commit = eventually(Duration::from_secs(60), || {
        files(&out, true).iter().any(|n| n.ends_with(".tmp"))
    })
    .await;
    assert!(in_commit, "no commit began:\n{}", worker.logs());
    assert_eq!(
        db.query("SELECT count(*) FROM test__export"),
        0,
        "not committed yet"
    );
    worker.terminate();
    let status = worker.wait(Duration::from_secs(60));
    let rows = db.query("SELECT count(*) FROM test__export");
    let published: usize = files(&out, false)
        .iter()
        .map(|name| {
            std::fs::read_to_string(out.join(name))
                .unwrap()
                .lines()
                .count()
        })
        .sum();
    println!(
        "exit {status:?}; rows committed {rows}; records in published files {published}; \
         left hidden: {:?}",
        files(&out, true)
    );
    assert_eq!(rows, MESSAGES as i64, "the slow commit landed");
    assert_eq!(
        published,
        MESSAGES,
        "every committed record is in a published file (hidden files left: {:?})",
        files(&out, true)
    );
}
