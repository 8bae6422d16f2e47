//! A triggered run with a `window` target on PostgreSQL ends with every window emitted, the
//! trailing ones no watermark passed included ("every window": the store's emission up to
//! `i64::MAX`, past the latest time PostgreSQL's `timestamptz` holds), each count equal to
//! what the input held:
//!
//! 1. a `once` Pub/Sub flow with `watermark:` writing the window target, drained (real
//!    emulator);
//! 2. a window over a `table` source whose only writer is a file flow (no emulator).
//!
//! Both failed on the store before "every window" was bounded by the latest `timestamptz`
//! (`22008: timestamp out of range`, the emission retried until the run was killed).
#![allow(clippy::unwrap_used, missing_docs)]

use google_cloud_pubsub::model::Message;
use sluice_tests::{FlowYaml, PROJECT, PgDb, PipelineYaml, PubSub, Workdir, Worker, now_ms};
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

const WINDOW_MS: i64 = 10_000;

/// Counts per `(window_start, group)`.
type Counts = BTreeMap<(i64, String), i64>;

/// The counts table `test__<target>__windows`, each row checked to be one window long.
fn emitted(db: &PgDb, target: &str) -> Counts {
    let text = db.text(&format!(
        "SELECT string_agg(window_start || ',' || window_end || ',' || count || ',' || group_key,
                           ';' ORDER BY window_start, group_key)
         FROM test__{target}__windows"
    ));
    text.split(';')
        .filter(|row| !row.is_empty())
        .map(|row| {
            let mut fields = row.splitn(4, ',');
            let mut number = || fields.next().unwrap().parse::<i64>().unwrap();
            let (start, end, count) = (number(), number(), number());
            assert_eq!(end - start, WINDOW_MS, "{row}");
            ((start, fields.next().unwrap().to_owned()), count)
        })
        .collect()
}

/// Runs the pipeline file to its end and returns the worker's output and logs.
fn run_to_end(file: &std::path::Path) -> String {
    let worker = Worker::start(file, "triggered");
    let (out, err) = (worker.stdout.clone(), worker.stderr.clone());
    let status = worker.wait(Duration::from_secs(60));
    let output = std::fs::read_to_string(out).unwrap() + &std::fs::read_to_string(err).unwrap();
    assert!(status.success(), "{output}");
    output
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_pubsub_flow_emits_every_window() {
    let database = sluice_store::ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let pubsub = PubSub::connect().await;
    // The tracking subscription exists before the messages are published, so it sees them all.
    let (topic, subs) = pubsub.topic_with("winpg", 2).await;
    let mut expected = Counts::new();
    let now = now_ms();
    let messages: Vec<Message> = (0..600)
        .map(|n| {
            // The last one is now: its window is one no watermark passes before the drain.
            let ts = if n == 0 {
                now
            } else {
                now - rand::random_range(0..60_000)
            };
            let region = (n % 10 != 0).then(|| format!("r{}", n % 3));
            *expected
                .entry((
                    ts - ts.rem_euclid(WINDOW_MS),
                    region.clone().unwrap_or_default(),
                ))
                .or_default() += 1;
            let mut attributes = vec![
                ("event_id".to_owned(), format!("w{n}")),
                ("ts".to_owned(), ts.to_string()),
            ];
            attributes.extend(region.map(|r| ("region".to_owned(), r)));
            Message::new()
                .set_data(bytes::Bytes::from_static(b"{}"))
                .set_attributes(attributes)
        })
        .collect();
    pubsub.publish(&topic, messages).await;
    let dir = Workdir::new();
    // `once: true`: the worker takes a drained flow's input as ended (every window emitted)
    // only for a once flow; without it the last emission is the watermark's.
    let file = PipelineYaml::new("test")
        .mode("triggered")
        .store(database.url())
        .pubsub_emulator()
        .target_window("per10s", "10s", "attribute:region", "0s")
        .flow(
            FlowYaml::pubsub("counts", "per10s", &subs[0])
                .once()
                .dedup_attribute("event_id")
                .event_time_attribute("ts")
                .drain_idle("3s")
                .watermark(&subs[1], "10s"),
        )
        .write(dir.path(), "p.yaml");
    let output = run_to_end(&file);
    assert_eq!(
        db.query("SELECT count(*) FROM test__per10s"),
        600,
        "{output}"
    );
    assert_eq!(emitted(&db, "per10s"), expected, "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_over_a_file_flows_table_emits_every_window() {
    let database = sluice_store::ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let dir = Workdir::new();
    let history = dir.path().join("history.jsonl");
    let mut expected = Counts::new();
    let mut lines = std::io::BufWriter::new(std::fs::File::create(&history).unwrap());
    let start = now_ms() - 3_600_000;
    for i in 0..500i64 {
        let event_time = start + i * 237;
        let region = format!("r{}", i % 4);
        *expected
            .entry((
                event_time - event_time.rem_euclid(WINDOW_MS),
                region.clone(),
            ))
            .or_default() += 1;
        writeln!(
            lines,
            "{{\"id\":\"h{i}\",\"data\":{{\"n\":{i}}},\"attributes\":{{\"region\":\"{region}\"}},\"event_time\":{event_time}}}"
        )
        .unwrap();
    }
    lines.flush().unwrap();
    let file = PipelineYaml::new("test")
        .mode("triggered")
        .store(database.url())
        .pubsub(PROJECT, "http://127.0.0.1:9")
        .target_table("events")
        .target_window("per10s", "10s", "attribute:region", "2s")
        .flow(FlowYaml::file(
            "backfill",
            "events",
            &history.display().to_string(),
        ))
        .flow(FlowYaml::table("counts", "per10s", "events"))
        .write(dir.path(), "p.yaml");
    let output = run_to_end(&file);
    assert_eq!(db.rows(), 500, "{output}");
    assert_eq!(emitted(&db, "per10s"), expected, "{output}");
}
