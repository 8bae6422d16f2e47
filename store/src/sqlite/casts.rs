//! Sluice's strict casts on SQLite: `sluice_cast_<type>(x)` for the nine column types, which a
//! flow's `CAST(x AS type)` becomes on SQLite (`pipeline/src/expression/render.rs`).
//!
//! SQLite's own `CAST('abc' AS INTEGER)` is 0; PostgreSQL's is an error. And
//! `sluice_nonzero(x)`, a divisor that fails at 0 as PostgreSQL's division does (SQLite's
//! gives NULL). These functions fail
//! where PostgreSQL's cast fails for the forms people write (numbers as text, `true`/`false`,
//! ISO 8601 times and dates, JSON text, `\x` hex bytes), and give what PostgreSQL gives
//! otherwise, as SQLite stores that type (`crate::typed`): a failing record is then a dead
//! letter on both stores, never a silent 0 on one of them. NULL casts to NULL.

use crate::typed::iso_millis;
use rusqlite::Connection;
use rusqlite::functions::{Context, FunctionFlags};
use rusqlite::types::{Value, ValueRef};

/// One cast: a non-NULL value to the type's value, or why it does not fit.
type Cast = fn(ValueRef<'_>) -> Result<Value, String>;

/// Registers the casts on `conn`.
pub(super) fn register(conn: &Connection) -> rusqlite::Result<()> {
    let flags = FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC;
    let casts: [(&str, Cast); 9] = [
        ("text", to_text),
        ("integer", to_integer),
        ("double", to_double),
        ("numeric", to_numeric),
        ("boolean", to_boolean),
        ("timestamp", to_timestamp),
        ("date", to_date),
        ("json", to_json),
        ("bytes", to_bytes),
    ];
    conn.create_scalar_function("sluice_nonzero", 1, flags, |ctx: &Context<'_>| {
        match ctx.get_raw(0) {
            value @ (ValueRef::Integer(_) | ValueRef::Real(_))
                if matches!(value, ValueRef::Integer(0))
                    || matches!(value, ValueRef::Real(x) if x.abs() == 0.0) =>
            {
                Err(rusqlite::Error::UserFunctionError(
                    "division by zero".into(),
                ))
            }
            value => Ok(Value::from(value)),
        }
    })?;
    for (name, cast) in casts {
        conn.create_scalar_function(
            format!("sluice_cast_{name}").as_str(),
            1,
            flags,
            move |ctx: &Context<'_>| match ctx.get_raw(0) {
                ValueRef::Null => Ok(Value::Null),
                value => cast(value)
                    .map_err(|message| rusqlite::Error::UserFunctionError(message.into())),
            },
        )?;
    }
    Ok(())
}

fn invalid(ty: &str, value: ValueRef<'_>) -> String {
    let shown = match value {
        ValueRef::Text(t) => format!("\"{}\"", String::from_utf8_lossy(t)),
        ValueRef::Integer(n) => n.to_string(),
        ValueRef::Real(x) => x.to_string(),
        ValueRef::Blob(_) => "bytes".to_owned(),
        ValueRef::Null => "NULL".to_owned(),
    };
    format!("invalid input for type {ty}: {shown}")
}

fn text_of(value: ValueRef<'_>) -> Option<&str> {
    match value {
        ValueRef::Text(t) => std::str::from_utf8(t).ok(),
        _ => None,
    }
}

fn to_text(value: ValueRef<'_>) -> Result<Value, String> {
    Ok(Value::Text(match value {
        ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
        ValueRef::Integer(n) => n.to_string(),
        ValueRef::Real(x) => x.to_string(),
        ValueRef::Blob(b) => {
            let hex: String = b.iter().map(|byte| format!("{byte:02x}")).collect();
            format!("\\x{hex}")
        }
        ValueRef::Null => return Ok(Value::Null),
    }))
}

fn to_integer(value: ValueRef<'_>) -> Result<Value, String> {
    match value {
        ValueRef::Integer(n) => Ok(Value::Integer(n)),
        // As PostgreSQL casts a numeric (SQLite's numeric values are stored as floats): half
        // away from zero.
        ValueRef::Real(x) => {
            let rounded = x.round();
            if rounded.is_finite() && rounded.abs() < 9.2e18 {
                Ok(Value::Integer(rounded as i64))
            } else {
                Err(format!("{x} is out of range for type integer"))
            }
        }
        _ => text_of(value)
            .and_then(|t| t.trim().parse::<i64>().ok())
            .map(Value::Integer)
            .ok_or_else(|| invalid("integer", value)),
    }
}

fn to_double(value: ValueRef<'_>) -> Result<Value, String> {
    match value {
        ValueRef::Integer(n) => Ok(Value::Real(n as f64)),
        ValueRef::Real(x) => Ok(Value::Real(x)),
        _ => text_of(value)
            .map(str::trim)
            .filter(|t| is_decimal(t))
            .and_then(|t| t.parse::<f64>().ok())
            .map(Value::Real)
            .ok_or_else(|| invalid("double", value)),
    }
}

fn to_numeric(value: ValueRef<'_>) -> Result<Value, String> {
    match value {
        ValueRef::Integer(n) => Ok(Value::Integer(n)),
        ValueRef::Real(x) => Ok(Value::Real(x)),
        _ => {
            let text = text_of(value)
                .map(str::trim)
                .filter(|t| is_decimal(t))
                .ok_or_else(|| invalid("numeric", value))?;
            Ok(match text.parse::<i64>() {
                Ok(n) => Value::Integer(n),
                Err(_) => Value::Real(text.parse::<f64>().map_err(|_| invalid("numeric", value))?),
            })
        }
    }
}

/// `[+-]digits[.digits][e[+-]digits]`, as PostgreSQL reads a number (no `inf`, no hex).
fn is_decimal(text: &str) -> bool {
    let body = text.strip_prefix(['+', '-']).unwrap_or(text);
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(at) => (&body[..at], Some(&body[at + 1..])),
        None => (body, None),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok =
        !(whole.is_empty() && fraction.is_empty()) && digits(whole) && digits(fraction);
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['+', '-']).unwrap_or(e);
        !e.is_empty() && digits(e)
    });
    mantissa_ok && exponent_ok
}

fn to_boolean(value: ValueRef<'_>) -> Result<Value, String> {
    match value {
        ValueRef::Integer(n) => Ok(Value::Integer(i64::from(n != 0))),
        _ => {
            let word = text_of(value)
                .map(|t| t.trim().to_ascii_lowercase())
                .ok_or_else(|| invalid("boolean", value))?;
            match word.as_str() {
                "t" | "true" | "y" | "yes" | "on" | "1" => Ok(Value::Integer(1)),
                "f" | "false" | "n" | "no" | "off" | "0" => Ok(Value::Integer(0)),
                _ => Err(invalid("boolean", value)),
            }
        }
    }
}

/// An ISO 8601 time: with an offset (`2026-12-04T10:00:00Z`, `+01:00`), or without one, read
/// as UTC (`2026-12-04 10:00:00.5`, `2026-12-04`).
pub(crate) fn parse_instant(text: &str) -> Option<i64> {
    let text = text.trim();
    if let Ok(instant) = text.parse::<jiff::Timestamp>() {
        return Some(instant.as_millisecond());
    }
    if let Ok(civil) = text.parse::<jiff::civil::DateTime>() {
        return civil
            .to_zoned(jiff::tz::TimeZone::UTC)
            .ok()
            .map(|z| z.timestamp().as_millisecond());
    }
    text.parse::<jiff::civil::Date>()
        .ok()
        .and_then(|d| d.to_zoned(jiff::tz::TimeZone::UTC).ok())
        .map(|z| z.timestamp().as_millisecond())
}

fn to_timestamp(value: ValueRef<'_>) -> Result<Value, String> {
    text_of(value)
        .and_then(parse_instant)
        .and_then(iso_millis)
        .map(Value::Text)
        .ok_or_else(|| invalid("timestamp", value))
}

fn to_date(value: ValueRef<'_>) -> Result<Value, String> {
    let text = text_of(value).map(str::trim).unwrap_or_default();
    let date = text
        .parse::<jiff::civil::Date>()
        .ok()
        .or_else(|| text.parse::<jiff::civil::DateTime>().ok().map(|d| d.date()))
        .or_else(|| {
            parse_instant(text)
                .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
                .map(|t| t.to_zoned(jiff::tz::TimeZone::UTC).date())
        });
    date.map(|d| Value::Text(d.to_string()))
        .ok_or_else(|| invalid("date", value))
}

fn to_json(value: ValueRef<'_>) -> Result<Value, String> {
    let text = text_of(value).ok_or_else(|| invalid("json", value))?;
    serde_json::from_str::<serde_json::Value>(text)
        .map(|_| Value::Text(text.to_owned()))
        .map_err(|e| format!("invalid input for type json: {e}"))
}

fn to_bytes(value: ValueRef<'_>) -> Result<Value, String> {
    match value {
        ValueRef::Blob(b) => Ok(Value::Blob(b.to_vec())),
        _ => {
            let text = text_of(value).ok_or_else(|| invalid("bytes", value))?;
            match text.strip_prefix("\\x") {
                Some(hex) => decode_hex(hex)
                    .map(Value::Blob)
                    .ok_or_else(|| invalid("bytes", value)),
                None if !text.contains('\\') => Ok(Value::Blob(text.as_bytes().to_vec())),
                None => Err(invalid("bytes", value)),
            }
        }
    }
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn cast(conn: &Connection, sql: &str) -> Result<Value, String> {
        conn.query_row(&format!("SELECT {sql}"), [], |r| r.get::<_, Value>(0))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn casts_fail_where_postgres_fails() {
        let conn = Connection::open_in_memory().unwrap();
        register(&conn).unwrap();
        assert_eq!(
            cast(&conn, "sluice_cast_integer('42')"),
            Ok(Value::Integer(42))
        );
        assert_eq!(
            cast(&conn, "sluice_cast_integer(2.5)"),
            Ok(Value::Integer(3))
        );
        assert!(
            cast(&conn, "7 / sluice_nonzero(0)")
                .unwrap_err()
                .contains("division by zero")
        );
        assert!(cast(&conn, "7 / sluice_nonzero(0.0)").is_err());
        assert_eq!(cast(&conn, "7 / sluice_nonzero(2)"), Ok(Value::Integer(3)));
        assert!(
            cast(&conn, "sluice_cast_integer('abc')")
                .unwrap_err()
                .contains("integer")
        );
        assert_eq!(
            cast(&conn, "sluice_cast_numeric('12.5')"),
            Ok(Value::Real(12.5))
        );
        assert!(cast(&conn, "sluice_cast_numeric('12,5')").is_err());
        assert!(cast(&conn, "sluice_cast_double('inf')").is_err());
        assert_eq!(
            cast(&conn, "sluice_cast_boolean('yes')"),
            Ok(Value::Integer(1))
        );
        assert!(cast(&conn, "sluice_cast_boolean('maybe')").is_err());
        assert_eq!(
            cast(&conn, "sluice_cast_timestamp('2026-12-04T10:00:00+01:00')"),
            Ok(Value::Text("2026-12-04T09:00:00.000Z".to_owned()))
        );
        assert_eq!(
            cast(&conn, "sluice_cast_timestamp('2026-12-04')"),
            Ok(Value::Text("2026-12-04T00:00:00.000Z".to_owned()))
        );
        assert!(cast(&conn, "sluice_cast_timestamp('yesterday')").is_err());
        assert_eq!(
            cast(&conn, "sluice_cast_date('2026-12-04T23:00:00Z')"),
            Ok(Value::Text("2026-12-04".to_owned()))
        );
        assert!(cast(&conn, "sluice_cast_json('{')").is_err());
        assert_eq!(
            cast(&conn, "sluice_cast_bytes('\\x6869')"),
            Ok(Value::Blob(b"hi".to_vec()))
        );
        assert_eq!(cast(&conn, "sluice_cast_text(NULL)"), Ok(Value::Null));
        assert_eq!(
            cast(&conn, "sluice_cast_text(7)"),
            Ok(Value::Text("7".to_owned()))
        );
    }
}
