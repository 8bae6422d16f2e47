//! Operations on a running pool of three replicas on PostgreSQL: `sluice reset FLOW` while
//! they run and messages flow replays that flow once and nothing else; `sluice status` shows
//! the pool update while it is in progress.
//!
//! Real parts: the Pub/Sub emulator (the live flow's traffic, published throughout), three
//! `sluice` processes, the `sluice reset` and `sluice status` commands, PostgreSQL on
//! 127.0.0.1:5432 (a fresh database), a JSONL file for the backfill.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_bench::free_port;
use sluice_store::ScratchDatabase;
use sluice_tests::{
    FlowYaml, PgDb, PipelineYaml, PubSub, Workdir, Worker, event, eventually, publish_in_chunks,
    sluice_bin, stop_all,
};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const HISTORY: usize = 20_000;
const LIVE: usize = 6_000;

#[tokio::test(flavor = "multi_thread")]
async fn a_reset_of_a_running_pool_replays_that_flow_once_and_nothing_else() {
    let database = ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let dir = Workdir::new();
    let history = dir.path().join("history.jsonl");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&history).unwrap());
    for i in 0..HISTORY {
        writeln!(out, r#"{{"id":"h{i}","data":{{"n":{i}}}}}"#).unwrap();
    }
    out.flush().unwrap();
    drop(out);
    let pubsub = PubSub::connect().await;
    let (topic, subscriptions) = pubsub.topic_with("reset", 1).await;
    let files: Vec<_> = (0..3)
        .map(|i| {
            PipelineYaml::new("test")
                .mode("continuous")
                .store(database.url())
                .pubsub_emulator()
                .metrics(&format!("127.0.0.1:{}", free_port().unwrap()))
                .target_table("history")
                .target_table("events")
                .flow(FlowYaml::file("backfill", "history", history.to_str().unwrap()).once())
                .flow(
                    FlowYaml::pubsub("live", "events", &subscriptions[0])
                        .dedup_attribute("event_id"),
                )
                .write(dir.path(), &format!("w{i}.yaml"))
        })
        .collect();
    let workers: Vec<Worker> = files
        .iter()
        .enumerate()
        .map(|(i, file)| Worker::start(file, &format!("w{i}")))
        .collect();
    let logs = |workers: &[Worker]| {
        workers
            .iter()
            .map(Worker::logs)
            .collect::<Vec<_>>()
            .join("\n----\n")
    };
    let rows = |table: &str| db.query(&format!("SELECT count(*) FROM test__{table}"));
    let completions = || db.query("SELECT count(*) FROM sluice_completions");
    let publisher = publish_in_chunks(
        &topic,
        (0..LIVE).map(|i| event(&format!("e{i}"))).collect(),
        100,
        Duration::from_millis(400),
    )
    .await;
    assert!(
        eventually(Duration::from_secs(180), || completions() == 1
            && rows("events") > 0)
        .await,
        "the backfill never completed: {}",
        logs(&workers)
    );
    assert_eq!(rows("history"), HISTORY as i64);
    let before = db.text("SELECT max(committed_at) FROM test__history");
    let live_before = rows("events");
    let cutoff = db.text("SELECT now()");

    // The reset, while the three run and messages flow; `status` is polled meanwhile.
    let started = Instant::now();
    let mut reset = Command::new(sluice_bin())
        .args(["reset", "backfill", "-c", files[0].to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut status_seen = String::new();
    while reset.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "the reset never ended: {}",
            logs(&workers)
        );
        let status = Command::new(sluice_bin())
            .args(["status", "-c", files[1].to_str().unwrap()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&status.stdout).into_owned();
        if text.contains("pool update") {
            status_seen = text;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let out = reset.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{stdout}\n{stderr}\n{}",
        logs(&workers)
    );
    assert!(
        stdout.contains("done: flow backfill reset"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("3 worker(s) of pipeline test are running"),
        "the reset went through the pool: {stderr}"
    );
    println!("status during the update:\n{status_seen}");
    assert!(
        status_seen.contains("in progress") && status_seen.contains("flows stopped"),
        "`sluice status` never showed the pool update"
    );
    for worker in &workers {
        assert!(
            eventually(Duration::from_secs(30), || worker
                .logs()
                .contains("pool update done; resuming"))
            .await,
            "{}",
            worker.logs()
        );
    }

    // The backfill runs again, once; the live flow loses and repeats nothing.
    assert!(
        eventually(Duration::from_secs(180), || completions() == 1
            && rows("history") == HISTORY as i64)
        .await,
        "the backfill did not run again: {} rows; {}",
        rows("history"),
        logs(&workers)
    );
    publisher.await.unwrap();
    assert!(
        eventually(Duration::from_secs(180), || rows("events") >= LIVE as i64).await,
        "{} of {LIVE} live rows; {}",
        rows("events"),
        logs(&workers)
    );
    let replayed = db.query(&format!(
        "SELECT count(*) FROM test__history WHERE committed_at > '{before}'"
    ));
    assert_eq!(replayed, HISTORY as i64, "every history row written again");
    assert_eq!(
        db.query("SELECT count(DISTINCT dedup_key) FROM test__history"),
        HISTORY as i64
    );
    let kept = db.query(&format!(
        "SELECT count(*) FROM test__events WHERE committed_at <= '{cutoff}'"
    ));
    assert!(
        kept >= live_before,
        "live rows from before the reset were rewritten: {kept} < {live_before}"
    );
    db.assert_exactly_once(LIVE);
    stop_all(workers);
}
