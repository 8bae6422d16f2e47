//! Schema revisions from Pub/Sub's schema service (`decode: { schema: pubsub }`): one
//! `GetSchema` of `projects/p/schemas/s@revision` per revision a message names, answered with
//! its definition. What a typed flow's decoder does with them is in `flow/decode/revisions.rs`.
//! Before a run, [`PubSubSchemas::revisions_of`] lists every revision of a subscription's topic's
//! schema, from which a table without `columns:` takes its columns (`flow/decode/derive.rs`).
//!
//! An answer is an outage (no answer, a server error, too many requests, credentials refused:
//! retried, nothing acked) or final for that revision (not found, any other refusal, a
//! definition sluice cannot read: its messages are dead letters saying why, and the revision
//! is asked for again a minute later).
//!
//! The request is Pub/Sub's REST `GET v1/{name}` without a `view` (unset means the whole
//! schema), sent with `reqwest` and the credentials the Pub/Sub clients use, rather than
//! through the official `SchemaService` client: that client always sends `view` as a number
//! (`view=0` when unset), which the emulator never answers (measured on the emulator 0.8.x:
//! `GET ...?view=2` times out, `?view=FULL` and no view answer at once), and the tests run on
//! the emulator.

use super::PubSubConfig;
use crate::flow::decode::revisions::{Revision, SchemaRegistry};
use crate::flow::decode::schema::SchemaFormat;
use async_trait::async_trait;
use google_cloud_auth::credentials::{CacheableResource, Credentials};
use std::time::Duration;
use tokio::sync::OnceCell;

/// The real service, when no endpoint is configured.
const PUBSUB_REST: &str = "https://pubsub.googleapis.com";
/// How long one revision's read may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Pub/Sub's schema service, reached through a flow's Pub/Sub settings.
#[derive(Debug)]
pub struct PubSubSchemas {
    config: PubSubConfig,
    credentials: OnceCell<Credentials>,
}

impl PubSubSchemas {
    /// The schema service `config` reaches.
    pub fn new(config: PubSubConfig) -> Self {
        Self {
            config,
            credentials: OnceCell::new(),
        }
    }

    async fn credentials(&self) -> Result<&Credentials, String> {
        self.credentials
            .get_or_try_init(|| async {
                match self.config.credentials() {
                    Some(anonymous) => Ok(anonymous),
                    None => google_cloud_auth::credentials::Builder::default()
                        .build()
                        .map_err(|e| format!("Application Default Credentials: {e}")),
                }
            })
            .await
    }

    /// `GET {endpoint}/{path}?{query}` with the Pub/Sub credentials: the status and the body,
    /// or why no answer came (an outage).
    async fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<(u16, String), String> {
        let base = self
            .config
            .endpoint()
            .unwrap_or_else(|| PUBSUB_REST.to_owned());
        let url = format!("{}/{path}", base.trim_end_matches('/'));
        let headers = match self
            .credentials()
            .await?
            .headers(http::Extensions::new())
            .await
            .map_err(|e| format!("credentials for Pub/Sub: {e}"))?
        {
            CacheableResource::New { data, .. } => data,
            CacheableResource::NotModified => http::HeaderMap::new(),
        };
        let client = reqwest::Client::builder()
            .timeout(READ_TIMEOUT)
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        let response = client
            .get(&url)
            .query(query)
            .headers(headers)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body = response.text().await.map_err(|e| e.to_string())?;
        Ok((status, body))
    }

    /// The JSON answer to `GET {path}`, or why there is none (any status but success).
    async fn get_json(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<serde_json::Value, String> {
        let (status, body) = self
            .get(path, query)
            .await
            .map_err(|e| format!("{path}: {e}"))?;
        if !(200..300).contains(&status) {
            return Err(format!("{path}: {status}: {}", body.trim()));
        }
        serde_json::from_str(&body).map_err(|e| format!("{path}: the answer is not JSON: {e}"))
    }

    /// The schema of the topic `subscription` reads (`projects/P/schemas/S`), and every
    /// revision of it, oldest first, each with its id (the columns a table follows it by, see
    /// `flow/decode/derive.rs`). Reads the subscription's topic, the topic's schema, then the
    /// revisions.
    ///
    /// # Errors
    /// Pub/Sub unreachable or refusing, a topic without a schema, a revision sluice cannot
    /// read; each said for people.
    pub async fn revisions_of(
        &self,
        subscription: &str,
    ) -> Result<(String, Vec<(String, Revision)>), String> {
        let subscription = self
            .config
            .subscription_path(subscription)
            .map_err(|e| e.to_string())?;
        let topic = text(
            &self.get_json(&format!("v1/{subscription}"), &[]).await?,
            "topic",
        )
        .ok_or_else(|| format!("{subscription} names no topic"))?;
        let schema = self
            .get_json(&format!("v1/{topic}"), &[])
            .await?
            .get("schemaSettings")
            .and_then(|settings| text(settings, "schema"))
            .ok_or_else(|| format!("topic {topic} has no schema in Pub/Sub"))?;
        let revisions = self.list_revisions(&schema).await?;
        Ok((schema, revisions))
    }

    /// Every revision of `schema`, oldest first, each with its id: `ListSchemaRevisions`,
    /// page by page.
    async fn list_revisions(&self, schema: &str) -> Result<Vec<(String, Revision)>, String> {
        let mut revisions = Vec::new();
        let mut page = String::new();
        loop {
            let answer = self
                .get_json(
                    &format!("v1/{schema}:listRevisions"),
                    &[("view", "FULL"), ("pageSize", "100"), ("pageToken", &page)],
                )
                .await?;
            let listed = answer
                .get("schemas")
                .and_then(serde_json::Value::as_array)
                .cloned()
                .unwrap_or_default();
            for revision in listed {
                let id = text(&revision, "revisionId").unwrap_or_default();
                let created = text(&revision, "revisionCreateTime")
                    .and_then(|t| crate::flow::event_time::parse_event_time(&t))
                    .unwrap_or_default();
                let name = format!("{schema}@{id}");
                revisions.push((created, id, parse_revision(&name, &revision.to_string())?));
            }
            match text(&answer, "nextPageToken").filter(|t| !t.is_empty()) {
                Some(next) => page = next,
                None => break,
            }
        }
        // By creation time, whatever order the service lists them in (a stable sort keeps its
        // order within a millisecond).
        revisions.sort_by_key(|(created, _, _)| *created);
        Ok(revisions
            .into_iter()
            .map(|(_, id, revision)| (id, revision))
            .collect())
    }
}

/// The text at `key` of a JSON object.
fn text(value: &serde_json::Value, key: &str) -> Option<String> {
    value
        .get(key)
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
}

#[async_trait]
impl SchemaRegistry for PubSubSchemas {
    async fn revision(
        &self,
        schema: &str,
        revision: &str,
    ) -> Result<Result<Revision, String>, String> {
        let name = format!("{schema}@{revision}");
        let response = self
            .get(&format!("v1/{name}"), &[])
            .await
            .map_err(|e| format!("reading schema revision {name}: {e}"))?;
        let (status, body) = response;
        let said = || format!("{status}: {}", body.trim());
        match status {
            200..=299 => {}
            404 => {
                return Ok(Err(format!(
                    "schema {schema} has no revision {revision} in Pub/Sub's schema service \
                     (deleted?)"
                )));
            }
            // The worker's identity may not read schemas: retried, and said until it can.
            401 | 403 => {
                return Err(format!(
                    "reading schema revision {name} was refused ({}): the worker's identity \
                     needs pubsub.schemas.get (roles/pubsub.viewer has it)",
                    said()
                ));
            }
            // Too many requests and server errors pass.
            429 | 500..=599 => return Err(format!("reading schema revision {name}: {}", said())),
            _ => return Ok(Err(format!("reading schema revision {name}: {}", said()))),
        }
        Ok(parse_revision(&name, &body))
    }

    async fn revisions(&self, schema: &str) -> Result<Vec<(String, Revision)>, String> {
        self.list_revisions(schema)
            .await
            .map_err(|why| format!("listing the revisions of schema {schema}: {why}"))
    }
}

/// The revision in the service's answer, or why it is not one sluice reads.
fn parse_revision(name: &str, body: &str) -> Result<Revision, String> {
    let found: serde_json::Value = serde_json::from_str(body)
        .map_err(|e| format!("schema revision {name}: the answer is not JSON: {e}"))?;
    let format = match found.get("type").and_then(serde_json::Value::as_str) {
        Some("PROTOCOL_BUFFER") => SchemaFormat::Protobuf,
        Some("AVRO") => SchemaFormat::Avro,
        other => {
            return Err(format!(
                "schema revision {name}: a type sluice does not read: {other:?}"
            ));
        }
    };
    let definition = found
        .get("definition")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| format!("schema revision {name}: no definition in the answer"))?;
    Ok(Revision {
        format,
        definition: definition.to_owned(),
    })
}
