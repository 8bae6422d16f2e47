//! One line of a JSONL file as a message: the record format of SPEC §4 ("File sources"), and
//! the dead-letter problems of a line that is not such a record.
//!
//! # Guarantee
//!
//! Every non-blank line becomes exactly one message: its record, or a problem (`undecodable`,
//! `missing_id`, `bad_timestamp`, `record_too_large`) keyed `FILE:LINE`, the same key each
//! time the line is read, whether the read starts at the file's beginning or at a checkpoint.

use crate::flow::delivery::{SourceMessage, SourceProblem};
use crate::flow::event_time::parse_event_time;
use base64::Engine;
use bytes::Bytes;
use serde_json::Value;
use std::collections::BTreeMap;

/// The reason of a line longer than the source's `max_record_bytes`.
pub(crate) const RECORD_TOO_LARGE: &str = "record_too_large";

/// Line `number` of `file` as a message; `None` for a blank line. `modified_ms` (the file's
/// modification time) is its publish time.
pub(crate) fn record(
    line: &[u8],
    file: &str,
    number: usize,
    modified_ms: i64,
) -> Option<SourceMessage> {
    let text = line.trim_ascii();
    if text.is_empty() {
        return None;
    }
    let message = match parse(text) {
        Ok(parsed) => SourceMessage {
            message_id: parsed.id,
            publish_time_ms: modified_ms,
            attributes: parsed.attributes,
            data: parsed.data,
            event_time_ms: parsed.event_time_ms,
            problem: None,
        },
        // Only a line that is not a record needs its position (its key) and its raw text.
        Err(problem) => not_a_record(problem, file, number, modified_ms, text),
    };
    Some(message)
}

/// Where a line over the limit lies, and how long it is.
pub(crate) struct LongLine<'a> {
    /// The file.
    pub(crate) file: &'a str,
    /// Its line number.
    pub(crate) number: usize,
    /// The byte offset in the file where the line starts.
    pub(crate) offset: u64,
    /// Its length in bytes (without the `\n`).
    pub(crate) len: u64,
    /// The limit it is over.
    pub(crate) max: usize,
}

/// A line longer than the limit as a `record_too_large` problem, carrying `head` (what was
/// kept of the line) as its data.
pub(crate) fn too_large(long: &LongLine<'_>, head: &[u8], modified_ms: i64) -> SourceMessage {
    let LongLine {
        file,
        number,
        offset,
        len,
        max,
    } = *long;
    let error = format!(
        "a line of {len} bytes at byte {offset}, over max_record_bytes {max}; its first {} \
         bytes are the dead letter's data",
        head.len()
    );
    not_a_record(
        problem(RECORD_TOO_LARGE, error),
        file,
        number,
        modified_ms,
        head,
    )
}

/// A line that is not a record, keyed `FILE:LINE`.
fn not_a_record(
    problem: SourceProblem,
    file: &str,
    number: usize,
    modified_ms: i64,
    data: &[u8],
) -> SourceMessage {
    let position = format!("{file}:{number}");
    SourceMessage {
        problem: Some(SourceProblem {
            reason: problem.reason,
            error: format!("{position}: {}", problem.error),
        }),
        message_id: position,
        publish_time_ms: modified_ms,
        attributes: BTreeMap::new(),
        data: Bytes::copy_from_slice(data),
        event_time_ms: None,
    }
}

struct Parsed {
    id: String,
    attributes: BTreeMap<String, String>,
    data: Bytes,
    event_time_ms: Option<i64>,
}

fn problem(reason: &'static str, error: impl Into<String>) -> SourceProblem {
    SourceProblem {
        reason,
        error: error.into(),
    }
}

fn parse(text: &[u8]) -> Result<Parsed, SourceProblem> {
    let value: Value = serde_json::from_slice(text)
        .map_err(|e| problem("undecodable", format!("not JSON: {e}")))?;
    let Value::Object(mut record) = value else {
        return Err(problem("undecodable", "a record must be a JSON object"));
    };
    let id = match record.remove("id") {
        Some(Value::String(id)) if !id.is_empty() => id,
        Some(Value::Number(id)) => id.to_string(),
        _ => return Err(problem("missing_id", "the record has no `id`")),
    };
    let attributes = match record.remove("attributes") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(map)) => map
            .into_iter()
            .map(|(k, v)| match v {
                Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect(),
        Some(_) => return Err(problem("undecodable", "`attributes` must be an object")),
    };
    let data = match record.remove("data") {
        None | Some(Value::Null) => Bytes::new(),
        Some(Value::String(encoded)) => base64::engine::general_purpose::STANDARD
            .decode(encoded.as_bytes())
            .map(Bytes::from)
            .map_err(|e| {
                problem(
                    "undecodable",
                    format!("`data` is a string but not base64: {e}"),
                )
            })?,
        Some(other) => Bytes::from(other.to_string()),
    };
    let event_time_ms = match record.remove("event_time") {
        None | Some(Value::Null) => None,
        Some(Value::Number(ms)) => Some(ms.as_i64().ok_or_else(|| {
            problem(
                "bad_timestamp",
                format!("`event_time` {ms} is not whole milliseconds"),
            )
        })?),
        Some(Value::String(text)) => Some(parse_event_time(&text).ok_or_else(|| {
            problem(
                "bad_timestamp",
                format!("`event_time` {text:?} is neither ms since epoch nor RFC 3339"),
            )
        })?),
        Some(other) => {
            return Err(problem(
                "bad_timestamp",
                format!("`event_time` {other} is neither ms since epoch nor RFC 3339"),
            ));
        }
    };
    Ok(Parsed {
        id,
        attributes,
        data,
        event_time_ms,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn one(line: &str) -> SourceMessage {
        record(line.as_bytes(), "f.jsonl", 7, 1_000).unwrap()
    }

    #[test]
    fn records_of_every_shape() {
        let m = one(
            r#"{"id":"a","data":{"x":1},"attributes":{"k":"v","n":2},"event_time":"1970-01-01T00:00:02Z"}"#,
        );
        assert_eq!(m.message_id, "a");
        assert_eq!(&m.data[..], br#"{"x":1}"#);
        assert_eq!(m.attributes["k"], "v");
        assert_eq!(m.attributes["n"], "2");
        assert_eq!(m.event_time_ms, Some(2_000));
        assert_eq!(m.publish_time_ms, 1_000);
        assert!(m.problem.is_none());

        let m = one(r#"{"id": 12, "data": "aGVsbG8=", "event_time": 5}"#);
        assert_eq!((m.message_id.as_str(), &m.data[..]), ("12", &b"hello"[..]));
        assert_eq!(m.event_time_ms, Some(5));

        let m = one(r#"{"id":"b"}"#);
        assert_eq!((m.event_time_ms, m.data.len()), (None, 0));
        assert!(record(b"  \r\n", "f", 1, 0).is_none());
    }

    #[test]
    fn bad_lines_become_problems_keyed_by_position() {
        for (line, reason) in [
            ("not json", "undecodable"),
            ("[1,2]", "undecodable"),
            (r#"{"data":"x"}"#, "missing_id"),
            (r#"{"id":"a","data":"%%%"}"#, "undecodable"),
            (r#"{"id":"a","attributes":[1]}"#, "undecodable"),
            (r#"{"id":"a","event_time":"yesterday"}"#, "bad_timestamp"),
            (r#"{"id":"a","event_time":1.5}"#, "bad_timestamp"),
        ] {
            let m = one(line);
            let problem = m.problem.expect(line);
            assert_eq!(problem.reason, reason, "{line}");
            assert!(
                problem.error.starts_with("f.jsonl:7: "),
                "{}",
                problem.error
            );
            assert_eq!(m.message_id, "f.jsonl:7", "{line}");
            assert_eq!(&m.data[..], line.as_bytes());
        }
    }

    #[test]
    fn a_line_over_the_limit_is_a_problem_keyed_by_position() {
        let long = LongLine {
            file: "f.jsonl",
            number: 7,
            offset: 120,
            len: 5000,
            max: 1024,
        };
        let m = too_large(&long, b"{\"id\":", 1_000);
        let problem = m.problem.unwrap();
        assert_eq!(problem.reason, RECORD_TOO_LARGE);
        assert_eq!(
            problem.error,
            "f.jsonl:7: a line of 5000 bytes at byte 120, over max_record_bytes 1024; its \
             first 6 bytes are the dead letter's data"
        );
        assert_eq!(m.message_id, "f.jsonl:7");
        assert_eq!((&m.data[..], m.publish_time_ms), (&b"{\"id\":"[..], 1_000));
    }
}
