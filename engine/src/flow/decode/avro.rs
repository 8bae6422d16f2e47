//! Avro payloads (`decode: { format: avro }`): a record's top-level fields as a typed flow's
//! fields, from the binary encoding (one datum, as Pub/Sub carries it: no container header)
//! read by Apache's `apache-avro`, or from Avro's JSON encoding (`avro_json.rs`).
//!
//! Each field is read by name and converted to its column's type strictly: a value of another
//! kind is an error naming `$.field`; a field the schema does not have, or a null, is NULL.
//! Logical types land as what they mean: `timestamp-*` as times, `date` as dates, `decimal` as
//! its digits (scale kept). A binary payload with bytes left over after the datum is refused.

use super::values;
use apache_avro::Schema;
use apache_avro::schema::ResolvedSchema;
use apache_avro::types::Value;
use sluice_store::{ColumnType, TypedValue};
use std::collections::HashMap;

/// A parsed Avro schema whose top level is a record.
#[derive(Debug, Clone)]
pub struct AvroRecord {
    schema: Schema,
    /// Its named types by full name, for fields that name a type defined earlier.
    names: HashMap<String, Schema>,
}

impl AvroRecord {
    /// Parses an Avro schema (`.avsc` text); its top level must be a record.
    pub fn parse(definition: &str) -> Result<Self, String> {
        let schema =
            Schema::parse_str(definition).map_err(|e| format!("not an Avro schema: {e}"))?;
        if !matches!(schema, Schema::Record(_)) {
            return Err("an Avro schema for a typed flow is a record".to_owned());
        }
        let names = ResolvedSchema::try_from(&schema)
            .map_err(|e| format!("not an Avro schema: {e}"))?
            .get_names()
            .iter()
            .map(|(name, named)| (name.fullname(None), (*named).clone()))
            .collect();
        Ok(Self { schema, names })
    }

    /// `schema`, or the named type it refers to.
    pub(super) fn resolve<'a>(&'a self, schema: &'a Schema) -> &'a Schema {
        match schema {
            Schema::Ref { name } => self.names.get(&name.fullname(None)).unwrap_or(schema),
            _ => schema,
        }
    }

    /// The whole schema (for tests that write datums of it).
    #[cfg(test)]
    pub(super) fn schema_for_tests(&self) -> &Schema {
        &self.schema
    }

    /// The record's fields with their schemas.
    pub(super) fn fields(&self) -> &[apache_avro::schema::RecordField] {
        match &self.schema {
            Schema::Record(record) => &record.fields,
            _ => &[],
        }
    }

    /// The schema of field `name` (a named type resolved), if the record has it.
    pub(super) fn field(&self, name: &str) -> Option<&Schema> {
        self.fields()
            .iter()
            .find(|f| f.name == name)
            .map(|f| self.resolve(&f.schema))
    }

    /// The values of `fields` in a binary-encoded datum.
    pub fn decode_binary(
        &self,
        data: &[u8],
        fields: &[(String, ColumnType)],
    ) -> Result<Vec<TypedValue>, String> {
        let mut input = EndWatch {
            rest: data,
            ran_out: false,
        };
        let value = apache_avro::reader::datum::GenericDatumReader::builder(&self.schema)
            .build()
            .and_then(|reader| reader.read_value(&mut input))
            .map_err(|e| format!("not an Avro datum of this schema: {e}"))?;
        // The reader takes a datum cut short for nulls (it reads containers that way): a read
        // past the end is an error here.
        if input.ran_out {
            return Err("not an Avro datum of this schema: it ends inside the record".to_owned());
        }
        if !input.rest.is_empty() {
            return Err(format!(
                "not an Avro datum of this schema: {} bytes left after the record",
                input.rest.len()
            ));
        }
        let Value::Record(record) = value else {
            return Err("not an Avro record".to_owned());
        };
        fields
            .iter()
            .map(
                |(name, ty)| match (record.iter().find(|(n, _)| n == name), self.field(name)) {
                    (Some((_, value)), Some(schema)) => self
                        .convert(value, schema, *ty)
                        .map_err(|why| format!("$.{name}: {why}")),
                    _ => Ok(TypedValue::Null),
                },
            )
            .collect()
    }
}

/// A payload being read, which remembers a read past its end.
struct EndWatch<'a> {
    rest: &'a [u8],
    ran_out: bool,
}

impl std::io::Read for EndWatch<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.rest.len() < buf.len() {
            self.ran_out = true;
        }
        self.rest.read(buf)
    }
}

/// What an Avro value is, for messages.
fn kind(value: &Value) -> String {
    let text = format!("{value:?}");
    match text.split_once('(') {
        Some((kind, _)) => kind.to_lowercase(),
        None => text.to_lowercase(),
    }
}

impl AvroRecord {
    /// One Avro value of `schema` as a value of `ty`.
    pub(super) fn convert(
        &self,
        value: &Value,
        schema: &Schema,
        ty: ColumnType,
    ) -> Result<TypedValue, String> {
        let schema = self.resolve(schema);
        if let (Value::Union(branch, inner), Schema::Union(union)) = (value, schema) {
            let variant = union
                .variants()
                .get(*branch as usize)
                .ok_or("a union branch the schema does not have")?;
            return self.convert(inner, variant, ty);
        }
        if matches!(value, Value::Null) {
            return Ok(TypedValue::Null);
        }
        scalar(value, schema, ty)
    }
}

/// A value that is not a union nor null, of `schema` (resolved), as a value of `ty`.
fn scalar(value: &Value, schema: &Schema, ty: ColumnType) -> Result<TypedValue, String> {
    let expected = |what: &str| format!("expected {what}, found {}", kind(value));
    match ty {
        ColumnType::Text => match value {
            Value::String(s) | Value::Enum(_, s) => Ok(TypedValue::Text(s.clone())),
            Value::Uuid(u) => Ok(TypedValue::Text(u.to_string())),
            Value::Int(i) => Ok(TypedValue::Text(i.to_string())),
            Value::Long(i) => Ok(TypedValue::Text(i.to_string())),
            Value::Boolean(b) => Ok(TypedValue::Text(b.to_string())),
            _ => Err(expected("a string")),
        },
        ColumnType::Integer => match value {
            Value::Int(i) => Ok(TypedValue::Integer(i64::from(*i))),
            Value::Long(i) => Ok(TypedValue::Integer(*i)),
            _ => Err(expected("an int or a long")),
        },
        ColumnType::Double => match value {
            Value::Float(x) => values::double(f64::from(*x)),
            Value::Double(x) => values::double(*x),
            Value::Int(i) => Ok(TypedValue::Double(f64::from(*i))),
            _ => Err(expected("a float or a double")),
        },
        ColumnType::Numeric => match (value, schema) {
            (Value::Decimal(decimal), Schema::Decimal(decimal_schema)) => {
                let unscaled = num_bigint::BigInt::from(decimal.clone()).to_string();
                Ok(values::numeric_from_unscaled(
                    &unscaled,
                    decimal_schema.scale,
                ))
            }
            (Value::Int(i), _) => Ok(TypedValue::Numeric(i.to_string())),
            (Value::Long(i), _) => Ok(TypedValue::Numeric(i.to_string())),
            (Value::Float(x), _) => values::numeric_from_f32(*x),
            (Value::Double(x), _) => values::numeric_from_float(*x),
            (Value::String(s), _) => values::numeric_from_text(s),
            _ => Err(expected("a decimal")),
        },
        ColumnType::Boolean => match value {
            Value::Boolean(b) => Ok(TypedValue::Boolean(*b)),
            _ => Err(expected("a boolean")),
        },
        ColumnType::Timestamp => match value {
            Value::TimestampMillis(ms) | Value::LocalTimestampMillis(ms) => values::timestamp(*ms),
            Value::TimestampMicros(us) | Value::LocalTimestampMicros(us) => {
                values::timestamp(us.div_euclid(1_000))
            }
            Value::TimestampNanos(ns) | Value::LocalTimestampNanos(ns) => {
                values::timestamp(ns.div_euclid(1_000_000))
            }
            Value::String(s) => values::timestamp_from_text(s),
            _ => Err(expected("a timestamp")),
        },
        ColumnType::Date => match value {
            Value::Date(days) => values::date_from_days(i64::from(*days)),
            Value::String(s) => values::date_from_text(s),
            _ => Err(expected("a date")),
        },
        ColumnType::Json => serde_json::Value::try_from(value.clone())
            .map(|json| TypedValue::Json(json.to_string()))
            .map_err(|e| format!("not representable as JSON: {e}")),
        ColumnType::Bytes => match value {
            Value::Bytes(b) | Value::Fixed(_, b) => Ok(TypedValue::Bytes(b.clone().into())),
            _ => Err(expected("bytes")),
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use apache_avro::types::Record;

    pub(crate) const ORDERS: &str = r#"{"type":"record","name":"Order","fields":[
        {"name":"order_id","type":"string"},
        {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}},
        {"name":"qty","type":"int"},
        {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
        {"name":"note","type":["null","string"],"default":null}]}"#;

    fn fields() -> Vec<(String, ColumnType)> {
        [
            ("order_id", ColumnType::Text),
            ("amount", ColumnType::Numeric),
            ("qty", ColumnType::Integer),
            ("ts", ColumnType::Timestamp),
            ("note", ColumnType::Text),
            ("absent", ColumnType::Text),
        ]
        .map(|(n, t)| (n.to_owned(), t))
        .to_vec()
    }

    fn datum(record: &AvroRecord, note: Option<&str>) -> Vec<u8> {
        let mut r = Record::new(&record.schema).unwrap();
        r.put("order_id", "o-1");
        r.put(
            "amount",
            Value::Decimal(apache_avro::Decimal::from(1230_i64.to_be_bytes().to_vec())),
        );
        r.put("qty", 3);
        r.put("ts", Value::TimestampMillis(1_796_378_400_000));
        r.put(
            "note",
            match note {
                Some(n) => Value::Union(1, Box::new(Value::String(n.into()))),
                None => Value::Union(0, Box::new(Value::Null)),
            },
        );
        apache_avro::writer::datum::GenericDatumWriter::builder(&record.schema)
            .build()
            .unwrap()
            .write_value_to_vec(r)
            .unwrap()
    }

    #[test]
    fn a_binary_datum_lands_its_typed_values() {
        let record = AvroRecord::parse(ORDERS).unwrap();
        let values = record
            .decode_binary(&datum(&record, Some("gift")), &fields())
            .unwrap();
        assert_eq!(
            values,
            vec![
                TypedValue::Text("o-1".into()),
                TypedValue::Numeric("12.30".into()),
                TypedValue::Integer(3),
                TypedValue::Timestamp(1_796_378_400_000),
                TypedValue::Text("gift".into()),
                TypedValue::Null,
            ]
        );
        let values = record
            .decode_binary(&datum(&record, None), &fields())
            .unwrap();
        assert_eq!(values[4], TypedValue::Null);
    }

    #[test]
    fn a_corrupt_datum_or_a_wrong_type_is_refused() {
        let record = AvroRecord::parse(ORDERS).unwrap();
        let good = datum(&record, Some("gift"));
        // Cut inside the last string, and just before the union's branch.
        for cut in [good.len() - 3, good.len() - 6] {
            let why = record.decode_binary(&good[..cut], &fields()).unwrap_err();
            assert!(why.contains("ends inside the record"), "{why}");
        }
        let mut longer = good.clone();
        longer.push(0);
        let why = record.decode_binary(&longer, &fields()).unwrap_err();
        assert!(why.contains("left after the record"), "{why}");
        let why = record
            .decode_binary(&good, &[("order_id".to_owned(), ColumnType::Integer)])
            .unwrap_err();
        assert!(why.starts_with("$.order_id: expected an int"), "{why}");
        assert!(AvroRecord::parse(r#""string""#).is_err());
    }
}
