//! A scheduled pipeline in a pool of two workers on PostgreSQL (the real emulator, `sluice`
//! processes): one replica runs each fire (the `scheduler` lease; each fire recorded once in
//! `sluice_runs`), and when the replica running a fire is SIGKILLed mid-run, the other takes
//! the lease over and finishes that same run (same run id, now its own) before any later
//! fire, which it runs alone; runs never overlap, and every event lands once.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::{
    PgDb, PipelineYaml, PubSub, Workdir, Worker, events_with_duplicates, eventually, stop_all,
};
use std::time::Duration;

/// The newest run that is still running: (run id, worker).
fn running(db: &PgDb) -> Option<(i64, String)> {
    let text = db.text(
        "SELECT run_id || ' ' || worker FROM sluice_runs WHERE state = 'running'
         ORDER BY run_id DESC LIMIT 1",
    );
    let (id, worker) = text.split_once(' ')?;
    Some((id.parse().ok()?, worker.to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fire_is_run_once_and_finished_by_the_other_replica_when_its_runner_dies() {
    let database = sluice_store::ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let pubsub = PubSub::connect().await;
    let (topic, subscriptions) = pubsub.topic_with("poolsched", 1).await;
    let dir = Workdir::new();
    let file = PipelineYaml::new("test")
        .store(&format!("{}?pool_size=4", database.url()))
        .pubsub_emulator()
        .ingest_every_five_seconds(&subscriptions[0])
        .write(dir.path(), "p.yaml");
    pubsub
        .publish(&topic, events_with_duplicates("a", 300, 30))
        .await;
    let mut workers = vec![Worker::start(&file, "w0"), Worker::start(&file, "w1")];

    // A run goes on (it lasts at least `drain_idle`): kill the replica running it.
    let mut target = None;
    assert!(
        eventually(Duration::from_secs(90), || {
            target = running(&db);
            target.is_some()
        })
        .await,
        "no run started:\n{}",
        workers[0].logs()
    );
    let (run_id, runner) = target.unwrap();
    let victim = workers
        .iter()
        .position(|w| runner.contains(&format!("-{}-", w.pid())))
        .unwrap_or_else(|| panic!("runner {runner} is none of the workers"));
    let killed = workers.remove(victim);
    killed.kill9();
    pubsub
        .publish(&topic, events_with_duplicates("b", 300, 30))
        .await;

    // The survivor takes the lease (at most 15 s + a beat) and finishes that run as its own.
    let finished = format!(
        "SELECT COUNT(*) FROM sluice_runs WHERE run_id = {run_id} AND state = 'completed'
         AND worker <> '{runner}'"
    );
    assert!(
        eventually(Duration::from_secs(180), || db.query(&finished) == 1).await,
        "run {run_id} not finished by the survivor: {}\n{}",
        db.text("SELECT string_agg(run_id || ':' || state || ':' || worker, ' ') FROM sluice_runs"),
        workers[0].logs()
    );
    assert!(
        eventually(Duration::from_secs(180), || db.rows() == 600).await,
        "rows {} of 600:\n{}",
        db.rows(),
        workers[0].logs()
    );
    stop_all(workers);

    db.assert_exactly_once(600);
    // Runs never overlap: each ended before the next began (the finished run counts from its
    // first start, on the replica that died).
    let overlaps = db.query(
        "SELECT COUNT(*) FROM sluice_runs a JOIN sluice_runs b ON b.fire_ms > a.fire_ms
         WHERE a.state = 'completed' AND b.started_at < a.ended_at",
    );
    assert_eq!(overlaps, 0, "runs overlapped");
    assert_eq!(
        db.query("SELECT COUNT(*) FROM sluice_runs WHERE trigger <> 'schedule'"),
        0
    );
    let runners =
        db.query("SELECT COUNT(DISTINCT worker) FROM sluice_runs WHERE state = 'completed'");
    assert_eq!(runners, 1, "after the kill one replica ran every fire");
}
