//! A typed flow's payload decoder from its `decode:` (SPEC §5, "Typed tables"): plain JSON, or
//! Avro and Protobuf by a schema file (compiled and checked against the flow's fields before the
//! run, and by `sluice validate`) or by the topic's schema in Pub/Sub's schema service (fetched
//! while running, every revision; `sluice_engine::RevisionsDecoder`). A table target without
//! `columns:` written by a schema-file decode takes the schema's ([`SchemaFiles`]).

use sluice_engine::{
    CompiledSchema, JsonFields, PayloadDecoder, PubSubConfig, RevisionsDecoder, SchemaFileDecoder,
    SchemaFormat, pubsub::PubSubSchemas,
};
use sluice_pipeline::{
    Column, Decode, DecodeFormat, DecodeSchema, Flow, Pipeline, SchemaColumns, Source,
};
use sluice_store::ColumnType;
use std::path::Path;
use std::sync::Arc;

/// The decoder of `flow`'s payloads into `fields`.
pub fn decoder(
    pipeline: &Pipeline,
    flow: &Flow,
    fields: Vec<(String, ColumnType)>,
) -> Result<Arc<dyn PayloadDecoder>, String> {
    let Some(decode) = &flow.query.decode else {
        return Ok(Arc::new(JsonFields::new(fields)));
    };
    let format = match decode.format {
        DecodeFormat::Json => return Ok(Arc::new(JsonFields::new(fields))),
        DecodeFormat::Avro => SchemaFormat::Avro,
        DecodeFormat::Protobuf => SchemaFormat::Protobuf,
    };
    match (&decode.schema, &flow.source) {
        (Some(DecodeSchema::File(file)), _) => {
            let decoder = schema_file(file, format, decode, fields)
                .map_err(|why| format!("flow {}: {why}", flow.name))?;
            Ok(Arc::new(decoder))
        }
        (Some(DecodeSchema::PubSub), Source::PubSub(_)) => {
            let config = PubSubConfig {
                project: pipeline.pubsub.project.clone(),
                endpoint: pipeline.pubsub.endpoint.clone(),
            };
            Ok(Arc::new(RevisionsDecoder::new(
                format,
                decode.message.clone(),
                fields,
                Arc::new(PubSubSchemas::new(config)),
            )))
        }
        _ => Err(format!(
            "flow {}: an {} decode without a schema it can read (the file checks refuse this)",
            flow.name,
            format.as_str()
        )),
    }
}

/// A decoder by the schema file `file`, if it compiles and fills `fields`.
fn schema_file(
    file: &Path,
    format: SchemaFormat,
    decode: &Decode,
    fields: Vec<(String, ColumnType)>,
) -> Result<SchemaFileDecoder, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("schema file {}: {e}", file.display()))?;
    let schema = CompiledSchema::compile(format, &text, decode.message.as_deref())
        .map_err(|why| format!("schema file {}: {why}", file.display()))?;
    SchemaFileDecoder::new(schema, fields)
        .map_err(|why| format!("schema file {}: {why}", file.display()))
}

/// Each flow whose schema file cannot fill its fields: the flow's index and why (for
/// `sluice validate` and `sluice run`, which report it at `flows[i].decode.schema`).
pub fn schema_file_problems(pipeline: &Pipeline) -> Vec<(usize, String)> {
    pipeline
        .flows
        .iter()
        .enumerate()
        .filter_map(|(i, flow)| {
            let decode = flow.query.decode.as_ref()?;
            let Some(DecodeSchema::File(file)) = &decode.schema else {
                return None;
            };
            let format = match decode.format {
                DecodeFormat::Avro => SchemaFormat::Avro,
                DecodeFormat::Protobuf => SchemaFormat::Protobuf,
                DecodeFormat::Json => return None,
            };
            let fields = super::typed::decoded_fields(flow);
            schema_file(file, format, decode, fields)
                .err()
                .map(|why| (i, why))
        })
        .collect()
}

/// Derives a typed table's columns from a decode's schema file, compiled as its decoder
/// compiles it (for `sluice_pipeline::load_deriving`).
pub struct SchemaFiles;

impl SchemaColumns for SchemaFiles {
    fn columns(
        &self,
        format: DecodeFormat,
        file: &Path,
        message: Option<&str>,
    ) -> Result<Vec<Column>, String> {
        let format = match format {
            DecodeFormat::Avro => SchemaFormat::Avro,
            DecodeFormat::Protobuf => SchemaFormat::Protobuf,
            DecodeFormat::Json => return Err("a JSON decode has no schema".to_owned()),
        };
        let text = std::fs::read_to_string(file).map_err(|e| e.to_string())?;
        let schema = CompiledSchema::compile(format, &text, message)?;
        Ok(schema
            .columns()
            .into_iter()
            .map(|(name, ty, nullable)| Column {
                name,
                ty: super::typed::pipeline_column_type(ty),
                nullable,
            })
            .collect())
    }
}
