//! A JSON payload decoded into a typed flow's fields (`decode: { format: json }`).
//!
//! The payload must be one JSON object; each field is read by name from its top level and
//! converted to the field's type, strictly and the same way for every store: a string where
//! a number is declared, a fraction where an integer is, a time that is not ISO 8601, are
//! errors naming the field's path (`$.amount`), and the message becomes a dead letter
//! ([`super::UNDECODABLE`]) instead of a row. A field that is absent or `null` is NULL. Numbers for
//! `numeric` keep their digits as written (no float on the way).

use super::values;
use base64::Engine as _;
use serde_json::value::RawValue;
use sluice_store::{ColumnType, TypedValue};
use std::collections::HashMap;

/// Decodes JSON payloads into the fields of a typed flow.
#[derive(Debug, Clone)]
pub struct JsonFields {
    fields: Vec<(String, ColumnType)>,
}

impl JsonFields {
    /// A decoder of these fields, in the order their values are returned.
    pub fn new(fields: Vec<(String, ColumnType)>) -> Self {
        Self { fields }
    }

    /// The values of the fields in `payload`, or why it does not decode.
    pub fn decode_payload(&self, payload: &[u8]) -> Result<Vec<TypedValue>, String> {
        let object: HashMap<String, &RawValue> = serde_json::from_slice(payload)
            .map_err(|e| format!("the payload is not a JSON object: {e}"))?;
        self.fields
            .iter()
            .map(|(name, ty)| match object.get(name) {
                None => Ok(TypedValue::Null),
                Some(raw) => convert(raw.get(), *ty).map_err(|why| format!("$.{name}: {why}")),
            })
            .collect()
    }
}

/// What a JSON text is, for messages.
pub(super) fn kind(raw: &str) -> &'static str {
    match raw.as_bytes().first() {
        Some(b'"') => "a string",
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

/// One JSON value (its text) as a value of `ty`.
pub(super) fn convert(raw: &str, ty: ColumnType) -> Result<TypedValue, String> {
    if raw == "null" {
        return Ok(TypedValue::Null);
    }
    let expected = |what: &str| format!("expected {what}, found {} {raw}", kind(raw));
    let string = || serde_json::from_str::<String>(raw).ok();
    let number = kind(raw) == "a number";
    Ok(match ty {
        ColumnType::Text => match string() {
            Some(text) => TypedValue::Text(text),
            None if number || kind(raw) == "a boolean" => TypedValue::Text(raw.to_owned()),
            None => return Err(expected("text (or a number or boolean)")),
        },
        ColumnType::Integer => TypedValue::Integer(
            raw.parse::<i64>()
                .map_err(|_| expected("an integer of 64 bits"))?,
        ),
        // A double beyond 64 bits' range (1e400) is refused, not taken for infinity.
        ColumnType::Double if number => TypedValue::Double(
            raw.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .ok_or_else(|| expected("a finite double"))?,
        ),
        ColumnType::Numeric if number => TypedValue::Numeric(raw.to_owned()),
        ColumnType::Boolean => match raw {
            "true" => TypedValue::Boolean(true),
            "false" => TypedValue::Boolean(false),
            _ => return Err(expected("a boolean")),
        },
        ColumnType::Timestamp => {
            let text = string().ok_or_else(|| expected("an ISO 8601 time (a string)"))?;
            values::timestamp_from_text(&text)
                .map_err(|_| expected("an ISO 8601 time in the years 0000 to 9999"))?
        }
        ColumnType::Date => {
            let text = string().ok_or_else(|| expected("a date YYYY-MM-DD (a string)"))?;
            values::date_from_text(&text).map_err(|_| expected("a date YYYY-MM-DD"))?
        }
        ColumnType::Json => TypedValue::Json(raw.to_owned()),
        ColumnType::Bytes => {
            let text = string().ok_or_else(|| expected("base64 (a string)"))?;
            TypedValue::Bytes(
                base64::engine::general_purpose::STANDARD
                    .decode(text.as_bytes())
                    .map_err(|_| expected("base64"))?
                    .into(),
            )
        }
        ColumnType::Double => return Err(expected("a double")),
        ColumnType::Numeric => return Err(expected("a numeric")),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn decoder() -> JsonFields {
        JsonFields::new(
            [
                ("order_id", ColumnType::Text),
                ("amount", ColumnType::Numeric),
                ("qty", ColumnType::Integer),
                ("ts", ColumnType::Timestamp),
                ("vip", ColumnType::Boolean),
                ("day", ColumnType::Date),
                ("extra", ColumnType::Json),
            ]
            .map(|(n, t)| (n.to_owned(), t))
            .to_vec(),
        )
    }

    #[test]
    fn fields_convert_exactly() {
        let values = decoder()
            .decode_payload(
                br#"{"order_id":"o-1","amount":12.30,"qty":3,"ts":"2026-12-04T10:00:00Z",
                     "vip":true,"day":"2026-12-04","extra":{"a":[1]},"ignored":1}"#,
            )
            .unwrap();
        assert_eq!(
            values,
            vec![
                TypedValue::Text("o-1".into()),
                TypedValue::Numeric("12.30".into()),
                TypedValue::Integer(3),
                TypedValue::Timestamp(1_796_378_400_000),
                TypedValue::Boolean(true),
                TypedValue::Date("2026-12-04".into()),
                TypedValue::Json(r#"{"a":[1]}"#.into()),
            ]
        );
        let values = decoder()
            .decode_payload(br#"{"order_id": 7, "qty": null}"#)
            .unwrap();
        assert_eq!(values[0], TypedValue::Text("7".into()));
        assert!(values[1..].iter().all(|v| *v == TypedValue::Null));
    }

    #[test]
    fn a_bad_value_names_its_field() {
        let bad = |payload: &str| decoder().decode_payload(payload.as_bytes()).unwrap_err();
        assert!(bad(r#"{"amount":"abc"}"#).starts_with("$.amount: expected a numeric"));
        assert!(bad(r#"{"qty":2.5}"#).starts_with("$.qty: expected an integer"));
        assert!(bad(r#"{"ts":"yesterday"}"#).starts_with("$.ts: expected an ISO 8601 time"));
        assert!(bad(r#"{"vip":"yes"}"#).starts_with("$.vip: expected a boolean"));
        let doubles = JsonFields::new(vec![("x".to_owned(), ColumnType::Double)]);
        assert!(
            doubles
                .decode_payload(br#"{"x":1e400}"#)
                .unwrap_err()
                .starts_with("$.x: expected a finite")
        );
        assert!(bad(r#"{"ts":"12026-01-01T00:00:00Z"}"#).starts_with("$.ts: expected"));
        assert!(bad("[1,2]").starts_with("the payload is not a JSON object"));
        assert!(bad("not json").starts_with("the payload is not a JSON object"));
    }
}
