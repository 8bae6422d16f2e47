//! `flows[i].decode` (SPEC §5, "Typed tables"): how a Pub/Sub or file payload becomes a typed
//! flow's fields. Plain JSON needs no schema; Avro and Protobuf name theirs: `schema: pubsub`
//! (the topic's schema in Pub/Sub's schema service, so a Pub/Sub source only) or a schema file
//! (`.avsc`, or `.proto` with its `message:`), which must be readable here. Whether the schema
//! can fill the declared fields is checked by the engine, which compiles it (`sluice validate`
//! and `sluice run` report it at `decode.schema`).

use crate::Column;
use crate::errors::{Collector, ErrorCode};
use crate::model::{Decode, DecodeFormat, DecodeSchema, Source};
use crate::query::{column_name, column_type};
use crate::raw::RawDecode;

/// Converts `flows[i].decode` (at `path`) of a flow reading `source`.
pub(crate) fn decode(c: &mut Collector<'_>, raw: RawDecode, path: &str, source: &Source) -> Decode {
    if matches!(source, Source::Table { .. } | Source::PipelineTable { .. }) {
        c.push(
            ErrorCode::InvalidValue,
            path,
            "a table source's rows are columns already: `decode` reads Pub/Sub and file payloads",
        );
    }
    let format_at = format!("{path}.format");
    let word = crate::fields::required(c, raw.format, &format_at);
    let format = match word.as_str() {
        "json" | "" => DecodeFormat::Json,
        "avro" => DecodeFormat::Avro,
        "protobuf" => DecodeFormat::Protobuf,
        other => {
            c.push(
                ErrorCode::InvalidValue,
                &format_at,
                format!("unknown decode format `{other}`; the formats are json, avro, protobuf"),
            );
            DecodeFormat::Json
        }
    };
    let schema = if format == DecodeFormat::Json {
        for (key, given) in [
            ("schema", raw.schema.is_some()),
            ("message", raw.message.is_some()),
        ] {
            if given {
                c.push(
                    ErrorCode::UnknownKey,
                    &format!("{path}.{key}"),
                    format!("plain JSON needs no `{key}`: declare its `fields:` if you like"),
                );
            }
        }
        None
    } else {
        schema(c, raw.schema, raw.message.is_some(), format, path, source)
    };
    let fields = raw
        .fields
        .unwrap_or_default()
        .into_iter()
        .map(|(name, ty)| {
            let at = format!("{path}.fields.{name}");
            let name = column_name(c, Some(name), &at);
            Column {
                name,
                ty: column_type(c, Some(ty), &at),
                nullable: true,
            }
        })
        .collect();
    Decode {
        format,
        schema,
        message: raw.message,
        fields,
    }
}

/// An Avro or Protobuf decode's `schema:`.
fn schema(
    c: &mut Collector<'_>,
    given: Option<String>,
    has_message: bool,
    format: DecodeFormat,
    path: &str,
    source: &Source,
) -> Option<DecodeSchema> {
    let at = format!("{path}.schema");
    let (keyword, extension) = match format {
        DecodeFormat::Protobuf => ("protobuf", "proto"),
        _ => ("avro", "avsc"),
    };
    let Some(given) = given else {
        c.push(
            ErrorCode::MissingField,
            &at,
            format!(
                "a {keyword} decode names its schema: `schema: pubsub` (the topic's, in Pub/Sub's \
                 schema service) or a `.{extension}` file"
            ),
        );
        return None;
    };
    if given == "pubsub" {
        if !matches!(source, Source::PubSub(_)) {
            c.push(
                ErrorCode::InvalidValue,
                &at,
                "`schema: pubsub` is the topic's schema, for a Pub/Sub source: a file flow \
                 names a schema file",
            );
        }
        return Some(DecodeSchema::PubSub);
    }
    let file = crate::paths::beside(c.file(), &given);
    if file.extension().and_then(|e| e.to_str()) != Some(extension) {
        c.push(
            ErrorCode::InvalidValue,
            &at,
            format!("`{given}`: a {keyword} schema file ends in `.{extension}` (or say `pubsub`)"),
        );
    } else if let Err(e) = std::fs::metadata(&file) {
        c.push(
            ErrorCode::Unreadable,
            &at,
            format!("schema file `{given}`: {e}"),
        );
    } else if format == DecodeFormat::Protobuf && !has_message {
        c.push(
            ErrorCode::MissingField,
            &format!("{path}.message"),
            "a `.proto` file may hold several messages: name the payload's with `message:`",
        );
    }
    if format == DecodeFormat::Avro && has_message {
        c.push(
            ErrorCode::UnknownKey,
            &format!("{path}.message"),
            "an Avro schema is one record: `message:` is for Protobuf",
        );
    }
    Some(DecodeSchema::File(file))
}
