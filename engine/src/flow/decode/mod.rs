//! A typed flow's payloads decoded into its fields (`decode:`, SPEC §5 "Typed tables"): plain
//! JSON (`json.rs`), Avro (`avro.rs`, `avro_json.rs`) and Protobuf (`protobuf.rs`) by a schema
//! file or by the topic's schema in Pub/Sub's schema service, every revision
//! (`revisions.rs`).
//!
//! Guarantees, for every format:
//! * A payload that does not decode, or a value that does not convert to its column's type,
//!   is a dead letter with reason [`UNDECODABLE`] naming the field path (`$.amount`) and, for
//!   a schema with revisions, the revision; it never becomes a row and never stops the flow.
//! * A message of a schema revision the decoder has not met makes it ask the schema service
//!   for that revision before deciding; a revision the service does not have, or one Pub/Sub
//!   marks deleted ([`DELETED_REVISION`]), is a dead letter naming it. The service unreachable is a stage
//!   outage: retried with backoff, nothing acked meanwhile.
//! * The same value lands the same way whatever the format (`values.rs`).

pub(crate) mod avro;
mod avro_json;
pub(crate) mod derive;
pub(crate) mod json;
pub(crate) mod protobuf;
pub(crate) mod revisions;
pub(crate) mod schema;
mod values;

use crate::flow::delivery::SourceMessage;
use async_trait::async_trait;
use sluice_store::TypedValue;

/// The dead-letter reason of a payload that does not decode.
pub const UNDECODABLE: &str = "undecodable";

/// The attribute Pub/Sub sets to the schema a message was validated against.
pub const SCHEMA_ATTRIBUTE: &str = "googclient_schemaname";
/// The attribute Pub/Sub sets to the schema revision a message was validated against.
pub const REVISION_ATTRIBUTE: &str = "googclient_schemarevisionid";
/// What Pub/Sub puts in [`REVISION_ATTRIBUTE`] once the revision a message was validated
/// against is deleted (measured on the emulator).
pub const DELETED_REVISION: &str = "_deleted-schema-revision_";
/// The attribute Pub/Sub sets to a message's encoding (`JSON` or `BINARY`).
pub const ENCODING_ATTRIBUTE: &str = "googclient_schemaencoding";

/// Decodes a typed flow's payloads into its fields, in the order the flow declares them.
#[async_trait]
pub trait PayloadDecoder: Send + Sync + std::fmt::Debug {
    /// Makes ready to decode `messages` (a decoder by Pub/Sub's schemas learns the revisions
    /// they name). An error is an outage: the batch is retried later, nothing is acked.
    async fn prepare(&self, _messages: &[&SourceMessage]) -> Result<(), String> {
        Ok(())
    }

    /// The values of the fields in `message`, or why it does not decode (for its dead
    /// letter).
    fn decode(&self, message: &SourceMessage) -> Result<Vec<TypedValue>, String>;
}

#[async_trait]
impl PayloadDecoder for json::JsonFields {
    fn decode(&self, message: &SourceMessage) -> Result<Vec<TypedValue>, String> {
        self.decode_payload(&message.data)
    }
}
