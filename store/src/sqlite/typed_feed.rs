//! A typed table read as a feed on SQLite (see `crate::feed`): the same rows, order and
//! positions as an envelope table's, through a relation that gives sluice's own columns their
//! envelope names and the declared columns as one JSON object in `data` (what a reading flow
//! decodes its fields from), each value as the JSON decoder reads its type back: times and
//! dates as their ISO 8601 text, booleans as `true`/`false`, doubles and numerics as numbers
//! (shortest text that reads back the same double), `bytes` in base64, `json` nested;
//! attributes `{}` (a typed row has none).

use crate::StoreError;
use crate::typed::{RESERVED, TYPED_MARK};
use base64::Engine as _;
use rusqlite::Connection;
use rusqlite::functions::{Context, FunctionFlags};
use rusqlite::types::{Value, ValueRef};

/// Columns per `json_object` call, well under SQLite's limit on a function's arguments; the
/// objects are merged with `json_patch` (a NULL there leaves the key out, which the decoder
/// reads as NULL alike).
const COLUMNS_PER_OBJECT: usize = 40;

/// The SQL function turning a stored value into its JSON text, by the column's declared type.
const JSON_OF: &str = "sluice_feed_json";

/// Registers [`JSON_OF`] on `conn`.
pub(super) fn register(conn: &Connection) -> rusqlite::Result<()> {
    let flags = FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC;
    conn.create_scalar_function(JSON_OF, 2, flags, |ctx: &Context<'_>| {
        let declared: String = ctx.get(0)?;
        Ok(json_of(&declared, ctx.get_raw(1)))
    })
}

/// `value` of a column declared `declared` as JSON text (`NULL` for NULL).
fn json_of(declared: &str, value: ValueRef<'_>) -> Value {
    let json = match (declared, value) {
        (_, ValueRef::Null) => return Value::Null,
        ("BOOLEAN", ValueRef::Integer(n)) => serde_json::Value::Bool(n != 0),
        ("BLOB", ValueRef::Blob(bytes)) => {
            serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
        // Valid JSON is passed on as written (its numbers keep their digits).
        ("JSON TEXT", ValueRef::Text(text))
            if serde_json::from_slice::<&serde_json::value::RawValue>(text).is_ok() =>
        {
            return Value::Text(String::from_utf8_lossy(text).into_owned());
        }
        (_, ValueRef::Integer(n)) => serde_json::Value::from(n),
        // A non-finite double has no JSON form: null.
        (_, ValueRef::Real(x)) => serde_json::Value::from(x),
        (_, ValueRef::Text(text)) => {
            serde_json::Value::String(String::from_utf8_lossy(text).into_owned())
        }
        (_, ValueRef::Blob(bytes)) => {
            serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    };
    Value::Text(json.to_string())
}

/// What the feed's statements read `table` through (spliced after `FROM`).
pub(crate) fn relation(conn: &Connection, table: &str) -> Result<String, StoreError> {
    let mut statement = conn.prepare_cached("SELECT name, type FROM pragma_table_info(?1)")?;
    let columns = statement
        .query_map([table], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    if !columns.iter().any(|(name, _)| name == TYPED_MARK) {
        return Ok(format!("\"{table}\""));
    }
    if columns.iter().any(|(name, _)| name == "_sluice_deleted_at") {
        return Err(crate::typed::refuse_feed_of_keyed(table));
    }
    let pairs: Vec<String> = columns
        .iter()
        .filter(|(name, _)| !name.starts_with(RESERVED))
        .map(|(name, declared)| {
            format!(
                "'{}', json({JSON_OF}('{}', \"{}\"))",
                name.replace('\'', "''"),
                declared.replace('\'', "''"),
                name.replace('"', "\"\"")
            )
        })
        .collect();
    let object = pairs
        .chunks(COLUMNS_PER_OBJECT)
        .map(|chunk| format!("json_object({})", chunk.join(", ")))
        .reduce(|merged, next| format!("json_patch({merged}, {next})"))
        .unwrap_or_else(|| "json_object()".to_owned());
    Ok(format!(
        "(SELECT _sluice_seq AS seq, _sluice_flow AS flow, _sluice_dedup_key AS dedup_key,
                 _sluice_message_id AS message_id, _sluice_publish_time AS publish_time,
                 _sluice_event_time AS event_time, '{{}}' AS attributes,
                 CAST({object} AS BLOB) AS data, _sluice_committed_at AS committed_at
          FROM \"{table}\") AS feed"
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn values_read_back_as_the_decoder_reads_their_type() {
        let text = |v: Value| match v {
            Value::Text(t) => t,
            other => panic!("{other:?}"),
        };
        assert_eq!(text(json_of("BOOLEAN", ValueRef::Integer(1))), "true");
        assert_eq!(
            text(json_of("BLOB", ValueRef::Blob(b"\x00\xff"))),
            "\"AP8=\""
        );
        assert_eq!(
            text(json_of("JSON TEXT", ValueRef::Text(br#"{"a":[1]}"#))),
            r#"{"a":[1]}"#
        );
        assert_eq!(
            text(json_of("DOUBLE", ValueRef::Real(0.1 + 0.2))),
            "0.30000000000000004"
        );
        assert_eq!(text(json_of("NUMERIC", ValueRef::Integer(12))), "12");
        assert_eq!(
            text(json_of(
                "TIMESTAMP TEXT",
                ValueRef::Text(b"2026-12-04T10:00:00.000Z")
            )),
            "\"2026-12-04T10:00:00.000Z\""
        );
        assert_eq!(json_of("TEXT", ValueRef::Null), Value::Null);
    }
}
