//! A pool update's timings, end to end on a running pool of two workers on PostgreSQL: an
//! update that a live replica never stops for is withdrawn by its asker after the drain wait,
//! and by a participant after twice that when the asker died, with nothing cleared; a clear
//! that a deadlock rolls back is run again. The waits are shortened for the test through the
//! environment (`SLUICE_POOL_UPDATE_DRAIN_WAIT`, the same setting an operator would use).
//!
//! The replica that never stops is this test beating for a worker id in `sluice_workers`
//! every 2 s, as a replica of an older version that knows no pool updates would. The deadlock
//! is made by a test session that locks a table the clear deletes from (`sluice_commit_marks`,
//! which only sink flows write, so no worker waits for it otherwise), waits until the clear
//! waits for it (seen in `pg_stat_activity` from another session), then asks for the flow's
//! row the clear holds: PostgreSQL aborts one of the two (the clear: the test session's
//! `deadlock_timeout` is long).
//!
//! Real parts: PostgreSQL on 127.0.0.1:5432 (a fresh database each), the Pub/Sub emulator (a
//! live flow beside the backfill keeps the workers running), two `sluice` workers and the
//! `sluice reset` command, a JSONL file backfill.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_store::ScratchDatabase;
use sluice_tests::{
    FlowYaml, PgDb, PipelineYaml, PubSub, Workdir, Worker, eventually, sluice_bin, stop_all,
};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const RECORDS: usize = 2_000;
const DRAIN_WAIT: &str = "15s";

/// A pipeline of a once flow, `backfill`, from a file of `RECORDS` records, and a live flow
/// (which keeps the workers running once the backfill is done); its file.
async fn backfill_pipeline(dir: &Workdir, store: &str) -> PathBuf {
    let pubsub = PubSub::connect().await;
    let (_topic, subscriptions) = pubsub.topic_with("timings", 1).await;
    let history = dir.path().join("history.jsonl");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&history).unwrap());
    for i in 0..RECORDS {
        writeln!(out, r#"{{"id":"h{i}","data":{{"n":{i}}}}}"#).unwrap();
    }
    out.flush().unwrap();
    PipelineYaml::new("test")
        .mode("continuous")
        .store(store)
        .pubsub_emulator()
        .target_table("history")
        .target_table("events")
        .flow(FlowYaml::file("backfill", "history", history.to_str().unwrap()).once())
        .flow(FlowYaml::pubsub("live", "events", &subscriptions[0]).dedup_attribute("event_id"))
        .write(dir.path(), "p.yaml")
}

fn env() -> Vec<(String, String)> {
    vec![(
        "SLUICE_POOL_UPDATE_DRAIN_WAIT".to_owned(),
        DRAIN_WAIT.to_owned(),
    )]
}

fn start_workers(file: &Path, dir: &Workdir) -> Vec<Worker> {
    (0..2)
        .map(|i| {
            Worker::spawn_with_env(
                &["run", "-c", file.to_str().unwrap()],
                &env(),
                dir.path(),
                &format!("w{i}"),
            )
        })
        .collect()
}

fn reset(file: &Path) -> Child {
    Command::new(sluice_bin())
        .args(["reset", "backfill", "-c", file.to_str().unwrap()])
        .envs(env())
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(child: Child) -> (i32, String) {
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn logs(workers: &[Worker]) -> String {
    workers
        .iter()
        .map(Worker::logs)
        .collect::<Vec<_>>()
        .join("\n----\n")
}

/// Beats for `worker` in the store every 2 s until the returned guard is dropped: a live
/// replica that never takes part in pool updates.
fn ghost(db: &PgDb, worker: &str) -> tokio_util::sync::DropGuard {
    let stop = tokio_util::sync::CancellationToken::new();
    let (url, worker, stopped) = (db.0.clone(), worker.to_owned(), stop.clone());
    tokio::spawn(async move {
        let db = PgDb(url);
        while !stopped.is_cancelled() {
            db.text(&format!(
                "INSERT INTO sluice_workers (pipeline, worker, host, pid, started_at, last_beat)
                 VALUES ('test', '{worker}', 'old', 1, now(), now())
                 ON CONFLICT (pipeline, worker) DO UPDATE SET last_beat = now()"
            ));
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    });
    stop.drop_guard()
}

async fn backfilled(db: &PgDb, workers: &[Worker]) {
    assert!(
        eventually(Duration::from_secs(120), || db
            .query("SELECT count(*) FROM sluice_completions")
            == 1)
        .await,
        "the backfill never completed: {}",
        logs(workers)
    );
    assert_eq!(
        db.query("SELECT count(*) FROM test__history"),
        RECORDS as i64
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_update_a_live_replica_never_stops_for_is_withdrawn_and_clears_nothing() {
    let database = ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let dir = Workdir::new();
    let file = backfill_pipeline(&dir, database.url()).await;
    let workers = start_workers(&file, &dir);
    backfilled(&db, &workers).await;
    let written_before = db.text("SELECT max(committed_at) FROM test__history");
    let _ghost = ghost(&db, "old-replica");

    // The asker withdraws after the drain wait.
    let started = Instant::now();
    let (code, out) = finish(reset(&file));
    let waited = started.elapsed();
    println!("withdrawn by its asker after {waited:?}: {out}");
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("withdrawn: old-replica did not stop its flows within 15 s")
            && out.contains("nothing was cleared"),
        "{out}"
    );
    assert!(
        waited >= Duration::from_secs(15),
        "withdrawn only after the wait"
    );

    // The asker dies: a participant withdraws after twice the wait.
    let mut asker = reset(&file);
    assert!(
        eventually(Duration::from_secs(30), || db.query(
            "SELECT count(*) FROM sluice_pool_updates WHERE state = 'pending'"
        ) == 1)
        .await
    );
    asker.kill().unwrap();
    asker.wait().unwrap();
    let asked = Instant::now();
    assert!(
        eventually(Duration::from_secs(90), || db.query(
            "SELECT count(*) FROM sluice_pool_updates WHERE state = 'failed'"
        ) == 2)
        .await,
        "the orphaned update was never withdrawn: {}",
        logs(&workers)
    );
    let withdrawn_after = asked.elapsed();
    println!("withdrawn by a participant {withdrawn_after:?} after the asker died");
    for worker in &workers {
        assert!(
            eventually(Duration::from_secs(30), || worker
                .logs()
                .matches("pool update failed; resuming")
                .count()
                == 2)
            .await,
            "{}",
            worker.logs()
        );
    }
    // Nothing was cleared: the backfill's rows and completion stay.
    assert_eq!(db.query("SELECT count(*) FROM sluice_completions"), 1);
    assert_eq!(
        db.query("SELECT count(*) FROM test__history"),
        RECORDS as i64
    );
    assert_eq!(
        db.text("SELECT max(committed_at) FROM test__history"),
        written_before
    );
    stop_all(workers);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clear_a_deadlock_rolls_back_is_run_again() {
    let database = ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let dir = Workdir::new();
    let file = backfill_pipeline(&dir, database.url()).await;
    let workers = start_workers(&file, &dir);
    backfilled(&db, &workers).await;
    let flow_id = db.query("SELECT flow_id FROM sluice_flows WHERE flow = 'backfill'");

    let (client, connection) = tokio_postgres::connect(database.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(
            "SET deadlock_timeout = '1h'; BEGIN; \
             LOCK TABLE sluice_commit_marks IN ACCESS EXCLUSIVE MODE",
        )
        .await
        .unwrap();
    // Another session watches: within the locking transaction, pg_stat_activity would show
    // the snapshot of its first read.
    let (watch, connection) = tokio_postgres::connect(database.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let resetting = reset(&file);
    // The clear holds the flow's row and waits for the locked table.
    let clearing = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                    AND wait_event_type = 'Lock' AND query LIKE 'DELETE FROM sluice_commit_marks%'";
    let started = Instant::now();
    while watch
        .query_one(clearing, &[])
        .await
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        if started.elapsed() > Duration::from_secs(120) {
            let waiting: Vec<String> = watch
                .query(
                    "SELECT coalesce(wait_event_type, '') || ' ' || state || ': ' || query \
                     FROM pg_stat_activity WHERE datname = current_database()",
                    &[],
                )
                .await
                .unwrap()
                .iter()
                .map(|row| row.get(0))
                .collect();
            panic!(
                "the clear never reached the locked table; sessions: {waiting:#?}\n{}",
                logs(&workers)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Now the cycle: this session waits for the clear's row, the clear for this session.
    client
        .execute(
            "SELECT 1 FROM sluice_flows WHERE flow_id = $1 FOR UPDATE",
            &[&flow_id],
        )
        .await
        .unwrap();
    client.batch_execute("COMMIT").await.unwrap();
    let (code, out) = finish(resetting);
    let all = format!("{out}\n{}", logs(&workers));
    assert_eq!(code, 0, "{all}");
    assert!(
        all.contains("the clear met a deadlock; clearing again"),
        "the clear was rolled back by the deadlock and run again: {all}"
    );
    // Cleared once, read again once.
    backfilled(&db, &workers).await;
    assert_eq!(
        db.query("SELECT count(DISTINCT dedup_key) FROM test__history"),
        RECORDS as i64
    );
    stop_all(workers);
}
