//! Topics bound to a schema in the emulator's schema service (the official client's admin
//! calls): a schema and its first revision, a topic validating messages against it, further
//! revisions committed and deleted.

use crate::{PROJECT, emulator};
use google_cloud_pubsub::client::{SchemaService, TopicAdmin};
use google_cloud_pubsub::model::{Encoding, Schema, SchemaSettings, schema};

/// A topic bound to a schema.
pub struct SchemaTopic {
    /// The schema service's client.
    pub schemas: SchemaService,
    /// The schema (`projects/P/schemas/S`).
    pub name: String,
    /// Its first revision's id.
    pub first_revision: String,
    /// The topic's short name.
    pub topic: String,
}

fn anonymous() -> google_cloud_auth::credentials::Credentials {
    google_cloud_auth::credentials::anonymous::Builder::new().build()
}

impl SchemaTopic {
    /// Creates schema `schema_id` of `kind` (first revision `definition`) and topic `topic`
    /// bound to it with `encoding`.
    pub async fn create(
        schema_id: &str,
        kind: schema::Type,
        definition: &str,
        topic: &str,
        encoding: Encoding,
    ) -> Self {
        let endpoint = emulator().endpoint();
        let schemas = SchemaService::builder()
            .with_endpoint(&endpoint)
            .with_credentials(anonymous())
            .build()
            .await
            .unwrap();
        let created = schemas
            .create_schema()
            .set_parent(format!("projects/{PROJECT}"))
            .set_schema_id(schema_id)
            .set_schema(Schema::new().set_type(kind).set_definition(definition))
            .send()
            .await
            .unwrap();
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
        Self {
            schemas,
            name: created.name,
            first_revision: created.revision_id,
            topic: topic.to_owned(),
        }
    }

    /// Commits a revision; returns its id.
    pub async fn commit(&self, kind: schema::Type, definition: &str) -> String {
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

    /// Deletes a revision (Pub/Sub then names it `_deleted-schema-revision_` in the messages
    /// validated against it).
    pub async fn delete(&self, revision: &str) {
        self.schemas
            .delete_schema_revision()
            .set_name(format!("{}@{revision}", self.name))
            .send()
            .await
            .unwrap();
    }
}
