//! A subscription with a dead-letter policy and `poison: nack`: a message that always fails is
//! handed back to Pub/Sub at each failure, and Pub/Sub forwards it to the policy's dead-letter
//! topic after `max_delivery_attempts`, across a worker restart in between; the other messages
//! commit once each and the poison never reaches sluice's own dead-letter table. The attempts
//! sluice counts start from Pub/Sub's `delivery_attempt` (the logs of the second worker show
//! the attempt it took over at). The policy allows 20 deliveries, so that some are left for the
//! second worker however many the first one used while it stopped (a failing message comes
//! back within milliseconds on the emulator).
//!
//! Real parts: the Pub/Sub emulator (it honours dead-letter policies and `delivery_attempt`),
//! `sluice` processes, SQLite, a real gRPC Stage server that refuses the poison record (a
//! `foreach_batch` target: the message is at fault, INVALID_ARGUMENT).
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_engine::pubsub::SubscriptionSettings;
use sluice_tests::stage_server::stage_server;
use sluice_tests::{
    Db, FlowYaml, PipelineYaml, PubSub, Workdir, Worker, event, eventually, unique,
};
use std::time::Duration;

const GOOD: usize = 100;
const MAX_DELIVERY_ATTEMPTS: i32 = 20;

#[tokio::test(flavor = "multi_thread")]
async fn a_poison_message_reaches_the_dead_letter_topic_across_a_restart() {
    let (stage, recorder) = stage_server().await;
    recorder.refuse_keys_containing("poison");
    let pubsub = PubSub::connect().await;
    let dead_letter_topic = unique("dlp-dead");
    pubsub.admin.create_topic(&dead_letter_topic).await.unwrap();
    let dead_letters = format!("{dead_letter_topic}-sub");
    pubsub
        .admin
        .create_subscription(&dead_letters, &dead_letter_topic, 10)
        .await
        .unwrap();
    let (topic, subscription) = pubsub
        .topic_with_subscription(
            "dlp",
            SubscriptionSettings {
                dead_letter: Some((dead_letter_topic.clone(), MAX_DELIVERY_ATTEMPTS)),
                ..SubscriptionSettings::default()
            },
        )
        .await;
    let dir = Workdir::new();
    let db = dir.db("dlp.db");
    let file = PipelineYaml::new("test")
        .sqlite(&db)
        .mode("continuous")
        .pubsub_emulator()
        .target(
            "enrich",
            "foreach_batch",
            &format!("{{ endpoint: \"http://{stage}\" }}"),
        )
        .flow(
            FlowYaml::pubsub("live", "enrich", &subscription)
                .dedup_attribute("event_id")
                .setting("poison", "nack")
                .batch(50, "20ms")
                .streams(1),
        )
        .write(dir.path(), "p.yaml");
    let poison_calls = || {
        recorder
            .calls()
            .iter()
            .filter(|c| c.keys.len() == 1 && c.keys[0].contains("poison"))
            .count()
    };
    let worker = Worker::start(&file, "first");
    let mut messages: Vec<_> = (0..GOOD).map(|i| event(&format!("e{i}"))).collect();
    messages.insert(GOOD / 2, event("poison"));
    pubsub.publish(&topic, messages).await;
    assert!(
        eventually(Duration::from_secs(120), || poison_calls() >= 2).await,
        "the poison was not retried: {}",
        worker.logs()
    );
    // A restart while the poison still goes round: Pub/Sub keeps its count.
    worker.terminate();
    let first_logs = worker.logs();
    assert!(
        worker.wait(Duration::from_secs(60)).success(),
        "{first_logs}"
    );
    let worker = Worker::start(&file, "second");
    let forwarded = pubsub
        .plain_client_taking(&dead_letters, 1, Duration::from_secs(240), true, |m| {
            m.attributes.get("event_id").cloned()
        })
        .await
        .unwrap();
    let logs = worker.logs();
    drop(worker);
    assert_eq!(
        forwarded.into_iter().collect::<Vec<_>>(),
        [Some("poison".to_owned())],
        "the poison reached the dead-letter topic: {first_logs}\n{logs}"
    );
    let store = Db(db);
    assert_eq!(
        store.query("SELECT COUNT(*) FROM test__enrich"),
        GOOD as i64,
        "each good message once"
    );
    assert_eq!(
        store.dead_letters(),
        0,
        "the poison is Pub/Sub's, not the table's"
    );
    assert!(
        first_logs.contains("handed back to Pub/Sub (poison: nack)"),
        "{first_logs}"
    );
    let deliveries = poison_calls();
    println!("the stage saw the poison alone {deliveries} times");
    assert!(
        deliveries <= MAX_DELIVERY_ATTEMPTS as usize,
        "Pub/Sub counted the deliveries across the restart ({deliveries} single calls)"
    );
    let attempts: Vec<u32> = logs
        .match_indices(" attempts=")
        .filter_map(|(at, key)| {
            let digits: String = logs[at + key.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .collect();
    assert!(
        attempts.first().is_some_and(|first| *first >= 2),
        "the second worker took the attempt count over from delivery_attempt ({attempts:?}): \
         {logs}"
    );
}
