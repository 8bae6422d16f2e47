//! Crashes: messages received but not committed come back and land once; SIGKILL at random
//! moments during a stream loses nothing, duplicates nothing and leaves no uncommitted message
//! unacked, and the test shows its kills landed where it claims: each killed worker had
//! committed, and kills fell between a commit and its ack (the ledger found redeliveries of
//! committed messages).
//!
//! Messages the emulator had handed to a killed worker's streams come back only after their
//! stream ack deadline (10 s; docs/architecture-notes.md, "Pub/Sub client facts"). These tests
//! keep a second replica whose streams were opened before any kill and is never killed (an
//! anchor), as a pool would have, and size their timeouts for the wait.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_bench::free_port;
use sluice_tests::{Db, PipelineOptions, PubSub, Workdir, Worker, event, eventually, flow_metric};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A worker that receives messages and holds them (a batch that closes only after a minute)
/// is killed before it commits anything; the anchor replica gets the redeliveries and each
/// message lands once.
#[tokio::test(flavor = "multi_thread")]
async fn received_but_uncommitted_messages_come_back_after_a_crash_and_land_once() {
    const N: usize = 2_000;
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("redeliver", 1).await;
    let dir = Workdir::new();
    let holder = dir.pipeline(
        "hold.yaml",
        "db",
        &PipelineOptions {
            batch: "{ max_messages: 100000, max_delay: 60s }",
            ..PipelineOptions::continuous(&subs[0])
        },
    );
    let normal = dir.pipeline("normal.yaml", "db", &PipelineOptions::continuous(&subs[0]));
    let db = Db(dir.db("db"));

    let holding = Worker::start(&holder, "holder");
    tokio::time::sleep(Duration::from_secs(3)).await;
    pubsub
        .publish(&topic, (0..N).map(|i| event(&format!("r{i}"))).collect())
        .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let anchor = Worker::start(&normal, "anchor");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        db.rows(),
        0,
        "the holder committed nothing before the crash"
    );
    holding.kill9();

    let landed = eventually(Duration::from_secs(300), || db.rows() >= N as i64).await;
    anchor.terminate();
    let logs = anchor.logs();
    assert!(anchor.wait(Duration::from_secs(60)).success(), "{logs}");
    assert!(landed, "only {} of {N} rows", db.rows());
    assert_eq!(db.rows(), N as i64);
    assert_eq!(db.distinct_keys(), N as i64);
}

/// The victim's counters of flow `ingest`, from one read of its `/metrics`.
#[derive(Debug, Clone, Copy)]
struct Scrape {
    received: f64,
    committed: f64,
    acked: f64,
}

const RECEIVED: &str = "sluice_messages_received_total";
const COMMITTED: &str = "sluice_messages_committed_total";
const ACKED: &str = "sluice_messages_acked_total";

/// Reads the victim's three counters at once (one request, as `sluice_tests::flow_metric` reads
/// one); `None` while it does not answer or does not export them yet.
fn scrape(port: u16) -> Option<Scrape> {
    let text = sluice_tests::metrics_text(port);
    let value = |name: &str| {
        let series = format!("{name}{{pipeline=\"test\",flow=\"ingest\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&series)?.trim().parse::<f64>().ok())
    };
    Some(Scrape {
        received: value(RECEIVED)?,
        committed: value(COMMITTED)?,
        acked: value(ACKED)?,
    })
}

/// Distinct messages only (no publisher duplicates; at least 20 000, 200 every 100 ms until the
/// last kill, so every life of the victim has messages to take), while one of two replicas
/// sharing a SQLite store and deduplicating by message id is SIGKILLed five times and restarted
/// each time.
///
/// Where the kills landed, shown rather than assumed:
/// * each life of the victim is killed only once its `sluice_messages_committed_total` is above
///   0, and that figure at the last scrape before the kill must be above 0: no kill is of a
///   worker that did nothing;
/// * after a further random 0.5–2 s the test aims: it scrapes the victim's counters back to back
///   and kills it as soon as `committed` has risen since the previous scrape, so within a few ms
///   of a commit. A commit's acks reach Pub/Sub only at the client's next flush (every 100 ms,
///   google-cloud-pubsub's lease loop), so such a kill usually lands between a commit and its
///   ack. Kills at random moments alone did not: in two runs (bursts of 1 000 a second, then a
///   steady 100 every 100 ms) all ten landed where the victim had acked all it had committed
///   (the ledger found no redelivery). Each kill prints how long after a commit, at most, it
///   came;
/// * with no publisher duplicates, a key the store's ledger finds duplicate is a redelivery of
///   a message that was committed but whose ack never reached Pub/Sub: a kill between a commit
///   and its ack (a clean SIGTERM drain leaves none, see `exactly_once.rs`
///   `sigterm_drains_commits_acks_and_exits_zero`). The ledger must find at least one;
/// * the received / committed / acked counters of each life at its last scrape are printed,
///   with how many kills had committed > acked there. `acked` counts acks handed to the
///   client, right after the commit returns, not acks Pub/Sub received, so this figure is
///   expected to be 0: the ledger's duplicates are the evidence.
///
/// At the end every message id has exactly one row, and once the workers have drained and
/// stopped, a plain client finds nothing left unacked on the subscription that has no row (a
/// killed stream's message the emulator hands back only after the last worker stopped may be
/// left, its row committed: seen once in CI, 1 of 21 400). A control
/// subscription, whose messages a plain client received and left unacked when its stream closed,
/// shows that the same check does find unacked messages when there are some.
#[tokio::test(flavor = "multi_thread")]
async fn sigkill_five_times_loses_nothing_and_duplicates_nothing() {
    const MIN_MESSAGES: usize = 20_000;
    const CHUNK: usize = 200;
    const KILLS: usize = 5;
    /// How long a fresh life may take to commit its first message before the test fails.
    const FIRST_COMMIT_WITHIN: Duration = Duration::from_secs(90);
    /// How long the test waits for a commit to aim a kill at before it kills all the same.
    const AIM_WITHIN: Duration = Duration::from_secs(20);
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("crash", 1).await;
    let dir = Workdir::new();
    let options = PipelineOptions {
        dedup: "{ by: message_id }",
        ..PipelineOptions::continuous(&subs[0])
    };
    let file = dir.pipeline("p.yaml", "db", &options);
    let port = free_port().unwrap();
    let victim_file = dir.pipeline(
        "victim.yaml",
        "db",
        &PipelineOptions {
            metrics_listen: Some(format!("127.0.0.1:{port}")),
            ..options.clone()
        },
    );
    let db = Db(dir.db("db"));
    let metric = |name: &str| flow_metric(port, name, "ingest");

    let anchor = Worker::start(&file, "anchor");
    let mut victim = Worker::start(&victim_file, "victim-0");
    let mut born = Instant::now();
    let kills_done = Arc::new(AtomicBool::new(false));
    let publisher = {
        let pubsub = PubSub::connect().await;
        let topic = topic.clone();
        let kills_done = kills_done.clone();
        tokio::spawn(async move {
            let mut published = 0;
            while published < MIN_MESSAGES || !kills_done.load(Ordering::SeqCst) {
                let chunk = (published..published + CHUNK)
                    .map(|i| event(&format!("c{i}")))
                    .collect();
                assert_eq!(pubsub.publish(&topic, chunk).await.len(), CHUNK);
                published += CHUNK;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            published
        })
    };
    let mut scrapes = Vec::new();
    for kill in 1..=KILLS {
        let life = kill - 1;
        let has_committed = eventually(FIRST_COMMIT_WITHIN, || {
            metric(COMMITTED).is_some_and(|c| c > 0.0)
        })
        .await;
        assert!(
            has_committed,
            "victim-{life} committed nothing within {FIRST_COMMIT_WITHIN:?}; its logs:\n{}",
            victim.logs()
        );
        tokio::time::sleep(Duration::from_millis(rand::random_range(500..2_000))).await;
        // Aim: kill right after a scrape finds `committed` risen since the one before it. The
        // commit returned after the earlier scrape started, so the kill comes at most the time
        // since then after it.
        let aim_until = Instant::now() + AIM_WITHIN;
        let mut before_started = Instant::now();
        let mut before = scrape(port);
        let (last, commit_after) = loop {
            let started = Instant::now();
            let now = scrape(port);
            if let (Some(b), Some(n)) = (before, now)
                && n.committed > b.committed
            {
                break (n, Some(before_started));
            }
            if started > aim_until {
                let last = now.unwrap_or_else(|| panic!("victim-{life} stopped serving metrics"));
                break (last, None);
            }
            (before, before_started) = (now, started);
        };
        assert!(victim.is_running(), "victim-{life} died before its kill");
        let after_commit = commit_after.map(|t| t.elapsed());
        victim.kill9();
        let aimed = after_commit.map_or_else(
            || format!("no commit seen in {AIM_WITHIN:?} of aiming"),
            |window| format!("at most {} ms after a commit", window.as_millis()),
        );
        println!(
            "kill {kill}: victim-{life} killed {:.1} s after its start, {aimed}; at the last \
             scrape received {}, committed {}, acked {}",
            born.elapsed().as_secs_f64(),
            last.received,
            last.committed,
            last.acked,
        );
        assert!(
            last.committed > 0.0,
            "victim-{life} was killed with nothing committed"
        );
        let scrape = (last, after_commit);
        scrapes.push(scrape);
        victim = Worker::start(&victim_file, &format!("victim-{kill}"));
        born = Instant::now();
    }
    kills_done.store(true, Ordering::SeqCst);
    let last_kill = Instant::now();
    let published = publisher.await.unwrap();
    let published_rows = published as i64;
    let publishing_ended = last_kill.elapsed();

    let landed = eventually(Duration::from_secs(600), || db.rows() >= published_rows).await;
    assert!(
        landed,
        "only {} of {published} rows; anchor logs:\n{}",
        db.rows(),
        anchor.logs()
    );
    println!(
        "publishing ended {:.0} s and all rows had landed {:.0} s after the last kill",
        publishing_ended.as_secs_f64(),
        last_kill.elapsed().as_secs_f64()
    );
    // The killed lives' redeliveries come back after their streams' ack deadline (10 s); wait
    // (30 s at most) until the ledger has found one of a committed message, the evidence below.
    let ledger_duplicates = || {
        db.query("SELECT duplicates FROM sluice_flows WHERE pipeline = 'test' AND flow = 'ingest'")
    };
    eventually(Duration::from_secs(30), || ledger_duplicates() > 0).await;
    anchor.terminate();
    victim.terminate();
    assert!(anchor.wait(Duration::from_secs(60)).success());
    assert!(victim.wait(Duration::from_secs(60)).success());

    let ledger_duplicates = ledger_duplicates();
    let unacked_at_kill = scrapes
        .iter()
        .filter(|(s, _)| s.committed > s.acked)
        .count();
    let within_flush = scrapes
        .iter()
        .filter(|(_, window)| window.is_some_and(|w| w < Duration::from_millis(100)))
        .count();
    println!(
        "{KILLS} kills, {published} distinct messages published; redeliveries of committed \
         messages found by the ledger (kills that landed between commit and ack): \
         {ledger_duplicates}; kills with committed > acked at the last scrape: \
         {unacked_at_kill} of {KILLS}; kills less than 100 ms (one ack flush) after a commit: \
         {within_flush} of {KILLS}"
    );

    assert_eq!(db.rows(), published_rows, "exactly one row per message id");
    assert_eq!(db.distinct_keys(), published_rows);
    assert_eq!(
        db.query("SELECT COUNT(DISTINCT message_id) FROM test__events"),
        published_rows
    );
    assert_eq!(
        db.query("SELECT COUNT(*) FROM test__events WHERE dedup_key <> message_id"),
        0,
        "keyed by message id"
    );
    assert_eq!(
        db.query("SELECT COUNT(DISTINCT json_extract(attributes, '$.event_id')) FROM test__events"),
        published_rows,
        "every published message is there"
    );
    assert_eq!(db.dead_letters(), 0);
    assert!(
        ledger_duplicates > 0,
        "the ledger found no redelivery of a committed message: no kill landed between a \
         commit and its ack"
    );
    // Read beside a control (a closed stream's held messages on a topic of its own, which the
    // same read must find), for as long as the control's took to come back.
    let left =
        sluice_tests::unacked_beside_control(&pubsub, &subs[0], |m| m.message_id.clone()).await;
    // A killed stream's messages come back from the emulator after their ack deadline: one
    // handed back after the last worker stopped stays unacked, though its row is there. What must never be
    // left is a message without its row.
    let uncommitted: Vec<&String> = left
        .iter()
        .filter(|id| {
            db.query(&format!(
                "SELECT COUNT(*) FROM test__events WHERE message_id = '{id}'"
            )) == 0
        })
        .collect();
    println!(
        "{} messages left unacked after the workers stopped, all committed: {}",
        left.len(),
        uncommitted.is_empty()
    );
    assert!(
        uncommitted.is_empty(),
        "{} of the {} messages left unacked on the subscription were never committed: {:?}",
        uncommitted.len(),
        left.len(),
        uncommitted.iter().take(5).collect::<Vec<_>>()
    );
}
