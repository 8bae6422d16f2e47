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

/// A run asked through the control API of the replica that does not hold the scheduler lease
/// waits for the fire in progress, runs, and is not recorded failed by the scheduler while it
/// runs; no two runs of the pool overlap. (Before the fix the asked replica started its run at
/// once, beside the fire's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_asked_of_the_other_replica_never_overlaps_a_fire() {
    use sluice_proto::v1::StartUpdateRequest;
    use sluice_proto::v1::control_client::ControlClient;
    const TOKEN: &str = "pool-schedule-token";
    let database = sluice_store::ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let pubsub = PubSub::connect().await;
    let (topic, subscriptions) = pubsub.topic_with("poolmanual", 1).await;
    let dir = Workdir::new();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let ports = [
        sluice_bench::free_port().unwrap(),
        sluice_bench::free_port().unwrap(),
    ];
    let files: Vec<_> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            PipelineYaml::new("test")
                .store(&format!("{}?pool_size=4", database.url()))
                .pubsub_emulator()
                .control(&format!(
                    "{{ listen: \"127.0.0.1:{port}\", token_file: \"{}\" }}",
                    token_file.display()
                ))
                .ingest_every_five_seconds(&subscriptions[0])
                .write(dir.path(), &format!("p{i}.yaml"))
        })
        .collect();
    pubsub
        .publish(&topic, events_with_duplicates("m", 200, 20))
        .await;
    let workers = vec![
        Worker::start(&files[0], "w0"),
        Worker::start(&files[1], "w1"),
    ];

    // While a fire runs, ask the other replica for a run.
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
    let (fire_run, runner) = target.unwrap();
    let other = workers
        .iter()
        .position(|w| !runner.contains(&format!("-{}-", w.pid())))
        .unwrap();
    let mut client = ControlClient::connect(format!("http://127.0.0.1:{}", ports[other]))
        .await
        .unwrap();
    let mut request = tonic::Request::new(StartUpdateRequest {
        full_refresh: false,
        refresh_flows: Vec::new(),
    });
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    client.start_update(request).await.unwrap();
    assert_eq!(
        db.query(&format!(
            "SELECT COUNT(*) FROM sluice_runs WHERE run_id = {fire_run} AND state = 'running'"
        )),
        1,
        "the fire's run was still going on when the other replica was asked"
    );

    let manual =
        "SELECT COUNT(*) FROM sluice_runs WHERE trigger = 'manual' AND state = 'completed'";
    assert!(
        eventually(Duration::from_secs(120), || db.query(manual) == 1).await,
        "the asked run never completed: {}\n{}",
        db.text(
            "SELECT string_agg(run_id || ':' || trigger || ':' || state, ' ') FROM sluice_runs"
        ),
        workers[other].logs()
    );
    // A fire after it, so the scheduler looked at the asked run while it ran.
    let after = "SELECT COUNT(*) FROM sluice_runs r JOIN sluice_runs m ON m.trigger = 'manual' \
                 WHERE r.trigger = 'schedule' AND r.state = 'completed' AND r.run_id > m.run_id";
    assert!(eventually(Duration::from_secs(90), || db.query(after) >= 1).await);
    stop_all(workers);
    let overlaps = db.query(
        "SELECT COUNT(*) FROM sluice_runs a JOIN sluice_runs b ON b.run_id > a.run_id
         WHERE a.ended_at IS NOT NULL AND b.started_at < a.ended_at
           AND a.started_at < coalesce(b.ended_at, now())",
    );
    println!(
        "runs: {}",
        db.text(
            "SELECT string_agg(run_id || ':' || trigger || ':' || state || ':' || worker || ':' \
             || to_char(started_at, 'HH24:MI:SS.MS') || '-' \
             || coalesce(to_char(ended_at, 'HH24:MI:SS.MS'), ''), ' ' ORDER BY run_id) \
             FROM sluice_runs"
        )
    );
    assert_eq!(overlaps, 0, "runs overlapped");
    assert_eq!(
        db.query("SELECT COUNT(*) FROM sluice_runs WHERE state = 'failed'"),
        0,
        "no run recorded failed"
    );
}
