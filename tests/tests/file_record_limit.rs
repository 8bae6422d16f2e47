//! A file line longer than the file source's `max_record_bytes` is a dead letter
//! (`record_too_large`) and the read goes on, without the worker ever holding the line.
//!
//! Real parts: the `sluice` binary on a SQLite store, JSONL files on disk.
//!
//! * With the default limit (10 MB), a 256 MiB line between ordinary records: every ordinary
//!   record is a row, the line is one dead letter keyed `FILE:LINE`, and the worker's peak
//!   resident memory stays under half the line's size. The peak is the kernel's own figure
//!   (`VmHWM` in `/proc/PID/status`), read once the backfill is complete; a second flow
//!   following the target's table keeps the worker running until then.
//! * With `max_record_bytes: 1KiB` in the file, a line of 5 000 bytes is a dead letter that
//!   names the file, the line, its byte offset and size; a second run of the flow (it is not
//!   `once`, so each run re-reads the file) finds that dead letter committed and adds nothing.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::{Db, FlowYaml, PipelineYaml, Workdir, Worker, eventually};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The over-long line of the memory test.
const BIG_LINE: usize = 256 * 1024 * 1024;

/// Ordinary records before and after the over-long line.
const AROUND: usize = 100;

/// Ordinary record `i`, with its newline.
fn record(i: usize) -> String {
    format!("{{\"id\":\"r{i}\",\"data\":{{\"n\":{i}}}}}\n")
}

/// Writes `before` records, then `line` (its own line), then `after` records to `path`;
/// records are numbered from `first`.
fn write_file(path: &Path, first: usize, before: usize, line: &[u8], after: usize) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for i in first..first + before {
        out.write_all(record(i).as_bytes()).unwrap();
    }
    out.write_all(line).unwrap();
    out.write_all(b"\n").unwrap();
    for i in first + before..first + before + after {
        out.write_all(record(i).as_bytes()).unwrap();
    }
    out.flush().unwrap();
}

/// A record whose `data` is a base64 string of `len` bytes: `{"id":"big","data":"xxxx…"}`.
fn long_record(len: usize) -> Vec<u8> {
    let mut line = br#"{"id":"big","data":""#.to_vec();
    line.resize(line.len() + len, b'x');
    line.extend_from_slice(br#""}"#);
    line
}

/// The peak resident set of process `pid` so far (bytes), from `/proc/PID/status`.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .unwrap_or_else(|| panic!("no VmHWM in {status}"));
    let kib: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kib * 1024
}

/// The one dead letter of the pipeline `test`: key, reason, error, data length.
fn dead_letter(db: &Path) -> (String, String, String, usize) {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row(
        "SELECT dedup_key, reason, error, length(data) FROM test__dead_letter",
        [],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
    )
    .unwrap()
}

/// A triggered pipeline `test` of one flow into target `events`.
fn pipeline(dir: &Workdir, db: &Path, flow: FlowYaml) -> PathBuf {
    PipelineYaml::new("test")
        .mode("triggered")
        .sqlite(db)
        .target_table("events")
        .flow(flow)
        .write(dir.path(), "p.yaml")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_of_256_mib_is_a_dead_letter_and_the_worker_never_holds_it() {
    let dir = Workdir::new();
    let history = dir.path().join("history");
    std::fs::create_dir_all(&history).unwrap();
    let first = history.join("a.jsonl");
    write_file(&first, 0, AROUND, &long_record(BIG_LINE), AROUND);
    write_file(&history.join("b.jsonl"), 2 * AROUND, AROUND, b"", 0);
    let glob = history.join("*.jsonl").display().to_string();
    let db_path = dir.db("limit");
    let file = PipelineYaml::new("test")
        .mode("continuous")
        .sqlite(&db_path)
        .target_table("events")
        .target_table("copies")
        .flow(FlowYaml::file("backfill", "events", &glob).once())
        .flow(FlowYaml::table("copy", "copies", "events"))
        .write(dir.path(), "p.yaml");
    let db = Db(db_path.clone());

    let worker = Worker::start(&file, "worker");
    let completed = eventually(Duration::from_secs(600), || {
        db.query("SELECT count(*) FROM sluice_completions") == 1
    })
    .await;
    assert!(completed, "the backfill never completed\n{}", worker.logs());
    let peak = peak_rss(worker.pid());
    let logs = worker.logs();
    worker.terminate();
    println!(
        "worker peak RSS {:.1} MiB reading a line of {} MiB",
        peak as f64 / (1024.0 * 1024.0),
        BIG_LINE / (1024 * 1024)
    );
    assert!(
        peak < (BIG_LINE / 2) as u64,
        "the worker's peak RSS was {peak} bytes for a line of {BIG_LINE} bytes: it held the line"
    );

    let records = 3 * AROUND as i64;
    assert_eq!(
        (db.rows(), db.distinct_keys()),
        (records, records),
        "every ordinary record once\n{logs}"
    );
    assert_eq!(db.dead_letters(), 1, "{logs}");
    let (key, reason, error, data) = dead_letter(&db_path);
    let line = AROUND + 1;
    assert_eq!(key, format!("{}:{line}", first.display()));
    assert_eq!(reason, "record_too_large");
    let size = long_record(BIG_LINE).len();
    assert!(error.contains(&size.to_string()), "{error}");
    assert!(
        data < 10_000,
        "the dead letter holds {data} bytes of the line"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_record_bytes_in_the_file_bounds_a_line_and_a_rerun_finds_its_dead_letter() {
    let dir = Workdir::new();
    let history = dir.path().join("history");
    std::fs::create_dir_all(&history).unwrap();
    let path = history.join("a.jsonl");
    let line = long_record(5_000);
    write_file(&path, 0, 3, &line, 2);
    let glob = history.join("*.jsonl").display().to_string();
    let db_path = dir.db("limit");
    let file = pipeline(
        &dir,
        &db_path,
        FlowYaml::file("load", "events", &glob).file_setting("max_record_bytes", "1KiB"),
    );
    let db = Db(db_path.clone());

    for run in ["first", "second"] {
        let worker = Worker::start(&file, run);
        let logs_path = worker.stderr.clone();
        let status = worker.wait(Duration::from_secs(120));
        let logs = std::fs::read_to_string(&logs_path).unwrap_or_default();
        assert!(status.success(), "the {run} run failed: {status}\n{logs}");
        assert_eq!((db.rows(), db.distinct_keys()), (5, 5), "{run} run\n{logs}");
        assert_eq!(db.dead_letters(), 1, "{run} run\n{logs}");
    }
    let (key, reason, error, _) = dead_letter(&db_path);
    assert_eq!(key, format!("{}:4", path.display()));
    assert_eq!(reason, "record_too_large");
    let offset: usize = (0..3).map(|i| record(i).len()).sum();
    for part in [
        path.display().to_string(),
        format!("byte {offset}"),
        line.len().to_string(),
        "max_record_bytes".to_owned(),
        "1024".to_owned(),
    ] {
        assert!(error.contains(&part), "{part:?} not in {error:?}");
    }
}
