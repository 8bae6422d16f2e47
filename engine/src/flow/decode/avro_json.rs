//! Avro's JSON encoding (what Pub/Sub carries for a topic with an Avro schema and JSON
//! encoding): a JSON object per record, a union's value either wrapped in an object naming its
//! branch (`{"string": "gift"}`, the Avro specification's form) or bare; read with `serde_json`
//! and converted to a typed flow's fields by the record's schema, as the binary form is.
//!
//! The schema decides what a JSON value means where JSON alone cannot: a number under
//! `timestamp-millis` is milliseconds, under `date` days, and a `decimal`'s bytes (a string of
//! code points 0 to 255, as the specification writes bytes) its unscaled digits.

use super::avro::AvroRecord;
use super::{json, values};
use apache_avro::Schema;
use serde_json::Value as Json;
use sluice_store::{ColumnType, TypedValue};
use std::collections::HashMap;

impl AvroRecord {
    /// The values of `fields` in a JSON-encoded record.
    pub fn decode_json(
        &self,
        data: &[u8],
        fields: &[(String, ColumnType)],
    ) -> Result<Vec<TypedValue>, String> {
        let object: HashMap<String, Json> = serde_json::from_slice(data)
            .map_err(|e| format!("the payload is not a JSON object: {e}"))?;
        fields
            .iter()
            .map(|(name, ty)| match (object.get(name), self.field(name)) {
                (Some(value), Some(schema)) => {
                    convert(value, schema, *ty).map_err(|why| format!("$.{name}: {why}"))
                }
                _ => Ok(TypedValue::Null),
            })
            .collect()
    }
}

/// The name a union's JSON form gives a branch of this schema.
fn branch_name(schema: &Schema) -> String {
    if let Some(name) = schema.name() {
        return name.fullname(None);
    }
    let text = serde_json::to_value(schema).unwrap_or(Json::Null);
    match &text {
        Json::String(primitive) => primitive.clone(),
        Json::Object(o) => o
            .get("type")
            .and_then(Json::as_str)
            .unwrap_or_default()
            .to_owned(),
        _ => String::new(),
    }
}

/// Bytes as Avro's JSON encoding writes them: a string of code points 0 to 255.
fn json_bytes(value: &Json) -> Result<Vec<u8>, String> {
    let Json::String(text) = value else {
        return Err(format!("expected bytes (a string), found {value}"));
    };
    text.chars()
        .map(|c| u8::try_from(u32::from(c)))
        .collect::<Result<_, _>>()
        .map_err(|_| "bytes are code points 0 to 255".to_owned())
}

/// One JSON value of `schema` as a value of `ty`.
fn convert(value: &Json, schema: &Schema, ty: ColumnType) -> Result<TypedValue, String> {
    if value.is_null() {
        return Ok(TypedValue::Null);
    }
    if let Schema::Union(union) = schema {
        let branches = union.variants();
        // `{"branch": value}` names its branch; a bare value takes the first that is not null.
        if let Json::Object(o) = value
            && o.len() == 1
            && let Some((name, inner)) = o.iter().next()
            && let Some(branch) = branches.iter().find(|b| branch_name(b) == *name)
        {
            return convert(inner, branch, ty);
        }
        let branch = branches
            .iter()
            .find(|b| !matches!(b, Schema::Null))
            .ok_or("a union of null alone")?;
        return convert(value, branch, ty);
    }
    let number = || {
        value
            .as_i64()
            .ok_or_else(|| format!("expected a whole number, found {value}"))
    };
    match (schema, ty) {
        (Schema::TimestampMillis | Schema::LocalTimestampMillis, ColumnType::Timestamp) => {
            values::timestamp(number()?)
        }
        (Schema::TimestampMicros | Schema::LocalTimestampMicros, ColumnType::Timestamp) => {
            values::timestamp(number()?.div_euclid(1_000))
        }
        (Schema::TimestampNanos | Schema::LocalTimestampNanos, ColumnType::Timestamp) => {
            values::timestamp(number()?.div_euclid(1_000_000))
        }
        (Schema::Date, ColumnType::Date) => values::date_from_days(number()?),
        (Schema::Decimal(decimal), ColumnType::Numeric) => {
            let bytes = json_bytes(value)?;
            let unscaled = num_bigint::BigInt::from_signed_bytes_be(&bytes).to_string();
            Ok(values::numeric_from_unscaled(&unscaled, decimal.scale))
        }
        (Schema::Bytes | Schema::Fixed(_), ColumnType::Bytes) => {
            Ok(TypedValue::Bytes(json_bytes(value)?.into()))
        }
        _ => json::convert(&value.to_string(), ty),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const ORDERS: &str = r#"{"type":"record","name":"Order","fields":[
        {"name":"order_id","type":"string"},
        {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
        {"name":"day","type":{"type":"int","logicalType":"date"}},
        {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}},
        {"name":"note","type":["null","string"],"default":null}]}"#;

    fn fields() -> Vec<(String, ColumnType)> {
        [
            ("order_id", ColumnType::Text),
            ("ts", ColumnType::Timestamp),
            ("day", ColumnType::Date),
            ("amount", ColumnType::Numeric),
            ("note", ColumnType::Text),
        ]
        .map(|(n, t)| (n.to_owned(), t))
        .to_vec()
    }

    #[test]
    fn a_json_record_lands_its_typed_values_with_unions_wrapped_or_bare() {
        let record = AvroRecord::parse(ORDERS).unwrap();
        // 1230 as two big-endian bytes: 0x04 0xCE.
        let payload = r#"{"order_id":"o-1","ts":1796378400000,"day":20426,
            "amount":"\u0004\u00ce","note":{"string":"gift"}}"#;
        let values = record.decode_json(payload.as_bytes(), &fields()).unwrap();
        assert_eq!(
            values,
            vec![
                TypedValue::Text("o-1".into()),
                TypedValue::Timestamp(1_796_378_400_000),
                TypedValue::Date("2025-12-04".into()),
                TypedValue::Numeric("12.30".into()),
                TypedValue::Text("gift".into()),
            ]
        );
        let bare = r#"{"order_id":"o-2","ts":0,"day":0,"amount":"\u0000","note":"bare"}"#;
        let values = record.decode_json(bare.as_bytes(), &fields()).unwrap();
        assert_eq!(values[4], TypedValue::Text("bare".into()));
        let null = r#"{"order_id":"o-3","ts":0,"day":0,"amount":"\u0000","note":null}"#;
        assert_eq!(
            record.decode_json(null.as_bytes(), &fields()).unwrap()[4],
            TypedValue::Null
        );
    }

    #[test]
    fn a_bad_json_value_names_its_field() {
        let record = AvroRecord::parse(ORDERS).unwrap();
        let why = record
            .decode_json(br#"{"ts":"yesterday"}"#, &fields())
            .unwrap_err();
        assert!(why.starts_with("$.ts: expected a whole number"), "{why}");
        assert!(record.decode_json(b"[]", &fields()).is_err());
    }
}
