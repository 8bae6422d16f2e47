//! Permanent errors fail at once with what to fix; transient ones are waited out, by a triggered
//! run for at most `give_up_after`; `sluice check` finds each before a run.
//!
//! Real: the machine's PostgreSQL (a database that does not exist), a private PostgreSQL that
//! asks for a password (`scram-sha-256`), a loopback port with nothing listening (a store or a
//! Pub/Sub endpoint that is down), the Pub/Sub emulator (a subscription that does not exist,
//! one that does), the `sluice` binary. Fake: an outage that begins mid-run, by a
//! [`FaultProxy`].
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::{
    Db, FaultProxy, PROJECT, PgDb, PrivatePostgres, PubSub, Workdir, Worker, emulator, event,
    eventually, sluice_command, unique,
};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

/// A triggered pipeline on `store` and `endpoint` whose one flow reads `subscription`, giving
/// up after 8 s (more than one of the source's 3 s questions to Pub/Sub, so that a retry shows).
fn pipeline(dir: &Workdir, store: &str, endpoint: &str, subscription: &str) -> PathBuf {
    let file = dir.path().join(format!("{}.yaml", unique("p")));
    std::fs::write(
        &file,
        format!(
            "pipeline: fail_fast
mode: triggered
give_up_after: 8s
store: {store}
pubsub: {{ project: {PROJECT}, endpoint: \"{endpoint}\" }}
targets:
  - {{ name: events, kind: table }}
flows:
  - name: live
    target: events
    source: {{ pubsub: {{ subscription: {subscription}, drain_idle: 2s }} }}
"
        ),
    )
    .unwrap();
    file
}

/// `sluice run` and `sluice check` on `file`: (run's exit code, its stderr, check's exit
/// code, its stdout).
fn run_and_check(file: &std::path::Path) -> (i32, String, i32, String) {
    let file = file.to_str().unwrap();
    let run = sluice_command(&["run", "-c", file], None);
    let check = sluice_command(&["check", "-c", file], None);
    (run.code, run.stderr, check.code, check.stdout)
}

/// A port on loopback with nothing listening.
fn dead_port() -> u16 {
    sluice_bench::free_port().unwrap()
}

/// The store: a database that does not exist and a refused password fail at once (no retry
/// step logged) naming the fix and the server; a server that does not answer is retried until
/// `give_up_after`, then the run fails naming host and port. `check` reports each, and passes
/// a reachable store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_errors_are_told_apart_and_a_triggered_run_gives_up() {
    let dir = Workdir::new();
    let pubsub = PubSub::connect().await;
    let (_, subscriptions) = pubsub.topic_with("failfast", 1).await;
    let endpoint = emulator().endpoint();
    let private = PrivatePostgres::start_requiring_password("right");
    let missing_db = format!(
        "postgres://postgres@127.0.0.1:5432/{}",
        unique("no_such_db").replace('-', "_")
    );
    let wrong_password = private.url_with_password("wrong");
    let port = dead_port();
    let nobody_listening = format!("postgres://postgres@127.0.0.1:{port}/postgres");

    for (store, code, fix) in [
        (&missing_db, "3D000", "CREATE DATABASE"),
        (&wrong_password, "28P01", "check the user and password"),
    ] {
        let file = pipeline(&dir, store, &endpoint, &subscriptions[0]);
        let (run, stderr, check, report) = run_and_check(&file);
        assert_eq!(run, 1, "{stderr}");
        assert!(stderr.contains(code) && stderr.contains(fix), "{stderr}");
        assert!(
            !stderr.contains("retrying"),
            "a permanent error is not retried: {stderr}"
        );
        assert!(
            !stderr.contains("wrong"),
            "the password is not shown: {stderr}"
        );
        assert_eq!(check, 1, "{report}");
        assert!(
            report
                .lines()
                .any(|l| l.starts_with("FAIL  store") && l.contains(code)),
            "{report}"
        );
    }

    let file = pipeline(&dir, &nobody_listening, &endpoint, &subscriptions[0]);
    let (run, stderr, check, report) = run_and_check(&file);
    assert_eq!(run, 1, "{stderr}");
    assert!(
        stderr.contains("store unavailable; retrying")
            && stderr.contains(&format!("127.0.0.1:{port}"))
            && stderr.contains("gave up after 8s (give_up_after)"),
        "{stderr}"
    );
    assert_eq!(check, 1, "{report}");
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("FAIL  store") && l.contains(&format!("127.0.0.1:{port}"))),
        "{report}"
    );

    let file = pipeline(
        &dir,
        &private.url_with_password("right"),
        &endpoint,
        &subscriptions[0],
    );
    let check = sluice_command(&["check", "-c", file.to_str().unwrap()], None);
    assert_eq!(check.code, 0, "{}", check.all());
    assert!(
        check.stdout.contains("ok    store") && check.stdout.contains("every check passed"),
        "{}",
        check.stdout
    );
}

/// Pub/Sub: a subscription that does not exist fails the flow at once (not retried) saying how
/// to create it; an endpoint that does not answer is retried until `give_up_after`, then the
/// flow fails naming the endpoint. `check` reports both, and passes an existing subscription
/// and dead-letter topic with a store not created yet (and creates nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_errors_are_told_apart_and_a_triggered_run_gives_up() {
    let dir = Workdir::new();
    let pubsub = PubSub::connect().await;
    let (topic, subscriptions) = pubsub.topic_with("failfast", 1).await;
    let endpoint = emulator().endpoint();
    let store = format!("sqlite://{}", dir.path().join("state/p.db").display());

    let file = pipeline(&dir, &store, &endpoint, "no-such-subscription");
    let (run, stderr, check, report) = run_and_check(&file);
    assert_eq!(run, 1, "{stderr}");
    assert!(
        stderr.contains("does not exist at")
            && stderr.contains("gcloud pubsub subscriptions create"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("flow failed; retrying"),
        "a missing subscription is not retried: {stderr}"
    );
    assert_eq!(check, 1, "{report}");
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("FAIL  flow live: subscription") && l.contains("does not exist")),
        "{report}"
    );

    let down = format!("http://127.0.0.1:{}", dead_port());
    let file = pipeline(&dir, &store, &down, &subscriptions[0]);
    let (run, stderr, check, report) = run_and_check(&file);
    assert_eq!(run, 1, "{stderr}");
    assert!(
        stderr.contains("Pub/Sub unreachable; retrying")
            && stderr.contains(&format!("Pub/Sub at {down} unreachable for 8s, giving up")),
        "{stderr}"
    );
    assert_eq!(check, 1, "{report}");
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("FAIL  flow live") && l.contains(&down)),
        "{report}"
    );

    std::fs::remove_dir_all(dir.path().join("state")).unwrap();
    let file = pipeline(&dir, &store, &endpoint, &subscriptions[0]);
    let text = std::fs::read_to_string(&file).unwrap().replace(
        "targets:",
        &format!("dead_letter: {{ topic: {topic} }}\ntargets:"),
    );
    std::fs::write(&file, text).unwrap();
    let check = sluice_command(&["check", "-c", file.to_str().unwrap()], None);
    assert_eq!(check.code, 0, "{}", check.all());
    assert_eq!(
        check
            .stdout
            .lines()
            .filter(|l| l.starts_with("ok  "))
            .count(),
        3,
        "{}",
        check.stdout
    );
    assert!(
        !dir.path().join("state").exists(),
        "check created the store"
    );
}

/// The `host:port` of `endpoint` (`http://host:port`) as a socket address.
fn socket_of(endpoint: &str) -> SocketAddr {
    let host_port = endpoint.rsplit("://").next().unwrap();
    host_port
        .to_socket_addrs()
        .unwrap()
        .find(SocketAddr::is_ipv4)
        .unwrap()
}

/// Waits (at most 90 s) for `worker` to exit; its exit code and stderr.
async fn exit_of(mut worker: Worker) -> (Option<i32>, String) {
    let exited = eventually(Duration::from_secs(90), || !worker.is_running()).await;
    let logs = worker.logs();
    assert!(exited, "the run did not end by itself; stderr:\n{logs}");
    (worker.wait(Duration::from_secs(1)).code(), logs)
}

/// An outage that begins **during** a triggered run ends it, failed, once `give_up_after` has
/// passed, rather than hold it for ever or end it as if all was read:
/// * Pub/Sub goes silent after the first messages are stored: the run's idle period comes, but
///   Pub/Sub does not answer whether the subscription is idle, so the run does not end as
///   drained; it fails naming the endpoint and `give_up_after`.
/// * PostgreSQL goes silent after the first messages are stored, and more are published: their
///   commit gets no answer, and the run fails naming `give_up_after`; nothing more is stored.
///
/// Real: the Pub/Sub emulator, PostgreSQL (a fresh database), the `sluice` binary. Fake: the
/// silence, by a [`FaultProxy`] between the worker and the part (a partition on demand).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_during_a_triggered_run_fails_it_after_give_up_after() {
    let dir = Workdir::new();
    let pubsub = PubSub::connect().await;
    let endpoint = emulator().endpoint();
    let first: Vec<_> = (0..10).map(|i| event(&format!("a{i}"))).collect();
    let more: Vec<_> = (0..10).map(|i| event(&format!("b{i}"))).collect();

    // Pub/Sub silent mid-run.
    let (topic, subscriptions) = pubsub.topic_with("midrun", 1).await;
    let proxy = FaultProxy::start(socket_of(&endpoint));
    let proxied = format!("http://{}", proxy.addr());
    let sqlite = dir.path().join("state/midrun.db");
    let store = format!("sqlite://{}", sqlite.display());
    pubsub.publish(&topic, first.clone()).await;
    let file = pipeline(&dir, &store, &proxied, &subscriptions[0]);
    let worker = Worker::start(&file, "pubsub_silent");
    let db = Db(sqlite);
    assert!(
        eventually(Duration::from_secs(60), || db
            .query("SELECT COUNT(*) FROM fail_fast__events")
            == 10)
        .await,
        "the first messages were not stored; stderr:\n{}",
        worker.logs()
    );
    proxy.blackhole();
    let silent = std::time::Instant::now();
    let (code, stderr) = exit_of(worker).await;
    let waited = silent.elapsed();
    println!("Pub/Sub silent: the run exited {code:?} {waited:?} after");
    assert_eq!(code, Some(1), "{stderr}");
    // The idle period (2 s), then questions of up to 3 s each until 8 s of no answer.
    assert!(
        waited >= Duration::from_secs(8) && waited < Duration::from_secs(30),
        "gave up {waited:?} after the silence began"
    );
    assert!(
        stderr.contains("Pub/Sub does not answer")
            && stderr.contains(&format!(
                "Pub/Sub at {proxied} unreachable for 8s, giving up"
            )),
        "{stderr}"
    );

    // PostgreSQL silent mid-run.
    let (topic, subscriptions) = pubsub.topic_with("midrun", 1).await;
    let database = sluice_store::ScratchDatabase::create().await.unwrap();
    let url = database.url().to_owned();
    let (scheme, rest) = url.split_once("://").unwrap();
    let (authority, path) = rest.split_once('/').unwrap();
    let (user, host_port) = match authority.rsplit_once('@') {
        Some((user, host_port)) => (format!("{user}@"), host_port),
        None => (String::new(), authority),
    };
    let proxy = FaultProxy::start(socket_of(host_port));
    let proxied_store = format!("{scheme}://{user}{}/{path}", proxy.addr());
    pubsub.publish(&topic, first).await;
    let file = pipeline(&dir, &proxied_store, &endpoint, &subscriptions[0]);
    let worker = Worker::start(&file, "postgres_silent");
    let db = PgDb(url);
    assert!(
        eventually(Duration::from_secs(60), || db
            .query("SELECT COUNT(*) FROM fail_fast__events")
            == 10)
        .await,
        "the first messages were not stored; stderr:\n{}",
        worker.logs()
    );
    proxy.blackhole();
    let silent = std::time::Instant::now();
    pubsub.publish(&topic, more).await;
    let (code, stderr) = exit_of(worker).await;
    let waited = silent.elapsed();
    println!("PostgreSQL silent: the run exited {code:?} {waited:?} after");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        waited >= Duration::from_secs(8) && waited < Duration::from_secs(60),
        "gave up {waited:?} after the silence began"
    );
    assert!(
        stderr.contains("the store stayed unavailable for 8s; the run gives up (give_up_after)"),
        "{stderr}"
    );
    assert_eq!(
        db.query("SELECT COUNT(*) FROM fail_fast__events"),
        10,
        "nothing more was stored"
    );
}
