//! Avro and Protobuf payloads decoded into typed columns, end to end on the real emulator.
//!
//! * Avro by the topic's schema in Pub/Sub's schema service (`decode: { schema: pubsub }`):
//!   the emulator validates each published message against the topic's schema and names the
//!   revision that took it in the message's attributes. The topic (binary encoding) gets three
//!   revisions: the first takes 100 orders and is then deleted (Pub/Sub then names their
//!   revision `_deleted-schema-revision_`: dead letters saying so); the second takes `ORDERS`
//!   orders; the third adds a nullable `note` and takes `ORDERS` more.
//! * Protobuf by a `.proto` file (the emulator's schema service refuses Protobuf schemas:
//!   "Protocol buffer support not implemented in emulator"; revisions of Protobuf schemas are
//!   covered against a fake registry in `engine/src/flow/decode/revisions.rs`): `ORDERS`
//!   binary messages, `ORDERS` in Protobuf's JSON mapping (`googclient_schemaencoding: JSON`)
//!   with the optional `note` set, and 100 corrupt ones (cut short).
//!
//! Both with 10 % publisher repeats. Outcome on SQLite: every order once, each typed value
//! exact, `note` filled exactly for the orders that carry it, the 100 dead letters of each
//! flow with their reason.
//!
//! Real: the emulator with its schema service, a `sluice` process, a SQLite file.
#![allow(clippy::unwrap_used, missing_docs)]

use bytes::Bytes;
use google_cloud_pubsub::client::{SchemaService, TopicAdmin};
use google_cloud_pubsub::model::{Encoding, Message, Schema, SchemaSettings, schema};
use sluice_tests::{Db, PROJECT, PubSub, Workdir, Worker, emulator, unique};
use std::time::Duration;

const ORDERS: usize = 1_500;
const ORPHANS: usize = 100;

/// The Avro revisions: the first two differ in their doc only; the third adds `note`.
fn avro_revision(rev: usize) -> String {
    let note = if rev == 2 {
        r#",{"name":"note","type":["null","string"],"default":null}"#
    } else {
        ""
    };
    format!(
        r#"{{"type":"record","name":"Order","doc":"revision {rev}","fields":[
        {{"name":"order_id","type":"string"}},
        {{"name":"amount","type":{{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}}}},
        {{"name":"qty","type":"long"}},
        {{"name":"ts","type":{{"type":"long","logicalType":"timestamp-millis"}}}}{note}]}}"#
    )
}

/// The Protobuf schema file; `note` is optional (NULL where unset).
const ORDER_PROTO: &str = "syntax = \"proto3\";
package shop;
message Order {
  string order_id = 1;
  string amount = 2;
  int64 qty = 3;
  string ts = 4;
  optional string note = 5;
}
";

/// Order `i`: amount `i.25`, qty `i % 7`, ts `10:mm` on 2026-12-04 (mm = i % 60).
fn ts_ms(i: usize) -> i64 {
    1_796_378_400_000 + (i % 60) as i64 * 60_000
}

fn avro_order(i: usize, rev: usize) -> Vec<u8> {
    use apache_avro::types::Value;
    let schema = apache_avro::Schema::parse_str(&avro_revision(rev)).unwrap();
    let cents = (i * 100 + 25) as i64;
    let mut fields = vec![
        ("order_id".to_owned(), Value::String(format!("o{i}"))),
        (
            "amount".to_owned(),
            Value::Decimal(apache_avro::Decimal::from(cents.to_be_bytes().to_vec())),
        ),
        ("qty".to_owned(), Value::Long((i % 7) as i64)),
        ("ts".to_owned(), Value::TimestampMillis(ts_ms(i))),
    ];
    if rev == 2 {
        fields.push((
            "note".to_owned(),
            Value::Union(1, Box::new(Value::String(format!("n{i}")))),
        ));
    }
    apache_avro::writer::datum::GenericDatumWriter::builder(&schema)
        .build()
        .unwrap()
        .write_value_to_vec(Value::Record(fields))
        .unwrap()
}

/// Order `i` in Protobuf's JSON mapping, with `note` from the second half on.
fn proto_json(i: usize) -> String {
    let note = if i >= ORDERS {
        format!(r#","note":"n{i}""#)
    } else {
        String::new()
    };
    format!(
        r#"{{"orderId":"o{i}","amount":"{i}.25","qty":"{}","ts":"2026-12-04T10:{:02}:00Z"{note}}}"#,
        i % 7,
        i % 60
    )
}

/// Order `i` as Protobuf: binary for the first half, JSON (so said in its attributes) after.
fn proto_message(i: usize, order: &prost_reflect::MessageDescriptor) -> Message {
    use prost_reflect::prost::Message as _;
    let json = proto_json(i);
    if i >= ORDERS {
        return message(i, json.into_bytes()).set_attributes([
            ("order_id", format!("o{i}")),
            ("googclient_schemaencoding", "JSON".to_owned()),
        ]);
    }
    let mut reader = serde_json::Deserializer::from_str(&json);
    let dynamic = prost_reflect::DynamicMessage::deserialize(order.clone(), &mut reader).unwrap();
    message(i, dynamic.encode_to_vec())
}

/// The Order message of [`ORDER_PROTO`], compiled.
fn order_descriptor(file: &std::path::Path) -> prost_reflect::MessageDescriptor {
    let dir = file.parent().unwrap();
    let pool = protox::compile([file], [dir]).unwrap();
    prost_reflect::DescriptorPool::from_file_descriptor_set(pool)
        .unwrap()
        .get_message_by_name("shop.Order")
        .unwrap()
}

fn message(i: usize, data: Vec<u8>) -> Message {
    Message::new()
        .set_data(Bytes::from(data))
        .set_attributes([("order_id", format!("o{i}"))])
}

/// Orders `range` encoded by `encode` under revision `rev`, with 10 % repeats.
fn batch(
    range: std::ops::Range<usize>,
    rev: usize,
    encode: fn(usize, usize) -> Vec<u8>,
) -> Vec<Message> {
    let mut all: Vec<Message> = range.clone().map(|i| message(i, encode(i, rev))).collect();
    all.extend(range.step_by(10).map(|i| message(i, encode(i, rev))));
    all
}

struct SchemaTopic {
    schemas: SchemaService,
    name: String,
    first_revision: String,
    topic: String,
}

/// A topic bound to a new schema of `kind` whose first revision is `definition`.
async fn schema_topic(kind: schema::Type, definition: &str, encoding: Encoding) -> SchemaTopic {
    let endpoint = emulator().endpoint();
    let anonymous = || google_cloud_auth::credentials::anonymous::Builder::new().build();
    let schemas = SchemaService::builder()
        .with_endpoint(&endpoint)
        .with_credentials(anonymous())
        .build()
        .await
        .unwrap();
    let id = unique("orders-schema");
    let created = schemas
        .create_schema()
        .set_parent(format!("projects/{PROJECT}"))
        .set_schema_id(&id)
        .set_schema(Schema::new().set_type(kind).set_definition(definition))
        .send()
        .await
        .unwrap();
    let topic = unique("schema-orders");
    TopicAdmin::builder()
        .with_endpoint(&endpoint)
        .with_credentials(anonymous())
        .build()
        .await
        .unwrap()
        .create_topic()
        .set_name(format!("projects/{PROJECT}/topics/{topic}"))
        .set_schema_settings(
            SchemaSettings::new()
                .set_schema(&created.name)
                .set_encoding(encoding),
        )
        .send()
        .await
        .unwrap();
    SchemaTopic {
        schemas,
        name: created.name,
        first_revision: created.revision_id,
        topic,
    }
}

impl SchemaTopic {
    /// Commits a revision; returns its id.
    async fn commit(&self, kind: schema::Type, definition: &str) -> String {
        self.schemas
            .commit_schema()
            .set_name(&self.name)
            .set_schema(
                Schema::new()
                    .set_name(&self.name)
                    .set_type(kind)
                    .set_definition(definition),
            )
            .send()
            .await
            .unwrap()
            .revision_id
    }

    async fn delete(&self, revision: &str) {
        self.schemas
            .delete_schema_revision()
            .set_name(format!("{}@{revision}", self.name))
            .send()
            .await
            .unwrap();
    }
}

/// Publishes the three revisions' orders to a new topic of `kind`; returns the topic and the
/// deleted revision's id.
async fn publish_revisions(
    pubsub: &PubSub,
    kind: schema::Type,
    encoding: Encoding,
    revision: fn(usize) -> String,
    encode: fn(usize, usize) -> Vec<u8>,
    subscription: &str,
) -> String {
    let topic = schema_topic(kind.clone(), &revision(0), encoding).await;
    // The emulator never answers the official client's GetSchema (it sends `view` as a number):
    // the first revision's id comes back with the schema's creation.
    pubsub
        .admin
        .create_subscription(subscription, &topic.topic, 10)
        .await
        .unwrap();
    let first = topic.first_revision.clone();
    let orphans: Vec<Message> = (0..ORPHANS)
        .map(|k| message(1_000_000 + k, encode(1_000_000 + k, 0)))
        .collect();
    pubsub.publish(&topic.topic, orphans).await;
    topic.commit(kind.clone(), &revision(1)).await;
    topic.delete(&first).await;
    pubsub
        .publish(&topic.topic, batch(0..ORDERS, 1, encode))
        .await;
    topic.commit(kind, &revision(2)).await;
    pubsub
        .publish(&topic.topic, batch(ORDERS..2 * ORDERS, 2, encode))
        .await;
    first
}

fn pipeline(store: &str, avro_sub: &str, proto_sub: &str, proto_file: &std::path::Path) -> String {
    let columns = "    columns:
      - { name: order_id, type: text, nullable: false }
      - { name: amount, type: numeric }
      - { name: qty, type: integer }
      - { name: ts, type: timestamp }
      - { name: note, type: text }
";
    let source = |sub: &str| {
        format!(
            "    source:
      pubsub:
        subscription: {sub}
        dedup: {{ by: attribute, attribute: order_id }}
        drain_idle: 15s
"
        )
    };
    format!(
        "pipeline: shop
mode: triggered
store: \"{store}\"
pubsub: {{ project: {PROJECT}, endpoint: \"{endpoint}\" }}
targets:
  - name: avro_orders
    kind: table
{columns}  - name: proto_orders
    kind: table
{columns}flows:
  - name: avro_orders
    target: avro_orders
{avro}    decode: {{ format: avro, schema: pubsub }}
  - name: proto_orders
    target: proto_orders
{proto}    decode: {{ format: protobuf, schema: \"{proto_file}\", message: shop.Order }}
",
        endpoint = emulator().endpoint(),
        avro = source(avro_sub),
        proto = source(proto_sub),
        proto_file = proto_file.display(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn avro_and_protobuf_revisions_land_typed_once_each() {
    let pubsub = PubSub::connect().await;
    let avro_sub = unique("avro-sub");
    let deleted_avro = publish_revisions(
        &pubsub,
        schema::Type::Avro,
        Encoding::Binary,
        avro_revision,
        avro_order,
        &avro_sub,
    )
    .await;
    let dir = Workdir::new();
    let proto_file = dir.path().join("orders.proto");
    std::fs::write(&proto_file, ORDER_PROTO).unwrap();
    let order = order_descriptor(&proto_file);
    let (proto_topic, proto_subs) = pubsub.topic_with("proto-orders", 1).await;
    let proto_sub = proto_subs[0].clone();
    let mut proto: Vec<Message> = (0..2 * ORDERS).map(|i| proto_message(i, &order)).collect();
    proto.extend(
        (0..2 * ORDERS)
            .step_by(10)
            .map(|i| proto_message(i, &order)),
    );
    proto.extend((0..ORPHANS).map(|k| {
        let whole = proto_message(k, &order);
        let cut = whole.data.slice(..whole.data.len() - 3);
        message(2_000_000 + k, cut.to_vec())
    }));
    pubsub.publish(&proto_topic, proto).await;
    let db_path = dir.db("shop");
    let file = dir.path().join("p.yaml");
    let store = format!("sqlite://{}", db_path.display());
    std::fs::write(&file, pipeline(&store, &avro_sub, &proto_sub, &proto_file)).unwrap();
    let worker = Worker::start(&file, "schemas");
    let out = worker.stdout.clone();
    assert!(
        worker.wait(Duration::from_secs(240)).success(),
        "{}",
        std::fs::read_to_string(&out).unwrap()
    );
    let letters: Vec<String> = {
        let conn = rusqlite::Connection::open(&db_path).unwrap();
        let mut stmt = conn
            .prepare(
                "SELECT flow || ' ' || reason || ' ' || substr(error, 1, 160) || ' x' || COUNT(*)
                 FROM shop__dead_letter GROUP BY flow, reason, substr(error, 1, 160)",
            )
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    println!("dead letters: {letters:#?}");
    let db = Db(db_path);
    let cents: i64 = (0..2 * ORDERS).map(|i| (i * 100 + 25) as i64).sum();
    // Pub/Sub renames a deleted revision in its messages' attributes.
    assert!(!deleted_avro.is_empty());
    let deleted = "the revision of schema % this message was published under was deleted%";
    for (table, flow, letter) in [
        ("shop__avro_orders", "avro_orders", deleted),
        (
            "shop__proto_orders",
            "proto_orders",
            "not a Protobuf shop.Order message%",
        ),
    ] {
        let rows = (2 * ORDERS) as i64;
        assert_eq!(
            db.query(&format!("SELECT COUNT(*) FROM {table}")),
            rows,
            "{table}"
        );
        assert_eq!(
            db.query(&format!("SELECT COUNT(DISTINCT order_id) FROM {table}")),
            rows
        );
        assert_eq!(
            db.query(&format!(
                "SELECT SUM(CAST(ROUND(amount * 100) AS INTEGER)) FROM {table}"
            )),
            cents,
            "{table}"
        );
        // Typed values, exact: o7 of the second revision, o1507 of the third.
        assert_eq!(
            db.query(&format!(
                "SELECT COUNT(*) FROM {table} WHERE order_id = 'o7' AND amount = 7.25 AND qty = 0
                 AND ts = '2026-12-04T10:07:00.000Z' AND note IS NULL"
            )),
            1,
            "{table}"
        );
        assert_eq!(
            db.query(&format!(
                "SELECT COUNT(*) FROM {table} WHERE order_id = 'o1507' AND amount = 1507.25
                 AND qty = 2 AND ts = '2026-12-04T10:07:00.000Z' AND note = 'n1507'"
            )),
            1,
            "{table}"
        );
        assert_eq!(
            db.query(&format!(
                "SELECT COUNT(*) FROM {table} WHERE note IS NOT NULL"
            )),
            ORDERS as i64
        );
        assert_eq!(
            db.query(&format!(
                "SELECT COUNT(*) FROM shop__dead_letter WHERE flow = '{flow}'
                 AND reason = 'undecodable' AND error LIKE '{letter}'"
            )),
            ORPHANS as i64,
            "{flow}"
        );
    }
}

/// `sluice validate` (and `run`) compile a schema file and refuse one that cannot fill the
/// columns, located at `flows[0].decode.schema` with exit 2; the same file with a fitting
/// schema is valid.
#[test]
fn a_schema_file_that_cannot_fill_the_columns_is_refused_before_a_run() {
    let dir = Workdir::new();
    let schema = dir.path().join("orders.avsc");
    let file = dir.path().join("p.yaml");
    let write = |amount: &str| {
        std::fs::write(
            &schema,
            format!(
                r#"{{"type":"record","name":"O","fields":[{{"name":"order_id","type":"string"}},
                {{"name":"amount","type":"{amount}"}}]}}"#
            ),
        )
        .unwrap();
    };
    std::fs::write(
        &file,
        format!(
            "pipeline: shop
store: \"sqlite://{db}\"
targets:
  - name: orders
    kind: table
    columns:
      - {{ name: order_id, type: text }}
      - {{ name: amount, type: integer }}
flows:
  - name: orders
    target: orders
    source: {{ pubsub: {{ subscription: orders-sub }} }}
    decode: {{ format: avro, schema: \"{schema}\" }}
",
            db = dir.db("shop").display(),
            schema = schema.display()
        ),
    )
    .unwrap();
    let validate = || {
        sluice_tests::sluice_command(
            &["validate", "-c", file.to_str().unwrap()],
            Some(dir.path()),
        )
    };
    write("long");
    let valid = validate();
    assert_eq!(valid.code, 0, "{}", valid.all());
    write("string");
    let refused = validate();
    assert_eq!(refused.code, 2, "{}", refused.all());
    assert!(
        refused.stderr.contains("p.yaml:13:")
            && refused.stderr.contains("flows[0].decode.schema")
            && refused.stderr.contains("$.amount is string in the schema"),
        "{}",
        refused.all()
    );
}
