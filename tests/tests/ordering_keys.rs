//! A subscription with message ordering: every ordering key's records are committed in publish
//! order, once each, by two replicas each committing several batches at once (keys in
//! parallel); a message of a key that can never be committed is dead-lettered and the key goes
//! on.
//!
//! Real parts: the Pub/Sub emulator (it keeps each ordering key in order on delivery), `sluice`
//! processes, a PostgreSQL server of the test's own with `track_commit_timestamp = on`, so the
//! order in which transactions committed can be read back (`pg_xact_commit_timestamp(xmin)`):
//! for each key, every message of an earlier commit must precede every message of a later
//! one. PostgreSQL, because it commits several batches of a flow at once (SQLite one at a
//! time).
//!
//! Crashes: `each_ordering_key_keeps_publish_order_across_sigkills` SIGKILLs the worker three
//! times while it commits. On the emulator (0.8.20) an ordered subscription never forgets a
//! stream that closed, even one of a killed process: each ordering key is routed to one of the
//! streams ever opened on the subscription (a consistent hash over all of them), so the keys
//! of a dead stream are never delivered again and unary Pull gets nothing (measured
//! 2026-12-02, Google's Python client; the same with the Rust client). Seeking an ordered
//! subscription to a time is not implemented there either. So each restarted worker reads a
//! *fresh* subscription of the same topic, made before anything was published: Pub/Sub
//! delivers it everything again, each key in publish order, which is a superset of what
//! Pub/Sub redelivers after a crash (a key's unacked messages, in order). The ledger (dedup by
//! message id, the same on every subscription of a topic) drops what the killed workers
//! committed; each key's remaining messages must commit after them, in order.
#![allow(clippy::unwrap_used, missing_docs)]

use bytes::Bytes;
use google_cloud_pubsub::model::Message;
use sluice_engine::pubsub::SubscriptionSettings;
use sluice_tests::{
    FlowYaml, PgDb, PipelineYaml, PrivatePostgres, PubSub, Workdir, Worker, eventually,
};
use std::time::Duration;

const KEYS: usize = 50;
const PER_KEY: usize = 400;
/// The key whose message number POISON can never be committed (an event time that is no
/// time): it is dead-lettered, and the key's later messages commit after it.
const POISON_KEY: usize = 7;
const POISON: usize = 200;

fn message(key: usize, n: usize) -> Message {
    let event_time = if key == POISON_KEY && n == POISON {
        "not a time".to_owned()
    } else {
        "2026-12-01T00:00:00Z".to_owned()
    };
    Message::new()
        .set_data(Bytes::from(format!("{{\"key\":{key},\"n\":{n}}}")))
        .set_ordering_key(format!("k{key:02}"))
        .set_attributes([
            ("key", format!("k{key:02}")),
            ("n", n.to_string()),
            ("ts", event_time),
        ])
}

#[tokio::test(flavor = "multi_thread")]
async fn each_ordering_key_commits_in_publish_order_with_keys_in_parallel() {
    let server = PrivatePostgres::start_with(&["track_commit_timestamp = on"]);
    let database = sluice_store::ScratchDatabase::create_on(&server.admin_url())
        .await
        .unwrap();
    let db = PgDb(database.url().to_owned());
    let pubsub = PubSub::connect().await;
    let (topic, subscription) = pubsub
        .topic_with_subscription(
            "ordered",
            SubscriptionSettings {
                message_ordering: true,
                ..SubscriptionSettings::default()
            },
        )
        .await;
    let dir = Workdir::new();
    let file = PipelineYaml::new("test")
        .mode("continuous")
        .store(database.url())
        .pubsub_emulator()
        .target_table("events")
        .flow(
            FlowYaml::pubsub("ingest", "events", &subscription)
                .event_time_attribute("ts")
                .streams(2)
                .batch(100, "20ms"),
        )
        .write(dir.path(), "p.yaml");

    // Published in rounds, each key's messages in order.
    let publisher = {
        let pubsub = PubSub::connect().await;
        let topic = topic.clone();
        tokio::spawn(async move {
            for round in 0..PER_KEY / 20 {
                let chunk: Vec<Message> = (0..KEYS)
                    .flat_map(|key| (round * 20..round * 20 + 20).map(move |n| message(key, n)))
                    .collect();
                pubsub.publish(&topic, chunk).await;
                tokio::time::sleep(Duration::from_millis(1_500)).await;
            }
        })
    };
    let total = (KEYS * PER_KEY) as i64;
    let settled = || db.rows() + db.dead_letters();
    let workers = [Worker::start(&file, "a"), Worker::start(&file, "b")];
    publisher.await.unwrap();
    assert!(
        eventually(Duration::from_secs(600), || settled() >= total).await,
        "{} of {total} settled; {}\n{}",
        settled(),
        workers[0].logs(),
        workers[1].logs()
    );
    drop(workers);

    check_once_each_in_publish_order(&db, total);
}

/// Exactly one dead letter (the poison), every other message once, and per key every message
/// of an earlier commit before every one of a later commit (PostgreSQL's commit timestamps).
fn check_once_each_in_publish_order(db: &PgDb, total: i64) {
    assert_eq!(
        db.dead_letters(),
        1,
        "the poison message, dead-lettered once"
    );
    assert_eq!(db.rows(), total - 1);
    assert_eq!(db.distinct_keys(), total - 1, "each message once");
    // Per key and commit: the smallest and largest message number, in commit order.
    let commits = db.text(
        "SELECT string_agg(k || ':' || lo || ':' || hi, ',' ORDER BY k, at)
         FROM (SELECT attributes->>'key' AS k, pg_xact_commit_timestamp(xmin) AS at,
                      min((attributes->>'n')::int) AS lo, max((attributes->>'n')::int) AS hi
               FROM test__events GROUP BY 1, 2) per_commit",
    );
    let mut last: Option<(String, i64)> = None;
    let mut commits_seen = 0;
    for entry in commits.split(',') {
        let mut parts = entry.split(':');
        let (key, lo, hi) = (
            parts.next().unwrap().to_owned(),
            parts.next().unwrap().parse::<i64>().unwrap(),
            parts.next().unwrap().parse::<i64>().unwrap(),
        );
        if let Some((last_key, last_hi)) = &last
            && *last_key == key
        {
            assert!(
                lo > *last_hi,
                "key {key}: a commit holding message {lo} came after one holding {last_hi}"
            );
        }
        last = Some((key, hi));
        commits_seen += 1;
    }
    println!("{commits_seen} (key, commit) groups, each key in publish order");
    assert!(commits_seen > KEYS * 2, "keys spread over many commits");
}

/// SIGKILLs while the worker commits; each successor reads a fresh subscription (see the
/// module docs for why).
#[tokio::test(flavor = "multi_thread")]
async fn each_ordering_key_keeps_publish_order_across_sigkills() {
    const KILLS: usize = 3;
    let server = PrivatePostgres::start_with(&["track_commit_timestamp = on"]);
    let database = sluice_store::ScratchDatabase::create_on(&server.admin_url())
        .await
        .unwrap();
    let db = PgDb(database.url().to_owned());
    let pubsub = PubSub::connect().await;
    let ordered = SubscriptionSettings {
        message_ordering: true,
        ack_deadline_seconds: 10,
        ..SubscriptionSettings::default()
    };
    let (topic, first) = pubsub
        .topic_with_subscription("ordered-kill", ordered.clone())
        .await;
    let mut subscriptions = vec![first];
    for i in 1..=KILLS {
        let name = format!("{topic}-sub{i}");
        pubsub
            .admin
            .create_subscription_with(&name, &topic, &ordered)
            .await
            .unwrap();
        subscriptions.push(name);
    }
    let dir = Workdir::new();
    let file = |i: usize| {
        PipelineYaml::new("test")
            .mode("continuous")
            .store(database.url())
            .pubsub_emulator()
            .target_table("events")
            .flow(
                FlowYaml::pubsub("ingest", "events", &subscriptions[i])
                    .event_time_attribute("ts")
                    .streams(2)
                    .batch(100, "20ms"),
            )
            .write(dir.path(), &format!("p{i}.yaml"))
    };
    let total = (KEYS * PER_KEY) as i64;
    let settled = || db.rows() + db.dead_letters();
    let mut worker = Worker::start(&file(0), "w0");
    // Published in rounds while the worker commits, each key's messages in order.
    for round in 0..PER_KEY / 50 {
        let chunk: Vec<Message> = (0..KEYS)
            .flat_map(|key| (round * 50..round * 50 + 50).map(move |n| message(key, n)))
            .collect();
        pubsub.publish(&topic, chunk).await;
    }
    let mut landed: Vec<i64> = Vec::new();
    for kill in 1..=KILLS {
        // Somewhere in this worker's share of the first two thirds of the stream, a little at
        // random: past three quarters, a successor once settled the rest between the look and
        // the kill (CI run 2026-12-05, with the emulator's stream fix).
        let at = (total * kill as i64 / (KILLS as i64 + 2) + rand::random_range(0..total / 20))
            .max(landed.last().map_or(0, |before| before + total / 20))
            .min(total - 1);
        assert!(
            eventually(Duration::from_secs(300), || settled() >= at).await,
            "{} of {total} settled before kill {kill}: {}",
            settled(),
            worker.logs()
        );
        let logs = worker.logs();
        worker.kill9();
        let at_kill = settled();
        assert!(
            at_kill < total,
            "kill {kill} landed after everything settled: {logs}"
        );
        assert!(
            landed.last().is_none_or(|&before| at_kill > before),
            "kill {kill} landed before this worker committed anything ({at_kill} settled, \
             {landed:?} before): {logs}"
        );
        landed.push(at_kill);
        worker = Worker::start(&file(kill), &format!("w{kill}"));
    }
    assert!(
        eventually(Duration::from_secs(600), || settled() >= total).await,
        "{} of {total} settled; kills at {landed:?}: {}",
        settled(),
        worker.logs()
    );
    drop(worker);
    println!("SIGKILLs with {landed:?} of {total} settled");
    check_once_each_in_publish_order(&db, total);
}
