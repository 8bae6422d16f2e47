//! Nothing cleared under a running flow, even when a replica cannot be reached or a clearer is
//! paused: `sluice reset live --seek T --drop-unread` of a running Pub/Sub flow on a pool of
//! three replicas, every row counted afterwards.
//!
//! 1. A replica cut off from PostgreSQL (its link blackholed through the fault proxy, its
//!    Pub/Sub link left alone) is counted gone after 15 s; the reset clears and seeks without
//!    it. A replica that kept running would still hold in its memory tier the keys it committed
//!    and ack their replayed copies as duplicates of rows the clear deleted: those messages
//!    would be lost. It must fence itself instead (stop its flows, withhold acks) before the
//!    pool counts it gone.
//! 2. The clearer is stopped (SIGSTOP) between its claim and its clear, for longer than the
//!    claim lasts: another participant takes the claim over, clears, and the pool resumes and
//!    replays. When the stopped clearer wakes, its clear must delete nothing more: the rows it
//!    would delete were just replayed into memory tiers that would ack the next replay.
//!
//! Real parts: the Pub/Sub emulator (a subscription that retains acked messages), PostgreSQL
//! on 127.0.0.1:5432 (a fresh database), three `sluice` workers and the `sluice reset`
//! command. A fake in addition: the TCP fault proxy (`tests/src/proxy.rs`) between each worker
//! and PostgreSQL (test 1) or the Pub/Sub emulator (test 2), since neither part can be made to
//! go silent for one client on demand.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_bench::free_port;
use sluice_store::ScratchDatabase;
use sluice_tests::{
    FaultProxy, FlowYaml, PgDb, PipelineYaml, PubSub, Workdir, Worker, event, eventually,
    flow_metric, http_status, now_ms, publish_in_chunks, sluice_bin, stop_all, unique,
};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const EVENTS: usize = 3_000;
/// Each way between a process and PostgreSQL while the clearer is aimed at: the answer to its
/// last check takes this long to come back, the window in which the test stops it.
const AIM_DELAY: Duration = Duration::from_millis(250);

/// The local PostgreSQL server the scratch database lives on.
fn postgres_addr() -> SocketAddr {
    "127.0.0.1:5432".parse().unwrap()
}

/// A pipeline file of the pool: flow `live` from `subscription` into `events`, by `event_id`.
fn pipeline_file(
    dir: &Workdir,
    name: &str,
    store: &str,
    pubsub_endpoint: &str,
    metrics_port: Option<u16>,
    subscription: &str,
) -> PathBuf {
    let mut yaml = PipelineYaml::new("test")
        .mode("continuous")
        .store(store)
        .pubsub(sluice_tests::PROJECT, pubsub_endpoint)
        .target_table("events")
        .flow(FlowYaml::pubsub("live", "events", subscription).dedup_attribute("event_id"));
    if let Some(port) = metrics_port {
        yaml = yaml.metrics(&format!("127.0.0.1:{port}"));
    }
    yaml.write(dir.path(), name)
}

/// `sluice reset live --seek SEEK --drop-unread -c FILE`, started.
fn start_reset(file: &std::path::Path, seek_ms: i64) -> Child {
    Command::new(sluice_bin())
        .args([
            "reset",
            "live",
            "-c",
            file.to_str().unwrap(),
            "--seek",
            &seek_ms.to_string(),
            "--drop-unread",
        ])
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn logs(workers: &[Worker]) -> String {
    workers
        .iter()
        .map(Worker::logs)
        .collect::<Vec<_>>()
        .join("\n----\n")
}

/// Waits for the command to end within `within`; its exit code and output.
fn finish(mut child: Child, within: Duration) -> (i32, String) {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(started.elapsed() < within, "the command never ended");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// Waits until every event is a row, then until nothing changes for a while; panics with the
/// workers' logs if the rows never reach `EVENTS`.
async fn settled_rows(db: &PgDb, workers: &[Worker], within: Duration) -> i64 {
    let all = eventually(within, || {
        db.query("SELECT count(DISTINCT dedup_key) FROM test__events") >= EVENTS as i64
    })
    .await;
    let distinct = db.query("SELECT count(DISTINCT dedup_key) FROM test__events");
    assert!(
        all,
        "{distinct} of {EVENTS} events are rows: the rest were acked without a row\n{}",
        logs(workers)
    );
    // Redeliveries still in flight land as duplicates, never as rows.
    tokio::time::sleep(Duration::from_secs(10)).await;
    db.query("SELECT count(*) FROM test__events")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_cut_off_from_the_store_fences_itself_and_a_seek_reset_loses_nothing() {
    let database = ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let dir = Workdir::new();
    let pubsub = PubSub::connect().await;
    let topic = unique("fence");
    pubsub.admin.create_topic(&topic).await.unwrap();
    let subscription = format!("{topic}-sub");
    pubsub
        .admin
        .create_replayable_subscription(&subscription, &topic, 10)
        .await
        .unwrap();
    let endpoint = sluice_tests::emulator().endpoint();
    let proxies: Vec<FaultProxy> = (0..3).map(|_| FaultProxy::start(postgres_addr())).collect();
    let ports: Vec<u16> = (0..3).map(|_| free_port().unwrap()).collect();
    let files: Vec<PathBuf> = proxies
        .iter()
        .zip(&ports)
        .enumerate()
        .map(|(i, (proxy, port))| {
            let store = database
                .url()
                .replace("127.0.0.1:5432", &proxy.addr().to_string());
            pipeline_file(
                &dir,
                &format!("w{i}.yaml"),
                &store,
                &endpoint,
                Some(*port),
                &subscription,
            )
        })
        .collect();
    // The command line reaches the store directly.
    let cli_file = pipeline_file(
        &dir,
        "cli.yaml",
        database.url(),
        &endpoint,
        None,
        &subscription,
    );
    let workers: Vec<Worker> = files
        .iter()
        .enumerate()
        .map(|(i, file)| Worker::start(file, &format!("w{i}")))
        .collect();

    // Every replica reads before the events come, so each commits a share of them.
    for port in &ports {
        assert!(
            eventually(Duration::from_secs(60), || http_status(*port, "/readyz")
                == "200")
            .await,
            "{}",
            logs(&workers)
        );
    }
    let seek_ms = now_ms() - 1_000;
    let publisher = publish_in_chunks(
        &topic,
        (0..EVENTS).map(|i| event(&format!("e{i}"))).collect(),
        100,
        Duration::from_millis(300),
    )
    .await;
    publisher.await.unwrap();
    assert!(
        eventually(Duration::from_secs(180), || db
            .query("SELECT count(*) FROM test__events")
            == EVENTS as i64)
        .await,
        "the events were never all committed: {}",
        logs(&workers)
    );
    // The replica about to be cut off holds committed keys in its memory tier.
    let committed_by_cut_off =
        flow_metric(ports[2], "sluice_messages_committed_total", "live").unwrap_or(0.0);
    assert!(
        committed_by_cut_off > 0.0,
        "w2 committed nothing, so the test could not lose anything"
    );
    println!("w2 committed {committed_by_cut_off} of {EVENTS} before its link went silent");

    proxies[2].blackhole();
    // Counted gone: its heartbeat is older than 15 s.
    tokio::time::sleep(Duration::from_secs(16)).await;
    let reset = start_reset(&cli_file, seek_ms);
    let (code, out) = finish(reset, Duration::from_secs(240));
    assert_eq!(code, 0, "{out}\n{}", logs(&workers));
    assert!(
        out.contains("2 worker(s) of pipeline test are running"),
        "the cut-off replica was counted gone, not waited for: {out}"
    );
    let healed_after = Duration::from_secs(60).saturating_sub(Duration::from_secs(16));
    tokio::time::sleep(healed_after).await;
    proxies[2].pass();

    let rows = settled_rows(&db, &workers, Duration::from_secs(360)).await;
    let cut_off_logs = workers[2].logs();
    println!("after the replay: {rows} rows");
    stop_all(workers);
    assert_eq!(rows, EVENTS as i64, "each event once");
    assert!(
        cut_off_logs.contains("heartbeats failed past the fence"),
        "w2 fenced itself: {cut_off_logs}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clearer_stopped_past_its_claim_clears_nothing_once_it_wakes() {
    let database = ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let dir = Workdir::new();
    let pubsub = PubSub::connect().await;
    let topic = unique("fence-clearer");
    pubsub.admin.create_topic(&topic).await.unwrap();
    let subscription = format!("{topic}-sub");
    pubsub
        .admin
        .create_replayable_subscription(&subscription, &topic, 10)
        .await
        .unwrap();
    // Every process reaches PostgreSQL through its own proxy, slowed while the update clears
    // ([`AIM_DELAY`] each way), so that the clearer can be stopped between its last check and its
    // clear, holding no transaction.
    let endpoint = sluice_tests::emulator().endpoint();
    let proxies: Vec<FaultProxy> = (0..4).map(|_| FaultProxy::start(postgres_addr())).collect();
    let files: Vec<PathBuf> = proxies
        .iter()
        .enumerate()
        .map(|(i, proxy)| {
            // Each process's sessions carry its name, so the aim watches the clearer's alone
            // (every replica asks who is alive with the same statement).
            let store = format!(
                "{}?application_name=p{i}",
                database
                    .url()
                    .replace("127.0.0.1:5432", &proxy.addr().to_string())
            );
            pipeline_file(
                &dir,
                &format!("p{i}.yaml"),
                &store,
                &endpoint,
                None,
                &subscription,
            )
        })
        .collect();
    let workers: Vec<Worker> = files[..3]
        .iter()
        .enumerate()
        .map(|(i, file)| Worker::start(file, &format!("w{i}")))
        .collect();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let seek_ms = now_ms() - 1_000;
    let publisher = publish_in_chunks(
        &topic,
        (0..EVENTS).map(|i| event(&format!("e{i}"))).collect(),
        100,
        Duration::from_millis(300),
    )
    .await;
    publisher.await.unwrap();
    assert!(
        eventually(Duration::from_secs(180), || db
            .query("SELECT count(*) FROM test__events")
            == EVENTS as i64)
        .await,
        "the events were never all committed: {}",
        logs(&workers)
    );

    for proxy in &proxies {
        proxy.delay(AIM_DELAY);
    }
    let reset = start_reset(&files[3], seek_ms);
    // The clearer, as soon as one claims the update.
    let (clearer, claimed_at) = {
        let started = Instant::now();
        loop {
            let found = db.text(
                "SELECT coalesce(clearer || ' ' || claimed_at, '') FROM sluice_pool_updates \
                 WHERE state = 'clearing' ORDER BY id DESC LIMIT 1",
            );
            if let Some((clearer, at)) = found.split_once(' ') {
                break (clearer.to_owned(), at.to_owned());
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "nobody claimed the update: {}",
                logs(&workers)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // Its clear opens the store anew: stopped the moment the server runs its check that no
    // worker runs (an autocommit read on a connection opened since the claim), so its answer
    // waits in the proxy and the clearer holds no transaction while stopped.
    // Worker ids are `<host>-<pid>-<random>`; the command line's `cli-<host>-<pid>-<random>`.
    let pid: u32 = clearer.rsplit('-').nth(1).unwrap().parse().unwrap();
    let clearer_app = match workers.iter().position(|w| w.pid() == pid) {
        Some(i) => format!("p{i}"),
        None => "p3".to_owned(),
    };
    let checking = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND application_name = '{clearer_app}' AND backend_start > '{claimed_at}' \
         AND query LIKE 'SELECT worker, host%'"
    );
    // Watched over one open session, every 5 ms: starting a `psql` per look took longer than
    // the answer's way back under a loaded machine (CI run 2026-12-04: the aim missed).
    let (watch, session) = tokio_postgres::connect(database.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(session);
    let started = Instant::now();
    loop {
        let seen: i64 = watch.query_one(&checking, &[]).await.unwrap().get(0);
        if seen > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the clearer never checked the running workers: {}",
            logs(&workers)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    signal(pid, "STOP");
    let rows_at_claim = db.query("SELECT count(*) FROM test__events");
    // The stop landed outside the clear's transactions: none of its sessions holds one open
    // (else the clear's locks would hold back the takeover, and the test would prove nothing).
    let in_transaction = db.query(&format!(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND application_name = '{clearer_app}' AND backend_start > '{claimed_at}' \
         AND state LIKE 'idle in transaction%'"
    ));
    assert_eq!(
        in_transaction,
        0,
        "the clearer was stopped inside a transaction; the aim missed: {}",
        logs(&workers)
    );
    println!("stopped the clearer {clearer} with {rows_at_claim} rows still there");
    assert_eq!(
        rows_at_claim, EVENTS as i64,
        "stopped after its claim and before its clear"
    );
    for proxy in &proxies {
        proxy.pass();
    }
    // Another participant takes the claim over after 60 s, clears, and the pool replays.
    assert!(
        eventually(Duration::from_secs(150), || db.query(
            "SELECT count(*) FROM sluice_pool_updates WHERE state = 'done'"
        ) == 1)
        .await,
        "the claim was never taken over: {}",
        logs(&workers)
    );
    let taken_over_by = db.text("SELECT clearer FROM sluice_pool_updates WHERE state = 'done'");
    assert_ne!(taken_over_by, clearer);
    let replayed = settled_rows(&db, &workers, Duration::from_secs(240)).await;
    assert_eq!(replayed, EVENTS as i64, "the replay after the takeover");

    // The stopped clearer wakes with the pool running its replayed keys.
    signal(pid, "CONT");
    println!("resumed the clearer {clearer}");
    let (code, out) = finish(reset, Duration::from_secs(240));
    println!("reset: exit {code}\n{out}");
    tokio::time::sleep(Duration::from_secs(20)).await;
    let rows = settled_rows(&db, &workers, Duration::from_secs(120)).await;
    // What the woken clearer did (a worker's log, or the command's output above).
    for worker in workers.iter().filter(|w| w.pid() == pid) {
        for line in worker.logs().lines().filter(|l| {
            l.contains("pool update") || l.contains("flow reset") || l.contains("claim")
        }) {
            println!("clearer: {line}");
        }
    }
    stop_all(workers);
    assert_eq!(
        rows, EVENTS as i64,
        "each event once after the clearer woke"
    );
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}
