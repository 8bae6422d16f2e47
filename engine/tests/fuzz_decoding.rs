//! Bounded property-based fuzzing (proptest) of message decoding: the JSONL file records of
//! [`FileSource`] (driven through a real temporary file), [`parse_event_time`], and
//! [`TableStage`] (driven with deliveries from a [`BatchSource`]).
//!
//! Inputs: arbitrary bytes (invalid UTF-8 included), records built from random JSON with every
//! shape of `id` (NUL and control characters, numbers, wrong types), `attributes`, `data` and
//! `event_time` (numbers out of the `i64` range, timestamps of every shape), byte mutations of
//! such records, and absurd ones: 10 000 attributes, payloads of a few MB, deep nesting.
//!
//! Properties:
//! - a file line never panics the source, and every non-blank line becomes exactly one message,
//!   in order: the record it encodes (id, attributes, data and event time as the format says),
//!   or a dead-letter problem whose reason is `undecodable`, `missing_id` or `bad_timestamp`,
//!   with a non-empty error, keyed and prefixed by `FILE:LINE`, carrying the raw line; with a
//!   small `max_record_bytes` (1 to 300), a line over it is instead a `record_too_large`
//!   problem keyed `FILE:LINE` carrying its first bytes, and the lines after it are read as
//!   before;
//! - `parse_event_time` never panics, round-trips every `i64` of milliseconds written as an
//!   integer, and reads RFC 3339 timestamps (any offset, `T`/`t`/space, fractions) to the
//!   instant an independent calendar computation gives;
//! - `TableStage` gives exactly one effect per delivery, in order, with the event time from the
//!   record, the attribute or the publish time, and dead letters with a non-empty reason and
//!   error (the batcher adds `unstorable` for U+0000, `connector/src/storable.rs`); end to end,
//!   every line of a file becomes exactly one row or one dead letter.
//!
//! Bound: at most 256 cases per property; 4 to 8 for the multi-MB and 10 000-attribute ones; no
//! failure persistence (nothing is written into the repository). About 10 s in a debug build.
//! A failure prints the minimal input; `PROPTEST_RNG_SEED` replays a run.
#![allow(clippy::unwrap_used, missing_docs)]

use base64::Engine;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::Config;
use serde_json::{Map, Number, Value};
use sluice_engine::{
    BatchSettings, BatchSource, Budget, Counters, DEFAULT_MAX_RECORD_BYTES, DedupSettings,
    FileSource, InProcessSource, KeySource, MessageSource, SourceMessage, SourceProblem, Stage,
    TableStage, parse_event_time,
};
use sluice_store::Effect;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The reasons a file source gives a line it cannot deliver as a record.
const REASONS: [&str; 4] = [
    "undecodable",
    "missing_id",
    "bad_timestamp",
    "record_too_large",
];

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

// ---------------------------------------------------------------------------------------------
// Driving the file source
// ---------------------------------------------------------------------------------------------

/// A JSONL file in its own temporary directory.
struct JsonlFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
    modified_ms: i64,
}

fn write_file(content: &[u8]) -> JsonlFile {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.jsonl");
    std::fs::write(&path, content).unwrap();
    let modified_ms = std::fs::metadata(&path)
        .unwrap()
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    JsonlFile {
        _dir: dir,
        path,
        modified_ms: i64::try_from(modified_ms).unwrap(),
    }
}

fn file_source(file: &JsonlFile, max_record_bytes: u64) -> FileSource {
    FileSource::new(file.path.display().to_string()).max_record_bytes(max_record_bytes)
}

/// Every message the file source delivers for `file`, in order.
async fn read_messages(file: &JsonlFile, max_record_bytes: u64) -> Vec<SourceMessage> {
    let source = file_source(file, max_record_bytes);
    let progress = source.progress();
    let (intake, mut received) = tokio::sync::mpsc::channel(1024);
    let handle = Box::new(source)
        .start(
            intake,
            Budget::new(1_000_000, 1 << 40),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let mut messages = Vec::new();
    while let Some(one) = received.recv().await {
        messages.push(one.message);
    }
    handle.close().await;
    assert_eq!(progress.failure(), None, "the file source failed");
    assert_eq!(
        progress.delivered.load(Ordering::Relaxed),
        messages.len() as u64
    );
    messages
}

/// What a line must become, by the record format of `connector/src/file.rs` (module docs).
#[derive(Debug, Clone, PartialEq)]
enum Expected {
    Record {
        id: String,
        attributes: BTreeMap<String, String>,
        data: Vec<u8>,
        event_time_ms: Option<i64>,
    },
    Problem(&'static str),
}

fn expected(line: &[u8]) -> Option<Expected> {
    let text = line.trim_ascii();
    if text.is_empty() {
        return None;
    }
    let problem = |reason| Some(Expected::Problem(reason));
    let Ok(Value::Object(mut record)) = serde_json::from_slice::<Value>(text) else {
        return problem("undecodable");
    };
    let id = match record.remove("id") {
        Some(Value::String(id)) if !id.is_empty() => id,
        Some(Value::Number(id)) => id.to_string(),
        _ => return problem("missing_id"),
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
        Some(_) => return problem("undecodable"),
    };
    let data = match record.remove("data") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(encoded)) => {
            match base64::engine::general_purpose::STANDARD.decode(encoded) {
                Ok(bytes) => bytes,
                Err(_) => return problem("undecodable"),
            }
        }
        Some(other) => other.to_string().into_bytes(),
    };
    let event_time_ms = match record.remove("event_time") {
        None | Some(Value::Null) => None,
        Some(Value::Number(ms)) => match ms.as_i64() {
            Some(ms) => Some(ms),
            None => return problem("bad_timestamp"),
        },
        Some(Value::String(text)) => match parse_event_time(&text) {
            Some(ms) => Some(ms),
            None => return problem("bad_timestamp"),
        },
        Some(_) => return problem("bad_timestamp"),
    };
    Some(Expected::Record {
        id,
        attributes,
        data,
        event_time_ms,
    })
}

/// Reads `content` as a file and checks every line's message against [`expected`].
fn check_file(content: &[u8]) -> Result<Vec<SourceMessage>, TestCaseError> {
    check_file_at(&write_file(content), content)
}

/// As [`check_file`], for `file`, which holds `content`.
fn check_file_at(file: &JsonlFile, content: &[u8]) -> Result<Vec<SourceMessage>, TestCaseError> {
    check_file_limited(file, content, DEFAULT_MAX_RECORD_BYTES)
}

/// As [`check_file_at`], with lines over `max` bytes (without their `\n`) expected as
/// `record_too_large` problems that carry the line's first bytes (at most 1 KiB).
fn check_file_limited(
    file: &JsonlFile,
    content: &[u8],
    max: u64,
) -> Result<Vec<SourceMessage>, TestCaseError> {
    let messages = block_on(read_messages(file, max));
    let limit = usize::try_from(max).unwrap();
    let lines: Vec<(usize, &[u8])> = content
        .split(|b| *b == b'\n')
        .enumerate()
        .map(|(i, line)| (i + 1, line))
        .filter(|(_, line)| !line.trim_ascii().is_empty())
        .collect();
    prop_assert_eq!(
        messages.len(),
        lines.len(),
        "one message per non-blank line"
    );
    let shown = file.path.display().to_string();
    for (message, (number, line)) in messages.iter().zip(&lines) {
        prop_assert_eq!(message.publish_time_ms, file.modified_ms);
        if line.len() > limit {
            let problem = message.problem.as_ref();
            prop_assert_eq!(problem.map(|p| p.reason), Some("record_too_large"));
            prop_assert_eq!(&message.message_id, &format!("{shown}:{number}"));
            prop_assert_eq!(&message.data[..], &line[..limit.min(1024)]);
            continue;
        }
        let want = expected(line).unwrap();
        match (&message.problem, want) {
            (Some(SourceProblem { reason, error }), Expected::Problem(want)) => {
                prop_assert!(REASONS.contains(reason), "reason {reason:?}");
                prop_assert_eq!(*reason, want, "line {}: {:?}", number, error);
                let position = format!("{shown}:{number}");
                prop_assert_eq!(&message.message_id, &position);
                let prefix = format!("{position}: ");
                prop_assert!(error.starts_with(&prefix), "{error:?}");
                prop_assert!(error.len() > prefix.len(), "empty error");
                prop_assert_eq!(&message.data[..], line.trim_ascii());
                prop_assert!(message.attributes.is_empty());
                prop_assert_eq!(message.event_time_ms, None);
            }
            (None, want @ Expected::Record { .. }) => {
                let got = Expected::Record {
                    id: message.message_id.clone(),
                    attributes: message.attributes.clone(),
                    data: message.data.to_vec(),
                    event_time_ms: message.event_time_ms,
                };
                prop_assert_eq!(got, want, "line {}", number);
                prop_assert!(!message.message_id.is_empty());
            }
            (got, want) => {
                prop_assert!(false, "line {number}: got {got:?}, expected {want:?}");
            }
        }
    }
    Ok(messages)
}

// ---------------------------------------------------------------------------------------------
// Driving the table stage
// ---------------------------------------------------------------------------------------------

/// `message` as the batcher hands it on (`connector/src/storable.rs`): U+0000 in its dedup key,
/// its id or an attribute is written as `\u0000`, and such a message becomes an `unstorable`
/// dead letter (an empty error here stands for "any non-empty one").
fn as_batched(message: &SourceMessage, key: &str) -> SourceMessage {
    let escape = |text: &str| text.replace('\0', "\\u0000");
    let mut batched = message.clone();
    let in_attributes = message
        .attributes
        .iter()
        .any(|(name, value)| name.contains('\0') || value.contains('\0'));
    if !(key.contains('\0') || message.message_id.contains('\0') || in_attributes) {
        return batched;
    }
    batched.message_id = escape(&message.message_id);
    if in_attributes {
        batched.attributes = message
            .attributes
            .iter()
            .map(|(name, value)| (escape(name), escape(value)))
            .collect();
    }
    batched.problem.get_or_insert(SourceProblem {
        reason: "unstorable",
        error: String::new(),
    });
    batched
}

/// `got` is `want` (from [`as_batched`]).
fn check_batched(got: &SourceMessage, want: &SourceMessage) -> Result<(), TestCaseError> {
    let strip = |m: &SourceMessage| SourceMessage {
        problem: None,
        ..m.clone()
    };
    prop_assert_eq!(strip(got), strip(want));
    match (&got.problem, &want.problem) {
        (Some(got), Some(want)) => {
            prop_assert_eq!(got.reason, want.reason);
            prop_assert!(!got.error.is_empty());
            if !want.error.is_empty() {
                prop_assert_eq!(&got.error, &want.error);
            }
        }
        (got, want) => prop_assert_eq!(got, want),
    }
    Ok(())
}

/// The effect [`TableStage`] must give `message` (module docs of `connector/src/stage.rs`).
fn expected_effect(
    stage: &TableStage,
    message: &SourceMessage,
    key_problem: Option<&str>,
) -> Effect {
    let dead = |reason: &str, error: String| Effect::DeadLetter {
        reason: reason.to_owned(),
        error,
        attempts: 1,
    };
    if let Some(reason) = key_problem {
        return dead(reason, String::new());
    }
    if let Some(problem) = &message.problem {
        return dead(problem.reason, problem.error.clone());
    }
    if let Some(event_time_ms) = message.event_time_ms {
        return Effect::row(event_time_ms);
    }
    let Some(name) = &stage.event_time_attribute else {
        return Effect::row(message.publish_time_ms);
    };
    match message
        .attributes
        .get(name)
        .and_then(|v| parse_event_time(v))
    {
        Some(event_time_ms) => Effect::row(event_time_ms),
        None if stage.bad_timestamp_uses_publish_time => Effect::row(message.publish_time_ms),
        None => dead("bad_timestamp", String::new()),
    }
}

/// Compares an effect with [`expected_effect`]; an empty expected error means "any non-empty".
fn check_effect(got: &Effect, want: &Effect) -> Result<(), TestCaseError> {
    match (got, want) {
        (
            Effect::DeadLetter {
                reason,
                error,
                attempts,
            },
            Effect::DeadLetter {
                reason: want_reason,
                error: want_error,
                attempts: want_attempts,
            },
        ) => {
            prop_assert!(!reason.is_empty(), "empty dead-letter reason");
            prop_assert!(!error.is_empty(), "empty dead-letter error");
            prop_assert_eq!(reason, want_reason);
            prop_assert_eq!(attempts, want_attempts);
            if !want_error.is_empty() {
                prop_assert_eq!(error, want_error);
            }
        }
        _ => prop_assert_eq!(got, want),
    }
    Ok(())
}

/// Runs `source` through a batcher and `stage`; every delivery with its key problem and effect.
async fn stage_all(
    source: Box<dyn MessageSource>,
    key: KeySource,
    max_messages: usize,
    stage: &TableStage,
    expect: Option<usize>,
) -> Vec<(SourceMessage, Option<&'static str>, Effect)> {
    let stop = CancellationToken::new();
    let (mut batches, handle) = BatchSource::start(
        source,
        Budget::new(100_000, 1 << 40),
        DedupSettings {
            key,
            window: Duration::from_secs(600),
        },
        BatchSettings {
            max_messages,
            max_delay: Duration::from_millis(1),
        },
        Counters::new("fuzz", "decoding"),
        stop.clone(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    // A source that stays open (in-process) is done at `expect` deliveries; a file at its end.
    while expect.is_none_or(|n| out.len() < n) {
        let next = tokio::time::timeout(Duration::from_secs(30), batches.next_batch()).await;
        let Some(batch) = next.expect("a batch within 30 s") else {
            break;
        };
        let effects = stage.stage(batch.deliveries()).await.unwrap();
        assert_eq!(effects.len(), batch.len(), "one effect per delivery");
        for (delivery, effect) in batch.deliveries().iter().zip(effects) {
            out.push((delivery.message.clone(), delivery.key_problem, effect));
        }
        batch.settle_committed();
    }
    stop.cancel();
    drop(batches);
    handle.close().await;
    out
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

/// Strings with NUL, control characters, quotes, non-ASCII and invalid-looking escapes.
fn nasty_string() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::collection::vec(any::<char>(), 0..12).prop_map(String::from_iter),
        2 => "[\\x00-\\x1f\\x7f\"\\\\ a-z]{0,12}",
        1 => "[\u{80}-\u{10ffff}]{0,6}",
        1 => Just(String::new()),
        1 => Just("\0".to_owned()),
    ]
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        select(vec![0.5, -0.0, 1e3, 1e300, -1e-300, 9.3e18, -9.3e18]).prop_map(Value::from),
    ]
}

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        nasty_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(nasty_string(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn id() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        4 => nasty_string().prop_map(|s| Some(Value::String(s))),
        2 => number().prop_map(Some),
        1 => Just(None),
        1 => json().prop_map(Some),
    ]
}

fn attributes() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        4 => prop::collection::btree_map(nasty_string(), json(), 0..5)
            .prop_map(|m| Some(Value::Object(m.into_iter().collect()))),
        1 => Just(None),
        1 => json().prop_map(Some),
    ]
}

fn data() -> impl Strategy<Value = Option<Value>> {
    let base64 = prop::collection::vec(any::<u8>(), 0..64)
        .prop_map(|b| base64::engine::general_purpose::STANDARD.encode(b));
    prop_oneof![
        4 => base64.prop_map(|s| Some(Value::String(s))),
        1 => Just(None),
        1 => "[A-Za-z0-9+/=%_-]{0,12}".prop_map(|s| Some(Value::String(s))),
        2 => json().prop_map(Some),
    ]
}

/// RFC 3339-ish timestamps whose every part may be out of range.
fn loose_timestamp() -> impl Strategy<Value = String> {
    (
        prop_oneof![0i64..10_000, -99_999i64..1_000_000],
        0u32..100,
        0u32..100,
        select(vec!["T", "t", " ", "_", "", "TT"]),
        0u32..100,
        0u32..100,
        0u32..100,
        "(\\.[0-9]{0,40})?",
        select(vec![
            "",
            "Z",
            "z",
            "+00:00",
            "-00:00",
            "+23:59",
            "-23:59",
            "+24:00",
            "+99:99",
            "+0200",
            "+02",
            "UTC",
            " Z",
            "Zz",
            "+02:00:00",
        ]),
    )
        .prop_map(|(y, mo, d, sep, h, mi, s, frac, offset)| {
            format!("{y:04}-{mo:02}-{d:02}{sep}{h:02}:{mi:02}:{s:02}{frac}{offset}")
        })
}

/// Event times of every shape, as text.
fn event_time_text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => loose_timestamp(),
        2 => valid_timestamp().prop_map(|(text, _)| text),
        2 => any::<i64>().prop_map(|n| n.to_string()),
        1 => any::<String>(),
        1 => "[0-9+\\-:.TtZz ]{0,40}",
        1 => "[+-]?[0-9]{0,400}",
        1 => select(vec![
            "9223372036854775808", "-9223372036854775809", "1e3", "1.5", "0x10", "+5", "-0",
            "١٢٣", " 12 ", "\t12\n", "\u{a0}12", "1_000", "NaN", "inf",
            "1970-01-01T00:00:60Z", "1969-12-31T23:59:60.999999999Z", "0000-01-01T00:00:00Z",
            "9999-12-31T23:59:59.999999999-23:59", "+275760-09-13T00:00:00Z",
            "-262144-01-01T00:00:00Z", "2026-02-29T00:00:00Z", "2024-02-29T00:00:00Z",
        ]).prop_map(str::to_owned),
        1 => (valid_timestamp(), any::<Index>(), any::<char>()).prop_map(|((text, _), at, c)| {
            let mut chars: Vec<char> = text.chars().collect();
            let at = at.index(chars.len());
            chars[at] = c;
            chars.into_iter().collect()
        }),
    ]
}

fn event_time() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        2 => Just(None),
        3 => event_time_text().prop_map(|s| Some(Value::String(s))),
        2 => number().prop_map(Some),
        1 => json().prop_map(Some),
    ]
}

/// A record as a JSON object with every shape of its four keys, and stray keys.
fn record() -> impl Strategy<Value = Map<String, Value>> {
    (
        id(),
        attributes(),
        data(),
        event_time(),
        prop::collection::btree_map("[a-z_]{1,8}", json(), 0..3),
    )
        .prop_map(|(id, attributes, data, event_time, extra)| {
            let mut record: Map<String, Value> = extra.into_iter().collect();
            for (key, value) in [
                ("id", id),
                ("attributes", attributes),
                ("data", data),
                ("event_time", event_time),
            ] {
                match value {
                    Some(value) => record.insert(key.to_owned(), value),
                    None => record.remove(key),
                };
            }
            record
        })
}

/// A line: a serialised record with optional ASCII padding, or garbage.
fn line() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => (record(), select(vec!["", " ", "\t", "\r", " \r", "\x0c"]), any::<bool>()).prop_map(
            |(r, pad, pad_before)| {
                let text = Value::Object(r).to_string();
                let text = if pad_before { format!("{pad}{text}{pad}") } else { format!("{text}{pad}") };
                text.into_bytes()
            }
        ),
        1 => prop::collection::vec(any::<u8>(), 0..80),
        1 => select(vec![
            "", " ", "\r", "null", "[]", "[1,2]", "\"id\"", "42", "{}", "{", "}", "{\"id\":}",
            "{\"id\":\"a\"}{\"id\":\"b\"}", "{\"id\":\"a\",\"id\":\"b\"}", "{\"id\":\"a\"} x",
            "\u{feff}{\"id\":\"a\"}", "{\"id\":\"a\\u0000b\"}", "{\"id\":\"\\ud800\"}",
            "{\"id\":\"a\",\"event_time\":1e400}", "{\"id\":\"a\",\"event_time\":-1e400}",
            "{\"id\":\"a\",\"event_time\":9223372036854775808}",
            "{\"id\":\"a\",\"event_time\":-9223372036854775809}",
            "{\"id\":\"a\",\"event_time\":1.0}", "{\"id\":\"a\",\"event_time\":-0}",
            "{\"id\":1e400}", "{\"id\":-0.0}", "{\"id\":18446744073709551616}",
            "{\"id\":\"a\",\"data\":\"\"}", "{\"id\":\"a\",\"data\":\"====\"}",
            "{\"id\":\"a\",\"attributes\":{\"k\":{\"deep\":[1,{\"x\":null}]}}}",
        ]).prop_map(|s| s.as_bytes().to_vec()),
    ]
}

/// One byte-level mutation of a line: invalid UTF-8, NUL, truncation, a new line break.
#[derive(Debug, Clone)]
enum ByteEdit {
    Insert(Index, u8),
    Replace(Index, u8),
    Delete(Index),
    Truncate(Index),
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    let byte = prop_oneof![
        select(vec![
            0x00, 0x80, 0xbf, 0xc0, 0xc3, 0xe2, 0xed, 0xf0, 0xf4, 0xf5, 0xff, b'\n', b'\r', b'"',
            b'\\', b'{', b'}', b',', b':'
        ]),
        any::<u8>(),
    ];
    prop_oneof![
        (any::<Index>(), byte.clone()).prop_map(|(i, b)| ByteEdit::Insert(i, b)),
        (any::<Index>(), byte).prop_map(|(i, b)| ByteEdit::Replace(i, b)),
        any::<Index>().prop_map(ByteEdit::Delete),
        any::<Index>().prop_map(ByteEdit::Truncate),
    ]
}

fn mutated_line() -> impl Strategy<Value = Vec<u8>> {
    (line(), prop::collection::vec(byte_edit(), 1..4)).prop_map(|(mut line, edits)| {
        for edit in edits {
            let n = line.len();
            match edit {
                ByteEdit::Insert(i, b) => line.insert(i.index(n + 1), b),
                ByteEdit::Replace(i, b) if n > 0 => line[i.index(n)] = b,
                ByteEdit::Delete(i) if n > 0 => {
                    line.remove(i.index(n));
                }
                ByteEdit::Truncate(i) => line.truncate(i.index(n + 1)),
                ByteEdit::Replace(..) | ByteEdit::Delete(_) => {}
            }
        }
        line
    })
}

fn file_content(line: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(line, 0..10),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(lines, crlf, trailing)| {
            let mut content = lines.join(if crlf { &b"\r\n"[..] } else { &b"\n"[..] });
            if trailing {
                content.push(b'\n');
            }
            content
        })
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// A valid timestamp in one of the documented shapes, with the instant it denotes (computed
/// without chrono).
fn valid_timestamp() -> impl Strategy<Value = (String, i64)> {
    (
        (0i64..=9999, 1i64..=12, any::<Index>()),
        (0i64..24, 0i64..60, 0i64..60),
        "([0-9]{1,9})?",
        select(vec!["T", "t", " "]),
        prop_oneof![
            Just(None),
            Just(Some("Z".to_owned())),
            Just(Some("z".to_owned())),
            (any::<bool>(), 0i64..24, 0i64..60).prop_map(|(east, h, m)| Some(format!(
                "{}{h:02}:{m:02}",
                if east { '+' } else { '-' }
            ))),
        ],
    )
        .prop_map(|((year, month, day), (h, mi, s), frac, sep, offset)| {
            let day =
                1 + i64::try_from(day.index(usize::try_from(days_in_month(year, month)).unwrap()))
                    .unwrap();
            let mut text = format!("{year:04}-{month:02}-{day:02}{sep}{h:02}:{mi:02}:{s:02}");
            if !frac.is_empty() {
                text.push('.');
                text.push_str(&frac);
            }
            let frac_ms: i64 = format!("{frac:0<3}")[..3].parse().unwrap();
            let offset_minutes = match &offset {
                Some(o) if o.len() == 6 => {
                    let minutes =
                        o[1..3].parse::<i64>().unwrap() * 60 + o[4..6].parse::<i64>().unwrap();
                    if o.starts_with('+') {
                        minutes
                    } else {
                        -minutes
                    }
                }
                _ => 0,
            };
            if let Some(offset) = &offset {
                text.push_str(offset);
            }
            let ms = days_from_civil(year, month, day) * 86_400_000
                + h * 3_600_000
                + mi * 60_000
                + s * 1_000
                + frac_ms
                - offset_minutes * 60_000;
            (text, ms)
        })
}

// ---------------------------------------------------------------------------------------------
// Properties: file records
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn every_line_is_one_record_or_one_problem(content in file_content(line())) {
        check_file(&content)?;
    }

    #[test]
    fn mutated_and_invalid_utf8_lines(content in file_content(mutated_line())) {
        let messages = check_file(&content)?;
        // A line that is not UTF-8 is undecodable (a problem's data is its raw line).
        for m in &messages {
            if let Some(problem) = &m.problem
                && std::str::from_utf8(&m.data).is_err()
            {
                prop_assert_eq!(problem.reason, "undecodable");
            }
        }
    }

    #[test]
    fn arbitrary_bytes(content in prop::collection::vec(any::<u8>(), 0..600)) {
        check_file(&content)?;
    }

    #[test]
    fn lines_over_max_record_bytes(content in file_content(line()), max in 1u64..300) {
        check_file_limited(&write_file(&content), &content, max)?;
    }

    #[test]
    fn event_times_in_records(text in event_time_text(), ms in any::<i64>()) {
        let lines = [
            serde_json::json!({"id": "s", "event_time": text}).to_string(),
            serde_json::json!({"id": "n", "event_time": ms}).to_string(),
            serde_json::json!({"id": "t", "event_time": ms.to_string()}).to_string(),
        ];
        let messages = check_file(lines.join("\n").as_bytes())?;
        prop_assert_eq!(messages.len(), 3);
        match parse_event_time(&text) {
            Some(at) => prop_assert_eq!(messages[0].event_time_ms, Some(at)),
            None => prop_assert_eq!(messages[0].problem.as_ref().map(|p| p.reason), Some("bad_timestamp")),
        }
        prop_assert_eq!(messages[1].event_time_ms, Some(ms));
        prop_assert_eq!(messages[2].event_time_ms, Some(ms));
    }

    #[test]
    fn numbers_out_of_the_i64_range(literal in prop_oneof![
        "-?[0-9]{18,40}",
        "-?[0-9]{1,20}\\.[0-9]{1,20}",
        "-?[0-9]{1,3}[eE][+-]?[0-9]{1,4}",
    ]) {
        let line = format!("{{\"id\":{literal},\"event_time\":{literal}}}");
        check_file(line.as_bytes())?;
    }
}

// ---------------------------------------------------------------------------------------------
// Properties: parse_event_time
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn event_time_never_panics(text in event_time_text()) {
        let _ = parse_event_time(&text);
    }

    #[test]
    fn event_time_round_trips_integer_milliseconds(
        ms in any::<i64>(),
        before in "[ \t\r\n]{0,3}",
        after in "[ \t\r\n]{0,3}",
        zeros in 0usize..4,
    ) {
        prop_assert_eq!(parse_event_time(&ms.to_string()), Some(ms));
        prop_assert_eq!(parse_event_time(&format!("{before}{ms}{after}")), Some(ms));
        let padded = if ms < 0 {
            format!("-{}{}", "0".repeat(zeros), ms.unsigned_abs())
        } else {
            format!("+{}{ms}", "0".repeat(zeros))
        };
        prop_assert_eq!(parse_event_time(&padded), Some(ms), "{}", padded);
    }

    #[test]
    fn event_time_reads_rfc3339_to_the_right_instant((text, ms) in valid_timestamp()) {
        prop_assert_eq!(parse_event_time(&text), Some(ms), "{}", text);
    }

    #[test]
    fn event_time_round_trips_chrono_rfc3339(
        ms in -62_167_219_200_000i64..=253_402_300_799_999,
        offset_minutes in -1439i32..=1439,
    ) {
        let utc = chrono::DateTime::from_timestamp_millis(ms).unwrap();
        let text = utc.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        prop_assert_eq!(parse_event_time(&text), Some(ms), "{}", text);
        let offset = chrono::FixedOffset::east_opt(offset_minutes * 60).unwrap();
        let local = utc.with_timezone(&offset).to_rfc3339_opts(chrono::SecondsFormat::AutoSi, false);
        // A local time of year 0 or 10000 has no 4-digit RFC 3339 form; then no promise.
        if local.len() > 4 && local[..4].bytes().all(|b| b.is_ascii_digit()) {
            prop_assert_eq!(parse_event_time(&local), Some(ms), "{}", local);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Properties: the table stage
// ---------------------------------------------------------------------------------------------

/// One message for the stage, before it gets its unique id.
#[derive(Debug, Clone)]
struct StageInput {
    publish_time_ms: i64,
    /// Value of the event-time attribute, if it has one.
    event_time_attribute: Option<String>,
    /// Whether it carries the dedup attribute `key`.
    has_key: bool,
    event_time_ms: Option<i64>,
    problem: Option<(&'static str, String)>,
    other: BTreeMap<String, String>,
}

fn stage_input() -> impl Strategy<Value = StageInput> {
    (
        any::<i64>(),
        prop::option::of(event_time_text()),
        any::<bool>(),
        prop::option::weighted(0.2, any::<i64>()),
        prop::option::weighted(0.2, (select(REASONS.to_vec()), ".{1,20}")),
        prop::collection::btree_map("x-.{0,6}", nasty_string(), 0..4),
    )
        .prop_map(
            |(publish_time_ms, event_time_attribute, has_key, event_time_ms, problem, other)| {
                StageInput {
                    publish_time_ms,
                    event_time_attribute,
                    has_key,
                    event_time_ms,
                    problem,
                    other,
                }
            },
        )
}

fn table_stage() -> impl Strategy<Value = TableStage> {
    (
        prop::option::of(select(vec!["ts", "event_time", "", "\0", "t s", "é"])),
        any::<bool>(),
    )
        .prop_map(|(attribute, publish)| TableStage {
            event_time_attribute: attribute.map(str::to_owned),
            bad_timestamp_uses_publish_time: publish,
            fields: None,
            dedup_attribute: None,
        })
}

fn key_source() -> impl Strategy<Value = KeySource> {
    prop_oneof![
        Just(KeySource::MessageId),
        any::<bool>().prop_map(|dead_letter_if_missing| KeySource::Attribute {
            name: "key".to_owned(),
            dead_letter_if_missing,
        }),
    ]
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn the_table_stage_gives_one_effect_per_delivery(
        inputs in prop::collection::vec(stage_input(), 1..40),
        stage in table_stage(),
        key in key_source(),
        max_messages in 1usize..16,
    ) {
        let messages: Vec<SourceMessage> = inputs
            .iter()
            .enumerate()
            .map(|(i, input)| {
                let mut attributes = input.other.clone();
                if let (Some(name), Some(value)) = (&stage.event_time_attribute, &input.event_time_attribute) {
                    attributes.insert(name.clone(), value.clone());
                }
                if input.has_key {
                    attributes.insert("key".to_owned(), format!("k{i}"));
                }
                SourceMessage {
                    message_id: format!("m{i}"),
                    publish_time_ms: input.publish_time_ms,
                    attributes,
                    data: bytes::Bytes::new(),
                    event_time_ms: input.event_time_ms,
                    problem: input.problem.clone().map(|(reason, error)| SourceProblem { reason, error }),
                }
            })
            .collect();
        let source = InProcessSource::new(messages.clone());
        let tally = source.tally();
        let staged = block_on(stage_all(Box::new(source), key.clone(), max_messages, &stage, Some(messages.len())));
        prop_assert_eq!(staged.len(), messages.len(), "every message staged once");
        for (i, (message, key_problem, effect)) in staged.iter().enumerate() {
            // One source, one batcher: receive order is the source's order.
            check_batched(message, &as_batched(&messages[i], &format!("m{i}")))?;
            let missing_key = matches!(key, KeySource::Attribute { dead_letter_if_missing: true, .. }) && !inputs[i].has_key;
            prop_assert_eq!(*key_problem, missing_key.then_some("missing_dedup_attribute"));
            check_effect(effect, &expected_effect(&stage, message, *key_problem))?;
        }
        prop_assert_eq!(tally.acked.load(Ordering::SeqCst), messages.len() as u64);
        prop_assert_eq!(tally.dropped.load(Ordering::SeqCst), 0);
    }

    /// End to end: file → source → batcher → stage. Ids are made unique so that the batcher's
    /// dedup lets every line through.
    #[test]
    fn every_line_of_a_file_becomes_one_row_or_one_dead_letter(
        records in prop::collection::vec(prop_oneof![4 => record().prop_map(Some), 1 => Just(None)], 0..10),
        garbage in prop::collection::vec(any::<u8>(), 0..40),
        stage in table_stage(),
        max_messages in 1usize..16,
    ) {
        let lines: Vec<Vec<u8>> = records
            .into_iter()
            .enumerate()
            .map(|(i, record)| match record {
                Some(mut record) => {
                    if let Some(Value::String(id)) = record.get_mut("id") && !id.is_empty() {
                        id.insert_str(0, &format!("{i}:"));
                    } else if let Some(Value::Number(_)) = record.get("id") {
                        record.insert("id".to_owned(), Value::from(format!("{i}#")));
                    }
                    Value::Object(record).to_string().into_bytes()
                }
                None => garbage.iter().copied().filter(|b| *b != b'\n').collect(),
            })
            .collect();
        let content = lines.join(&b'\n');
        let file = write_file(&content);
        let decoded = check_file_at(&file, &content)?;
        let staged = block_on(stage_all(Box::new(file_source(&file, DEFAULT_MAX_RECORD_BYTES)), KeySource::MessageId, max_messages, &stage, None));
        let non_blank = lines.iter().filter(|l| !l.trim_ascii().is_empty()).count();
        prop_assert_eq!(staged.len(), non_blank, "one effect per non-blank line");
        for ((message, key_problem, effect), decoded) in staged.iter().zip(&decoded) {
            check_batched(message, &as_batched(decoded, &decoded.message_id))?;
            prop_assert_eq!(*key_problem, None);
            if let Some(problem) = &message.problem {
                prop_assert!(
                    REASONS.contains(&problem.reason) || problem.reason == "unstorable",
                    "{problem:?}"
                );
                prop_assert!(matches!(effect, Effect::DeadLetter { .. }), "{effect:?}");
            }
            check_effect(effect, &expected_effect(&stage, message, None))?;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Properties: absurd records (few cases: each is large)
// ---------------------------------------------------------------------------------------------

/// `len` pseudo-random bytes from `seed` (xorshift; proptest-generated vectors this large would
/// be slow to generate and shrink).
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect()
}

proptest! {
    #![proptest_config(config(8))]

    #[test]
    fn ten_thousand_attributes(values in prop::collection::vec(json(), 1..8), et in prop::option::of(event_time_text())) {
        let attributes: Map<String, Value> = (0..10_000)
            .map(|i| (format!("a{i}"), values[i % values.len()].clone()))
            .collect();
        let mut record = serde_json::json!({"id": "many", "attributes": attributes});
        if let Some(et) = &et {
            record["attributes"]["ts"] = Value::from(et.clone());
        }
        let content = record.to_string();
        let file = write_file(content.as_bytes());
        let messages = check_file_at(&file, content.as_bytes())?;
        prop_assert!(messages[0].attributes.len() >= 10_000);
        let stage = TableStage { event_time_attribute: Some("ts".to_owned()), bad_timestamp_uses_publish_time: false, fields: None, dedup_attribute: None };
        let staged = block_on(stage_all(Box::new(file_source(&file, DEFAULT_MAX_RECORD_BYTES)), KeySource::MessageId, 1, &stage, None));
        prop_assert_eq!(staged.len(), 1);
        check_effect(&staged[0].2, &expected_effect(&stage, &staged[0].0, None))?;
    }
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn deep_nesting(depth in 1usize..20_000, open in select(vec!["[", "{\"a\":"]), field in select(vec!["data", "attributes", "id", "event_time"])) {
        let close = if open == "[" { "]" } else { "}" };
        let nested = format!("{}{}", open.repeat(depth), close.repeat(depth));
        let line = format!("{{\"id\":\"deep\",\"{field}\":{nested}}}");
        let messages = check_file(line.as_bytes())?;
        if depth > 200 {
            prop_assert_eq!(messages[0].problem.as_ref().map(|p| p.reason), Some("undecodable"));
        }
    }
}

proptest! {
    #![proptest_config(config(6))]

    #[test]
    fn payloads_of_a_few_megabytes(seed in any::<u64>(), len in 1_000_000usize..4_000_000, shape in 0u8..4) {
        let bytes = noise(seed, len);
        let line = match shape {
            // Valid base64 of random bytes: a record carrying them.
            0 => serde_json::json!({"id": "big", "data": base64::engine::general_purpose::STANDARD.encode(&bytes)}).to_string(),
            // Base64 broken at the end: undecodable, the whole line kept.
            1 => format!("{{\"id\":\"big\",\"data\":\"{}%\"}}", base64::engine::general_purpose::STANDARD.encode(&bytes)),
            // A huge JSON payload (an array of numbers; shorter, each number is a JSON value).
            2 => serde_json::json!({"id": "big", "data": &bytes[..len / 16]}).to_string(),
            // A huge id and a huge event time.
            _ => serde_json::json!({"id": "x".repeat(len), "event_time": "9".repeat(len)}).to_string(),
        };
        let messages = check_file(line.as_bytes())?;
        prop_assert_eq!(messages.len(), 1);
        match shape {
            0 => prop_assert_eq!(&messages[0].data[..], &bytes[..]),
            1 => prop_assert_eq!(messages[0].problem.as_ref().map(|p| p.reason), Some("undecodable")),
            3 => prop_assert_eq!(messages[0].problem.as_ref().map(|p| p.reason), Some("bad_timestamp")),
            _ => {}
        }
    }
}

proptest! {
    #![proptest_config(config(4))]

    #[test]
    fn a_few_megabytes_of_invalid_utf8(seed in any::<u64>(), len in 1_000_000usize..3_000_000) {
        let mut line = b"{\"id\":\"x\",\"data\":\"".to_vec();
        line.extend(noise(seed, len).into_iter().map(|b| b | 0x80));
        line.extend_from_slice(b"\"}");
        let messages = check_file(&line)?;
        prop_assert_eq!(messages[0].problem.as_ref().map(|p| p.reason), Some("undecodable"));
    }
}

// ---------------------------------------------------------------------------------------------
// Fixed inputs
// ---------------------------------------------------------------------------------------------

#[test]
fn documented_event_time_shapes() {
    let utc = Some(1_796_112_000_000);
    for text in [
        "1796112000000",
        "2026-12-01T08:00:00Z",
        "2026-12-01t08:00:00z",
        "2026-12-01 08:00:00Z",
        "2026-12-01T10:00:00+02:00",
        "2026-12-01T08:00:00",
        "2026-12-01 08:00:00",
        " 2026-12-01T08:00:00.000Z ",
    ] {
        assert_eq!(parse_event_time(text), utc, "{text:?}");
    }
}

#[test]
fn blank_lines_are_skipped_but_counted() {
    let messages = check_file(b"\n  \r\n{\"id\":\"a\"}\n\t\nnot json\n").unwrap();
    assert_eq!(messages.len(), 2);
    assert!(messages[1].message_id.ends_with(":5"), "{:?}", messages[1]);
}

/// Found by `event_time_reads_rfc3339_to_the_right_instant`: `0000-01-01t00:00:00` (a lower-case
/// `t` and no offset) was not read, though `t` is accepted with an offset and a timestamp
/// without one is read as UTC; a file record or an attribute holding it was dead-lettered
/// (`bad_timestamp`).
#[test]
fn regression_lower_case_t_without_an_offset() {
    assert_eq!(
        parse_event_time("0000-01-01t00:00:00"),
        Some(-62_167_219_200_000)
    );
    assert_eq!(
        parse_event_time("2026-12-01t08:00:00.5"),
        Some(1_796_112_000_500)
    );
    let messages = check_file(br#"{"id":"a","event_time":"2026-12-01t08:00:00"}"#).unwrap();
    assert_eq!(messages[0].problem, None);
    assert_eq!(messages[0].event_time_ms, Some(1_796_112_000_000));
}
