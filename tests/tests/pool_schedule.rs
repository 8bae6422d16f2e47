//! A scheduled pipeline in a pool of two workers on PostgreSQL (the real emulator, `sluice`
//! processes): one replica runs each fire (the `scheduler` lease; each fire recorded once in
//! `sluice_runs`), and when the replica running a fire is SIGKILLed mid-run, the other takes
//! the lease over and finishes that same run (same run id, now its own) before any later
//! fire, which it runs alone; runs never overlap, and every event lands once.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::{
    FlowYaml, PgDb, PipelineYaml, PubSub, Workdir, Worker, events_with_duplicates, eventually,
    sluice_command, stop_all,
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

/// Two replicas of a scheduled pipeline on PostgreSQL (`every: 5s`, `data_interval`, from 12
/// intervals back, with catch-up) catch up the past intervals and fire live ones while
/// `sluice backfill` runs the same 12 past ones beside them, then `sluice backfill --rerun`
/// runs 3 of those again after the file changed for them. Every interval is run once by the
/// scheduler or the backfill (whoever begins it second records it done without running it),
/// runs never overlap across the three processes, the rerun's intervals hold exactly the new
/// records, and the intervals the pool fired meanwhile are unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_a_backfill_and_a_rerun_run_each_interval_once() {
    const INTERVAL_MS: i64 = 5_000;
    let database = sluice_store::ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let dir = Workdir::new();
    let now = sluice_tests::now_ms() / INTERVAL_MS * INTERVAL_MS;
    let from = now - 12 * INTERVAL_MS;
    let history = dir.path().join("history");
    std::fs::create_dir_all(&history).unwrap();
    let write = |records: &[(i64, &str)]| {
        let lines: String = records
            .iter()
            .map(|(t, v)| {
                format!("{{\"id\":\"e{t}\",\"event_time\":{t},\"attributes\":{{\"v\":\"{v}\"}}}}\n")
            })
            .collect();
        // Whole or not at all for a run reading it meanwhile.
        let next = history.join("events.jsonl.next");
        std::fs::write(&next, lines).unwrap();
        std::fs::rename(&next, history.join("events.jsonl")).unwrap();
    };
    // A record a second, from 12 intervals back to 30 s ahead.
    let until = now + 30_000;
    let before: Vec<(i64, &str)> = (0..)
        .map(|i| from + i * 1_000)
        .take_while(|t| *t < until)
        .map(|t| (t, "old"))
        .collect();
    write(&before);
    let start_date = jiff::Timestamp::from_millisecond(from).unwrap();
    let file = PipelineYaml::new("test")
        .store(&format!("{}?pool_size=4", database.url()))
        .mode("triggered")
        .schedule(&format!(
            "{{ every: 5s, semantics: data_interval, catchup: true, start_date: \"{start_date}\" }}"
        ))
        .target_table("events")
        .flow(FlowYaml::file(
            "events",
            "events",
            &history.join("*.jsonl").display().to_string(),
        ))
        .write(dir.path(), "p.yaml");
    let config = file.to_str().unwrap();
    let at = |k: i64| {
        jiff::Timestamp::from_millisecond(from + k * INTERVAL_MS)
            .unwrap()
            .to_string()
    };
    let workers = vec![Worker::start(&file, "w0"), Worker::start(&file, "w1")];
    let backfill = sluice_command(
        &["backfill", "-c", config, "--from", &at(0), "--to", &at(12)],
        None,
    );
    assert_eq!(backfill.code, 0, "{}", backfill.all());

    // Intervals 2 to 4 change: new values, and the first record of each gone.
    let in_rerun = |t: i64| (from + 2 * INTERVAL_MS..from + 5 * INTERVAL_MS).contains(&t);
    let after: Vec<(i64, &str)> = before
        .iter()
        .filter(|(t, _)| !(in_rerun(*t) && (t - from) % INTERVAL_MS == 0))
        .map(|(t, v)| (*t, if in_rerun(*t) { "new" } else { *v }))
        .collect();
    write(&after);
    let rerun = sluice_command(
        &[
            "backfill",
            "-c",
            config,
            "--from",
            &at(2),
            "--to",
            &at(5),
            "--rerun",
        ],
        None,
    );
    assert_eq!(rerun.code, 0, "{}", rerun.all());
    let rerun_ended = sluice_tests::now_ms();
    // The pool fires on, after the rerun and past the file's last record.
    let done_past_until = format!(
        "SELECT COUNT(*) FROM sluice_runs WHERE state = 'completed' AND trigger = 'schedule'
         AND interval_end > {until} AND started_at > to_timestamp({rerun_ended} / 1000.0)"
    );
    assert!(
        eventually(Duration::from_secs(120), || db.query(&done_past_until) > 0).await,
        "the pool stopped firing: {}\n{}",
        db.text(
            "SELECT string_agg(run_id || ':' || trigger || ':' || state, ' ') FROM sluice_runs"
        ),
        workers[0].logs()
    );
    stop_all(workers);

    println!(
        "runs: {}",
        db.text(
            "SELECT string_agg(trigger || ' [' || interval_start || ', ' || interval_end || ') ' \
             || state || ' ' || rows, E'\\n' ORDER BY run_id) FROM sluice_runs"
        )
    );
    // Each record once, as the file holds it now.
    assert_eq!(db.rows(), after.len() as i64);
    assert_eq!(db.distinct_keys(), after.len() as i64);
    for (t, v) in &after {
        assert_eq!(
            db.query(&format!(
                "SELECT COUNT(*) FROM test__events WHERE dedup_key = 'e{t}' \
                 AND attributes->>'v' = '{v}' \
                 AND (extract(epoch FROM event_time) * 1000)::bigint = {t}"
            )),
            1,
            "e{t} with v = {v}"
        );
    }
    // Every interval run once (a run that found its interval done records no flow's rows).
    let twice = db.text(
        "SELECT string_agg(interval_start::text, ', ') FROM (
             SELECT interval_start FROM sluice_runs
             WHERE state = 'completed' AND trigger <> 'rerun' AND rows <> '{}'
             GROUP BY interval_start HAVING COUNT(*) > 1) twice",
    );
    assert_eq!(twice, "", "intervals run twice");
    let reruns = db.text(
        "SELECT string_agg(interval_start::text, ',' ORDER BY interval_start) FROM sluice_runs
         WHERE trigger = 'rerun' AND state = 'completed'",
    );
    let expected: Vec<String> = (2..5)
        .map(|k| (from + k * INTERVAL_MS).to_string())
        .collect();
    assert_eq!(reruns, expected.join(","));
    // Of the runs that ran flows: one that found its interval run by another waited, queued
    // from its start, and ran nothing.
    let overlaps = db.query(
        "SELECT COUNT(*) FROM sluice_runs a JOIN sluice_runs b ON b.run_id <> a.run_id
         WHERE a.state = 'completed' AND a.rows <> '{}' AND b.rows <> '{}'
           AND b.started_at > a.started_at AND b.started_at < a.ended_at",
    );
    assert_eq!(overlaps, 0, "runs overlapped");
    // The backfill recorded each interval of its range (run, or found run by the pool).
    let backfilled = db.query(
        "SELECT COUNT(DISTINCT interval_start) FROM sluice_runs
         WHERE trigger = 'backfill' AND state = 'completed'",
    );
    assert_eq!(backfilled, 12);
    println!(
        "runs that found their interval run by another: {}",
        db.query("SELECT COUNT(*) FROM sluice_runs WHERE rows = '{}'")
    );
}
