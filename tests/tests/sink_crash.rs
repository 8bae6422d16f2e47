//! `sink` targets under SIGKILL: two replicas on one host write JSONL files into one folder
//! while one of them is killed three times at random moments and restarted (each restart
//! resolves the killed worker's leftover files, and may meet the other worker's files in
//! flight). At the end every distinct record is in exactly one published file, none twice,
//! no temporary file is left, and the target's store table agrees.
//!
//! Real parts: the Pub/Sub emulator, `sluice` processes, a SQLite store shared by both, files.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::{
    Db, FlowYaml, PipelineYaml, PubSub, Workdir, Worker, events_with_duplicates, eventually,
};
use std::collections::HashMap;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread")]
async fn sink_files_hold_each_record_once_across_sigkills() {
    const DISTINCT: usize = 10_000;
    const DUPLICATES: usize = 1_000;
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("sink", 1).await;
    let dir = Workdir::new();
    let db = dir.db("sink");
    let out = dir.path().join("out");
    let sink = format!(
        "{{ format: jsonl, path: \"{}/events.jsonl\" }}",
        out.display()
    );
    let file = PipelineYaml::new("test")
        .sqlite(&db)
        .pubsub_emulator()
        .target("export", "sink", &sink)
        .flow(
            FlowYaml::pubsub("live", "export", &subs[0])
                .dedup_attribute("event_id")
                .batch(300, "20ms")
                .streams(4),
        )
        .write(dir.path(), "p.yaml");
    let store = Db(db);
    let rows = || store.query("SELECT COUNT(*) FROM test__export");

    let anchor = Worker::start(&file, "anchor");
    let mut victim = Worker::start(&file, "victim-0");
    let messages = events_with_duplicates("s", DISTINCT, DUPLICATES);
    let publisher = {
        let pubsub = PubSub::connect().await;
        let topic = topic.clone();
        let chunks: Vec<Vec<_>> = messages.chunks(1_000).map(|c| c.to_vec()).collect();
        tokio::spawn(async move {
            for chunk in chunks {
                pubsub.publish(&topic, chunk).await;
                tokio::time::sleep(Duration::from_millis(700)).await;
            }
        })
    };
    for kill in 1..=3 {
        tokio::time::sleep(Duration::from_millis(rand::random_range(1_000..3_000))).await;
        victim.kill9();
        victim = Worker::start(&file, &format!("victim-{kill}"));
    }
    publisher.await.unwrap();
    let landed = eventually(Duration::from_secs(600), || rows() >= DISTINCT as i64).await;
    assert!(
        landed,
        "only {} rows; anchor logs:\n{}",
        rows(),
        anchor.logs()
    );
    // Let the killed workers' redeliveries arrive and be found duplicates.
    tokio::time::sleep(Duration::from_secs(20)).await;
    anchor.terminate();
    victim.terminate();
    assert!(anchor.wait(Duration::from_secs(60)).success());
    assert!(victim.wait(Duration::from_secs(60)).success());
    assert_eq!(rows(), DISTINCT as i64);

    // The killed workers' leftovers were resolved when they restarted; the clean stops leave
    // none. (A victim killed during a commit leaves a temporary file its restart resolves.)
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut files = 0;
    for entry in std::fs::read_dir(&out).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!name.ends_with(".tmp"), "temporary file left: {name}");
        assert!(
            name.starts_with("events-live-") && name.ends_with(".jsonl"),
            "{name}"
        );
        files += 1;
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let record: serde_json::Value = serde_json::from_str(line).unwrap();
            *seen
                .entry(record["id"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
    }
    assert!(files > 1, "one file per committed batch");
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(twice.is_empty(), "records in two files: {twice:?}");
    assert_eq!(seen.len(), DISTINCT, "every record in a file");
}
