//! Pub/Sub's limits pass end to end: a message of 10 MB (Pub/Sub's largest) and one with 100
//! attributes (its most) land intact in the table, payload bytes and attributes exact, with
//! `flow_control.max_outstanding_bytes` smaller than the large message (it then takes the whole
//! byte budget alone instead of waiting forever).
//!
//! Real parts: the Pub/Sub emulator (it accepts both), a `sluice` process, SQLite.
#![allow(clippy::unwrap_used, missing_docs)]

use bytes::Bytes;
use google_cloud_pubsub::model::Message;
use sluice_tests::{Db, FlowYaml, PipelineYaml, PubSub, Workdir, Worker, eventually};
use std::collections::BTreeMap;
use std::time::Duration;

/// 10 MB of data in one message, less the room its attributes and framing take.
const LARGE: usize = 10 * 1000 * 1000 - 1000;
const ATTRIBUTES: usize = 100;

#[tokio::test(flavor = "multi_thread")]
async fn the_largest_message_and_the_most_attributes_land_intact() {
    let pubsub = PubSub::connect().await;
    let (topic, subscriptions) = pubsub.topic_with("limits", 1).await;
    let dir = Workdir::new();
    let db = dir.db("limits.db");
    let file = PipelineYaml::new("test")
        .mode("continuous")
        .sqlite(&db)
        .pubsub_emulator()
        .target_table("events")
        .flow(
            FlowYaml::pubsub("ingest", "events", &subscriptions[0])
                .setting("flow_control", "{ max_outstanding_bytes: 4MiB }"),
        )
        .write(dir.path(), "p.yaml");
    let worker = Worker::start(&file, "limits");

    let large: Vec<u8> = (0..LARGE).map(|i| (i % 251) as u8).collect();
    let attributes: BTreeMap<String, String> = (0..ATTRIBUTES)
        .map(|i| (format!("key_{i:03}"), format!("value \"{i}\" ü\u{1F600}")))
        .collect();
    // One publish call each: a request holds at most 10 MB.
    let mut ids = Vec::new();
    for message in [
        Message::new()
            .set_data(Bytes::from(large.clone()))
            .set_attributes([("kind", "large")]),
        Message::new()
            .set_data(Bytes::from_static(b"many"))
            .set_attributes(attributes.clone()),
        Message::new().set_data(Bytes::from_static(b"small")),
    ] {
        ids.extend(pubsub.publish(&topic, vec![message]).await);
    }
    let store = Db(db.clone());
    assert!(
        eventually(Duration::from_secs(120), || store.rows() == 3).await,
        "{} rows; {}",
        store.rows(),
        worker.logs()
    );
    drop(worker);

    let connection = rusqlite::Connection::open(&db).unwrap();
    let row = |id: &str| -> (Vec<u8>, String) {
        connection
            .query_row(
                "SELECT data, attributes FROM test__events WHERE message_id = ?1",
                [id],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap()
    };
    let (data, _) = row(&ids[0]);
    assert_eq!(data.len(), LARGE, "the large payload's length");
    assert!(data == large, "the large payload's bytes");
    let (data, stored) = row(&ids[1]);
    assert_eq!(data, b"many");
    let stored: BTreeMap<String, String> = serde_json::from_str(&stored).unwrap();
    assert_eq!(stored, attributes, "the 100 attributes, exactly");
    assert_eq!(store.dead_letters(), 0);
}
