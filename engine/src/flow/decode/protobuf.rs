//! Protobuf payloads (`decode: { format: protobuf }`): a message's top-level fields as a typed
//! flow's fields. The `.proto` text (a schema file, or a revision from Pub/Sub's schema
//! service) is compiled by `protox` (no `protoc` needed); messages are read by `prost-reflect`,
//! from the binary wire format or from Protobuf's JSON mapping.
//!
//! Each field is read by name and converted to its column's type strictly (an error names
//! `$.field`). A field with presence (`optional`, a message) that is not set is NULL; a proto3
//! scalar without presence is its value, zero included, as Protobuf defines it. An enum lands
//! as its name (a number the descriptor does not know, which Protobuf allows, as that number),
//! a `google.protobuf.Timestamp` as a time, a message or a list in a `json` column as
//! Protobuf's JSON mapping with default values written out. A field the schema does not know
//! is ignored in both encodings. A binary payload cut at a field boundary is a shorter valid
//! message (Protobuf cannot tell): its missing fields take their defaults.

use super::values;
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, FieldDescriptor, Kind, MessageDescriptor,
    ReflectMessage, SerializeOptions, Value,
};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};
use sluice_store::{ColumnType, TypedValue};

/// The name the schema text is compiled under.
const SCHEMA_FILE: &str = "sluice_schema.proto";

/// A compiled message type.
#[derive(Debug, Clone)]
pub struct ProtobufMessage {
    message: MessageDescriptor,
}

/// The schema text, as the only file besides Google's well-known types.
struct SchemaText(String);

impl FileResolver for SchemaText {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        if name == SCHEMA_FILE {
            File::from_source(name, &self.0)
        } else {
            Err(protox::Error::file_not_found(name))
        }
    }
}

impl ProtobufMessage {
    /// Compiles `.proto` text and takes message `name` (its full name, or its name when that
    /// is unique), or without a name the file's only top-level message (as Pub/Sub's schemas
    /// have).
    pub fn compile(definition: &str, name: Option<&str>) -> Result<Self, String> {
        let mut resolver = ChainFileResolver::new();
        resolver.add(SchemaText(definition.to_owned()));
        resolver.add(GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(resolver);
        compiler
            .open_file(SCHEMA_FILE)
            .map_err(|e| format!("not a Protobuf schema: {e}"))?;
        let pool: DescriptorPool = compiler.descriptor_pool();
        let ours = pool
            .get_file_by_name(SCHEMA_FILE)
            .ok_or("the schema file did not compile")?;
        let candidates: Vec<MessageDescriptor> = match name {
            Some(name) => pool
                .all_messages()
                .filter(|m| m.full_name() == name || m.name() == name)
                .collect(),
            None => ours.messages().collect(),
        };
        match (candidates.as_slice(), name) {
            ([message], _) => Ok(Self {
                message: message.clone(),
            }),
            ([], Some(name)) => Err(format!("the schema has no message `{name}`")),
            (_, Some(name)) => Err(format!(
                "`{name}` names several messages: give its full name (package.Message)"
            )),
            (_, None) => Err(
                "the schema has several top-level messages: say which with `message:`".to_owned(),
            ),
        }
    }

    /// The message's descriptor.
    pub(super) fn descriptor(&self) -> &MessageDescriptor {
        &self.message
    }

    /// The values of `fields` in a binary-encoded message.
    pub fn decode_binary(
        &self,
        data: &[u8],
        fields: &[(String, ColumnType)],
    ) -> Result<Vec<TypedValue>, String> {
        let message = DynamicMessage::decode(self.message.clone(), data)
            .map_err(|e| format!("not a Protobuf {} message: {e}", self.message.full_name()))?;
        self.values(&message, fields)
    }

    /// The values of `fields` in a message in Protobuf's JSON mapping.
    pub fn decode_json(
        &self,
        data: &[u8],
        fields: &[(String, ColumnType)],
    ) -> Result<Vec<TypedValue>, String> {
        let mut reader = serde_json::Deserializer::from_slice(data);
        // Fields the schema does not know are ignored, as the binary form ignores them.
        let options = DeserializeOptions::new().deny_unknown_fields(false);
        let message =
            DynamicMessage::deserialize_with_options(self.message.clone(), &mut reader, &options)
                .and_then(|m| reader.end().map(|()| m))
                .map_err(|e| {
                    format!(
                        "not a Protobuf {} message in JSON: {e}",
                        self.message.full_name()
                    )
                })?;
        self.values(&message, fields)
    }

    fn values(
        &self,
        message: &DynamicMessage,
        fields: &[(String, ColumnType)],
    ) -> Result<Vec<TypedValue>, String> {
        fields
            .iter()
            .map(|(name, ty)| {
                let Some(field) = self.message.get_field_by_name(name) else {
                    return Ok(TypedValue::Null);
                };
                if field.supports_presence() && !message.has_field(&field) {
                    return Ok(TypedValue::Null);
                }
                convert(&message.get_field(&field), &field, *ty)
                    .map_err(|why| format!("$.{name}: {why}"))
            })
            .collect()
    }
}

/// What a Protobuf value is, for messages.
fn kind(value: &Value) -> String {
    match value {
        Value::Message(m) => m.descriptor().full_name().to_owned(),
        Value::List(_) => "a repeated field".to_owned(),
        Value::Map(_) => "a map".to_owned(),
        // `u64(18446744073709551615)`: the kind and the value.
        other => format!("{other:?}").to_lowercase(),
    }
}

/// A value of `field` as a value of `ty`.
fn convert(value: &Value, field: &FieldDescriptor, ty: ColumnType) -> Result<TypedValue, String> {
    let expected = |what: &str| format!("expected {what}, found {}", kind(value));
    let enum_name = |number: i32| match field.kind() {
        Kind::Enum(e) => e
            .get_value(number)
            .map_or_else(|| number.to_string(), |v| v.name().to_owned()),
        _ => number.to_string(),
    };
    match ty {
        ColumnType::Text => match value {
            Value::String(s) => Ok(TypedValue::Text(s.clone())),
            Value::EnumNumber(n) => Ok(TypedValue::Text(enum_name(*n))),
            Value::Bool(b) => Ok(TypedValue::Text(b.to_string())),
            _ => integer(value)
                .map(|i| TypedValue::Text(i.to_string()))
                .ok_or_else(|| expected("a string")),
        },
        ColumnType::Integer => integer(value)
            .and_then(|i| i64::try_from(i).ok())
            .map(TypedValue::Integer)
            .ok_or_else(|| expected("an integer of 64 bits")),
        ColumnType::Double => match value {
            Value::F32(x) => values::double(f64::from(*x)),
            Value::F64(x) => values::double(*x),
            _ => Err(expected("a float or a double")),
        },
        ColumnType::Numeric => match value {
            Value::F32(x) => values::numeric_from_f32(*x),
            Value::F64(x) => values::numeric_from_float(*x),
            Value::String(s) => values::numeric_from_text(s),
            _ => integer(value)
                .map(|i| TypedValue::Numeric(i.to_string()))
                .ok_or_else(|| expected("a number or a decimal string")),
        },
        ColumnType::Boolean => match value {
            Value::Bool(b) => Ok(TypedValue::Boolean(*b)),
            _ => Err(expected("a bool")),
        },
        ColumnType::Timestamp => match value {
            Value::Message(m) if m.descriptor().full_name() == "google.protobuf.Timestamp" => {
                let part = |name: &str| {
                    m.get_field_by_name(name)
                        .and_then(|v| integer(&v))
                        .unwrap_or(0)
                };
                let ms = part("seconds")
                    .checked_mul(1_000)
                    .and_then(|ms| ms.checked_add(part("nanos").div_euclid(1_000_000)))
                    .and_then(|ms| i64::try_from(ms).ok())
                    .ok_or_else(|| expected("a time in range"))?;
                values::timestamp(ms)
            }
            Value::String(s) => values::timestamp_from_text(s),
            _ => Err(expected(
                "a google.protobuf.Timestamp or an ISO 8601 string",
            )),
        },
        ColumnType::Date => match value {
            Value::String(s) => values::date_from_text(s),
            _ => Err(expected("a date YYYY-MM-DD (a string)")),
        },
        ColumnType::Json => {
            // Protobuf's JSON mapping, defaults written out (a 0 is 0, not absent).
            let options = SerializeOptions::new().skip_default_fields(false);
            let json = match value {
                Value::Message(m) => m
                    .serialize_with_options(serde_json::value::Serializer, &options)
                    .map(|json| json.to_string()),
                _ => {
                    let mut holder = DynamicMessage::new(field.parent_message().clone());
                    holder.set_field(field, value.clone());
                    holder
                        .serialize_with_options(serde_json::value::Serializer, &options)
                        .map(|whole| {
                            whole
                                .get(field.json_name())
                                .map_or_else(|| "null".to_owned(), ToString::to_string)
                        })
                }
            };
            json.map(TypedValue::Json)
                .map_err(|e| format!("not representable as JSON: {e}"))
        }
        ColumnType::Bytes => match value {
            Value::Bytes(b) => Ok(TypedValue::Bytes(b.clone())),
            _ => Err(expected("bytes")),
        },
    }
}

/// An integer value, widened.
fn integer(value: &Value) -> Option<i128> {
    match value {
        Value::I32(i) => Some(i128::from(*i)),
        Value::I64(i) => Some(i128::from(*i)),
        Value::U32(i) => Some(i128::from(*i)),
        Value::U64(i) => Some(i128::from(*i)),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use prost_reflect::prost::Message as _;

    const ORDERS: &str = r#"
        syntax = "proto3";
        package shop;
        import "google/protobuf/timestamp.proto";
        enum Region { REGION_UNKNOWN = 0; EU = 1; US = 2; }
        message Order {
          string order_id = 1;
          string amount = 2;
          int64 qty = 3;
          google.protobuf.Timestamp ts = 4;
          Region region = 5;
          optional string note = 6;
          repeated string tags = 7;
        }"#;

    fn fields() -> Vec<(String, ColumnType)> {
        [
            ("order_id", ColumnType::Text),
            ("amount", ColumnType::Numeric),
            ("qty", ColumnType::Integer),
            ("ts", ColumnType::Timestamp),
            ("region", ColumnType::Text),
            ("note", ColumnType::Text),
            ("tags", ColumnType::Json),
        ]
        .map(|(n, t)| (n.to_owned(), t))
        .to_vec()
    }

    fn order(schema: &ProtobufMessage, note: Option<&str>) -> DynamicMessage {
        let json = format!(
            r#"{{"orderId":"o-1","amount":"12.30","qty":"3","ts":"2026-12-04T10:00:00Z",
                "region":"EU","tags":["a"]{}}}"#,
            note.map(|n| format!(r#","note":"{n}""#))
                .unwrap_or_default()
        );
        let mut reader = serde_json::Deserializer::from_str(&json);
        DynamicMessage::deserialize(schema.descriptor().clone(), &mut reader).unwrap()
    }

    #[test]
    fn binary_and_json_land_the_same_typed_values() {
        let schema = ProtobufMessage::compile(ORDERS, None).unwrap();
        let message = order(&schema, Some("gift"));
        let expected = vec![
            TypedValue::Text("o-1".into()),
            TypedValue::Numeric("12.30".into()),
            TypedValue::Integer(3),
            TypedValue::Timestamp(1_796_378_400_000),
            TypedValue::Text("EU".into()),
            TypedValue::Text("gift".into()),
            TypedValue::Json(r#"["a"]"#.into()),
        ];
        let binary = message.encode_to_vec();
        assert_eq!(schema.decode_binary(&binary, &fields()).unwrap(), expected);
        let json = serde_json::to_vec(&message).unwrap();
        assert_eq!(schema.decode_json(&json, &fields()).unwrap(), expected);
        let unset = order(&schema, None).encode_to_vec();
        assert_eq!(
            schema.decode_binary(&unset, &fields()).unwrap()[5],
            TypedValue::Null
        );
    }

    /// A `json` column holds a value at its default (0, an empty list) as that value.
    #[test]
    fn defaults_land_in_json_columns_as_values() {
        let schema = ProtobufMessage::compile(
            r#"syntax = "proto3"; message M { int64 i = 1; repeated string l = 2; }"#,
            None,
        )
        .unwrap();
        let fields = vec![
            ("i".to_owned(), ColumnType::Json),
            ("l".to_owned(), ColumnType::Json),
        ];
        assert_eq!(
            schema.decode_binary(&[], &fields).unwrap(),
            vec![
                TypedValue::Json("\"0\"".into()),
                TypedValue::Json("[]".into())
            ]
        );
        // A field the schema does not know is ignored in JSON as in binary.
        assert_eq!(
            schema
                .decode_json(br#"{"i":"5","newField":1}"#, &fields)
                .unwrap()[0],
            TypedValue::Json("\"5\"".into())
        );
    }

    #[test]
    fn corrupt_payloads_and_wrong_types_are_refused() {
        let schema = ProtobufMessage::compile(ORDERS, Some("Order")).unwrap();
        let binary = order(&schema, Some("gift")).encode_to_vec();
        assert!(
            schema
                .decode_binary(&binary[..binary.len() - 2], &fields())
                .is_err()
        );
        assert!(schema.decode_binary(&[0xff, 0xff], &fields()).is_err());
        let why = schema
            .decode_binary(&binary, &[("order_id".to_owned(), ColumnType::Integer)])
            .unwrap_err();
        assert!(why.starts_with("$.order_id: expected an integer"), "{why}");
        assert!(ProtobufMessage::compile(ORDERS, Some("Nope")).is_err());
        assert!(ProtobufMessage::compile("message {", None).is_err());
    }
}
