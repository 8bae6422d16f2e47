//! A table target without `columns:` written by a flow that decodes by a schema file takes its
//! columns from the schema (SPEC §5, "Typed tables"): created with the types its values land
//! as, checked by `sluice validate` like declared ones (a downstream flow's `select:` over
//! them), and filled exactly. With `schema: pubsub` they come from every revision of the
//! topic's schema, and a revision committed while the flow runs adds its new field as a column,
//! in the commit that first writes it.
//!
//! Real parts: the Pub/Sub emulator with its schema service, `sluice` processes, a SQLite
//! file.
#![allow(clippy::unwrap_used, missing_docs)]

use bytes::Bytes;
use google_cloud_pubsub::model::Message;
use sluice_tests::{
    Db, PubSub, SchemaTopic, Workdir, Worker, emulator, eventually, sluice_command, unique,
};
use std::path::Path;
use std::time::Duration;

const ORDER_PROTO: &str = r#"syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
enum Region { REGION_UNKNOWN = 0; EU = 1; US = 2; }
message Order {
  string order_id = 1;
  int64 qty = 2;
  double price = 3;
  google.protobuf.Timestamp ts = 4;
  optional string note = 5;
  Region region = 6;
  repeated string tags = 7;
}
"#;

/// `pipeline: shop` reading `subscription` into `orders` (no `columns:`: the schema's) and,
/// downstream, `big`, whose `select:` and `where:` read the derived columns; `extra` is
/// appended to the flows.
fn pipeline(dir: &Path, subscription: &str, schema: &str, extra: &str) -> String {
    format!(
        "pipeline: shop
mode: triggered
store: \"sqlite://{db}\"
pubsub: {{ project: {project}, endpoint: \"{endpoint}\" }}
targets:
  - name: orders
    kind: table
  - name: big
    kind: table
    columns:
      - {{ name: order_id, type: text, nullable: false }}
      - {{ name: twice, type: integer }}
flows:
  - name: orders
    target: orders
    source:
      pubsub:
        subscription: {subscription}
        dedup: {{ by: attribute, attribute: order_id }}
        drain_idle: 10s
    decode: {schema}
  - name: big
    target: big
    source: {{ table: orders }}
    select: {{ twice: \"qty * 2\" }}
    where: \"qty >= 5 AND note IS NULL\"
{extra}",
        db = dir.join("shop.db").display(),
        project = sluice_tests::PROJECT,
        endpoint = emulator().endpoint(),
    )
}

fn proto_schema(dir: &Path) -> String {
    let proto = dir.join("orders.proto");
    std::fs::write(&proto, ORDER_PROTO).unwrap();
    "{ format: protobuf, schema: orders.proto, message: shop.Order }".to_owned()
}

/// Order `i`: qty `i % 10`, price `i.5`, region EU or US, a note on every 4th, two tags.
fn order(i: usize, descriptor: &prost_reflect::MessageDescriptor) -> Message {
    use prost_reflect::prost::Message as _;
    let note = if i.is_multiple_of(4) {
        format!(r#","note":"n{i}""#)
    } else {
        String::new()
    };
    let json = format!(
        r#"{{"orderId":"o{i}","qty":"{}","price":{i}.5,"ts":"2026-12-04T10:{:02}:00Z",
            "region":"{}","tags":["a","b{i}"]{note}}}"#,
        i % 10,
        i % 60,
        if i.is_multiple_of(2) { "EU" } else { "US" }
    );
    let mut reader = serde_json::Deserializer::from_str(&json);
    let dynamic =
        prost_reflect::DynamicMessage::deserialize(descriptor.clone(), &mut reader).unwrap();
    Message::new()
        .set_data(Bytes::from(dynamic.encode_to_vec()))
        .set_attributes([("order_id", format!("o{i}"))])
}

fn descriptor(dir: &Path) -> prost_reflect::MessageDescriptor {
    let pool = protox::compile([dir.join("orders.proto")], [dir]).unwrap();
    prost_reflect::DescriptorPool::from_file_descriptor_set(pool)
        .unwrap()
        .get_message_by_name("shop.Order")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_table_without_columns_takes_its_schema_files_and_lands_exact_values() {
    const ORDERS: usize = 400;
    let dir = Workdir::new();
    let schema = proto_schema(dir.path());
    let order_type = descriptor(dir.path());
    let pubsub = PubSub::connect().await;
    // The second run reads the second subscription, which holds everything from the start.
    let (topic, subs) = pubsub.topic_with("derived", 2).await;
    let mut messages: Vec<Message> = (0..ORDERS).map(|i| order(i, &order_type)).collect();
    // Publisher duplicates.
    messages.extend((0..ORDERS).step_by(10).map(|i| order(i, &order_type)));
    pubsub.publish(&topic, messages).await;
    let file = dir.path().join("p.yaml");
    std::fs::write(&file, pipeline(dir.path(), &subs[0], &schema, "")).unwrap();
    let worker = Worker::start(&file, "derived");
    let out = worker.stdout.clone();
    assert!(
        worker.wait(Duration::from_secs(180)).success(),
        "{}",
        std::fs::read_to_string(&out).unwrap()
    );
    let db = Db(dir.path().join("shop.db"));
    // The columns, as the schema gives them, nullable.
    for (name, ty, not_null) in [
        ("order_id", "TEXT", 0),
        ("qty", "INTEGER", 0),
        ("price", "DOUBLE", 0),
        ("ts", "TIMESTAMP TEXT", 0),
        ("note", "TEXT", 0),
        ("region", "TEXT", 0),
        ("tags", "JSON TEXT", 0),
    ] {
        assert_eq!(
            db.query(&format!(
                "SELECT COUNT(*) FROM pragma_table_info('shop__orders')
                 WHERE name = '{name}' AND type = '{ty}' AND \"notnull\" = {not_null}"
            )),
            1,
            "column {name} {ty} not null {not_null}"
        );
    }
    assert_eq!(
        db.query("SELECT COUNT(*) FROM pragma_table_info('shop__orders') WHERE name NOT LIKE '\\_sluice\\_%' ESCAPE '\\'"),
        7
    );
    assert_eq!(db.query("SELECT COUNT(*) FROM shop__orders"), ORDERS as i64);
    assert_eq!(
        db.query("SELECT COUNT(DISTINCT order_id) FROM shop__orders"),
        ORDERS as i64
    );
    // Exact values: o13 has qty 3, price 13.5, region US, no note, tags ["a","b13"].
    assert_eq!(
        db.query(
            "SELECT COUNT(*) FROM shop__orders WHERE order_id = 'o13' AND qty = 3
             AND price = 13.5 AND region = 'US' AND note IS NULL
             AND ts = '2026-12-04T10:13:00.000Z' AND json_extract(tags, '$[1]') = 'b13'"
        ),
        1
    );
    assert_eq!(
        db.query("SELECT COUNT(*) FROM shop__orders WHERE note = 'n8'"),
        1
    );
    assert_eq!(
        db.query("SELECT SUM(qty) FROM shop__orders"),
        (0..ORDERS).map(|i| (i % 10) as i64).sum::<i64>()
    );
    // Downstream, the derived columns read like declared ones.
    let big: Vec<usize> = (0..ORDERS)
        .filter(|i| i % 10 >= 5 && !i.is_multiple_of(4))
        .collect();
    assert_eq!(db.query("SELECT COUNT(*) FROM shop__big"), big.len() as i64);
    assert_eq!(
        db.query("SELECT SUM(twice) FROM shop__big"),
        big.iter().map(|i| (i % 10 * 2) as i64).sum::<i64>()
    );
    assert_eq!(db.query("SELECT COUNT(*) FROM shop__dead_letter"), 0);

    // The schema file gains a field: the next run adds its column (NULL in the rows before).
    std::fs::write(
        dir.path().join("orders.proto"),
        ORDER_PROTO.replace(
            "repeated string tags = 7;",
            "repeated string tags = 7;\n  string channel = 8;",
        ),
    )
    .unwrap();
    let order_type = descriptor(dir.path());
    let later: Vec<Message> = (ORDERS..ORDERS + 50)
        .map(|i| {
            use prost_reflect::prost::Message as _;
            let mut dynamic = prost_reflect::DynamicMessage::decode(
                order_type.clone(),
                order(i, &order_type).data.clone(),
            )
            .unwrap();
            dynamic.set_field_by_name("channel", prost_reflect::Value::String("web".to_owned()));
            Message::new()
                .set_data(Bytes::from(dynamic.encode_to_vec()))
                .set_attributes([("order_id", format!("o{i}"))])
        })
        .collect();
    pubsub.publish(&topic, later).await;
    std::fs::write(&file, pipeline(dir.path(), &subs[1], &schema, "")).unwrap();
    let worker = Worker::start(&file, "derived-2");
    let out = worker.stdout.clone();
    assert!(
        worker.wait(Duration::from_secs(180)).success(),
        "{}",
        std::fs::read_to_string(&out).unwrap()
    );
    assert_eq!(
        db.query("SELECT COUNT(*) FROM pragma_table_info('shop__orders') WHERE name = 'channel' AND type = 'TEXT'"),
        1
    );
    assert_eq!(
        db.query("SELECT COUNT(*) FROM shop__orders WHERE channel = 'web'"),
        50,
        "{} rows, {} dead letters; {}",
        db.query("SELECT COUNT(*) FROM shop__orders"),
        db.query("SELECT COUNT(*) FROM shop__dead_letter"),
        std::fs::read_to_string(&out).unwrap()
    );
    assert_eq!(
        db.query("SELECT COUNT(*) FROM shop__orders WHERE channel IS NULL"),
        ORDERS as i64
    );
    // What the second subscription brought again was each a duplicate in the ledger: only
    // the 50 new orders are rows (how many were received counts redeliveries too, which a
    // loaded emulator makes).
    let said = std::fs::read_to_string(&out).unwrap();
    assert!(
        said.contains("flow orders: COMPLETED; received ")
            && said.contains(", rows 50, dead letters 0,"),
        "{said}"
    );
}

#[test]
fn validate_checks_the_rest_of_the_file_against_derived_columns() {
    let dir = Workdir::new();
    let file = dir.path().join("p.yaml");
    let validate = |text: String| {
        std::fs::write(&file, text).unwrap();
        sluice_command(
            &["validate", "-c", file.to_str().unwrap()],
            Some(dir.path()),
        )
    };
    let schema = proto_schema(dir.path());
    let valid = validate(pipeline(dir.path(), "orders-sub", &schema, ""));
    assert_eq!(valid.code, 0, "{}", valid.all());

    // A derived column of the wrong type for an expression: refused, located.
    let wrong = validate(pipeline(dir.path(), "orders-sub", &schema, "").replace(
        "where: \"qty >= 5 AND note IS NULL\"",
        "where: \"tags >= 5\"",
    ));
    assert_eq!(wrong.code, 2, "{}", wrong.all());
    assert!(wrong.stderr.contains("flows[1].where"), "{}", wrong.all());

    // A column the schema does not have.
    let unknown = validate(
        pipeline(dir.path(), "orders-sub", &schema, "")
            .replace("twice: \"qty * 2\"", "twice: \"quantity * 2\""),
    );
    assert_eq!(unknown.code, 2, "{}", unknown.all());
    assert!(
        unknown.stderr.contains("quantity") && unknown.stderr.contains("flows[1].select.twice"),
        "{}",
        unknown.all()
    );

    // A schema that does not compile: located at the decode's schema.
    std::fs::write(
        dir.path().join("broken.proto"),
        "syntax = \"proto3\"; message {",
    )
    .unwrap();
    let broken = validate(pipeline(
        dir.path(),
        "orders-sub",
        "{ format: protobuf, schema: broken.proto, message: shop.Order }",
        "",
    ));
    assert_eq!(broken.code, 2, "{}", broken.all());
    assert!(
        broken.stderr.contains("flows[0].decode.schema")
            && broken
                .stderr
                .contains("no `columns:`, so they come from schema file"),
        "{}",
        broken.all()
    );

    // A field that cannot be a column name: said at the decode's schema, once.
    std::fs::write(
        dir.path().join("camel.proto"),
        "syntax = \"proto3\"; package shop; message Order { string orderId = 1; int64 qty = 2; }",
    )
    .unwrap();
    let camel = validate(pipeline(
        dir.path(),
        "orders-sub",
        "{ format: protobuf, schema: camel.proto, message: shop.Order }",
        "",
    ));
    assert_eq!(camel.code, 2, "{}", camel.all());
    assert!(
        camel.stderr.contains("flows[0].decode.schema")
            && camel.stderr.contains("orderId cannot be column names"),
        "{}",
        camel.all()
    );
    assert!(!camel.stderr.contains("targets["), "{}", camel.all());

    // The topic's schema, of a subscription Pub/Sub does not have: said at the decode.
    let pubsub = validate(pipeline(
        dir.path(),
        "orders-sub",
        "{ format: avro, schema: pubsub }",
        "",
    ));
    assert_eq!(pubsub.code, 2, "{}", pubsub.all());
    assert!(
        pubsub.stderr.contains("flows[0].decode.schema")
            && pubsub
                .stderr
                .contains("no `columns:`, so they come from the topic's Pub/Sub schema")
            && pubsub.stderr.contains("orders-sub"),
        "{}",
        pubsub.all()
    );
}

/// Avro revision `rev` of the followed schema: the second adds `note`, the third changes
/// `qty`'s type.
fn followed_revision(rev: usize) -> String {
    let (qty, note) = match rev {
        0 => ("long", ""),
        1 => (
            "long",
            r#",{"name":"note","type":["null","string"],"default":null}"#,
        ),
        _ => ("double", ""),
    };
    format!(
        r#"{{"type":"record","name":"Order","fields":[
        {{"name":"order_id","type":"string"}},{{"name":"qty","type":"{qty}"}}{note}]}}"#
    )
}

/// Orders `range` in Avro's JSON encoding under revision `rev`.
fn followed_orders(range: std::ops::Range<usize>, rev: usize) -> Vec<Message> {
    range
        .map(|i| {
            let data = match rev {
                0 => format!(r#"{{"order_id":"o{i}","qty":{}}}"#, i % 7),
                1 => format!(
                    r#"{{"order_id":"o{i}","qty":{},"note":{{"string":"n{i}"}}}}"#,
                    i % 7
                ),
                _ => format!(r#"{{"order_id":"o{i}","qty":{}.5}}"#, i % 7),
            };
            Message::new()
                .set_data(Bytes::from(data))
                .set_attributes([("order_id", format!("o{i}"))])
        })
        .collect()
}

/// `pipeline: shop` reading `subscription` into `orders`, whose columns follow the topic's
/// schema.
fn following(dir: &Path, subscription: &str, mode: &str) -> String {
    format!(
        "pipeline: shop
mode: {mode}
store: \"sqlite://{db}\"
pubsub: {{ project: {project}, endpoint: \"{endpoint}\" }}
targets:
  - {{ name: orders, kind: table }}
flows:
  - name: orders
    target: orders
    source:
      pubsub:
        subscription: {subscription}
        dedup: {{ by: attribute, attribute: order_id }}
        drain_idle: 5s
    decode: {{ format: avro, schema: pubsub }}
",
        db = dir.join("shop.db").display(),
        project = sluice_tests::PROJECT,
        endpoint = emulator().endpoint(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_table_following_the_topics_schema_gains_a_new_revisions_field_while_running() {
    const ORDERS: usize = 150;
    let dir = Workdir::new();
    let pubsub = PubSub::connect().await;
    let kind = google_cloud_pubsub::model::schema::Type::Avro;
    let topic = SchemaTopic::create(
        &unique("followed-schema"),
        kind.clone(),
        &followed_revision(0),
        &unique("followed"),
        google_cloud_pubsub::model::Encoding::Json,
    )
    .await;
    // The second run reads the second subscription, which holds everything from the start.
    let subs = [unique("followed-a"), unique("followed-b")];
    for sub in &subs {
        pubsub
            .admin
            .create_subscription(sub, &topic.topic, 10)
            .await
            .unwrap();
    }
    let file = dir.path().join("p.yaml");
    std::fs::write(&file, following(dir.path(), &subs[0], "continuous")).unwrap();
    let db = Db(dir.path().join("shop.db"));
    let columns = || {
        db.query(
            "SELECT COUNT(*) FROM pragma_table_info('shop__orders') \
             WHERE name NOT LIKE '\\_sluice\\_%' ESCAPE '\\'",
        )
    };
    let rows = || db.query("SELECT COUNT(*) FROM shop__orders");
    let worker = Worker::start(&file, "following");
    pubsub
        .publish(&topic.topic, followed_orders(0..ORDERS, 0))
        .await;
    assert!(
        eventually(Duration::from_secs(120), || rows() == ORDERS as i64).await,
        "{} rows; {}",
        rows(),
        worker.logs()
    );
    assert_eq!(columns(), 2, "order_id and qty, from the first revision");

    // A revision that adds `note`, committed while the flow runs.
    topic.commit(kind.clone(), &followed_revision(1)).await;
    pubsub
        .publish(&topic.topic, followed_orders(ORDERS..2 * ORDERS, 1))
        .await;
    assert!(
        eventually(Duration::from_secs(120), || rows() == 2 * ORDERS as i64).await,
        "{} rows; {}",
        rows(),
        worker.logs()
    );
    assert_eq!(columns(), 3);
    assert_eq!(
        db.query(
            "SELECT COUNT(*) FROM pragma_table_info('shop__orders') \
             WHERE name = 'note' AND type = 'TEXT' AND \"notnull\" = 0"
        ),
        1
    );
    assert_eq!(
        db.query("SELECT COUNT(*) FROM shop__orders WHERE note = 'n' || substr(order_id, 2)"),
        ORDERS as i64
    );
    assert_eq!(
        db.query(&format!(
            "SELECT COUNT(*) FROM shop__orders WHERE note IS NULL \
             AND CAST(substr(order_id, 2) AS INTEGER) < {ORDERS}"
        )),
        ORDERS as i64
    );
    assert_eq!(
        db.query("SELECT SUM(qty) FROM shop__orders"),
        (0..2 * ORDERS).map(|i| (i % 7) as i64).sum::<i64>()
    );

    // A revision that changes `qty`'s type adds nothing: its messages are dead letters.
    topic.commit(kind, &followed_revision(2)).await;
    pubsub
        .publish(
            &topic.topic,
            followed_orders(2 * ORDERS..2 * ORDERS + 10, 2),
        )
        .await;
    let letters = || {
        db.query(
            "SELECT COUNT(*) FROM shop__dead_letter \
             WHERE reason = 'undecodable' AND error LIKE '%$.qty%'",
        )
    };
    assert!(
        eventually(Duration::from_secs(120), || letters() == 10).await,
        "{} dead letters; {}",
        letters(),
        worker.logs()
    );
    assert_eq!(columns(), 3);
    worker.terminate();
    let logs = worker.logs();
    assert!(worker.wait(Duration::from_secs(60)).success(), "{logs}");
    assert_eq!(
        logs.matches("a schema revision adds fields").count(),
        1,
        "{logs}"
    );

    // The next run derives all three columns from the revisions (the third adds none), and
    // finds each message of the second subscription committed or dead-lettered already.
    std::fs::write(&file, following(dir.path(), &subs[1], "triggered")).unwrap();
    let again = Worker::start(&file, "following-again");
    let (out, err) = (again.stdout.clone(), again.stderr.clone());
    assert!(
        again.wait(Duration::from_secs(180)).success(),
        "{}",
        std::fs::read_to_string(&out).unwrap()
    );
    let said = std::fs::read_to_string(&out).unwrap();
    // Each message was committed or dead-lettered already: no row, no new dead letter
    // (received counts redeliveries too).
    assert!(
        said.contains("flow orders: COMPLETED; received ")
            && said.contains(", rows 0, dead letters 0,"),
        "{said}"
    );
    let logs = std::fs::read_to_string(&err).unwrap();
    assert!(logs.contains("changes a field's type: $.qty"), "{logs}");
    assert_eq!(columns(), 3);
    assert_eq!(rows(), 2 * ORDERS as i64);
}
