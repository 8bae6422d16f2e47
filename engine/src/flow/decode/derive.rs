//! The columns a schema gives, for a typed table that does not declare its `columns:` (SPEC
//! §5, "Typed tables"): one column per top-level field, named as the field, of the type its
//! values land as.
//!
//! Guarantee: every column derived here is one the schema fills
//! ([`CompiledSchema::check_fields`] accepts the derived list, tested below), and it is
//! nullable unless every message has a value for it: an Avro field whose type is not a union
//! with `null`, a Protobuf field without presence (proto3's plain scalars, repeated fields and
//! maps, which read as their defaults when unset).

use super::avro::AvroRecord;
use super::revisions::Revision;
use super::schema::{CompiledSchema, SchemaFormat, is_protobuf_integer};
use apache_avro::Schema as Avro;
use prost_reflect::{FieldDescriptor, Kind};
use sluice_store::ColumnType;

/// A derived column: its name, type and whether it may be NULL.
pub type DerivedColumn = (String, ColumnType, bool);

impl CompiledSchema {
    /// One column per top-level field, in the schema's order.
    pub fn columns(&self) -> Vec<DerivedColumn> {
        match self {
            Self::Avro(record) => record
                .fields()
                .iter()
                .map(|field| {
                    let (ty, nullable) = avro_column(record, &field.schema);
                    (field.name.clone(), ty, nullable)
                })
                .collect(),
            Self::Protobuf(message) => message
                .descriptor()
                .fields()
                .map(|field| {
                    let ty = protobuf_column(&field);
                    (field.name().to_owned(), ty, field.supports_presence())
                })
                .collect(),
        }
    }
}

/// The columns a table takes from the revisions of one schema, each `(id, revision)`, oldest
/// first: the first revision's columns, then each later revision's fields not seen before;
/// every one nullable (a row of a revision without the field holds NULL). A revision that does
/// not compile as a `format` schema (`message` picks a Protobuf message), or that gives a field
/// in a type its column does not take ([`CompiledSchema::check_fields`], the rule a running
/// flow applies to a new revision), adds nothing: it is returned with why, and a running flow
/// dead-letters its messages with that reason. A start and a running flow both derive with
/// this, so they agree whatever order messages name revisions in.
///
/// # Errors
/// No revision gives a field.
pub fn columns_of_revisions(
    format: SchemaFormat,
    message: Option<&str>,
    revisions: &[(String, Revision)],
) -> Result<(Vec<DerivedColumn>, Vec<String>), String> {
    let mut columns: Vec<DerivedColumn> = Vec::new();
    let mut refused = Vec::new();
    for (id, revision) in revisions {
        let compiled = if revision.format == format {
            CompiledSchema::compile(format, &revision.definition, message)
        } else {
            Err(format!(
                "it is a {} schema and the flow decodes {}",
                revision.format.as_str(),
                format.as_str()
            ))
        };
        let schema = match compiled {
            Ok(schema) => schema,
            Err(why) => {
                refused.push(format!("revision {id}: {why}"));
                continue;
            }
        };
        let fields: Vec<(String, ColumnType)> =
            columns.iter().map(|(n, t, _)| (n.clone(), *t)).collect();
        match schema.check_fields(&fields) {
            Ok(()) => columns.extend(new_columns(&schema, &fields)),
            Err(why) => refused.push(format!("revision {id} changes a field's type: {why}")),
        }
    }
    if columns.is_empty() {
        return Err("no revision of the schema has fields".to_owned());
    }
    Ok((columns, refused))
}

/// The fields of `schema` that are not among `fields`, as nullable columns, in its order.
pub fn new_columns(schema: &CompiledSchema, fields: &[(String, ColumnType)]) -> Vec<DerivedColumn> {
    schema
        .columns()
        .into_iter()
        .filter(|(name, _, _)| !fields.iter().any(|(known, _)| known == name))
        .map(|(name, ty, _)| (name, ty, true))
        .collect()
}

/// An Avro field's column type, and whether it may be NULL (a union with `null`).
fn avro_column(record: &AvroRecord, schema: &Avro) -> (ColumnType, bool) {
    let schema = record.resolve(schema);
    if let Avro::Union(union) = schema {
        let nullable = union.variants().iter().any(|v| matches!(v, Avro::Null));
        let mut values = union.variants().iter().filter(|v| !matches!(v, Avro::Null));
        return match (values.next(), values.next()) {
            (Some(only), None) => (avro_column(record, only).0, nullable),
            // Several kinds of value (or only null): each lands as JSON.
            _ => (ColumnType::Json, nullable),
        };
    }
    use ColumnType as C;
    let ty = match schema {
        Avro::String | Avro::Enum(_) | Avro::Uuid(_) => C::Text,
        Avro::Int | Avro::Long => C::Integer,
        Avro::Float | Avro::Double => C::Double,
        Avro::Boolean => C::Boolean,
        Avro::Bytes | Avro::Fixed(_) => C::Bytes,
        Avro::Decimal(_) => C::Numeric,
        Avro::Date => C::Date,
        Avro::TimestampMillis
        | Avro::TimestampMicros
        | Avro::TimestampNanos
        | Avro::LocalTimestampMillis
        | Avro::LocalTimestampMicros
        | Avro::LocalTimestampNanos => C::Timestamp,
        // Records, arrays, maps, times of day, durations and the rest.
        _ => C::Json,
    };
    (ty, matches!(schema, Avro::Null))
}

/// A Protobuf field's column type.
fn protobuf_column(field: &FieldDescriptor) -> ColumnType {
    use ColumnType as C;
    if field.is_list() || field.is_map() {
        return C::Json;
    }
    match field.kind() {
        Kind::Float | Kind::Double => C::Double,
        Kind::Bool => C::Boolean,
        Kind::String | Kind::Enum(_) => C::Text,
        Kind::Bytes => C::Bytes,
        Kind::Message(m) if m.full_name() == "google.protobuf.Timestamp" => C::Timestamp,
        Kind::Message(_) => C::Json,
        // Past the 64-bit signed range: exact in `numeric`.
        Kind::Uint64 | Kind::Fixed64 => C::Numeric,
        // The other integer kinds.
        kind => {
            debug_assert!(is_protobuf_integer(&kind));
            C::Integer
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn fields(columns: &[DerivedColumn]) -> Vec<(String, ColumnType)> {
        columns.iter().map(|(n, t, _)| (n.clone(), *t)).collect()
    }

    #[test]
    fn revisions_add_their_new_fields_and_one_that_changes_a_type_adds_nothing() {
        let avro = |id: &str, fields: &str| {
            (
                id.to_owned(),
                Revision {
                    format: SchemaFormat::Avro,
                    definition: format!(r#"{{"type":"record","name":"R","fields":[{fields}]}}"#),
                },
            )
        };
        let first = avro(
            "a",
            r#"{"name":"id","type":"string"},{"name":"qty","type":"long"}"#,
        );
        let second = avro(
            "b",
            r#"{"name":"id","type":"string"},{"name":"qty","type":"long"},
               {"name":"note","type":["null","string"],"default":null}"#,
        );
        let (columns, refused) =
            columns_of_revisions(SchemaFormat::Avro, None, &[first.clone(), second.clone()])
                .unwrap();
        assert!(refused.is_empty());
        use ColumnType as C;
        let expected = [("id", C::Text), ("qty", C::Integer), ("note", C::Text)]
            .map(|(n, t)| (n.to_owned(), t, true));
        assert_eq!(columns, expected.to_vec());
        let changed = avro(
            "c",
            r#"{"name":"id","type":"string"},{"name":"qty","type":"boolean"}"#,
        );
        let broken = avro("d", r#"{"name":"#);
        let (columns, refused) =
            columns_of_revisions(SchemaFormat::Avro, None, &[first, changed, broken, second])
                .unwrap();
        assert_eq!(
            columns,
            expected.to_vec(),
            "the refused revisions add nothing"
        );
        assert_eq!(refused.len(), 2);
        assert!(
            refused[0].contains("revision c") && refused[0].contains("$.qty"),
            "{refused:?}"
        );
        assert!(refused[1].contains("revision d"), "{refused:?}");
    }

    #[test]
    fn an_avro_record_gives_a_column_per_field_that_it_fills() {
        let schema = CompiledSchema::compile(
            SchemaFormat::Avro,
            r#"{"type":"record","name":"Order","fields":[
                {"name":"order_id","type":"string"},
                {"name":"qty","type":"long"},
                {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}},
                {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
                {"name":"day","type":["null",{"type":"int","logicalType":"date"}],"default":null},
                {"name":"note","type":["null","string"],"default":null},
                {"name":"either","type":["null","string","long"],"default":null},
                {"name":"tags","type":{"type":"array","items":"string"}},
                {"name":"paid","type":"boolean"},
                {"name":"ratio","type":"float"}
            ]}"#,
            None,
        )
        .unwrap();
        let columns = schema.columns();
        use ColumnType as C;
        let expected = [
            ("order_id", C::Text, false),
            ("qty", C::Integer, false),
            ("amount", C::Numeric, false),
            ("ts", C::Timestamp, false),
            ("day", C::Date, true),
            ("note", C::Text, true),
            ("either", C::Json, true),
            ("tags", C::Json, false),
            ("paid", C::Boolean, false),
            ("ratio", C::Double, false),
        ]
        .map(|(n, t, null)| (n.to_owned(), t, null));
        assert_eq!(columns, expected.to_vec());
        schema.check_fields(&fields(&columns)).unwrap();
    }

    #[test]
    fn a_protobuf_message_gives_a_column_per_field_that_it_fills() {
        let schema = CompiledSchema::compile(
            SchemaFormat::Protobuf,
            r#"syntax = "proto3";
            package shop;
            import "google/protobuf/timestamp.proto";
            enum Region { R_UNKNOWN = 0; EU = 1; }
            message Item { string sku = 1; }
            message Order {
                string order_id = 1;
                int64 qty = 2;
                double amount = 3;
                optional string note = 4;
                google.protobuf.Timestamp ts = 5;
                Region region = 6;
                repeated string tags = 7;
                Item first = 8;
                bytes blob = 9;
                bool paid = 10;
                uint64 big = 11;
            }"#,
            Some("shop.Order"),
        )
        .unwrap();
        let columns = schema.columns();
        use ColumnType as C;
        let expected = [
            ("order_id", C::Text, false),
            ("qty", C::Integer, false),
            ("amount", C::Double, false),
            ("note", C::Text, true),
            ("ts", C::Timestamp, true),
            ("region", C::Text, false),
            ("tags", C::Json, false),
            ("first", C::Json, true),
            ("blob", C::Bytes, false),
            ("paid", C::Boolean, false),
            ("big", C::Numeric, false),
        ]
        .map(|(n, t, null)| (n.to_owned(), t, null));
        assert_eq!(columns, expected.to_vec());
        schema.check_fields(&fields(&columns)).unwrap();
    }
}
