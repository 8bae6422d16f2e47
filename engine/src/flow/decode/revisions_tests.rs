//! The decoders by schema revisions, on a fake registry.
#![allow(clippy::unwrap_used)]

use super::*;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A registry in memory (a fake of Pub/Sub's schema service: revisions come and go at
/// the test's word).
#[derive(Debug, Default)]
struct Registry {
    revisions: Mutex<HashMap<String, Revision>>,
    fetches: AtomicUsize,
    /// An outage while set.
    down: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl SchemaRegistry for Registry {
    async fn revision(&self, schema: &str, id: &str) -> Result<Result<Revision, String>, String> {
        assert_eq!(schema, SCHEMA);
        self.fetches.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err("no answer".to_owned());
        }
        Ok(self
            .revisions
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .ok_or_else(|| format!("schema {schema} has no revision {id}")))
    }

    /// Oldest first is by id here (`r1`, `r2`, ...).
    async fn revisions(&self, schema: &str) -> Result<Vec<(String, Revision)>, String> {
        assert_eq!(schema, SCHEMA);
        if self.down.load(Ordering::SeqCst) {
            return Err("no answer".to_owned());
        }
        let mut all: Vec<(String, Revision)> = self
            .revisions
            .lock()
            .unwrap()
            .iter()
            .map(|(id, r)| (id.clone(), r.clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(all)
    }
}

const SCHEMA: &str = "projects/p/schemas/orders";

fn avro(extra: &str) -> Revision {
    Revision {
        format: SchemaFormat::Avro,
        definition: format!(
            r#"{{"type":"record","name":"O","fields":[{{"name":"id","type":"string"}}{extra}]}}"#
        ),
    }
}

fn message(revision: Option<&str>, data: &str) -> SourceMessage {
    let mut attributes = BTreeMap::new();
    if let Some(r) = revision {
        attributes.insert(SCHEMA_ATTRIBUTE.to_owned(), SCHEMA.to_owned());
        attributes.insert(REVISION_ATTRIBUTE.to_owned(), r.to_owned());
        attributes.insert(ENCODING_ATTRIBUTE.to_owned(), "JSON".to_owned());
    }
    SourceMessage {
        message_id: "m".into(),
        publish_time_ms: 0,
        attributes,
        data: data.as_bytes().to_vec().into(),
        event_time_ms: None,
        problem: None,
    }
}

#[tokio::test]
async fn each_revision_is_fetched_once_and_a_deleted_one_is_a_dead_letter() {
    let registry = Arc::new(Registry::default());
    registry
        .revisions
        .lock()
        .unwrap()
        .insert("r1".into(), avro(""));
    let fields = vec![
        ("id".to_owned(), ColumnType::Text),
        ("note".to_owned(), ColumnType::Text),
    ];
    let decoder = RevisionsDecoder::new(SchemaFormat::Avro, None, fields, registry.clone());
    let first = message(Some("r1"), r#"{"id":"a"}"#);
    decoder.prepare(&[&first, &first]).await.unwrap();
    assert_eq!(
        decoder.decode(&first).unwrap(),
        vec![TypedValue::Text("a".into()), TypedValue::Null]
    );
    // A second revision adds a nullable field; its first message makes the decoder ask.
    registry.revisions.lock().unwrap().insert(
        "r2".into(),
        avro(r#",{"name":"note","type":["null","string"],"default":null}"#),
    );
    let second = message(Some("r2"), r#"{"id":"b","note":{"string":"x"}}"#);
    decoder.prepare(&[&first, &second]).await.unwrap();
    assert_eq!(
        decoder.decode(&second).unwrap()[1],
        TypedValue::Text("x".into())
    );
    assert_eq!(registry.fetches.load(Ordering::SeqCst), 2);
    // A revision the service does not have: asked once, then a letter naming it.
    let gone = message(Some("r0"), r#"{"id":"c"}"#);
    decoder.prepare(&[&gone]).await.unwrap();
    decoder.prepare(&[&gone]).await.unwrap();
    assert_eq!(registry.fetches.load(Ordering::SeqCst), 3);
    let why = decoder.decode(&gone).unwrap_err();
    assert!(
        why.contains("schema projects/p/schemas/orders has no revision r0"),
        "{why}"
    );
    let deleted = message(Some(DELETED_REVISION), r#"{"id":"d"}"#);
    decoder.prepare(&[&deleted]).await.unwrap();
    assert_eq!(registry.fetches.load(Ordering::SeqCst), 3);
    let why = decoder.decode(&deleted).unwrap_err();
    assert!(why.contains("was deleted"), "{why}");
    let why = decoder.decode(&message(None, "{}")).unwrap_err();
    assert!(why.starts_with("no googclient_schemaname"), "{why}");
    let why = decoder
        .decode(&message(Some("r2"), r#"{"id":[7]}"#))
        .unwrap_err();
    assert!(
        why.starts_with("revision r2: $.id: expected a string"),
        "{why}"
    );
}

/// The service unreachable is an outage (the batch waits, nothing decided); a revision
/// it would not give is asked for again after [`ASK_AGAIN_AFTER`], not at every batch.
#[tokio::test]
async fn an_outage_decides_nothing_and_a_refusal_is_asked_again_later() {
    let registry = Arc::new(Registry::default());
    let fields = vec![("id".to_owned(), ColumnType::Text)];
    let decoder = RevisionsDecoder::new(SchemaFormat::Avro, None, fields, registry.clone());
    let m = message(Some("r1"), r#"{"id":"a"}"#);
    registry.down.store(true, Ordering::SeqCst);
    assert_eq!(decoder.prepare(&[&m]).await.unwrap_err(), "no answer");
    assert!(decoder.decode(&m).unwrap_err().contains("was not fetched"));
    registry.down.store(false, Ordering::SeqCst);
    // Not there yet: refused, and not asked again at the next batch.
    decoder.prepare(&[&m]).await.unwrap();
    decoder.prepare(&[&m]).await.unwrap();
    assert_eq!(registry.fetches.load(Ordering::SeqCst), 2);
    assert!(
        decoder
            .decode(&m)
            .unwrap_err()
            .contains("has no revision r1")
    );
    // A minute later it is asked for again.
    registry
        .revisions
        .lock()
        .unwrap()
        .insert("r1".into(), avro(""));
    if let Some(Known::Refused(_, at)) = decoder
        .known
        .write()
        .unwrap()
        .get_mut(&(SCHEMA.to_owned(), "r1".to_owned()))
    {
        *at -= ASK_AGAIN_AFTER;
    }
    decoder.prepare(&[&m]).await.unwrap();
    assert_eq!(registry.fetches.load(Ordering::SeqCst), 3);
    assert_eq!(
        decoder.decode(&m).unwrap(),
        vec![TypedValue::Text("a".into())]
    );
}

#[tokio::test]
async fn a_revision_that_cannot_fill_the_columns_is_refused_whole() {
    let registry = Arc::new(Registry::default());
    registry
        .revisions
        .lock()
        .unwrap()
        .insert("r1".into(), avro(""));
    registry.revisions.lock().unwrap().insert(
        "r2".into(),
        Revision {
            format: SchemaFormat::Avro,
            definition: r#"{"type":"record","name":"O","fields":[{"name":"id","type":"long"}]}"#
                .into(),
        },
    );
    let fields = vec![("id".to_owned(), ColumnType::Integer)];
    let decoder = RevisionsDecoder::new(SchemaFormat::Avro, None, fields, registry);
    let (one, two) = (
        message(Some("r1"), r#"{"id":"a"}"#),
        message(Some("r2"), r#"{"id":5}"#),
    );
    decoder.prepare(&[&one, &two]).await.unwrap();
    let why = decoder.decode(&one).unwrap_err();
    assert!(
        why.starts_with("revision r1: $.id is string in the schema"),
        "{why}"
    );
    assert_eq!(decoder.decode(&two).unwrap(), vec![TypedValue::Integer(5)]);
}

#[test]
fn a_schema_file_must_have_every_field() {
    let schema = CompiledSchema::compile(SchemaFormat::Avro, &avro("").definition, None).unwrap();
    let why =
        SchemaFileDecoder::new(schema, vec![("nope".to_owned(), ColumnType::Text)]).unwrap_err();
    assert_eq!(why, "the schema has no field `nope`");
}

#[tokio::test]
async fn a_following_decoder_widens_its_query_with_a_new_revisions_fields() {
    let registry = Arc::new(Registry::default());
    registry
        .revisions
        .lock()
        .unwrap()
        .insert("r1".into(), avro(""));
    let reads = |name: &str, _: ColumnType| {
        if name.chars().any(char::is_uppercase) {
            return Err(format!("`{name}` is not a column name"));
        }
        Ok(sluice_store::Sql {
            postgres: format!("\"{name}\""),
            sqlite: format!("\"{name}\""),
        })
    };
    let id = sluice_store::TypedColumn {
        name: "id".into(),
        ty: ColumnType::Text,
        nullable: true,
    };
    let query = Arc::new(QueryCell::following_schema(
        Arc::new(sluice_store::TypedQuery {
            fields: vec![("id".into(), ColumnType::Text)],
            select: vec![(id, reads("id", ColumnType::Text).unwrap())],
            filter: None,
            expectations: Vec::new(),
            grown: Vec::new(),
            changes: None,
        }),
        Box::new(reads),
    ));
    let decoder =
        RevisionsDecoder::following(SchemaFormat::Avro, None, query.clone(), registry.clone());
    let first = message(Some("r1"), r#"{"id":"a"}"#);
    decoder.prepare(&[&first]).await.unwrap();
    assert_eq!(
        decoder.decode(&first).unwrap(),
        vec![TypedValue::Text("a".into())]
    );
    registry.revisions.lock().unwrap().insert(
        "r2".into(),
        avro(r#",{"name":"note","type":["null","string"],"default":null}"#),
    );
    let second = message(Some("r2"), r#"{"id":"b","note":{"string":"x"}}"#);
    decoder.prepare(&[&second]).await.unwrap();
    let grown = query.current();
    assert_eq!(grown.fields.len(), 2);
    assert_eq!(
        grown.grown.len(),
        1,
        "the column is for the next commit to add"
    );
    assert_eq!(
        decoder.decode(&second).unwrap(),
        vec![TypedValue::Text("b".into()), TypedValue::Text("x".into())]
    );
    assert_eq!(
        decoder.decode(&first).unwrap(),
        vec![TypedValue::Text("a".into()), TypedValue::Null],
        "an older revision's message holds NULL in the new column"
    );
    // A revision that changes a column's type, or whose field cannot be a column, is refused.
    registry.revisions.lock().unwrap().insert(
        "r3".into(),
        Revision {
            format: SchemaFormat::Avro,
            definition: r#"{"type":"record","name":"O","fields":[{"name":"id","type":"double"}]}"#
                .into(),
        },
    );
    registry
        .revisions
        .lock()
        .unwrap()
        .insert("r4".into(), avro(r#",{"name":"Camel","type":"string"}"#));
    let third = message(Some("r3"), r#"{"id":1.5}"#);
    let fourth = message(Some("r4"), r#"{"id":"c","Camel":"y"}"#);
    decoder.prepare(&[&third, &fourth]).await.unwrap();
    let why = decoder.decode(&third).unwrap_err();
    assert!(why.contains("revision r3") && why.contains("$.id"), "{why}");
    let why = decoder.decode(&fourth).unwrap_err();
    assert!(
        why.contains("revision r4") && why.contains("Camel"),
        "{why}"
    );
    assert_eq!(
        query.current().fields.len(),
        2,
        "nothing added by a refused revision"
    );

    // Revisions met out of order: r6 (which gives `extra` as text) before r5 (which added it
    // as an integer first). The columns are those a start derives, oldest first: `extra` is
    // an integer, r6 is refused, r5 decodes (r4's field, which cannot be a column, is left
    // out and holds nothing back).
    registry.revisions.lock().unwrap().insert(
        "r5".into(),
        avro(r#",{"name":"extra","type":["null","long"],"default":null}"#),
    );
    registry.revisions.lock().unwrap().insert(
        "r6".into(),
        avro(r#",{"name":"extra","type":["null","string"],"default":null}"#),
    );
    let sixth = message(Some("r6"), r#"{"id":"f","extra":{"string":"x"}}"#);
    decoder.prepare(&[&sixth]).await.unwrap();
    assert_eq!(
        query.current().fields.last().unwrap(),
        &("extra".to_owned(), ColumnType::Integer)
    );
    let why = decoder.decode(&sixth).unwrap_err();
    assert!(
        why.contains("revision r6") && why.contains("$.extra"),
        "{why}"
    );
    let fifth = message(Some("r5"), r#"{"id":"e","extra":{"long":7}}"#);
    decoder.prepare(&[&fifth]).await.unwrap();
    assert_eq!(decoder.decode(&fifth).unwrap()[2], TypedValue::Integer(7));
}
