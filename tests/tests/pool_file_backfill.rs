//! A file backfill (a `once` file flow) run by a pool of replicas is read once: only the holder
//! of the flow's turn reads, and when it is SIGKILLed mid-read another replica takes the turn
//! over and reads on from the checkpoint it saved, not from the start.
//!
//! * Three replicas, two files of 100 000 records, the reader killed a third of the way (in the
//!   first file): the records read in total stay close to the records.
//! * Two replicas, three files of 50 000 records, the reader killed once its checkpoint stands
//!   in a later file (the store's checkpoint, read after the kill, names it): the successor
//!   starts from that checkpoint (its log names it) and reads exactly the records after it,
//!   none of the files before (its `sluice_source_records_read_total`, which counts records
//!   skipped as committed too, equals the count after the checkpoint).
//!
//! Real parts: `sluice` processes, PostgreSQL on 127.0.0.1:5432 (a fresh database), JSONL
//! files, and the Pub/Sub emulator for the pipeline's live flow (which keeps the workers running
//! once the backfill is done). Records read are each replica's
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

/// Writes `files` files `part-N.jsonl` of `per_file` records each; returns their glob.
fn write_history(dir: &Workdir, files: usize, per_file: usize) -> String {
    let history = dir.path().join("history");
    std::fs::create_dir_all(&history).unwrap();
    for file in 0..files {
        let mut out = std::io::BufWriter::new(
            std::fs::File::create(history.join(format!("part-{file}.jsonl"))).unwrap(),
        );
        for i in 0..per_file {
            let id = file * per_file + i;
            writeln!(out, r#"{{"id":"r{id}","data":{{"n":{id}}}}}"#).unwrap();
        }
        out.flush().unwrap();
    }
    format!("{}/*.jsonl", history.display())
}

/// One worker per metrics port, each running the backfill of `glob` and a live flow.
fn start_pool(
    dir: &Workdir,
    store: &str,
    glob: &str,
    subscription: &str,
    ports: &[u16],
) -> Vec<Option<Worker>> {
    ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            let file = PipelineYaml::new("test")
                .mode("continuous")
                .store(store)
                .pubsub_emulator()
                .metrics(&format!("127.0.0.1:{port}"))
                .target_table("events")
                .target_table("live_events")
                .flow(FlowYaml::file("backfill", "events", glob).once())
                .flow(FlowYaml::pubsub("live", "live_events", subscription))
                .write(dir.path(), &format!("w{i}.yaml"));
            Some(Worker::start(&file, &format!("w{i}")))
        })
        .collect()
}

/// Records of the backfill a worker read, from its metrics.
fn read(port: u16) -> Option<f64> {
    flow_metric(port, "sluice_source_records_read_total", "backfill")
}

/// The logs of the workers still running.
fn logs(workers: &[Option<Worker>]) -> String {
    workers
        .iter()
        .flatten()
        .map(Worker::logs)
        .collect::<Vec<_>>()
        .join("\n----\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_backfill_in_a_pool_of_three_is_read_once_and_handed_over_on_sigkill() {
    let database = ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let dir = Workdir::new();
    let glob = write_history(&dir, FILES, PER_FILE);
    let pubsub = PubSub::connect().await;
    let (_topic, subscriptions) = pubsub.topic_with("live", 1).await;
    let ports: Vec<u16> = (0..3).map(|_| free_port().unwrap()).collect();
    let mut workers = start_pool(&dir, database.url(), &glob, &subscriptions[0], &ports);

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

/// The file checkpoint in the store: file name, line (records before it in that file).
fn stored_checkpoint(db: &PgDb) -> Option<(String, i64)> {
    let text = db.text(
        "SELECT range_from || '|' || after_b FROM sluice_read_positions WHERE source = 'file'",
    );
    let (path, line) = text.split_once('|')?;
    let name = std::path::Path::new(path).file_name()?.to_str()?.to_owned();
    Some((name, line.parse().ok()?))
}

/// N of `part-N.jsonl`.
fn file_index(name: &str) -> usize {
    name.trim_start_matches("part-")
        .trim_end_matches(".jsonl")
        .parse()
        .unwrap()
}

/// The line a successor's log says it read on from (`reading on from the checkpoint ...`).
fn successor_start(logs: &str) -> Option<(String, i64)> {
    let line = logs
        .lines()
        .find(|l| l.contains("reading on from the checkpoint an earlier reader saved"))?;
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .map(str::to_owned)
    };
    let path = field("path=")?;
    let name = std::path::Path::new(&path)
        .file_name()?
        .to_str()?
        .to_owned();
    Some((name, field("line=")?.parse().ok()?))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kill_in_a_later_file_is_read_on_from_there_and_the_files_before_are_skipped() {
    const LATER_FILES: usize = 3;
    const LATER_PER_FILE: usize = 50_000;
    const LATER_RECORDS: usize = LATER_FILES * LATER_PER_FILE;
    let database = ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let dir = Workdir::new();
    let glob = write_history(&dir, LATER_FILES, LATER_PER_FILE);
    let pubsub = PubSub::connect().await;
    let (_topic, subscriptions) = pubsub.topic_with("live", 1).await;
    let ports: Vec<u16> = (0..2).map(|_| free_port().unwrap()).collect();
    let mut workers = start_pool(&dir, database.url(), &glob, &subscriptions[0], &ports);

    // The reader is killed once its checkpoint has left the first file.
    let mut reader = None;
    let found = eventually(Duration::from_secs(180), || {
        let now: Vec<f64> = ports.iter().map(|p| read(*p).unwrap_or(0.0)).collect();
        let readers: Vec<usize> = (0..2).filter(|i| now[*i] > 0.0).collect();
        assert!(readers.len() <= 1, "more than one replica reads: {now:?}");
        let past_first = stored_checkpoint(&db).is_some_and(|(file, _)| file != "part-0.jsonl");
        reader = readers.first().copied();
        reader.is_some() && past_first
    })
    .await;
    assert!(
        found,
        "the checkpoint never left the first file: {}",
        logs(&workers)
    );
    let reader = reader.unwrap();
    workers[reader].take().unwrap().kill9();
    let rows_at_kill = db.rows();
    let (file, line) = stored_checkpoint(&db).unwrap();
    let index = file_index(&file);
    assert!(
        index >= 1 && rows_at_kill < LATER_RECORDS as i64,
        "the kill landed at {file}:{line} with {rows_at_kill} rows committed, not in a later \
         file mid-read"
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
    db.assert_exactly_once(LATER_RECORDS);

    // The successor starts from the checkpoint the store held after the kill (or from a later
    // one, if a save the reader sent just before its kill landed after that look).
    let survivor = 1 - reader;
    let survivor_logs = workers[survivor].as_ref().unwrap().logs();
    let (start_file, start_line) = successor_start(&survivor_logs)
        .unwrap_or_else(|| panic!("the successor started from the beginning: {survivor_logs}"));
    let start_index = file_index(&start_file);
    assert!(
        (start_index, start_line) >= (index, line),
        "the successor started at {start_file}:{start_line}, before the checkpoint {file}:{line}"
    );
    // What comes after it: the rest of its file and every file after that one.
    let after = (LATER_PER_FILE - usize::try_from(start_line).unwrap())
        + (LATER_FILES - 1 - start_index) * LATER_PER_FILE;
    let survivor_read = read(ports[survivor]).unwrap_or(0.0);
    println!(
        "killed with the checkpoint at {file}:{line} ({rows_at_kill} rows committed); the \
         successor started at {start_file}:{start_line} and read {survivor_read} records, \
         {after} after its start"
    );
    assert_eq!(
        survivor_read, after as f64,
        "the successor read other records than those after its checkpoint: {survivor_logs}"
    );
}
