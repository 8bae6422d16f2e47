//! Update flows end to end (issue 30, SCD type 1), the seed's pattern: a `once` flow loads a
//! snapshot of 200 customers from a file, and a live flow that `depends_on` it applies 2 000
//! change events from Pub/Sub (upserts and deletes, versions shuffled, one in ten published
//! twice) to the same keyed table. The table ends as a sequential replay of snapshot and changes
//! in version order: each key's greatest change, deletes as tombstones; a change without a
//! version is a dead letter naming the column. The changes are published before the worker
//! starts, shuffled, so the live flow meets them out of order.
//!
//! Real: the emulator, a `sluice` worker, SQLite.
#![allow(clippy::unwrap_used, missing_docs)]

use bytes::Bytes;
use google_cloud_pubsub::model::Message;
use sluice_tests::{Db, PubSub, Workdir, Worker, emulator, eventually};
use std::collections::BTreeMap;
use std::time::Duration;

const KEYS: usize = 200;
const CHANGES: usize = 2_000;

fn pipeline(store: &str, snapshot: &str, subscription: &str) -> String {
    format!(
        "pipeline: crm
mode: continuous
store: \"{store}\"
pubsub: {{ project: {project}, endpoint: \"{endpoint}\" }}
targets:
  - name: customers
    kind: table
    keys: [id]
    columns:
      - {{ name: id, type: text, nullable: false }}
      - {{ name: version, type: integer, nullable: false }}
      - {{ name: name, type: text }}
flows:
  - name: snapshot
    target: customers
    once: true
    source: {{ file: {{ path: \"{snapshot}\" }} }}
    decode: {{ format: json, fields: {{ id: text, version: integer, name: text }} }}
    apply_changes: {{ sequence_by: version }}
  - name: changes
    target: customers
    depends_on: snapshot
    source:
      pubsub:
        subscription: {subscription}
        dedup: {{ by: attribute, attribute: change_id }}
    decode: {{ format: json, fields: {{ id: text, version: integer, name: text, op: text }} }}
    apply_changes: {{ sequence_by: version, apply_as_deletes: \"op = 'D'\" }}
",
        project = sluice_tests::PROJECT,
        endpoint = emulator().endpoint(),
    )
}

/// A small deterministic generator.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_then_live_changes_end_as_their_replay() {
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("updates", 1).await;
    let dir = Workdir::new();
    // The snapshot: version 0 of every customer.
    let snapshot = dir.path().join("snapshot.jsonl");
    let lines: String = (0..KEYS)
        .map(|k| {
            format!(
                "{{\"id\":\"s{k}\",\"data\":{{\"id\":\"c{k}\",\"version\":0,\"name\":\"first{k}\"}}}}\n"
            )
        })
        .collect();
    std::fs::write(&snapshot, lines).unwrap();
    // The replay's state: key -> (version, dedup key, name or None for a delete).
    let mut last: BTreeMap<String, (i64, String, Option<String>)> = (0..KEYS)
        .map(|k| {
            (
                format!("c{k}"),
                (0, format!("s{k}"), Some(format!("first{k}"))),
            )
        })
        .collect();
    let mut rng = Lcg(30);
    let mut messages = Vec::new();
    for i in 0..CHANGES {
        let key = format!("c{}", rng.below(KEYS as u64));
        let version = 1 + rng.below(40) as i64;
        let delete = rng.below(6) == 0;
        let name = format!("n{i}");
        let change_id = format!("x{i:05}");
        let json = if delete {
            format!("{{\"id\":\"{key}\",\"version\":{version},\"op\":\"D\"}}")
        } else {
            format!("{{\"id\":\"{key}\",\"version\":{version},\"name\":\"{name}\",\"op\":\"U\"}}")
        };
        let message = Message::new()
            .set_data(Bytes::from(json))
            .set_attributes([("change_id", change_id.clone())]);
        if rng.below(10) == 0 {
            messages.push(message.clone());
        }
        messages.push(message);
        let held = &last[&key];
        if (version, &change_id) > (held.0, &held.1) {
            last.insert(key, (version, change_id, (!delete).then_some(name)));
        }
    }
    // One change without a version.
    messages.push(
        Message::new()
            .set_data(Bytes::from(
                "{\"id\":\"c1\",\"name\":\"none\",\"op\":\"U\"}",
            ))
            .set_attributes([("change_id", "x-none".to_owned())]),
    );
    for i in (1..messages.len()).rev() {
        messages.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let distinct = CHANGES + 1;
    pubsub.publish(&topic, messages).await;

    let db_path = dir.db("crm");
    let db = Db(db_path.clone());
    let file = dir.path().join("p.yaml");
    std::fs::write(
        &file,
        pipeline(
            &format!("sqlite://{}", db_path.display()),
            &snapshot.display().to_string(),
            &subs[0],
        ),
    )
    .unwrap();
    let worker = Worker::start(&file, "updates");
    let committed = "SELECT COALESCE(SUM(committed), 0) + COALESCE(SUM(dead_lettered), 0)
                     FROM sluice_flows WHERE flow = 'changes'";
    assert!(
        eventually(Duration::from_secs(180), || db.query(committed)
            == distinct as i64)
        .await,
        "changes settled {} of {distinct}; logs:\n{}",
        db.query(committed),
        worker.logs()
    );
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(60)).success());

    let expected: Vec<String> = last
        .iter()
        .map(|(key, (version, _, name))| {
            format!(
                "{key}|{version}|{}|{}",
                name.as_deref().unwrap_or(""),
                u8::from(name.is_none())
            )
        })
        .collect();
    let table = db.text(
        "SELECT group_concat(id || '|' || version || '|' || COALESCE(name, '') || '|' ||
                (_sluice_deleted_at IS NOT NULL), ',') FROM
             (SELECT * FROM crm__customers ORDER BY id)",
    );
    assert_eq!(table.split(',').collect::<Vec<_>>(), expected);
    let dead = db.text("SELECT group_concat(reason || ' ' || error, '; ') FROM crm__dead_letter");
    assert!(
        dead.contains("version"),
        "the change without a version: {dead}"
    );
    assert_eq!(
        db.query("SELECT COUNT(*) FROM crm__dead_letter"),
        1,
        "{dead}"
    );
}
