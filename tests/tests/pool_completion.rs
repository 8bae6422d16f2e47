//! Flow completion is shared through the store: a backfill (a once flow) drained by one worker
//! is IDLE, not re-read, for a worker that starts later and for the first worker's restart, and
//! the live flow that `depends_on` it starts at once on both.
//!
//! Real parts: the Pub/Sub emulator and PostgreSQL on 127.0.0.1:5432 (a fresh database).
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_store::ScratchDatabase;
use sluice_tests::{
    FlowYaml, PgDb, PipelineYaml, PubSub, Workdir, Worker, event, eventually, sluice_command,
};
use std::time::Duration;

fn pipeline(dir: &Workdir, store: &str, backfill: &str, live: &str) -> std::path::PathBuf {
    PipelineYaml::new("test")
        .mode("continuous")
        .store(store)
        .pubsub_emulator()
        .target_table("events")
        .flow(
            FlowYaml::pubsub("backfill", "events", backfill)
                .once()
                .dedup_attribute("event_id")
                .drain_idle("3s")
                .streams(2),
        )
        .flow(
            FlowYaml::pubsub("live", "events", live)
                .depends_on(&["backfill"])
                .dedup_attribute("event_id")
                .streams(2),
        )
        .write(dir.path(), "p.yaml")
}

fn rows_of(db: &PgDb, flow: &str) -> i64 {
    db.query(&format!(
        "SELECT count(*) FROM test__events WHERE flow = '{flow}'"
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_drained_backfill_is_idle_for_every_replica_and_after_restart() {
    let database = ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let pubsub = PubSub::connect().await;
    let (history, history_subs) = pubsub.topic_with("history", 1).await;
    let (live, live_subs) = pubsub.topic_with("live", 1).await;
    let dir = Workdir::new();
    let file = pipeline(&dir, database.url(), &history_subs[0], &live_subs[0]);
    pubsub
        .publish(
            &history,
            (0..400).map(|i| event(&format!("h{i}"))).collect(),
        )
        .await;

    let first = Worker::start(&file, "first");
    assert!(
        eventually(Duration::from_secs(120), || {
            db.query("SELECT count(*) FROM sluice_completions") == 1
        })
        .await,
        "the backfill never completed; logs:\n{}",
        first.logs()
    );
    assert_eq!(rows_of(&db, "backfill"), 400);

    // History published after the backfill completed is not read by anyone: a replica
    // started now, and the first worker restarted, both leave the backfill IDLE.
    pubsub
        .publish(
            &history,
            (0..100).map(|i| event(&format!("late{i}"))).collect(),
        )
        .await;
    let second = Worker::start(&file, "second");
    pubsub
        .publish(&live, (0..300).map(|i| event(&format!("l{i}"))).collect())
        .await;
    assert!(
        eventually(Duration::from_secs(120), || rows_of(&db, "live") == 300).await,
        "live rows: {}",
        rows_of(&db, "live")
    );
    first.terminate();
    assert!(first.wait(Duration::from_secs(60)).success());
    let restarted = Worker::start(&file, "restarted");
    pubsub
        .publish(&live, (0..200).map(|i| event(&format!("m{i}"))).collect())
        .await;
    assert!(eventually(Duration::from_secs(120), || rows_of(&db, "live") == 500).await);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        rows_of(&db, "backfill"),
        400,
        "the backfill was not re-read"
    );

    // `sluice status` reads the same from the store: counts, completion, the two live workers
    // and the upkeep lease.
    let status = |format: &str| {
        let out = sluice_command(
            &["status", "-c", file.to_str().unwrap(), "--format", format],
            None,
        );
        assert_eq!(out.code, 0, "{}", out.stderr);
        out.stdout
    };
    let json: serde_json::Value = serde_json::from_str(&status("json")).unwrap();
    assert_eq!(json["flows"][0]["flow"], "backfill");
    assert_eq!(json["flows"][0]["state"], "COMPLETED");
    assert_eq!(json["flows"][0]["rows"], 400);
    assert_eq!(json["flows"][1]["state"], "LIVE");
    assert_eq!(json["flows"][1]["rows"], 500);
    assert_eq!(json["workers"].as_array().unwrap().len(), 2, "{json}");
    assert_eq!(json["leases"][0]["role"], "ledger_upkeep");
    let text = status("text");
    assert!(text.contains("2 worker(s) alive"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("backfill") && l.contains("COMPLETED")),
        "{text}"
    );
    eprintln!("{text}");
    for worker in [second, restarted] {
        worker.terminate();
        let logs = worker.logs();
        assert!(worker.wait(Duration::from_secs(60)).success(), "{logs}");
    }
    for name in ["second", "restarted"] {
        let out = std::fs::read_to_string(dir.path().join(format!("{name}.out"))).unwrap();
        assert!(
            out.contains("flow backfill: IDLE (completed earlier; not re-read)"),
            "{name}: {out}"
        );
        assert!(out.contains("flow live: STOPPED"), "{name}: {out}");
    }
    assert_eq!(
        db.distinct_keys(),
        900,
        "400 backfill rows and 500 live rows, each once"
    );
}
