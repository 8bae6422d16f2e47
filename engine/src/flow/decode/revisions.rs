//! Avro and Protobuf decoders: by one schema file ([`SchemaFileDecoder`]), or by a topic's
//! schema in Pub/Sub's schema service, every revision ([`RevisionsDecoder`]).
//!
//! Pub/Sub names each message's schema, revision and encoding in its attributes
//! (`googclient_schemaname`, `googclient_schemarevisionid`, `googclient_schemaencoding`; for a
//! schema file a message without them is binary). A revision is fetched the first time a
//! message names it, and kept: a revision's text never changes. A revision exists before any
//! message validated against it, so one the service says it does not have was deleted since,
//! and its messages are dead letters naming it. A fetch that fails is an outage (the batch
//! waits and is retried). Each revision is compiled and its fields checked once; one that
//! cannot fill the flow's columns dead-letters its messages with the reason, the others go on.

use super::schema::{CompiledSchema, Encoding, SchemaFormat};
use super::{
    DELETED_REVISION, ENCODING_ATTRIBUTE, PayloadDecoder, REVISION_ATTRIBUTE, SCHEMA_ATTRIBUTE,
};
use crate::flow::delivery::SourceMessage;
use async_trait::async_trait;
use sluice_store::{ColumnType, TypedValue};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// A decoder by one schema (a file).
#[derive(Debug)]
pub struct SchemaFileDecoder {
    schema: CompiledSchema,
    fields: Vec<(String, ColumnType)>,
}

impl SchemaFileDecoder {
    /// A decoder of `fields` by `schema`, if the schema can fill them: each field is one of the
    /// schema's, of a type its column takes.
    pub fn new(schema: CompiledSchema, fields: Vec<(String, ColumnType)>) -> Result<Self, String> {
        let missing: Vec<&str> = fields
            .iter()
            .filter(|(name, _)| !schema.has_field(name))
            .map(|(name, _)| name.as_str())
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "the schema has no field {}",
                missing
                    .iter()
                    .map(|m| format!("`{m}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        schema.check_fields(&fields)?;
        Ok(Self { schema, fields })
    }
}

#[async_trait]
impl PayloadDecoder for SchemaFileDecoder {
    fn decode(&self, message: &SourceMessage) -> Result<Vec<TypedValue>, String> {
        let encoding = message
            .attributes
            .get(ENCODING_ATTRIBUTE)
            .and_then(|e| Encoding::from_attribute(e))
            .unwrap_or(Encoding::Binary);
        self.schema.decode(&message.data, encoding, &self.fields)
    }
}

/// One revision of a registered schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revision {
    /// Its language.
    pub format: SchemaFormat,
    /// Its text.
    pub definition: String,
}

/// Where schema revisions come from (Pub/Sub's schema service; a test's own).
#[async_trait]
pub trait SchemaRegistry: Send + Sync + std::fmt::Debug {
    /// Revision `revision` of schema `schema` (`projects/p/schemas/s`): `Ok(Ok(_))` found,
    /// `Ok(Err(why))` the service's answer that it cannot give it (not found, a request it
    /// refuses, a definition sluice cannot read), `Err(why)` an outage (no answer, a server
    /// error, too many requests, credentials refused), retried. Each said for people.
    async fn revision(
        &self,
        schema: &str,
        revision: &str,
    ) -> Result<Result<Revision, String>, String>;
}

/// How long a revision the service would not give (or that does not compile) is taken as
/// such before it is asked for again (a revision never changes, a refusal may).
pub const ASK_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// What a [`RevisionsDecoder`] knows of one revision.
#[derive(Debug)]
enum Known {
    /// Compiled and checked.
    Ready(Arc<CompiledSchema>),
    /// Why its messages do not decode, and when that was found.
    Refused(String, std::time::Instant),
}

/// A revision as a message names it: its schema and its id.
type RevisionKey = (String, String);

/// A decoder by every revision of a topic's schema.
#[derive(Debug)]
pub struct RevisionsDecoder {
    format: SchemaFormat,
    message: Option<String>,
    fields: Vec<(String, ColumnType)>,
    registry: Arc<dyn SchemaRegistry>,
    /// Each revision met, compiled and checked, or why its messages do not decode.
    known: RwLock<HashMap<RevisionKey, Known>>,
    fetch: tokio::sync::Mutex<()>,
}

/// The revision `message` names, if it names one.
fn revision_of(message: &SourceMessage) -> Option<RevisionKey> {
    Some((
        message.attributes.get(SCHEMA_ATTRIBUTE)?.clone(),
        message.attributes.get(REVISION_ATTRIBUTE)?.clone(),
    ))
}

impl RevisionsDecoder {
    /// A decoder of `fields` by the revisions `registry` holds, each a `format` schema
    /// (`message` picks a Protobuf message).
    pub fn new(
        format: SchemaFormat,
        message: Option<String>,
        fields: Vec<(String, ColumnType)>,
        registry: Arc<dyn SchemaRegistry>,
    ) -> Self {
        Self {
            format,
            message,
            fields,
            registry,
            known: RwLock::new(HashMap::new()),
            fetch: tokio::sync::Mutex::new(()),
        }
    }

    fn unknown(&self, messages: &[&SourceMessage]) -> Vec<RevisionKey> {
        let known = self.known.read().unwrap_or_else(|p| p.into_inner());
        let mut wanted: Vec<RevisionKey> = messages
            .iter()
            .filter_map(|m| revision_of(m))
            .filter(|key| {
                key.1 != DELETED_REVISION
                    && match known.get(key) {
                        None => true,
                        Some(Known::Ready(_)) => false,
                        Some(Known::Refused(_, at)) => at.elapsed() >= ASK_AGAIN_AFTER,
                    }
            })
            .collect();
        wanted.sort();
        wanted.dedup();
        wanted
    }

    fn compile(&self, revision: &Revision) -> Result<Arc<CompiledSchema>, String> {
        if revision.format != self.format {
            return Err(format!(
                "it is a {} schema and the flow decodes {}",
                revision.format.as_str(),
                self.format.as_str()
            ));
        }
        let schema = CompiledSchema::compile(
            revision.format,
            &revision.definition,
            self.message.as_deref(),
        )?;
        schema.check_fields(&self.fields)?;
        Ok(Arc::new(schema))
    }
}

#[async_trait]
impl PayloadDecoder for RevisionsDecoder {
    async fn prepare(&self, messages: &[&SourceMessage]) -> Result<(), String> {
        if self.unknown(messages).is_empty() {
            return Ok(());
        }
        // One fetch at a time; a batch that waited for another's may find it answered.
        let _one = self.fetch.lock().await;
        for (schema, revision) in self.unknown(messages) {
            let outcome = self
                .registry
                .revision(&schema, &revision)
                .await?
                .and_then(|found| self.compile(&found));
            let known = match outcome {
                Ok(ready) => {
                    tracing::info!(%schema, %revision, "decoding a new schema revision");
                    Known::Ready(ready)
                }
                Err(why) => {
                    tracing::warn!(%schema, %revision,
                        "{why}; its messages are dead letters, asked again in a minute");
                    Known::Refused(why, std::time::Instant::now())
                }
            };
            self.known
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert((schema, revision), known);
        }
        Ok(())
    }

    fn decode(&self, message: &SourceMessage) -> Result<Vec<TypedValue>, String> {
        let Some(key) = revision_of(message) else {
            return Err(format!(
                "no {SCHEMA_ATTRIBUTE} and {REVISION_ATTRIBUTE} attributes: the message was not \
                 published under a topic's schema"
            ));
        };
        if key.1 == DELETED_REVISION {
            return Err(format!(
                "the revision of schema {} this message was published under was deleted \
                 (Pub/Sub names it {DELETED_REVISION})",
                key.0
            ));
        }
        let schema = {
            let known = self.known.read().unwrap_or_else(|p| p.into_inner());
            match known.get(&key) {
                None => return Err(format!("revision {} was not fetched", key.1)),
                Some(Known::Refused(why, _)) => return Err(format!("revision {}: {why}", key.1)),
                Some(Known::Ready(schema)) => schema.clone(),
            }
        };
        let encoding = message
            .attributes
            .get(ENCODING_ATTRIBUTE)
            .and_then(|e| Encoding::from_attribute(e))
            .unwrap_or(Encoding::Binary);
        schema
            .decode(&message.data, encoding, &self.fields)
            .map_err(|why| format!("revision {}: {why}", key.1))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
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
        async fn revision(
            &self,
            schema: &str,
            id: &str,
        ) -> Result<Result<Revision, String>, String> {
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
                definition:
                    r#"{"type":"record","name":"O","fields":[{"name":"id","type":"long"}]}"#.into(),
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
        let schema =
            CompiledSchema::compile(SchemaFormat::Avro, &avro("").definition, None).unwrap();
        let why = SchemaFileDecoder::new(schema, vec![("nope".to_owned(), ColumnType::Text)])
            .unwrap_err();
        assert_eq!(why, "the schema has no field `nope`");
    }
}
