//! A typed flow's payload decoder from its `decode:` (SPEC §5, "Typed tables"): plain JSON, or
//! Avro and Protobuf by a schema file (compiled and checked against the flow's fields before the
//! run, and by `sluice validate`) or by the topic's schema in Pub/Sub's schema service (fetched
//! while running, every revision; `sluice_engine::RevisionsDecoder`). A table target without
//! `columns:` takes its columns from its writer's schema file or from every revision of the
//! topic's Pub/Sub schema ([`DecodeSchemas`]).

use sluice_engine::{
    CompiledSchema, JsonFields, PayloadDecoder, PubSubConfig, QueryCell, Revision,
    RevisionsDecoder, SchemaFileDecoder, SchemaFormat, pubsub::PubSubSchemas,
};
use sluice_pipeline::{
    Column, Decode, DecodeFormat, DecodeSchema, Flow, Pipeline, PubSubSchemaOf, SchemaColumns,
    Source,
};
use sluice_store::ColumnType;
use std::path::Path;
use std::sync::Arc;

/// The decoder of `flow`'s payloads into `fields`; with `following`, a decoder by the topic's
/// Pub/Sub schema widens that query with each new revision's fields.
pub fn decoder(
    pipeline: &Pipeline,
    flow: &Flow,
    fields: Vec<(String, ColumnType)>,
    following: Option<Arc<QueryCell>>,
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
            let registry = Arc::new(PubSubSchemas::new(config));
            Ok(Arc::new(match following {
                Some(query) => {
                    RevisionsDecoder::following(format, decode.message.clone(), query, registry)
                }
                None => RevisionsDecoder::new(format, decode.message.clone(), fields, registry),
            }))
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

/// Derives a typed table's columns from a decode's schema file or Pub/Sub schema, compiled as
/// its decoder compiles them (for `sluice_pipeline::load_deriving`).
pub struct DecodeSchemas;

/// How long reading a topic's schema revisions may take before a command gives up.
const REVISIONS_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A pipeline file's decode format as the engine names it (`None`: plain JSON).
fn schema_format(format: DecodeFormat) -> Option<SchemaFormat> {
    match format {
        DecodeFormat::Avro => Some(SchemaFormat::Avro),
        DecodeFormat::Protobuf => Some(SchemaFormat::Protobuf),
        DecodeFormat::Json => None,
    }
}

/// Derived columns as the pipeline file names them.
fn pipeline_columns(columns: Vec<sluice_engine::DerivedColumn>) -> Vec<Column> {
    columns
        .into_iter()
        .map(|(name, ty, nullable)| Column {
            name,
            ty: super::typed::pipeline_column_type(ty),
            nullable,
        })
        .collect()
}

/// Every revision of the schema of `of`'s topic, oldest first, each with its id.
async fn revisions(of: &PubSubSchemaOf) -> Result<Vec<(String, Revision)>, String> {
    let config = PubSubConfig {
        project: of.project.clone(),
        endpoint: of.endpoint.clone(),
    }
    .with_adc_project()
    .await;
    let (_, listed) = tokio::time::timeout(
        REVISIONS_READ_TIMEOUT,
        PubSubSchemas::new(config).revisions_of(&of.subscription),
    )
    .await
    .map_err(|_| {
        format!(
            "Pub/Sub did not list the schema's revisions within {} s",
            REVISIONS_READ_TIMEOUT.as_secs()
        )
    })?
    .map_err(|why| format!("reading the topic's schema revisions: {why}"))?;
    Ok(listed)
}

impl SchemaColumns for DecodeSchemas {
    fn columns(
        &self,
        format: DecodeFormat,
        file: &Path,
        message: Option<&str>,
    ) -> Result<Vec<Column>, String> {
        let format = schema_format(format).ok_or("a JSON decode has no schema")?;
        let text = std::fs::read_to_string(file).map_err(|e| e.to_string())?;
        let schema = CompiledSchema::compile(format, &text, message)?;
        Ok(pipeline_columns(schema.columns()))
    }

    /// Reads the revisions on a thread of its own (the commands load files inside and outside
    /// a runtime alike).
    fn pubsub_columns(
        &self,
        format: DecodeFormat,
        of: &PubSubSchemaOf,
        message: Option<&str>,
    ) -> Result<Vec<Column>, String> {
        let format = schema_format(format).ok_or("a JSON decode has no schema")?;
        let read_of = of.clone();
        let read = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("a runtime to read Pub/Sub with: {e}"))?;
            runtime.block_on(revisions(&read_of))
        });
        let revisions = read
            .join()
            .map_err(|_| "reading the topic's schema revisions panicked".to_owned())??;
        let (columns, refused) = sluice_engine::columns_of_revisions(format, message, &revisions)?;
        for why in refused {
            tracing::warn!(subscription = %of.subscription,
                "{why}: it adds no column, and its messages are dead letters when they come");
        }
        Ok(pipeline_columns(columns))
    }
}
