//! Avro's JSON encoding (what Pub/Sub carries for a topic with an Avro schema and JSON
//! encoding): a JSON object per record, a union's value either wrapped in an object naming its
//! branch (`{"string": "gift"}`, the Avro specification's form) or bare. The JSON (read with
//! `serde_json`) is turned into the Avro value the binary form would give, checked against the
//! schema on the way, and that value converted as the binary form's is: a value lands the same
//! whatever the encoding, a `json` column included.
//!
//! Checked as Avro would: a field missing from the record without a default or a null branch,
//! a null outside a union with a null branch, a string where an `int` is, an `int` past 32 bits,
//! a symbol not in its enum, bytes of the wrong size for a `fixed`: each an error naming the
//! field. The schema decides what a JSON value means where JSON alone cannot: a number under
//! `timestamp-millis` is milliseconds, under `date` days, and bytes (a `decimal`'s included)
//! are a string of code points 0 to 255, as the specification writes them.

use super::avro::AvroRecord;
use apache_avro::Schema;
use apache_avro::types::Value;
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
            .map(|(name, ty)| {
                let Some(schema) = self.field(name) else {
                    return Ok(TypedValue::Null);
                };
                let at = |why: String| format!("$.{name}: {why}");
                let value = match object.get(name) {
                    Some(json) => self.value(json, schema).map_err(at)?,
                    None => self.absent(name, schema).map_err(at)?,
                };
                self.convert(&value, schema, *ty).map_err(at)
            })
            .collect()
    }

    /// A field the record leaves out: its default, or null where the schema allows it.
    fn absent(&self, name: &str, schema: &Schema) -> Result<Value, String> {
        let field = self.fields().iter().find(|f| f.name == name);
        match field.and_then(|f| f.default.as_ref()) {
            // A union's default is of its first branch.
            Some(default) => match self.resolve(schema) {
                Schema::Union(union) => {
                    let first = union.variants().first().ok_or("an empty union")?;
                    Ok(Value::Union(0, Box::new(self.value(default, first)?)))
                }
                other => self.value(default, other),
            },
            None => Err("missing, and its schema has no default".to_owned()),
        }
    }

    /// The Avro value `json` writes for `schema`, checked against it.
    fn value(&self, json: &Json, schema: &Schema) -> Result<Value, String> {
        let schema = self.resolve(schema);
        let expected = |what: &str| format!("expected {what}, found {json}");
        let whole = || json.as_i64().ok_or_else(|| expected("a whole number"));
        let int =
            || whole().and_then(|n| i32::try_from(n).map_err(|_| expected("an int of 32 bits")));
        let text = || json.as_str().ok_or_else(|| expected("a string"));
        Ok(match schema {
            Schema::Union(union) => return self.branch(json, union.variants()),
            Schema::Null if json.is_null() => Value::Null,
            _ if json.is_null() => return Err(expected("a value (the schema has no null)")),
            Schema::Null => return Err(expected("null")),
            Schema::Boolean => Value::Boolean(json.as_bool().ok_or_else(|| expected("a boolean"))?),
            Schema::Int => Value::Int(int()?),
            Schema::Long => Value::Long(whole()?),
            Schema::Float => {
                Value::Float(json.as_f64().ok_or_else(|| expected("a number"))? as f32)
            }
            Schema::Double => Value::Double(json.as_f64().ok_or_else(|| expected("a number"))?),
            Schema::Bytes => Value::Bytes(json_bytes(json)?),
            Schema::String => Value::String(text()?.to_owned()),
            Schema::Fixed(fixed) => Value::Fixed(fixed.size, sized(json_bytes(json)?, fixed.size)?),
            Schema::Enum(e) => {
                let symbol = text()?;
                let index = e
                    .symbols
                    .iter()
                    .position(|s| s == symbol)
                    .ok_or_else(|| expected("a symbol of the enum"))?;
                Value::Enum(index as u32, symbol.to_owned())
            }
            Schema::Array(array) => Value::Array(
                json.as_array()
                    .ok_or_else(|| expected("an array"))?
                    .iter()
                    .map(|item| self.value(item, &array.items))
                    .collect::<Result<_, _>>()?,
            ),
            Schema::Map(map) => Value::Map(
                json.as_object()
                    .ok_or_else(|| expected("an object"))?
                    .iter()
                    .map(|(k, v)| Ok((k.clone(), self.value(v, &map.types)?)))
                    .collect::<Result<_, String>>()?,
            ),
            Schema::Record(record) => {
                let object = json.as_object().ok_or_else(|| expected("an object"))?;
                let mut fields = Vec::with_capacity(record.fields.len());
                for field in &record.fields {
                    let value = match object.get(&field.name) {
                        Some(v) => self.value(v, &field.schema),
                        None => match &field.default {
                            Some(default) => self.value(default, &field.schema),
                            None => Err("missing, and its schema has no default".to_owned()),
                        },
                    }
                    .map_err(|why| format!("{}: {why}", field.name))?;
                    fields.push((field.name.clone(), value));
                }
                Value::Record(fields)
            }
            Schema::Decimal(decimal) => {
                let bytes = json_bytes(json)?;
                let bytes = match &decimal.inner {
                    apache_avro::schema::InnerDecimalSchema::Fixed(f) => sized(bytes, f.size)?,
                    apache_avro::schema::InnerDecimalSchema::Bytes => bytes,
                };
                Value::Decimal(apache_avro::Decimal::from(bytes))
            }
            Schema::Uuid(apache_avro::schema::UuidSchema::String) => {
                Value::Uuid(apache_avro::Uuid::parse_str(text()?).map_err(|_| expected("a uuid"))?)
            }
            Schema::Uuid(_) => Value::Uuid(
                apache_avro::Uuid::from_slice(&sized(json_bytes(json)?, 16)?)
                    .map_err(|_| expected("16 bytes of a uuid"))?,
            ),
            Schema::Date => Value::Date(int()?),
            Schema::TimeMillis => Value::TimeMillis(int()?),
            Schema::TimeMicros => Value::TimeMicros(whole()?),
            Schema::TimestampMillis => Value::TimestampMillis(whole()?),
            Schema::TimestampMicros => Value::TimestampMicros(whole()?),
            Schema::TimestampNanos => Value::TimestampNanos(whole()?),
            Schema::LocalTimestampMillis => Value::LocalTimestampMillis(whole()?),
            Schema::LocalTimestampMicros => Value::LocalTimestampMicros(whole()?),
            Schema::LocalTimestampNanos => Value::LocalTimestampNanos(whole()?),
            other => {
                return Err(format!(
                    "{} in Avro's JSON encoding is not read",
                    branch_name(other)
                ));
            }
        })
    }

    /// A union's value: `{"branch": value}` names its branch; a bare value takes the first
    /// branch it fits (null the null branch).
    fn branch(&self, json: &Json, branches: &[Schema]) -> Result<Value, String> {
        if let Json::Object(o) = json
            && o.len() == 1
            && let Some((name, inner)) = o.iter().next()
            && let Some(index) = branches
                .iter()
                .position(|b| branch_name(self.resolve(b)) == *name)
        {
            return Ok(Value::Union(
                index as u32,
                Box::new(self.value(inner, &branches[index])?),
            ));
        }
        branches
            .iter()
            .enumerate()
            .find_map(|(index, b)| {
                self.value(json, b)
                    .ok()
                    .map(|v| Value::Union(index as u32, Box::new(v)))
            })
            .ok_or_else(|| format!("{json} fits no branch of the union"))
    }
}

/// `bytes` if they are `size` long (a `fixed`).
fn sized(bytes: Vec<u8>, size: usize) -> Result<Vec<u8>, String> {
    if bytes.len() == size {
        Ok(bytes)
    } else {
        Err(format!("{} bytes where the schema has {size}", bytes.len()))
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
        let bad = |payload: &str| {
            record
                .decode_json(payload.as_bytes(), &fields())
                .unwrap_err()
        };
        let good = r#""order_id":"o","ts":0,"day":0,"amount":"\u0000""#;
        let why = bad(r#"{"order_id":"o","ts":"yesterday","day":0,"amount":"\u0000"}"#);
        assert!(why.starts_with("$.ts: expected a whole number"), "{why}");
        // Checked as Avro would: a field left out without a default, a null outside a union
        // with null, a number where a string is, an int past 32 bits.
        let why = bad(r#"{"ts":0,"day":0,"amount":"\u0000"}"#);
        assert!(why.starts_with("$.order_id: missing"), "{why}");
        let why = bad(r#"{"order_id":null,"ts":0,"day":0,"amount":"\u0000"}"#);
        assert!(why.starts_with("$.order_id: expected a value"), "{why}");
        let why = bad(r#"{"order_id":7,"ts":0,"day":0,"amount":"\u0000"}"#);
        assert!(why.starts_with("$.order_id: expected a string"), "{why}");
        let why = bad(&format!("{{{good},\"note\":{{\"long\":1}}}}"));
        assert!(why.starts_with("$.note: "), "{why}");
        let why = bad(r#"{"order_id":"o","ts":0,"day":3000000000,"amount":"\u0000"}"#);
        assert!(
            why.starts_with("$.day: expected an int of 32 bits"),
            "{why}"
        );
        // `note` has a default: it may be left out.
        let values = record
            .decode_json(format!("{{{good}}}").as_bytes(), &fields())
            .unwrap();
        assert_eq!(values[4], TypedValue::Null);
        assert!(record.decode_json(b"[]", &fields()).is_err());
    }

    /// A value lands the same from either encoding: named types referred to by name, a uuid on
    /// a `fixed`, a decimal string, a float, a nested record with a union in a json column.
    #[test]
    fn both_encodings_land_the_same_values() {
        let schema = r#"{"type":"record","name":"R","fields":[
            {"name":"colour","type":{"type":"enum","name":"Colour","symbols":["RED","BLUE"]}},
            {"name":"again","type":"Colour"},
            {"name":"money","type":{"type":"fixed","name":"Money","size":2,
                "logicalType":"decimal","precision":4,"scale":2}},
            {"name":"tax","type":"Money"},
            {"name":"id","type":{"type":"fixed","name":"Id","size":16,"logicalType":"uuid"}},
            {"name":"price","type":"string"},
            {"name":"ratio","type":"float"},
            {"name":"inner","type":{"type":"record","name":"In","fields":[
                {"name":"n","type":["null","string"]},{"name":"b","type":"bytes"}]}}]}"#;
        let record = AvroRecord::parse(schema).unwrap();
        let fields: Vec<(String, ColumnType)> = [
            ("colour", ColumnType::Text),
            ("again", ColumnType::Text),
            ("money", ColumnType::Numeric),
            ("tax", ColumnType::Numeric),
            ("id", ColumnType::Text),
            ("price", ColumnType::Numeric),
            ("ratio", ColumnType::Numeric),
            ("inner", ColumnType::Json),
        ]
        .map(|(n, t)| (n.to_owned(), t))
        .to_vec();
        let compiled = super::super::schema::CompiledSchema::Avro(record.clone());
        compiled.check_fields(&fields).unwrap();
        let json = r#"{"colour":"BLUE","again":"RED","money":"\u0004\u00ce","tax":"\u0000\u0007",
            "id":"\u0001\u0002\u0003\u0004\u0005\u0006\u0007\u0008\u0009\u000a\u000b\u000c\u000d\u000e\u000f\u0010",
            "price":"12.30","ratio":0.1,"inner":{"n":{"string":"hi"},"b":"\u0001\u0002"}}"#;
        let from_json = record.decode_json(json.as_bytes(), &fields).unwrap();
        let value = record
            .value(
                &serde_json::from_str(json).unwrap(),
                record.schema_for_tests(),
            )
            .unwrap();
        let binary =
            apache_avro::writer::datum::GenericDatumWriter::builder(record.schema_for_tests())
                .build()
                .unwrap()
                .write_value_to_vec(value)
                .unwrap();
        let from_binary = record.decode_binary(&binary, &fields).unwrap();
        assert_eq!(from_json, from_binary);
        assert_eq!(
            from_json,
            vec![
                TypedValue::Text("BLUE".into()),
                TypedValue::Text("RED".into()),
                TypedValue::Numeric("12.30".into()),
                TypedValue::Numeric("0.07".into()),
                TypedValue::Text("01020304-0506-0708-090a-0b0c0d0e0f10".into()),
                TypedValue::Numeric("12.30".into()),
                TypedValue::Numeric("0.1".into()),
                TypedValue::Json(r#"{"b":[1,2],"n":"hi"}"#.into()),
            ]
        );
    }
}
