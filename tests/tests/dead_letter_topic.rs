//! `dead_letter: { topic }`: every dead letter also reaches the pipeline's dead-letter topic,
//! once, across a SIGKILL. The kill lands where it claims: after the dead letters committed
//! (their source messages acked) and before any was published, shown by the outbox holding
//! every one of them with publishes tried (the topic does not exist yet, so each failed). The
//! successor publishes each once, with the reason and attempts as attributes and the payload
//! intact. `sluice status` shows the letters waiting meanwhile. A reset that dead-letters the
//! same records again publishes no second letter. Letters the topic refuses for good (its
//! schema does not match their payload) are kept refused and hold up none behind them.
//!
//! Real parts: the Pub/Sub emulator (topics, a schema, publishing and a subscription on the
//! dead-letter topic), `sluice` processes, SQLite.
#![allow(clippy::unwrap_used, missing_docs)]

use bytes::Bytes;
use google_cloud_pubsub::model::Message;
use google_cloud_pubsub::model::{Encoding, schema};
use sluice_tests::{
    Db, FlowYaml, PipelineYaml, PubSub, SchemaTopic, Workdir, Worker, eventually, sluice_command,
    unique,
};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const GOOD: usize = 40;
const BAD: usize = 20;

fn message(n: usize, bad: bool) -> Message {
    let ts = if bad {
        "not a time"
    } else {
        "2026-12-01T00:00:00Z"
    };
    Message::new()
        .set_data(Bytes::from(format!("payload {n}")))
        .set_attributes([
            ("event_id", format!("e{n}")),
            ("ts", ts.to_owned()),
            ("bad", bad.to_string()),
        ])
}

#[tokio::test(flavor = "multi_thread")]
async fn each_dead_letter_reaches_the_topic_once_across_a_sigkill() {
    let pubsub = PubSub::connect().await;
    let topic = unique("dlt-source");
    pubsub.admin.create_topic(&topic).await.unwrap();
    let subscription = format!("{topic}-sub");
    pubsub
        .admin
        .create_subscription(&subscription, &topic, 10)
        .await
        .unwrap();
    let dead_letter_topic = unique("dlt-out");
    let dir = Workdir::new();
    let db = dir.db("dlt.db");
    let file = PipelineYaml::new("test")
        .sqlite(&db)
        .mode("continuous")
        .pubsub_emulator()
        .dead_letter_topic(&dead_letter_topic)
        .target_table("events")
        .flow(
            FlowYaml::pubsub("live", "events", &subscription)
                .dedup_attribute("event_id")
                .event_time_attribute("ts")
                .batch(25, "20ms")
                .streams(1),
        )
        .write(dir.path(), "p.yaml");
    let store = Db(db);
    let worker = Worker::start(&file, "first");
    let messages: Vec<_> = (0..GOOD + BAD)
        .map(|n| message(n, n % 3 == 0 && n / 3 < BAD))
        .collect();
    pubsub.publish(&topic, messages).await;

    // The dead letters committed, and each one's publish was tried and refused (the topic is
    // missing).
    let tried = || {
        store.query("SELECT COUNT(*) FROM sluice_dead_letter_outbox WHERE publishes > 0") as usize
    };
    let refused_seen = || {
        worker
            .logs()
            .contains("cannot publish dead letters; they wait in the outbox")
    };
    assert!(
        eventually(Duration::from_secs(120), || store.dead_letters() as usize
            == BAD
            && tried() == BAD
            && refused_seen())
        .await,
        "dead letters {} tried {}: {}",
        store.dead_letters(),
        tried(),
        worker.logs()
    );
    worker.kill9();
    assert_eq!(
        store.query("SELECT COUNT(*) FROM sluice_dead_letter_outbox"),
        BAD as i64,
        "the kill landed after the commits and before any publish"
    );

    // `sluice status` says what waits.
    let out = sluice_command(
        &["status", "-c", file.to_str().unwrap(), "--format", "json"],
        None,
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json["dead_letter_topic"]["waiting"], BAD, "{json}");
    assert_eq!(json["dead_letter_topic"]["refused"], 0, "{json}");

    pubsub.admin.create_topic(&dead_letter_topic).await.unwrap();
    let received_on = format!("{dead_letter_topic}-sub");
    pubsub
        .admin
        .create_subscription(&received_on, &dead_letter_topic, 10)
        .await
        .unwrap();
    let worker = Worker::start(&file, "second");
    let letters = pubsub
        .collect_all(
            &received_on,
            BAD,
            Duration::from_secs(120),
            Duration::from_secs(5),
        )
        .await;
    assert!(
        eventually(Duration::from_secs(30), || store.query(
            "SELECT COUNT(*) FROM sluice_dead_letter_outbox WHERE published_at IS NULL"
        ) == 0)
        .await,
        "every letter recorded published: {}",
        worker.logs()
    );
    let logs = worker.logs();
    drop(worker);

    let mut copies: BTreeMap<String, usize> = BTreeMap::new();
    for letter in &letters {
        *copies
            .entry(letter.attributes["sluice_dead_letter_id"].clone())
            .or_default() += 1;
        assert_eq!(letter.attributes["sluice_reason"], "bad_timestamp");
        assert_eq!(letter.attributes["sluice_attempts"], "1");
        assert_eq!(letter.attributes["sluice_flow"], "live");
        assert_eq!(letter.attributes["bad"], "true");
        let n = &letter.attributes["event_id"][1..];
        assert_eq!(
            letter.data,
            Bytes::from(format!("payload {n}")),
            "payload intact"
        );
    }
    assert_eq!(
        copies.len(),
        BAD,
        "every dead letter reached the topic: {logs}"
    );
    assert!(
        copies.values().all(|&c| c == 1),
        "each once: {copies:?}\n{logs}"
    );
    let ids: BTreeSet<_> = letters
        .iter()
        .map(|l| l.attributes["event_id"].clone())
        .collect();
    assert_eq!(ids.len(), BAD);
    assert_eq!(
        store.query("SELECT COUNT(*) FROM test__events"),
        GOOD as i64
    );
    assert!(
        logs.contains("publishing dead letters again"),
        "the successor said the letters had been tried before: {logs}"
    );
}

const RESET_GOOD: usize = 20;
const RESET_BAD: usize = 5;

/// `sluice reset` of a file backfill re-reads its bad lines and dead-letters them again; their
/// letters are on the topic already and are not published again: the topic holds one letter per
/// bad line, each with the id it got first. The second run's dead letters are shown to be new
/// rows (committed after the reset), so the re-read happened.
#[tokio::test(flavor = "multi_thread")]
async fn a_reset_does_not_publish_its_dead_letters_again() {
    let pubsub = PubSub::connect().await;
    let dead_letter_topic = unique("dlt-reset");
    pubsub.admin.create_topic(&dead_letter_topic).await.unwrap();
    let received_on = format!("{dead_letter_topic}-sub");
    pubsub
        .admin
        .create_subscription(&received_on, &dead_letter_topic, 10)
        .await
        .unwrap();
    let dir = Workdir::new();
    let mut lines = String::new();
    for i in 0..RESET_GOOD {
        lines.push_str(&format!(
            "{{\"id\":\"r{i}\",\"data\":{{\"n\":{i}}},\"event_time\":1700000000000}}\n"
        ));
    }
    for i in 0..RESET_BAD {
        lines.push_str(&format!(
            "{{\"id\":\"bad{i}\",\"data\":{{\"n\":{i}}},\"event_time\":\"not a time\"}}\n"
        ));
    }
    let history = dir.path().join("history.jsonl");
    std::fs::write(&history, lines).unwrap();
    let db = dir.db("reset.db");
    let file = PipelineYaml::new("test")
        .sqlite(&db)
        .mode("triggered")
        .pubsub_emulator()
        .dead_letter_topic(&dead_letter_topic)
        .target_table("events")
        .flow(FlowYaml::file("backfill", "events", history.to_str().unwrap()).once())
        .write(dir.path(), "p.yaml");
    let store = Db(db);
    let config = file.to_str().unwrap();
    let waiting = || {
        let out = sluice_command(&["status", "-c", config, "--format", "json"], None);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        json["dead_letter_topic"]["waiting"].as_u64().unwrap()
    };

    let first = Worker::start(&file, "first");
    assert!(first.wait(Duration::from_secs(120)).success());
    assert_eq!(store.dead_letters(), RESET_BAD as i64);
    assert_eq!(waiting(), 0, "the first run published its letters");

    let reset_at = sluice_tests::now_ms();
    let out = sluice_command(&["reset", "backfill", "-c", config], None);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(
        store.dead_letters(),
        0,
        "the reset deleted the dead letters"
    );
    let second = Worker::start(&file, "second");
    assert!(second.wait(Duration::from_secs(120)).success());
    assert_eq!(
        store.query(&format!(
            "SELECT COUNT(*) FROM test__dead_letter WHERE committed_at >= {reset_at}"
        )),
        RESET_BAD as i64,
        "the second run dead-lettered the bad lines again"
    );
    assert_eq!(waiting(), 0);

    let letters = pubsub
        .collect_all(
            &received_on,
            RESET_BAD,
            Duration::from_secs(60),
            Duration::from_secs(10),
        )
        .await;
    let ids: BTreeSet<_> = letters
        .iter()
        .map(|l| l.attributes["sluice_dead_letter_id"].clone())
        .collect();
    let lines: BTreeSet<_> = letters
        .iter()
        .map(|l| l.attributes["sluice_message_id"].clone())
        .collect();
    assert_eq!(lines.len(), RESET_BAD, "every bad line has a letter");
    assert_eq!(
        (letters.len(), ids.len()),
        (RESET_BAD, RESET_BAD),
        "one letter per bad line: ids {ids:?}"
    );
}

const REFUSED: usize = 150;
const ACCEPTED: usize = 20;

/// Creates topic `name` on the emulator bound to an Avro schema (JSON encoding) that takes only
/// `{"id": "<text>"}`: Pub/Sub answers INVALID_ARGUMENT to a request holding any other payload
/// (measured: one such message fails its whole request).
async fn topic_taking_only_ids(name: &str) {
    SchemaTopic::create(
        &format!("{name}-schema"),
        schema::Type::Avro,
        r#"{"type":"record","name":"Letter","fields":[{"name":"id","type":"string"}]}"#,
        name,
        Encoding::Json,
    )
    .await;
}

/// A message with a bad timestamp (so a dead letter) and `payload`.
fn bad_with(n: usize, payload: String) -> Message {
    Message::new()
        .set_data(Bytes::from(payload))
        .set_attributes([
            ("event_id", format!("e{n}")),
            ("ts", "not a time".to_owned()),
        ])
}

/// More letters than a publisher's round takes (100) that the topic refuses for good sit at
/// the head of the outbox (the refusal is the emulator's own, for the topic's schema, which
/// sluice's checks of Pub/Sub's limits do not predict); letters committed after them still
/// reach the topic, once each, and the refused ones are kept, marked with Pub/Sub's answer.
/// The head is shown: every refused letter's outbox id is below every published one's.
#[tokio::test(flavor = "multi_thread")]
async fn letters_the_topic_refuses_for_good_are_kept_and_hold_up_none_behind_them() {
    let pubsub = PubSub::connect().await;
    let (topic, subscriptions) = pubsub.topic_with("dlt-refusing-source", 1).await;
    let dead_letter_topic = unique("dlt-schema");
    topic_taking_only_ids(&dead_letter_topic).await;
    let received_on = format!("{dead_letter_topic}-sub");
    pubsub
        .admin
        .create_subscription(&received_on, &dead_letter_topic, 10)
        .await
        .unwrap();
    let dir = Workdir::new();
    let db = dir.db("refusals.db");
    let file = PipelineYaml::new("test")
        .sqlite(&db)
        .mode("continuous")
        .pubsub_emulator()
        .dead_letter_topic(&dead_letter_topic)
        .target_table("events")
        .flow(
            FlowYaml::pubsub("live", "events", &subscriptions[0])
                .dedup_attribute("event_id")
                .event_time_attribute("ts")
                .batch(50, "20ms"),
        )
        .write(dir.path(), "p.yaml");
    let store = Db(db);
    let worker = Worker::start(&file, "refusals");
    pubsub
        .publish(
            &topic,
            (0..REFUSED)
                .map(|n| bad_with(n, format!("not json {n}")))
                .collect(),
        )
        .await;
    assert!(
        eventually(Duration::from_secs(120), || store.dead_letters()
            == REFUSED as i64)
        .await,
        "{} dead letters: {}",
        store.dead_letters(),
        worker.logs()
    );
    pubsub
        .publish(
            &topic,
            (REFUSED..REFUSED + ACCEPTED)
                .map(|n| bad_with(n, format!(r#"{{"id":"e{n}"}}"#)))
                .collect(),
        )
        .await;

    let letters = pubsub
        .collect_all(
            &received_on,
            ACCEPTED,
            Duration::from_secs(90),
            Duration::from_secs(5),
        )
        .await;
    let mut copies: BTreeMap<String, usize> = BTreeMap::new();
    for letter in &letters {
        *copies
            .entry(letter.attributes["event_id"].clone())
            .or_default() += 1;
    }
    assert_eq!(
        copies.len(),
        ACCEPTED,
        "the letters behind the refused ones reached the topic: {copies:?}\n{}",
        worker.logs()
    );
    assert!(copies.values().all(|&c| c == 1), "each once: {copies:?}");
    assert!(
        copies
            .keys()
            .all(|id| id[1..].parse::<usize>().unwrap() >= REFUSED),
        "only payloads the schema takes: {copies:?}"
    );
    let refused =
        || store.query("SELECT COUNT(*) FROM sluice_dead_letter_outbox WHERE refused IS NOT NULL");
    assert!(
        eventually(Duration::from_secs(60), || refused() == REFUSED as i64).await,
        "{} refused: {}",
        refused(),
        worker.logs()
    );
    assert_eq!(
        store.query(
            "SELECT COUNT(*) FROM sluice_dead_letter_outbox
             WHERE refused IS NOT NULL AND refused LIKE '%Could not parse message%'"
        ),
        REFUSED as i64,
        "each refusal is Pub/Sub's answer"
    );
    assert!(
        store.query("SELECT MAX(id) FROM sluice_dead_letter_outbox WHERE refused IS NOT NULL")
            < store.query(
                "SELECT MIN(id) FROM sluice_dead_letter_outbox WHERE published_at IS NOT NULL"
            ),
        "the refused letters were ahead of the published ones"
    );
    let out = sluice_command(
        &["status", "-c", file.to_str().unwrap(), "--format", "json"],
        None,
    );
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json["dead_letter_topic"]["refused"], REFUSED, "{json}");
    assert_eq!(json["dead_letter_topic"]["waiting"], 0, "{json}");
    assert_eq!(store.dead_letters(), (REFUSED + ACCEPTED) as i64);
}
