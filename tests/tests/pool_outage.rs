//! PostgreSQL is stopped for 15 seconds in the middle of a run and started again: two workers
//! retry their commits with backoff (acking nothing meanwhile, their Pub/Sub leases extended),
//! recover by themselves, and every distinct key lands exactly once.
//!
//! Real parts: the Pub/Sub emulator and the machine's PostgreSQL server, stopped and started
//! with `pg_ctlcluster` (this test binary holds a single test, and test binaries run one after
//! another, so no other test is using the server meanwhile). A guard restarts the server if the
//! test fails half-way.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::{
    PostgresPipeline, PubSub, Worker, events_with_duplicates, eventually, stop_all,
};
use std::process::Command;
use std::time::Duration;

/// The local cluster, as `pg_ctlcluster` names it (`<version> main`).
fn pg_ctl(action: &str) {
    let version = std::fs::read_dir("/etc/postgresql")
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_name();
    let status = Command::new("pg_ctlcluster")
        .arg("--skip-systemctl-redirect")
        .arg(&version)
        .args(["main", action, "-m", "fast"])
        .status()
        .unwrap();
    assert!(status.success(), "pg_ctlcluster {action} failed");
}

fn postgres_ready() -> bool {
    Command::new("pg_isready")
        .args(["-h", "127.0.0.1", "-q"])
        .status()
        .is_ok_and(|s| s.success())
}

/// Starts the server again when dropped (also when the test panics while it is down).
struct Stopped;

impl Stopped {
    fn now() -> Self {
        pg_ctl("stop");
        assert!(!postgres_ready());
        Stopped
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if !postgres_ready() {
            let version = std::fs::read_dir("/etc/postgresql")
                .ok()
                .and_then(|mut d| d.next())
                .and_then(Result::ok)
                .map(|e| e.file_name());
            if let Some(version) = version {
                let _ = Command::new("pg_ctlcluster")
                    .arg("--skip-systemctl-redirect")
                    .arg(version)
                    .args(["main", "start"])
                    .status();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fifteen_second_database_outage_loses_nothing_and_duplicates_nothing() {
    const DISTINCT: usize = 20_000;
    const DUPLICATES: usize = 2_000;
    let PostgresPipeline {
        database: _database,
        db,
        pubsub,
        topic,
        subscription,
        dir: _dir,
        file,
    } = PostgresPipeline::create("outage", "").await;
    let mut workers = vec![Worker::start(&file, "a"), Worker::start(&file, "b")];
    let messages = events_with_duplicates("o", DISTINCT, DUPLICATES);
    let publisher = {
        let pubsub = PubSub::connect().await;
        let topic = topic.clone();
        let chunks: Vec<_> = messages.chunks(1_000).map(|c| c.to_vec()).collect();
        tokio::spawn(async move {
            for chunk in chunks {
                pubsub.publish(&topic, chunk).await;
                tokio::time::sleep(Duration::from_millis(700)).await;
            }
        })
    };
    assert!(eventually(Duration::from_secs(120), || db.rows() > 2_000).await);

    let outage = Stopped::now();
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(
        workers.iter_mut().all(Worker::is_running),
        "workers survive the outage"
    );
    pg_ctl("start");
    assert!(eventually(Duration::from_secs(30), postgres_ready).await);
    drop(outage);
    publisher.await.unwrap();

    let landed = eventually(Duration::from_secs(600), || db.rows() >= DISTINCT as i64).await;
    assert!(landed, "only {} of {DISTINCT} rows", db.rows());
    tokio::time::sleep(Duration::from_secs(20)).await;
    let logs = stop_all(workers);
    db.assert_exactly_once(DISTINCT);
    let all_logs = logs.join("\n");
    assert!(
        all_logs.contains("store unavailable; retrying the commit"),
        "commits were retried during the outage:\n{all_logs}"
    );
    assert!(all_logs.contains("store reachable again"), "{all_logs}");
    let left = sluice_tests::unacked_messages(&pubsub, &subscription, 0).await;
    assert!(left.is_empty(), "{} messages left unacked", left.len());
}
