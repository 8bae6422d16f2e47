//! Schema revisions from Pub/Sub's schema service (`decode: { schema: pubsub }`): one
//! `GetSchema` of `projects/p/schemas/s@revision` per revision a message names, answered with
//! its definition. What a typed flow's decoder does with them is in `flow/decode/revisions.rs`.
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
}

#[async_trait]
impl SchemaRegistry for PubSubSchemas {
    async fn revision(
        &self,
        schema: &str,
        revision: &str,
    ) -> Result<Result<Revision, String>, String> {
        let name = format!("{schema}@{revision}");
        let base = self
            .config
            .endpoint()
            .unwrap_or_else(|| PUBSUB_REST.to_owned());
        let url = format!("{}/v1/{name}", base.trim_end_matches('/'));
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
            .headers(headers)
            .send()
            .await
            .map_err(|e| format!("reading schema revision {name}: {e}"))?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|e| format!("reading schema revision {name}: {e}"))?;
        let said = || format!("{status}: {}", body.trim());
        match status.as_u16() {
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
