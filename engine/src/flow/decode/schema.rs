//! One compiled schema (a schema file, or one revision of a Pub/Sub schema) and what it can
//! fill: [`CompiledSchema::check_fields`] says, before any message, which declared field the
//! schema cannot give as its column's type, so that an incompatible schema is refused whole
//! rather than message by message.

use super::avro::AvroRecord;
use super::protobuf::ProtobufMessage;
use apache_avro::Schema as Avro;
use prost_reflect::Kind;
use sluice_store::{ColumnType, TypedValue};

/// A schema's language.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaFormat {
    /// Apache Avro (`.avsc`).
    Avro,
    /// Protocol Buffers (`.proto`).
    Protobuf,
}

impl SchemaFormat {
    /// Its name in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Avro => "avro",
            Self::Protobuf => "protobuf",
        }
    }
}

/// How a payload of a schema is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// The format's binary encoding.
    Binary,
    /// The format's JSON encoding.
    Json,
}

impl Encoding {
    /// The encoding Pub/Sub names in a message's `googclient_schemaencoding` attribute.
    pub fn from_attribute(value: &str) -> Option<Self> {
        match value {
            "BINARY" => Some(Self::Binary),
            "JSON" => Some(Self::Json),
            _ => None,
        }
    }
}

/// A compiled schema.
#[derive(Debug, Clone)]
pub enum CompiledSchema {
    /// An Avro record.
    Avro(AvroRecord),
    /// A Protobuf message.
    Protobuf(ProtobufMessage),
}

impl CompiledSchema {
    /// Compiles `definition`; `message` picks a Protobuf message.
    pub fn compile(
        format: SchemaFormat,
        definition: &str,
        message: Option<&str>,
    ) -> Result<Self, String> {
        match format {
            SchemaFormat::Avro => AvroRecord::parse(definition).map(Self::Avro),
            SchemaFormat::Protobuf => {
                ProtobufMessage::compile(definition, message).map(Self::Protobuf)
            }
        }
    }

    /// The values of `fields` in `data`.
    pub fn decode(
        &self,
        data: &[u8],
        encoding: Encoding,
        fields: &[(String, ColumnType)],
    ) -> Result<Vec<TypedValue>, String> {
        match (self, encoding) {
            (Self::Avro(r), Encoding::Binary) => r.decode_binary(data, fields),
            (Self::Avro(r), Encoding::Json) => r.decode_json(data, fields),
            (Self::Protobuf(m), Encoding::Binary) => m.decode_binary(data, fields),
            (Self::Protobuf(m), Encoding::Json) => m.decode_json(data, fields),
        }
    }

    /// Whether the schema has field `name`.
    pub fn has_field(&self, name: &str) -> bool {
        match self {
            Self::Avro(r) => r.field(name).is_some(),
            Self::Protobuf(m) => m.descriptor().get_field_by_name(name).is_some(),
        }
    }

    /// Every field of `fields` the schema has but cannot give as its column's type, said for
    /// people (`$.amount is a string in the schema, column amount is integer`).
    pub fn check_fields(&self, fields: &[(String, ColumnType)]) -> Result<(), String> {
        let problems: Vec<String> = fields
            .iter()
            .filter_map(|(name, ty)| {
                let (gives, what) = match self {
                    Self::Avro(r) => {
                        let schema = r.field(name)?;
                        (avro_gives(r, schema, *ty), avro_name(schema))
                    }
                    Self::Protobuf(m) => {
                        let field = m.descriptor().get_field_by_name(name)?;
                        let what = protobuf_name(&field);
                        (protobuf_gives(&field, *ty), what)
                    }
                };
                (!gives).then(|| {
                    format!(
                        "$.{name} is {what} in the schema, which does not land in a column of type {}",
                        format!("{ty:?}").to_lowercase()
                    )
                })
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

fn avro_name(schema: &Avro) -> String {
    match serde_json::to_value(schema) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "a type".to_owned(),
    }
}

/// Whether an Avro field of `schema` converts to `ty` (`avro.rs` decides each value).
fn avro_gives(record: &AvroRecord, schema: &Avro, ty: ColumnType) -> bool {
    let schema = record.resolve(schema);
    if let Avro::Union(union) = schema {
        return union
            .variants()
            .iter()
            .filter(|b| !matches!(b, Avro::Null))
            .all(|b| avro_gives(record, b, ty));
    }
    use ColumnType as C;
    match ty {
        C::Json => true,
        C::Text => matches!(
            schema,
            Avro::String | Avro::Enum(_) | Avro::Uuid(_) | Avro::Int | Avro::Long | Avro::Boolean
        ),
        C::Integer => matches!(schema, Avro::Int | Avro::Long),
        C::Double => matches!(schema, Avro::Float | Avro::Double | Avro::Int),
        C::Numeric => matches!(
            schema,
            Avro::Decimal(_) | Avro::Int | Avro::Long | Avro::Float | Avro::Double | Avro::String
        ),
        C::Boolean => matches!(schema, Avro::Boolean),
        C::Timestamp => matches!(
            schema,
            Avro::TimestampMillis
                | Avro::TimestampMicros
                | Avro::TimestampNanos
                | Avro::LocalTimestampMillis
                | Avro::LocalTimestampMicros
                | Avro::LocalTimestampNanos
                | Avro::String
        ),
        C::Date => matches!(schema, Avro::Date | Avro::String),
        C::Bytes => matches!(schema, Avro::Bytes | Avro::Fixed(_)),
    }
}

fn protobuf_name(field: &prost_reflect::FieldDescriptor) -> String {
    let kind = match field.kind() {
        Kind::Message(m) => m.full_name().to_owned(),
        Kind::Enum(e) => e.full_name().to_owned(),
        other => format!("{other:?}").to_lowercase(),
    };
    if field.is_list() {
        format!("repeated {kind}")
    } else if field.is_map() {
        "a map".to_owned()
    } else {
        kind
    }
}

/// Whether a Protobuf kind is one of its integers.
pub(super) fn is_protobuf_integer(kind: &Kind) -> bool {
    matches!(
        kind,
        Kind::Int32
            | Kind::Int64
            | Kind::Uint32
            | Kind::Uint64
            | Kind::Sint32
            | Kind::Sint64
            | Kind::Fixed32
            | Kind::Fixed64
            | Kind::Sfixed32
            | Kind::Sfixed64
    )
}

/// Whether a Protobuf field converts to `ty` (`protobuf.rs` decides each value).
fn protobuf_gives(field: &prost_reflect::FieldDescriptor, ty: ColumnType) -> bool {
    use ColumnType as C;
    if ty == C::Json {
        return true;
    }
    if field.is_list() || field.is_map() {
        return false;
    }
    let kind = field.kind();
    let integer = is_protobuf_integer(&kind);
    let float = matches!(kind, Kind::Float | Kind::Double);
    match ty {
        C::Json => true,
        C::Text => integer || matches!(kind, Kind::String | Kind::Enum(_) | Kind::Bool),
        C::Integer => integer,
        C::Double => float,
        C::Numeric => integer || float || kind == Kind::String,
        C::Boolean => kind == Kind::Bool,
        C::Timestamp => match &kind {
            Kind::Message(m) => m.full_name() == "google.protobuf.Timestamp",
            other => *other == Kind::String,
        },
        C::Date => kind == Kind::String,
        C::Bytes => kind == Kind::Bytes,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_incompatible_field_is_named_before_any_message() {
        let avro = CompiledSchema::compile(
            SchemaFormat::Avro,
            r#"{"type":"record","name":"R","fields":[{"name":"a","type":"string"},
                {"name":"b","type":["null","long"]}]}"#,
            None,
        )
        .unwrap();
        let fields = |a, b| vec![("a".to_owned(), a), ("b".to_owned(), b)];
        assert!(
            avro.check_fields(&fields(ColumnType::Text, ColumnType::Integer))
                .is_ok()
        );
        let why = avro
            .check_fields(&fields(ColumnType::Integer, ColumnType::Integer))
            .unwrap_err();
        assert!(why.starts_with("$.a is string in the schema"), "{why}");
        let proto = CompiledSchema::compile(
            SchemaFormat::Protobuf,
            r#"syntax = "proto3"; message R { string a = 1; repeated int64 b = 2; }"#,
            None,
        )
        .unwrap();
        assert!(
            proto
                .check_fields(&fields(ColumnType::Text, ColumnType::Json))
                .is_ok()
        );
        let why = proto
            .check_fields(&fields(ColumnType::Text, ColumnType::Integer))
            .unwrap_err();
        assert!(why.starts_with("$.b is repeated int64"), "{why}");
    }
}
