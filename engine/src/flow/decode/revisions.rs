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

use super::derive::{columns_of_revisions, new_columns};
use super::schema::{CompiledSchema, Encoding, SchemaFormat};
use super::{
    DELETED_REVISION, ENCODING_ATTRIBUTE, PayloadDecoder, REVISION_ATTRIBUTE, SCHEMA_ATTRIBUTE,
};
use crate::flow::delivery::SourceMessage;
use crate::flow::query_cell::QueryCell;
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

    /// Every revision of schema `schema`, oldest first, each with its id (for a table that
    /// follows the schema); `Err(why)` when the service does not list them (retried).
    async fn revisions(&self, schema: &str) -> Result<Vec<(String, Revision)>, String>;
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
    fields: Fields,
    registry: Arc<dyn SchemaRegistry>,
    /// Each revision met, compiled and checked, or why its messages do not decode.
    known: RwLock<HashMap<RevisionKey, Known>>,
    fetch: tokio::sync::Mutex<()>,
}

/// The fields a [`RevisionsDecoder`] decodes.
#[derive(Debug)]
enum Fields {
    /// The flow's, declared.
    Fixed(Vec<(String, ColumnType)>),
    /// Those of its query, which each new revision's fields widen (the table follows the
    /// schema).
    Following(Arc<QueryCell>),
}

impl Fields {
    fn now(&self) -> FieldsNow<'_> {
        match self {
            Self::Fixed(fields) => FieldsNow::Fixed(fields),
            Self::Following(cell) => FieldsNow::Query(cell.current()),
        }
    }
}

/// The fields as they are now: borrowed, or the query's (shared, not copied).
enum FieldsNow<'a> {
    Fixed(&'a [(String, ColumnType)]),
    Query(Arc<sluice_store::TypedQuery>),
}

impl std::ops::Deref for FieldsNow<'_> {
    type Target = [(String, ColumnType)];

    fn deref(&self) -> &Self::Target {
        match self {
            Self::Fixed(fields) => fields,
            Self::Query(query) => &query.fields,
        }
    }
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
            fields: Fields::Fixed(fields),
            registry,
            known: RwLock::new(HashMap::new()),
            fetch: tokio::sync::Mutex::new(()),
        }
    }

    /// A decoder of the fields of `query`, whose table follows the schema: a revision met for
    /// the first time that adds fields adds them to the query, as nullable columns, before
    /// its messages are decoded (a field it cannot add refuses the revision).
    pub fn following(
        format: SchemaFormat,
        message: Option<String>,
        query: Arc<QueryCell>,
        registry: Arc<dyn SchemaRegistry>,
    ) -> Self {
        Self {
            fields: Fields::Following(query),
            ..Self::new(format, message, Vec::new(), registry)
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
        schema.check_fields(&self.fields.now())?;
        Ok(Arc::new(schema))
    }

    /// For a table that follows the schema, when `revision` (compiled) has fields the query
    /// lacks: the columns of every revision of `schema`, as a start derives them
    /// ([`columns_of_revisions`]: oldest first, whatever order messages name them in), added
    /// to the query; then `revision` is checked against them again. `Err` is an outage (the
    /// listing failed: retried); `Ok(Err(why))` refuses the revision.
    async fn follow(
        &self,
        schema: &str,
        revision: Arc<CompiledSchema>,
    ) -> Result<Result<Arc<CompiledSchema>, String>, String> {
        let Fields::Following(query) = &self.fields else {
            return Ok(Ok(revision));
        };
        if new_columns(&revision, &self.fields.now()).is_empty() {
            return Ok(Ok(revision));
        }
        let listed = self.registry.revisions(schema).await?;
        let (columns, _) = match columns_of_revisions(self.format, self.message.as_deref(), &listed)
        {
            Ok(derived) => derived,
            Err(why) => return Ok(Err(why)),
        };
        let before = self.fields.now().len();
        let left_out = query.widen(&columns).err();
        let now = self.fields.now();
        let names: Vec<&str> = now[before..].iter().map(|(n, _)| n.as_str()).collect();
        if !names.is_empty() {
            tracing::info!(%schema, columns = %names.join(", "),
                "a schema revision adds fields: their columns are added by the next commit");
        }
        // A field of this revision that could not be a column: its messages cannot land whole.
        if !new_columns(&revision, &now).is_empty() {
            return Ok(Err(format!(
                "its new fields cannot be columns: {}",
                left_out.unwrap_or_default()
            )));
        }
        Ok(revision.check_fields(&now).map(|()| revision))
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
            let outcome = match self
                .registry
                .revision(&schema, &revision)
                .await?
                .and_then(|found| self.compile(&found))
            {
                Ok(compiled) => self.follow(&schema, compiled).await?,
                Err(why) => Err(why),
            };
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
            .decode(&message.data, encoding, &self.fields.now())
            .map_err(|why| format!("revision {}: {why}", key.1))
    }
}

#[cfg(test)]
#[path = "revisions_tests.rs"]
mod tests;
