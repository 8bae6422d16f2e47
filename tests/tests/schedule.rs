//! Scheduled triggered pipelines end to end, in real time, with a `sluice run` worker:
//!
//! * a cron schedule with a seconds field (`*/5 * * * * *`) on the real emulator: its runs
//!   drain what was published before their fire, nothing lands twice, and `sluice_runs` holds
//!   the completed runs with their counts (the flow's `drain_idle` is 20 s: a run's streams
//!   close when it ends, and the emulator hands what is published after that to a new stream
//!   only after the closed stream's ack deadline, 10 s; ARCHITECTURE.md, "Pub/Sub client facts
//!   we build on");
//! * between runs the worker serves `/healthz` and `/metrics` (the next fire's gauge), `sluice
//!   status` shows the next run, and SIGTERM exits 0 at once;
//! * `semantics: data_interval` over a JSONL file, every 5 s with `catchup: true`: each run
//!   reads the records of its interval only; after a stop of 12 s the missed fires run in
//!   order (`catchup`), so the intervals run join up with no gap and no record twice.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_bench::free_port;
use sluice_tests::{
    Db, FlowYaml, PipelineYaml, PubSub, Workdir, Worker, events_with_duplicates, eventually,
    now_ms, sluice_command,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One row of `sluice_runs`.
#[derive(Debug, Clone)]
struct Run {
    fire_ms: i64,
    interval: Option<(i64, i64)>,
    trigger: String,
    state: String,
    started_at: i64,
    ended_at: Option<i64>,
    rows: i64,
}

/// The runs recorded in the SQLite store at `db`, oldest first (the rows of all flows added).
fn runs(db: &Path) -> Vec<Run> {
    if !db.exists() {
        return Vec::new();
    }
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    let mut statement = match conn.prepare(
        "SELECT fire_ms, interval_start, interval_end, trigger, state, started_at, ended_at, rows
         FROM sluice_runs ORDER BY run_id",
    ) {
        Ok(statement) => statement,
        Err(error) if error.to_string().contains("no such table") => return Vec::new(),
        Err(error) => panic!("{error}"),
    };
    statement
        .query_map([], |row| {
            let rows: String = row.get(7)?;
            let counts: serde_json::Value = serde_json::from_str(&rows).unwrap();
            let interval = match (row.get::<_, Option<i64>>(1)?, row.get::<_, Option<i64>>(2)?) {
                (Some(start), Some(end)) => Some((start, end)),
                _ => None,
            };
            Ok(Run {
                fire_ms: row.get(0)?,
                interval,
                trigger: row.get(3)?,
                state: row.get(4)?,
                started_at: row.get(5)?,
                ended_at: row.get(6)?,
                rows: counts
                    .as_object()
                    .unwrap()
                    .values()
                    .map(|n| n.as_i64().unwrap())
                    .sum(),
            })
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn completed(db: &Path) -> Vec<Run> {
    runs(db)
        .into_iter()
        .filter(|r| r.state == "completed")
        .collect()
}

/// Waits until a run that fired after `after_ms` completed.
async fn wait_for_a_run_after(db: &Path, after_ms: i64, worker: &Worker) {
    assert!(
        eventually(Duration::from_secs(240), || completed(db)
            .iter()
            .any(|r| r.fire_ms > after_ms))
        .await,
        "no run fired after {after_ms} completed: {:?}\n{}",
        runs(db),
        worker.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seconds_schedule_runs_each_fire_and_each_run_drains_what_came_before() {
    let pubsub = PubSub::connect().await;
    let (topic, subscriptions) = pubsub.topic_with("sched", 1).await;
    let dir = Workdir::new();
    let db_path = dir.db("sched");
    let db = Db(db_path.clone());
    let metrics_port = free_port().unwrap();
    let file = PipelineYaml::new("test")
        .sqlite(&db_path)
        .pubsub_emulator()
        .metrics(&format!("127.0.0.1:{metrics_port}"))
        .ingest_every_five_seconds(&subscriptions[0])
        .write(dir.path(), "p.yaml");
    let mut published = 0;
    pubsub
        .publish(&topic, events_with_duplicates("b0-", 100, 10))
        .await;
    published += 100;
    let mut published_at = now_ms();
    let worker = Worker::start(&file, "scheduled");
    for batch in 1..3 {
        wait_for_a_run_after(&db_path, published_at, &worker).await;
        assert_eq!(db.rows(), published, "the batches published so far");
        pubsub
            .publish(
                &topic,
                events_with_duplicates(&format!("b{batch}-"), 100, 10),
            )
            .await;
        published += 100;
        published_at = now_ms();
    }
    wait_for_a_run_after(&db_path, published_at, &worker).await;
    let metrics = http_get(metrics_port, "/metrics").unwrap_or_default();
    worker.terminate();
    let exit = worker.wait(Duration::from_secs(90));
    assert!(exit.success(), "{exit:?}");

    assert_eq!(db.rows(), published, "every event");
    assert_eq!(db.distinct_keys(), published, "none twice");
    let runs = runs(&db_path);
    let done: Vec<&Run> = runs.iter().filter(|r| r.state == "completed").collect();
    println!("runs: {runs:#?}");
    assert!(done.len() >= 3, "three runs or more: {runs:#?}");
    assert_eq!(
        done.iter().map(|r| r.rows).sum::<i64>(),
        published,
        "the runs' counts add up"
    );
    for pair in runs.windows(2) {
        assert!(
            pair[0].fire_ms < pair[1].fire_ms,
            "fires in order: {runs:#?}"
        );
        if let Some(ended) = pair[0].ended_at {
            assert!(ended <= pair[1].started_at, "runs never overlap: {runs:#?}");
        }
    }
    for run in &runs {
        assert_eq!(run.fire_ms % 5_000, 0, "a fire of */5 s: {run:?}");
        assert_eq!(run.trigger, "schedule");
        assert_eq!(run.interval, None, "trigger semantics: no interval");
    }
    // Each run lasts 20 s or more, so fires come during runs and wait for them.
    let metric = |name: &str| {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|value| value.trim().parse::<f64>().ok())
    };
    let completed_runs = metric("sluice_runs_total{pipeline=\"test\",state=\"completed\"}");
    assert!(
        completed_runs.is_some_and(|n| n >= 3.0),
        "sluice_runs_total: {completed_runs:?} in\n{metrics}"
    );
    let delayed = metric("sluice_schedule_fires_delayed_total{pipeline=\"test\"}");
    assert!(
        delayed.is_some_and(|n| n >= 3.0),
        "fires delayed behind runs: {delayed:?} in\n{metrics}"
    );
    for run in &done {
        let late = db.query(&format!(
            "SELECT COUNT(*) FROM test__events WHERE publish_time < {} AND committed_at > {}",
            run.fire_ms,
            run.ended_at.unwrap()
        ));
        assert_eq!(late, 0, "run {run:?} left what was published before it");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn between_runs_the_worker_serves_and_sigterm_exits_at_once() {
    let dir = Workdir::new();
    let db_path = dir.db("yearly");
    let history = dir.path().join("history");
    std::fs::create_dir_all(&history).unwrap();
    std::fs::write(history.join("a.jsonl"), "{\"id\":\"a\"}\n").unwrap();
    let metrics_port = free_port().unwrap();
    let file = PipelineYaml::new("test")
        .mode("triggered")
        .sqlite(&db_path)
        .metrics(&format!("127.0.0.1:{metrics_port}"))
        .schedule("{ cron: \"@yearly\", timezone: Europe/Berlin }")
        .target_table("events")
        .flow(FlowYaml::file(
            "backfill",
            "events",
            &history.join("*.jsonl").display().to_string(),
        ))
        .write(dir.path(), "p.yaml");
    let mut worker = Worker::start(&file, "yearly");
    // The next 1 January, 00:00 in Berlin (23:00 UTC the day before).
    let next_fire = {
        let now =
            jiff::Zoned::now().with_time_zone(jiff::tz::TimeZone::get("Europe/Berlin").unwrap());
        let next_year = jiff::civil::date(now.year() + 1, 1, 1).at(0, 0, 0, 0);
        next_year
            .to_zoned(jiff::tz::TimeZone::get("Europe/Berlin").unwrap())
            .unwrap()
            .timestamp()
            .as_second()
    };
    let gauge = "sluice_schedule_next_fire_timestamp_seconds{pipeline=\"test\"}";
    let mut metrics = String::new();
    let served = eventually(Duration::from_secs(60), || {
        metrics = http_get(metrics_port, "/metrics").unwrap_or_default();
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(gauge))
            .and_then(|value| value.trim().parse::<f64>().ok())
            == Some(next_fire as f64)
    })
    .await;
    assert!(
        served,
        "{gauge} {next_fire} not in:\n{metrics}\n{}",
        worker.logs()
    );
    assert!(
        http_get(metrics_port, "/healthz").is_some(),
        "/healthz answers between runs"
    );
    let status = sluice_command(&["status", "-c", file.to_str().unwrap()], None);
    assert_eq!(status.code, 0, "{}", status.all());
    let next = jiff::Timestamp::from_second(next_fire).unwrap().to_string();
    assert!(
        status.stdout.contains("last run: none") && status.stdout.contains(&next),
        "next run {next} in:\n{}",
        status.stdout
    );
    assert!(worker.is_running(), "still waiting for its fire");

    let stopped = Instant::now();
    worker.terminate();
    let exit = worker.wait(Duration::from_secs(30));
    assert!(exit.success(), "{exit:?}");
    assert!(
        stopped.elapsed() < Duration::from_secs(5),
        "SIGTERM between runs exits at once (took {:?})",
        stopped.elapsed()
    );
    let listed = sluice_command(&["runs", "-c", file.to_str().unwrap()], None);
    assert_eq!(listed.code, 0, "{}", listed.all());
    assert!(
        listed.stdout.contains("no runs recorded"),
        "{}",
        listed.stdout
    );
    assert_eq!(Db(db_path).rows(), 0, "nothing ran");
}

/// `GET path` on the worker's metrics port; the body of a 200 answer.
fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer
        .starts_with("HTTP/1.1 200")
        .then(|| {
            answer
                .split_once("\r\n\r\n")
                .map(|(_, body)| body.to_owned())
        })
        .flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_interval_runs_read_their_interval_and_catch_up_after_a_stop() {
    let dir = Workdir::new();
    let db_path = dir.db("intervals");
    let db = Db(db_path.clone());
    // A record every 50 ms from 20 s ago to 90 s ahead.
    let first_event = now_ms() - 20_000;
    let events: Vec<i64> = (0..2_200).map(|i| first_event + i * 50).collect();
    let file = scheduled_over_events(
        &dir,
        &db_path,
        &events,
        "{ every: 5s, semantics: data_interval, catchup: true }",
    );

    let worker = Worker::start(&file, "first");
    assert!(
        eventually(Duration::from_secs(60), || completed(&db_path).len() >= 3).await,
        "{:?}\n{}",
        runs(&db_path),
        worker.logs()
    );
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(30)).success());
    // Three fires or more are missed.
    tokio::time::sleep(Duration::from_secs(16)).await;

    let worker = Worker::start(&file, "second");
    let restarted = now_ms();
    assert!(
        eventually(Duration::from_secs(60), || completed(&db_path)
            .iter()
            .any(|r| r.started_at > restarted && r.trigger == "schedule"))
        .await,
        "{:?}\n{}",
        runs(&db_path),
        worker.logs()
    );
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(30)).success());

    let runs: Vec<Run> = runs(&db_path)
        .into_iter()
        .filter(|r| r.state == "completed")
        .collect();
    println!("runs: {runs:#?}");
    // The first start runs the latest interval and the fires after it come on time: only
    // the restart has fires to catch up.
    assert!(
        runs.iter().filter(|r| r.trigger == "catchup").count() >= 2,
        "the fires missed during the stop ran as catchup: {runs:#?}"
    );
    for pair in runs.windows(2) {
        assert_eq!(
            pair[1].fire_ms - pair[0].fire_ms,
            5_000,
            "every fire ran, in order: {runs:#?}"
        );
    }
    // A run stopped half-way by the SIGTERM and finished after the restart counts only what
    // its second part committed; every other run counts its whole interval.
    let mut partial = 0;
    for run in &runs {
        let (start, end) = run.interval.unwrap();
        assert_eq!((start, end), (run.fire_ms - 5_000, run.fire_ms));
        let expected = events.iter().filter(|t| start <= **t && **t < end).count() as i64;
        assert!(run.rows <= expected, "run {run:?} reads its interval only");
        if run.rows < expected {
            partial += 1;
        }
    }
    assert!(partial <= 1, "each run reads its interval: {runs:#?}");
    let (from, to) = (runs[0].interval.unwrap().0, runs.last().unwrap().fire_ms);
    let expected = events.iter().filter(|t| from <= **t && **t < to).count() as i64;
    assert_eq!(db.rows(), expected, "the intervals join up");
    assert_eq!(db.distinct_keys(), expected, "no record twice");
}

/// A file `history/events.jsonl` in `dir` of one record per event time (`e{t}`), and a
/// triggered pipeline `test` on the SQLite store `db` reading it into table `events` on
/// `schedule` (YAML flow mapping); the pipeline file.
fn scheduled_over_events(dir: &Workdir, db: &Path, events: &[i64], schedule: &str) -> PathBuf {
    let glob = dir.events_file(events);
    PipelineYaml::new("test")
        .mode("triggered")
        .sqlite(db)
        .schedule(schedule)
        .target_table("events")
        .flow(FlowYaml::file("events", "events", &glob))
        .write(dir.path(), "p.yaml")
}

/// `n` JSONL records `{prefix}{i}` in `dir/name`.
fn records(dir: &Path, name: &str, prefix: &str, n: usize) {
    let lines: String = (0..n)
        .map(|i| format!("{{\"id\":\"{prefix}{i}\",\"data\":{{\"n\":{i}}}}}\n"))
        .collect();
    std::fs::write(dir.join(name), lines).unwrap();
}

/// Data-aware runs: pipeline `exports` reads the table of pipeline `orders` in the same store
/// (`source: { table: orders.events }`) on a yearly schedule with `on_update: true`: each time
/// `orders` commits rows, `exports` runs (trigger `update`) and reads what is new, no sooner
/// than `min_interval` (10 s) after its last run; each record is copied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_pipelines_new_rows_fire_a_run_that_reads_them() {
    let dir = Workdir::new();
    let db_path = dir.db("shared");
    let history = dir.path().join("history");
    std::fs::create_dir_all(&history).unwrap();
    let orders = PipelineYaml::new("orders")
        .mode("triggered")
        .sqlite(&db_path)
        .target_table("events")
        .flow(FlowYaml::file(
            "load",
            "events",
            &history.join("*.jsonl").display().to_string(),
        ))
        .write(dir.path(), "orders.yaml");
    let exports = PipelineYaml::new("exports")
        .mode("triggered")
        .sqlite(&db_path)
        .schedule("{ cron: \"@yearly\", on_update: true, min_interval: 10s }")
        .target_table("copies")
        .flow(FlowYaml::table("export", "copies", "orders.events"))
        .write(dir.path(), "exports.yaml");
    let copies = |db: &Path| {
        Db(db.to_owned()).query("SELECT COUNT(DISTINCT dedup_key) FROM exports__copies")
    };
    let load = |what: &str| {
        let out = sluice_command(&["run", "-c", orders.to_str().unwrap()], None);
        assert_eq!(out.code, 0, "{what}: {}", out.all());
    };

    records(&history, "a.jsonl", "a", 500);
    load("first load");
    let worker = Worker::start(&exports, "exports");
    assert!(
        eventually(Duration::from_secs(60), || copies(&db_path) == 500).await,
        "the first update run: {:?}\n{}",
        runs(&db_path),
        worker.logs()
    );
    records(&history, "b.jsonl", "b", 300);
    load("second load");
    let second_load_done = now_ms();
    assert!(
        eventually(Duration::from_secs(60), || copies(&db_path) == 800).await,
        "the second update run: {:?}\n{}",
        runs(&db_path),
        worker.logs()
    );
    // Nothing new: no third run.
    tokio::time::sleep(Duration::from_secs(8)).await;
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(30)).success());

    let runs = runs(&db_path);
    println!("runs: {runs:#?}");
    let exports_runs: Vec<&Run> = runs.iter().filter(|r| r.trigger == "update").collect();
    assert_eq!(exports_runs.len(), 2, "one run per load: {runs:#?}");
    assert_eq!(
        exports_runs.iter().map(|r| r.rows).collect::<Vec<_>>(),
        [500, 300],
        "each run reads what is new"
    );
    // The rows to read were there well before min_interval had passed: only the debounce
    // held the second run back.
    assert!(
        second_load_done < exports_runs[0].started_at + 8_000,
        "the second load took too long to show the debounce: {runs:#?}"
    );
    assert!(
        exports_runs[1].started_at - exports_runs[0].started_at >= 10_000,
        "min_interval apart: {runs:#?}"
    );
    assert_eq!(
        Db(db_path.clone()).query("SELECT COUNT(*) FROM exports__copies"),
        800,
        "each record copied once"
    );
}

/// A run whose flow fails is recorded `failed` with the reason, the schedule goes on, and
/// SIGTERM between runs still exits 0 (a scheduled worker's runs are in `sluice_runs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_run_is_recorded_and_sigterm_between_runs_exits_0() {
    let dir = Workdir::new();
    let db_path = dir.db("failing");
    let file = PipelineYaml::new("test")
        .mode("triggered")
        .sqlite(&db_path)
        .schedule("{ cron: \"*/20 * * * * *\" }")
        .target_table("events")
        .flow(FlowYaml::file(
            "load",
            "events",
            &dir.path().join("nothing/*.jsonl").display().to_string(),
        ))
        .write(dir.path(), "p.yaml");
    let worker = Worker::start(&file, "failing");
    let failed = |db: &Path| runs(db).iter().any(|r| r.state == "failed");
    assert!(
        eventually(Duration::from_secs(90), || failed(&db_path)).await,
        "{:?}\n{}",
        runs(&db_path),
        worker.logs()
    );
    // Between runs now (a failed run takes its retries, 7 s, of the 20 s between fires).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stopped = Instant::now();
    worker.terminate();
    let exit = worker.wait(Duration::from_secs(30));
    assert!(exit.success(), "{exit:?}");
    assert!(
        stopped.elapsed() < Duration::from_secs(5),
        "{:?}",
        stopped.elapsed()
    );
    let listed = sluice_command(&["runs", "-c", file.to_str().unwrap()], None);
    assert!(
        listed.stdout.contains("failed") && listed.stdout.contains("load:"),
        "the reason is shown: {}",
        listed.stdout
    );
}

/// `start_date` with `catchup: true` (issue: the intervals before the first fire were never
/// run, so a file's early records were never read): a schedule `every: 1s` starting 200 s
/// ago, over a file of 4 000 records spread over those 200 intervals, runs each interval once,
/// oldest first, the first starting at `start_date`, and reads every record exactly once,
/// across a SIGKILL in the middle of the catch-up (shown by the completed runs at the kill:
/// some, not all; a run over a few records takes milliseconds, hence so many intervals). The
/// killed run is finished by the restart with the same fire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_date_with_catchup_reads_every_interval_once_across_a_kill() {
    const INTERVAL_MS: i64 = 1_000;
    const INTERVALS: i64 = 200;
    let dir = Workdir::new();
    let db_path = dir.db("catchup");
    let db = Db(db_path.clone());
    let start = (now_ms() - INTERVALS * INTERVAL_MS) / 1_000 * 1_000;
    let last_fire = start + INTERVALS * INTERVAL_MS;
    let events: Vec<i64> = (0..INTERVALS * 20).map(|i| start + i * 50).collect();
    let start_date = jiff::Timestamp::from_millisecond(start).unwrap();
    let file = scheduled_over_events(
        &dir,
        &db_path,
        &events,
        &format!(
            "{{ every: 1s, semantics: data_interval, catchup: true, start_date: \"{start_date}\" }}"
        ),
    );

    let caught_up = |db: &Path| {
        completed(db)
            .iter()
            .filter(|r| r.fire_ms <= last_fire)
            .count()
    };
    let worker = Worker::start(&file, "first");
    // Polled closely: a run over a few records takes milliseconds.
    let deadline = Instant::now() + Duration::from_secs(120);
    while caught_up(&db_path) < 10 {
        assert!(
            Instant::now() < deadline,
            "{:?}\n{}",
            runs(&db_path),
            worker.logs()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    worker.kill9();
    let at_kill = caught_up(&db_path);
    println!("killed with {at_kill} of {INTERVALS} intervals run");
    assert!(
        at_kill < INTERVALS as usize,
        "the kill landed before the catch-up ended"
    );

    let worker = Worker::start(&file, "second");
    assert!(
        eventually(Duration::from_secs(180), || caught_up(&db_path)
            >= INTERVALS as usize)
        .await,
        "{:?}\n{}",
        runs(&db_path),
        worker.logs()
    );
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(30)).success());

    let runs: Vec<Run> = completed(&db_path)
        .into_iter()
        .filter(|r| r.fire_ms <= last_fire)
        .collect();
    let fires: Vec<i64> = runs.iter().map(|r| r.fire_ms).collect();
    let expected: Vec<i64> = (1..=INTERVALS).map(|k| start + k * INTERVAL_MS).collect();
    assert_eq!(fires, expected, "each interval ran once, oldest first");
    for run in &runs {
        assert_eq!(run.interval, Some((run.fire_ms - INTERVAL_MS, run.fire_ms)));
    }
    assert!(
        runs.iter().filter(|r| r.trigger == "catchup").count() >= 100,
        "the intervals before now ran as catch-up: {runs:#?}"
    );
    let total = events.len() as i64;
    assert_eq!(db.rows(), total, "every record was read");
    assert_eq!(db.distinct_keys(), total, "no record twice");
}

/// `schedule.retries`: a run that fails (a record violates an expectation with
/// `on_violation: fail`) runs again after `retry_delay`, as the same run with the same
/// interval; once the bad record is fixed, the retry completes and the run is recorded
/// completed with every record of its interval, once. The retry is shown by its log line,
/// seen before the file is fixed (so the first attempt failed on the bad record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_run_is_retried_after_retry_delay_and_completes() {
    let dir = Workdir::new();
    let db_path = dir.db("retries");
    // One hour-long interval, caught up from a start two hours back: its records are these.
    let start = (now_ms() - 2 * 3_600_000) / 3_600_000 * 3_600_000;
    let history = dir.path().join("history");
    std::fs::create_dir_all(&history).unwrap();
    let write = |bad: bool| {
        let lines: String = (0..20)
            .map(|i| {
                let n = if bad && i == 7 { -1 } else { i };
                format!(
                    "{{\"id\":\"r{i}\",\"event_time\":{},\"data\":{{\"n\":{n}}}}}\n",
                    start + i * 1_000
                )
            })
            .collect();
        let staging = history.join("events.tmp");
        std::fs::write(&staging, lines).unwrap();
        std::fs::rename(&staging, history.join("events.jsonl")).unwrap();
    };
    write(true);
    let start_date = jiff::Timestamp::from_millisecond(start).unwrap();
    let file = dir.path().join("p.yaml");
    std::fs::write(
        &file,
        format!(
            "pipeline: test
mode: triggered
store: sqlite://{}
schedule:
  every: 1h
  semantics: data_interval
  catchup: true
  start_date: \"{start_date}\"
  retries: 2
  retry_delay: 3s
targets:
  - name: events
    kind: table
    columns:
      - {{ name: n, type: integer }}
flows:
  - name: events
    target: events
    source: {{ file: {{ path: \"{}\" }} }}
    decode: {{ format: json }}
    expect:
      - {{ name: not_negative, check: \"n >= 0\", on_violation: fail }}
",
            db_path.display(),
            history.join("*.jsonl").display()
        ),
    )
    .unwrap();
    let worker = Worker::start(&file, "retrying");
    assert!(
        eventually(Duration::from_secs(90), || worker
            .logs()
            .contains("the run failed; running it again"))
        .await,
        "{}",
        worker.logs()
    );
    write(false);
    assert!(
        eventually(Duration::from_secs(90), || completed(&db_path).len() >= 2).await,
        "{:?}\n{}",
        runs(&db_path),
        worker.logs()
    );
    worker.terminate();
    let logs = worker.logs();
    assert!(worker.wait(Duration::from_secs(30)).success());
    let first = &completed(&db_path)[0];
    println!("first run: {first:?}");
    assert_eq!(first.interval, Some((start, start + 3_600_000)));
    assert_eq!(
        first.rows, 20,
        "the retry wrote every record of the interval"
    );
    assert_eq!(
        runs(&db_path)
            .iter()
            .filter(|r| r.state == "failed")
            .count(),
        0,
        "the run was retried, not recorded failed"
    );
    assert!(logs.contains("attempt=1"), "{logs}");
    assert_eq!(Db(db_path).query("SELECT COUNT(*) FROM test__events"), 20);
}

/// `sluice backfill`: the intervals of a range before the schedule's `start_date` (so the
/// scheduler never runs them) are run by `sluice backfill -c FILE --from T1 --to T2`, each
/// once, oldest first, recorded `backfill` with its interval, reading exactly the file's
/// records of the range; a second backfill of the same range runs nothing. Beside it a worker
/// runs the schedule (every 10 s) on the same store: no backfill run overlaps one of its runs
/// in time (a run waits for the other's to end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_runs_the_missing_intervals_of_its_range_beside_the_scheduler() {
    const INTERVAL_MS: i64 = 10_000;
    let dir = Workdir::new();
    let db_path = dir.db("backfill");
    let now = now_ms() / INTERVAL_MS * INTERVAL_MS;
    let from = now - 60 * INTERVAL_MS;
    let to = from + 5 * INTERVAL_MS;
    // Records every 2 s over 10 intervals from `from`: the range holds the first 5.
    let events: Vec<i64> = (0..50).map(|i| from + i * 2_000).collect();
    let start_date = jiff::Timestamp::from_millisecond(now).unwrap();
    let file = scheduled_over_events(
        &dir,
        &db_path,
        &events,
        &format!("{{ every: 10s, semantics: data_interval, start_date: \"{start_date}\" }}"),
    );
    let scheduler = Worker::start(&file, "scheduler");
    assert!(
        eventually(Duration::from_secs(60), || !completed(&db_path).is_empty()).await,
        "{:?}\n{}",
        runs(&db_path),
        scheduler.logs()
    );
    let (from_text, to_text) = (
        jiff::Timestamp::from_millisecond(from).unwrap().to_string(),
        jiff::Timestamp::from_millisecond(to).unwrap().to_string(),
    );
    let config = file.to_str().unwrap();
    let backfill = sluice_command(
        &[
            "backfill", "-c", config, "--from", &from_text, "--to", &to_text,
        ],
        None,
    );
    assert_eq!(backfill.code, 0, "{}", backfill.all());
    let again = sluice_command(
        &[
            "backfill", "-c", config, "--from", &from_text, "--to", &to_text,
        ],
        None,
    );
    assert_eq!(again.code, 0, "{}", again.all());
    scheduler.terminate();
    assert!(scheduler.wait(Duration::from_secs(30)).success());

    let all = runs(&db_path);
    let backfilled: Vec<&Run> = all.iter().filter(|r| r.trigger == "backfill").collect();
    let intervals: Vec<_> = backfilled.iter().map(|r| r.interval.unwrap()).collect();
    let expected: Vec<_> = (0..5)
        .map(|k| (from + k * INTERVAL_MS, from + (k + 1) * INTERVAL_MS))
        .collect();
    assert_eq!(
        intervals, expected,
        "each interval of the range once, oldest first"
    );
    assert!(backfilled.iter().all(|r| r.state == "completed"));
    assert!(
        again.all().contains("to_run=0"),
        "the second backfill ran nothing: {}",
        again.all()
    );
    let in_range = events.iter().filter(|t| **t < to).count() as i64;
    assert_eq!(backfilled.iter().map(|r| r.rows).sum::<i64>(), in_range);
    assert_eq!(
        Db(db_path.clone()).rows(),
        in_range,
        "only the range's records"
    );
    // No two runs overlap in time.
    // (A scheduled run the SIGTERM stopped has no end: it stays running for the next.)
    let mut spans: Vec<(i64, i64)> = all
        .iter()
        .filter_map(|r| Some((r.started_at, r.ended_at?)))
        .collect();
    spans.sort();
    for pair in spans.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "runs overlap: {pair:?} in {all:#?}");
    }
    let scheduled = all.iter().filter(|r| r.trigger != "backfill").count();
    println!(
        "{} backfill runs beside {scheduled} scheduled runs",
        backfilled.len()
    );
}

/// An interval is run once, whoever asks: a scheduler catching up from `start_date` and a
/// `sluice backfill` of the same 30 intervals, started together on one store, run each
/// interval once between them (the other's begin finds it completed and records its run
/// completed at once, with no rows), and every record once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_and_the_catchup_of_one_range_run_each_interval_once() {
    const INTERVAL_MS: i64 = 10_000;
    const INTERVALS: i64 = 30;
    let dir = Workdir::new();
    let db_path = dir.db("both");
    let now = now_ms() / INTERVAL_MS * INTERVAL_MS;
    let from = now - (INTERVALS + 5) * INTERVAL_MS;
    let to = from + INTERVALS * INTERVAL_MS;
    let events: Vec<i64> = (0..INTERVALS * 5).map(|i| from + i * 2_000).collect();
    let start_date = jiff::Timestamp::from_millisecond(from).unwrap();
    // The end date keeps the scheduler to the range: it is the last interval's start (as in
    // Airflow, an interval that starts at the end date still runs; a CI run, 2026-12-05, saw
    // the scheduler's catch-up run the one starting at `to` before the test looked).
    let end_date = jiff::Timestamp::from_millisecond(to - INTERVAL_MS).unwrap();
    let file = scheduled_over_events(
        &dir,
        &db_path,
        &events,
        &format!(
            "{{ every: 10s, semantics: data_interval, catchup: true, start_date: \"{start_date}\", \
             end_date: \"{end_date}\" }}"
        ),
    );
    let scheduler = Worker::start(&file, "scheduler");
    let backfill = sluice_command(
        &[
            "backfill",
            "-c",
            file.to_str().unwrap(),
            "--from",
            &start_date.to_string(),
            "--to",
            &jiff::Timestamp::from_millisecond(to).unwrap().to_string(),
        ],
        None,
    );
    assert_eq!(backfill.code, 0, "{}", backfill.all());
    assert!(
        eventually(Duration::from_secs(120), || {
            let done: std::collections::HashSet<_> =
                completed(&db_path).iter().map(|r| r.interval).collect();
            done.len() == INTERVALS as usize
        })
        .await,
        "{:?}\n{}",
        runs(&db_path),
        scheduler.logs()
    );
    scheduler.terminate();
    assert!(scheduler.wait(Duration::from_secs(30)).success());

    let conn = rusqlite::Connection::open(&db_path).unwrap();
    let per_interval: Vec<(i64, i64, i64)> = conn
        .prepare(
            "SELECT interval_start, SUM(rows <> '{}'), SUM(rows = '{}') FROM sluice_runs
             WHERE state = 'completed' GROUP BY interval_start ORDER BY interval_start",
        )
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(per_interval.len(), INTERVALS as usize, "{per_interval:?}");
    let twice: Vec<_> = per_interval
        .iter()
        .filter(|(_, ran, _)| *ran != 1)
        .collect();
    assert!(
        twice.is_empty(),
        "intervals not run exactly once (start, runs that ran, runs found done): {twice:?}\n{:#?}",
        runs(&db_path)
    );
    // The two met: some begins found their interval completed by the other.
    let found_done: i64 = per_interval.iter().map(|(_, _, done)| done).sum();
    println!("{found_done} runs found their interval completed by the other");
    assert!(found_done > 0, "the backfill and the scheduler never met");
    assert_eq!(Db(db_path).rows(), events.len() as i64);
}

/// A SIGTERM during `sluice backfill` exits 1 (not 0) and says how much of the range it left;
/// a second backfill runs the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_during_a_backfill_exits_1_and_a_second_one_runs_the_rest() {
    const INTERVAL_MS: i64 = 10_000;
    const INTERVALS: i64 = 200;
    let dir = Workdir::new();
    let db_path = dir.db("stopped");
    let now = now_ms() / INTERVAL_MS * INTERVAL_MS;
    let from = now - (INTERVALS + 5) * INTERVAL_MS;
    let to = from + INTERVALS * INTERVAL_MS;
    let events: Vec<i64> = (0..INTERVALS).map(|i| from + i * INTERVAL_MS + 1).collect();
    // The schedule starts after the range: only the backfills run it.
    let start_date = jiff::Timestamp::from_millisecond(now).unwrap();
    let file = scheduled_over_events(
        &dir,
        &db_path,
        &events,
        &format!("{{ every: 10s, semantics: data_interval, start_date: \"{start_date}\" }}"),
    );
    let (from_text, to_text) = (
        jiff::Timestamp::from_millisecond(from).unwrap().to_string(),
        jiff::Timestamp::from_millisecond(to).unwrap().to_string(),
    );
    let args = [
        "backfill",
        "-c",
        file.to_str().unwrap(),
        "--from",
        &from_text,
        "--to",
        &to_text,
    ];
    let first = Worker::spawn(&args, dir.path(), "first");
    assert!(
        eventually(Duration::from_secs(60), || completed(&db_path).len() >= 3).await,
        "{}",
        first.logs()
    );
    first.terminate();
    let logs_of_first = first.stderr.clone();
    let status = first.wait(Duration::from_secs(60));
    let logs = std::fs::read_to_string(logs_of_first).unwrap();
    let completed_then = completed(&db_path).len();
    assert!(
        completed_then < INTERVALS as usize,
        "the signal came after the range's end"
    );
    assert_eq!(status.code(), Some(1), "{logs}");
    assert!(
        logs.contains("backfill stopped by a signal before the end of its range"),
        "{logs}"
    );
    let second = sluice_command(&args, None);
    assert_eq!(second.code, 0, "{}", second.all());
    assert_eq!(completed(&db_path).len(), INTERVALS as usize);
    assert_eq!(Db(db_path).rows(), INTERVALS);
    println!("{completed_then} intervals completed before the signal");
}

/// `p.yaml` in `dir`: a triggered pipeline without a schedule (each `sluice run` a manual run)
/// reading `subscription` into `events` on the SQLite store `db`, drained after `idle`.
fn manual_runs(dir: &Workdir, db: &Path, subscription: &str, idle: &str) -> PathBuf {
    PipelineYaml::new("test")
        .mode("triggered")
        .sqlite(db)
        .pubsub_emulator()
        .target_table("events")
        .flow(
            FlowYaml::pubsub("ingest", "events", subscription)
                .dedup_attribute("event_id")
                .drain_idle(idle),
        )
        .write(dir.path(), "p.yaml")
}

/// A pipeline without a schedule has no scheduler to end a run its worker left `running` (a
/// SIGKILL, or a worker that gave up): the next `sluice run` of the pipeline records it failed,
/// naming the worker, before its own run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_left_running_by_a_gone_worker_is_recorded_failed_by_the_next_run() {
    let dir = Workdir::new();
    let db_path = dir.db("left");
    let pubsub = PubSub::connect().await;
    // Two subscriptions: the second run reads a fresh one (a killed stream's messages come
    // back only after their stream ack deadline).
    let (topic, subs) = pubsub.topic_with("left", 2).await;
    pubsub
        .publish(&topic, events_with_duplicates("l", 20, 0))
        .await;
    let write = |subscription: &str, idle: &str| manual_runs(&dir, &db_path, subscription, idle);
    // A run that stays up (120 s idle before it counts as drained), killed once it committed.
    let file = write(&subs[0], "120s");
    let first = Worker::start(&file, "first");
    assert!(
        eventually(Duration::from_secs(60), || Db(db_path.clone()).rows() == 20).await,
        "{}",
        first.logs()
    );
    assert_eq!(runs(&db_path).len(), 1);
    assert_eq!(runs(&db_path)[0].state, "running");
    first.kill9();
    // Gone once its last heartbeat is older than the pool's `ALIVE_WITHIN` (15 s).
    tokio::time::sleep(Duration::from_secs(16)).await;
    write(&subs[1], "5s");
    let second = sluice_command(&["run", "-c", file.to_str().unwrap()], None);
    assert_eq!(second.code, 0, "{}", second.all());
    let all = runs(&db_path);
    assert_eq!(all.len(), 2, "{all:#?}");
    assert_eq!(all[0].state, "failed", "{all:#?}");
    assert!(all[0].ended_at.is_some());
    assert_eq!(all[1].state, "completed", "{all:#?}");
    let conn = rusqlite::Connection::open(&db_path).unwrap();
    let error: String = conn
        .query_row(
            "SELECT error FROM sluice_runs ORDER BY run_id LIMIT 1",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert!(error.contains("stopped before the run ended"), "{error}");
    assert_eq!(Db(db_path).rows(), 20);
}

/// A backfill whose range reaches past now runs only the intervals that have ended: one still
/// going on is the schedule's (run early, it would read part of its data and count as run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_leaves_the_intervals_not_ended_to_the_schedule() {
    const INTERVAL_MS: i64 = 3_600_000;
    // Far from the end of the hour, so that the interval going on stays so meanwhile.
    let into_hour = now_ms() % INTERVAL_MS;
    if into_hour > INTERVAL_MS - 60_000 {
        tokio::time::sleep(Duration::from_millis(
            (INTERVAL_MS - into_hour + 1_000) as u64,
        ))
        .await;
    }
    let dir = Workdir::new();
    let db_path = dir.db("ahead");
    let now = now_ms() / INTERVAL_MS * INTERVAL_MS;
    let events: Vec<i64> = (-3..3).map(|k| now + k * INTERVAL_MS + 1).collect();
    let start_date = jiff::Timestamp::from_millisecond(now + 10 * INTERVAL_MS).unwrap();
    let file = scheduled_over_events(
        &dir,
        &db_path,
        &events,
        &format!("{{ every: 1h, semantics: data_interval, start_date: \"{start_date}\" }}"),
    );
    let stamp = |ms: i64| jiff::Timestamp::from_millisecond(ms).unwrap().to_string();
    let backfill = sluice_command(
        &[
            "backfill",
            "-c",
            file.to_str().unwrap(),
            "--from",
            &stamp(now - 3 * INTERVAL_MS),
            "--to",
            &stamp(now + 3 * INTERVAL_MS),
        ],
        None,
    );
    assert_eq!(backfill.code, 0, "{}", backfill.all());
    assert!(
        backfill.all().contains("left to the schedule"),
        "{}",
        backfill.all()
    );
    let ran: Vec<_> = completed(&db_path).iter().map(|r| r.interval).collect();
    let ended: Vec<_> = (-3..0)
        .map(|k| Some((now + k * INTERVAL_MS, now + (k + 1) * INTERVAL_MS)))
        .collect();
    assert_eq!(ran, ended, "only the intervals that ended");
    assert_eq!(Db(db_path).rows(), 3);
}

/// `kill -SIG` of `worker`.
fn signal(worker: &Worker, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &worker.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// A manual run queued behind another worker's, whose worker is paused past the pool's
/// `ALIVE_WITHIN`, is recorded failed by the next `sluice run` (its worker counts as gone);
/// the paused worker, resumed, finds it so and exits 1 saying nothing of it ran, rather than 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_run_ended_by_another_worker_exits_1() {
    let dir = Workdir::new();
    let db_path = dir.db("queued");
    let pubsub = PubSub::connect().await;
    let (_topic, subs) = pubsub.topic_with("queued", 1).await;
    let file = manual_runs(&dir, &db_path, &subs[0], "300s");
    let first = Worker::start(&file, "first");
    assert!(
        eventually(Duration::from_secs(60), || runs(&db_path)
            .iter()
            .any(|r| r.state == "running"))
        .await,
        "{}",
        first.logs()
    );
    let paused = Worker::start(&file, "paused");
    assert!(
        eventually(Duration::from_secs(60), || runs(&db_path)
            .iter()
            .any(|r| r.state == "queued"))
        .await,
        "{}",
        paused.logs()
    );
    signal(&paused, "-STOP");
    // Past `ALIVE_WITHIN` (15 s) since its last heartbeat.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let third = Worker::start(&file, "third");
    assert!(
        eventually(Duration::from_secs(60), || runs(&db_path)
            .iter()
            .any(|r| r.state == "failed"))
        .await,
        "{:#?}\n{}",
        runs(&db_path),
        third.logs()
    );
    signal(&paused, "-CONT");
    let paused_err = paused.stderr.clone();
    let status = paused.wait(Duration::from_secs(60));
    let logs = std::fs::read_to_string(paused_err).unwrap();
    assert_eq!(status.code(), Some(1), "{logs}");
    assert!(
        logs.contains("was recorded failed by another worker while it waited"),
        "{logs}"
    );
    for worker in [first, third] {
        worker.terminate();
        worker.wait(Duration::from_secs(60));
    }
}

/// Records `(event time, attribute v)` as JSONL lines, ids `e{t}`.
fn versioned_records(records: &[(i64, &str)]) -> String {
    records
        .iter()
        .map(|(t, v)| {
            format!("{{\"id\":\"e{t}\",\"event_time\":{t},\"attributes\":{{\"v\":\"{v}\"}}}}\n")
        })
        .collect()
}

/// `sluice backfill --rerun` replaces what its intervals wrote: six intervals are backfilled
/// from a file into `events` and, downstream, `copies`; the file then changes for intervals
/// 1 to 3 (new values, a record gone from each, one record added); a rerun of those three
/// intervals leaves exactly the new records there, in both tables, recorded `rerun`, and the
/// other intervals' rows untouched. A schedule without data intervals is refused, exit 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_replaces_exactly_what_its_intervals_wrote() {
    const INTERVAL_MS: i64 = 10_000;
    let dir = Workdir::new();
    let db_path = dir.db("rerun");
    let now = now_ms() / INTERVAL_MS * INTERVAL_MS;
    let from = now - 60 * INTERVAL_MS;
    let history = dir.path().join("history");
    std::fs::create_dir_all(&history).unwrap();
    let file_of = |records: &[(i64, &str)]| {
        std::fs::write(history.join("events.jsonl"), versioned_records(records)).unwrap();
    };
    // Five records per interval, every 2 s, over six intervals.
    let before: Vec<(i64, &str)> = (0..30).map(|i| (from + i * 2_000, "old")).collect();
    file_of(&before);
    let start_date = jiff::Timestamp::from_millisecond(now).unwrap();
    let pipeline = |semantics: &str| {
        PipelineYaml::new("test")
            .mode("triggered")
            .sqlite(&db_path)
            .schedule(&format!(
                "{{ every: 10s, semantics: {semantics}, start_date: \"{start_date}\" }}"
            ))
            .target_table("events")
            .target_table("copies")
            .flow(FlowYaml::file(
                "events",
                "events",
                &history.join("*.jsonl").display().to_string(),
            ))
            .flow(FlowYaml::table("copies", "copies", "events"))
            .write(dir.path(), "p.yaml")
    };
    let file = pipeline("data_interval");
    let config = file.to_str().unwrap();
    let at = |k: i64| {
        jiff::Timestamp::from_millisecond(from + k * INTERVAL_MS)
            .unwrap()
            .to_string()
    };
    let backfill = sluice_command(
        &["backfill", "-c", config, "--from", &at(0), "--to", &at(6)],
        None,
    );
    assert_eq!(backfill.code, 0, "{}", backfill.all());
    let db = Db(db_path.clone());
    assert_eq!(db.rows(), 30);
    assert_eq!(db.query("SELECT COUNT(*) FROM test__copies"), 30);

    // Intervals 1 to 3 change: new values, their first record gone, one record added.
    let in_rerun = |t: i64| (from + INTERVAL_MS..from + 4 * INTERVAL_MS).contains(&t);
    let mut after: Vec<(i64, &str)> = before
        .iter()
        .filter(|(t, _)| !(in_rerun(*t) && (t - from) % INTERVAL_MS == 0))
        .map(|(t, v)| (*t, if in_rerun(*t) { "new" } else { *v }))
        .collect();
    after.push((from + 2 * INTERVAL_MS + 1_000, "new"));
    file_of(&after);
    let rerun = sluice_command(
        &[
            "backfill",
            "-c",
            config,
            "--from",
            &at(1),
            "--to",
            &at(4),
            "--rerun",
        ],
        None,
    );
    assert_eq!(rerun.code, 0, "{}", rerun.all());

    let reruns: Vec<Run> = runs(&db_path)
        .into_iter()
        .filter(|r| r.trigger == "rerun")
        .collect();
    let intervals: Vec<_> = reruns.iter().map(|r| r.interval.unwrap()).collect();
    let expected: Vec<_> = (1..4)
        .map(|k| (from + k * INTERVAL_MS, from + (k + 1) * INTERVAL_MS))
        .collect();
    assert_eq!(
        intervals, expected,
        "each interval of the range once, in order"
    );
    assert!(reruns.iter().all(|r| r.state == "completed"), "{reruns:?}");
    // Each table holds exactly the file's records now, with their values (a copy's key is
    // the upstream row's flow and key).
    for (table, key) in [("test__events", ""), ("test__copies", "events/")] {
        assert_eq!(
            db.query(&format!("SELECT COUNT(*) FROM {table}")),
            after.len() as i64,
            "{table}"
        );
        for (t, v) in &after {
            assert_eq!(
                db.query(&format!(
                    "SELECT COUNT(*) FROM {table} WHERE dedup_key = '{key}e{t}' \
                     AND json_extract(attributes, '$.v') = '{v}' AND event_time = {t}"
                )),
                1,
                "{table}: e{t} with v = {v}"
            );
        }
    }

    // Refused before anything runs: without data intervals there is nothing to replace by,
    // and a flow reading another pipeline's table would not read the interval again.
    let refused = |file: &Path, says: &str| {
        let out = sluice_command(
            &[
                "backfill",
                "-c",
                file.to_str().unwrap(),
                "--from",
                &at(1),
                "--to",
                &at(4),
                "--rerun",
            ],
            None,
        );
        assert_eq!(out.code, 2, "{}", out.all());
        assert!(out.all().contains(says), "{}", out.all());
    };
    refused(&pipeline("trigger"), "semantics: data_interval");
    let cross = PipelineYaml::new("test")
        .mode("triggered")
        .sqlite(&db_path)
        .schedule(&format!(
            "{{ every: 10s, semantics: data_interval, start_date: \"{start_date}\" }}"
        ))
        .target_table("copies")
        .flow(FlowYaml::table("copies", "copies", "other.events"))
        .write(dir.path(), "cross.yaml");
    refused(&cross, "other.events");
    assert_eq!(
        runs(&db_path)
            .iter()
            .filter(|r| r.trigger == "rerun")
            .count(),
        3
    );
}

/// A dataset condition: `exports` reads `orders.events` and `crm.customers` and runs on
/// `on_update: { all_of: [...] }`. Rows in one table alone fire nothing (they wait, unread);
/// once the other has rows too, one run reads both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_all_of_condition_runs_once_every_table_has_new_rows() {
    let dir = Workdir::new();
    let db_path = dir.db("shared");
    let loader = |pipeline: &str, target: &str| {
        let history = dir.path().join(pipeline);
        std::fs::create_dir_all(&history).unwrap();
        let file = PipelineYaml::new(pipeline)
            .mode("triggered")
            .sqlite(&db_path)
            .target_table(target)
            .flow(FlowYaml::file(
                "load",
                target,
                &history.join("*.jsonl").display().to_string(),
            ))
            .write(dir.path(), &format!("{pipeline}.yaml"));
        (history, file)
    };
    let (orders_dir, orders) = loader("orders", "events");
    let (crm_dir, crm) = loader("crm", "customers");
    let exports = PipelineYaml::new("exports")
        .mode("triggered")
        .sqlite(&db_path)
        .schedule(
            "{ cron: \"@yearly\", min_interval: 1s, \
             on_update: { all_of: [orders.events, crm.customers] } }",
        )
        .target_table("copies")
        .target_table("people")
        .flow(FlowYaml::table("export", "copies", "orders.events"))
        .flow(FlowYaml::table("people", "people", "crm.customers"))
        .write(dir.path(), "exports.yaml");
    let db = Db(db_path.clone());
    let update_runs = || {
        runs(&db_path)
            .into_iter()
            .filter(|r| r.trigger == "update")
            .count()
    };
    let load = |file: &Path| {
        let out = sluice_command(&["run", "-c", file.to_str().unwrap()], None);
        assert_eq!(out.code, 0, "{}", out.all());
    };
    let worker = Worker::start(&exports, "exports");
    records(&orders_dir, "a.jsonl", "a", 100);
    load(&orders);
    // Polled every 2 s: four polls with only `orders.events` grown.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        update_runs(),
        0,
        "one table alone fired a run: {:?}",
        runs(&db_path)
    );
    records(&crm_dir, "c.jsonl", "c", 50);
    load(&crm);
    assert!(
        eventually(Duration::from_secs(60), || db
            .query("SELECT COUNT(*) FROM exports__copies")
            == 100
            && db.query("SELECT COUNT(*) FROM exports__people") == 50)
        .await,
        "{:?}\n{}",
        runs(&db_path),
        worker.logs()
    );
    assert_eq!(update_runs(), 1, "{:?}", runs(&db_path));
    // `orders.events` grows again alone: no run.
    records(&orders_dir, "b.jsonl", "b", 30);
    load(&orders);
    tokio::time::sleep(Duration::from_secs(8)).await;
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(30)).success());
    assert_eq!(update_runs(), 1, "{:?}", runs(&db_path));
    assert_eq!(db.query("SELECT COUNT(*) FROM exports__copies"), 100);
}

/// `depends_on_past: true`: the first fire's run fails (its files are missing), and the fires
/// after it wait instead of running; once `sluice backfill` completed that interval, the next
/// fire runs. (Without it, each fire would run and fail.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_depends_on_past_a_fire_waits_for_the_interval_before_it() {
    let dir = Workdir::new();
    let db_path = dir.db("past");
    let inbox = dir.path().join("inbox");
    let file = PipelineYaml::new("test")
        .mode("triggered")
        .sqlite(&db_path)
        .schedule("{ every: 4s, semantics: data_interval, depends_on_past: true }")
        .target_table("events")
        .flow(FlowYaml::file(
            "load",
            "events",
            &inbox.join("*.jsonl").display().to_string(),
        ))
        .write(dir.path(), "p.yaml");
    let worker = Worker::start(&file, "past");
    let failed = || runs(&db_path).into_iter().find(|r| r.state == "failed");
    assert!(
        eventually(Duration::from_secs(60), || failed().is_some()).await,
        "{:?}\n{}",
        runs(&db_path),
        worker.logs()
    );
    let first = failed().unwrap();
    // Three more fires come meanwhile: none runs.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(runs(&db_path).len(), 1, "{:?}", runs(&db_path));
    assert!(
        worker.logs().contains("depends_on_past"),
        "{}",
        worker.logs()
    );

    std::fs::create_dir_all(&inbox).unwrap();
    records(&inbox, "a.jsonl", "a", 10);
    let (start, end) = first.interval.unwrap();
    let at = |ms: i64| jiff::Timestamp::from_millisecond(ms).unwrap().to_string();
    let backfill = sluice_command(
        &[
            "backfill",
            "-c",
            file.to_str().unwrap(),
            "--from",
            &at(start),
            "--to",
            &at(end),
        ],
        None,
    );
    assert_eq!(backfill.code, 0, "{}", backfill.all());
    let later = || {
        runs(&db_path)
            .into_iter()
            .any(|r| r.trigger != "backfill" && r.fire_ms > first.fire_ms && r.state == "completed")
    };
    assert!(
        eventually(Duration::from_secs(60), later).await,
        "{:?}\n{}",
        runs(&db_path),
        worker.logs()
    );
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(30)).success());
    let all = runs(&db_path);
    assert_eq!(
        all.iter().filter(|r| r.state == "failed").count(),
        1,
        "only the first fire failed: {all:?}"
    );
}

/// A Pub/Sub flow in runs with data intervals reads what was published before its run's
/// interval ended; what comes after is left, unacked, for a later run (the streams are kept
/// open between runs `every: 8s` apart, so it waits in the kept source). Events are published
/// steadily through several runs of at least the flow's 12 s idle time each, so every run
/// has messages published after its end arriving while it reads: on the code before the cut
/// a run read them too (and, published steadily, never found the subscription idle).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pubsub_run_with_an_interval_leaves_what_came_after_its_end_to_the_next_run() {
    let pubsub = PubSub::connect().await;
    let (topic, subscriptions) = pubsub.topic_with("schedpsi", 1).await;
    let dir = Workdir::new();
    let db_path = dir.db("schedpsi");
    let db = Db(db_path.clone());
    let metrics_port = free_port().unwrap();
    let file = PipelineYaml::new("test")
        .sqlite(&db_path)
        .pubsub_emulator()
        .metrics(&format!("127.0.0.1:{metrics_port}"))
        .mode("triggered")
        .schedule("{ every: 8s, semantics: data_interval }")
        .target_table("events")
        .flow(
            FlowYaml::pubsub("ingest", "events", &subscriptions[0])
                .dedup_attribute("event_id")
                .drain_idle("12s"),
        )
        .write(dir.path(), "p.yaml");
    let worker = Worker::start(&file, "interval");
    let publisher = pubsub.admin.publisher(&topic).await.unwrap();
    // 5 events a second for 45 s.
    let mut published = 0;
    for tick in 0..90 {
        let batch = events_with_duplicates(&format!("t{tick}-"), 3, 0);
        published += batch.len() as i64;
        sluice_engine::pubsub::publish_all(&publisher, batch)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let published_until = now_ms();
    wait_for_a_run_after(&db_path, published_until, &worker).await;
    assert!(
        eventually(Duration::from_secs(120), || db.rows() == published).await,
        "rows {} of {published}; runs {:#?}\n{}",
        db.rows(),
        runs(&db_path),
        worker.logs()
    );
    let metrics = http_get(metrics_port, "/metrics").unwrap_or_default();
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(90)).success());

    assert_eq!(db.distinct_keys(), published, "each event once");
    let done = completed(&db_path);
    println!("runs: {done:#?}");
    let mut deferred = 0;
    for run in &done {
        let (_, end) = run.interval.expect("data_interval runs have intervals");
        let ended = run.ended_at.unwrap();
        let after_end = db.query(&format!(
            "SELECT COUNT(*) FROM test__events WHERE committed_at BETWEEN {} AND {ended} \
             AND publish_time >= {end}",
            run.started_at
        ));
        assert_eq!(
            after_end, 0,
            "run {run:?} committed what came after its end"
        );
        // Published while it read, after its end: left for a later run.
        deferred += db.query(&format!(
            "SELECT COUNT(*) FROM test__events WHERE publish_time BETWEEN {end} AND {ended} \
             AND committed_at > {ended}"
        ));
    }
    assert!(
        deferred > 0,
        "no run had messages published after its end while it read: {done:#?}"
    );
    let counted = metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix("sluice_messages_deferred_total{pipeline=\"test\",flow=\"ingest\"}")
        })
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert!(
        counted.is_some_and(|n| n > 0.0),
        "sluice_messages_deferred_total: {counted:?}"
    );
}

/// Two replicas of one pipeline with different schedules (a pipeline file changed during a
/// rollout): the lease holder fires nothing while both are alive, and says why; once the old
/// replica is gone the pool fires by the schedule left. The 20 s of disagreement hold four
/// fires of the old `every: 5s`: on the code before the check they ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_different_schedules_fire_nothing_until_they_agree() {
    let dir = Workdir::new();
    let db_path = dir.db("agree");
    let glob = dir.events_file(&[1_000, 2_000]);
    let file = |schedule: &str, name: &str| {
        PipelineYaml::new("test")
            .mode("triggered")
            .sqlite(&db_path)
            .schedule(schedule)
            .target_table("events")
            .flow(FlowYaml::file("events", "events", &glob))
            .write(dir.path(), name)
    };
    let old = Worker::start(&file("{ every: 5s }", "old.yaml"), "old");
    assert!(
        eventually(Duration::from_secs(60), || completed(&db_path).len() >= 2).await,
        "runs of the old schedule: {:?}\n{}",
        runs(&db_path),
        old.logs()
    );
    let new = Worker::start(&file("{ every: 7s }", "new.yaml"), "new");
    let said = "replicas of this pipeline run different schedules";
    assert!(
        eventually(Duration::from_secs(60), || old.logs().contains(said)).await,
        "the holder never noticed: {}",
        old.logs()
    );
    let noticed = now_ms();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let started_meanwhile: Vec<Run> = runs(&db_path)
        .into_iter()
        .filter(|r| r.started_at > noticed)
        .collect();
    assert!(
        started_meanwhile.is_empty(),
        "runs started while the replicas disagreed: {started_meanwhile:#?}"
    );
    old.terminate();
    assert!(old.wait(Duration::from_secs(60)).success());
    let left = now_ms();
    assert!(
        eventually(Duration::from_secs(90), || completed(&db_path)
            .iter()
            .any(|r| r.started_at > left && r.fire_ms % 7_000 == 0))
        .await,
        "no run of the schedule left: {:#?}\n{}",
        runs(&db_path),
        new.logs()
    );
    new.terminate();
    assert!(new.wait(Duration::from_secs(60)).success());
    assert_eq!(Db(db_path.clone()).rows(), 2, "each record once");
}
