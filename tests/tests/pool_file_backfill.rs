//! A file backfill (a `once` file flow) run by a pool of three replicas is read once: only the
//! holder of the flow's turn reads, and when it is SIGKILLed mid-read another replica takes
//! the turn over and reads on from the checkpoint it saved, not from the start.
//!
//! Real parts: three `sluice` processes, PostgreSQL on 127.0.0.1:5432 (a fresh database), two
//! JSONL files of 100 000 records each, and the Pub/Sub emulator for the pipeline's live flow
//! (which keeps the workers running once the backfill is done). Records read are each replica's
//! `sluice_source_records_read_total`; the killed reader's is its last scrape, taken just
//! before the kill (what it read in between is not counted: the figure printed says so).
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_bench::free_port;
use sluice_store::ScratchDatabase;
use sluice_tests::{
    FlowYaml, PgDb, PipelineYaml, PubSub, Workdir, Worker, eventually, flow_metric,
};
use std::io::Write;
use std::time::Duration;

const FILES: usize = 2;
const PER_FILE: usize = 100_000;
const RECORDS: usize = FILES * PER_FILE;

fn write_history(dir: &Workdir) -> String {
    let history = dir.path().join("history");
    std::fs::create_dir_all(&history).unwrap();
    for file in 0..FILES {
        let mut out = std::io::BufWriter::new(
            std::fs::File::create(history.join(format!("part-{file}.jsonl"))).unwrap(),
        );
        for i in 0..PER_FILE {
            let id = file * PER_FILE + i;
            writeln!(out, r#"{{"id":"r{id}","data":{{"n":{id}}}}}"#).unwrap();
        }
        out.flush().unwrap();
    }
    format!("{}/*.jsonl", history.display())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_backfill_in_a_pool_of_three_is_read_once_and_handed_over_on_sigkill() {
    let database = ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let dir = Workdir::new();
    let glob = write_history(&dir);
    let pubsub = PubSub::connect().await;
    let (_topic, subscriptions) = pubsub.topic_with("live", 1).await;
    let ports: Vec<u16> = (0..3).map(|_| free_port().unwrap()).collect();
    let mut workers: Vec<Option<Worker>> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            let file = PipelineYaml::new("test")
                .mode("continuous")
                .store(database.url())
                .pubsub_emulator()
                .metrics(&format!("127.0.0.1:{port}"))
                .target_table("events")
                .target_table("live_events")
                .flow(FlowYaml::file("backfill", "events", &glob).once())
                .flow(FlowYaml::pubsub("live", "live_events", &subscriptions[0]))
                .write(dir.path(), &format!("w{i}.yaml"));
            Some(Worker::start(&file, &format!("w{i}")))
        })
        .collect();
    let read = |port: u16| flow_metric(port, "sluice_source_records_read_total", "backfill");

    // The reader: the one replica reading. Killed once it has read a good part, not all.
    let mut reader = None;
    let mut at_kill = vec![0.0; 3];
    let found = eventually(Duration::from_secs(180), || {
        let now: Vec<f64> = ports.iter().map(|p| read(*p).unwrap_or(0.0)).collect();
        let readers: Vec<usize> = (0..3).filter(|i| now[*i] > 0.0).collect();
        assert!(readers.len() <= 1, "more than one replica reads: {now:?}");
        match readers.first() {
            Some(&i) if now[i] >= (RECORDS / 3) as f64 => {
                at_kill = now;
                reader = Some(i);
                true
            }
            _ => false,
        }
    })
    .await;
    let logs = |workers: &[Option<Worker>]| {
        workers
            .iter()
            .flatten()
            .map(Worker::logs)
            .collect::<Vec<_>>()
            .join("\n----\n")
    };
    assert!(
        found,
        "no replica read a third of the files: {}",
        logs(&workers)
    );
    let reader = reader.unwrap();
    workers[reader].take().unwrap().kill9();
    let rows_at_kill = db.rows();
    assert!(
        rows_at_kill < RECORDS as i64,
        "the kill landed after the read had committed everything ({rows_at_kill} rows)"
    );

    let completed = eventually(Duration::from_secs(300), || {
        db.query("SELECT count(*) FROM sluice_completions") == 1
    })
    .await;
    assert!(
        completed,
        "the backfill never completed: {}",
        logs(&workers)
    );
    db.assert_exactly_once(RECORDS);

    // Every survivor gets the turn in the end (the last to find nothing left: it reads none,
    // and its counter appears at 0); after that nobody reads.
    let survivors: Vec<usize> = (0..3).filter(|i| *i != reader).collect();
    let every_turn_taken = eventually(Duration::from_secs(60), || {
        survivors.iter().all(|i| read(ports[*i]).is_some())
    })
    .await;
    assert!(
        every_turn_taken,
        "a survivor never got its turn: {}",
        logs(&workers)
    );
    let after: Vec<f64> = survivors
        .iter()
        .map(|i| read(ports[*i]).unwrap_or(0.0))
        .collect();
    let total = at_kill[reader] + after.iter().sum::<f64>();
    let ratio = total / RECORDS as f64;
    println!(
        "records read: {total} for {RECORDS} records ({ratio:.3}x): the killed reader {} (at \
         its last scrape before the kill, {rows_at_kill} rows committed then), the survivors \
         {after:?}",
        at_kill[reader]
    );
    assert!(
        after.iter().any(|r| *r > 0.0),
        "no survivor read on after the kill"
    );
    let all_logs = logs(&workers);
    assert!(
        all_logs.contains("reading on from the checkpoint an earlier reader saved"),
        "the successor started from the beginning: {all_logs}"
    );
    assert!(ratio <= 1.1, "read {ratio:.3}x the files: {all_logs}");
}
